"""The compile-time targets in one run: torchfuse's cold and warm first calls beside torch.compile's cold one.

    python benchmarks/compile_targets.py --device cuda --models gpt2,vit_b_16 --model-modes training
    python benchmarks/compile_targets.py --device cuda --only softmax,layer_norm_train --out DIR --tag T
    python benchmarks/compile_targets.py --device cpu --small --only softmax      # smoke test
    python benchmarks/compile_targets.py --collect benchmarks/results             # every row's latest

For each row (a model of ``models.py`` with ``--models``, or a workload of ``workloads.py``
with ``--only``), three fresh processes, one after the other:

- ``tc cold``: ``torch.compile`` with empty Inductor and Triton caches of its own
  (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``);
- ``tf cold`` and ``tf warm``: torchfuse over one fresh cache directory, first empty, then as
  the cold process left it (`compile_profile.py`'s children, so each also reports its
  recorded stages and cache counts).

Every process first compiles a trivial function with its compiler (imports and the CUDA
context paid, as in BENCHMARKS.md), builds the row, runs it once eagerly, collects the garbage,
and then times the first compiled call (compile and first step, synchronized); ``--repeat N``
keeps each cell's minimum over N runs, each with fresh caches. Both compilers
run with the same ``ptxas`` (`run._pin_ptxas`). The table gives the two ratios the issue's
targets are about: ``tf cold / tc cold`` (target ≤ 0.5) and ``tf warm / tf cold`` (≤ 0.15),
followed by the stage breakdown of torchfuse's processes. ``--collect DIR`` runs nothing: it
reads every GPU run's JSON in DIR and prints each row's latest measurement with torch.compile
(its run and GPU named beside it), then the rows of ``models.py`` and ``workloads.py`` never
measured.
``tf cold, tuned s`` is when the cold process was done tuning: its first call, the wait for
the background compiles and a second call (which tunes what the first deferred,
``TORCHFUSE_AUTOTUNE_LATER``). With ``--out``, ``<tag>.json`` (schema
``torchfuse-compile-targets/1``) and ``<tag>.md`` are rewritten after every row, so a run cut
short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compile_profile as cp  # noqa: E402

TC_MARK = "COMPILE_TARGETS_TC "
COLD_TARGET = 0.5
WARM_TARGET = 0.15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cp.add_row_arguments(p)
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--timeout", type=float, default=300, help="seconds per child process")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every child N times (fresh caches each time), keep the minimum")
    p.add_argument("--out", default="", help="folder for <tag>.json and <tag>.md")
    p.add_argument("--tag", default="", help="file name stem (default: compile_targets_<device>_<time>)")
    p.add_argument("--skip-tc", action="store_true",
                   help="torchfuse's processes only (a setting's effect, beside a run with torch.compile)")
    p.add_argument("--collect", default="", metavar="DIR",
                   help="run nothing: each row's latest GPU measurement among DIR's result files")
    p.add_argument("--slots", type=int, default=1, metavar="N",
                   help="run the rows in N processes at once, slot i on GPU i alone and its share of the "
                        "cores (a host of N GPUs measured as N one-GPU machines)")
    p.add_argument("--plan", action="store_true",
                   help="run nothing: print the rows each slot would run and the expected minutes")
    p.add_argument("--rows", default="", help=argparse.SUPPRESS)  # a slot's rows, by name
    p.add_argument("--cores", default="", help=argparse.SUPPRESS)  # a slot's cores: 0,1,2
    p.add_argument("--tc-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.only and not args.models and not args.collect:
        p.error("name the rows: --models and/or --only")
    if args.slots < 1:
        p.error("--slots must be at least 1")
    return args


def _profile_args(args: argparse.Namespace, **over: Any) -> argparse.Namespace:
    """The arguments `compile_profile` reads, for its rows and its children."""
    ns = cp.parse_args(["--warm", "--device", args.device, "--timeout", str(args.timeout)]
                       + (["--small"] if args.small else []))
    ns.only, ns.models, ns.model_modes, ns.repeat = args.only, args.models, args.model_modes, args.repeat
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


def tc_child(args: argparse.Namespace) -> int:
    """One row's torch.compile first call in this fresh process, printed as one JSON line."""
    import torch

    (row,) = cp.select_rows(_profile_args(args))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    marks = [time.perf_counter()]
    x = torch.ones(8, device=args.device)
    torch.compile(lambda t: t * 2 + 1)(x)  # imports and first-use costs paid
    sync()
    marks.append(time.perf_counter())
    fn, step = row.build(args.device, "small" if args.small else "full")
    marks.append(time.perf_counter())
    step(fn)  # the model's own first-use costs (lazy imports) are not the compiler's
    sync()
    gc.collect()
    marks.append(time.perf_counter())
    step(torch.compile(fn))
    sync()
    seconds = time.perf_counter() - marks[-1]
    setup = {"imports": marks[0] - cp.STARTED, "warm_up": marks[1] - marks[0], "build": marks[2] - marks[1],
             "eager": marks[3] - marks[2]}
    print(TC_MARK + json.dumps({"first_call_s": seconds, "setup_s": setup}), flush=True)
    return 0


