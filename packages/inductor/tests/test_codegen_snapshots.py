"""Generated kernels pinned by golden files in ``snapshots/``.

Run with ``TORCHFUSE_UPDATE_SNAPSHOTS=1`` to rewrite them after an intended change, then
review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import compile_fn
from torchfuse.inductor.config import from_env

SNAPSHOTS = Path(__file__).parent / "snapshots"
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
    text = "\n# ----\n".join(k.source for k in program.kernels)
    path = SNAPSHOTS / f"{name}.py.txt"
    if from_env().update_snapshots or not path.exists():
        path.write_text(text)
        if not from_env().update_snapshots:
            pytest.fail(f"snapshot {path.name} was missing and has been written; review and rerun")
    assert text == path.read_text(), (
        f"generated code changed; TORCHFUSE_UPDATE_SNAPSHOTS=1 to accept ({path})"
    )
