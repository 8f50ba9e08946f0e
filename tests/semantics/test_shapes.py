"""Empty and size-1 tensors through every kind of kernel: pointwise, reductions (over an
empty dim and over a non-empty one of an empty tensor), normalizations, views, matmul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from semantics_helpers import assert_like_eager, compiled, outcome

OPS = {
    "pointwise": lambda x: (x + 1) * x.sin(),
    "sum": lambda x: x.sum(),
    "sum_last": lambda x: x.sum(-1),
    "mean_last": lambda x: x.mean(-1),
    "prod_last": lambda x: x.prod(-1),
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(-1),
    "logsumexp": lambda x: x.logsumexp(-1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "transpose_copy": lambda x: x.t().contiguous() + 1,
    "cat": lambda x: torch.cat([x, x * 2], 0),
    "matmul": lambda x: x @ x.t(),
    "cumsum": lambda x: x.cumsum(-1),
    "reshape": lambda x: x.reshape(-1) * 2,
}
SHAPES = [(0, 3), (3, 0), (1, 1), (1, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", list(OPS))
def test_empty_and_size_one(op, shape, backend):
    fn = OPS[op]

    def g(x):
        return fn(x)

    x = torch.randn(shape)
    assert_like_eager(outcome(compiled(g, backend, fullgraph=True), x), outcome(g, x))


@pytest.mark.parametrize("op", ["sum_last", "pointwise", "softmax"])
def test_empty_backward(op, backend):
    fn = OPS[op]
    x = torch.randn(3, 0, requires_grad=True)
    out = compiled(lambda t: fn(t), backend)(x)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (3, 0)
