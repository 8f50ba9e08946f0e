"""Tensor subclasses: an override is never silently ignored, and the output type is kept.

A subclass that overrides ``__torch_function__`` or ``__torch_dispatch__`` is a graph break
(capture does not trace through overrides: docs/semantics.md); the code runs in Python and
the override runs, as in eager. A subclass that only adds Python behaviour is captured, and
the results of torch calls on it take its type, as eager's default conversion does.
"""

from __future__ import annotations

import torch
from semantics_helpers import assert_like_eager, compiled, outcome


class Negating(torch.Tensor):
    """``+`` subtracts."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.add, torch.add):
            func = torch.sub
        return super().__torch_function__(func, types, args, kwargs or {})


class Tagged(torch.Tensor):
    """No override: a plain Python subclass."""

    def tag(self):
        return "tagged"


class Dispatching(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError("not reached: as_subclass tensors keep their data")


def add_two(x):
    return x + 2


def pointwise(x):
    return (x.sin() * 2 + 1).relu()


def makes_subclass(x):
    return (x * 2).as_subclass(Tagged) + 1


def makes_overriding_subclass(x):
    return x.as_subclass(Negating) + 2


def test_torch_function_override_runs(backend):
    x = torch.zeros(3).as_subclass(Negating)
    want = add_two(x)
    got = compiled(add_two, backend)(x)
    assert_like_eager(got, want)
    assert torch.equal(got.as_subclass(torch.Tensor), torch.full((3,), -2.0))


def test_override_made_inside_the_function(backend):
    x = torch.zeros(3)
    assert_like_eager(outcome(compiled(makes_overriding_subclass, backend), x), makes_overriding_subclass(x))


def test_plain_subclass_output_type(backend):
    x = torch.randn(4).as_subclass(Tagged)
    got = compiled(pointwise, backend)(x)
    assert_like_eager(got, pointwise(x))
    assert got.tag() == "tagged"


def test_as_subclass_inside(backend):
    x = torch.randn(4)
    assert_like_eager(compiled(makes_subclass, backend)(x), makes_subclass(x))


def test_parameter_results_are_plain_tensors(backend):
    p = torch.nn.Parameter(torch.randn(3))
    got = compiled(pointwise, backend)(p)
    assert type(got) is torch.Tensor and got.requires_grad
