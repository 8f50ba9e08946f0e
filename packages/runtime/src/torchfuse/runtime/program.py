"""``load(program)`` and `CompiledProgram`: a Program made callable.

Loading validates the Program and imports its kernels (on a GPU, when first used:
`kernels.LazyKernel`). The first call binds the size symbols, precompiles every kernel launch
in parallel (GPU; a warm start that tunes nothing instead records the launch handles an
earlier process kept, `torchfuse.runtime.handle_cache`, and compiles nothing), autotunes
kernels with several candidate configs (GPU, winners cached on disk; in ``mode="default"`` a
first call without stored winners runs the candidates cheapest to compile and a later call
tunes, `_install_pending`), then generates and ``exec``-s the call function for the chosen configs (see
[`torchfuse.runtime.codegen`][torchfuse.runtime.codegen]); later calls go straight to it.

Where a call goes (``CompiledProgram._entry``):

    _first_call ──> generated function ──(sizes not tuned for: _TUNED_FOR)──> _redispatch
        │               ^                                                        │
        │               └──────────── tuned for those sizes, installed ──────────┘
        └──(GPU, mode="default", kernels without stored winners)──> pending
    pending ──(the deferred candidates' background compiles done)──> _tune_pending
            ──> tuned, installed: the generated function (until then: the provisional one)

``reduce-overhead`` wraps all of it in `torchfuse.runtime.cudagraphs.GraphRunner`.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

import msgspec
import torch
import torchfuse.runtime.config as rconfig
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.ops import to_dtype
from torchfuse.runtime import background, call_cache, codegen, handle_cache, launchers, library_warmup
from torchfuse.runtime.autotune import (
    AutotuneCache,
    Tuner,
    cheapest_to_compile,
    launch_bytes,
    launch_symbols,
    prune_candidates,
    tuning_key,
)
from torchfuse.runtime.checks import buffer_table, diagnose_inputs, symbol_source, validate_program
from torchfuse.runtime.code_cache import compile_cached
from torchfuse.runtime.config import logger
from torchfuse.runtime.errors import (
    CorruptArchiveError,
    InputError,
    InterpreterRequiredError,
    RuntimeLoadError,
    UntrustedCodeError,
)
from torchfuse.runtime.kernels import (
    CompileStats,
    WarmupJob,
    any_new_source,
    code_dir,
    count_compiles,
    device_key,
    kernel_hash,
    load_kernel,
    mark_warm,
    precompile,
    timed,
    triton_interpreting,
)

Mode = Literal["default", "reduce-overhead"]
_warned_interpreter = False

_INTERPRETER_LOCK = threading.RLock()
"""Held while a program runs Triton kernels through the interpreter (CPU): the interpreter
patches ``triton.language`` for the duration of each launch, so two threads launching at once
see each other's patches ("Did you forget to add @triton.jit?"). GPU launches run unlocked."""


def _cuda_device(args: tuple[Any, ...]) -> torch.device:
    """The device of the call's first CUDA tensor (the current CUDA device when none is)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device
    return torch.device("cuda", torch.cuda.current_device())


def _add(phases: dict[str, float], name: str, seconds: float) -> None:
    phases[name] = phases.get(name, 0.0) + seconds


def _warn_interpreter_once() -> None:
    global _warned_interpreter
    if not _warned_interpreter:
        _warned_interpreter = True
        warnings.warn(
            "torchfuse.runtime: running Triton kernels on the CPU through Triton's interpreter "
            "(TRITON_INTERPRET=1). This path is for testing and is very slow; use small tensors.",
            RuntimeWarning, stacklevel=4,
        )


def _own_cpp(kernels: list[S.Kernel]) -> bool:
    """Whether C++ kernels are this user's own code (`torchfuse.runtime.cpp.vouch`)."""
    from torchfuse.runtime.cpp import is_vouched

    return is_vouched(kernels)


