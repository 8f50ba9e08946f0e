"""Turning a Program's kernel sources into Triton ``JITFunction`` objects, and compiling them early.

Triton's ``@jit`` reads its function's source through ``inspect``, so every ``Kernel.source`` is
checked (`check_source`: only imports of triton/math and ``@triton.jit`` functions, see
`torchfuse.graph.kernel_source`), then written to a real file, ``<cache>/kernels/k_<hash>.py``,
named by the hash of its content, and
imported from there. Compiled binaries are Triton's business: its own on-disk cache (keyed by
the source, the compiler version and the target) makes a second process load them instead of
compiling. `precompile` warms every (kernel, config) a call will launch, in a thread pool,
before the first GPU launch, and counts Triton's cache hits and misses where Triton reports them
(``triton.knobs.compilation.listener``), so that "a warm process compiles nothing" can be measured.
"""

from __future__ import annotations

import hashlib
import importlib.util
import linecache
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torchfuse.runtime.config as rconfig
from torchfuse.graph import progress
from torchfuse.graph import schema as S
from torchfuse.graph.caches import write_atomic
from torchfuse.graph.kernel_source import KernelSourceError, check_kernel_source
from torchfuse.runtime import launchers
from torchfuse.runtime.code_cache import compile_cached
from torchfuse.runtime.config import logger
from torchfuse.runtime.errors import KernelCompileError, UntrustedCodeError

_MODULE_PREFIX = "torchfuse_runtime_kernels"
_modules: dict[tuple[str, bool], ModuleType] = {}
"""Imported kernel modules by (file, interpreted)."""
_modules_lock = threading.Lock()


def kernel_hash(kernel: S.Kernel) -> str:
    """Content hash of a kernel's source and entry name (what names its cache file)."""
    digest = hashlib.sha256(kernel.source.encode())
    digest.update(b"\0" + (kernel.entry or kernel.name).encode())
    return digest.hexdigest()[:40]


def entry_name(kernel: S.Kernel) -> str:
    return kernel.entry or kernel.name


def kernels_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or rconfig.config.cache_dir) / "kernels"


def code_dir(cache_dir: Path | None = None) -> Path:
    """Where `torchfuse.runtime.code_cache` keeps compiled Python code."""
    return (cache_dir or rconfig.config.cache_dir) / "code"


_new_sources: set[str] = set()
"""Kernel files this process wrote because none was on disk (`any_new_source`)."""


