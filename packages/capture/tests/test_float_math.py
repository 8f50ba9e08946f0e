"""``math`` functions of a float that varies between calls (issue 20): ``math.sqrt(f + 1)``
stays in the graph as ``sqrt`` of the float's carrier, guarded only on Python's domain, so one
entry serves every float; out of the domain eager's error is raised. Each test compares with
eager and counts entries and graphs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile

FUNCS = ["sqrt", "exp", "log", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan", "tanh", "atan", "fabs"]


@pytest.mark.parametrize("name", FUNCS)
def test_a_math_function_of_a_varying_float_is_one_entry(name):
    fn = getattr(math, name)

    def f(x, v):
        return x * fn(v * 0.5 + 0.25)

    cf = compile(f, backend="eager")
    x = torch.randn(3, 4, dtype=torch.float64)
    for v in [0.5, 1.5, 2.0, 3.75, 0.125]:
        assert_same(cf(x, v), f(x, v))
    assert len(cf.entries) == 2 and cf.recompiles == 1  # the first constant, then one for all
    ops = [n.op for n in cf.entries[-1].result.graph.nodes]
    assert any(name.replace("fabs", "abs") in op for op in ops), ops


def test_math_of_an_int_symbol_and_of_a_numpy_float():
    def f(x, n, g):
        return x * math.sqrt(n) + math.log(g)

    cf = compile(f, backend="eager")
    x = torch.randn(4)
    for n, g in [(2, np.float64(1.5)), (3, np.float64(2.5)), (7, np.float64(9.0)), (10, np.float64(0.5))]:
        assert_same(cf(x, n, g), f(x, n, g))
    assert len(cf.entries) <= 3 and cf.graph_count() == len(cf.entries)
    assert "sqrt" in " ".join(n.op for n in cf.entries[-1].result.graph.nodes)


@pytest.mark.parametrize("name,bad", [("sqrt", -1.0), ("log", 0.0), ("exp", 1000.0), ("sin", math.inf)])
def test_a_value_out_of_the_domain_raises_as_eager(name, bad):
    fn = getattr(math, name)

    def f(x, v):
        return x + fn(v)

    cf = compile(f, backend="eager")
    x = torch.zeros(2)
    for v in [0.5, 1.5]:
        assert_same(cf(x, v), f(x, v))
    with pytest.raises((ValueError, OverflowError)) as want:
        f(x, bad)
    with pytest.raises(type(want.value)):
        cf(x, bad)
    assert_same(cf(x, 2.5), f(x, 2.5))  # the kept entry still serves values in the domain
    assert cf.recompiles == 2


def test_a_math_result_python_needs_specializes():
    def f(x, v):
        r = math.sqrt(v)
        if r > 1.0:  # Python reads the value: the float is guarded as a constant
            return x * r
        return x - r

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    for v in [0.25, 4.0, 0.5, 9.0]:
        assert_same(cf(x, v), f(x, v))
    assert len(cf.entries) == 4  # one per value, as before


def test_a_math_function_of_a_random_draw_is_drawn_per_call():
    import random

    def f(x):
        return x * math.exp(random.random())

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    got, want = [], []
    for seed in [1, 2, 3]:
        random.seed(seed)
        got.append(cf(x))
        random.seed(seed)
        want.append(f(x))
    assert_same(got, want)


def test_floor_ceil_trunc_of_a_varying_float_are_int_carriers():
    def f(x, i, v):
        return x * math.floor(v) + math.ceil(v * 2), i * math.trunc(v), x > math.floor(v)

    cf = compile(f, backend="eager")
    x, i = torch.randn(3) * 4, torch.arange(3, dtype=torch.int32)
    for v in [0.25, 1.25, 2.75, -3.5, 7.0]:
        assert_same(cf(x, i, v), f(x, i, v))  # int32 stays int32, as with a Python int
    assert len(cf.entries) == 2 and cf.recompiles == 1
    with pytest.raises(OverflowError):
        f(x, i, math.inf)
    with pytest.raises(OverflowError):
        cf(x, i, math.inf)


def test_floor_of_a_float_python_needs_specializes():
    def f(x, v):
        return [x * k for k in range(math.floor(v))]

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    for v in [1.5, 2.5, 3.5, 2.25]:
        assert_same(cf(x, v), f(x, v))
    assert len(cf.entries) == 4  # the float itself is guarded: one entry per value, as before
