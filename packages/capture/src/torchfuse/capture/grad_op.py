"""The one non-ATen op capture writes: switching grad mode inside a graph.

``with torch.no_grad():`` regions inside a compiled function become a pair of
``torchfuse.set_grad_enabled.default`` nodes, so that the reference interpreter (and any
backend) runs the region with the same grad mode eager would. Defined with
``torch.library`` so ``resolve_op`` finds it.
"""

from __future__ import annotations

import torch

SET_GRAD_ENABLED = "torchfuse.set_grad_enabled.default"

_lib = torch.library.Library("torchfuse", "FRAGMENT")
_lib.define("set_grad_enabled(bool enabled) -> ()")


def _set_grad_enabled(enabled: bool) -> None:
    torch._C._set_grad_enabled(enabled)


for _key in ("CompositeExplicitAutograd", "Meta"):
    _lib.impl("set_grad_enabled", _set_grad_enabled, _key)
