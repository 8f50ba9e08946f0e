"""Generated kernels pinned by golden files in ``snapshots/``.

Run with ``TORCHFUSE_UPDATE_SNAPSHOTS=1`` to rewrite them after an intended change, then
review the diff.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import assert_snapshot, compile_fn

pytestmark = pytest.mark.triton_cpu  # the Triton code generator's output, run by its interpreter

CASES = {
    "seed_fn": (
        lambda x, y: F.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean(),
        (torch.randn(8, 16), torch.randn(8, 16)),
        None,
    ),
    "softmax_persistent": (lambda x: x.softmax(-1), (torch.randn(8, 64, dtype=torch.bfloat16),), None),
    "softmax_looped": (
        lambda x: x.softmax(-1),
        (torch.randn(8, 64),),
        {"persistent_rnumel_max": 32, "looped_rblock": 32},
    ),
    "gelu_bias_pointwise": (
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        (torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)),
        None,
    ),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, (64,), w, b),
        (torch.randn(8, 64), torch.randn(64), torch.randn(64)),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_source_snapshot(name):
    fn, inputs, options = CASES[name]
    program = compile_fn(fn, *inputs, options=options)
    assert_snapshot(name, program)
