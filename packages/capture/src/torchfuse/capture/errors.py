"""Errors users of capture see: typed, located, with a suggested fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchfuse.graph.schema import SourceLoc
from torchfuse.graph.symbolic import SpecializationError


def where(loc: SourceLoc | None) -> str:
    """``file:line in fn: text`` for a message."""
    if loc is None:
        return "<unknown location>"
    text = f"{loc.file}:{loc.line}"
    if loc.function:
        text += f" in {loc.function}"
    if loc.text:
        text += f"\n    {loc.text}"
    return text


def call_stack(error: Unsupported) -> tuple[str, ...]:
    """``file:line in function`` of each call a break inside inlined calls passed through,
    outermost first (empty for a break in the compiled frame itself)."""
    chain = getattr(error, "break_chain", None) or []
    lines = []
    for state in reversed(chain[1:]):  # the innermost frame's line is the break's own location
        loc = state.frame.location(state.instruction)
        if loc is not None:
            lines.append(f"{loc.file}:{loc.line} in {loc.function}")
    return tuple(lines)


def break_stack(error: Unsupported) -> str:
    """`call_stack` as lines for a log message ("" when there is none)."""
    lines = call_stack(error)
    return "\n  called from (outermost first):\n" + "\n".join(f"    {s}" for s in lines) if lines else ""


class CaptureError(RuntimeError):
    """Base class of every error torchfuse-capture raises on purpose."""


class Unsupported(CaptureError):
    """Capture met something it cannot put in a graph (a graph break).

    ``reason`` says what, ``loc`` where in the user's code. Inside the interpreter this is
    caught at the frame boundary: the graph up to it is compiled, the instruction runs in
    Python and a resume function captures the rest (``docs/breaks.md``). Only a break capture
    cannot resume after (inside a ``try`` with handlers, under ``autocast`` or
    ``inference_mode``, in a generator) makes the frame run eagerly; ``fallback`` then says
    why. The reason is kept for [`explain`][torchfuse.capture.explain].
    """

    def __init__(self, reason: str, loc: SourceLoc | None = None, hint: str | None = None) -> None:
        self.reason = reason
        self.loc = loc
        self.hint = hint
        self.internal = False
        self.break_chain: list = []
        """``frame.BreakState`` of each frame the break passed through, innermost first:
        the instruction and the stack/locals before it (for resume functions)."""
        self.compile_callee = False
        """The break is a call whose callee is compiled as a frame of its own when it runs
        in Python (a module whose hooks run in Python, `torchfuse.capture.hooks`), as a break
        deeper inside a call is."""
        super().__init__(reason)

    @property
    def break_state(self) -> Any:
        """Where the innermost frame stopped (a ``frame.BreakState``), or ``None``."""
        return self.break_chain[0] if self.break_chain else None

    def __str__(self) -> str:
        msg = f"{self.reason}\n  at {where(self.loc)}"
        if self.hint:
            msg += f"\n  hint: {self.hint}"
        return msg


class UserException(Unsupported):
    """The captured code raised an ordinary Python exception (``KeyError``, ``raise X``…).

    A ``try`` block around it (found through the code's exception table) handles it during
    capture, as Python would; uncaught, it is a graph break and eager execution raises it.
    """

    def __init__(self, exc: BaseException, loc: SourceLoc | None = None) -> None:
        self.exc = exc
        super().__init__(f"{type(exc).__name__}: {exc}", loc)


class GraphBreakInFullgraph(CaptureError):
    """``fullgraph=True`` was asked for, and capture met a graph break."""

    def __init__(self, cause: Unsupported) -> None:
        self.cause = cause
        super().__init__(
            f"graph break with fullgraph=True: {cause.reason}\n  at {where(cause.loc)}\n"
            f"  fix: {cause.hint or 'move this statement out of the compiled function'}, "
            "or compile with fullgraph=False to split the graph there"
        )


class RecompileLimitExceeded(CaptureError):
    """A function recompiled more than ``config.recompile_limit`` times."""


class ExportError(CaptureError):
    """``export`` needs one graph; these breaks prevent it."""

    def __init__(self, name: str, breaks: Sequence[Unsupported]) -> None:
        self.breaks = list(breaks)
        lines = [f"cannot export {name}: it does not capture as one graph "
                 f"({len(self.breaks)} graph break(s)):"]
        for b in self.breaks:
            lines.append(f"  - {b.reason}\n    at {where(b.loc)}")
        lines.append("  fix: rewrite these lines with torch operations, or move them out of the "
                     "exported function")
        super().__init__("\n".join(lines))


class DynamicShapeError(CaptureError, SpecializationError):
    """The captured code made a size constant that ``mark_dynamic`` asked to keep symbolic.

    Raised from the call that captures, naming the line that needed a plain number
    (``int(x.shape[0])``, ``range(x.shape[0])``, a Python list indexed by a size …). Fix
    the line to compute with the size (``x.new_ones(x.shape[0])``, tensor ops instead of a
    Python loop), or drop the ``mark_dynamic`` request for that dimension.
    """

    def __init__(self, cause: SpecializationError, loc: SourceLoc | None = None) -> None:
        self.cause = cause
        self.loc = loc
        super().__init__(f"{cause}\n  fix: keep the size symbolic on that line (compute with it "
                         "through torch ops), or do not mark the dimension dynamic")


class BackendNotFound(CaptureError, LookupError):
    """A backend name that no installed package registers."""


class AmbiguousBackend(BackendNotFound):
    """A backend name that two installed distributions register; the message names both and
    how to choose one (its entry-point value, ``"package.module:function"``)."""
