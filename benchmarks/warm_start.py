"""Cold start vs warm start of torchfuse alone, with the warm start's first call profiled.

    python benchmarks/warm_start.py --only softmax,cross_entropy,small_ops,layer_norm_train
    python benchmarks/warm_start.py --device cpu --small --only softmax     # smoke test

For each workload two fresh processes run one after the other over the same cache directory
(TORCHFUSE_CACHE_DIR and TRITON_CACHE_DIR; nothing else compiled in them, unlike the cache-hit
column of ``run.py``, where torch.compile's hit runs in the same process first):

- ``cold``: empty caches; the first call (capture + compile + Triton + run) is timed;
- ``warm``: the caches the cold process left; the first call is timed, then timed again under
  cProfile with ``TORCHFUSE_LOGS=runtime,perf_hints`` so the runtime's per-phase first-call
  line and every entry's stage table (with its cache hits and misses) are printed, and the
  functions with the most cumulative time are listed.

Each process first compiles a trivial function (imports and CUDA context paid, as in
BENCHMARKS.md). The JSON written with ``--json`` has cold/warm seconds, the ratio, and each
warm child's profile text, so the target (warm ≤ 15% of cold) can be checked and explained.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "WARM_START_RESULT "


def child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    import cProfile
    import io
    import pstats

    import torch
    import torchfuse.capture as tf
    import workloads
    from run import make_step

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    warm_x = torch.ones(8, device=device)
    tf.compile(lambda x: x * 2 + 1)(warm_x)
    sync()
    wl = workloads.select([args.only])[0]
    case = wl.make_case(device, None, "small" if args.small else "full")
    step = make_step(wl, case, tf.compile(case.fn))
    prof = cProfile.Profile() if args.profile else None
    sync()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    step()
    sync()
    if prof is not None:
        prof.disable()
    seconds = time.perf_counter() - t0
    text = ""
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        text = out.getvalue()
    print(MARK + json.dumps({"seconds": seconds, "profile": text}), flush=True)
    return 0


def run_child(name: str, cache: str, args: argparse.Namespace, profile: bool) -> dict:
    env = dict(os.environ)
    env["TORCHFUSE_CACHE_DIR"] = os.path.join(cache, "torchfuse")
    env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    if profile:
        env["TORCHFUSE_LOGS"] = "runtime,perf_hints"  # every entry's stages and cache counts
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--only", name, "--device", args.device,
           "--top", str(args.top)]
    cmd += ["--small"] if args.small else []
    cmd += ["--profile"] if profile else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=args.timeout)
    result = {"seconds": None, "log": "", "profile": ""}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result.update(json.loads(line[len(MARK):]))
    result["log"] = "\n".join(_torchfuse_lines(proc.stderr + proc.stdout))
    if proc.returncode != 0:
        result["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return result


def _torchfuse_lines(text: str) -> list[str]:
    """The log lines of torchfuse's channels, with the tables ``perf_hints`` prints under its
    lines (up to the next line that is neither)."""
    out: list[str] = []
    table = False
    for line in text.splitlines():
        if line.startswith("[torchfuse."):
            out.append(line)
            table = line.startswith("[torchfuse.perf_hints]")
        elif table and (not line or line[0].isalnum() or line.startswith(" ")) and "Warning" not in line:
            out.append(line)
        else:
            table = False
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="softmax,cross_entropy,small_ops,layer_norm_train")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", default="")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    rows = []
    for name in [n for n in args.only.split(",") if n]:
        cache = tempfile.mkdtemp(prefix="torchfuse_warm_")
        cold = run_child(name, cache, args, profile=False)
        warm = run_child(name, cache, args, profile=False)
        profiled = run_child(name, cache, args, profile=True)
        ratio = (warm["seconds"] / cold["seconds"]) if cold["seconds"] and warm["seconds"] else None
        rows.append({"name": name, "cold_s": cold["seconds"], "warm_s": warm["seconds"], "ratio": ratio,
                     "warm_profiled_s": profiled["seconds"], "runtime_log": profiled["log"],
                     "profile": profiled["profile"],
                     "errors": {k: r["error"] for k, r in (("cold", cold), ("warm", warm),
                                                               ("profiled", profiled)) if "error" in r}})
        r = rows[-1]
        print(f"{name:24s} cold {r['cold_s']} s  warm {r['warm_s']} s  ratio {ratio}", flush=True)
        print(r["runtime_log"])
        print(r["profile"][:6000])
        if r["errors"]:
            print("errors:", r["errors"])
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
