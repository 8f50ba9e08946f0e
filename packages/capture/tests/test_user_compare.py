"""Rich comparisons and hashing of user objects (dataclasses included), frozen dataclasses,
and classes made in the function (issue 20): values vs eager, graph and recompile counts."""

from __future__ import annotations

import collections
import dataclasses
import warnings

import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile, reset


@dataclasses.dataclass(frozen=True, order=True)
class Frozen:
    a: int
    b: int = 3
    c: tuple = dataclasses.field(default_factory=lambda: (1, 2))

    def __post_init__(self):
        object.__setattr__(self, "d", self.a + self.b)


class Eq:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Eq) and self.v == other.v

    __hash__ = None


class SubEq(Eq):
    def __eq__(self, other):
        return "sub first"


class Plain:
    pass


class OnlyLt:
    def __init__(self, v):
        self.v = v

    def __lt__(self, other):
        return self.v < other.v


class TensorEq:
    def __eq__(self, other):
        return other * 2


def _run(fn, *args, graphs=1):
    reset()
    cf = compile(fn, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exp = fn(*args)
        got = cf(*args)
    assert_same(got, exp)
    errs = [r.error for r in cf.results if r.error is not None]
    assert cf.graph_count() == graphs and not errs, errs
    return cf


def test_frozen_dataclass_eq_defaults_and_order():
    def f(x):
        g = Frozen(1)
        h = dataclasses.replace(g, b=7)
        return x * g.d, [g == Frozen(1, 3), g == h, g != Frozen(1), Frozen(1) < Frozen(2),
                         Frozen(1, 5) >= Frozen(1, 4), h.d, h.c, dataclasses.astuple(g),
                         hash(g) == hash(Frozen(1)), g in [h, Frozen(1)]]
    _run(f, torch.randn(3))


def test_frozen_dataclass_assignment_raises_frozen_error():
    def f(x):
        g = Frozen(1)
        try:
            g.a = 5
        except dataclasses.FrozenInstanceError as e:
            return x + g.a, str(e)
        return x, ""
    _run(f, torch.randn(3))

    def g(x):
        Frozen(1).a = 2
        return x
    cf = compile(g, backend="eager")
    with pytest.raises(dataclasses.FrozenInstanceError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf(torch.randn(3))


def test_python_eq_reflected_subclass_first_and_identity_fallback():
    def f(x):
        p = Plain()
        return x, [Eq(1) == Eq(1), Eq(1) != Eq(2), Eq(1) == SubEq(1), SubEq(1) == Eq(1),
                   p == p, p != Plain(), p == 1, 1 == p, x == p, OnlyLt(3) > OnlyLt(1),
                   Eq(2) in [Eq(1), Eq(2)]]
    _run(f, torch.randn(3))


def test_user_eq_may_return_a_tensor():
    def f(x):
        return TensorEq() == x, x == TensorEq()
    _run(f, torch.randn(3))


def test_unsupported_ordering_raises_type_error():
    def f(x):
        try:
            return x, Plain() < Plain()
        except TypeError as e:
            return x + 1, str(e)
    _run(f, torch.randn(3))


def test_unhashable_user_object_raises():
    def f(x):
        try:
            hash(Eq(1))
        except TypeError as e:
            return x, str(e)
        return x + 1, ""
    _run(f, torch.randn(3))


def test_namedtuple_made_in_the_function_captures_once():
    def f(x):
        P = collections.namedtuple("P", ["a", "b"], defaults=[4])
        p, q = P(x, 2), P(x)
        return p.a * p.b + q.b, p._replace(b=5).b, P._fields, type(p).__name__
    reset()
    cf = compile(f, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        assert_same(cf(x), f(x))
    assert cf.graph_count() == 1 and cf.recompiles == 0
    assert not [r.error for r in cf.results if r.error is not None]
