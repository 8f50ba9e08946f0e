"""The runtime's background work: one thread that runs, in order, the compiles nobody waits
for yet (a training step's backward warm-ups, `CompiledProgram.precompile_async`; the
candidates of tuning deferred past a first call, `torchfuse.runtime.config.Config.autotune_later`),
each fanning out to the compile threads or workers; `wait_for_background` waits for it."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_pool: ThreadPoolExecutor | None = None
_pending = 0
_pending_lock = threading.Lock()
_exiting = False
"""Set when the interpreter starts shutting down: deferred candidates not yet compiling are
dropped (a script that exits after one call should not wait for compiles it will never use;
the backward warm-ups still run, their first calls wait for them)."""


def submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` on the background thread, after everything submitted before."""
    global _pool, _pending
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchfuse-warmup")
    with _pending_lock:
        _pending += 1
    return _pool.submit(_counted, fn, *args)


def _counted(fn: Callable[..., Any], *args: Any) -> Any:
    global _pending
    try:
        return fn(*args)
    finally:  # before the result is set: whoever sees it done sees the count without it
        with _pending_lock:
            _pending -= 1


def busy() -> bool:
    """Whether work submitted to the background thread is still queued or running (a
    training step's backward being compiled while its forward's first call runs)."""
    return _pending > 0


def exiting() -> bool:
    """Whether the interpreter is shutting down (`_exiting`)."""
    return _exiting


def _on_exit() -> None:
    global _exiting
    _exiting = True


# Before the executor's own exit hook joins its thread (threading's hooks run before atexit's).
getattr(threading, "_register_atexit", atexit.register)(_on_exit)


def wait_for_background(timeout: float | None = None) -> None:
    """Wait until the background compiles started so far in this process are done: a training
    step's backward warm-ups (`CompiledProgram.precompile_async`) and the candidates of tuning
    deferred past a first call (`torchfuse.runtime.config.Config.autotune_later`), and the
    Triton launchers built after a first call (`torchfuse.runtime.launchers.build_soon`). The
    next call of such a Program then tunes. ``timeout``: seconds (each), else ``TimeoutError``."""
    if _pool is not None:
        _pool.submit(lambda: None).result(timeout)
    for wait in _waiters:
        wait(timeout)


_waiters: list[Callable[[float | None], None]] = []
"""Other background work `wait_for_background` waits for (`add_waiter`): Triton's launchers
built after a first call (`torchfuse.runtime.launchers.wait_for_builds`)."""


def add_waiter(wait: Callable[[float | None], None]) -> None:
    """Have `wait_for_background` also call ``wait(timeout)`` (background work kept elsewhere)."""
    if wait not in _waiters:
        _waiters.append(wait)