class CompiledProgram:
    """A loaded Program: call it with the Program's inputs (flat, in order) to get its outputs.

    Attributes worth knowing: ``source`` (the generated call function as Python text),
    ``stats`` (compile and launch counters, see [`CompileStats`][torchfuse.runtime.kernels.CompileStats]),
    ``program`` (the Program record), ``device_type`` and ``mode``.
    """

    def __init__(self, program: S.Program, *, device_type: str, mode: Mode = "default",
                 tensors: dict[str, torch.Tensor] | None = None, cache_dir: Path | None = None,
                 trust_code: bool = False) -> None:
        validate_program(program)
        self.program = program
        self.device_type = device_type
        self.mode = mode
        self.tensors = dict(tensors or {})
        self.cache_dir = cache_dir or rconfig.config.cache_dir
        self.stats = CompileStats()
        self._lock = threading.RLock()
        # the compiled entry this Program belongs to (its first call's phases are filed there)
        self._observe_as = (observe.current_graph(), observe.current_role())
        self._reported = False
        triton_kernels = [k for k in program.kernels if k.language == "triton"]
        cpp_kernels = [k for k in program.kernels if k.language == "cpp"]
        self._serial = device_type == "cpu" and bool(triton_kernels)
        """Calls take `_INTERPRETER_LOCK` (Triton's interpreter is not thread-safe)."""
        self._kmap = {k.name: k for k in program.kernels}
        if cpp_kernels and not trust_code and not _own_cpp(cpp_kernels):
            raise UntrustedCodeError(
                f"program {program.name!r} holds C++ kernels ({cpp_kernels[0].name!r}, ...), native code "
                "that cannot be validated before it runs, and not compiled by this process nor read "
                "from its compile cache: load it with trust_code=True (only for a Program from a "
                "source you trust)")
        if cpp_kernels and device_type != "cpu":
            raise RuntimeLoadError(f"program {program.name!r} holds C++ kernels, which run on the CPU only")
        if device_type == "cpu" and triton_kernels and not triton_interpreting():
            raise InterpreterRequiredError(
                f"program {program.name!r} runs on the CPU, which needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 in the environment before triton is imported (e.g. before "
                "`import torchfuse.runtime`), or load it with device='cuda' (or compile it with the "
                "C++ CPU backend, inductor option cpu_backend='cpp')"
            )

        def load_all() -> dict[str, Any]:
            # on a GPU, made when first used: a warm start may launch them all from kept handles
            lazy = device_type == "cuda"
            out = {k.name: load_kernel(k, self.cache_dir, trust_code=trust_code, lazy=lazy)
                   for k in triton_kernels}
            if cpp_kernels:
                from torchfuse.runtime.cpp import load_library

                out.update(load_library(cpp_kernels, self.cache_dir))
            return out

        self.kernels: dict[str, Any] = timed(self.stats, load_all)
        self.stats.kernels_loaded = len(self.kernels)
        self._hashes = {k.name: kernel_hash(k) for k in program.kernels}
        self._gpu = device_type == "cuda"
        if self._gpu and triton_kernels and any_new_source(triton_kernels, self.cache_dir):
            from torchfuse.runtime.compile_workers import start_early

            # started now, while the caller works on, for this Program's first call or a later
            # one's (not for a warm start, whose binaries are on disk)
            start_early()
        self._layout = launchers.triton_layout() if self._gpu and rconfig.config.direct_launch else "generic"
        self._variants: dict[tuple[Any, ...], codegen.Generated] = {}
        self._by_key: dict[tuple[int, ...], Any] = {}
        tunable = [k for k in program.kernels if len(k.configs) > 1]
        self._setup_tuning(tunable if (self._gpu and rconfig.config.autotune) else [])
        self._precompiled: set[tuple[Any, ...]] = set()
        self._digest: str | None = None
        """The Program's hash (`_generate`'s cache key), made when first needed."""
        self._later_compiles: Future[None] | None = None
        """The deferred candidates' background compiles (`_install_pending`), if any."""
        self._generated: codegen.Generated | None = None
        self._entry: Any = self._first_call
        self._graphs: Any = None
        if mode == "reduce-overhead":
            from torchfuse.runtime.cudagraphs import GraphRunner

            self._graphs = GraphRunner(self)
        elif mode != "default":
            raise ValueError(f"unknown mode {mode!r}; expected 'default' or 'reduce-overhead'")

    def _setup_tuning(self, tunable: list[S.Kernel]) -> None:
        """Which kernels are autotuned (GPU only, unless a test asks), and on which symbols."""
        self._tunable = tunable
        self._candidates: dict[str, list[S.LaunchConfig]] = {}
        """Per tunable kernel, the candidates `_choose` kept for the last sizes it saw."""
        self._tune_symbols = tuple(sorted({s for k in tunable for s in launch_symbols(self.program, k)}))
        self._autotune_cache: AutotuneCache | None = None  # made at the first call (needs the device)

    # ------------------------------------------------------------------------- calling

    def __call__(self, *inputs: Any) -> list[Any]:
        if self._graphs is not None:
            return self._graphs(inputs)
        if self._serial:
            with _INTERPRETER_LOCK:
                return self._entry(*inputs)
        return self._entry(*inputs)

    def run_uncaptured(self, *inputs: Any) -> list[Any]:
        """Run through the generated call function (never a CUDA graph)."""
        if self._serial:
            with _INTERPRETER_LOCK:
                return self._entry(*inputs)
        return self._entry(*inputs)

    @property
    def source(self) -> str:
        """The generated call function (after the first call; before it, what it would be with
        every kernel's first config)."""
        if self._generated is None:
            return codegen.generate(self.program, device_type=self.device_type, kernels=self.kernels,
                                    configs=self._default_configs(), fast=self._fast_allowed(),
                                    layout=self._layout).source
        return self._generated.source

    @property
    def call(self) -> Any:
        """The generated function itself (lowest overhead; no CUDA graphs). Available after the first call."""
        return self._entry

    def _default_configs(self) -> dict[str, S.LaunchConfig | None]:
        return {k.name: (k.configs[0] if k.configs else None) for k in self.program.kernels}

    def _fast_allowed(self) -> bool:
        return self._gpu and rconfig.config.fast_launch

    def _bad_inputs(self, args: tuple[Any, ...]) -> InputError:
        return diagnose_inputs(self.program, self.device_type, args) or InputError(
            f"inputs do not match program {self.program.name!r}")

    def _bind(self, args: tuple[Any, ...]) -> dict[str, int]:
        err = diagnose_inputs(self.program, self.device_type, args)
        if err is not None:
            raise err
        env: dict[str, int] = {}
        for sym in self.program.symbols:
            src = symbol_source(sym)
            env[sym.name] = int(args[src[0]].shape[src[1]]) if src else int(sym.hint or 0)
        return env

    def _first_call(self, *args: Any) -> list[Any]:
        t0 = time.perf_counter()
        with self._lock:
            # a background warm-up (`precompile_async`) holds the lock until it is done
            _add(self.stats.first_call, "wait", time.perf_counter() - t0)
            env = self._bind(args)
            # not under reduce-overhead: a thread launching while a CUDA graph is captured
            # would break the capture; not while the background thread compiles (a training
            # step's backward): the two threads would slow each other (`library_warmup`)
            if self._gpu and rconfig.config.library_warmup and self.mode != "reduce-overhead" \
                    and not background.busy():
                self.stats.library_warmups = library_warmup.start(self.program, env, _cuda_device(args))
            if not self._gpu and self._serial:
                _warn_interpreter_once()
            if not self._gpu and not self._tunable:
                t0 = time.perf_counter()
                fn = self._install(self._default_configs(), tuned_key=None)
                t1 = time.perf_counter()
                out = fn(*args)
                _add(self.stats.first_call, "generate", t1 - t0)
                _add(self.stats.first_call, "run", time.perf_counter() - t1)
                self._report_first_call()
                return out
            return self._dispatch(args, env)

    def _redispatch(self, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            return self._dispatch(args, self._bind(args))

    def _dispatch(self, args: tuple[Any, ...], env: dict[str, int]) -> list[Any]:
        # Every Triton compilation during this call (warm-up, tuning, first launches) is counted.
        with count_compiles(self.stats):
            out = self._dispatch_counted(args, env)
        self._report_first_call()
        return out

    def _report_first_call(self) -> None:
        """File the first call's phases and counts with the compiled entry this Program belongs
        to (``timings.json``, the ``perf_hints`` channel; `torchfuse.graph.observe`), once."""
        name, role = self._observe_as
        if self._reported or name is None:
            return
        self._reported = True
        st = self.stats
        with observe.compiling(name, role):
            for phase, seconds in st.first_call.items():
                observe.record_time(f"runtime.{phase}", seconds)
            for what, n in (("kernels", st.kernels_loaded), ("warmups", st.warmups),
                            ("triton_compiles", st.triton_compiles), ("worker_compiles", st.worker_compiles),
                            ("plans_skipped", st.plans_skipped), ("handles_kept", st.handles_kept),
                            ("library_warmups", st.library_warmups),
                            ("triton_cache_hits", st.triton_cache_hits),
                            ("autotuned", st.autotuned), ("autotune_cache_hits", st.autotune_cache_hits),
                            ("autotune_skipped", st.autotune_skipped)):
                observe.record_count(f"runtime.{what}", n or 0)
        observe.flush_timings(name)

    def _dispatch_counted(self, args: tuple[Any, ...], env: dict[str, int], now: bool = False) -> list[Any]:
        """Choose configs for these symbol values (tuning if needed), then call their function.

        Runs on the first call (GPU), and again for each new value of the symbols that tuned
        kernels depend on. Tuning is deferred (`_later`) unless ``now``: the call that
        finishes a deferred tuning (`_tune_pending`).
        """
        key = tuple(env[s] for s in self._tune_symbols)
        fn = self._by_key.get(key)
        if fn is not None:
            self._entry = fn
            return fn(*args)
        phases = self.stats.later if now else self.stats.first_call
        t0 = time.perf_counter()
        configs = self._default_configs()
        winners, missing, tkeys = self._choose(env, count=not now)
        # deferred only on the first call: sizes met later tune at once, as before
        later = not now and not self._by_key and self._later(missing)
        t1 = time.perf_counter()
        _add(phases, "choose", t1 - t0)
        generated = 0.0
        if self._gpu:
            # a warm start launches from the handles kept on disk, else every kernel warms up
            warm, generated = self._start_warm({**configs, **winners}, key, bool(missing) or later)
            if not warm:
                self._precompile(env, self._to_warm(configs, winners, missing, later))
        t2 = time.perf_counter()
        _add(phases, "generate", generated)
        _add(phases, "precompile", t2 - t1 - generated)
        if later:
            fn = self._install_pending(configs, winners, missing, env)
            t3 = time.perf_counter()
            _add(phases, "generate", t3 - t2)
            result = fn(*args)
            _add(phases, "run", time.perf_counter() - t3)
            return result
        result = None
        if missing:
            assert self._autotune_cache is not None
            tuner = Tuner(self.program, self.kernels, winners, self._autotune_cache, tkeys, self.stats,
                          candidates=self._candidates)
            gen = self._generate(configs={**configs, **winners}, tune=frozenset(missing))
            try:
                result = self._exec(gen, {"_tune": tuner})(*args)
            finally:  # what was measured is kept, even when the run failed after it
                tuner.flush()
        t3 = time.perf_counter()
        _add(phases, "tune", t3 - t2)
        configs.update(winners)
        # the set a warm start will warm up: the winners'
        jobs = self._warmup_jobs(env, self._to_warm(configs, winners, [])) if self._gpu and missing else []
        if jobs:
            mark_warm(jobs)
        fn = self._install(configs, tuned_key=key if self._tune_symbols else None)
        if jobs and handle_cache.launches_aligned(self.program):  # not called this time (the
            # tuning run gave the result): its handles kept now, for a warm start
            handle_cache.keep_tuned(fn, jobs, codegen.handle_key(self.program, env, args))
        self._by_key[key] = fn
        t4 = time.perf_counter()
        _add(phases, "generate", t4 - t3)
        if result is None:
            result = fn(*args)
        _add(phases, "run", time.perf_counter() - t4)
        logger.info("program %r: first call %s; triton hits %s, compiles %s, autotuned %d, "
                    "tune-cache hits %d",
                    self.program.name, ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items()),
                    self.stats.triton_cache_hits, self.stats.triton_compiles, self.stats.autotuned,
                    self.stats.autotune_cache_hits)
        return result

    def _choose(self, env: dict[str, int], count: bool = False
                ) -> tuple[dict[str, S.LaunchConfig], list[str], dict[str, str]]:
        """(configs known for tunable kernels, kernels still to tune, their tuning keys)."""
        if self._tunable and self._autotune_cache is None:
            self._autotune_cache = AutotuneCache(self.cache_dir, device_key(self.device_type))
        winners: dict[str, S.LaunchConfig] = {}
        missing = []
        tkeys = {}
        buffers = buffer_table(self.program)
        limit = 0 if self.program.meta.get("mode") == "max-autotune" else rconfig.config.autotune_default_max
        for k in self._tunable:
            moved = launch_bytes(self.program, k, env, buffers)
            if moved is not None and moved < rconfig.config.autotune_min_bytes:
                # launch-latency bound: no candidate is worth a compile and a benchmark
                winners[k.name] = cheapest_to_compile(k.configs)
                self.stats.autotune_skipped += count
                continue
            candidates = self._candidates[k.name] = prune_candidates(self.program, k, env, limit)
            if len(candidates) == 1:  # the others launch the same programs, or were cut by limit
                winners[k.name] = candidates[0]
                self.stats.autotune_skipped += count
                continue
            tkeys[k.name] = tuning_key(self._hashes[k.name], launch_symbols(self.program, k), env)
            assert self._autotune_cache is not None
            hit = self._autotune_cache.get(tkeys[k.name], candidates)
            if hit is None:
                missing.append(k.name)
            else:
                winners[k.name] = hit
                self.stats.autotune_cache_hits += count
        return winners, missing, tkeys

    def _to_warm(self, configs: dict[str, S.LaunchConfig | None], winners: dict[str, S.LaunchConfig],
                 missing: list[str], later: bool = False) -> dict[str, list[S.LaunchConfig | None]]:
        """Only what will run: every candidate of a kernel still to tune (only its
        `_provisional` one when its tuning is deferred, ``later``), else the chosen config."""
        return {k.name: ([self._provisional(k)] if later else self._tuning_candidates(k)) if k.name in missing
                else [winners.get(k.name) or configs[k.name]] for k in self.program.kernels}

    def _tuning_candidates(self, kernel: S.Kernel) -> list[S.LaunchConfig]:
        return list(self._candidates.get(kernel.name) or kernel.configs)

    def _provisional(self, kernel: S.Kernel) -> S.LaunchConfig:
        """What a kernel whose tuning is deferred runs until then: its candidate cheapest to
        compile (Triton's compile time grows faster than the work per thread: a softmax row's
        two-rows-per-program candidate took 780 ms against 132 ms for one row per program)."""
        return cheapest_to_compile(self._tuning_candidates(kernel))

    # ------------------------------------------------------------------------- deferred tuning

    def _later(self, missing: list[str]) -> bool:
        """Whether kernels still to tune are tuned after the first call (`Config.autotune_later`)."""
        return (bool(missing) and rconfig.config.autotune_later and self._graphs is None
                and self.program.meta.get("mode") != "max-autotune")

    def _install_pending(self, configs: dict[str, S.LaunchConfig | None], winners: dict[str, S.LaunchConfig],
                         missing: list[str], env: dict[str, int]) -> Any:
        """Run each kernel's `_provisional` candidate until the others are compiled, then tune.

        The provisional function checks no sizes (any candidate is correct at any size; only
        its speed was to be chosen), so calls go straight to it while the background compiles
        run; the first call that finds them done tunes, through `_dispatch_counted`, and
        installs the winners' function."""
        kmap = self._kmap
        chosen = {**configs, **winners, **{k: self._provisional(kmap[k]) for k in missing}}
        gen = self._generate(configs=chosen, fast=self._fast_allowed())
        provisional = self._exec(gen, {"_TUNED_FOR": set()})
        self._generated = gen
        rest = {k: [c for c in self._tuning_candidates(kmap[k]) if c is not chosen[k]] for k in missing}
        done: Future[None] | None = None
        if self._gpu:
            device = torch.cuda.current_device()
            done = background.submit(self._compile_later, env, rest, device)
        self._later_compiles = done
        logger.info("program %r: %d kernel(s) run their candidate cheapest to compile; tuned after %s",
                    self.program.name, len(missing),
                    "the others compile" if done is not None else "this call")

        def pending(*args: Any) -> list[Any]:
            if done is None or done.done():
                return self._tune_pending(args)
            return provisional(*args)

        self._entry = pending
        return provisional

    def _compile_later(self, env: dict[str, int], warm: dict[str, list[S.LaunchConfig | None]],
                       device: int) -> None:
        """The deferred candidates' compiles (background thread; the calls go on meanwhile)."""
        if background.exiting():
            return
        start = time.perf_counter()
        with torch.cuda.device(device), self._lock:
            try:
                self._precompile(env, warm, background=True, quiet=True)
            except Exception as e:  # the tuning call compiles what is missing, and reports it
                logger.debug("background compile of %r's candidates failed: %s", self.program.name, e)
        _add(self.stats.later, "background", time.perf_counter() - start)

    def _tune_pending(self, args: tuple[Any, ...]) -> list[Any]:
        """The call that tunes what the first call deferred (its own sizes: any not tuned yet)."""
        with self._lock:
            env = self._bind(args)
            with count_compiles(self.stats):
                before = self.stats.autotuned
                out = self._dispatch_counted(args, env, now=True)
                self.stats.tuned_later += self.stats.autotuned - before
            self._report_later()
            return out

    def _report_later(self) -> None:
        """File the deferred tuning with the compiled entry, as the first call's phases are:
        ``runtime.later.<phase>`` (the tuning call's ``choose``, ``precompile``: compiles still
        missing, ``tune``: the tuning run, ``generate``; the background compiles overlapped
        other work and are left out)."""
        name, role = self._observe_as
        if name is None:
            return
        with observe.compiling(name, role):
            for phase, seconds in self.stats.later.items():
                if phase not in ("background", "run"):
                    observe.record_time(f"runtime.later.{phase}", seconds)
            observe.record_count("runtime.tuned_later", self.stats.tuned_later)
        observe.flush_timings(name)

    def precompile_async(self) -> Future[None] | None:
        """Start compiling, in the background, what the first call will launch (GPU only).

        Symbol values come from the Program's hints, the configs from the same choice the first
        call makes (autotune cache, small-launch rule). The first call waits for it (they share
        a lock) and then compiles only what is still missing, e.g. for sizes other than the
        hints. The autograd glue uses this to compile a backward's kernels while the forward's
        first call runs. Returns the future, or None when there is nothing to do.
        """
        if not self._gpu or not self.program.kernels or self._generated is not None:
            return None
        env = {s.name: s.hint for s in self.program.symbols}
        if any(v is None for v in env.values()):
            return None
        # the caller's device: Triton compiles and loads for the thread's current one
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        return background.submit(self._warm_in_background, {k: int(v) for k, v in env.items()}, device)

    def _warm_in_background(self, env: dict[str, int], device: int | None = None) -> None:
        on_device = torch.cuda.device(device) if device is not None else contextlib.nullcontext()
        with on_device, self._lock:
            if self._generated is not None:  # the first call came first
                return
            start = time.perf_counter()
            winners, missing, _ = self._choose(env)
            # Not under count_compiles: Triton's listener is one global, and a foreground call
            # of another program may be swapping it right now.
            try:
                later = self._later(missing)
                # a warm start: the call function's kept handles, loaded now (the first call
                # finds its variant made and its handles recorded), else a warm-up
                try:
                    key = tuple(env[s] for s in self._tune_symbols)
                    configs = {**self._default_configs(), **winners}
                    kept, _ = self._start_warm(configs, key, bool(missing) or later)
                except Exception as e:  # the first call meets it again; warm up meanwhile
                    logger.debug("kept handles of %r not loaded: %s", self.program.name, e)
                    kept = False
                if not kept:
                    warm = self._to_warm(self._default_configs(), winners, missing, later)
                    self._precompile(env, warm, background=True)
            except Exception as e:  # the first call meets it again and reports it there
                logger.debug("background warm-up of %r failed: %s", self.program.name, e)
            # filed with the first call's phases; it overlapped other work (the forward's)
            _add(self.stats.first_call, "background", time.perf_counter() - start)

    def _precompile(self, env: dict[str, int], warm: dict[str, list[S.LaunchConfig | None]],
                    background: bool = False, quiet: bool = False) -> None:
        """Compile every (launch, config) in ``warm`` before the first launch, in parallel."""
        jobs = []
        for job in self._warmup_jobs(env, warm):
            jkey = (job.name, tuple(map(repr, job.args)), tuple(sorted(job.kwargs)))
            if jkey not in self._precompiled:
                self._precompiled.add(jkey)
                jobs.append(job)
        precompile(jobs, self.stats, background=background, quiet=quiet)

    def _warmup_jobs(self, env: dict[str, int],
                     warm: dict[str, list[S.LaunchConfig | None]]) -> list[WarmupJob]:
        """A warm-up per (launch, config) in ``warm``: the kernel's arguments at these sizes."""
        buffers = buffer_table(self.program)
        jobs = []
        for step in self.program.steps:
            if not isinstance(step, S.LaunchStep):
                continue
            kernel = self._kmap[step.kernel]
            args: list[Any] = []
            for param, a in zip(kernel.signature, step.args, strict=True):
                if isinstance(a, S.TensorRef):
                    buf = buffers.get(a.name)
                    dtype = param.dtype or (buf.dtype if buf else "float32")
                    args.append(to_dtype(dtype))  # Triton mocks a dtype as an aligned pointer
                elif isinstance(a, S.SymRef):
                    args.append(evaluate(a.expr, env))
                elif isinstance(a, S.Float):
                    args.append(float(a.value))
                else:
                    args.append(getattr(a, "value", None))
            fn = self.kernels[kernel.name]
            for cfg in warm.get(kernel.name, ()):  # kernels not named: nothing to warm up
                values = codegen.launch_values(kernel, cfg, fn, args)
                kw = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages} if cfg else {}
                jobs.append(WarmupJob(kernel.name, fn, tuple(values), tuple(kw.items())))
        return jobs

    def _generate(self, *, configs: dict[str, S.LaunchConfig | None], fast: bool = False,
                  tune: frozenset[str] = frozenset(), tuned_for: tuple[str, ...] | None = None
                  ) -> codegen.Generated:
        """`codegen.generate` for this Program, or what an earlier process kept of it
        (`torchfuse.runtime.call_cache`)."""
        layout = self._layout if fast else "generic"
        if self._digest is None:
            # Sorted: a Program compiled in this process holds its dicts in the order they were
            # built; one read back from the program cache, sorted. Both must hash the same.
            self._digest = hashlib.sha256(msgspec.msgpack.encode(self.program, order="sorted")).hexdigest()
        key = call_cache.call_key(
            self._digest, device=self.device_type, fast=fast, layout=layout, tune=sorted(tune),
            tuned_for=tuned_for, configs={k: msgspec.to_builtins(c) for k, c in sorted(configs.items())})
        folder = self.cache_dir / "calls"
        gen = call_cache.load(folder, key, self.kernels)
        if gen is None:
            gen = codegen.generate(self.program, device_type=self.device_type, kernels=self.kernels,
                                   configs=configs, fast=fast, tune=tune, tuned_for=tuned_for,
                                   layout=layout)
            call_cache.store(folder, key, gen, self.kernels)
        gen.key = key
        return gen

    def _exec(self, gen: codegen.Generated, extra: dict[str, Any]) -> Any:
        namespace = dict(gen.globals)
        namespace.update(
            _stats=self.stats,
            _bad_inputs=self._bad_inputs,
            _redispatch=self._redispatch,
            **extra,
        )
        if self._gpu:
            import triton

            handles: dict[tuple[Any, ...], tuple[Any, ...]] = {}
            kept = handle_cache.Recorder(self.cache_dir / "calls", gen.key) if gen.key else None
            record = launchers.recorder(handles, self._layout, aligned_only=bool(self.program.inputs),
                                        note_fallback=self._note_fallback, kept=kept)
            namespace.update(
                # torch.cuda.current_device() without its lazy-init check (the inputs are on CUDA)
                _current_device=torch._C._cuda_getDevice,
                _get_stream=triton.runtime.driver.active.get_current_stream,
                _handles=handles,
                _record=record,
            )
        # Named by its content, not by how many were generated before it: a warm start that
        # tunes nothing generates one function fewer than the cold one, and must find the
        # code cache's entry for the same source under the same name.
        digest = hashlib.sha256(gen.source.encode()).hexdigest()[:12]
        filename = f"<torchfuse.runtime:{self.program.name}:{digest}>"
        code = compile_cached(gen.source, filename, code_dir(self.cache_dir))
        # Register the source so tracebacks through the generated function show its lines.
        import linecache

        linecache.cache[filename] = (len(gen.source), None, gen.source.splitlines(True), filename)
        exec(code, namespace)
        self.stats.generated += 1
        logger.debug("program %r: generated call function\n%s", self.program.name, gen.source)
        return namespace[gen.fast_entry or gen.entry]

    def _start_warm(self, configs: dict[str, S.LaunchConfig | None], key: tuple[int, ...],
                    tunes: bool) -> tuple[bool, float]:
        """On a first call that tunes nothing: make its call function (`_variant`) and record
        the launch handles `handle_cache` kept for it. (Whether any were, the seconds spent
        making it.)"""
        if tunes or self._by_key or not self._fast_allowed():
            return False, 0.0
        t0 = time.perf_counter()
        gen = self._variant(configs, tuned_key=key if self._tune_symbols else None)
        fn = gen.globals["_fn"]
        generated = time.perf_counter() - t0
        if gen.key is None or gen.fast_entry is None or "_record" not in fn.__globals__:
            return False, generated
        if not fn.__globals__["_handles"]:  # else loaded already, by a background warm-up
            handle_cache.preload(self.cache_dir / "calls", gen.key, fn.__globals__["_record"])
            self.stats.handles_kept += len(fn.__globals__["_handles"])
        return bool(fn.__globals__["_handles"]), generated

    def _variant(self, configs: dict[str, S.LaunchConfig | None],
                 tuned_key: tuple[int, ...] | None) -> codegen.Generated:
        """The call function for ``configs``, generated and exec-ed once (``globals["_fn"]``)."""
        ckey = tuple((k, msgspec.json.encode(c)) for k, c in sorted(configs.items()))
        gen = self._variants.get(ckey)
        if gen is None:
            tuned_for = self._tune_symbols if tuned_key is not None else None
            gen = self._generate(configs=configs, fast=self._fast_allowed(), tuned_for=tuned_for)
            self._variants[ckey] = gen
            gen.globals["_fn"] = self._exec(gen, {"_TUNED_FOR": set()})
        if tuned_key is not None:
            # The symbol values these configs were chosen for; others go back to _dispatch.
            gen.globals["_fn"].__globals__["_TUNED_FOR"].add(tuned_key)
        return gen

    def _install(self, configs: dict[str, S.LaunchConfig | None], tuned_key: tuple[int, ...] | None) -> Any:
        """The call function for ``configs`` (`_variant`), made the entry point."""
        gen = self._variant(configs, tuned_key)
        self._generated = gen
        self._entry = fn = gen.globals["_fn"]
        return fn

    def _note_fallback(self, reason: str) -> None:
        if reason not in self.stats.fallback_reasons:
            self.stats.fallback_reasons.append(reason)
            logger.info("program %r: %s", self.program.name, reason)

    # ------------------------------------------------------------------------- saving

    def save(self, path: str | Path) -> Path:
        """Write the Program (and any tensors it was loaded with) as an archive (directory or ``.zip``)."""
        from torchfuse.graph import save
        from torchfuse.runtime.__about__ import __version__

        return save(self.program, path, tensors=self.tensors or None,
                    producer=("torchfuse-runtime", __version__))

    def __repr__(self) -> str:
        return (f"CompiledProgram({self.program.name!r}, device={self.device_type!r}, mode={self.mode!r}, "
                f"kernels={len(self.program.kernels)}, steps={len(self.program.steps)})")


