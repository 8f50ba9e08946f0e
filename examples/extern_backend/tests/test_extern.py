"""The example backend against eager PyTorch, on graphs recorded with ``torchfuse.graph.trace``."""

from __future__ import annotations

import sys

import pytest
import torch
from torchfuse.graph import schema as S
from torchfuse.graph import trace, verify_program
from torchfuse.graph.ops import tensor_refs
from torchfuse.runtime import CompiledProgram, InputError
from torchfuse_example_extern import ExternBackendError, codegen, explain_program, extern

SCALE = torch.tensor([0.5, -1.0, 2.0])  # a tensor the traced code closes over: a constant input


def pointwise(x, y):
    return torch.relu(x + y) * 2 - y.exp()


def matmul_and_reduce(x, w):
    h = torch.nn.functional.silu(x @ w)
    return h.sum(dim=1), h.mean()


def returns_input_and_scalar(x, y):
    return x.sin() * y, x, 3, 1.5


def views_and_mutation(x, y):
    z = x * 1
    z.add_(SCALE)            # in place on an intermediate, with a captured constant
    return z.view(-1, 1).t(), torch.max(x, dim=1).indices, y[:, 1:]


CASES = [pointwise, matmul_and_reduce, returns_input_and_scalar, views_and_mutation]


def make_inputs(fn, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    if fn is matmul_and_reduce:
        shapes = [(4, 5), (5, 3)]
    else:
        shapes = [(2, 3), (2, 3)]
    return [torch.randn(s, generator=gen).requires_grad_(requires_grad) for s in shapes]


def flat_inputs(graph, args, constants):
    """The graph's inputs in order: traced arguments first, then the constants it captured."""
    return [*args, *(constants[i.name] for i in graph.inputs[len(args):])]


def compile_traced(fn, args):
    graph, constants = trace(fn, *args, name=fn.__name__)
    return graph, extern(graph, flat_inputs(graph, args, constants)), constants


def as_list(result):
    return list(result) if isinstance(result, tuple) else [result]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride() or g.numel() <= 1
        else:
            assert type(g) is type(w) and g == w


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_matches_eager(fn):
    args = make_inputs(fn)
    graph, compiled, constants = compile_traced(fn, args)
    fresh = [a + 1 for a in args]  # the compiled function is reusable on new values
    for call_args in (args, fresh):
        assert_same(compiled(*flat_inputs(graph, call_args, constants)), as_list(fn(*call_args)))


def mutates_input(x, y):
    x.mul_(2)
    return x + y


def test_input_mutation_is_visible_to_the_caller():
    args = make_inputs(mutates_input)
    graph, compiled, constants = compile_traced(mutates_input, [a.clone() for a in args])
    got_args, want_args = [a.clone() for a in args], [a.clone() for a in args]
    got = compiled(*flat_inputs(graph, got_args, constants))
    assert_same(got, as_list(mutates_input(*want_args)))
    for g, w in zip(got_args, want_args, strict=True):
        torch.testing.assert_close(g, w)
    assert not torch.equal(got_args[0], args[0])  # it really was written


def test_output_that_is_an_input_is_the_same_tensor():
    args = make_inputs(returns_input_and_scalar)
    graph, compiled, constants = compile_traced(returns_input_and_scalar, args)
    out = compiled(*flat_inputs(graph, args, constants))
    assert out[1] is args[0]


@pytest.mark.parametrize("fn", [pointwise, matmul_and_reduce], ids=lambda f: f.__name__)
def test_gradients_through_torchfuse_autograd(fn):
    pytest.importorskip("torchfuse.autograd")  # the optional ``autograd`` extra
    args = make_inputs(fn, requires_grad=True)
    _, compiled, _ = compile_traced(fn, args)
    assert not isinstance(compiled, CompiledProgram)  # wrapped by aot: forward and backward Programs
    got = compiled(*args)
    assert_same([o.detach() for o in got], as_list(fn(*[a.detach() for a in args])))
    grads = torch.autograd.grad([o.sum() for o in got], args)
    ref_args = [a.detach().requires_grad_(True) for a in args]
    want = torch.autograd.grad([o.sum() for o in as_list(fn(*ref_args))], ref_args)
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w)


def test_no_grad_mode_compiles_the_forward_only():
    args = make_inputs(pointwise, requires_grad=True)
    with torch.no_grad():
        _, compiled, _ = compile_traced(pointwise, args)
        assert isinstance(compiled, CompiledProgram)
        (out,) = compiled(*args)
        torch.testing.assert_close(out, pointwise(*args))
    assert not out.requires_grad


def test_gradients_without_torchfuse_autograd_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchfuse.autograd", None)  # makes the import fail
    args = make_inputs(pointwise, requires_grad=True)
    graph, _ = trace(pointwise, *args)
    with pytest.raises(ExternBackendError, match=r"torch.no_grad\(\)"):
        extern(graph, args)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_program_structure(fn):
    graph, _ = trace(fn, *make_inputs(fn))
    program = codegen(graph)
    verify_program(program)
    externs = [s for s in program.steps if isinstance(s, S.ExternStep)]
    assert [(s.op, s.outputs) for s in externs] == [(n.op, n.outputs) for n in graph.nodes]
    assert program.inputs == tuple(i.name for i in graph.inputs)
    assert program.outputs == tuple(o.value for o in graph.outputs)
    freed = [s.buffer for s in program.steps if isinstance(s, S.FreeStep)]
    assert len(freed) == len(set(freed))
    assert not set(freed) & ({*program.inputs} | set(tensor_refs(program.outputs)))


def test_explain_program_shows_every_step():
    graph, _ = trace(pointwise, *make_inputs(pointwise))
    program = codegen(graph)
    text = explain_program(program)
    lines = text.splitlines()
    assert len(lines) == 1 + len(program.inputs) + len(program.steps) + 1
    for node in graph.nodes:
        assert any(line.strip().startswith(f"{node.outputs[0]} = {node.op}(") for line in lines)


def test_wrong_input_shape_is_a_runtime_input_error():
    args = make_inputs(pointwise)
    _, compiled, _ = compile_traced(pointwise, args)
    with pytest.raises(InputError, match="shape"):
        compiled(torch.randn(3, 3), args[1])
    with pytest.raises(RuntimeError):  # and eager refuses the same inputs
        pointwise(torch.randn(3, 3), args[1])
