"""Configuration of torchfuse-capture: the only module of this package that reads the environment.

=================================  ==========================================================
variable                           meaning
=================================  ==========================================================
``TORCHFUSE_RECOMPILE_LIMIT``      compiled entries kept per function before it runs eagerly
                                   (default 8)
``TORCHFUSE_RAISE_ON_RECOMPILE``   ``1``: raise `RecompileLimitExceeded` instead of
                                   falling back to eager with a warning
``TORCHFUSE_BACKEND``              the backend ``compile`` uses when none is given
                                   (default ``inductor``)
``TORCHFUSE_DDP_SPLIT``            ``0``: graphs captured inside a DDP forward stay whole
                                   (default: cut at DDP's bucket boundaries)
``TORCHFUSE_RANK_CHECK``           ``warn`` (default), ``error`` or ``off``: what a rank that
                                   compiled another graph than the others gets
``TORCHFUSE_META_MEMO``            ``0``: every op capture records runs its meta kernel
                                   (default: answered from `torchfuse.graph.meta_memo` when
                                   an earlier op had arguments of the same metadata; the
                                   switch autograd's passes read too)
``TORCHFUSE_META_MEMO_DISK``       ``0``: the memo stays in memory (default: its answers for
                                   ATen ops are kept in ``<cache dir>/meta_memo/``, one file
                                   per torch version, so a new process's capture and passes
                                   run no meta kernel an earlier one ran; the cache dir is
                                   ``TORCHFUSE_CACHE_DIR``, see `torchfuse.runtime.config`)
``TORCHFUSE_CAPTURE_CACHE``        ``0``: capture every function anew in each process (default:
                                   entries are kept in ``<cache dir>/captures/`` and a new
                                   process rebuilds the one whose guards hold without
                                   capturing, `torchfuse.capture.entry_cache`)
``TORCHFUSE_LOGS``                 the shared logging switch (parsed by
                                   `torchfuse.graph.observe`); this package writes the
                                   channels ``graph``, ``guards``, ``recompiles``, ``breaks``
=================================  ==========================================================

Tests change settings with `patch`, or by assigning attributes of `config`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from torchfuse.graph import observe

CHANNELS = ("graph", "guards", "recompiles", "breaks")
"""Log channels this package writes (loggers ``torchfuse.<channel>``)."""


@dataclass(slots=True)
class CaptureConfig:
    """Settings of the capture package."""

    recompile_limit: int = 8
    """Compiled entries per function; past it the function runs eagerly (warned once)."""
    raise_on_recompile_limit: bool = False
    """Raise `RecompileLimitExceeded` instead of running eagerly."""
    inline_depth_limit: int = 48
    """How deep user function calls are inlined before capture gives up."""
    max_loop_iterations: int = 100_000
    """Instructions one frame may run (unrolled loops) before capture gives up."""
    check_parameter_metadata: bool = True
    """Check dtype/shape of parameters and buffers when a module attribute changed."""
    default_backend: str = "inductor"
    """The backend ``compile`` uses when its ``backend`` argument is not given: a registered
    name or a ``"package.module:function"`` entry-point value (``TORCHFUSE_BACKEND``)."""

    ddp_split: bool = True
    """Cut a graph captured inside a ``DistributedDataParallel`` forward at DDP's bucket
    boundaries, so that each bucket's all-reduce overlaps the rest of the backward
    (`torchfuse.capture.distributed`)."""
    ddp_bucket_bytes: int | None = None
    """The bucket size the split aims at, in bytes; ``None``: the DDP module's own
    ``bucket_bytes_cap`` (``bucket_cap_mb``)."""
    rank_check: str = "warn"
    """``"warn"``, ``"error"`` or ``"off"``: a graph compiled inside a DDP forward is compared
    across ranks (`torchfuse.capture.distributed.check_ranks`)."""
    meta_memo: bool = True
    """Answer an op whose outputs are new tensors from `torchfuse.graph.meta_memo` when an
    earlier op met arguments of the same metadata (a model's repeated layers), instead of
    running its meta kernel again (``TORCHFUSE_META_MEMO=0``: off)."""
    meta_memo_disk: bool = True
    """Keep that memo in the cache directory across processes
    (`torchfuse.graph.meta_memo_store`; ``TORCHFUSE_META_MEMO_DISK=0``: in memory only)."""
    capture_cache: bool = True
    """Keep captured entries on disk and rebuild them in a later process when their guards
    hold (`torchfuse.capture.entry_cache`; ``TORCHFUSE_CAPTURE_CACHE=0``: off)."""
    rank_check_timeout: float = 120.0
    """Seconds a rank waits for the others to capture the same graph before it reports them
    (the ranks compare before the backend compiles: the wait covers capture, not compile)."""

    def patch(self, **changes: object) -> contextlib.AbstractContextManager[CaptureConfig]:
        """Temporarily change settings: ``with config.patch(recompile_limit=2): ...``."""
        return patch(**changes)


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if not value:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def from_environment(environ: Mapping[str, str] | None = None) -> CaptureConfig:
    """Settings from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    return CaptureConfig(
        recompile_limit=int(env.get("TORCHFUSE_RECOMPILE_LIMIT", "8") or 8),
        raise_on_recompile_limit=_flag(env, "TORCHFUSE_RAISE_ON_RECOMPILE", False),
        default_backend=env.get("TORCHFUSE_BACKEND", "").strip() or "inductor",
        ddp_split=_flag(env, "TORCHFUSE_DDP_SPLIT", True),
        rank_check=_rank_check(env.get("TORCHFUSE_RANK_CHECK", "")),
        meta_memo=_flag(env, "TORCHFUSE_META_MEMO", True),
        meta_memo_disk=_flag(env, "TORCHFUSE_META_MEMO_DISK", True),
        capture_cache=_flag(env, "TORCHFUSE_CAPTURE_CACHE", True),
    )


def _rank_check(value: str) -> str:
    value = value.strip().lower() or "warn"
    if value not in ("warn", "error", "off"):
        raise ValueError(f"TORCHFUSE_RANK_CHECK={value!r}: expected warn, error or off")
    return value


config = from_environment()
"""The live settings; read at call time, so assignments take effect immediately."""


@contextlib.contextmanager
def patch(**changes: object) -> Iterator[CaptureConfig]:
    """Temporarily change settings: ``with config.patch(recompile_limit=2): ...``."""
    known = {f.name for f in fields(CaptureConfig)}
    unknown = set(changes) - known
    if unknown:
        raise AttributeError(f"unknown capture settings {sorted(unknown)}; known: {sorted(known)}")
    old = {k: getattr(config, k) for k in changes}
    for k, v in changes.items():
        setattr(config, k, v)
    try:
        yield config
    finally:
        for k, v in old.items():
            setattr(config, k, v)


def log_enabled(channel: str) -> bool:
    """Whether ``TORCHFUSE_LOGS`` turned ``channel`` on."""
    return observe.log_enabled(channel)


def logger(channel: str) -> logging.LoggerAdapter:
    """The logger of one of `CHANNELS`."""
    return observe.get_logger(channel)
