"""Graphs held inside a graph: ``torchfuse.custom_grad`` (a custom autograd.Function's
backward) and ``torchfuse.checkpoint`` (an activation-checkpointed region). They run with the
reference interpreter, survive an archive, and are verified like the outer graph (an archive
is data from a stranger)."""

from __future__ import annotations

import msgspec
import pytest
import torch
from torchfuse.graph import VerificationError, load, run, save, verify
from torchfuse.graph import custom_grad as CG
from torchfuse.graph import schema as S
from torchfuse.graph.torchfuse_ops import CHECKPOINT, CUSTOM_GRAD, SET_GRAD_ENABLED
from torchfuse.graph.tracing import GraphBuilder, Recorder


def _backward() -> S.Graph:
    """saved x, gradient g -> 3 * g * cos(x): three times sin's derivative, so a test sees
    that this Graph, not ATen's formula, differentiated the output."""
    rec = Recorder(GraphBuilder("backward"))
    with rec:
        x = rec.input(torch.randn(4), name="saved", requires_grad=False)
        g = rec.input(torch.randn(4), name="grad", requires_grad=False)
        out = g * x.cos() * 3
    rec.output(out, kind="gradient")
    return rec.builder.build()


def _outer(text: str) -> S.Graph:
    rec = Recorder(GraphBuilder("outer"))
    with rec:
        x = rec.input(torch.randn(4), name="x", requires_grad=True)
        rec.builder.add_node(SET_GRAD_ENABLED, [S.Bool(value=False)], {}, [])
        with torch.no_grad():
            y = x.sin()
        rec.builder.add_node(SET_GRAD_ENABLED, [S.Bool(value=True)], {}, [])
        (z,) = torch.ops.torchfuse.custom_grad.default(text, [x], [y], [x])
    rec.output(z)
    return rec.builder.build()


def test_the_op_runs_its_backward_graph():
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        y = x.sin()
    (z,) = torch.ops.torchfuse.custom_grad.default(CG.dumps(_backward()), [x], [y], [x])
    torch.testing.assert_close(z, y)
    assert z.requires_grad and z is not y
    z.sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach().cos())


def test_a_graph_holding_it_survives_an_archive_and_the_interpreter(tmp_path):
    graph = _outer(CG.dumps(_backward()))
    assert CUSTOM_GRAD in [n.op for n in graph.nodes]
    verify(graph)
    save(graph, tmp_path / "g")
    loaded = load(tmp_path / "g", kind="graph")
    assert loaded == graph
    x = torch.randn(4, requires_grad=True)
    (z,) = run(loaded, x)
    torch.testing.assert_close(z, x.detach().sin())
    z.sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach().cos())


def test_under_no_grad_it_is_a_copy():
    x = torch.randn(4)
    with torch.no_grad():
        (z,) = run(_outer(CG.dumps(_backward())), x)
    torch.testing.assert_close(z, x.sin())
    assert not z.requires_grad


def _with_text(graph: S.Graph, text: str) -> S.Graph:
    nodes = tuple(msgspec.structs.replace(n, args=(S.Str(value=text), *n.args[1:])) if n.op == CUSTOM_GRAD
                  else n for n in graph.nodes)
    return msgspec.structs.replace(graph, nodes=nodes)


def test_verify_checks_the_backward_graph_too():
    good = _backward()
    with pytest.raises(VerificationError, match="backward graph: not a valid Graph"):
        verify(_with_text(_outer(CG.dumps(good)), '{"nodes": 3}'))
    hostile = msgspec.structs.replace(good, nodes=tuple(
        msgspec.structs.replace(n, op="builtins.exec.default") if k == 0 else n
        for k, n in enumerate(good.nodes)))
    with pytest.raises(VerificationError, match=r"backward graph: .*unknown op"):
        verify(_with_text(_outer(CG.dumps(good)), CG.dumps(hostile)))
    with pytest.raises(VerificationError, match=r"backward graph: .* over the"):
        verify(_with_text(_outer(CG.dumps(good)), " " * (CG._MAX_TEXT + 1)))


def _region() -> S.Graph:
    rec = Recorder(GraphBuilder("region"))
    with rec:
        x = rec.input(torch.randn(4), name="x", requires_grad=False)
        w = rec.input(torch.randn(4), name="w", requires_grad=False)
        out = (x.sin() * w).exp()
    rec.output(out)
    return rec.builder.build()