def _resolve_device(program: S.Program, device: str | torch.device | None) -> str:
    if device is None:
        return program.device.split(":")[0]
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise RuntimeLoadError(f"device {device!r}: torchfuse runs Programs on 'cpu' or 'cuda'")
    return kind


def _read_archive(path: Path) -> tuple[S.Program, dict[str, torch.Tensor]]:
    from torchfuse.graph import ArchiveError, FormatVersionError, load_archive

    try:
        archive = load_archive(path)  # size-capped, named members only, content hash required
    except FormatVersionError as e:
        raise CorruptArchiveError(f"{path}: {e}") from e
    except (ArchiveError, msgspec.MsgspecError, OSError, ValueError, KeyError) as e:
        raise CorruptArchiveError(f"{path} is not a loadable Program archive: {e}") from e
    if not isinstance(archive.document, S.Program):
        raise CorruptArchiveError(
            f"{path} holds a {type(archive.document).__name__}, not a Program; compile it with "
            "torchfuse.inductor first")
    return archive.document, archive.tensors


def load(program_or_path: S.Program | str | Path, *, device: str | torch.device | None = None,
         mode: Mode = "default", trust_code: bool = False) -> CompiledProgram:
    """Load a Program (a record, or the path of an archive) and return it as a callable.

    Loading never runs code from the Program: it is validated (`InvalidProgramError`),
    and each kernel source must have the form
    [`check_kernel_source`][torchfuse.graph.kernel_source.check_kernel_source] accepts before it is imported
    (`UntrustedCodeError`). ``trust_code=True`` skips the source check, for a Program
    from a source you trust whose kernels use more of Python than that form allows. A Program
    with C++ kernels (`torchfuse.runtime.cpp`) needs ``trust_code=True``, C++ being impossible to
    check before it runs, unless its kernels are this user's own code: compiled by
    ``torchfuse.inductor`` in this process or read back from the user's own compile cache
    ([`vouch`][torchfuse.runtime.cpp.vouch]).

    Needs only torchfuse-graph and torchfuse-runtime. Kernels are imported from a
    content-addressed cache and compiled by Triton on first use; an archive's kernel sources
    are validated before anything imports them.

    Args:
        program_or_path: A [`Program`][torchfuse.graph.Program] record, or the directory or
            ``.zip`` file of a Program archive (written by ``torchfuse.graph.save`` or
            [`CompiledProgram.save`][torchfuse.runtime.CompiledProgram.save]).
        device: Where to run: defaults to the Program's own device type. ``"cpu"`` runs any
            Program, a cuda one included, through Triton's CPU interpreter
            (``TRITON_INTERPRET=1`` must be set before triton is imported; slow).
        mode: ``"default"``, or ``"reduce-overhead"`` to replay calls as CUDA graphs.

    Returns:
        A [`CompiledProgram`][torchfuse.runtime.CompiledProgram]; call it with the Program's
        flat inputs, in order, to get the list of its outputs.

    Raises:
        CorruptArchiveError: The archive does not load, or holds a Graph rather than a Program.
        InvalidProgramError: The Program fails validation (kernel sources included).
        InterpreterRequiredError: The Program runs on the CPU and Triton was imported without
            ``TRITON_INTERPRET=1``.
        RuntimeLoadError: ``device`` is neither ``"cpu"`` nor ``"cuda"``.
        TypeError: ``program_or_path`` is neither a Program nor a path.

    Examples:
        ```python
        fn = torchfuse.runtime.load("model.tfp.zip")
        out, = fn(x, y)
        ```
    """
    tensors: dict[str, torch.Tensor] = {}
    if isinstance(program_or_path, S.Program):
        program = program_or_path
    elif isinstance(program_or_path, str | Path):
        program, tensors = _read_archive(Path(program_or_path))
    else:
        raise TypeError(f"load() takes a Program or an archive path, got {type(program_or_path).__name__}")
    return CompiledProgram(program, device_type=_resolve_device(program, device), mode=mode, tensors=tensors,
                           trust_code=trust_code)
