"""The reference interpreter: semantics, errors, overriding."""

import msgspec
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
    # the value table (wrongly) records w as 5x4, so the inputs pass their check and mm fails
    w = g.inputs[1].name
    g = msgspec.structs.replace(g, values={**g.values, w: msgspec.structs.replace(
        g.values[w], sizes=(5, 4), strides=(4, 1))})
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


def _rotary_angles(inv_freq, pos):
    # HF's rotary embeddings: a float32 matmul forced with autocast disabled
    with torch.autocast("cpu", enabled=False):
        return (inv_freq[:, None] @ pos[None, :]).cos()


def test_a_graph_runs_with_autocast_off():
    """A graph holds autocast's casts already: an autocast around the call must not cast its
    ops again (the float32 mm of an autocast-disabled region would become a bf16 one)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    pos = torch.arange(2048, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g, _ = trace(_rotary_angles, inv_freq, pos)
        assert g.values[g.nodes[-2].outputs[0]].dtype == "float32"
        got = run(g, inv_freq, pos)[0]
        assert torch.is_autocast_enabled("cpu")  # restored after the run
    want = _rotary_angles(inv_freq, pos)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_no_autocast_restores_the_state_and_nests():
    from torchfuse.graph.interpreter import no_autocast

    assert not torch.is_autocast_enabled("cpu")
    with no_autocast():
        assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with no_autocast(["cpu"]):
            assert not torch.is_autocast_enabled("cpu")
            with no_autocast():
                assert not torch.is_autocast_enabled("cpu")
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
