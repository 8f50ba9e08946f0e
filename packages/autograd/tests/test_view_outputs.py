"""Outputs the compiled forward makes as views of its own buffers
(`torchfuse.autograd.output_views.views_made_plain`):
eager returns a view of an intermediate nobody else holds, which the caller may write in
place; a custom Function's view output may not be. Such an output comes back as a plain
tensor over the same memory, unless its memory is shared with another output or a saved
tensor (then a write would change them behind autograd's back, and autograd's refusal
stands)."""

from __future__ import annotations

import pytest
import torch
from torchfuse.autograd import aot_eager
from torchfuse.graph import trace


def _views(x, w):
    return (x @ w).view(-1), (x * 2).t()


def _shared(x, w):
    y = x @ w
    return y.view(-1), y.t()  # two views of one buffer


def _saved(x, w):
    y = x @ w
    return y.view(-1), y @ w.t()  # the buffer is saved: w's gradient reads it


def _run(fn, compiled, x, w):
    x.grad = w.grad = None
    a, b = (compiled or fn)(x, w)
    a.mul_(2)
    b.add_(1)
    (a.sum() + (b * b).sum()).backward()
    return a.detach().clone(), b.detach().clone(), x.grad.clone(), w.grad.clone()


def test_a_view_of_an_intermediate_may_be_written_in_place_as_in_eager():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    graph, _ = trace(_views, x.detach(), w.detach())
    compiled = aot_eager(graph, [x, w])
    got, want = _run(_views, compiled, x, w), _run(_views, None, x, w)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    a, _ = compiled(x, w)
    assert a._base is None and a.requires_grad  # a plain tensor, with its gradient


@pytest.mark.parametrize("fn", [_shared, _saved], ids=["shared_by_outputs", "saved_for_backward"])
def test_a_view_sharing_memory_stays_a_view_and_the_write_is_refused(fn):
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    graph, _ = trace(fn, x.detach(), w.detach())
    compiled = aot_eager(graph, [x, w])
    a, _ = compiled(x, w)
    assert a._base is not None
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        a.mul_(2)
