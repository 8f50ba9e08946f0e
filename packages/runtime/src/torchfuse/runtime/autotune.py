"""First-call autotuning over a kernel's candidate configs, with the winners kept on disk.

Winners live in ``<cache>/autotune/<device key>.json`` (the device key names the backend, the
architecture and the Triton version), keyed by the kernel's content hash and the values of the
size symbols its launches use, each rounded up to a power of two. A process that finds its
key there benchmarks nothing.

Tuning happens inside a real run of the Program (the call function generated with
``_tune(...)`` at each launch of an untuned kernel), so every kernel is benchmarked on the
buffers it really reads. Pointer arguments are cloned before benchmarking and restored before
the winner's launch, because a kernel may write into a buffer it also reads.

Kernels whose launches move little data (under ``autotune_min_bytes`` of the runtime config)
are not tuned at all: their time is the launch latency whatever the config, while every
candidate costs a Triton compile (0.1-2 s each, a first call's largest cost). They take the
candidate cheapest to compile, `cheapest_to_compile`, and only that one is compiled. The
others are pruned before anything compiles (`prune_candidates`): candidates that launch the
same programs at these sizes are one, and ``mode="default"`` tunes only the first
``autotune_default_max`` of a kernel's candidates (``max-autotune``: all).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from torchfuse.graph import schema as S
from torchfuse.graph.caches import write_atomic
from torchfuse.graph.expr import evaluate, free_symbols
from torchfuse.graph.ops import to_dtype
from torchfuse.runtime.config import logger
from torchfuse.runtime.kernels import CompileStats, values_per_thread

_file_lock = threading.Lock()


def launch_symbols(program: S.Program, kernel: S.Kernel) -> tuple[str, ...]:
    """The size symbols that a kernel's launches depend on (grid and scalar arguments)."""
    found: set[str] = set()
    for step in program.steps:
        if isinstance(step, S.LaunchStep) and step.kernel == kernel.name:
            for g in step.grid or kernel.grid:
                found |= free_symbols(g)
            for a in step.args:
                if isinstance(a, S.SymRef):
                    found |= free_symbols(a.expr)
    meta_names = {k for c in kernel.configs for k in c.meta}
    return tuple(sorted(found - meta_names))


def launch_bytes(program: S.Program, kernel: S.Kernel, env: Mapping[str, int],
                 buffers: Mapping[str, S.Buffer]) -> int | None:
    """Bytes of the tensors the largest launch of a kernel reads or writes (each pointer
    argument once), for these symbol values; None when a size cannot be evaluated. A kernel
    shared by several launches (a model's repeated layers) is judged by its largest launch:
    the threshold asks whether one launch is latency-bound, not what all of them move."""
    most = 0
    for step in program.steps:
        if not (isinstance(step, S.LaunchStep) and step.kernel == kernel.name):
            continue
        total = 0
        for a in step.args:
            buf = buffers.get(a.name) if isinstance(a, S.TensorRef) else None
            if buf is None:
                continue
            try:
                numel = math.prod(int(evaluate(size, env)) for size in buf.sizes)
            except (KeyError, ValueError, TypeError):
                return None
            total += numel * to_dtype(buf.dtype).itemsize
        most = max(most, total)
    return most


def cheapest_to_compile(configs: Sequence[S.LaunchConfig]) -> S.LaunchConfig:
    """The candidate with the least work per thread (product of its block sizes per warp).

    Triton unrolls a block over the threads of a program, so the code it compiles -- and the
    compile time, sin/cos and other libdevice calls above all -- grows with the elements each
    thread handles. Ties keep the producer's order.
    """
    return min(configs, key=lambda cfg: values_per_thread(list(cfg.meta.values()), cfg.num_warps))


BLOCK_EXTENTS = {"XBLOCK": "xnumel", "YBLOCK": "ynumel", "RBLOCK": "rnumel"}
"""A block size of a launch config and the kernel parameter holding the extent it tiles."""


