"""Configuration of torchfuse-runtime: the only module of this package that reads the environment.

| variable | meaning |
|---|---|
| `TORCHFUSE_CACHE_DIR` | root of the caches; default `$XDG_CACHE_HOME/torchfuse` or `~/.cache/torchfuse` |
| `TORCHFUSE_AUTOTUNE` | `0`: no first-call autotuning (each kernel's first config); default on |
| `TORCHFUSE_AUTOTUNE_MIN_BYTES` | launches moving fewer bytes are not tuned; default 16 MiB |
| `TORCHFUSE_AUTOTUNE_DEFAULT_MAX` | candidates a kernel tunes in `mode="default"`; default 2, `0`: all |
| `TORCHFUSE_FAST_LAUNCH` | `0`: launch through `fn[grid](...)`, not the compiled launcher; default on |
| `TORCHFUSE_DIRECT_LAUNCH` | `0`: the fast path calls `CompiledKernel.run`, not the C launcher; default on |
| `TORCHFUSE_CUDAGRAPH_MAX` | CUDA graphs kept per program under reduce-overhead; default 8, `0`: unlimited |
| `TORCHFUSE_COMPILE_THREADS` | threads compiling kernels ahead of time; default `min(8, cpu count)` |
| `TORCHFUSE_COMPILE_WORKERS` | processes compiling Triton kernels (GPU); default 0: off; at most cores - 1 |
| `TORCHFUSE_LOGS` | the torchfuse logging switch; this package owns `runtime` (`+runtime`: DEBUG) |
| `TRITON_INTERPRET` | read, not owned: whether Triton runs kernels on the CPU |

Values are read at import and kept in `config`; tests replace it with
`dataclasses.replace` or call `from_environment` with their own mapping.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of the runtime package."""

    cache_dir: Path
    """Root of the runtime's on-disk caches."""
    autotune: bool = True
    """Benchmark a kernel's candidate configs on its first GPU launch and keep the fastest."""
    autotune_min_bytes: int = 1 << 24
    """Kernels whose launches read and write fewer bytes than this are not benchmarked: 16 MiB
    move in under 5 us on an H100/H200, about a launch's latency, so whatever the config the
    kernel costs a few microseconds, while every extra candidate costs a Triton compile
    (0.1-2 s). They take the candidate cheapest to compile (the least work per thread), and
    nothing else is compiled."""
    autotune_default_max: int = 2
    """Candidates of one kernel benchmarked (and compiled) on a cold start in ``mode="default"``,
    the first ones in the producer's order once equivalent ones are pruned
    (`torchfuse.runtime.autotune.prune_candidates`); ``max-autotune`` Programs tune them all.
    0: no limit."""
    fast_launch: bool = True
    """Launch through the compiled kernel's launcher once it is known (GPU only)."""
    direct_launch: bool = True
    """On the fast path, call Triton's C launcher itself where the installed Triton's is known
    ([`torchfuse.runtime.launchers`][torchfuse.runtime.launchers]); off: through ``CompiledKernel.run``."""
    compile_threads: int = 4
    """Threads that compile kernels concurrently before the first GPU call."""
    compile_workers: int = 0
    """Worker processes that compile a first call's Triton kernels concurrently (GPU only;
    [`torchfuse.runtime.compile_workers`][torchfuse.runtime.compile_workers]), started once
    per process and reused. 0: compile in this process's threads only."""
    cudagraph_max: int = 8
    """CUDA graphs one program keeps under ``mode="reduce-overhead"`` (one per input layout:
    with dynamic shapes, one per size seen); past it the least recently replayed is dropped,
    with its static buffers. 0: no limit."""
    cxx: str | None = None
    """The C++ compiler of C++ kernels (``CXX``); None: ``g++``, ``clang++`` or ``c++`` from the PATH."""
    log_runtime: bool = False
    log_level: int = logging.INFO


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchfuse"


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def from_environment(environ: Mapping[str, str] | None = None) -> Config:
    """The config described by ``environ`` (defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    cache = env.get("TORCHFUSE_CACHE_DIR")
    logs = {n.strip() for n in env.get("TORCHFUSE_LOGS", "").split(",") if n.strip()}
    threads = env.get("TORCHFUSE_COMPILE_THREADS")
    workers = env.get("TORCHFUSE_COMPILE_WORKERS")
    min_bytes = env.get("TORCHFUSE_AUTOTUNE_MIN_BYTES")
    default_max = env.get("TORCHFUSE_AUTOTUNE_DEFAULT_MAX")
    graphs = env.get("TORCHFUSE_CUDAGRAPH_MAX")
    return Config(
        cache_dir=Path(cache).expanduser() if cache else _default_cache_dir(env),
        autotune=_flag(env, "TORCHFUSE_AUTOTUNE", True),
        autotune_min_bytes=max(0, int(min_bytes)) if min_bytes else 1 << 24,
        autotune_default_max=max(0, int(default_max)) if default_max else 2,
        fast_launch=_flag(env, "TORCHFUSE_FAST_LAUNCH", True),
        direct_launch=_flag(env, "TORCHFUSE_DIRECT_LAUNCH", True),
        compile_threads=max(1, int(threads)) if threads else max(1, min(8, os.cpu_count() or 1)),
        # a worker beside every core would slow the process it works for: at most cores - 1
        compile_workers=max(0, min(int(workers), (os.cpu_count() or 1) - 1)) if workers else 0,
        cudagraph_max=max(0, int(graphs)) if graphs else 8,
        cxx=env.get("CXX") or None,
        log_runtime=bool(logs & {"runtime", "+runtime", "all"}),
        log_level=logging.DEBUG if "+runtime" in logs else logging.INFO,
    )


def triton_interpret_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to run kernels through its CPU interpreter."""
    env = os.environ if environ is None else environ
    return _flag(env, "TRITON_INTERPRET", False)


config: Config = from_environment()
"""The active configuration."""

logger = logging.getLogger("torchfuse.runtime")
if config.log_runtime:
    logger.setLevel(config.log_level)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(logging.StreamHandler())