def run_tc(row: Any, args: argparse.Namespace) -> float | None:
    """torch.compile's cold first call of ``row`` in a fresh process, or None (reported)."""
    import subprocess

    root = tempfile.mkdtemp(prefix="torchfuse_targets_tc_")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"))
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tc-child", "--device", args.device,
           *cp.row_flags(row)]
    cmd += ["--small"] if args.small else []
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"{row.name} tc cold: timed out after {args.timeout:.0f} s", file=sys.stderr)
        return None
    for line in proc.stdout.splitlines():
        if line.startswith(TC_MARK):
            found = json.loads(line[len(TC_MARK):])
            seconds = float(found["first_call_s"])
            setup = ", ".join(f"{k} {v:.1f}" for k, v in found.get("setup_s", {}).items())
            print(f"{row.name} tc cold: {seconds:.2f} s (process {time.perf_counter() - t0:.1f} s: {setup})",
                  file=sys.stderr, flush=True)
            return seconds
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    print(f"{row.name} tc cold: failed: {' | '.join(tail)}", file=sys.stderr)
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _judged(v: float | None, target: float, fmt: str) -> str:
    return "-" if v is None else f"{v:{fmt}} {'ok' if v <= target else 'MISS'}"


def summarize(results: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the targets, one line per row, and a count of passes."""
    lines = ["| row | tc cold s | tf cold s | tf warm s | tf cold / tc cold | tf warm / cold "
             "| tf cold, tuned s |",
             "|---|---|---|---|---|---|---|"]
    cold_ok = warm_ok = 0
    for r in results:
        cold, warm = r["tf_cold_over_tc"], r["tf_warm_over_cold"]
        cold_ok += cold is not None and cold <= COLD_TARGET
        warm_ok += warm is not None and warm <= WARM_TARGET
        lines.append(f"| {r['row']} | {_seconds(r['tc_cold_s'])} | {_seconds(r['tf_cold_s'])} | "
                     f"{_seconds(r['tf_warm_s'])} | {_judged(cold, COLD_TARGET, '.2f')} | "
                     f"{_judged(warm, WARM_TARGET, '.1%')} | {_seconds(r.get('tf_cold_tuned_s'))} |")
    lines.append("")
    n = len(results)
    lines.append(f"targets: cold <= {COLD_TARGET:.0%} of torch.compile's on {cold_ok} of {n} rows; "
                 f"warm <= {WARM_TARGET:.0%} of cold on {warm_ok} of {n}")
    return lines


def environment(device: str) -> dict[str, Any]:
    import platform

    import torch
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device, "cores": os.cpu_count()}
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) != os.cpu_count():
        env["usable_cores"] = len(os.sched_getaffinity(0))  # a slot's share (--slots), or taskset
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    # settings the children inherit (e.g. TORCHFUSE_COMPILE_FORWARD_FIRST): the table says which
    # ran, the cache directories excepted (each child gets fresh ones)
    for name in sorted(os.environ):
        if name.startswith("TORCHFUSE_") and name != "TORCHFUSE_CACHE_DIR":
            env[name] = os.environ[name]
    return env


WARM_STAGES = ("capture", "runtime.precompile", "runtime.run")


def _experiment(env: dict[str, Any]) -> bool:
    """Whether a run was made under a setting of its own (a ``TORCHFUSE_`` variable it
    recorded, e.g. ``TORCHFUSE_CHANNELS_LAST=never``): an experiment, not the default compiler."""
    return any(k.startswith("TORCHFUSE_") for k in env)


def collect(folder: Path) -> list[str]:
    """Each row's latest GPU measurement with torch.compile among ``folder``'s result files
    (newest run first by its recorded date; runs under a setting of their own, `_experiment`,
    left out), as a markdown table, then the model rows never measured."""
    latest: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path in sorted(folder.glob("compile_targets_*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        env = doc.get("environment", {})
        gpu_run = str(env.get("device", "")).startswith("cuda")
        if doc.get("schema") != "torchfuse-compile-targets/1" or not gpu_run or _experiment(env):
            continue
        for r in doc["rows"]:
            if r.get("tc_cold_s") is None or r.get("tf_cold_s") is None:
                continue
            date = str(env.get("date", ""))
            if r["row"] not in latest or date >= latest[r["row"]][0]:
                gpu = str(env.get("gpu", "?")).replace("NVIDIA ", "")
                latest[r["row"]] = (date, f"{doc['tag']} ({gpu})", r)
    lines = ["| row | tc cold s | tf cold s | tf warm s | tf cold / tc cold | tf warm / cold "
             "| warm capture / precompile / first run, ms | run |", "|---|---|---|---|---|---|---|---|"]
    cold_ok = warm_ok = 0
    for name in sorted(latest):
        _, run, r = latest[name]
        cold, warm = r["tf_cold_over_tc"], r["tf_warm_over_cold"]
        cold_ok += cold is not None and cold <= COLD_TARGET
        warm_ok += warm is not None and warm <= WARM_TARGET
        stages = (r.get("tf_stages") or {}).get(f"{name} warm", {}).get("stages_s", {})
        split = " / ".join(f"{stages[k] * 1e3:.0f}" if k in stages else "-" for k in WARM_STAGES)
        lines.append(f"| {name} | {_seconds(r['tc_cold_s'])} | {_seconds(r['tf_cold_s'])} | "
                     f"{_seconds(r['tf_warm_s'])} | {_judged(cold, COLD_TARGET, '.2f')} | "
                     f"{_judged(warm, WARM_TARGET, '.1%')} | {split} | {run} |")
    lines += ["", f"{len(latest)} rows: cold <= {COLD_TARGET:.0%} of torch.compile's on {cold_ok}, "
              f"warm <= {WARM_TARGET:.0%} of cold on {warm_ok} (each row's latest run; runs differ in "
              "host and tree: compare ratios, not seconds)"]
    import models
    import workloads

    missing = [f"{m.name}/{mode}" for m in models.MODELS for mode in ("inference", "training")
               if f"{m.name}/{mode}" not in latest]
    lines.append("model rows never measured: " + (", ".join(missing) if missing else "none"))
    missing = [w.name for w in workloads.WORKLOADS if w.name not in latest]
    lines.append("micro rows never measured: " + (", ".join(missing) if missing else "none"))
    return lines


def measure_row(row: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One row: torch.compile's cold process(es), then torchfuse's cold and warm ones."""
    runs = [] if args.skip_tc else \
        [t for t in (run_tc(row, args) for _ in range(max(1, args.repeat))) if t is not None]
    tc = min(runs) if runs else None
    tf = dict(cp.child_rows([row], _profile_args(args)))
    cold, warm = tf.get(f"{row.name} cold"), tf.get(f"{row.name} warm")
    tf_cold = cold["first_call_s"] if cold else None
    tf_warm = warm["first_call_s"] if warm else None
    tuned = cold.get("tuned_s") if cold else None
    return {"row": row.name, "tc_cold_s": tc, "tf_cold_s": tf_cold, "tf_warm_s": tf_warm,
            "tf_cold_over_tc": _ratio(tf_cold, tc), "tf_warm_over_cold": _ratio(tf_warm, tf_cold),
            "tf_cold_tuned_s": tuned if tuned is not None and tuned < float("inf") else None,
            "tf_stages": tf}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cores:  # a slot: its cores, before torch is imported; every child inherits them
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    if args.tc_child:
        return tc_child(args)
    if args.collect:
        print("\n".join(collect(Path(args.collect))))
        return 0
    from run import _pin_ptxas

    _pin_ptxas()  # one ptxas for every child (Triton keys its cache by its version)
    tag = args.tag or time.strftime(f"compile_targets_{args.device.split(':')[0]}_%Y%m%d_%H%M")
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": "torchfuse-compile-targets/1", "tag": tag,
                           "environment": environment(args.device), "rows": []}

    def write() -> None:  # after every row: a run cut short keeps what it measured
        if out:
            (out / f"{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
            (out / f"{tag}.md").write_text(_markdown(doc) + "\n")

    rows = cp.select_rows(_profile_args(args))
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.name in wanted]
    if args.plan:
        from targets_slots import plan

        print("\n".join(plan([r.name for r in rows], args.slots)))
        return 0
    if args.slots > 1:
        from targets_slots import run_slots

        run_slots(rows, args, doc, write)
    else:
        for row in rows:
            doc["rows"].append(measure_row(row, args))
            write()
    print(_markdown(doc))
    return 0


def _markdown(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    stage_rows = [(k, v) for r in doc["rows"] for k, v in (r.get("tf_stages") or {}).items()]
    head = [f"# Compile-time targets: {doc['tag']}", "",
            ", ".join(f"{k} {v}" for k, v in env.items()), "",
            "First call of each compiler in a fresh process (compile + first step); tc = torch.compile "
            "(cold: empty caches), tf = torchfuse (cold, then warm over the caches the cold process left).",
            ""]
    for slot in doc.get("slots", []):  # --slots: where each row ran
        head.append(f"- slot {slot['slot']}: GPU {slot['gpu'] or '-'}, cores {slot['cores']}: "
                    + ", ".join(slot["rows"]))
    head += [""] if doc.get("slots") else []
    buf = io.StringIO()
    if stage_rows:
        with redirect_stdout(buf):
            cp.print_real_table(stage_rows)
    return "\n".join(head + summarize(doc["rows"]) + ["", "torchfuse's stages:", "", buf.getvalue()])


if __name__ == "__main__":
    raise SystemExit(main())
