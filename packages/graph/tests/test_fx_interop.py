"""torch.fx interop: Graph -> GraphModule -> Graph round trips, and foreign fx graphs."""

import operator

import msgspec
import pytest
import torch
import torch.fx
from torchfuse.graph import Graph, run, trace
from torchfuse.graph.fixtures import fixture_names, load_fixture
from torchfuse.graph.fx_interop import from_fx, to_fx
from torchfuse.graph.verify import verify

GRAPHS = [n for n in fixture_names() if isinstance(load_fixture(n)[0], Graph)]


def _same(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", GRAPHS)
def test_to_fx_runs_like_the_interpreter(name):
    graph, inputs, expected, _ = load_fixture(name)
    gm = to_fx(graph)
    assert isinstance(gm, torch.fx.GraphModule)
    got = gm(*[t.clone() for t in inputs])
    for a, b in zip(got, expected, strict=True):
        _same(a, b)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and n.target is not torch.ops.aten.sym_size.int]
    assert [n.meta["torchfuse"].name for n in calls] == [n.name for n in graph.nodes]


@pytest.mark.parametrize("name", [n for n in GRAPHS if n != "symbolic_sizes"])
def test_graph_fx_graph_round_trip(name):
    graph, inputs, expected, _ = load_fixture(name)
    back = from_fx(to_fx(graph), [t.clone() for t in inputs], name=graph.name)
    verify(back)
    assert [n.op for n in back.nodes] == [n.op for n in graph.nodes]
    assert [n.args for n in back.nodes] == [n.args for n in graph.nodes]  # same names: same builder rules
    assert [(i.name, i.kind, i.target) for i in back.inputs] == [(i.name, i.kind, i.target) for i in graph.inputs]
    unflagged = {k: msgspec.structs.replace(v, requires_grad=False) for k, v in graph.values.items()}
    assert back.values == unflagged  # the examples do not require grad
    for a, b in zip(run(back, *inputs), expected, strict=True):
        _same(a, b)


def test_symbolic_graph_round_trips_at_the_example_size():
    graph, inputs, expected, _ = load_fixture("symbolic_sizes")
    gm = to_fx(graph)
    assert any(n.target is torch.ops.aten.sym_size.int for n in gm.graph.nodes)
    assert any(n.target is operator.mul for n in gm.graph.nodes)
    back = from_fx(gm, inputs)
    verify(back)
    assert back.values[back.inputs[0].name].sizes == tuple(inputs[0].shape)  # concrete after import
    for a, b in zip(run(back, *inputs), expected, strict=True):
        _same(a, b)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.lin(x))) * self.scale


def test_from_symbolic_trace_module_with_parameters():
    torch.manual_seed(0)
    model = _Block()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(5, 8)
    constants = {}
    graph = from_fx(gm, [x], constants=constants)
    verify(graph)
    kinds = {i.target: i.kind for i in graph.inputs if i.target}
    assert kinds == {"lin.weight": "parameter", "lin.bias": "parameter", "norm.weight": "parameter",
                     "norm.bias": "parameter", "scale": "buffer"}
    args = [x] + [constants[i.name] for i in graph.inputs[1:]]
    _same(run(graph, *args)[0], model(x))


def test_from_fx_checks_input_count():
    gm = to_fx(trace(lambda x, y: x + y, torch.randn(2), torch.randn(2))[0])
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        from_fx(gm, [torch.randn(2)])
