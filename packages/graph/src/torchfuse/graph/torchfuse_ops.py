"""The ``torchfuse`` opset: the few non-ATen ops the format itself defines.

Every Graph may contain them, so every reader needs them registered with torch: importing
``torchfuse.graph`` does it. Today there is one:

``torchfuse.set_grad_enabled.default(bool enabled) -> ()``
    Switches grad mode. Capture writes a pair of them around a ``with torch.no_grad():``
    region inside a compiled function, so that the reference interpreter and every backend
    run the region with the grad mode eager would.
"""

from __future__ import annotations

import torch

TORCHFUSE_OPSET = 1
"""Opset number written for the ``torchfuse`` namespace."""

SET_GRAD_ENABLED = "torchfuse.set_grad_enabled.default"

_lib = torch.library.Library("torchfuse", "FRAGMENT")
_lib.define("set_grad_enabled(bool enabled) -> ()")


def _set_grad_enabled(enabled: bool) -> None:
    torch._C._set_grad_enabled(enabled)


for _key in ("CompositeExplicitAutograd", "Meta"):
    _lib.impl("set_grad_enabled", _set_grad_enabled, _key)
