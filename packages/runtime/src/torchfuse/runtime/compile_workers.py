"""Triton compiles in worker processes: a Program's kernels and autotune candidates at once.

Threads (`torchfuse.runtime.kernels.precompile`) overlap Triton's LLVM and ``ptxas`` work, but
its front end (Python AST to TTIR) holds the GIL. With ``TORCHFUSE_COMPILE_WORKERS=N`` the
runtime starts N worker processes once per process: when the ``inductor`` backend compiles a
GPU graph the Program cache does not hold (`start_early`, before the passes), or when a GPU
Program with kernels new to the cache loads (`torchfuse.runtime.kernels.any_new_source`; a warm
start starts none), or else at the first call that finds a compile to do; and reuses them for
every Program after. Each worker, told the device's target, compiles one small kernel into a
private cache before its first request (`_warm_up`): a worker's first compile pays the
compiler's one-time set-up (on the CPU machine 0.50 s, against 0.11 s once warmed up). A first
call then compiles in three steps:

1. **plan** (here, in this process): each warm-up runs with Triton's ``jit_cache_hook`` set
   to a recorder, which keeps the specialization Triton would compile (its own JSON, as
   ``JITFunction.preload`` reads it) and tells Triton to skip the compile, unless Triton's
   disk cache already holds that binary (`_on_disk`, a warm start): then Triton loads it here
   at once, since a worker would cost a round trip and an import to read the same file;
2. **compile** (in the workers): each worker, once ready, imports the kernel's cached source
   file, rebuilds the specialization and compiles it with Triton for this device's target,
   which writes the binary into Triton's on-disk cache (``TRITON_CACHE_DIR``, shared); the
   caller's threads meanwhile take back, cheapest first, the requests no worker has started
   (`WorkerPool.claim`, ``Config.compile_here`` at a time) and compile them themselves;
3. **load** (here): the ordinary warm-up, now a disk-cache hit for each kernel.

Workers are plain subprocesses speaking one JSON line per request on their pipes, not
``multiprocessing``: a forked child of a process with CUDA initialised is unsafe, and
``spawn`` re-imports the user's ``__main__``. A worker runs this file alone (`_BOOT`), not
the package: it imports Triton and never torch (0.3 s of start-up instead of 3.5 s on a
2-core host). Workers never touch the GPU (a stub driver names the target), start with this
process's environment (the same ``ptxas``, so the same cache keys), and exit when this
process does. Anything a worker cannot do (an unknown Triton, a failed compile) is left to
step 3, which compiles it here as before: the pool can cost time, never a result. A worker
that dies is restarted for the next request; the kernel it was compiling is compiled here,
and a warning says so (once per pool).

When the pool is used (`torchfuse.runtime.config.Config.compile_workers`): by default on a
host of 4 or more cores, with ``min(16, cores - 1)`` workers, started by the first GPU graph
compiled (as torch.compile starts its workers at its first compile), used by a first call
that needs at least ``compile_workers_min`` (2) compiles; ``TORCHFUSE_COMPILE_WORKERS=0``
turns it off.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

_BOOT = ("import importlib.util, sys; "
         "spec = importlib.util.spec_from_file_location('_torchfuse_compile_worker', sys.argv[1]); "
         "module = sys.modules[spec.name] = importlib.util.module_from_spec(spec); "
         "spec.loader.exec_module(module); "
         "sys.exit(module.main())")
"""A worker's command line: this file run by path, so that the package (and torch) stay unimported."""


def _logger() -> Any:
    from torchfuse.runtime.config import logger  # not at import: a worker has no package

    return logger


@dataclass(frozen=True, slots=True)
class CompileRequest:
    """One specialization of one kernel, as a worker compiles it."""

    path: str
    """The kernel's source file (the runtime's content-addressed ``kernels/k_<hash>.py``)."""
    module: str
    """The module name it was imported under here: Triton checks the function's full name."""
    entry: str
    specialization: str
    """Triton's JSON of the specialization (``serialize_specialization_data``)."""
    target: dict[str, Any]
    """The GPU target (``backend``, ``arch``, ``warp_size``)."""


# ----------------------------------------------------------------------------- step 1: plan

_plan_lock = threading.Lock()
_planning = threading.local()