def _write_once(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    write_atomic(path, text)  # a concurrent process never imports a half-written file
    _new_sources.add(str(path))


def any_new_source(kernels: Sequence[S.Kernel], cache_dir: Path | None = None) -> bool:
    """Whether some of ``kernels`` had no source file in the cache until this process loaded
    them: kernels no process has loaded before, whose binaries Triton has yet to compile. A
    Program whose kernels were all on disk (a warm start) most likely finds every binary in
    Triton's cache too, so loading it does not start the compile workers ahead of need."""
    folder = kernels_dir(cache_dir)
    return any(str(folder / f"k_{kernel_hash(k)}.py") in _new_sources for k in kernels)


def triton_interpreting() -> bool:
    """Whether Triton's ``@jit`` currently builds interpreted (CPU) functions."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    # Older Triton read the variable once, at import.
    from torchfuse.runtime.config import triton_interpret_requested

    return triton_interpret_requested()


def check_source(kernel: S.Kernel) -> None:
    """Raise `UntrustedCodeError` unless the kernel's source has the form that is
    imported without trust (`torchfuse.graph.kernel_source.check_kernel_source`)."""
    try:
        check_kernel_source(kernel.source, entry_name(kernel))
    except KernelSourceError as e:
        raise UntrustedCodeError(
            f"kernel {kernel.name!r}: refusing to import its source: {e}. Load the Program with "
            "trust_code=True to import it anyway (only for a Program from a source you trust)") from e


def code_key(kernel: S.Kernel) -> str:
    """What two kernels with equal code share: the hash of the source with the entry
    function's name replaced by a placeholder. Programs number their kernels on their own
    (``triton_poi_fused_add_0`` in one, ``..._3`` in the next), so equal code rarely has an
    equal name."""
    entry = entry_name(kernel)
    body = re.sub(rf"\b{re.escape(entry)}\b", "\0ENTRY\0", kernel.source)
    return hashlib.sha256(body.encode()).hexdigest()[:40]


_shared: dict[tuple[str, str, bool], tuple[Any, str]] = {}
"""(cache directory, `code_key`, interpreted) -> (the module, its entry name)."""
share_stats = {"imported": 0, "shared": 0}
"""Kernel modules imported, and kernels served by a module of equal code (this process)."""


class LazyKernel:
    """A kernel's function before it is made (`load_kernel` with ``lazy``): a GPU Program's
    warm start may launch every kernel through handles kept on disk
    (`torchfuse.runtime.handle_cache`) and never need the ``JITFunction``, whose creation
    tokenizes the kernel's source (88 ms for 54 kernels on the CPU machine, about 200 ms on
    the GPU hosts). Anything asked of it (an attribute, ``[grid]``) makes the function first;
    `resolved` gives the function itself."""

    def __init__(self, make: Callable[[], Any], name: str) -> None:
        self._make = make
        self._fn: Any = None
        self._lock = threading.Lock()
        self.__name__ = name

    def resolve(self) -> Any:
        fn = self._fn
        if fn is None:
            with self._lock:
                if self._fn is None:
                    self._fn = self._make()
                fn = self._fn
        return fn

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_make", "_fn", "_lock"):  # copy, pickle, half-made
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __getitem__(self, grid: Any) -> Any:
        return self.resolve()[grid]

    def __repr__(self) -> str:
        return f"<LazyKernel {self.__name__}{' (made)' if self._fn is not None else ''}>"


def resolved(fn: Any) -> Any:
    """The kernel function itself, made now if ``fn`` is a `LazyKernel`."""
    return fn.resolve() if isinstance(fn, LazyKernel) else fn


_lazy: dict[tuple[str, str, bool], LazyKernel] = {}


def load_kernel(kernel: S.Kernel, cache_dir: Path | None = None, *, trust_code: bool = False,
                lazy: bool = False) -> Any:
    """The Triton ``JITFunction`` (or interpreted function) a kernel's source defines. The
    source is checked (`check_source`) before it is written or imported, unless
    ``trust_code``; with ``lazy``, it is written now and imported when first used
    (`LazyKernel`).

    Kernels of equal code (`code_key`) share one function in a process, whatever their names
    and Programs: its compiled binaries, in memory, then serve every Program that launches it
    (no second Triton compile or disk-cache load)."""
    if not trust_code:
        check_source(kernel)
    interp = triton_interpreting()
    skey = (str(kernels_dir(cache_dir)), code_key(kernel), interp)
    digest = kernel_hash(kernel)
    path = kernels_dir(cache_dir) / f"k_{digest}.py"
    with _modules_lock:
        found = _shared.get(skey)
        proxy = _lazy.get(skey) if lazy else None
    if lazy:
        if proxy is not None:
            share_stats["shared"] += 1
            return proxy
        _write_once(path, kernel.source)  # on disk now: the compile workers read it
        with _modules_lock:
            return _lazy.setdefault(skey, LazyKernel(
                lambda: load_kernel(kernel, cache_dir, trust_code=True), entry_name(kernel)))
    if found is not None:
        share_stats["shared"] += 1
        return getattr(found[0], found[1])
    key = (str(path), interp)
    with _modules_lock:
        module = _modules.get(key)
        if module is None:
            _write_once(path, kernel.source)
            # Interpreted and compiled builds of one source are different objects; keep both apart.
            mod_name = base = f"{_MODULE_PREFIX}.k_{digest}{'_interp' if interp else ''}"
            suffix = 0
            while mod_name in sys.modules:  # the same source under another cache directory
                suffix += 1
                mod_name = f"{base}_{suffix}"
            spec = importlib.util.spec_from_file_location(mod_name, path)
            if spec is None or spec.loader is None:
                raise KernelCompileError(f"kernel {kernel.name!r}: cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            # Triton reads the function's source back (``inspect.getsourcelines`` in
            # ``JITFunction.__init__``): from memory, not from the file. Kernel files are
            # written once under their hash and never change, so the entry never goes stale.
            linecache.cache[str(path)] = (len(kernel.source), None, kernel.source.splitlines(True), str(path))
            try:
                # what exec_module does, with the bytecode from the code cache (no compile warm)
                code = compile_cached(kernel.source, str(path), code_dir(cache_dir))
                exec(code, module.__dict__)
            except Exception as e:
                sys.modules.pop(mod_name, None)
                raise KernelCompileError(
                    f"kernel {kernel.name!r}: its source ({path}) failed to import: {type(e).__name__}: {e}"
                ) from e
            _modules[key] = module
            share_stats["imported"] += 1
    fn = getattr(module, entry_name(kernel), None)
    if fn is None:
        raise KernelCompileError(
            f"kernel {kernel.name!r}: its source defines no function named {entry_name(kernel)!r}"
        )
    with _modules_lock:
        _shared.setdefault(skey, (module, entry_name(kernel)))
    return fn


def param_names(fn: Any) -> list[str]:
    """Parameter names of a Triton function, in order (constexprs included)."""
    names = getattr(fn, "arg_names", None)
    if names is None:
        import inspect

        names = list(inspect.signature(fn.fn).parameters)
    return list(names)


def device_key(device: str) -> str:
    """What distinguishes compiled code between machines: backend, architecture, Triton version."""
    import triton

    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index
        major, minor = torch.cuda.get_device_capability(
            index if index is not None else torch.cuda.current_device())
        arch = f"{'hip' if torch.version.hip else 'sm'}{major}{minor}"
    else:
        arch = "interpreter"
    return f"{device.split(':')[0]}-{arch}-triton{triton.__version__}"


# ----------------------------------------------------------------------------- compile statistics


@dataclass
class CompileStats:
    """What a CompiledProgram spent compiling (see ``CompiledProgram.stats``)."""

    kernels_loaded: int = 0
    """Kernel modules imported."""
    warmups: int = 0
    """(kernel, config, specialization) pairs handed to Triton before the first launch."""
    triton_cache_hits: int | None = None
    """Binaries Triton loaded from its on-disk cache; ``None`` where Triton does not report it."""
    triton_compiles: int | None = None
    """Binaries Triton really compiled (cache misses); ``None`` where Triton does not report it."""
    plans_skipped: int = 0
    """First calls whose compile plan was skipped: every job was warmed up here before
    (`_compiled_marker`), a warm start."""
    worker_compiles: int = 0
    """Binaries compiled by the worker processes (`torchfuse.runtime.compile_workers`); this
    process then loads each from Triton's disk cache (counted in ``triton_cache_hits``)."""
    compile_seconds: float = 0.0
    """Wall time of importing and precompiling kernels."""
    autotune_seconds: float = 0.0
    autotuned: int = 0
    """Kernels benchmarked over their candidate configs (not found in the autotune cache)."""
    autotune_cache_hits: int = 0
    autotune_skipped: int = 0
    """Kernels with several candidates whose launches were too small to tune (see
    ``Config.autotune_min_bytes``): the cheapest to compile was taken."""
    handles_kept: int = 0
    """Handle keys a warm start recorded from the launch handles an earlier process kept
    (`torchfuse.runtime.handle_cache`): its first call then warmed nothing up."""
    library_warmups: int = 0
    """Library calls (convolutions) a first GPU call handed to a background thread to load
    their kernels (`torchfuse.runtime.library_warmup`, ``Config.library_warmup``)."""
    tuned_later: int = 0
    """Tunings deferred past a first call (``Config.autotune_later``): the first call ran the
    kernels' candidates cheapest to compile, a later call benchmarked them all."""
    later: dict[str, float] = field(default_factory=dict)
    """Seconds of deferred tuning, not part of any first call: ``background`` (the other
    candidates' compiles, while calls went on), ``precompile`` and ``tune`` (the call that
    tuned: compiles still missing, then the tuning run)."""
    generated: int = 0
    """Call functions generated and ``exec``-ed."""
    calls: int = 0
    """Calls through the generated function (each CUDA-graph replay counts in ``graph_replays``)."""
    kernel_launches: int = 0
    """Kernels and extern ops launched from Python (a replayed CUDA graph launches none)."""
    graph_replays: int = 0
    graph_captures: int = 0
    graph_evictions: int = 0
    """CUDA graphs dropped to stay within ``Config.cudagraph_max`` (the least recently replayed)."""
    fallback_reasons: list[str] = field(default_factory=list)
    first_call: dict[str, float] = field(default_factory=dict)
    """Seconds of each phase of the calls that chose configs (the first call, and one per new
    tuned size): ``choose`` (autotune-cache lookups), ``precompile`` (Triton compiles or
    disk-cache loads), ``tune`` (tuning run: benchmarks and the first launches),
    ``generate`` (call function generated and exec-ed), ``run`` (the first call through it:
    first launches, each binding its compiled kernel). Where a cache-hit start spends its time.
    Two more where a background warm-up ran (`CompiledProgram.precompile_async`, a training
    step's backward): ``background`` (its compiles, while the forward ran: overlapping the
    other phases, not after them) and ``wait`` (how long the first call waited for it)."""


