"""The expression grammar: parse, evaluate, free_symbols, checked against Python itself."""

import itertools

import pytest
from torchfuse.graph.expr import BinOp, Call, ExprError, Name, Num, evaluate, free_symbols, parse, to_python

SMALL = range(-7, 8)


@pytest.mark.parametrize("op", ["//", "%"])
def test_floordiv_and_mod_match_python_exhaustively(op):
    for a, b in itertools.product(SMALL, SMALL):
        if b == 0:
            continue
        want = eval(f"a {op} b", {"a": a, "b": b})
        assert evaluate(f"a {op} b", {"a": a, "b": b}) == want, (a, op, b)
        # literals, including negative ones, parse with Python's precedence
        assert evaluate(f"{a} {op} {b}") == eval(f"{a} {op} {b}"), (a, op, b)


def test_arithmetic_and_comparisons_match_python_over_small_ranges():
    exprs = [
        "a + b * c", "(a + b) * c", "a - b - c", "a * b // c", "a - b % c", "-a + b",
        "-(a - b) * c", "min(a, b) + max(b, c)", "max(a * b, c - 1) // c", "a*b + c - 1",
        "(a*b + c - 1) // c", "a == b", "a != b", "a <= b + c", "a < b", "a >= c", "a > b * c",
        "a % c == 0", "--a", "a - -b",
    ]
    for text in exprs:
        for a, b, c in itertools.product(range(-3, 4), range(-3, 4), [1, 2, 3, -2]):
            env = {"a": a, "b": b, "c": c}
            assert evaluate(text, env) == eval(text, {"min": min, "max": max}, env), (text, env)


def test_parse_builds_a_small_ast():
    assert parse("s0*4 + 1") == BinOp("+", BinOp("*", Name("s0"), Num(4)), Num(1))
    assert parse("max(s0, 2)") == Call("max", (Name("s0"), Num(2)))
    assert parse("  7 ") == Num(7)


def test_free_symbols():
    assert free_symbols("(s0*s1 + XBLOCK - 1) // XBLOCK") == {"s0", "s1", "XBLOCK"}
    assert free_symbols("min(s2, 4) % 3") == {"s2"}
    assert free_symbols(12) == frozenset()
    assert free_symbols("3 + 4") == frozenset()


def test_evaluate_ints_pass_through_and_grid_example():
    assert evaluate(5) == 5
    assert evaluate("(s0*s1 + XBLOCK - 1) // XBLOCK", {"s0": 4, "s1": 100, "XBLOCK": 128}) == 4


@pytest.mark.parametrize("bad", ["", "s0 +", "(s0", "s0 ** 2", "s0 / 2", "3 $ 4", "min(1)", "a < b < c", "1 2"])
def test_malformed_expressions_raise_expr_error(bad):
    with pytest.raises(ExprError):
        parse(bad)


def test_unbound_symbol_is_named():
    with pytest.raises(ExprError, match="s7"):
        evaluate("s7 + 1", {"s0": 1})


def test_to_python_round_trips_through_eval():
    text = "max(s0 - 1, 0) * 8 // 3"
    assert eval(to_python(text), {"s0": 6, "max": max}) == evaluate(text, {"s0": 6})
    assert to_python(4) == "4"
    with pytest.raises(ExprError):
        to_python("s0 +")