def plan(jobs: Sequence[Any], source_path: Any) -> list[tuple[Any, CompileRequest]]:
    """The compile each warm-up job would run, without running it: ``(job, request)`` pairs.

    ``source_path(fn)`` gives the source file of a kernel function (None: not poolable).
    Jobs whose kernel is compiled already, in memory, record nothing (Triton asks no hook).
    """
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        return []
    target = _target()
    out: list[tuple[Any, CompileRequest]] = []
    with _plan_lock:  # one planner at a time: the hook is one global of Triton's
        previous = knobs.runtime.jit_cache_hook

        def hook(*args: Any, **kwargs: Any) -> Any:
            found = getattr(_planning, "found", None)
            data = (kwargs.get("compile") or {}).get("specialization_data")
            if found is None or data is None or not kwargs.get("is_manual_warmup", True):
                return previous(*args, **kwargs) if previous is not None else None
            if _on_disk(kwargs):
                return None  # Triton: load it here, now (milliseconds); no worker needed
            found.append(data)
            return True  # Triton: skip this compile (the worker does it)

        knobs.runtime.jit_cache_hook = hook
        try:
            for job in jobs:
                path = source_path(job.fn)
                if path is None:
                    continue
                _planning.found = []
                try:
                    job.fn.warmup(*job.args, grid=(1,), **dict(job.kwargs))
                except Exception as e:  # step 3 meets it again and reports it
                    _logger().debug("compile plan of %s failed: %s", job.name, e)
                found, _planning.found = _planning.found, None
                fn = job.fn.fn
                out += [(job, CompileRequest(str(path), fn.__module__, fn.__name__, data, target))
                        for data in found]
        finally:
            _planning.found = None
            knobs.runtime.jit_cache_hook = previous
    return out


def _on_disk(hook_kwargs: dict[str, Any]) -> bool:
    """Whether Triton's disk cache holds the binary the hook's compile would make (a warm
    start: handing it to a worker would cost a round trip and an import for a file read).

    The key is Triton's own (``get_cache_key`` over the same source, backend and options that
    ``triton.compile`` would use, the options read back from the specialization data as
    ``JITFunction.preload`` reads them). Anything unexpected answers False: the worker then
    finds the binary itself, as before.
    """
    try:
        import hashlib

        import triton.runtime.cache as tcache
        from triton import knobs
        from triton.compiler import compiler as tcompiler

        if knobs.runtime.add_stages_inspection_hook is not None or knobs.compilation.always_compile:
            return False
        spec = hook_kwargs["compile"]
        jit_fn = hook_kwargs["fn"].jit_function
        backend = jit_fn.device_caches[spec["device"]][3]
        raw = json.loads(spec["specialization_data"])["options"]
        options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
        src = jit_fn.ASTSource(jit_fn, spec["signature"], spec["constants"], spec["configs"][0])
        env_vars = tcompiler.get_cache_invalidating_env_vars()
        key = tcache.get_cache_key(src, backend, options, env_vars=env_vars)
        manager = tcache.get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        name = f"{src.name[:150]}.json"
        return (manager.get_group(name) or {}).get(name) is not None
    except Exception:  # another Triton: keep to the workers
        return False


def _target() -> dict[str, Any]:
    from triton.runtime.driver import driver

    t = driver.active.get_current_target()
    return {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}