class count_compiles:
    """Counts Triton compilations while active, chaining to any listener already installed."""

    def __init__(self, stats: CompileStats) -> None:
        self.stats = stats
        self.lock = threading.Lock()
        self.previous: Any = None
        self.knobs: Any = None

    def __enter__(self) -> count_compiles:
        import triton

        knobs = getattr(triton, "knobs", None)
        if knobs is None or not hasattr(knobs.compilation, "listener"):
            return self
        self.knobs = knobs
        self.previous = knobs.compilation.listener
        if self.stats.triton_cache_hits is None:
            self.stats.triton_cache_hits = 0
            self.stats.triton_compiles = 0

        def listener(*, cache_hit: bool, **kwargs: Any) -> None:
            with self.lock:
                if cache_hit:
                    self.stats.triton_cache_hits += 1
                else:
                    self.stats.triton_compiles += 1
            if self.previous is not None:
                self.previous(cache_hit=cache_hit, **kwargs)

        knobs.compilation.listener = listener
        return self

    def __exit__(self, *exc: object) -> None:
        if self.knobs is not None:
            self.knobs.compilation.listener = self.previous


@dataclass(frozen=True, slots=True)
class WarmupJob:
    """One compilation to run ahead of time: a kernel, its arguments by kind, and launch options."""

    name: str
    fn: Any
    args: tuple[Any, ...]
    """Pointers as torch dtypes (Triton mocks them as 16-byte aligned), scalars as values."""
    kwargs: tuple[tuple[str, Any], ...]


