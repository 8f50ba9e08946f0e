"""Where GPT-2's time goes: GPU kernels and host time of one call, torchfuse vs torch.compile.

    python benchmarks/gpt2_profile.py --json benchmarks/results/gpt2_profile_<tag>.json
    python benchmarks/gpt2_profile.py --only '' --models bert,vit   # models of models.py instead

``--models`` profiles models of ``benchmarks/models.py`` the same way (full size, bf16
autocast; ``--model-modes inference,training``), with peak memory, and the whole traceback
of a variant that fails; ``--host`` adds, per variant, cProfile's functions by own time over
20 calls and the CPU-side profiler events of one call (launches, copies, ATen calls).

Needs CUDA and ``transformers``. Measures, for the ``gpt2`` (inference) and ``gpt2_train`` rows
of ``workloads.py``:

- wall time per call (median of 20, synchronized) and GPU busy time per call (the sum of the
  CUDA kernel times ``torch.profiler`` records for one call), for eager, torch.compile and
  torchfuse: wall - busy is what the host adds (launches, guards, glue);
- the 12 kernels with the most GPU time in one call, per compiler;
- the lm_head matmul alone: ``[4096, 768] @ [768, 50257]`` in bf16 against the same with N
  padded to 50264 (a multiple of 8), the hypothesis that an unaligned vocab keeps cuBLAS off
  its fast paths (``benchmarks/notes/2026-11.md``, "GPT-2 gap", cause 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _wall_ms(step, n: int = 20) -> float:
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _kernels(step) -> tuple[float, list[tuple[str, float, int]]]:
    """(GPU busy ms of one call, top kernels as (name, ms, count))."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        cuda_us = getattr(evt, "device_time_total", None)
        if cuda_us is None:
            cuda_us = getattr(evt, "cuda_time_total", 0)
        if cuda_us and evt.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((evt.key[:90], cuda_us / 1e3, evt.count))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows[:12]


