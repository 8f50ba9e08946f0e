"""``t.requires_grad = flag`` and ``t.requires_grad_(flag)`` inside a compiled function
(`torchfuse.capture.methods._requires_grad_`): on a tensor made in the function the flag is
the fake's, and autograd tracks it from there; on the caller's tensor, and on a result whose
gradient would reach only such a tensor, it is a break with eager's behaviour."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchfuse.capture import compile, explain
from torchfuse.capture.compiler import EagerFallbackWarning


def _attribute(x, w):
    bias = torch.zeros(x.shape[-1])
    bias.requires_grad = True  # T5's position bias, when it checkpoints
    return ((x @ w) + bias).tanh().sum(), bias.requires_grad


def _method(x, w):
    bias = torch.zeros(x.shape[-1]).requires_grad_()
    return ((x @ w) + bias).tanh().sum(), bias.requires_grad


@pytest.mark.parametrize("fn", [_attribute, _method], ids=["attribute", "method"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_tensor_made_in_the_function_may_require_grad(fn, backend):
    x, w = torch.randn(4, 6), torch.randn(6, 6, requires_grad=True)
    e = explain(fn)(x, w)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    (got, flag), (want, want_flag) = compile(fn, backend=backend)(x, w), fn(x, w)
    assert flag is want_flag is True
    torch.testing.assert_close(got, want)
    assert got.requires_grad and got.grad_fn is not None
    (g,) = torch.autograd.grad(got, w)
    (g_eager,) = torch.autograd.grad(want, w)
    torch.testing.assert_close(g, g_eager)


def _flip_input(x):
    x.requires_grad = True
    return x * 2


def _flip_input_method(x):
    x.requires_grad_()
    return x * 2


@pytest.mark.parametrize("fn", [_flip_input, _flip_input_method], ids=["attribute", "method"])
def test_the_callers_tensor_changes_flag_as_in_eager(fn):
    e = explain(fn)(torch.randn(3))
    assert e.graph_break_count >= 1
    assert any("from outside the function" in str(r) for r in e.break_reasons)
    x, x_eager = torch.randn(3), torch.randn(3)
    out = compile(fn, backend="aot_eager")(x)
    want = fn(x_eager)
    assert (x.requires_grad, out.requires_grad, out.grad_fn is None) == (
        x_eager.requires_grad, want.requires_grad, want.grad_fn is None) == (True, True, False)


def test_an_input_that_already_requires_grad_may_be_set_again():
    def f(x):
        x.requires_grad = True  # no change: nothing for the caller to see
        return x * 2

    e = explain(f)(torch.randn(3, requires_grad=True))
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons


def test_a_result_whose_gradient_reaches_only_such_a_tensor_runs_eagerly():
    def f(x):
        z = torch.zeros(3)
        z.requires_grad = True
        return z * x

    e = explain(f)(torch.randn(3))
    assert any("only through a tensor the function made require grad" in str(r) for r in e.break_reasons)
    x = torch.randn(3)
    with pytest.warns(EagerFallbackWarning, match="only through a tensor the function made"):
        got = compile(f, backend="aot_eager")(x)
    want = f(x)
    assert (got.requires_grad, got.grad_fn is None) == (want.requires_grad, want.grad_fn is None) == (True, False)


@pytest.mark.parametrize(("make", "error"), [
    (lambda x: (x * 2), "leaf variables"),                       # a non-leaf
    (lambda x: torch.zeros(3, dtype=torch.long), "floating point"),  # an integer tensor
])
def test_what_eager_refuses_raises_eagers_error(make, error):
    def f(x):
        t = make(x)
        t.requires_grad = False if t.dtype.is_floating_point else True
        return t

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=error):
        f(x)
    with pytest.raises(RuntimeError, match=error):  # the break runs the line, eagerly
        compile(f, backend="aot_eager")(x)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, h):
        bias = torch.zeros(1, 8)
        if self.training:
            bias.requires_grad = True
        return torch.relu(self.proj(h) + bias)


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(_Layer() for _ in range(2))

    def forward(self, h):
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False)
        return h.square().mean()


def test_inside_a_checkpointed_region_it_is_one_graph_with_eagers_gradients():
    model = _Checkpointed().train()
    h = torch.randn(4, 8)
    e = explain(model)(h)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    grads = []
    for fn in (compile(model, backend="aot_eager"), model):
        model.zero_grad(set_to_none=True)
        fn(h).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g, want in zip(*grads, strict=True):
        torch.testing.assert_close(g, want)
