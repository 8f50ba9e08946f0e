"""Comparing a compiled call with eager: values, dtype, requires_grad, type, raised error."""

from __future__ import annotations

import warnings

import torch
import torchfuse.capture as tfc


def outcome(fn, *args):
    """What ``fn(*args)`` gives: the result, or the exception it raised."""
    try:
        return fn(*args)
    except Exception as e:
        return e


def compiled(fn, backend, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tfc.compile(fn, backend=backend, **kw)


def assert_like_eager(got, want, *, atol=1e-5):
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"eager raised {type(want).__name__}, compiled gave {got!r}"
        assert type(got) is type(want), f"eager raised {type(want).__name__}, compiled {type(got).__name__}: {got}"
        return
    assert not isinstance(got, Exception), f"compiled raised {type(got).__name__}: {got}"
    if isinstance(want, tuple | list):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_like_eager(g, w, atol=atol)
        return
    assert type(got) is type(want), (type(got), type(want))
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    assert got.requires_grad == want.requires_grad
    torch.testing.assert_close(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor),
                               atol=atol, rtol=1e-5, equal_nan=True)
