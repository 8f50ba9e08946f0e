"""NaN and inf patterns per op: compiled code propagates NaN as eager does.

The cases the default backend still gets wrong are strict xfails: the NaN-propagating scalar
vocabulary of inductor (#25) flips them."""

from __future__ import annotations

import pytest
import torch
from semantics_helpers import assert_like_eager, compiled

NAN = float("nan")
INF = float("inf")
OPS = {
    "relu": lambda x, y: torch.relu(x),
    "clamp": lambda x, y: x.clamp(-1, 1),
    "clamp_min": lambda x, y: x.clamp_min(0),
    "maximum": lambda x, y: torch.maximum(x, y),
    "minimum": lambda x, y: torch.minimum(x, y),
    "amax": lambda x, y: x.amax(-1),
    "amin": lambda x, y: x.amin(-1),
    "max_dim": lambda x, y: x.max(-1).values,
    "argmax": lambda x, y: x.argmax(-1),
    "argmin": lambda x, y: x.argmin(-1),
    "sum": lambda x, y: x.sum(-1),
    "softmax": lambda x, y: x.softmax(-1),
    "sigmoid": lambda x, y: torch.sigmoid(x),
    "tanh": lambda x, y: torch.tanh(x),
    "where": lambda x, y: torch.where(x > 0, x, y),
    "exp_log": lambda x, y: torch.log(torch.exp(x)),
    "div": lambda x, y: x / y,
    "isnan": lambda x, y: torch.isnan(x) | torch.isinf(y),
    "sort": lambda x, y: x.sort(-1).values,
    "topk": lambda x, y: x.topk(2, -1).values,
}
INDUCTOR_FAILS: set[str] = set()
"""Ops the default backend still gets wrong on NaN (strict xfails, reason "NaN vocabulary
(#25)"). Empty: relu, clamp, maximum/minimum and argmax/argmin propagate NaN now."""


def _inputs():
    x = torch.tensor([[1.0, NAN, -2.0, 0.5], [INF, -INF, 3.0, NAN], [0.0, -0.0, 2.0, 1.0]])
    y = torch.tensor([[NAN, 1.0, 0.0, -1.0], [2.0, NAN, -INF, 0.0], [0.0, 1.0, NAN, INF]])
    return x, y


@pytest.mark.parametrize("op", list(OPS))
def test_nan_and_inf(op, backend, request):
    if backend == "inductor" and op in INDUCTOR_FAILS:
        request.applymarker(pytest.mark.xfail(strict=True, reason="NaN vocabulary (#25)"))
    fn = OPS[op]

    def g(x, y):
        return fn(x, y)

    x, y = _inputs()
    assert_like_eager(compiled(g, backend, fullgraph=True)(x, y), g(x, y))
