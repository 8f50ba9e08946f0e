"""Forward values and gradients through ``aot`` (reference-interpreter compilers) match eager,
for every function of ``cases.CASES``, on graphs that went through a save/load round-trip."""

from __future__ import annotations

import pytest
import torch
from autograd_cases import CASES, Case
from torchfuse.autograd import aot, interpreter_compiler
from torchfuse.graph import load, save, trace
from torchfuse.graph.ops import resolve_op
from torchfuse.graph.tracing import mutated_arguments
from torchfuse.graph.verify import verify


def _clone(inputs, flags):
    return [t.detach().clone().requires_grad_(f and t.dtype.is_floating_point)
            for t, f in zip(inputs, flags, strict=True)]


def _flat(outs):
    flat = []
    for o in outs if isinstance(outs, list | tuple) else [outs]:
        flat.extend(o if isinstance(o, list | tuple) else [o])
    return flat


def build(c: Case, tmp_path):
    inputs = c.make_inputs()
    graph, constants = trace(c.fn, *inputs, name=c.name)
    path = tmp_path / f"{c.name}.zip"
    save(graph, path, tensors=constants)
    loaded = load(path)
    assert loaded == graph
    return loaded, inputs, list(constants.values())


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_values_and_gradients_match_eager(c: Case, tmp_path):
    graph, inputs, constants = build(c, tmp_path)
    flags = c.flags(inputs)
    fn = aot(graph, interpreter_compiler, interpreter_compiler)

    eager_in = _clone(inputs, flags)
    aot_in = _clone(inputs, flags)
    # mutate non-leaf copies so that in-place writes to inputs are legal in eager too
    expected = _flat(c.fn(*eager_in))
    got = _flat(fn(*aot_in, *constants))[: len(expected)]
    assert len(got) == len(expected)
    for stage in fn.stages:  # every intermediate graph is functional and well formed
        assert not [n.op for n in stage.value.nodes if mutated_arguments(resolve_op(n.op))], stage.name
        verify(stage.value)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, msg=lambda m: f"{c.name} forward: {m}")
    if c.mutates_inputs:
        for e, g in zip(eager_in, aot_in, strict=True):
            torch.testing.assert_close(g, e, msg=lambda m: f"{c.name} mutated input: {m}")

    diff = [i for i, e in enumerate(expected) if isinstance(e, torch.Tensor) and e.requires_grad]
    wrt_e = [t for t in eager_in if t.requires_grad]
    wrt_g = [t for t in aot_in if t.requires_grad]
    if not diff or not wrt_e:
        assert not any(isinstance(g, torch.Tensor) and g.requires_grad for g in got)
        return
    torch.manual_seed(1)
    cots = [torch.randn_like(expected[i]) for i in diff]
    ge = torch.autograd.grad([expected[i] for i in diff], wrt_e, cots, allow_unused=True)
    gg = torch.autograd.grad([got[i] for i in diff], wrt_g, cots, allow_unused=True)
    for k, (e, g) in enumerate(zip(ge, gg, strict=True)):
        if e is None:
            assert g is None or not g.any(), f"{c.name}: grad {k} should be None/zero"
            continue
        assert g is not None, f"{c.name}: grad {k} missing"
        torch.testing.assert_close(g, e, msg=lambda m, k=k: f"{c.name} grad {k}: {m}")


def test_table_is_large_enough():
    assert len(CASES) >= 100
    assert len({c.name for c in CASES}) == len(CASES)
