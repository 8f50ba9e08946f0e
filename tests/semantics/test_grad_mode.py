"""Grad-mode regions inside a compiled function set requires_grad as eager does."""

from __future__ import annotations

import torch
from semantics_helpers import assert_like_eager, compiled


def enable_inside(x):
    a = x * 5
    with torch.enable_grad():
        y = x * 2
    return a, y


def no_grad_inside(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y, z


def set_grad_enabled_false(x):
    torch.set_grad_enabled(False)
    y = x.sin()
    torch.set_grad_enabled(True)
    return y, x.cos()


def test_enable_grad_under_no_grad(backend):
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        want = enable_inside(x)
        got = compiled(enable_inside, backend)(x)
    assert_like_eager(got, want)
    got[1].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_no_grad_region_under_grad(backend):
    x = torch.randn(3, requires_grad=True)
    want = no_grad_inside(x)
    got = compiled(no_grad_inside, backend)(x)
    assert_like_eager(got, want)
    got[1].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_both_modes_get_their_own_entry(backend):
    x = torch.randn(3, requires_grad=True)
    f = compiled(no_grad_inside, backend)
    with torch.no_grad():
        assert_like_eager(f(x), no_grad_inside(x))
    assert_like_eager(f(x), no_grad_inside(x))
    assert len(f.entries) == 2