def test_a_checkpointed_region_runs_and_is_recomputed_for_its_gradients():
    from torchfuse.graph import checkpoint_region as CR

    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    (y,) = torch.ops.torchfuse.checkpoint.default(CR.dumps(_region()), [x, w])
    want = (x.sin() * w).exp()
    torch.testing.assert_close(y, want.detach())
    gx, gw = torch.autograd.grad(y.sum(), [x, w])
    ex, ew = torch.autograd.grad(want.sum(), [x, w])
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)
    rec = Recorder(GraphBuilder("outer"))
    with rec:
        a = rec.input(torch.randn(4), name="a")
        (b,) = torch.ops.torchfuse.checkpoint.default(CR.dumps(_region()), [a, a])
    rec.output(b)
    graph = rec.builder.build()
    verify(graph)
    broken = msgspec.structs.replace(graph, nodes=tuple(
        msgspec.structs.replace(n, args=(S.Str(value="[]"), *n.args[1:])) if n.op == CHECKPOINT else n
        for n in graph.nodes))
    with pytest.raises(VerificationError, match="region graph: not a valid Graph"):
        verify(broken)


def test_a_symbol_used_only_in_a_list_argument_counts_as_used():
    """A symbol a held graph mentions only inside a list argument (a view's sizes) is used:
    with no input to bind it from, the graph cannot be held (it was dropped, leaving the
    view's size unbound)."""
    from torchfuse.graph.graph_symbols import carrier, used_symbols

    flat = S.TensorMeta(dtype="float32", sizes=[32], strides=[1])
    view = S.Node(name="v", op="aten.view.default", kwargs={}, outputs=("v",),
                  args=(S.TensorRef(name="y"), S.ListArg(items=(S.SymRef(expr="s0"), S.Int(value=4)))))
    g = S.Graph(name="g", inputs=(S.GraphInput(name="y"),), nodes=(view,),
                outputs=(S.GraphOutput(value=S.TensorRef(name="v")),),
                values={"y": flat, "v": S.TensorMeta(dtype="float32", sizes=[8, 4], strides=[4, 1])},
                symbols=(S.Symbol(name="s0", source="input:3.size(0)"),), opsets={"aten": 1})
    assert used_symbols(g) == {"s0"} and carrier(g, "s0") is None
    assert CG.bound_to_inputs(g) is None
    carried = msgspec.structs.replace(g, values={**g.values, "y": S.TensorMeta(
        dtype="float32", sizes=["s0", 4], strides=[4, 1])})
    assert carrier(carried, "s0") == "input:0.size(0)"
    assert CG.bound_to_inputs(carried).symbols[0].source == "input:0.size(0)"


def test_a_region_whose_kept_draws_are_malformed_fails_verify():
    """A stranger's region that claims kept draws its nodes do not make: `verify` names it
    (the backward would otherwise derive a recompute from it)."""
    from torchfuse.graph.checkpoint_region import DRAWS, RegionError, recompute_graph

    b = GraphBuilder("region")
    x = b.add_input(S.TensorMeta(dtype="float32", sizes=[3], strides=[1]), name="x")
    (y,) = b.add_node("aten.sin.default", [S.TensorRef(name=x)], {},
                      [S.TensorMeta(dtype="float32", sizes=[3], strides=[1])])
    b.add_output(S.TensorRef(name=y))
    region = msgspec.structs.replace(b.build(), meta={DRAWS: "1"})  # its one output is no draw
    with pytest.raises(RegionError, match="not the clones keep_draws writes"):
        recompute_graph(region)
    outer = GraphBuilder("outer")
    xi = outer.add_input(S.TensorMeta(dtype="float32", sizes=[3], strides=[1]), name="x")
    (o,) = outer.add_node(CHECKPOINT, [S.Str(value=CG.dumps(region)), S.ListArg(items=(S.TensorRef(name=xi),))],
                          {}, [S.TensorMeta(dtype="float32", sizes=[3], strides=[1])])
    outer.add_output(S.TensorRef(name=o))
    with pytest.raises(VerificationError, match="region graph: its kept draws"):
        verify(outer.build(), check_meta=False)
