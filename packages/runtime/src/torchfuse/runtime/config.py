"""Configuration of torchfuse-runtime: the only module of this package that reads the environment.

| variable | meaning |
|---|---|
| `TORCHFUSE_CACHE_DIR` | root of the caches; default `$XDG_CACHE_HOME/torchfuse` or `~/.cache/torchfuse` |
| `TORCHFUSE_AUTOTUNE` | `0`: no first-call autotuning (each kernel's first config); default on |
| `TORCHFUSE_AUTOTUNE_MIN_BYTES` | launches moving fewer bytes are not tuned; default 16 MiB |
| `TORCHFUSE_AUTOTUNE_DEFAULT_MAX` | candidates a kernel tunes in `mode="default"`; default 2, `0`: all |
| `TORCHFUSE_AUTOTUNE_LATER` | `0`: tune before the first call returns; default: after it (`mode="default"`) |
| `TORCHFUSE_FAST_LAUNCH` | `0`: launch through `fn[grid](...)`, not the compiled launcher; default on |
| `TORCHFUSE_DIRECT_LAUNCH` | `0`: the fast path calls `CompiledKernel.run`, not the C launcher; default on |
| `TORCHFUSE_QUICK_LAUNCH` | `0`: Triton 3.6's C launchers built before a first launch; default: after |
| `TORCHFUSE_LIBRARY_WARMUP` | `0`: no loading of a first GPU call's convolution kernels in a thread |
| `TORCHFUSE_CUDAGRAPH_MAX` | CUDA graphs kept per program under reduce-overhead; default 8, `0`: unlimited |
| `TORCHFUSE_COMPILE_THREADS` | threads compiling kernels ahead of time; default `min(8, cpu count)` |
| `TORCHFUSE_COMPILE_WORKERS` | compile processes (GPU); default `min(16, cores - 1)` from 4 cores, or 0 |
| `TORCHFUSE_COMPILE_WORKERS_MIN` | compiles a first call needs before it uses the workers; default 2 |
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

from torchfuse.graph.caches import cache_root


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
    autotune_later: bool = True
    """In ``mode="default"``, a first call that would tune runs each kernel still to tune with
    its candidate cheapest to compile instead; the others compile in the background, and the first
    call after they are ready benchmarks them all and switches to the winners (cached on disk
    as ever, so the next process starts tuned). Off, or under ``max-autotune`` or
    ``reduce-overhead`` (whose CUDA graphs are captured at once): tuned before the first call
    returns."""
    fast_launch: bool = True
    """Launch through the compiled kernel's launcher once it is known (GPU only)."""
    direct_launch: bool = True
    """On the fast path, call Triton's C launcher itself where the installed Triton's is known
    ([`torchfuse.runtime.launchers`][torchfuse.runtime.launchers]); off: through ``CompiledKernel.run``."""
    quick_launch: bool = True
    """With Triton 3.6, load kernels without building its C launcher per signature (0.2-0.4 s of
    system C compiler each) and launch them through ``cuLaunchKernel``
    ([`torchfuse.runtime.launchers`][torchfuse.runtime.launchers], "Launching without the
    launcher build"); off: Triton builds its launchers as it would alone."""
    handle_cache: bool = True
    """Keep each GPU call function's launch handles on disk, and let a warm start launch from
    them without warming anything up ([`torchfuse.runtime.handle_cache`][torchfuse.runtime.handle_cache];
    ``TORCHFUSE_HANDLE_CACHE=0``: neither kept nor read)."""
    library_warmup: bool = True
    """On a Program's first GPU call, call its distinct convolutions once in a background
    thread, so that CUDA has loaded their library kernels when the caller reaches them
    ([`torchfuse.runtime.library_warmup`][torchfuse.runtime.library_warmup]), unless the
    background thread is compiling then (a training step's backward): measured faster in
    inference, slower beside a backward's compiles."""
    compile_threads: int = 4
    """Threads that compile kernels concurrently before the first GPU call."""
    compile_workers: int = 0
    """Worker processes that compile a first call's Triton kernels concurrently (GPU only;
    [`torchfuse.runtime.compile_workers`][torchfuse.runtime.compile_workers]), started once
    per process and reused. 0: compile in this process's threads only. From the environment
    the default is `default_compile_workers` (on with 4 or more cores)."""
    compile_workers_min: int = 2
    """The fewest Triton compiles (kernel, config, specialization) a first call must need for
    it to hand them to the workers (started once per process, by the first GPU graph
    compiled or the first GPU Program loaded with a kernel new to the cache); one compile is
    done here, since a worker pays a request's round trip and this process then loads the
    binary from disk. Two are enough:
    Triton's passes hold the GIL, so this process's threads compile one at a time (on an H100
    host, one compile of the softmax row took 295 ms and the two of the cross-entropy row
    734 ms in threads)."""
    compile_here: int = 2
    """While the workers compile a first call's kernels, how many of them this process may
    compile at once itself: each takes a request no worker has started yet, the cheapest
    first (the workers take the costliest first). A first call with few compiles then does
    not wait for workers still starting (a fresh worker's first reply took 1.1-1.6 s on the
    H100 host, two compiles here 0.26 s), and a big one shares them. 0: only the workers
    compile (``TORCHFUSE_COMPILE_HERE``)."""
    cudagraph_max: int = 8
    """CUDA graphs one program keeps under ``mode="reduce-overhead"`` (one per input layout:
    with dynamic shapes, one per size seen); past it the least recently replayed is dropped,
    with its static buffers. 0: no limit."""
    cxx: str | None = None
    """The C++ compiler of C++ kernels (``CXX``); None: ``g++``, ``clang++`` or ``c++`` from the PATH."""
    log_runtime: bool = False
    log_level: int = logging.INFO


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_compile_workers(ncores: int) -> int:
    """Worker processes by default: ``min(16, cores - 1)`` on 4 or more cores, else none.

    Measured on a shared 2-core host (``benchmarks/compile_pool.py``: GPT-2 training's 88
    compiles for sm_90): one after another 42 s, two threads 78 s, one worker 51 s, two
    workers 77 s. With no core to spare, concurrency only adds contention; the workers pay off
    where cores are free to run Triton's front end (which holds the GIL in threads) side by
    side. On the GPU machine (16 cores, H200), ViT-B/16 training's cold first call spent
    13.2 s in ``runtime.precompile`` with 8 workers and 5.9 s with 15 (one run each).
    """
    return min(16, ncores - 1) if ncores >= 4 else 0


