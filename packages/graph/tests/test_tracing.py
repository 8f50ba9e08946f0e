"""Recording torch code into Graphs, checked by running the graph and comparing with eager."""

import pytest
import torch
from torchfuse.graph import DataDependentError, FakeTensor, GraphBuilder, Recorder, run, trace
from torchfuse.graph import schema as S
from torchfuse.graph.tracing import fake_from_meta, is_view_op, mutated_arguments
from torchfuse.graph.verify import verify

GLOBAL_SCALE = torch.tensor([0.5, 2.0, -1.0, 3.0])


def _check(fn, *examples, atol=1e-5):
    graph, constants = trace(fn, *examples)
    verify(graph)
    extra = [constants[i.name] for i in graph.inputs if i.kind == "constant"]
    got = run(graph, *[e.clone() for e in examples], *extra)
    want = fn(*[e.clone() for e in examples])
    want = list(want) if isinstance(want, tuple | list) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-5)
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
    return graph


def ops_of(graph):
    return [n.op for n in graph.nodes]


def test_pointwise_and_reduction():
    g = _check(lambda x, y: ((x + y).relu() * 3).sum(1), torch.randn(4, 8), torch.randn(4, 8))
    assert ops_of(g) == ["aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor", "aten.sum.dim_IntList"]


def test_inplace_ops_get_fresh_ssa_names():
    def f(x):
        y = x.clone()
        y.add_(1)
        y.mul_(2)
        return y, y.sum()

    g = _check(f, torch.randn(3, 3))
    add, mul = g.nodes[1], g.nodes[2]
    assert (add.op, mul.op) == ("aten.add_.Tensor", "aten.mul_.Tensor")
    assert mul.args[0] == S.TensorRef(name=add.outputs[0])  # the mutated value, by its new name
    assert len({o for n in g.nodes for o in n.outputs}) == len(g.nodes)
    assert g.outputs[0].value == S.TensorRef(name=mul.outputs[0])


def test_views():
    def f(x):
        return x[1:, ::2].permute(1, 0), x.view(2, 2, 6).transpose(0, 2), x.t().contiguous(), x.unsqueeze(0)

    g = _check(f, torch.randn(4, 6))
    assert "aten.permute.default" in ops_of(g) and "aten.slice.Tensor" in ops_of(g)
    assert g.values[g.outputs[0].value.name].storage_offset == 6


def test_multi_output_ops():
    def f(x, w, b):
        out = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
        a, c = torch.split(x, [1, 3])
        return (*out, a * 2, c.sum(0))

    g = _check(f, torch.randn(4, 8), torch.randn(8), torch.randn(8))
    ln = g.nodes[0]
    assert ln.op == "aten.native_layer_norm.default" and len(ln.outputs) == 3
    split = next(n for n in g.nodes if n.op.startswith("aten.split"))
    assert len(split.outputs) == 2


def test_factory_functions():
    def f(x):
        return x + torch.ones(4, 4), torch.arange(4, dtype=torch.float32) * x[0], torch.zeros_like(x)

    g = _check(f, torch.randn(4, 4))
    assert {"aten.ones.default", "aten.arange.default", "aten.zeros_like.default"} <= set(ops_of(g))
    assert not [i for i in g.inputs if i.kind == "constant"]  # factories are nodes, not constants


def test_an_op_of_python_numbers_only_is_a_node_on_the_fake_device():
    # ATen wraps the numbers and runs its CPU kernel: the result still becomes a fake tensor
    def f(x):
        n = torch.div(16, 4, rounding_mode="trunc")
        h = torch.add(2.5, 1)
        return x * n, n, h

    g = _check(f, torch.randn(3))
    assert ops_of(g).count("aten.div.Tensor_mode") == 1 and "aten.add.Tensor" in ops_of(g)


def test_constants_from_globals_become_constant_inputs():
    g, constants = trace(lambda x: x * GLOBAL_SCALE, torch.randn(3, 4))
    const = [i for i in g.inputs if i.kind == "constant"]
    assert len(const) == 1 and constants[const[0].name] is GLOBAL_SCALE
    _check(lambda x: x * GLOBAL_SCALE, torch.randn(3, 4))


