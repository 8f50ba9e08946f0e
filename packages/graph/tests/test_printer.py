"""Graphs print as runnable Python; guards print as Python expressions."""

import pytest
import torch
from torchfuse.graph import Graph, run, trace
from torchfuse.graph import schema as S
from torchfuse.graph.fixtures import fixture_names, load_fixture
from torchfuse.graph.printer import (
    GUARD_HELPERS,
    describe_meta,
    guard_to_python,
    guards_to_python,
    load_python,
    to_python,
)

GRAPHS = [n for n in fixture_names() if isinstance(load_fixture(n)[0], Graph)]


def _same(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", GRAPHS)
def test_printed_fixture_runs_like_the_interpreter(name):
    graph, inputs, _, _ = load_fixture(name)
    source = to_python(graph)
    fn = load_python(source)
    printed = fn(*[t.clone() for t in inputs])
    reference = run(graph, *[t.clone() for t in inputs])
    assert len(printed) == len(reference)
    for a, b in zip(printed, reference, strict=True):
        _same(a, b)


def test_one_line_per_node_with_metadata_and_locations():
    graph = load_fixture("pointwise_chain")[0]
    source = to_python(graph)
    assert source.startswith("import torch\n")
    assert "def pointwise_chain(x, y):" in source
    assert "    add = torch.ops.aten.add.Tensor(x, y)  # f32[4, 8]\n" in source
    assert "# model.py:3 in forward: a = (x + y) * 2.0" in source
    for node in graph.nodes:
        assert source.count(f"torch.ops.{node.op}(") >= 1
    assert sum(line.lstrip().startswith(tuple(o for o in n.outputs if o)) for line in source.splitlines()
               for n in graph.nodes[:1]) >= 1


def test_multi_output_and_none_outputs():
    def f(x):
        return torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)[0], torch.split(x, 1)[2]

    graph, _ = trace(f, torch.randn(3, 4))
    source = to_python(graph)
    assert "native_layer_norm, native_layer_norm_1, native_layer_norm_2 = " in source
    x = torch.randn(3, 4)
    for a, b in zip(load_python(source)(x), run(graph, x), strict=True):
        _same(a, b)


def test_symbolic_graph_binds_symbols_from_inputs():
    graph = load_fixture("symbolic_sizes")[0]
    source = to_python(graph)
    assert "s0 = x.size(0)" in source and "[s0*8]" in source and "# f32[s0, 8]" in source
    out = load_python(source)(torch.randn(3, 8), torch.randn(8))
    assert out[0].shape == (24,) and out[3] == (3 + 3) // 4


def test_awkward_names_become_identifiers():
    meta = S.TensorMeta(dtype="float32", sizes=(2,), strides=(1,))
    g = S.Graph(name="my graph", inputs=(S.GraphInput(name="input.0"), S.GraphInput(name="lambda")),
                values={"input.0": meta, "lambda": meta, "sum": meta},
                nodes=(S.Node(name="sum", op="aten.add.Tensor",
                              args=(S.TensorRef(name="input.0"), S.TensorRef(name="lambda")), outputs=("sum",)),),
                outputs=(S.GraphOutput(value=S.TensorRef(name="sum")),), opsets={"aten": 1})
    source = to_python(g)
    assert "def my_graph(input_0, v_lambda):" in source
    x = torch.randn(2)
    _same(load_python(source)(x, x)[0], x + x)


def test_describe_meta():
    assert describe_meta(S.TensorMeta(dtype="bfloat16", sizes=(2, 3), strides=(1, 2), device="cuda")) == \
        "bf16[2, 3] strides=(1, 2) cuda"
    assert describe_meta(S.TensorMeta(dtype="int64", sizes=("s0", 4), strides=(4, 1))) == "i64[s0, 4]"


# ----------------------------------------------------------------------------- guards


def _eval(guard, **scope):
    return eval(guard_to_python(guard), {**GUARD_HELPERS, **scope})


def test_tensor_guard():
    g = S.TensorGuard(source="x", dtype="float32", device="cpu", sizes=(4, 8))
    assert guard_to_python(g) == "check_tensor(x, dtype=torch.float32, device='cpu', sizes=(4, 8), requires_grad=False)"
    assert _eval(g, x=torch.randn(4, 8))
    assert not _eval(g, x=torch.randn(4, 9))
    assert not _eval(g, x=torch.randn(4, 8, dtype=torch.float64))
    assert not _eval(g, x=torch.randn(4, 8, requires_grad=True))
    dyn = S.TensorGuard(source="x", dtype="float32", device="cpu", sizes=(None, 8), strides=(8, 1))
    assert _eval(dyn, x=torch.randn(11, 8))
    assert not _eval(dyn, x=torch.randn(8, 11).t())
    sym = S.TensorGuard(source="x", dtype="float32", device="cpu", sizes=("s0", "s0*2"))
    assert _eval(sym, x=torch.randn(3, 6), s0=3) and not _eval(sym, x=torch.randn(3, 5), s0=3)


def test_other_guards():
    assert _eval(S.ConstantGuard(source="n", value="3"), n=3) and not _eval(S.ConstantGuard(source="n", value="3"), n=4)
    assert _eval(S.TypeGuard(source="m", type_name="torch.nn.modules.linear.Linear"), m=torch.nn.Linear(1, 1))
    assert not _eval(S.TypeGuard(source="m", type_name="builtins.int"), m=1.0)
    assert _eval(S.LengthGuard(source="xs", length=2), xs=[1, 2])
    assert not _eval(S.LengthGuard(source="xs", length=2), xs=[1])
    assert _eval(S.GlobalStateGuard(name="grad_enabled", value=str(torch.is_grad_enabled())))
    with torch.no_grad():
        assert not _eval(S.GlobalStateGuard(name="grad_enabled", value="True"))
    autocast = S.GlobalStateGuard(name="autocast_enabled(cpu, cuda)", value="(False, False)")
    assert _eval(autocast)
    with torch.autocast("cpu"):
        assert not _eval(autocast)
    with pytest.raises(KeyError, match="unknown global state"):
        _eval(S.GlobalStateGuard(name="moon_phase", value="full"))
    assert _eval(S.SymbolGuard(expr="s0 % 8 == 0"), s0=16) and not _eval(S.SymbolGuard(expr="s0 % 8 == 0"), s0=4)
    ident = guard_to_python(S.IdentityGuard(source="fn", description="<function relu>"))
    assert "fn is <function relu>" in ident


def test_guards_to_python_keeps_locations():
    graph = load_fixture("symbolic_sizes")[0]
    text = guards_to_python(graph.guards)
    assert text.splitlines()[0] == "# model.py:10 in forward: def forward(self, x, bias):"
    assert "s0 >= 2" in text


def test_describe_guard_shows_a_value_that_calls_a_constructor():
    from torchfuse.graph.printer import describe_guard, guard_to_python
    from torchfuse.graph.schema import ConstantGuard
    from torchfuse.graph.verify import VerificationError

    for value in ("set()", "np.float64(2.0)"):
        guard = ConstantGuard(source="L[1]", value=value)
        assert describe_guard(guard) == f"L[1] == {value}"  # text for a log line
        with pytest.raises(VerificationError, match="calls"):
            guard_to_python(guard)  # never made runnable