# ----------------------------------------------------------------------------- step 2: the pool


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What became of one request in the pool."""

    error: str | None = None
    """None: compiled into Triton's disk cache; else why not (the worker's exception)."""
    lost: bool = False
    """The worker died or its pipe broke while compiling it."""

    @property
    def ok(self) -> bool:
        return self.error is None


class WorkerPool:
    """``size`` worker processes, each served by one thread of this process.

    A worker takes requests once it is **ready**: started, Triton imported and its compiler
    warmed up (`_warm_up`), which it says with a first line. Until then requests wait in the
    queue, from which the caller may take any back to compile itself (`claim`): on the H100
    host a fresh worker's first reply took 1.1-1.6 s, while a first call's two compiles took
    0.26 s in the caller's threads (2026-12-07), so a small first call does not wait for
    workers still starting, and a big one shares its compiles between both.

    Requests wait in one queue ordered by priority, then by arrival: a first call's compiles
    (priority 0) go before those of a background warm-up (priority 1, a training step's
    backward, started before the forward), which would otherwise hold the forward back
    until every backward kernel had compiled. A worker that dies is replaced; one that dies
    before it is ready is not (its thread gives up, and once none is left, what is queued is
    answered as lost: the caller compiles it).
    """

    def __init__(self, size: int, env: dict[str, str] | None = None,
                 target: dict[str, Any] | None = None) -> None:
        self.size = size
        self.env = dict(os.environ if env is None else env)
        if target is not None:  # each worker warms its compiler up for it while idle (`_warm_up`)
            self.env[TARGET_ENV] = json.dumps(target)
        self._procs: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        self.started = 0
        """Worker processes started, restarts included."""
        self.lost = 0
        """Requests whose worker died under them."""
        self.ready = 0
        """Workers ready (booted and warmed up) and waiting for a request, now."""
        self._warned = False
        self._queue: list[tuple[int, int, CompileRequest, Future[CompileResult]]] = []
        self._ready = threading.Condition()
        self._arrivals = itertools.count()
        self._closed = False
        self._serving = size
        # started now: their imports and warm-up overlap this process's compile work
        booting = [self._start() for _ in range(size)]
        self._servers = [threading.Thread(target=self._serve, args=(proc,), name=f"torchfuse-compile-{i}",
                                          daemon=True) for i, proc in enumerate(booting)]
        for server in self._servers:
            server.start()

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__)], env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1)
        with self._lock:
            self._procs.append(proc)
            self.started += 1
        return proc

    def _await_ready(self, proc: subprocess.Popen[str]) -> bool:
        """Wait for ``proc``'s first line (`READY`); False when it died or said something else."""
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
        except (OSError, ValueError):
            line = ""
        if line.strip() == READY:
            return True
        _logger().debug("compile worker %s exited before it was ready (%r)", proc.pid, line[:200])
        proc.kill()
        return False

    def pids(self) -> list[int]:
        """The process ids of the live workers."""
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]

    def submit(self, requests: Sequence[CompileRequest], priority: int = 0) -> list[Future[CompileResult]]:
        """Queue every request, after any queued of a lower ``priority`` number; one future
        per request, in order, which a worker completes (or `claim` takes back)."""
        futures: list[Future[CompileResult]] = []
        with self._ready:
            if self._closed:
                raise RuntimeError("the compile worker pool is closed")
            for request in requests:
                future: Future[CompileResult] = Future()
                if self._serving:
                    heapq.heappush(self._queue, (priority, next(self._arrivals), request, future))
                else:  # no worker left to ask
                    future.set_result(CompileResult("no compile worker could start", lost=True))
                futures.append(future)
            self._ready.notify_all()
        return futures

    def claim(self, future: Future[CompileResult]) -> bool:
        """Take a queued request back, for the caller to compile itself: True when no worker
        has started it (none will), False when one has (its result is the future's)."""
        return future.cancel()

    def compile(self, requests: Sequence[CompileRequest], priority: int = 0) -> list[CompileResult]:
        """Compile every request in the workers (`submit`) and wait: one result per request."""
        return self.results(self.submit(requests, priority))

    def results(self, futures: Sequence[Future[CompileResult]]) -> list[CompileResult]:
        """The results of submitted requests, waiting for them (None for a claimed one); the
        first loss in the pool's life is a warning."""
        results = [None if f.cancelled() else f.result() for f in futures]
        lost = [r for r in results if r is not None and r.lost]
        if lost and not self._warned:
            self._warned = True
            _logger().warning(
                "torchfuse: a Triton compile worker died (%s); %d kernel(s) are compiled in this "
                "process instead, and the worker is restarted for the next request",
                lost[0].error, len(lost))
        return results  # type: ignore[return-value]

    def _serve(self, proc: subprocess.Popen[str] | None) -> None:
        """One of ``size`` threads, serving one worker at a time: once it is ready, takes the
        first queued request, runs it, and so on; a worker that died is replaced."""
        live = proc is not None and self._await_ready(proc)
        while live:
            taken = self._next()
            if taken is None:  # closed
                break
            request, future = taken
            assert proc is not None
            try:
                result = self._one(proc, request)
            except BaseException as e:  # never leave a caller waiting
                result = CompileResult(f"{type(e).__name__}: {e}")
            future.set_result(result)
            if result.lost:  # dead: a new one serves the next request
                proc = self._start()
                live = self._await_ready(proc)
        self._stop_serving()

    def _next(self) -> tuple[CompileRequest, Future[CompileResult]] | None:
        """The first queued request no caller claimed, waiting for one; None once closed."""
        with self._ready:
            self.ready += 1
            try:
                while not self._closed:
                    while self._queue:
                        _, _, request, future = heapq.heappop(self._queue)
                        if future.set_running_or_notify_cancel():  # else its caller claimed it
                            return request, future
                    self._ready.wait()
                return None
            finally:
                self.ready -= 1

    def _stop_serving(self) -> None:
        """A server thread ends: at close, or with no worker that could start. The last one
        answers what is still queued (its callers then compile it themselves)."""
        with self._ready:
            self._serving -= 1
            if self._serving and not self._closed:
                return
            pending, self._queue = self._queue, []
        why = "the compile worker pool was closed" if self._closed else "no compile worker could start"
        for *_, waiting in pending:
            if waiting.set_running_or_notify_cancel():
                waiting.set_result(CompileResult(why, lost=not self._closed))

    def _one(self, proc: subprocess.Popen[str], request: CompileRequest) -> CompileResult:
        if proc.poll() is not None:
            return CompileResult(f"worker {proc.pid} exited with status {proc.returncode} before "
                                 f"compiling {request.entry}", lost=True)
        message = {"path": request.path, "module": request.module, "entry": request.entry,
                   "specialization": request.specialization, "target": request.target}
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (OSError, ValueError) as e:
            line, why = "", f"pipe broken: {e}"
        else:
            why = "no reply"
        if not line:  # dead: a later request starts a new one
            try:
                code: int | None = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # alive with its output closed: no use either
                proc.kill()
                code = None
            with self._lock:
                self.lost += 1
            return CompileResult(f"worker {proc.pid} exited with status {code} ({why}) "
                                 f"compiling {request.entry}", lost=True)
        return CompileResult(json.loads(line).get("error"))

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for proc in self._procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()  # a worker exits at the end of its input
                proc.wait(timeout=5)
            except Exception:
                proc.kill()


