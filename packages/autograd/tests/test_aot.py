"""The ``aot`` glue and the ``aot_eager`` backend: training, inference path, mutated inputs,
aliasing and non-differentiable outputs, double backward, compilers, logging."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import DoubleBackwardError, aot, aot_eager, interpreter_compiler
from torchfuse.autograd import config as aconfig
from torchfuse.graph import GraphBuilder, Recorder, load, run, save, trace


def _mlp_graph(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """The loss of a 2-layer MLP recorded with params as inputs of kind ``parameter``."""
    rec = Recorder(GraphBuilder("mlp_loss"))
    with rec:
        p = {name: rec.input(t, name=name.replace(".", "_"), kind="parameter", target=name,
                             requires_grad=True) for name, t in params.items()}
        xf = rec.input(x, name="x")
        yf = rec.input(y, name="y")
        h = torch.tanh(F.linear(xf, p["fc1.weight"], p["fc1.bias"]))
        logits = F.linear(h, p["fc2.weight"], p["fc2.bias"])
        loss = F.cross_entropy(logits, yf)
    rec.output(loss)
    return rec.builder.build()


def _eager_loss(params, x, y):
    h = torch.tanh(F.linear(x, params["fc1.weight"], params["fc1.bias"]))
    return F.cross_entropy(F.linear(h, params["fc2.weight"], params["fc2.bias"]), y)


def test_mlp_trains_with_aot_eager_like_eager(tmp_path):
    torch.manual_seed(0)
    init = {"fc1.weight": torch.randn(16, 8) * 0.3, "fc1.bias": torch.zeros(16),
            "fc2.weight": torch.randn(4, 16) * 0.3, "fc2.bias": torch.zeros(4)}
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    graph = _mlp_graph(init, x, y)
    assert [i.kind for i in graph.inputs] == ["parameter"] * 4 + ["user_input"] * 2
    save(graph, tmp_path / "mlp")
    graph = load(tmp_path / "mlp")

    ours = {k: v.clone().requires_grad_() for k, v in init.items()}
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    compiled = aot_eager(graph, [*ours.values(), x, y])
    lr, losses, ref_losses = 0.5, [], []
    for _ in range(20):
        (loss,) = compiled(*ours.values(), x, y)
        loss.backward()
        ref_loss = _eager_loss(ref, x, y)
        ref_loss.backward()
        with torch.no_grad():
            for p, q in zip(ours.values(), ref.values(), strict=True):
                p -= lr * p.grad
                q -= lr * q.grad
                p.grad = q.grad = None
        losses.append(loss.item())
        ref_losses.append(ref_loss.item())
    assert losses[-1] < losses[0] * 0.8, "the loss should go down"
    for a, b in zip(losses, ref_losses, strict=True):
        assert abs(a - b) <= 1e-5, (losses, ref_losses)


def test_aot_eager_is_registered_as_a_backend():
    (ep,) = [e for e in importlib.metadata.entry_points(group="torchfuse.backends") if e.name == "aot_eager"]
    assert ep.load() is aot_eager


def _counting_compiler(log: list[str], tag: str):
    def compiler(graph, example_inputs):
        log.append(f"{tag}:{graph.name}:{len(example_inputs)}")
        return lambda *args: run(graph, *args)
    return compiler


def test_backward_compiles_lazily_and_once():
    log: list[str] = []
    graph, _ = trace(lambda x: (x.sin() * 2).sum(), torch.randn(4))
    f = aot(graph, _counting_compiler(log, "fw"), _counting_compiler(log, "bw"))
    x = torch.randn(4, requires_grad=True)
    out = f(x)[0]
    assert log == ["fw:graph_forward:1"]
    out.backward()
    assert len(log) == 2 and log[1].startswith("bw:graph_backward:")
    f(x)[0].backward()
    assert len(log) == 2
    torch.testing.assert_close(x.grad, 2 * 2 * x.detach().cos())


def test_inference_path_under_no_grad_and_without_grad_inputs():
    graph, _ = trace(lambda x, w: F.linear(x, w).relu(), torch.randn(3, 4), torch.randn(5, 4))
    f = aot(graph, interpreter_compiler)
    x, w = torch.randn(3, 4), torch.randn(5, 4, requires_grad=True)
    with torch.no_grad():
        out = f(x, w)[0]
    assert not out.requires_grad
    torch.testing.assert_close(out, F.linear(x, w).relu())
    assert [s.name for s in f.stages] == ["functionalize", "decompose"]
    out2 = f(x, w.detach())[0]
    assert not out2.requires_grad
    assert "joint_graph" not in [s.name for s in f.stages]
    out3 = f(x, w)[0]
    assert out3.requires_grad and "joint_graph" in [s.name for s in f.stages]


def test_inference_path_writes_mutated_inputs_back():
    def fn(x, buf):
        buf.add_(x)
        return x * 2
    x, buf = torch.randn(3), torch.zeros(3)
    graph, _ = trace(fn, x, buf)
    f = aot(graph, interpreter_compiler)
    out = f(x, buf)
    assert len(out) == 1
    torch.testing.assert_close(buf, x)
    torch.testing.assert_close(out[0], x * 2)


def test_mutated_input_requiring_grad_non_leaf():
    def fn(x):
        x.mul_(3)
        return x.sin()
    base = torch.randn(4, requires_grad=True)
    graph, _ = trace(fn, base.detach())
    f = aot(graph, interpreter_compiler)
    x = base * 1
    out = f(x)[0]
    (g,) = torch.autograd.grad((out.sum() + x.sum()), base)
    ref_base = base.detach().requires_grad_()
    xr = ref_base * 1
    outr = fn(xr)
    (e,) = torch.autograd.grad((outr.sum() + xr.sum()), ref_base)
    torch.testing.assert_close(x, xr)
    torch.testing.assert_close(g, e)


def test_outputs_aliasing_inputs_are_views_of_the_real_input():
    graph, _ = trace(lambda x: (x.view(-1), x.t(), x, x.exp()), torch.randn(3, 4))
    f = aot(graph, interpreter_compiler)
    x = torch.randn(3, 4, requires_grad=True)
    flat, t, same, _ = f(x)
    assert flat.data_ptr() == x.data_ptr() and flat._base is x
    assert t.stride() == (1, 4) and t._base is x
    assert same is x
    (g,) = torch.autograd.grad(flat.sum() + 2 * t.sum(), x)
    torch.testing.assert_close(g, torch.full((3, 4), 3.0))
    aliases = [o.aliases_input for o in f.functional.outputs]
    assert aliases == ["arg0", "arg0", "arg0", None]


def test_non_differentiable_outputs():
    graph, _ = trace(lambda x: (x.softmax(-1), x.argmax(-1), x > 0), torch.randn(3, 4))
    f = aot(graph, interpreter_compiler)
    x = torch.randn(3, 4, requires_grad=True)
    sm, am, pos = f(x)
    assert sm.requires_grad and not am.requires_grad and not pos.requires_grad
    assert am.dtype == torch.int64 and pos.dtype == torch.bool
    torch.testing.assert_close(am, x.argmax(-1))


def test_double_backward_is_a_clear_error():
    graph, _ = trace(lambda x: (x ** 3).sum(), torch.randn(3))
    f = aot(graph, interpreter_compiler)
    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(f(x)[0], x, create_graph=True)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    with pytest.raises(DoubleBackwardError, match="differentiable only once"):
        torch.autograd.grad(g.sum(), x)


def test_requires_grad_argument_restricts_gradients():
    graph, _ = trace(lambda x, y: (x * y).sum(), torch.randn(3), torch.randn(3))
    f = aot(graph, interpreter_compiler, requires_grad=[True, False])
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    f(x, y)[0].backward()
    torch.testing.assert_close(x.grad, y.detach())
    assert y.grad is None


def test_list_outputs_keep_their_structure():
    graph, _ = trace(lambda x: (x.split(2), x.sum()), torch.randn(5))
    f = aot(graph, interpreter_compiler)
    x = torch.randn(5, requires_grad=True)
    parts, total = f(x)
    assert isinstance(parts, list) and [p.shape[0] for p in parts] == [2, 2, 1]
    (g,) = torch.autograd.grad(parts[1].sum() * 3 + total, x)
    torch.testing.assert_close(g, torch.tensor([1.0, 1.0, 4.0, 4.0, 1.0]))


def test_wrong_number_of_inputs():
    graph, _ = trace(lambda x: x * 2, torch.randn(3))
    with pytest.raises(RuntimeError, match="takes 1 inputs, got 2"):
        aot(graph, interpreter_compiler)(torch.randn(3), torch.randn(3))


def test_logging_of_graphs(monkeypatch, capsys):
    assert aconfig.from_environment({"TORCHFUSE_LOGS": "graph,aot"}).log_aot
    assert not aconfig.from_environment({"TORCHFUSE_LOGS": "graph"}).log_aot
    assert aconfig.from_environment({"TORCHFUSE_LOGS": "+aot"}).log_level == logging.DEBUG
    assert aconfig.from_environment({"TORCHFUSE_DEBUG": "1"}).verify_passes
    assert not aconfig.from_environment({}).verify_passes
    monkeypatch.setattr("torchfuse.autograd.glue.config", dataclasses.replace(aconfig.config, log_aot=True))
    graph, _ = trace(lambda x: x.sin().sum(), torch.randn(3))
    aot(graph, interpreter_compiler)(torch.randn(3, requires_grad=True))
    text = capsys.readouterr().err
    assert "[torchfuse.aot]" in text
    for title in ("aot joint graph", "aot forward graph", "aot backward graph"):
        assert title in text
    assert "aten.sin.default" in text and "aten.cos.default" in text


def test_symbolic_sizes_share_one_plan():
    import msgspec
    from torchfuse.graph import schema as S

    def fn(x):
        return (x.sin() * x).view(-1)

    graph, _ = trace(fn, torch.randn(5, 3))

    def sym(meta):
        sizes = tuple({5: "s0", 15: "s0*3"}.get(s, s) for s in meta.sizes)
        return msgspec.structs.replace(meta, sizes=sizes)

    def sym_node(node):
        if node.op != "aten.view.default":
            return node
        return msgspec.structs.replace(node, args=(node.args[0], S.ListArg(items=(S.SymRef(expr="s0*3"),))))

    graph = msgspec.structs.replace(
        graph, values={k: sym(m) for k, m in graph.values.items()},
        nodes=tuple(sym_node(n) for n in graph.nodes),
        symbols=(S.Symbol(name="s0", min=2, hint=5, source="input:0.size(0)"),))
    f = aot(graph, interpreter_compiler)
    for rows in (5, 7, 5):
        x = torch.randn(rows, 3, requires_grad=True)
        out = f(x)[0]
        assert out.shape == (rows * 3,)
        (g,) = torch.autograd.grad(out.sum(), x)
        xr = x.detach().requires_grad_()
        (e,) = torch.autograd.grad(fn(xr).sum(), xr)
        torch.testing.assert_close(g, e)
    with torch.no_grad():
        torch.testing.assert_close(f(torch.ones(4, 3))[0], fn(torch.ones(4, 3)))
    assert f.num_plans == 2, "one training plan for every size, one inference plan"


def test_debug_mode_verifies_every_pass(monkeypatch):
    from torchfuse.autograd import AutogradError, glue

    monkeypatch.setattr(glue, "config", dataclasses.replace(aconfig.config, verify_passes=True))
    graph, _ = trace(lambda x: F.gelu(x).sum(), torch.randn(3))
    f = aot(graph, interpreter_compiler)
    x = torch.randn(3, requires_grad=True)
    f(x)[0].backward()
    torch.testing.assert_close(x.grad, torch.autograd.grad(F.gelu(x).sum(), x)[0])

    def broken(graph):  # a pass that forgets a node
        import msgspec
        return msgspec.structs.replace(graph, nodes=graph.nodes[1:])

    f = aot(graph, interpreter_compiler, decompositions={"aten.sin.default": torch.sin})
    monkeypatch.setattr(glue, "decompose", lambda g, table: broken(g))
    with pytest.raises(AutogradError, match="pass 'decompose' produced an invalid graph"):
        f(torch.randn(3, requires_grad=True))
