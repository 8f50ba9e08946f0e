"""How long a Triton compile worker takes to be ready, alone and with others starting beside it.

    python benchmarks/worker_boot.py                   # 1 and 15 workers, with and without warm-up
    python benchmarks/worker_boot.py --sizes 1,4,15 --profile

Each worker is the runtime's own (`torchfuse.runtime.compile_workers`, run as the pool runs
it); its first request compiles one small kernel for this device's target, into a fresh Triton
cache. Reported per pool size and mode (``cold``: no warm-up, ``warm-up``: the worker compiles
its warm-up kernel as it starts): the time from starting the workers to their ready line and
to each first reply (the median and the slowest). ``--profile`` also runs the warm-up once
in a child under cProfile and prints its top entries. Needs Triton and a target: the
current CUDA device's, or sm_90 (``--arch``) when there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def first_request(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.exp(x) / (1.0 + tl.sum(x, axis=0)), mask=offs < n)
"""


def target_of(arch: int) -> dict[str, object]:
    try:
        import torch

        if torch.cuda.is_available():
            from torchfuse.runtime import compile_workers

            return compile_workers._target()
    except ImportError:
        pass
    return {"backend": "cuda", "arch": arch, "warp_size": 32}


def specialization(path: str, target: dict[str, object]) -> str:
    """Triton's own JSON for one compile of the request kernel (made in a child, as the
    runtime's plan step makes it, so that this process keeps no compiler state)."""
    code = f"""
import importlib.util, json, sys
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / "packages/runtime/src")!r})
from torchfuse.runtime.compile_workers import _StubDriver
t = {json.dumps(target)}
driver.set_active(_StubDriver(GPUTarget(t["backend"], t["arch"], t["warp_size"])))
spec = importlib.util.spec_from_file_location("first_request_mod", {path!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
import triton
seen = []
def hook(*a, **kw):
    seen.append(kw["compile"]["specialization_data"] if "compile" in kw else None)
    return True
triton.knobs.runtime.jit_cache_hook = hook
import torch
x = torch.empty(4096, device="cpu")
try:
    m.first_request.warmup(x, x, 4096, BLOCK=1024, grid=(4,))
except Exception:
    pass
print(seen[-1] if seen else "")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def run_pool(size: int, warm_up: bool, target: dict[str, object], path: str,
             spec: str) -> tuple[list[float], list[float]]:
    from torchfuse.runtime import compile_workers as cw

    env = dict(os.environ)
    env.pop(cw.TARGET_ENV, None)
    if warm_up:
        env[cw.TARGET_ENV] = json.dumps(target)
    times: list[float] = []
    ready: list[float] = []
    with tempfile.TemporaryDirectory(prefix="worker_boot_") as tmp:
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        request = {"path": path, "module": "first_request_mod", "entry": "first_request",
                   "specialization": spec, "target": target}
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", cw._BOOT, cw.__file__], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, bufsize=1) for _ in range(size)]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(request) + "\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout is not None and p.stdin is not None
            reply = p.stdout.readline()
            if reply.strip() == cw.READY:  # ready first, then the reply
                ready.append(time.perf_counter() - start)
                reply = p.stdout.readline()
            times.append(time.perf_counter() - start)
            p.stdin.close()
            err = p.stderr.read() if p.stderr else ""
            p.wait()
            if not reply or json.loads(reply).get("error") or "warm-up failed" in err:
                print(f"  worker {p.pid}: reply {reply.strip()!r} stderr {err.strip()[-400:]!r}")
    return ready, times


def profile_warm_up(target: dict[str, object]) -> None:
    from torchfuse.runtime import compile_workers as cw

    code = f"""
import cProfile, pstats, importlib.util, json, time, sys
t0 = time.perf_counter()
import triton
t1 = time.perf_counter()
spec = importlib.util.spec_from_file_location('_cw', {cw.__file__!r})
cw = sys.modules['_cw'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(cw)
pr = cProfile.Profile(); pr.enable()
t2 = time.perf_counter(); cw._warm_up({json.dumps(target)}); t3 = time.perf_counter()
pr.disable()
print(f"import triton {{t1 - t0:.3f}} s, warm-up {{t3 - t2:.3f}} s")
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    print(out.stdout[-6000:], out.stderr[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,15")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    target = target_of(args.arch)
    with tempfile.TemporaryDirectory(prefix="worker_boot_src_") as tmp:
        path = os.path.join(tmp, "first_request_mod.py")
        Path(path).write_text(KERNEL)
        spec = specialization(path, target)
        if not spec:
            raise SystemExit("could not make the request's specialization")
        print(f"target {target}, python {sys.version.split()[0]}, cores {os.cpu_count()}")
        print("| workers | mode | ready, median s | first reply, median s | slowest s |")
        print("|---|---|---|---|---|")
        for size in [int(s) for s in args.sizes.split(",")]:
            for warm_up in (False, True):
                ready, t = run_pool(size, warm_up, target, path, spec)
                r = f"{statistics.median(ready):.2f}" if ready else "-"
                print(f"| {size} | {'warm-up' if warm_up else 'cold'} | {r} | {statistics.median(t):.2f} | "
                      f"{max(t):.2f} |", flush=True)
        if args.profile:
            profile_warm_up(target)


if __name__ == "__main__":
    main()
