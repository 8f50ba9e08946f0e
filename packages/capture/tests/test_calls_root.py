"""Calling compiled functions: keyword arguments, defaults, *args/**kwargs, methods."""

from __future__ import annotations

import torch
from capture_helpers import assert_same
from torchfuse.capture import compile


def f_kw(x, y=None, *, scale=1.0, **extra):
    out = x * scale
    if y is not None:
        out = out + y
    for v in extra.values():
        out = out + v
    return out


def f_star(*xs):
    return sum(xs)


def test_keywords_and_defaults():
    cf = compile(f_kw, backend="eager")
    x, y = torch.randn(3), torch.randn(3)
    for args, kwargs in [((x,), {}), ((x, y), {}), ((x,), {"y": y, "scale": 2.0}),
                         ((x,), {"bias": y, "more": y})]:
        assert_same(cf(*args, **kwargs), f_kw(*args, **kwargs))
        assert_same(cf(*args, **kwargs), f_kw(*args, **kwargs))
    assert len(cf.entries) == 4


def test_varargs_root():
    cf = compile(f_star, backend="eager")
    xs = [torch.randn(2) for _ in range(3)]
    assert_same(cf(*xs), f_star(*xs))
    assert_same(cf(*xs[:2]), f_star(*xs[:2]))
    assert len(cf.entries) == 2


def test_binding_errors_are_python_errors():
    cf = compile(f_kw, backend="eager")
    try:
        cf()
    except TypeError as e:
        assert "f_kw" in str(e) and "x" in str(e)
    else:
        raise AssertionError("missing argument accepted")


class Model:
    def __init__(self):
        self.w = torch.randn(3)

    @compile(backend="eager")
    def apply(self, x):
        return x * self.w


def test_compiled_method_on_class():
    m = Model()
    x = torch.randn(3)
    assert_same(m.apply(x), x * m.w)
    m2 = Model()
    assert_same(m2.apply(x), x * m2.w)


def test_closure_over_tensor_sees_reassignment():
    t = torch.ones(2)

    def f(x):
        return x + t

    cf = compile(f, backend="eager")
    x = torch.zeros(2)
    assert_same(cf(x), x + 1)
    t.mul_(3)  # in place: the same graph sees it
    assert_same(cf(x), x + 3)
    assert len(cf.entries) == 1
