"""Run the benchmark suite: eager vs torch.compile vs torchfuse, side by side in one process.

    python benchmarks/run.py                         # the whole table on the GPU
    python benchmarks/run.py --only softmax,rope     # some rows
    python benchmarks/run.py --small --device cpu --skip-compile --only seed_fn_1k   # smoke run

Per workload and variant it records the median time, speedup over eager, GB/s and % of the
device-to-device copy bandwidth measured at the start of the same run, TFLOP/s for matmul-bound
rows, the cold compile time (first call), the cache-hit compile time (first call in a second
process sharing the same cache directories), the peak extra memory of one call, and whether
the outputs (and gradients) match eager. A variant that fails records ``error`` in its cell and
the run goes on. Results go to ``<out>/<tag>.json``, ``.md`` and ``.png`` (when matplotlib is
importable). See ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHEMA = "torchfuse-bench/1"
VARIANTS = ("eager", "torch_compile", "torchfuse")
HIT_MARKER = "CACHE_HIT_JSON:"


def _set_cache_dirs(root: str | None) -> str:
    """Point every compile cache at ``root`` (a fresh temp dir by default) before any import.

    Fresh directories make the first call of each compiler a real cold compile; the cache-hit
    subprocess inherits the same environment, so its first calls hit those caches.
    """
    root = root or tempfile.mkdtemp(prefix="torchfuse_bench_")
    for var, sub in (("TORCHFUSE_CACHE_DIR", "torchfuse"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton")):
        path = os.path.join(root, sub)
        os.makedirs(path, exist_ok=True)
        os.environ[var] = path
    return root


def _pin_ptxas() -> str | None:
    """Set ``TRITON_PTXAS_PATH`` to torch's bundled ``ptxas`` before anything compiles, as
    torch.compile does at its first Triton compile (``_set_triton_ptxas_path``), when unset.

    Triton hashes the ptxas version into every cache key, once per process (its backend hash
    is cached at the first compile). Set by torch.compile *after* torchfuse's first compile,
    the variable made the parent's entries keyed by Triton's own ptxas while the cache-hit
    child, inheriting it from the start, looked them up under torch's: every Triton compile
    of run ``gpu_20261202_0106``'s hit column missed (``triton_cache_hits`` 0 on all 19 rows).
    Pinned here, every process of a run uses one ptxas from its first compile on."""
    import importlib.util

    if os.environ.get("TRITON_PTXAS_PATH"):
        return os.environ["TRITON_PTXAS_PATH"]
    spec = importlib.util.find_spec("torch")
    for root in (spec.submodule_search_locations or []) if spec else []:
        ptxas = Path(root) / "bin" / "ptxas"
        if ptxas.is_file() and os.access(ptxas, os.X_OK):
            os.environ["TRITON_PTXAS_PATH"] = str(ptxas)
            return str(ptxas)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    p.add_argument("--skip", default="", help="comma-separated workload names to leave out")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile column")
    p.add_argument("--skip-torchfuse", action="store_true", help="no torchfuse column")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke runs)")
    p.add_argument("--mode", default=None, help="torchfuse compile mode (e.g. reduce-overhead)")
    p.add_argument("--dynamic", default=None, choices=("true", "false"), help="torchfuse dynamic=")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: default mode)")
    p.add_argument("--options", default="",
                   help='torchfuse compile options as JSON, e.g. \'{"pointwise_rows": 1024}\' (an A/B run)')
    p.add_argument("--tag", default=None, help="result file name (default: <device>_<date>)")
    p.add_argument("--out", default=str(HERE / "results"), help="directory for the result files")
    p.add_argument("--cache-dir", default=None, help="root of the compile caches (default: fresh temp)")
    p.add_argument("--no-cache-hit", action="store_true", help="skip the cache-hit subprocess")
    p.add_argument("--hit-timeout", type=float, default=240.0, help="seconds for the cache-hit run")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new workload after this many seconds (rows left are marked skipped)")
    p.add_argument("--variant-timeout-s", type=float, default=180.0,
                   help="give up on one variant's compile + first call after this long (0: never)")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warmup")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    p.add_argument("--cache-hit-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hit-env", default="", help=argparse.SUPPRESS)  # JSON: workload -> compile env
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- helpers


class VariantTimeout(Exception):
    """A variant's compile or first call ran past ``--variant-timeout-s``."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`VariantTimeout` in this (main) thread after ``seconds``; 0 = no limit.

    A slow compiler is mostly Python code, which a signal interrupts; this keeps one stuck
    workload from eating the time of the whole suite.
    """
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise VariantTimeout(f"no result within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def short_error(e: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message``, shortened: what goes into a result cell."""
    msg = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Device:
    """Timing, synchronization and memory statistics for one device."""

    def __init__(self, name: str, warmup_ms: float, rep_ms: float) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(name)
        self.is_cuda = self.device.type == "cuda"
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms

    def sync(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize()

    def healthy(self) -> str | None:
        """None when the device still works; else why not (a failed kernel can poison CUDA)."""
        try:
            self.sync()
            return None
        except Exception as e:  # a sticky CUDA error surfaces here
            return short_error(e)

    def bench_ms(self, step: Callable[[], Any]) -> float:
        """Median milliseconds of ``step()``: CUDA events via do_bench, else a timeit median."""
        if self.is_cuda:
            import triton.testing

            return float(triton.testing.do_bench(step, warmup=self.warmup_ms, rep=self.rep_ms,
                                                 return_mode="median"))
        step()
        times: list[float] = []
        deadline = time.perf_counter() + self.rep_ms / 1e3
        while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 100):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def loop_ms(self, step: Callable[[], Any], rep_ms: float | None = None) -> float:
        """Milliseconds per call of ``step`` called back to back, synchronized only at the ends:
        what a loop over the function achieves, the larger of its host time (Python, guards,
        launches) and its GPU time (with warm caches). ``bench_ms`` flushes the L2 before each
        call and times it with CUDA events, which hides the host time whenever it is shorter
        than the flush; a launch-bound row needs both numbers."""
        step()
        self.sync()
        t0 = time.perf_counter()
        step()
        self.sync()
        one = max(time.perf_counter() - t0, 1e-6)
        n = max(10, min(100_000, int((rep_ms or self.rep_ms) / 1e3 / one)))
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        self.sync()
        return (time.perf_counter() - t0) * 1e3 / n

    def flush_ms(self) -> float | None:
        """GPU time of the L2 flush ``bench_ms`` runs before each timed call (its host-hiding window)."""
        if not self.is_cuda:
            return None
        import triton

        driver = triton.runtime.driver.active
        cache = driver.get_empty_cache_for_benchmark()
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        driver.clear_cache(cache)
        start.record()
        for _ in range(10):
            driver.clear_cache(cache)
        end.record()
        self.sync()
        return start.elapsed_time(end) / 10

    def timed_call(self, step: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``step`` once; return its result and wall seconds (synchronized)."""
        self.sync()
        t0 = time.perf_counter()
        result = step()
        self.sync()
        return result, time.perf_counter() - t0

    def finish_tuning(self, step: Callable[[], Any]) -> float:
        """Wall seconds until torchfuse's tuning deferred past the first call is done: the wait
        for its background compiles (`torchfuse.runtime.wait_for_background`) and one call
        (which tunes). Before any steady-state timing, which must not time untuned kernels."""
        from torchfuse.runtime import wait_for_background

        t0 = time.perf_counter()
        wait_for_background()
        self.timed_call(step)
        return time.perf_counter() - t0

    def peak_extra_mb(self, step: Callable[[], Any]) -> float | None:
        """Peak memory of one call above what was allocated before it (inputs excluded)."""
        if not self.is_cuda:
            return None
        cuda = self.torch.cuda
        self.sync()
        cuda.reset_peak_memory_stats(self.device)
        base = cuda.memory_allocated(self.device)
        result = step()
        self.sync()
        peak = cuda.max_memory_allocated(self.device) - base
        del result
        return peak / 2**20

    def copy_bandwidth_gbps(self) -> float:
        """Device-to-device copy bandwidth: ``2 * bytes / time`` of a large ``dst.copy_(src)``."""
        torch = self.torch
        nbytes = 2**30 if self.is_cuda else 2**26
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=self.device).uniform_()
        dst = torch.empty_like(src)
        ms = self.bench_ms(lambda: dst.copy_(src))
        return 2 * nbytes / (ms * 1e-3) / 1e9

    def name(self) -> str:
        if self.is_cuda:
            return self.torch.cuda.get_device_name(self.device)
        import platform

        return platform.processor() or platform.machine() or "cpu"


class Compilers:
    """Makes the callable of each variant, resetting the compiler's state first."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.torchfuse_import_error: str | None = None
        self._tf: Any = None
        if not args.skip_torchfuse:
            try:
                import torchfuse.capture as tf

                self._tf = tf
            except Exception as e:
                self.torchfuse_import_error = short_error(e)

    def variants(self) -> list[str]:
        out = ["eager"]
        if not self.args.skip_compile:
            out.append("torch_compile")
        if not self.args.skip_torchfuse:
            out.append("torchfuse")
        return out

    def make(self, variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if variant == "eager":
            return fn
        if variant == "torch_compile":
            import torch

            torch._dynamo.reset()
            kwargs = {"mode": self.args.compile_mode} if self.args.compile_mode else {}
            return torch.compile(fn, **kwargs)
        if self._tf is None:
            raise RuntimeError(f"torchfuse.capture does not import: {self.torchfuse_import_error}")
        if not self.args.skip_compile:
            import torch

            # Drop torch.compile's state for this function so nothing of it is left around
            # torchfuse's run (its caches hang off the same code objects).
            torch._dynamo.reset()
        if hasattr(self._tf, "reset"):
            self._tf.reset()
        kwargs: dict[str, Any] = {}
        if self.args.mode:
            kwargs["mode"] = self.args.mode
        if self.args.dynamic is not None:
            kwargs["dynamic"] = self.args.dynamic == "true"
        if self.args.options:
            kwargs["options"] = json.loads(self.args.options)
        return self._tf.compile(fn, **kwargs)

    def prewarm(self, dev: Device) -> dict[str, str]:
        """Compile a trivial function with each compiler so imports and worker start-up are paid
        before the first timed compile (as in BENCHMARKS.md). Returns failures by variant."""
        torch = dev.torch
        x = torch.ones(8, device=dev.device)
        failures = {}
        for variant in self.variants()[1:]:
            try:
                self.make(variant, _prewarm_fn)(x)
                dev.sync()
            except Exception as e:
                failures[variant] = short_error(e)
        return failures


def _prewarm_fn(x: Any) -> Any:
    return x * 2 + 1


def make_step(wl: Any, case: Any, compiled: Callable[..., Any]) -> Callable[[], Any]:
    """The timed unit: a forward call, or forward + loss + gradients for training rows."""
    import torch

    if not wl.training:
        return lambda: compiled(*case.inputs)

    def train_step() -> Any:
        out = compiled(*case.inputs)
        loss = wl.loss(out)
        return loss, torch.autograd.grad(loss, case.grad_wrt)

    return train_step


def detach_all(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple | list):
        return type(value)(detach_all(v) for v in value)
    return value


def flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def check_against(expected: Any, actual: Any, tol: dict[str, float]) -> str:
    """``ok`` or ``MISMATCH: ...`` for outputs (and loss + gradients of training rows).

    ``atol`` is taken relative to the largest magnitude of each expected tensor: gradients of a
    mean over millions of elements are ~1e-8 each, where an absolute bf16 tolerance would
    accept anything.
    """
    import torch

    exp, act = flatten(expected), flatten(actual)
    if len(exp) != len(act):
        return f"MISMATCH: {len(act)} values, eager gave {len(exp)}"
    for i, (e, a) in enumerate(zip(exp, act, strict=True)):
        try:
            if not isinstance(e, torch.Tensor):
                if e != a:
                    return f"MISMATCH: value {i}: {a!r} != {e!r}"
                continue
            finite = e[torch.isfinite(e)] if e.is_floating_point() else e.to(torch.int64)
            scale = float(finite.abs().max()) if finite.numel() else 1.0
            atol = tol["atol"] * max(scale, 1e-30)
            torch.testing.assert_close(a, e, rtol=tol["rtol"], atol=atol, equal_nan=True)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return f"MISMATCH: value {i}: " + " | ".join(lines[:3])[:300]
        except Exception as err:
            return f"MISMATCH: value {i}: " + short_error(err)
    return "ok"


def gradient_bytes(case: Any) -> int:
    from workloads import tensor_bytes

    return tensor_bytes(case.grad_wrt)


# ----------------------------------------------------------------------------- one workload


def run_workload(wl: Any, dev: Device, compilers: Compilers, args: argparse.Namespace,
                 copy_gbps: float) -> dict[str, Any]:
    from workloads import Bound, tensor_bytes

    scale = "small" if args.small else "full"
    row: dict[str, Any] = {
        "name": wl.name, "description": wl.description, "shapes": wl.shapes,
        "dtype": str(wl.dtype).removeprefix("torch."), "bound": wl.bound.value,
        "training": wl.training, "scale": scale, "bytes": None, "flops": None,
        "reference": None if wl.reference is None else {
            "eager_ms": wl.reference.eager_ms, "torch_compile_ms": wl.reference.compiled_ms,
            "torch_compile_s": wl.reference.compile_s, "gbps": wl.reference.gbps},
        "results": {},
    }
    try:
        case = wl.make_case(dev.device, None, scale)
    except Exception as e:
        row["error"] = "inputs: " + short_error(e)
        return row
    expected: Any = None
    for variant in compilers.variants():
        cell: dict[str, Any] = {"ms": None, "error": None}
        row["results"][variant] = cell
        if variant == "torchfuse":
            # the environment this compile saw: its cache-hit child gets the same (see
            # _apply_compile_env)
            cell["compile_env"] = _compile_env()
        try:
            with deadline(args.variant_timeout_s):
                compiled = compilers.make(variant, case.fn)
                step = make_step(wl, case, compiled)
                first, cold_s = dev.timed_call(step)
            if variant == "eager":
                expected = detach_all(first)
                outputs = first[0] if wl.training else first
                if wl.bound is not Bound.MODEL:
                    row["bytes"] = tensor_bytes(case.inputs, outputs) + (
                        gradient_bytes(case) if wl.training else 0)
                if wl.flops is not None:
                    row["flops"] = wl.flops(case.inputs)
            else:
                cell["compile_s"] = cold_s
                cell["check"] = ("no eager reference" if expected is None
                                 else check_against(expected, detach_all(first), wl.tolerances()))
            del first
            if variant == "torchfuse":
                cell["tuned_after_s"] = cold_s + dev.finish_tuning(step)
            cell["peak_mb"] = dev.peak_extra_mb(step)
            ms = dev.bench_ms(step)
            cell["ms"] = ms
            if row["bytes"]:
                cell["gbps"] = row["bytes"] / (ms * 1e-3) / 1e9
                cell["pct_copy"] = 100.0 * cell["gbps"] / copy_gbps
            if row["flops"]:
                cell["tflops"] = row["flops"] / (ms * 1e-3) / 1e12
        except Exception as e:
            cell["error"] = short_error(e)
        finally:
            compiled = step = None
            gc.collect()
        broken = dev.healthy()
        if broken:
            row["device_lost"] = f"after {variant}: {broken}"
            break
    add_speedups(row)
    del case, expected
    gc.collect()
    if dev.is_cuda:
        dev.torch.cuda.empty_cache()
    return row


# ----------------------------------------------------------------------------- cache hits


def add_speedups(row: dict[str, Any]) -> None:
    """Each compiler's speedup over the row's eager time, where both were measured."""
    eager_ms = row["results"].get("eager", {}).get("ms")
    for cell in row["results"].values():
        if eager_ms and cell.get("ms"):
            cell["speedup"] = eager_ms / cell["ms"]


def cache_hit_worker(args: argparse.Namespace) -> int:
    """Child process: first-call time of each named workload, with caches already filled."""
    import torch
    import workloads

    dev = Device(args.device, args.warmup_ms, args.rep_ms)
    compilers = Compilers(args)
    compilers.prewarm(dev)
    scale = "small" if args.small else "full"
    envs = json.loads(Path(args.hit_env).read_text()) if args.hit_env else {}
    for wl in workloads.select([n for n in args.only.split(",") if n]):
        times: dict[str, float | str] = {}
        if wl.name in envs:
            _apply_compile_env(envs[wl.name])
        for variant in compilers.variants()[1:]:
            try:
                case = wl.make_case(dev.device, None, scale)
                before = _torchfuse_cache_counts() if variant == "torchfuse" else None
                triton_counts = _triton_counter() if variant == "torchfuse" else contextlib.nullcontext()
                with deadline(args.variant_timeout_s), triton_counts:
                    step = make_step(wl, case, compilers.make(variant, case.fn))
                    _, seconds = dev.timed_call(step)
                times[variant] = seconds
                if before is not None:
                    # what the first call found in the on-disk caches: a miss here means the
                    # "hit" compiled (a key that differs from the cold process's); Triton's
                    # own compiles and cache hits beside them
                    after = _torchfuse_cache_counts()
                    times["torchfuse_cache"] = {k: after[k] - before[k] for k in after} | {
                        "triton_compiles": triton_counts.stats.triton_compiles,
                        "triton_cache_hits": triton_counts.stats.triton_cache_hits}
            except Exception as e:
                times[variant] = "error: " + short_error(e)
            finally:
                case = step = None
                gc.collect()
        if dev.is_cuda:
            torch.cuda.empty_cache()
        # One line per workload, so that a parent that times out keeps what was measured.
        print(HIT_MARKER + json.dumps({wl.name: times}), flush=True)
    return 0


def _triton_counter() -> Any:
    """Counts Triton's compiles and cache hits while active (the runtime's own counter chains
    to it)."""
    from torchfuse.runtime.kernels import CompileStats, count_compiles

    return count_compiles(CompileStats())


def _compile_env() -> dict[str, str]:
    """The environment variables that can change a compile (and so a cache key)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "TORCHINDUCTOR_", "CUDA_"))}


def _apply_compile_env(saved: dict[str, str]) -> None:
    """Make this process's compile-related environment what ``saved`` records: what a second
    start of the same program sees. torch.compile, compiling in the parent before or between
    torchfuse's compiles, may set such variables there (``TRITON_PTXAS_PATH`` for one), and a
    child inheriting the parent's final environment could then look Triton's cache up under
    other tools than the cold compile used."""
    for k in _compile_env():
        if k not in saved:
            del os.environ[k]
    os.environ.update(saved)


def _torchfuse_cache_counts() -> dict[str, int]:
    from torchfuse.inductor import cache

    return {k: getattr(cache.stats, k) for k in ("program_hits", "program_misses", "aot_hits", "aot_misses")}


def run_cache_hits(rows: list[dict[str, Any]], args: argparse.Namespace) -> str | None:
    """Re-run every compiled workload's first call in fresh processes; fill ``compile_hit_s``.

    One child process per compiler: a child that ran torch.compile's hit first (its compile
    workers, its caches in memory) made torchfuse's hit in the same process look 3-10x slower
    than a fresh process's (``benchmarks/warm_start.py``, run ``gpu_20261130_1339``).
    """
    children = []
    for variant, skip in (("torch_compile", "--skip-torchfuse"), ("torchfuse", "--skip-compile")):
        names = [r["name"] for r in rows if r["results"].get(variant, {}).get("ms")]
        if names:
            children.append((variant, names, skip))
    notes = []
    for variant, names, skip in children:  # --hit-timeout is shared between the children
        note = _cache_hit_child(rows, names, args, skip, args.hit_timeout / len(children))
        if note:
            notes.append(f"{variant}: {note}")
    return "; ".join(notes) or None


def _cache_hit_child(rows: list[dict[str, Any]], names: list[str], args: argparse.Namespace,
                     skip: str, timeout: float) -> str | None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cache-hit-worker", "--only", ",".join(names),
           "--device", args.device, skip]
    envs = {r["name"]: r["results"]["torchfuse"]["compile_env"] for r in rows
            if r["name"] in names and "compile_env" in r["results"].get("torchfuse", {})}
    if skip == "--skip-compile" and envs:  # the torchfuse child: each workload's compile environment
        env_file = Path(args.cache_dir) / "torchfuse_compile_env.json"
        env_file.write_text(json.dumps(envs))
        cmd += ["--hit-env", str(env_file)]
    if args.small:
        cmd.append("--small")
    for flag, value in (("--mode", args.mode), ("--dynamic", args.dynamic), ("--options", args.options),
                        ("--compile-mode", args.compile_mode),
                        ("--variant-timeout-s", str(args.variant_timeout_s)),
                        ("--cache-dir", args.cache_dir)):
        if value:
            cmd += [flag, value]
    note = None
    # The child leads its own process group, killed whole when it ends, so no compile worker
    # it started outlives it into the next child's measurement. (This did not explain the slow
    # torchfuse hits of full runs: see benchmarks/notes/2026-11.md, "Cache-hit column".)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            tail = (stderr or stdout).strip().splitlines()[-3:]
            note = f"cache-hit run failed (rc={proc.returncode}): " + " | ".join(tail)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        note = f"cache-hit run timed out after {timeout:.0f} s (later workloads have no hit time)"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    hits: dict[str, dict[str, float | str]] = {}
    for line in stdout.splitlines():
        if line.startswith(HIT_MARKER):
            hits.update(json.loads(line[len(HIT_MARKER):]))
    for row in rows:
        for variant, value in hits.get(row["name"], {}).items():
            if variant == "torchfuse_cache":  # the hit's on-disk cache lookups, kept beside it
                row["results"].get("torchfuse", {})["compile_hit_cache"] = value
                continue
            cell = row["results"].get(variant)
            if cell is None or cell.get("ms") is None:
                continue
            if isinstance(value, str):
                cell["compile_hit_error"] = value
            else:
                cell["compile_hit_s"] = value
    return note


# ----------------------------------------------------------------------------- environment


def environment(dev: Device, copy_gbps: float) -> dict[str, Any]:
    import importlib.metadata as md
    import platform

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    def git(*cmd: str) -> str | None:
        # Only this tree's own repository: an exported copy (``git archive``) inside another
        # checkout would otherwise report that checkout's commit.
        if not (ROOT / ".git").exists():
            return None
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=ROOT,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    # An exported tree has no repository: the commit it was exported from comes from outside.
    exported = os.environ.get("TORCHFUSE_BENCH_COMMIT")

    return {
        "device": dev.name(), "device_type": dev.device.type,
        "python": platform.python_version(), "torch": torch.__version__,
        "triton": version("triton"), "transformers": version("transformers"),
        "cuda": torch.version.cuda,
        "torchfuse": {p: version(f"torchfuse-{p}") for p in
                      ("graph", "capture", "autograd", "inductor", "runtime")},
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": exported or git("rev-parse", "HEAD"),
        "git_dirty": False if exported else bool(git("status", "--porcelain")),
        "copy_gbps": copy_gbps,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache_root = _set_cache_dirs(args.cache_dir)
    _pin_ptxas()  # before the first compile of any process of the run (see its doc)
    env_at_start = _compile_env()
    args.cache_dir = cache_root  # the cache-hit child must reuse these caches, not make fresh ones
    sys.path.insert(0, str(HERE))
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.device.startswith("cuda"):
        # Triton kernels can only run through its interpreter without a GPU; it must be set
        # before anything imports triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.cache_hit_worker:
        return cache_hit_worker(args)

    import report
    import workloads

    started = time.perf_counter()
    only = [n for n in args.only.split(",") if n]
    skip = {n for n in args.skip.split(",") if n}
    selected = [w for w in workloads.select(only) if w.name not in skip]
    dev = Device(args.device, args.warmup_ms, args.rep_ms)
    tag = args.tag or f"{dev.device.type}_{dt.datetime.now():%Y%m%d_%H%M}"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    copy_gbps = dev.copy_bandwidth_gbps()
    compilers = Compilers(args)
    prewarm_failures = compilers.prewarm(dev)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "tag": tag, "environment": environment(dev, copy_gbps),
        "config": {k: v for k, v in vars(args).items() if k != "cache_hit_worker"} | {
            "cache_root": cache_root, "variants": compilers.variants()},
        "prewarm_failures": prewarm_failures, "rows": [], "notes": [],
    }
    if compilers.torchfuse_import_error:
        doc["notes"].append(f"torchfuse.capture does not import: {compilers.torchfuse_import_error}")
    print(f"{dev.name()}: device-to-device copy {copy_gbps:.0f} GB/s; caches under {cache_root}",
          flush=True)

    for wl in selected:
        if not wl.available():
            doc["rows"].append({"name": wl.name, "skipped": f"needs {', '.join(wl.requires)}"})
            continue
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            doc["rows"].append({"name": wl.name, "skipped": f"time budget {args.budget_s:.0f} s spent"})
            continue
        if doc["rows"] and doc["rows"][-1].get("device_lost"):
            doc["rows"].append({"name": wl.name, "skipped": "device lost in an earlier workload"})
            continue
        t0 = time.perf_counter()
        row = run_workload(wl, dev, compilers, args, copy_gbps)
        doc["rows"].append(row)
        print(report.progress_line(row, time.perf_counter() - t0), flush=True)
        report.write_json(doc, out_dir / f"{tag}.json")  # partial results survive a timeout

    measured = [r for r in doc["rows"] if "results" in r]
    changed = {k: v for k, v in _compile_env().items() if env_at_start.get(k) != v}
    changed |= {k: None for k in env_at_start if k not in os.environ}
    if changed:
        # the cache-hit children inherit these: a variable a compiler set during the run may
        # change the keys its caches are read under
        doc["notes"].append(f"compile environment changed during the run: {changed}")
    if not args.no_cache_hit and not any(r.get("device_lost") for r in measured):
        note = run_cache_hits(measured, args)
        if note:
            doc["notes"].append(note)
    doc["summary"] = report.summarize(measured)
    doc["elapsed_s"] = time.perf_counter() - started
    paths = report.write_all(doc, out_dir, tag, plot_png=not args.no_plot)
    report.print_table(doc)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