class Shared:
    """The compiles of one first call handed to the workers (`hand_out`), which the caller's
    threads may take back (`take`), at most ``Config.compile_here`` at a time."""

    def __init__(self, pool: WorkerPool, futures: dict[int, list[Future[CompileResult]]]) -> None:
        from torchfuse.runtime.config import config

        self.pool = pool
        self.futures = futures
        """Per job (by ``id``): the futures of its requests."""
        self.slots = threading.BoundedSemaphore(max(1, config.compile_here))
        self.here = config.compile_here > 0

    def take(self, job: Any) -> bool:
        """Before ``job``'s warm-up: True when its compile is this thread's to run (then
        `done_here` after it); False when a worker compiled it (waited for here: the warm-up
        then loads the binary from disk) or it was never the workers' (on disk, not poolable)."""
        futures = self.futures.get(id(job), ())
        if not futures:
            return False
        taken = False
        if self.here:
            self.slots.acquire()  # waiting here, the request stays queued for a worker
            taken = any([self.pool.claim(f) for f in futures])
            if not taken:
                self.slots.release()
        self.pool.results([f for f in futures if not f.cancelled()])  # a worker's, if any left
        return taken

    def done_here(self) -> None:
        self.slots.release()

    def by_workers(self) -> int:
        """Requests the workers compiled without error."""
        return sum(1 for fs in self.futures.values() for f in fs
                   if f.done() and not f.cancelled() and f.result().ok)


def hand_out(jobs: Sequence[Any], workers: int, source_path: Any, cost: Any,
             priority: int = 0) -> Shared | None:
    """Steps 1 and 2 for a first call's warm-up ``jobs``: the compiles they would run, queued
    for the workers (the costliest first, by ``cost(job)``), which compile them into Triton's
    disk cache (the warm-ups after load them), or the caller's threads take them back
    (`Shared.take`). None when nothing went to the workers."""
    planned = plan(jobs, source_path)
    if not planned:  # all on disk (a warm start): no pool needed, none started
        return None
    pool = get_pool(workers)
    if pool is None:
        return None
    # longest first: a pool's wall time is at least its longest compile, and one started last
    # adds all of itself to the end (a 768-wide layer-norm backward took 9 s of ViT's 100)
    planned.sort(key=lambda pair: -cost(pair[0]))
    try:
        futures = pool.submit([request for _, request in planned], priority=priority)
    except RuntimeError as e:  # the pool was closed (interpreter exit): compiled here instead
        _logger().debug("compile workers unavailable (%s); compiling in this process", e)
        return None
    by_job: dict[int, list[Future[CompileResult]]] = {}
    for (job, _), future in zip(planned, futures, strict=True):
        by_job.setdefault(id(job), []).append(future)

        def failed(f: Future[CompileResult], name: str = job.name) -> None:
            if not f.cancelled() and not f.result().ok:  # compiled here instead, by its warm-up
                _logger().debug("compile worker: %s failed (%s); compiling it in this process", name,
                                f.result().error)
        future.add_done_callback(failed)
    return Shared(pool, by_job)


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def get_pool(size: int) -> WorkerPool | None:
    """The process's pool (started at the first call, reused after); None when ``size`` < 1.
    Its workers learn this device's target, to warm their compiler up for it (`_warm_up`)."""
    global _pool
    if size < 1:
        return None
    with _pool_lock:
        if _pool is None:
            try:
                target: dict[str, Any] | None = _target()
            except Exception:  # no device to ask: the workers start cold
                target = None
            _pool = WorkerPool(size, target=target)
            atexit.register(_pool.close)
        return _pool


