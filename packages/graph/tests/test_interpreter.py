"""The reference interpreter: semantics, errors, overriding."""

import pytest
import torch
from torchfuse.graph import Interpreter, InterpreterError, run, trace
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import bind_symbols


def test_wrong_input_count_names_the_inputs():
    g, _ = trace(lambda x, y: x + y, torch.randn(2), torch.randn(2))
    with pytest.raises(InterpreterError, match=r"takes 2 inputs \(arg0, arg1\), got 1"):
        run(g, torch.randn(2))


def test_failing_node_is_named_with_its_source_line():
    g, _ = trace(lambda x, w: x @ w, torch.randn(2, 3), torch.randn(3, 4))
    loc = S.SourceLoc(file="model.py", line=7, function="forward", text="y = x @ w")
    g = S.Graph(**{f: getattr(g, f) for f in g.__struct_fields__ if f != "nodes"},
                nodes=tuple(S.Node(**{f: getattr(n, f) for f in n.__struct_fields__ if f != "loc"}, loc=loc)
                            for n in g.nodes))
    with pytest.raises(InterpreterError, match=r"node 'mm' \[aten.mm.default\] failed \(from model.py:7 in forward: y = x @ w\)"):
        run(g, torch.randn(2, 3), torch.randn(5, 4))


def test_symbols_bound_from_inputs_and_hints():
    syms = (S.Symbol(name="s0", source="input:1.size(0)"), S.Symbol(name="s1", hint=9))
    assert bind_symbols(syms, [torch.ones(1), torch.ones(5, 2)]) == {"s0": 5, "s1": 9}


def test_call_node_can_be_overridden():
    g, _ = trace(lambda x: (x + 1).relu(), torch.randn(3))
    seen = []

    class Spy(Interpreter):
        def call_node(self, node, args, kwargs):
            seen.append(node.op)
            return super().call_node(node, args, kwargs)

    x = torch.randn(3)
    torch.testing.assert_close(Spy(g).run(x)[0], (x + 1).relu())
    assert seen == ["aten.add.Tensor", "aten.relu.default"]


def test_symbolic_and_scalar_outputs():
    g = S.Graph(name="g", inputs=(S.GraphInput(name="x"),),
                values={"x": S.TensorMeta(dtype="float32", sizes=("s0",), strides=(1,))},
                symbols=(S.Symbol(name="s0", source="input:0.size(0)"),),
                outputs=(S.GraphOutput(value=S.SymRef(expr="s0 * 2")), S.GraphOutput(value=S.Int(value=3))))
    assert run(g, torch.ones(6)) == [12, 3]