def test_dtype_promotion_and_integer_ops():
    g = _check(lambda x, i: (x * i, i // 2, (i > 1).to(torch.int32)),
               torch.randn(5), torch.arange(5))
    assert g.values[g.outputs[0].value.name].dtype == "float32"


def test_data_dependent_ops_raise():
    with pytest.raises(DataDependentError):
        trace(lambda x: x.nonzero(), torch.randn(3))
    with pytest.raises(DataDependentError):
        trace(lambda x: x.sum().item(), torch.randn(3))


def test_autograd_grad_through_fakes_records_backward_ops():
    x0, w0 = torch.randn(4, 8), torch.randn(8, 3)

    def loss_fn(x, w):
        return (torch.nn.functional.layer_norm(x, (8,)) @ w).sin().sum()

    rec = Recorder(GraphBuilder("joint"))
    with rec:
        x = rec.input(x0, name="x", requires_grad=True)
        w = rec.input(w0, name="w", requires_grad=True)
        loss = loss_fn(x, w)
        gx, gw = torch.autograd.grad(loss, [x, w])
    rec.output(loss, kind="loss")
    rec.output(gx, kind="gradient", target="x")
    rec.output(gw, kind="gradient", target="w")
    graph = rec.builder.build()
    verify(graph)
    ops = ops_of(graph)
    assert "aten.native_layer_norm_backward.default" in ops and "aten.cos.default" in ops

    xr, wr = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
    eager = loss_fn(xr, wr)
    egx, egw = torch.autograd.grad(eager, [xr, wr])
    loss_v, gx_v, gw_v = run(graph, x0, w0)
    torch.testing.assert_close(loss_v, eager.detach())
    torch.testing.assert_close(gx_v, egx)
    torch.testing.assert_close(gw_v, egw)


def test_fake_tensor_reports_device_and_never_holds_data():
    meta = S.TensorMeta(dtype="float16", sizes=(2, 3), strides=(3, 1), storage_offset=1, device="cuda")
    fake = fake_from_meta(meta)
    assert isinstance(fake, FakeTensor)
    assert fake.device == torch.device("cuda") and fake.dtype == torch.float16
    assert fake.storage_offset() == 1 and fake._elem.device.type == "meta"
    out = fake.float() * 2  # metadata propagates outside a recorder
    assert out.shape == (2, 3) and out.device.type == "cuda" and out.dtype == torch.float32


def test_fake_from_meta_with_symbols():
    meta = S.TensorMeta(dtype="float32", sizes=("s0", 4), strides=(4, 1))
    assert fake_from_meta(meta, {"s0": 7}).shape == (7, 4)


def test_location_tags_nodes():
    loc = S.SourceLoc(file="m.py", line=3, function="f", text="y = x + 1")
    example = torch.randn(2)
    rec = Recorder()
    with rec:
        x = rec.input(example)
        with rec.location(loc, "layers.0"):
            y = x + 1
        z = y * 2
    rec.output(z)
    g = rec.builder.build()
    assert g.nodes[0].loc == loc and g.nodes[0].module_path == "layers.0"
    assert g.nodes[1].loc is None


def test_schema_helpers():
    assert mutated_arguments(torch.ops.aten.add_.Tensor) == [0]
    assert mutated_arguments(torch.ops.aten.add.Tensor) == []
    assert is_view_op(torch.ops.aten.view.default) and is_view_op(torch.ops.aten.permute.default)
    assert not is_view_op(torch.ops.aten.add_.Tensor) and not is_view_op(torch.ops.aten.clone.default)


def _probing_fresh(taken: set[str], hint: str) -> str:
    """GraphBuilder.fresh as it was: the first free of stem, stem_1, ... probed from the stem."""
    import re

    base = re.sub(r"\W", "_", hint).strip("_") or "v"
    if base[0].isdigit():
        base = "v" + base
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def test_fresh_names_are_those_of_the_probing_search():
    # hints that collide with each other's suffixed names ("mul_2" before the second "mul"),
    # that sanitize to the same stem ("a.b", "a b"), empty and digit-led ones
    import random

    hints = ["mul", "mul_2", "mul", "mul", "mul_1", "mul_1", "a.b", "a b", "a_b", "", "_", "3x",
             "v3x", "v3x_1", "add", "mul_2_1", "mul_2", "x", "x_1_1", "x_1", "x", "x"]
    rng = random.Random(0)
    hints += [rng.choice(["mul", "mul_1", "mul_3", "add", "add_2", "sum", "sum_1_1", "1"]) for _ in range(2000)]
    builder = GraphBuilder()
    taken: set[str] = set()
    for h in hints:
        assert builder.fresh(h) == _probing_fresh(taken, h), h


def test_fresh_is_linear_in_the_values_of_one_stem():
    import time

    def seconds(n: int) -> float:
        builder = GraphBuilder()
        t0 = time.perf_counter()
        for _ in range(n):
            builder.fresh("mul")
        return time.perf_counter() - t0

    seconds(1000)  # warm
    # quadratic probing: 20000 names took ~400x the time of 1000; linear is ~20x
    assert seconds(20000) < 100 * max(seconds(1000), 1e-4)
