"""The lowering rule modules, imported once so that each registers its rules into the
engine's table ([`torchfuse.inductor.lowering.RULES`][torchfuse.inductor.lowering.RULES]).

The registry points one way: rule modules import the engine, the engine never imports them.
Whoever lowers imports this module first (``compile`` does, and with it the package).
"""

from __future__ import annotations

from torchfuse.inductor import lowerings, lowerings_index, user_kernels
from torchfuse.inductor.lowering import RULES

RULE_MODULES = (lowerings, lowerings_index, user_kernels)
"""The modules whose rules are in `RULES`."""

__all__ = ["RULES", "RULE_MODULES"]
