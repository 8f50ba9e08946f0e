"""functionalize and joint_graph on their own: structure of the graphs they produce, checked
by running them with the reference interpreter against eager."""

from __future__ import annotations

import pytest
import torch
from autograd_cases import CASES
from torchfuse.autograd import functionalize, joint_graph
from torchfuse.autograd.functionalize import HIDDEN_MUTATIONS, functional_variant
from torchfuse.graph import FakeTensor, load, run, save, trace
from torchfuse.graph import schema as S
from torchfuse.graph.ops import resolve_op
from torchfuse.graph.tracing import mutated_arguments

aten = torch.ops.aten

MUTATING = [c for c in CASES if c.name.startswith(("inplace_", "input_", "batch_norm_train"))]


def _no_mutation(graph: S.Graph) -> bool:
    return not any(mutated_arguments(resolve_op(n.op)) or n.op in HIDDEN_MUTATIONS for n in graph.nodes)


@pytest.mark.parametrize("c", MUTATING, ids=[c.name for c in MUTATING])
def test_functionalized_graph_has_no_mutation_and_same_values(c, tmp_path):
    inputs = c.make_inputs()
    graph, consts = trace(c.fn, *inputs)
    assert not _no_mutation(graph)
    save(graph, tmp_path / "g.zip")
    fg = functionalize(load(tmp_path / "g.zip"))
    assert _no_mutation(fg)
    eager_in = [t.clone() for t in inputs]
    expected = c.fn(*eager_in)
    expected = list(expected) if isinstance(expected, tuple | list) else [expected]
    func_in = [t.clone() for t in inputs]
    got = run(fg, *func_in, *consts.values())
    for e, g in zip(expected, got, strict=False):
        torch.testing.assert_close(g, e)
    for t, before in zip(func_in, inputs, strict=True):
        assert torch.equal(t, before), "a functional graph must not write to its inputs"
    mutated = {o.target: g for o, g in zip(fg.outputs, got, strict=True) if o.kind == "mutated_input"}
    names = [i.name for i in fg.inputs]
    for name, t_after in zip(names, eager_in, strict=False):
        if name in mutated:
            torch.testing.assert_close(mutated[name], t_after)
        elif t_after.dtype.is_floating_point:
            assert torch.equal(t_after, inputs[names.index(name)])


def test_docstring_example():
    def f(x, y):
        x[1].add_(y)
        return x * 2

    graph, _ = trace(f, torch.randn(4, 4), torch.randn(4))
    fg = functionalize(graph)
    assert [n.op for n in fg.nodes] == ["aten.select.int", "aten.add.Tensor",
                                        "aten.select_scatter.default", "aten.mul.Tensor"]
    assert [(o.kind, o.target) for o in fg.outputs] == [("user_output", None), ("mutated_input", "arg0")]


def test_functional_variants_by_schema():
    assert functional_variant(aten.add_.Tensor) is aten.add.Tensor
    assert functional_variant(aten.bernoulli_.float) is aten.bernoulli.p
    assert functional_variant(aten.index_put_.default) is aten.index_put.default
    assert functional_variant(aten._native_batch_norm_legit.default) is \
        aten._native_batch_norm_legit_functional.default


def test_functionalize_keeps_functional_graphs_and_marks_aliases():
    graph, _ = trace(lambda x: (x.t(), x.sin(), x[0]), torch.randn(3, 3))
    fg = functionalize(graph)
    assert [n.op for n in fg.nodes] == [n.op for n in graph.nodes]
    assert [o.aliases_input for o in fg.outputs] == ["arg0", None, "arg0"]


def test_in_place_metadata_change_of_an_input_is_an_error():
    def f(x):
        x.t_()
        return x + 1

    graph, _ = trace(f, torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="changes the shape or strides of a graph input"):
        functionalize(graph)


def test_joint_graph_structure_and_values():
    def f(x, w, unused):
        return (x @ w).tanh().sum(), (x @ w).argmax()

    x, w, u = torch.randn(3, 4), torch.randn(4, 2), torch.randn(2)
    graph, _ = trace(f, x, w, u)
    joint = joint_graph(graph, [False, True, True])
    assert [(i.kind, i.target) for i in joint.inputs[3:]] == [("tangent", "output:0")]
    assert [(o.kind, o.target) for o in joint.outputs] == [
        ("user_output", None), ("user_output", None), ("gradient", "arg1"), ("gradient", "arg2")]
    assert isinstance(joint.outputs[3].value, S.NoneArg), "unused input: undefined gradient"
    assert joint.meta["autograd.num_fwd_outputs"] == "2"
    assert not any(n.op == "aten.detach.default" for n in joint.nodes)
    cot = torch.tensor(1.5)
    loss, am, gw, gu = run(joint, x, w, u, cot)
    wr = w.clone().requires_grad_()
    ref = f(x, wr, u)
    (ew,) = torch.autograd.grad(ref[0], wr, cot)
    torch.testing.assert_close(loss, ref[0])
    torch.testing.assert_close(am, ref[1])
    torch.testing.assert_close(gw, ew)
    assert gu is None


def test_joint_graph_of_a_mutating_graph_functionalizes_first():
    def f(x, buf):
        buf.add_(1)
        return (x * buf).sum()

    graph, _ = trace(f, torch.randn(3), torch.randn(3))
    joint = joint_graph(graph, [True, False])
    assert [o.kind for o in joint.outputs] == ["user_output", "mutated_input", "gradient"]
    x, buf = torch.randn(3), torch.randn(3)
    loss, new_buf, gx = run(joint, x, buf, torch.tensor(1.0))
    torch.testing.assert_close(loss, (x * (buf + 1)).sum())
    torch.testing.assert_close(new_buf, buf + 1)
    torch.testing.assert_close(gx, buf + 1)


def test_joint_graph_for_a_device_this_build_lacks():
    fake = FakeTensor(torch.empty(3, 4, device="meta"), "cuda")
    graph, _ = trace(lambda x: x.sin().sum(), fake)
    assert graph.values["arg0"].device == "cuda"
    joint = joint_graph(graph, [True])
    assert {m.device for m in joint.values.values()} == {"cuda"}
    assert "aten.cos.default" in [n.op for n in joint.nodes]


def test_requires_grad_length_is_checked():
    graph, _ = trace(lambda x: x.sin(), torch.randn(3))
    with pytest.raises(RuntimeError, match="requires_grad has 2 entries"):
        joint_graph(graph, [True, False])


def test_pass_recorder_folds_real_scalars_into_the_graph():
    from torchfuse.autograd.common import AutogradError, PassRecorder
    from torchfuse.graph import GraphBuilder

    x = torch.randn(3)
    rec = PassRecorder(GraphBuilder())
    with rec:
        fx = rec.input(x, name="x")
        y = fx * torch.tensor(2.5)
    rec.output(y)
    graph = rec.builder.build()
    assert [i.name for i in graph.inputs] == ["x"]
    assert "aten.scalar_tensor.default" in [n.op for n in graph.nodes]
    torch.testing.assert_close(run(graph, x)[0], x * 2.5)
    ones = torch.ones(3)
    with pytest.raises(AutogradError, match="only scalars"), rec:
        fx * ones