def _clone(fn: Any) -> Any | None:
    """A second ``JITFunction`` over the same Python function, or None.

    A clone has the same source, globals and options, hence the same Triton cache key: what it
    compiles lands in Triton's on-disk cache, where the original then finds it. That is how two
    configs of one kernel compile at the same time without two threads filling one
    ``JITFunction``'s in-memory caches. Functions with options a plain ``@triton.jit`` would
    not reproduce are not cloned.
    """
    try:
        import triton.runtime.jit as tjit
    except ImportError:  # pragma: no cover - triton is a dependency
        return None
    fn = resolved(fn)
    if type(fn) is not getattr(tjit, "JITFunction", None):
        return None
    for attr in ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline", "version",
                 "launch_metadata", "_repr"):
        if getattr(fn, attr, None):
            return None
    registry = getattr(tjit, "_triton_jit_function_registry", None)
    name = f"{getattr(fn, 'module', '')}:{getattr(fn.fn, '__qualname__', '')}"
    previous = registry.get(name) if isinstance(registry, dict) else None
    try:
        clone = tjit.JITFunction(fn.fn)
    except Exception:  # e.g. a Triton whose constructor changed: compile in one thread instead
        return None
    finally:
        if previous is not None:  # the clone registered itself under the original's name
            registry[name] = previous
    return clone


