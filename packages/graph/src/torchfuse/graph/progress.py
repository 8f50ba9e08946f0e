"""A progress line on stderr while a long compile works: stages done, kernels compiled.

Every package already reports its stages to `torchfuse.graph.observe.record_time`, and the
runtime reports its kernel compiles here (`kernels`), so the line needs no hook of its own::

    torchfuse: compiling forward/entry_0 -- 14 stages (inductor.codegen), kernels 12/40, 3.1 s

It appears only once a compile has run for `DELAY_S` seconds, only when stderr is a terminal,
and never when ``CI`` is set or ``TORCHFUSE_LOGS`` has ``-progress``; it rewrites one line
(``\\r``) and clears it when the entry's first call ends (`finish`). A dozen lines of our own
rather than rich or tqdm: neither is a runtime dependency of any torchfuse package, and the
line needs no layout, colour or rate estimate.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DELAY_S = 2.0
"""Seconds a compile runs before the line appears (shorter compiles print nothing)."""


@dataclass
class _State:
    start: float | None = None
    graph: str = ""
    stages: int = 0
    last: str = ""
    kernels_done: int = 0
    kernels_total: int = 0
    drawn: bool = False


_state = _State()
_lock = threading.Lock()


_switch: Callable[[], bool] = lambda: True
"""Whether the settings allow the line; `torchfuse.graph.observe` installs its own (``CI``,
``-progress``) through `set_switch`, so that this module imports nothing of the package."""


def set_switch(switch: Callable[[], bool]) -> None:
    """Install the function that says whether the settings allow a progress line."""
    global _switch
    _switch = switch


def enabled() -> bool:
    """Whether a progress line may be drawn: stderr is a terminal, ``CI`` is not set and
    ``TORCHFUSE_LOGS`` does not say ``-progress``."""
    if not _switch():
        return False
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream
        return False


def stage(graph: str, name: str, seconds: float) -> None:
    """A stage of ``graph`` finished after ``seconds`` (called by ``observe.record_time``)."""
    if not enabled():
        return
    with _lock:
        now = time.perf_counter()
        if _state.start is None:
            _state.start = now - seconds
        _state.graph = graph
        _state.stages += 1
        _state.last = name
        _draw(now)


def kernels(done: int, total: int) -> None:
    """``done`` of ``total`` kernel compiles of the current first call have finished."""
    if not enabled():
        return
    with _lock:
        now = time.perf_counter()
        if _state.start is None:
            _state.start = now
        _state.kernels_done, _state.kernels_total = done, total
        _draw(now)


def finish(graph: str | None = None) -> None:
    """The first call that the line describes is over: clear the line and start afresh."""
    global _state
    with _lock:
        if _state.drawn:
            _write("\r\x1b[K")
        _state = _State()


def line_text(now: float | None = None) -> str:
    """The text the line shows now (tests read it without a terminal)."""
    elapsed = (now or time.perf_counter()) - (_state.start or 0.0)
    text = f"torchfuse: compiling {_state.graph} -- {_state.stages} stages"
    if _state.last:
        text += f" ({_state.last})"
    if _state.kernels_total:
        text += f", kernels {_state.kernels_done}/{_state.kernels_total}"
    return text + f", {elapsed:.1f} s"


def _draw(now: float) -> None:
    if _state.start is None or now - _state.start < DELAY_S:
        return
    width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
    _write("\r" + line_text(now)[:width] + "\x1b[K")
    _state.drawn = True


def _write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):  # never let progress break a compile
        pass
