"""Symbolic sizes: SymNode arithmetic, range decisions, guards, text round trips, tracing."""

from __future__ import annotations

import pytest
import sympy
import torch
from torchfuse.graph.expr import evaluate
from torchfuse.graph.interpreter import bind_symbols, run
from torchfuse.graph.symbolic import SizeEnv, SpecializationError, node_of, to_text
from torchfuse.graph.tracing import trace
from torchfuse.graph.verify import verify


def test_symbols_start_at_two():
    env = SizeEnv()
    with pytest.raises(ValueError, match="specialized"):
        env.symbol(1)
    with pytest.raises(ValueError, match="outside"):
        env.symbol(9, min=2, max=8)


def test_arithmetic_keeps_expression_and_hint():
    env = SizeEnv()
    s0, s1 = env.symbol(6), env.symbol(4)
    n = (s0 * s1 + 3) // 2 - s1 % 3
    node = node_of(n)
    assert node.hint == (6 * 4 + 3) // 2 - 4 % 3
    text = to_text(node.expr)
    assert evaluate(text, {"s0": 6, "s1": 4}) == node.hint
    assert evaluate(text, {"s0": 11, "s1": 7}) == (11 * 7 + 3) // 2 - 7 % 3


@pytest.mark.parametrize("rel,expected", [
    ("s0 == 1", False), ("s0 != 0", True), ("s0 >= 2", True), ("s0*s1 != s0", True),
    ("s0 < 2", False), ("s0*s1 - s1 >= s1", True),
])
def test_ranges_decide_without_guards(rel, expected):
    env = SizeEnv()
    env.symbol(5), env.symbol(3)
    assert env.decide(env.to_sympy(rel)) is expected
    assert env.guards == []


def test_undecided_relation_becomes_a_guard_once():
    env = SizeEnv()
    s0, s1 = env.symbol(5), env.symbol(5)
    assert bool(s0 == s1) is True
    assert bool(s1 == s0) is True
    assert [g for g, _ in env.guards] == ["s0 == s1"]
    # after the guard, s1 is written as s0
    assert env.text(node_of(s1 * 2).expr) == "2*s0"


def test_guard_int_specializes_and_strict_symbols_refuse():
    env = SizeEnv()
    s0 = env.symbol(7)
    assert int(s0) == 7
    assert [g for g, _ in env.guards] == ["s0 == 7"]
    strict = SizeEnv()
    t = strict.symbol(7, strict=True, source="input:0.size(0)")
    with pytest.raises(SpecializationError, match="marked dynamic"):
        int(t)


def test_trace_dynamic_runs_at_other_sizes():
    def f(x, y):
        z = (x * y).sum(-1) + 1
        flat = torch.softmax(x.view(x.shape[0] * x.shape[1], -1), -1)
        return flat, z, torch.nn.functional.layer_norm(x, (x.shape[-1],)), torch.cat([x, y], 1)

    x, y = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    g, _ = trace(f, x, y, dynamic={0: [0, 1], 1: [0, 1]})
    verify(g)
    assert g.values[g.inputs[0].name].sizes == ("s0", "s1", 8)
    assert g.values[g.inputs[1].name].sizes == ("s0", "s1", 8)  # unified by the guards
    assert {gd.expr for gd in g.guards} == {"s0 == s2", "s1 == s3"}
    for shape in [(2, 2, 8), (6, 7, 8), (3, 11, 8)]:
        a, b = torch.randn(shape), torch.randn(shape)
        out = run(g, a, b)
        for got, want in zip(out, f(a, b), strict=True):
            torch.testing.assert_close(got, want)
        env = bind_symbols(g.symbols, [a, b])
        assert all(evaluate(gd.expr, env) for gd in g.guards)


def test_trace_shape_dependent_branch_is_guarded():
    def f(x):
        if x.shape[0] > 4:
            return x * 2
        return x + 1

    g, _ = trace(f, torch.randn(6, 3), dynamic={0: [0]})
    assert [gd.expr for gd in g.guards] == ["s0 > 4"]
    assert [n.op for n in g.nodes] == ["aten.mul.Tensor"]


def test_text_round_trip_matches_sympy():
    env = SizeEnv()
    s0, s1 = (node_of(env.symbol(h)).expr for h in (9, 4))
    for e in [s0 * s1 - s1, sympy.floor(s0 / 4), sympy.Max(s0, s1 + 2), sympy.Mod(s0, 8),
              sympy.ceiling(s0 * s1 / 3), s0 ** 2]:
        text = to_text(e)
        for v0, v1 in [(9, 4), (13, 2), (64, 7)]:
            assert evaluate(text, {"s0": v0, "s1": v1}) == int(e.subs({s0: v0, s1: v1}))


def test_a_negated_disjunction_becomes_two_guards():
    env = SizeEnv()
    s0 = env.symbol(8)
    half = s0 // 2
    rel = node_of(half == 1).expr | node_of((s0 - half) == 1).expr  # what chunk() asks
    env.assume(rel, False)
    assert sorted(g for g, _ in env.guards) == ["s0 - (s0//2) != 1", "s0//2 != 1"]
    for g, _ in env.guards:  # written in the grammar, true for the hint
        assert evaluate(g, {"s0": 8}) is True


def test_new_symbols_never_reuse_a_name():
    from torchfuse.graph import schema as S
    from torchfuse.graph.symbolic import env_from_symbols

    env = env_from_symbols((S.Symbol(name="s0", hint=4), S.Symbol(name="s2", hint=6)))
    fresh = node_of(env.symbol(5)).expr
    assert fresh.name not in ("s0", "s2")
    with pytest.raises(ValueError, match="exists already"):
        env.symbol(3, name="s0")