def precompile(jobs: Sequence[WarmupJob], stats: CompileStats, threads: int | None = None,
               background: bool = False, quiet: bool = False) -> None:
    """Compile ``jobs`` with ``fn.warmup`` in a thread pool, every job at the same time.

    Triton's compilation releases the GIL in LLVM and runs ``ptxas`` as a subprocess, so
    threads overlap well (measured: a Python thread keeps running at full speed while another
    compiles). A ``JITFunction``'s own caches are not safe to fill from two threads at once,
    so the first job of each kernel runs on the kernel itself and the others on clones
    (`_clone`), whose binaries land in Triton's disk cache; the kernel then loads them
    from there (milliseconds each) once all compiles are done. A failed warm-up is logged and
    left to the first launch, which raises the real error there. ``background``: a warm-up
    ahead of the first call (`CompiledProgram.precompile_async`), whose worker compiles wait
    behind those of any first call. ``quiet``: no progress line (compiles after the first call,
    whose line was cleared when it ended: a deferred tuning's candidates).
    """
    if not jobs:
        return
    threads = threads or rconfig.config.compile_threads
    start = time.perf_counter()
    by_fn = _by_function(jobs)

    compiled: list[Any] = []
    """The binaries this process will launch (not the clones'): their launchers are bound below."""

    failed = [0]

    def run(group: Sequence[WarmupJob], fn: Any = None) -> None:
        for job in group:
            here = share is not None and share.take(job)  # else a worker compiled it: a disk hit
            try:
                kernel = (fn or job.fn).warmup(*job.args, grid=(1,), **dict(job.kwargs))
            except Exception as e:  # the first real launch reports it with full context
                logger.debug("warm-up of %s failed (%s: %s); compiling at first launch", job.name,
                             type(e).__name__, e)
                failed[0] += 1  # int += under the GIL: a lost count only keeps the marker away
            else:
                if fn is None and kernel is not None:
                    compiled.append(kernel)  # list.append is atomic: no lock needed
            finally:
                if here:
                    share.done_here()  # type: ignore[union-attr]

    tasks: list[tuple[Sequence[WarmupJob], Any]] = []
    reload: list[list[WarmupJob]] = []
    for group in by_fn.values():
        clones = [_clone(group[0].fn) for _ in group[1:]] if threads > 1 else []
        if clones and all(c is not None for c in clones):
            tasks.append(([group[0]], None))
            tasks += [([job], clone) for job, clone in zip(group[1:], clones, strict=True)]
            reload.append(group[1:])
        else:
            tasks.append((group, None))
    unique = [job for group in by_fn.values() for job in group]
    total = len(unique)
    workers = rconfig.config.compile_workers
    marker = None
    share: Any = None
    if _through_workers(total):
        marker = _compiled_marker(unique)
        if marker is None or not _binaries_listed(marker):
            from torchfuse.runtime import compile_workers

            share = compile_workers.hand_out(unique, workers, _source_path, compile_cost,
                                             priority=1 if background else 0)
        else:
            stats.plans_skipped += 1
            marker = None  # nothing to write after
    if share is not None:  # this process's threads take the cheapest, the workers the costliest
        tasks.sort(key=lambda task: min(compile_cost(job) for job in task[0]))
    done = [0]
    done_lock = threading.Lock()

    def run_task(task: tuple[Sequence[WarmupJob], Any]) -> None:
        run(*task)
        with done_lock:
            done[0] += len(task[0])
            if not quiet:
                progress.kernels(done[0], total)

    if threads == 1 or len(tasks) == 1:
        for task in tasks:
            run_task(task)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(tasks))) as pool:
            list(pool.map(run_task, tasks))
    if share is not None:
        stats.worker_compiles += share.by_workers()
        share = None  # the reloads below are disk hits: nothing to take
    for group in reload:  # Triton disk-cache hits now, so that launches find them in memory
        run(group)
    bind_launchers(compiled, threads)
    if marker is not None and not failed[0]:
        _write_marker(marker, compiled)
    stats.warmups += len(jobs)
    stats.compile_seconds += time.perf_counter() - start


def bind_launchers(kernels: Sequence[Any], threads: int) -> None:
    """Load each compiled kernel onto the device, in threads, before the first launch would do
    it one kernel at a time.

    Triton 3.6 (the GPU machine's) builds a C launcher per kernel signature with the system C
    compiler the first time a kernel of that signature loads (``CompiledKernel._init_handles``,
    0.2-0.4 s a build; 19 builds took 7.1 s of GPT-2 training's cold first call on the H200).
    Kernels are loaded here without those builds (`launchers.bound_without_builds`): most then
    launch through ``cuLaunchKernel`` until their launchers are built after the first call
    (`launchers.build_soon`), and those the quick launcher cannot launch (a ``bf16`` scalar,
    scratch memory, clusters) build theirs here, one of each signature first, in parallel.
    Where the swap does not apply (another Triton version that builds launchers),
    one kernel of each signature is bound first, in parallel, and the others after (they then
    find the built launcher in Triton's disk cache). Newer Triton versions build nothing; binding
    is then just the module load the first launch would do anyway. A failure is left to the
    first launch, which reports it.
    """
    unique = list({id(k): k for k in kernels if hasattr(k, "_init_handles")}.values())
    if not unique:
        return
    import torch

    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def bind(kernel: Any) -> None:
        try:
            if device is None:
                kernel._init_handles()
            else:
                with torch.cuda.device(device):  # Triton loads onto the thread's current device
                    kernel._init_handles()
        except Exception as e:
            logger.debug("binding %s early failed (%s: %s); left to its first launch",
                         getattr(kernel, "name", kernel), type(e).__name__, e)

    def build(kernel: Any) -> None:
        try:
            kernel._run.real()
        except Exception as e:
            logger.debug("building the launcher of %s early failed (%s: %s); left to its first launch",
                         getattr(kernel, "name", kernel), type(e).__name__, e)

    with launchers.bound_without_builds() as deferred:
        if deferred:  # nothing is built while loading: all at once
            _in_waves([], unique, bind, threads)
            # ... and kernels that need Triton's launcher build it now, as without the swap
            slow = [k for k in unique if isinstance(getattr(k, "_run", None), launchers.DeferredLauncher)
                    and k._run.quick is None]
            _in_waves(*_by_launcher(slow), build, threads)
        else:
            _in_waves(*_by_launcher(unique), bind, threads)


