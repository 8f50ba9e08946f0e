"""A training batch norm's running statistics, written back to the caller's tensors: a compiled
training step (the batch norm decomposed into reductions, its input a leaf without grad, so
its backward's ``output_mask`` leaves the input gradient out) against eager, over two calls,
with and without another read of the old running mean: outputs, gradients, running statistics,
and that they stay the caller's tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.graph import trace
from torchfuse.inductor import inductor


def _bn(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1).relu().sum()


def _bn_reading_the_old_mean(x, w, b, rm, rv):
    before = rm * 2  # the old running mean: it must not be overwritten before this reads it
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    return y.relu().sum() + before.sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=g)
    w = torch.randn(3, generator=g).requires_grad_()
    b = torch.randn(3, generator=g).requires_grad_()
    return [x, w, b, torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5]


@pytest.mark.parametrize("fn", [_bn, _bn_reading_the_old_mean])
def test_training_step_matches_eager(fn):
    inputs = _inputs()
    graph, _ = trace(fn, *inputs)
    compiled = inductor(graph, inputs)
    ours = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    eager = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    stats = ours[3], ours[4]
    for _ in range(2):  # the second call updates statistics the first one wrote
        (loss,) = compiled(*ours)
        want = fn(*eager)
        torch.testing.assert_close(loss, want)
        loss.backward()
        want.backward()
    assert ours[3] is stats[0] and ours[4] is stats[1]
    torch.testing.assert_close(ours[3], eager[3])
    torch.testing.assert_close(ours[4], eager[4])
    for got, exp in zip(ours[1:3], eager[1:3], strict=True):
        torch.testing.assert_close(got.grad, exp.grad)
