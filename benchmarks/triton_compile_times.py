"""What each Triton compile of a row's first call costs, stage by stage, for both compilers.

    python benchmarks/triton_compile_times.py --only cross_entropy,softmax,layer_norm_train
    python benchmarks/triton_compile_times.py --models opt --model-modes training --out DIR --tag T

For each row and each compiler (torch.compile, torchfuse), one fresh process with empty caches
compiles the row's first call with every Triton compile in that process and one at a time
(``TORCHINDUCTOR_COMPILE_THREADS=1``; ``TORCHFUSE_COMPILE_WORKERS=0``,
``TORCHFUSE_COMPILE_THREADS=1``), under Triton's compilation listener
(``triton.knobs.compilation.listener``). Each binary is reported with its kernel's name, its
``num_warps``/``num_stages`` and the microseconds of each stage (``ir`` = Python AST to TTIR,
then ``ttir``, ``ttgir``, ``llir``, ``ptx``, ``cubin``, and ``store``). The first call's wall time
is printed too, but it is a serial compile's, not the compilers' real cold start
(`compile_targets.py` measures that). What this answers: whether one compiler compiles more
binaries, or costlier ones, and which stage the time is in.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compile_profile as cp  # noqa: E402

MARK = "TRITON_COMPILE_TIMES "
COMPILERS = ("torch.compile", "torchfuse")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cp.add_row_arguments(p)
    p.add_argument("--device", default="cuda", help="cuda (Triton's compiler runs only for a GPU target)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per child process")
    p.add_argument("--out", default="", help="folder for <tag>.json")
    p.add_argument("--tag", default="", help="file name stem (default: triton_compile_times_<time>)")
    p.add_argument("--child", default="", choices=("", *COMPILERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.only and not args.models:
        p.error("name the rows: --models and/or --only")
    return args


def _rows(args: argparse.Namespace) -> list[Any]:
    ns = cp.parse_args(["--device", args.device] + (["--small"] if args.small else []))
    ns.only, ns.models, ns.model_modes = args.only, args.models, args.model_modes
    return cp.select_rows(ns)


def child(args: argparse.Namespace) -> int:
    """One row's first call under one compiler, every Triton compile recorded; one JSON line."""
    import torch
    import triton

    if args.child == "torchfuse":
        import torchfuse.capture as torchfuse

        compile_fn: Any = torchfuse.compile
    else:
        compile_fn = torch.compile
    (row,) = _rows(args)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    x = torch.ones(8, device=args.device)
    compile_fn(lambda t: t * 2 + 1)(x)  # imports and first-use costs paid, not recorded
    sync()
    fn, step = row.build(args.device, "small" if args.small else "full")
    step(fn)
    sync()
    gc.collect()
    records: list[dict[str, Any]] = []

    def listener(*, src: Any, metadata: dict[str, Any], metadata_group: Any, times: Any,
                 cache_hit: bool) -> None:
        fn_ = getattr(src, "fn", None)
        stages = {"ir": times.ir_initialization, **dict(times.lowering_stages), "store": times.store_results}
        records.append({"kernel": getattr(fn_, "__name__", "?"), "cache_hit": cache_hit,
                        "num_warps": metadata.get("num_warps"), "num_stages": metadata.get("num_stages"),
                        "us": stages, "total_us": times.total})

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        print(MARK + json.dumps({"error": f"triton {triton.__version__} has no compilation listener"}))
        return 0
    knobs.compilation.listener = listener
    t0 = time.perf_counter()
    step(compile_fn(fn))
    sync()
    wall = time.perf_counter() - t0
    knobs.compilation.listener = None
    print(MARK + json.dumps({"first_call_s": wall, "binaries": records}), flush=True)
    return 0


def run_child(row: Any, compiler: str, args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="torchfuse_tct_")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"), TORCHFUSE_CACHE_DIR=os.path.join(root, "tf"),
               TORCHINDUCTOR_COMPILE_THREADS="1", TORCHFUSE_COMPILE_WORKERS="0",
               TORCHFUSE_COMPILE_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", compiler, "--device", args.device,
           *cp.row_flags(row)]
    cmd += ["--small"] if args.small else []
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": " | ".join(tail)}


def report(row: str, compiler: str, res: dict[str, Any]) -> list[str]:
    if "error" in res:
        return [f"{row} {compiler}: {res['error']}"]
    bins = [b for b in res["binaries"] if not b["cache_hit"]]
    stages: dict[str, int] = defaultdict(int)
    for b in bins:
        for k, v in b["us"].items():
            stages[k] += v
    total = sum(b["total_us"] for b in bins)
    lines = [f"{row} {compiler}: first call {res['first_call_s']:.2f} s (serial), "
             f"{len(bins)} binaries compiled, "
             f"{total / 1e3:.0f} ms in Triton's compile: "
             + ", ".join(f"{k} {v / 1e3:.0f}" for k, v in stages.items())]
    for b in sorted(bins, key=lambda b: -b["total_us"])[:8]:
        lines.append(f"    {b['total_us'] / 1e3:7.1f} ms  {b['kernel']}  warps {b['num_warps']} stages "
                     f"{b['num_stages']}  " + " ".join(f"{k} {v / 1e3:.0f}" for k, v in b["us"].items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    tag = args.tag or time.strftime("triton_compile_times_%Y%m%d_%H%M")
    doc: dict[str, Any] = {"schema": "torchfuse-triton-compile-times/1", "tag": tag, "rows": {}}
    for row in _rows(args):
        for compiler in COMPILERS:
            res = run_child(row, compiler, args)
            doc["rows"].setdefault(row.name, {})[compiler] = res
            print("\n".join(report(row.name, compiler, res)), flush=True)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / f"{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