def _by_launcher(kernels: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(one kernel of each launcher signature, the others): the first build a signature's
    launcher, in parallel; the others then find it in Triton's disk cache."""
    first: dict[Any, Any] = {}
    rest = []
    for kernel in kernels:
        if first.setdefault(_launcher_key(kernel), kernel) is not kernel:
            rest.append(kernel)
    return list(first.values()), rest


def _in_waves(first: Sequence[Any], rest: Sequence[Any], action: Callable[[Any], None], threads: int) -> None:
    """``action`` on every kernel of ``first`` in parallel threads, then on every one of ``rest``."""
    for wave in (first, rest):
        if threads <= 1 or len(wave) <= 1:
            for kernel in wave:
                action(kernel)
            continue
        with ThreadPoolExecutor(max_workers=min(threads, len(wave))) as pool:
            list(pool.map(action, wave))


def _launcher_key(kernel: Any) -> Any:
    """`launchers.signature_key` of a compiled kernel; a kernel it cannot read is its own key
    (a wrong guess only costs time: a build done twice, or waited for)."""
    try:
        return launchers.signature_key(kernel.src)
    except Exception:
        return id(kernel)


def _by_function(jobs: Sequence[WarmupJob]) -> dict[int, list[WarmupJob]]:
    """The distinct jobs, grouped by kernel function: two kernels of equal code share a
    function (`load_kernel`), and are compiled once."""
    by_fn: dict[int, list[WarmupJob]] = {}
    seen: set[tuple[Any, ...]] = set()
    for job in jobs:
        fn = id(resolved(job.fn))  # a `LazyKernel` and its function are one function
        same = (fn, tuple(map(repr, job.args)), job.kwargs)
        if same not in seen:
            seen.add(same)
            by_fn.setdefault(fn, []).append(job)
    return by_fn


def _through_workers(total: int) -> bool:
    """Whether a precompile of ``total`` distinct jobs goes through the compile workers (and
    so plans, or skips the plan by a marker)."""
    return (rconfig.config.compile_workers > 0 and total >= rconfig.config.compile_workers_min
            and not triton_interpreting())


def mark_warm(jobs: Sequence[WarmupJob]) -> None:
    """Leave the marker (`_compiled_marker`) that a warm start's warm-up of ``jobs`` will look
    for, when none is there yet. ``jobs`` must all be compiled in this process by now: after a
    tuning, the warm-ups of the winners, which a later process chooses from the autotune cache
    at once. (A first call that tunes warms up every candidate, and a tuning deferred past it
    warms up the cheapest first and the others later: neither set is the one a warm start
    asks for, so without this its plan ran again, about 1.5 ms a kernel.) Each warm-up here
    is a hit in the kernel's own cache, returning its binary."""
    unique = [job for group in _by_function(jobs).values() for job in group]
    if not _through_workers(len(unique)):
        return
    marker = _compiled_marker(unique)
    if marker is None or _binaries_listed(marker):
        return
    compiled = []
    for job in unique:
        try:
            kernel = job.fn.warmup(*job.args, grid=(1,), **dict(job.kwargs))
        except Exception as e:  # then no marker: a warm start plans, as before
            logger.debug("no warm-start marker: warm-up of %s failed: %s", job.name, e)
            return
        if kernel is None:
            return
        compiled.append(kernel)
    _write_marker(marker, compiled)


def _compiled_marker(jobs: Sequence[WarmupJob]) -> Path | None:
    """Where a file says that every one of ``jobs`` was warmed up without error before, on a
    device of this kind (`device_key`), so that their binaries sit in Triton's disk cache: a
    warm start then skips `compile_workers.plan` (about 1.5 ms a kernel on the H100, spent
    working out Triton's cache key only to find the binary on disk).

    Named by the jobs' kernel files (content hashes), arguments and options; None for jobs the
    workers could not take anyway. The marker lists the binaries' metadata files in Triton's
    cache, and counts only while they all exist (`_binaries_listed`); a marker stale in another
    way (another ``ptxas``, which changes Triton's cache keys) costs time, never a result: each
    warm-up then compiles in this process's threads instead of the workers.
    """
    lines = []
    for job in jobs:
        path = _source_path(job.fn)
        if path is None:
            return None
        lines.append(f"{path.name} {job.args!r} {job.kwargs!r}")
    try:
        lines.append(device_key("cuda"))
    except Exception:  # no device to name: no marker
        return None
    digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:40]
    return path.parent / "compiled" / digest


