"""Python's cyclic garbage collector, paused while a compiler stage runs.

A stage of the compiler (a capture, a retrace of a graph, a partition's flow graph, a lowering)
allocates metadata, fakes and nodes by the ten thousand. Each 700 net allocations start a
young collection, and every tenth of those a middle one, and they in turn start full
collections, which walk every object of the process: a loaded ``transformers`` model's
included. With the collector off for a T5 training compile, capture went 624 -> 387 ms and
inductor's lower 445 -> 177 ms (``benchmarks/notes/2026-12.md``). Reference counting still
frees whatever a stage drops; only the cycles wait for the first collection after the pause.

`gc_paused` is the one helper every package uses: capture around the compile of a frame,
autograd around its passes, inductor around its retraces. ``TORCHFUSE_GC_PAUSE=0``
(`torchfuse.graph.observe.ObserveConfig.gc_pause`, read when a pause opens) turns every pause
into a no-op, to measure what it buys.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any

from torchfuse.graph import observe

_lock = threading.Lock()
_depth = 0
_was_on = False


class gc_paused(contextlib.ContextDecorator):
    """The collector off for the block, or for each call of a function it decorates.

    Re-entrant, and shared by all threads: the collector is one per process, so the
    outermost of the open pauses, over all threads, saved ``gc.isenabled()`` and the last one
    to close puts that back, on an exception too. A block that starts while the collector is
    already off (the user's ``gc.disable()``) leaves it off. With ``TORCHFUSE_GC_PAUSE=0``
    a pause that opens with no other open leaves the collector as it is.

        >>> import gc
        >>> with gc_paused():
        ...     with gc_paused():
        ...         gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """

    def __enter__(self) -> gc_paused:
        global _depth, _was_on
        with _lock:
            if _depth == 0:
                _was_on = gc.isenabled()
                if observe.config.gc_pause:
                    gc.disable()
                else:
                    _was_on = False  # nothing to restore: the collector was left alone
            _depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_on:
                gc.enable()