def start_early() -> None:
    """Start the pool now, if this process uses one (`Config.compile_workers`): for a caller
    about to produce a GPU Program with kernels to compile (the ``inductor`` backend, on a
    cache miss), so that the workers' start and their compiler's set-up (`_warm_up`) overlap
    the passes instead of the first call. A pool that cannot start is left to the first call."""
    import torch
    from torchfuse.runtime import config as rconfig

    workers = rconfig.config.compile_workers
    # a GPU graph compiled where it cannot run, or run by the interpreter: nothing to compile
    # (this module stays below `kernels`: the interpreter is asked for by its variable)
    if workers < 1 or not torch.cuda.is_available() or rconfig.triton_interpret_requested():
        return
    try:
        get_pool(workers)
    except Exception as e:
        _logger().debug("compile workers not started early (%s: %s)", type(e).__name__, e)


# ----------------------------------------------------------------------------- the worker


class _StubDriver:
    """What Triton asks of a driver to compile (not launch): the device and its target."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def compile_request(request: dict[str, Any]) -> None:
    """Compile one request in this process (the worker's job; tests call it directly)."""
    import importlib.util

    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    t = request["target"]
    driver.set_active(_StubDriver(GPUTarget(t["backend"], t["arch"], t["warp_size"])))
    name = request["module"]
    module = sys.modules.get(name)
    if module is None or getattr(module, "__file__", None) != request["path"]:
        spec = importlib.util.spec_from_file_location(name, request["path"])
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot import {request['path']}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    fn = getattr(module, request["entry"])
    fn.preload(request["specialization"])  # Triton's own reading of its JSON: the same key


READY = '{"ready": true}'
"""A worker's first line: booted and warmed up, it takes requests from now on."""

TARGET_ENV = "TORCHFUSE_COMPILE_WORKER_TARGET"
"""The environment variable that hands a worker its device's target (JSON of `_target`)."""

_WARM_UP_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def torchfuse_worker_warm_up(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(x_ptr + offs, tl.exp(x) / tl.sum(x, axis=0), mask=offs < n)
"""


def _warm_up(target: dict[str, Any]) -> None:
    """Compile one small kernel for ``target`` before any request comes: a worker's first
    compile pays the compiler's one-time set-up (the backend, LLVM, ``ptxas``, the hash of
    Triton's own files): 0.50 s for a small reduction on the CPU machine against 0.13 s for
    the next one of its size, and 0.11 s as the first request of a warmed-up worker. The
    binary goes to a private Triton cache (a hit in the shared one would set nothing up).

    It calls ``triton.compile`` on the kernel's source with its signature, not
    ``JITFunction.warmup``: Triton 3.6's argument specialization imports torch, which took
    a worker 3.9 s on the H100 host (15 workers starting at once: 9-12 s to a first reply)."""
    import importlib.util
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    saved = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="torchfuse_warm_up_") as tmp:
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        try:
            path = os.path.join(tmp, "torchfuse_worker_warm_up.py")
            with open(path, "w") as f:
                f.write(_WARM_UP_SOURCE)
            spec = importlib.util.spec_from_file_location("_torchfuse_worker_warm_up", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            source = ASTSource(module.torchfuse_worker_warm_up,
                               {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})
            triton.compile(source, target=GPUTarget(target["backend"], target["arch"], target["warp_size"]))
        finally:
            if saved is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # real compiles, whatever the parent runs
    import triton  # noqa: F401  -- imported before the first request, while the parent works

    target = os.environ.get(TARGET_ENV)
    if target:
        try:
            _warm_up(json.loads(target))
        except Exception as e:  # a cold first request instead; nothing else changes
            sys.stderr.write(f"torchfuse compile worker: warm-up failed: {type(e).__name__}: {e}\n")
    sys.stdout.write(READY + "\n")  # the pool sends requests from now on
    sys.stdout.flush()

    for line in sys.stdin:
        try:
            compile_request(json.loads(line))
            reply: dict[str, Any] = {}
        except Exception as e:  # reported to the parent, which compiles this one itself
            reply = {"error": f"{type(e).__name__}: {e}"[:2000]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