def launch_extents(program: S.Program, kernel: S.Kernel, env: Mapping[str, int]) -> dict[str, int]:
    """The largest value each extent parameter (``xnumel``, ``rnumel``, ...) takes over the
    kernel's launches, for these symbol values (an extent that cannot be evaluated is left out)."""
    wanted = set(BLOCK_EXTENTS.values())
    out: dict[str, int] = {}
    for step in program.steps:
        if not (isinstance(step, S.LaunchStep) and step.kernel == kernel.name):
            continue
        for param, arg in zip(kernel.signature, step.args, strict=False):
            if param.name not in wanted:
                continue
            try:
                value = int(evaluate(arg.expr, env)) if isinstance(arg, S.SymRef) else int(arg.value)
            except (AttributeError, KeyError, ValueError, TypeError):
                continue
            out[param.name] = max(out.get(param.name, 0), value)
    return out


def prune_candidates(program: S.Program, kernel: S.Kernel, env: Mapping[str, int],
                     limit: int = 0) -> list[S.LaunchConfig]:
    """The candidates worth compiling for these sizes: a cost model that needs no compile.

    A block larger than the extent it tiles (rounded up to a power of two) adds only masked
    lanes: two candidates that agree once their blocks are clamped to the extents launch the
    same programs, so only the one with less work per thread (`cheapest_to_compile`) is kept.
    ``limit`` (the first ``limit`` left, in the producer's order of preference; 0: all) is
    how much a cold start tunes: little in ``mode="default"``, everything under
    ``max-autotune`` (``Config.autotune_default_max``)."""
    extents = launch_extents(program, kernel, env)
    kept: dict[tuple[Any, ...], S.LaunchConfig] = {}
    for cfg in kernel.configs:
        clamped = tuple(sorted(
            (name, min(value, size_bucket(extents[BLOCK_EXTENTS[name]]))
             if isinstance(value, int) and BLOCK_EXTENTS.get(name) in extents else value)
            for name, value in cfg.meta.items()))
        same = (clamped, cfg.num_warps, cfg.num_stages)
        other = kept.get(same)
        kept[same] = cfg if other is None else cheapest_to_compile([other, cfg])
    chosen = set(map(id, kept.values()))
    out = [cfg for cfg in kernel.configs if id(cfg) in chosen]
    return out[:limit] if limit > 0 else out


def tuning_key(kernel_hash: str, symbols: Sequence[str], env: Mapping[str, int]) -> str:
    """The autotune-cache key of a kernel at these symbol values, each rounded up to a power of
    two: a dynamic Program called with sequence lengths 500, 501, 502, ... tunes once for the
    bucket (512), not once per length (a few milliseconds of benchmarking each, and a cache
    that grows without bound); sizes a factor of two apart rarely want different configs."""
    return kernel_hash + "|" + ",".join(f"{s}<={size_bucket(env[s])}" for s in symbols)


def size_bucket(n: int) -> int:
    """``n`` rounded up to a power of two (the autotune key's resolution)."""
    return 1 << max(0, int(n) - 1).bit_length()


class AutotuneCache:
    """The JSON file of winners for one device key (read once, rewritten on every new winner)."""

    def __init__(self, cache_dir: Path, device_key: str) -> None:
        self.path = cache_dir / "autotune" / f"{device_key}.json"
        self._entries: dict[str, dict[str, Any]] | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def get(self, key: str, candidates: Sequence[S.LaunchConfig]) -> S.LaunchConfig | None:
        raw = self._load().get(key)
        if raw is None:
            return None
        try:
            cfg = msgspec.convert(raw, S.LaunchConfig)
        except msgspec.ValidationError:
            return None
        # A winner that is no longer a candidate (the producer changed its configs) is ignored.
        return cfg if cfg in candidates else None

    def put(self, key: str, cfg: S.LaunchConfig) -> None:
        self.put_many({key: cfg})

    def put_many(self, winners: Mapping[str, S.LaunchConfig]) -> None:
        """Store ``winners`` with one read and one write of the file (a tuning run's, at its
        end: one rewrite per winner re-read a file that grows with every model tuned)."""
        if not winners:
            return
        with _file_lock:
            # Re-read so that winners written meanwhile by other processes survive.
            self._entries = None
            entries = self._load()
            entries.update({key: msgspec.to_builtins(cfg) for key, cfg in winners.items()})
            write_atomic(self.path, json.dumps(entries, indent=1, sort_keys=True))


