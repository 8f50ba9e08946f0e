"""A custom ``torch.autograd.Function`` runs in Python at a graph break: its backward is the
user's (called on fake tensors, the forward alone would be recorded and the backward lost)."""

from __future__ import annotations

import pytest
import torch
from torchfuse.capture import compile, explain


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def f(x):
    return Twice.apply(x.sin()).cos().sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_custom_function_keeps_its_backward(backend):
    x = torch.randn(5, requires_grad=True)
    out = compile(f, backend=backend)(x)
    (got,) = torch.autograd.grad(out, x)
    xe = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(f(xe), xe)
    torch.testing.assert_close(out, f(xe))
    torch.testing.assert_close(got, want)


def test_custom_function_is_a_reported_break():
    e = explain(f)(torch.randn(5, requires_grad=True))
    assert e.graph_count == 2 and e.graph_break_count == 1, str(e)
    assert "Twice.apply" in e.break_reasons[0].reason
