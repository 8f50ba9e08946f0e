"""A training batch norm's running statistics are updated in the inputs themselves
(`torchfuse.inductor.inplace`): the Program calls the in-place op and returns the inputs as
their new values, unless something else reads the old ones. Checked against eager: outputs,
gradients, running statistics (and that they stay the caller's tensors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import functionalize
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph, inductor
from torchfuse.runtime.checks import mutated_inputs

FUNCTIONAL = "aten._native_batch_norm_legit_functional.default"
IN_PLACE = "aten._native_batch_norm_legit.default"


def _bn(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1).relu().sum()


def _bn_reading_the_old_mean(x, w, b, rm, rv):
    before = rm * 2  # the old running mean: it must not be overwritten before this reads it
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    return y.relu().sum() + before.sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=g)
    w = torch.randn(3, generator=g).requires_grad_()
    b = torch.randn(3, generator=g).requires_grad_()
    return [x, w, b, torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5]


def _externs(program: S.Program) -> list[str]:
    return [s.op for s in program.steps if isinstance(s, S.ExternStep)]


def test_the_program_updates_the_running_statistics_in_its_inputs():
    graph, _ = trace(_bn, *_inputs())
    program = compile_graph(functionalize(graph))
    assert IN_PLACE in _externs(program) and FUNCTIONAL not in _externs(program)
    assert set(mutated_inputs(program)) == {program.inputs[3], program.inputs[4]}
    returned = [o.name for o in program.outputs if isinstance(o, S.TensorRef)]
    assert program.inputs[3] in returned and program.inputs[4] in returned


def test_reduce_overhead_keeps_the_functional_op():
    # a CUDA graph cannot replay a Program that writes its inputs: the write-back stays outside
    graph, _ = trace(_bn, *_inputs())
    program = compile_graph(functionalize(graph), mode="reduce-overhead")
    assert FUNCTIONAL in _externs(program) and mutated_inputs(program) == []


def test_an_input_read_elsewhere_keeps_the_functional_op():
    graph, _ = trace(_bn_reading_the_old_mean, *_inputs())
    program = compile_graph(functionalize(graph))
    assert FUNCTIONAL in _externs(program) and IN_PLACE not in _externs(program)
    assert mutated_inputs(program) == []


@pytest.mark.parametrize("fn", [_bn, _bn_reading_the_old_mean])
def test_training_step_matches_eager(fn):
    inputs = _inputs()
    graph, _ = trace(fn, *inputs)
    compiled = inductor(graph, inputs)
    ours = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    eager = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    stats = ours[3], ours[4]
    for _ in range(2):  # the second call updates statistics the first one wrote
        (loss,) = compiled(*ours)
        want = fn(*eager)
        torch.testing.assert_close(loss, want)
        loss.backward()
        want.backward()
    assert ours[3] is stats[0] and ours[4] is stats[1]
    torch.testing.assert_close(ours[3], eager[3])
    torch.testing.assert_close(ours[4], eager[4])
    for got, exp in zip(ours[1:3], eager[1:3], strict=True):
        torch.testing.assert_close(got.grad, exp.grad)
