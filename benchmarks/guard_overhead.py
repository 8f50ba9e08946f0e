"""Per-call overhead of torchfuse capture's cache + guards, on the CPU, eager backend.

Overhead = time of a compiled call whose graph is replaced by a stub that returns the
outputs computed once, i.e. everything capture adds around the graph: argument binding,
guard checks, gathering flat inputs (parameters included), rebuilding the return value.
The same is measured for ``torch.compile`` with a stub backend (its guards + frame
evaluation), and plain call times with the real eager backends are reported alongside.

    python benchmarks/guard_overhead.py [--quick]

Writes ``benchmarks/results/guard_overhead_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "capture" / "tests"))
from capture_gpt2 import GPT2  # noqa: E402  (the GPT-2-shaped test model)
from torchfuse.capture import compile as tf_compile  # noqa: E402

TARGETS_US = {"x + 1": 10.0, "gpt2-12-layer": 50.0}


def per_call_us(fn, args, iters: int, repeats: int) -> float:
    for _ in range(min(iters, 50)):
        fn(*args)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def stub_torchfuse(cf, args):
    """Replace the compiled graph of the (only) entry by a stub returning fixed outputs."""
    cf(*args)
    compiled = cf._compiled if hasattr(cf, "_compiled") else cf
    entry = compiled.entries[0]
    outs = entry.compiled(*entry.gather(*_lgc(compiled, args), entry.params))
    entry.compiled = lambda *flat: outs
    return cf


def _lgc(compiled, args):
    call_args = (compiled.bound_self, *args) if compiled.bound_self is not None else args
    return compiled.binder(*call_args), compiled.globals, compiled.closure


def stub_backend():
    def backend(gm, example_inputs):
        cache = {}

        def run(*flat):
            if "out" not in cache:
                cache["out"] = gm(*flat)
            return cache["out"]
        return run
    return backend


def measure(name, fn, args, iters, repeats):
    torch._dynamo.reset()
    eager_us = per_call_us(fn, args, iters, repeats)
    tf_eager = tf_compile(fn, backend="eager")
    tf_eager_us = per_call_us(tf_eager, args, iters, repeats)
    tf_stub = stub_torchfuse(tf_compile(fn, backend="eager"), args)
    tf_over = per_call_us(tf_stub, args, iters, repeats)
    tc_eager = torch.compile(fn, backend="eager")
    tc_eager_us = per_call_us(tc_eager, args, iters, repeats)
    torch._dynamo.reset()
    tc_stub = torch.compile(fn, backend=stub_backend())
    tc_over = per_call_us(tc_stub, args, iters, repeats)
    return {
        "case": name,
        "torchfuse_overhead_us": round(tf_over, 2),
        "torch_compile_overhead_us": round(tc_over, 2),
        "target_us": TARGETS_US[name],
        "meets_target": tf_over <= TARGETS_US[name],
        "eager_call_us": round(eager_us, 2),
        "torchfuse_eager_backend_call_us": round(tf_eager_us, 2),
        "torch_compile_eager_backend_call_us": round(tc_eager_us, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    torch.set_num_threads(1)  # overhead is single-threaded Python; threads only add noise
    torch.manual_seed(0)
    rows = []
    iters, repeats = (200, 3) if opts.quick else (2000, 7)
    x = torch.randn(8)
    rows.append(measure("x + 1", lambda t: t + 1, (x,), iters, repeats))
    gpt = GPT2(vocab=128, ctx=16, dim=32, heads=4, layers=12).eval()
    idx = torch.randint(0, 128, (1, 8))
    rows.append(measure("gpt2-12-layer", gpt, (idx,), max(iters // 20, 20), repeats))
    meta = {"python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.machine(), "cpu_count": __import__("os").cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "method": __doc__.split("\n\n")[1].replace("\n", " ")}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "guard_overhead_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# Guard / call overhead (CPU, eager backends)", "",
             f"Python {meta['python']}, torch {meta['torch']}, {meta['machine']}, "
             f"{meta['torch_threads']} torch thread(s).", "",
             meta["method"], "",
             "| case | torchfuse overhead (µs) | torch.compile overhead (µs) | target (µs) | "
             "eager call (µs) | torchfuse eager-backend call (µs) | torch.compile eager-backend call (µs) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['torchfuse_overhead_us']} | {r['torch_compile_overhead_us']} | "
                     f"{r['target_us']} | {r['eager_call_us']} | {r['torchfuse_eager_backend_call_us']} | "
                     f"{r['torch_compile_eager_backend_call_us']} |")
    (out / "guard_overhead_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
