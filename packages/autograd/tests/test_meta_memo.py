"""The meta-kernel memo of the passes (`torchfuse.graph.meta_memo`): with it, every pass
produces the graph it produces without it, node for node and name for name; and it answers
only calls whose output metadata the key determines."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torchfuse.autograd.common as common
from autograd_cases import CASES
from torchfuse.autograd import decompose, functionalize, joint_graph, partition
from torchfuse.graph import run, trace
from torchfuse.graph.archive import to_json
from torchfuse.graph.meta_memo import MEMO


def _pipeline(graph, flags):
    """Every artifact of functionalize -> joint -> decompose -> partition, serialized."""
    f = functionalize(graph)
    j = joint_graph(f, flags)
    d = decompose(j)
    p = partition(d)
    return [to_json(g) for g in (f, j, d, p.forward, p.backward)]


def _without_memo(monkeypatch):
    monkeypatch.setattr(common, "config", dataclasses.replace(common.config, meta_memo=False))


@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_passes_give_the_same_graphs_with_and_without_the_memo(case, monkeypatch):
    inputs = case.make_inputs()
    graph, _ = trace(case.fn, *inputs)
    flags = case.flags(inputs)
    if not any(flags):
        pytest.skip("nothing requires grad")
    MEMO.clear()
    cold = _pipeline(graph, flags)
    warm = _pipeline(graph, flags)  # every answer from the memo this time
    assert MEMO.hits > 0
    with monkeypatch.context() as m:
        _without_memo(m)
        plain = _pipeline(graph, flags)
    assert cold == plain
    assert warm == plain


def _decomposed(fn, *inputs):
    graph, _ = trace(fn, *inputs)
    return decompose(graph, {"aten.silu.default": lambda x: x * torch.sigmoid(x)})


def test_the_python_type_of_a_scalar_is_part_of_the_key():
    # mul(int, 2) stays int64, mul(int, 2.0) is float32, mul(int, True) stays int64: equal as
    # Python values (2 == 2.0, 1 == True), different results
    x = torch.arange(6).reshape(2, 3)

    def f(x):
        mul = torch.ops.aten.mul.Scalar
        return mul(x, 2), mul(x, 2.0), mul(x, True), mul(x, 1), mul(x, 1.0)

    MEMO.clear()
    graph, _ = trace(f, x)
    out = functionalize(graph)  # a retrace, like every pass
    again = functionalize(graph)
    want = [str(t.dtype).removeprefix("torch.") for t in f(x)]
    for g in (graph, out, again):
        recorded = [g.values[o.value.name].dtype for o in g.outputs]
        assert recorded == want == ["int64", "float32", "int64", "int64", "float32"]
        for a, b in zip(run(g, x), f(x), strict=True):
            torch.testing.assert_close(a, b)


def test_views_are_not_answered_from_the_memo():
    # a view must share its base's storage: as_strided over a view reads the base's elements
    def f(x):
        v = x.view(6, 4)[1:]
        return torch.nn.functional.silu(torch.as_strided(v, (2, 2), (1, 4), 0))

    x = torch.randn(4, 6)
    MEMO.clear()
    first = _decomposed(f, x)
    second = _decomposed(f, x)
    assert to_json(first) == to_json(second)
    torch.testing.assert_close(run(second, x)[0], f(x))
    assert not any(k[0].name().startswith(("aten::view", "aten::slice", "aten::as_strided"))
                   for k in MEMO._entries)