def _binaries_listed(marker: Path) -> bool:
    """Whether ``marker`` exists and every binary it lists is still in Triton's disk cache (a
    stat each: Triton's cache may have been emptied since, and a start that skipped the plan
    would then compile everything in this process instead of the workers)."""
    try:
        paths = marker.read_text().splitlines()
    except OSError:
        return False
    return bool(paths) and all(os.path.exists(p) for p in paths)


def _write_marker(marker: Path, compiled: Sequence[Any]) -> None:
    """Write ``marker`` listing the metadata file of every binary in ``compiled`` (Triton's
    ``CompiledKernel.metadata_group``); nothing when one has no such file to name."""
    paths = []
    for kernel in compiled:
        group = getattr(kernel, "metadata_group", None) or {}
        found = [str(p) for name, p in group.items() if str(name).endswith(".json")]
        if not found:
            return
        paths += found
    if not paths:
        return
    try:
        write_atomic(marker, "\n".join(sorted(set(paths))) + "\n")
    except OSError as e:  # a read-only cache: the next start plans again
        logger.debug("cannot write %s: %s", marker, e)


def values_per_thread(blocks: Sequence[Any], num_warps: int) -> float:
    """The values each thread of a program holds per tile: the product of the integer block
    sizes over the program's threads. Triton unrolls a block over the threads, so the code it
    compiles, and its compile time, grow with it."""
    block = math.prod(v for v in blocks if isinstance(v, int) and not isinstance(v, bool))
    return block / (32 * max(1, num_warps))


def compile_cost(job: WarmupJob) -> float:
    """A guess of how long Triton takes to compile ``job``, for ordering only: the source's
    length times the values each thread holds per tile. Measured for sm_90 on one fused
    layer-norm backward (768-wide rows, 4 warps): 8 rows per program (64 values a thread)
    5.1 s, 4 rows 2.1 s, 2 rows 1.5 s, 1 row 0.7 s, 1 row with 8 warps 0.55 s: about
    0.4 s + 0.07 s per value a thread holds."""
    kwargs = dict(job.kwargs)
    try:
        named = [*zip(param_names(job.fn), job.args), *kwargs.items()]
    except Exception:  # not one of our kernels: order by source length alone
        named = []
    blocks = [value for name, value in named if name.endswith("BLOCK")]
    per_thread = values_per_thread(blocks, int(kwargs.get("num_warps", 4) or 4))
    source = getattr(job.fn, "src", "") or ""
    return (1 + len(source) / 1000) * (1 + per_thread / 6)


def _source_path(fn: Any) -> Path | None:
    """The cached source file a kernel function was imported from (None: not a plain
    ``JITFunction`` of ours, which the workers could not rebuild)."""
    try:
        import triton.runtime.jit as tjit
    except ImportError:  # pragma: no cover - triton is a dependency
        return None
    fn = resolved(fn)
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    if type(fn) is not getattr(tjit, "JITFunction", None) or code is None:
        return None
    path = Path(code.co_filename)
    return path if path.is_file() else None


def timed(stats: CompileStats, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return fn()
    finally:
        stats.compile_seconds += time.perf_counter() - start
