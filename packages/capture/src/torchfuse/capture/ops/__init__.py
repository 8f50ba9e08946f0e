"""Bytecode handlers, one module per opcode family, merged into one dispatch table.

Every handler is ``handler(frame, instruction) -> None`` and works on ``frame.stack``,
``frame.locals``, ``frame.cells`` and ``frame.ip``. Opcodes missing from the table are graph
breaks (``Unsupported``), never silently skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchfuse.capture.ops import arith, build, calls, control, load_store, stack

Handler = Callable[[Any, Any], None]

DISPATCH: dict[str, Handler] = {}
for _family in (stack, load_store, build, arith, calls, control):
    _overlap = set(DISPATCH) & set(_family.HANDLERS)
    assert not _overlap, f"opcodes handled twice: {_overlap}"
    DISPATCH.update(_family.HANDLERS)

__all__ = ["DISPATCH"]