def _host(step, n: int = 20, top: int = 25) -> dict[str, Any]:
    """Where the host time of ``n`` calls goes: cProfile's functions by own time, and the
    CUDA runtime/driver calls (launches, copies, syncs) torch.profiler records per call."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        step()
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = {}
    for evt in tp.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CPU:
            calls[evt.key[:80]] = [evt.count, evt.self_cpu_time_total / 1e3]
    busiest = sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]
    return {"cprofile_per_call_ms": stats.total_tt / n * 1e3, "cprofile": buf.getvalue()[-8000:],
            "cpu_events": busiest}


def _mm_alignment() -> dict[str, float]:
    import torch

    out = {}
    a = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16)
    for n in (50257, 50264, 50304):
        b = torch.randn(768, n, device="cuda", dtype=torch.bfloat16)
        bt = torch.randn(n, 768, device="cuda", dtype=torch.bfloat16).t()
        out[f"mm N={n}"] = _wall_ms(lambda b=b: torch.mm(a, b), 50)
        out[f"mm N={n} (weight transposed)"] = _wall_ms(lambda bt=bt: torch.mm(a, bt), 50)
    return out


def _model_cases(names: str, modes: str) -> list[tuple[str, Any]]:
    """``(row name, make)`` for models of ``models.py``: ``make(variant)`` -> the timed step."""
    import models as M
    import torch
    import torchfuse.capture as tf

    out = []
    for spec in M.select(names, ""):
        for training in [m == "training" for m in modes.split(",")]:
            def make(variant: str, spec: Any = spec, training: bool = training) -> Any:
                model, _ = M.build_model(spec, "full", torch.device("cuda"))
                model.train(training)
                inputs = M.make_inputs(spec, model.config, "full", "cuda", training)
                if variant == "torch_compile":
                    torch._dynamo.reset()
                    fn = torch.compile(model)
                elif variant == "torchfuse":
                    tf.reset()
                    fn = tf.compile(model)
                else:
                    fn = model
                params = tuple(p for p in model.parameters() if p.requires_grad)
                return M.make_step(fn, inputs, training, params, "cuda")
            out.append((f"{spec.name}{'_train' if training else ''}", make))
    return out


def _profile(name: str, make: Any, host: bool = False) -> dict[str, Any]:
    import traceback

    import torch

    per: dict[str, Any] = {}
    for variant in ("eager", "torch_compile", "torchfuse"):
        try:
            step = make(variant)
            wall = _wall_ms(step)
            busy, top = _kernels(step)
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
            per[variant] = {"wall_ms": wall, "gpu_busy_ms": busy, "host_ms": wall - busy, "top": top,
                            "peak_mb": peak}
            if host:
                per[variant]["host"] = h = _host(step)
                print(f"    host: {h['cprofile_per_call_ms']:.3f} ms a call under cProfile")
                print(h["cprofile"])
                for key, (count, ms) in h["cpu_events"]:
                    print(f"    {ms:8.3f} ms self  x{count:<4d} {key}")
            print(f"{name:10s} {variant:14s} wall {wall:.3f} ms  GPU busy {busy:.3f} ms  peak {peak:.0f} MB")
            for kname, ms, count in top:
                print(f"    {ms:8.3f} ms  x{count:<3d} {kname}")
        except Exception as e:  # the whole error: this script is where a failing row is read
            per[variant] = {"error": "".join(traceback.format_exception(e))[-6000:]}
            print(f"{name} {variant}: {per[variant]['error']}")
        step = None
        torch.cuda.empty_cache()
    return per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="")
    p.add_argument("--only", default="gpt2,gpt2_train")
    p.add_argument("--models", default="",
                   help="also (or, with --only '', only) these models of models.py, e.g. bert,vit")
    p.add_argument("--model-modes", default="inference", help="inference, training or both, comma-separated")
    p.add_argument("--options", default="",
                   help='torchfuse compile options as JSON, e.g. {"pointwise_rows":1024} '
                        "(no spaces when it goes through gpu_run.sh)")
    p.add_argument("--host", action="store_true",
                   help="with --models: also where the host time goes (cProfile of 20 calls, the CPU-side "
                        "profiler events of one)")
    args = p.parse_args(argv)
    import torch
    import torchfuse.capture as tf
    import workloads
    from run import make_step

    if not torch.cuda.is_available():
        print("gpt2_profile: needs CUDA", file=sys.stderr)
        return 1
    result: dict[str, Any] = {"rows": {}, "torchfuse_options": args.options or None}
    if args.only:
        result["mm"] = _mm_alignment()
        for k, v in result["mm"].items():
            print(f"{k:36s} {v:.3f} ms")
    for name, make in _model_cases(args.models, args.model_modes) if args.models else []:
        result["rows"][name] = _profile(name, make, args.host)
    for wl in workloads.select(args.only.split(",")) if args.only else []:
        per: dict[str, Any] = {}
        for variant in ("eager", "torch_compile", "torchfuse"):
            case = wl.make_case(torch.device("cuda"), None, "full")
            if variant == "torch_compile":
                torch._dynamo.reset()
                fn = torch.compile(case.fn)
            elif variant == "torchfuse":
                tf.reset()
                fn = tf.compile(case.fn, **({"options": json.loads(args.options)} if args.options else {}))
            else:
                fn = case.fn
            step = make_step(wl, case, fn)
            try:
                wall = _wall_ms(step)
                busy, top = _kernels(step)
                per[variant] = {"wall_ms": wall, "gpu_busy_ms": busy, "host_ms": wall - busy, "top": top}
                print(f"{wl.name:10s} {variant:14s} wall {wall:.3f} ms  GPU busy {busy:.3f} ms")
                for name, ms, count in top:
                    print(f"    {ms:8.3f} ms  x{count:<3d} {name}")
            except Exception as e:
                per[variant] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{wl.name} {variant}: {per[variant]['error']}")
            case = fn = step = None
            torch.cuda.empty_cache()
        result["rows"][wl.name] = per
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