def benchmark(kernel: S.Kernel, cfg: S.LaunchConfig, launch: Callable[[], Any]) -> float:
    """Milliseconds one launch of ``kernel`` with ``cfg`` takes (median of Triton's ``do_bench``).

    A short budget (about 8 ms of wall time per candidate): first-call compile time is a
    target of its own, and the winner is cached on disk, so the choice is made once.
    """
    from triton.testing import do_bench

    try:
        return float(do_bench(launch, warmup=2, rep=6, return_mode="median"))
    except TypeError:  # a Triton without return_mode
        return float(do_bench(launch, warmup=2, rep=6))


class Tuner:
    """Called from a tuning run at each launch of an untuned kernel (``_tune`` in the source)."""

    def __init__(self, program: S.Program, kernels: Mapping[str, Any], winners: dict[str, S.LaunchConfig],
                 cache: AutotuneCache, keys: Mapping[str, str], stats: CompileStats,
                 candidates: Mapping[str, Sequence[S.LaunchConfig]] | None = None) -> None:
        self.program = program
        self.candidates = dict(candidates or {})
        """Per kernel, the configs to benchmark (`prune_candidates`); default: all of them."""
        self.kmap = {k.name: k for k in program.kernels}
        self.kernels = kernels
        self.winners = winners
        self.cache = cache
        self.keys = keys
        self.stats = stats
        self.measured: dict[str, S.LaunchConfig] = {}
        """Winners benchmarked in this run, by autotune key: stored by `flush`, at its end."""

    def _launcher(self, kernel: S.Kernel, step: S.LaunchStep, cfg: S.LaunchConfig, args: tuple[Any, ...],
                  env: Mapping[str, int]) -> Any:
        from torchfuse.runtime.codegen import launch_values

        fn = self.kernels[kernel.name]
        ints = {k: v for k, v in kernel.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
        full = {**env, **ints, **cfg.meta}
        grid = tuple(evaluate(g, full) for g in (step.grid or kernel.grid))
        values = launch_values(kernel, cfg, fn, args)
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        return lambda: fn[grid](*values, **options)

    def __call__(self, slot: int, step_index: int, args: tuple[Any, ...], env: Mapping[str, int]) -> None:
        import torch

        step = self.program.steps[step_index]
        assert isinstance(step, S.LaunchStep)
        kernel = self.kmap[step.kernel]
        cfg = self.winners.get(kernel.name)
        if cfg is None:
            start = time.perf_counter()
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            saved = [t.clone() for t in tensors]
            timings: list[tuple[float, int]] = []
            candidates = list(self.candidates.get(kernel.name) or kernel.configs)
            for i, cand in enumerate(candidates):
                try:
                    ms = benchmark(kernel, cand, self._launcher(kernel, step, cand, args, env))
                except Exception as e:  # e.g. out of shared memory: not a candidate here
                    logger.debug("autotune %s: config %s failed: %s", kernel.name, cand, e)
                    ms = float("inf")
                timings.append((ms, i))
            for t, s in zip(tensors, saved, strict=True):
                t.copy_(s)
            best = min(timings)
            if best[0] == float("inf"):
                cfg = candidates[0]
            else:
                cfg = candidates[best[1]]
                self.measured[self.keys[kernel.name]] = cfg
            self.winners[kernel.name] = cfg
            self.stats.autotuned += 1
            self.stats.autotune_seconds += time.perf_counter() - start
            logger.info("autotune %s: %s (%s)", kernel.name, cfg,
                        ", ".join(f"#{i}: {ms:.4f} ms" for ms, i in timings))
        self._launcher(kernel, step, cfg, args, env)()

    def flush(self) -> None:
        """Write this run's winners to the autotune cache, in one rewrite of its file."""
        self.cache.put_many(self.measured)
        self.measured = {}