def from_environment(environ: Mapping[str, str] | None = None) -> Config:
    """The config described by ``environ`` (defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    logs = {n.strip() for n in env.get("TORCHFUSE_LOGS", "").split(",") if n.strip()}
    threads = env.get("TORCHFUSE_COMPILE_THREADS")
    workers = env.get("TORCHFUSE_COMPILE_WORKERS")
    workers_min = env.get("TORCHFUSE_COMPILE_WORKERS_MIN")
    here = env.get("TORCHFUSE_COMPILE_HERE")
    ncores = cores()
    min_bytes = env.get("TORCHFUSE_AUTOTUNE_MIN_BYTES")
    default_max = env.get("TORCHFUSE_AUTOTUNE_DEFAULT_MAX")
    graphs = env.get("TORCHFUSE_CUDAGRAPH_MAX")
    return Config(
        cache_dir=cache_root(env),
        autotune=_flag(env, "TORCHFUSE_AUTOTUNE", True),
        autotune_min_bytes=max(0, int(min_bytes)) if min_bytes else 1 << 24,
        autotune_default_max=max(0, int(default_max)) if default_max else 2,
        autotune_later=_flag(env, "TORCHFUSE_AUTOTUNE_LATER", True),
        fast_launch=_flag(env, "TORCHFUSE_FAST_LAUNCH", True),
        direct_launch=_flag(env, "TORCHFUSE_DIRECT_LAUNCH", True),
        quick_launch=_flag(env, "TORCHFUSE_QUICK_LAUNCH", True),
        handle_cache=_flag(env, "TORCHFUSE_HANDLE_CACHE", True),
        library_warmup=_flag(env, "TORCHFUSE_LIBRARY_WARMUP", True),
        compile_threads=max(1, int(threads)) if threads else max(1, min(8, ncores)),
        # a worker beside every core would slow the process it works for: at most cores - 1
        compile_workers=(max(0, min(int(workers), ncores - 1)) if workers
                         else default_compile_workers(ncores)),
        compile_workers_min=max(1, int(workers_min)) if workers_min else 2,
        compile_here=max(0, int(here)) if here else 2,
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
