"""CPU micro-benchmark: eager vs torch.compile (its C++ backend) vs torchfuse (its CPU default,
C++/OpenMP kernels), side by side in one run, as speedups over eager.

    python benchmarks/cpu.py                       # every row at CPU-sized shapes (1024 x 1024)
    python benchmarks/cpu.py --only softmax,rope --repeat 50
    python benchmarks/cpu.py --skip-compile        # no torch.compile column
    python benchmarks/cpu.py --out benchmarks/results/cpu_<stamp>.md   # also write the table

The rows are the forward functions of ``workloads.py`` at CPU-sized shapes, float32. Each
variant is compiled and called once (the first call, compile included, is reported
separately), then timed as the median (``--stat min``: the fastest) of ``--repeat`` calls.
Outputs are compared with eager (``ok`` column). Prints a Markdown table and the geometric
mean of each column; the thread count is torch's intra-op thread count (torchfuse's kernels
use OpenMP's default, the same number of cores), and the load average is printed with it (a
shared machine's timings swing with it). Run it without ``TRITON_INTERPRET`` (which would
select Triton kernels); the header says which kernels torchfuse compiled. Nothing here is
asserted: performance is measured, not tested.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import workloads as W  # noqa: E402

N = 1024


def _rows() -> dict[str, tuple[Callable, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    return {
        "seed_fn": (W.seed_fn, lambda: (r(N, N), r(N, N))),
        "gelu_bias": (W.gelu_bias, lambda: (r(N, N), r(N))),
        "softmax": (W.softmax_last, lambda: (r(N, N),)),
        "layer_norm": (W.layer_norm, lambda: (r(N, N), r(N), r(N))),
        "rmsnorm": (W.rmsnorm, lambda: (r(N, N), r(N))),
        "add_layer_norm": (W.add_layer_norm, lambda: (r(N, N), r(N, N), r(N), r(N))),
        "cross_entropy": (W.cross_entropy, lambda: (r(N, 4 * N), torch.randint(0, 4 * N, (N,), generator=g))),
        "rope": (W.rope, lambda: (r(8, 128, 64), r(128, 64), r(128, 64))),
        "small_ops": (W.small_ops, lambda: (r(N, N), r(N, N))),
        "sum_rows": (lambda x: x.sum(1), lambda: (r(N, N),)),
        "sum_all": (lambda x: x.sum(), lambda: (r(4 * N, N),)),
    }


def _time(fn: Callable, args: tuple, repeat: int, stat: Callable = statistics.median) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return stat(times)


def _same(a, b) -> bool:
    a = a if isinstance(a, tuple | list) else (a,)
    b = b if isinstance(b, tuple | list) else (b,)
    try:
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    except (AssertionError, ValueError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="min: the fastest call (steadier on a machine shared with other work)")
    p.add_argument("--out", default="", help="also write the header, table and means to this file")
    args = p.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="torchfuse_cpu_bench_")  # cold compiles, like a first run
    os.environ.setdefault("TORCHFUSE_CACHE_DIR", os.path.join(cache, "torchfuse"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    import torchfuse.capture as tf
    from torchfuse.inductor.config import config as inductor_config
    from torchfuse.inductor.config import cpu_kernels
    from torchfuse.runtime.cpp import compiler_flags, find_compiler

    rows = _rows()
    only = [x for x in args.only.split(",") if x]
    variants = ["eager", "torchfuse"] + ([] if args.skip_compile else ["torch_compile"])
    cxx = find_compiler()
    kernels, why = cpu_kernels(inductor_config)
    report: list[str] = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        report.append(line)

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    emit(f"threads: {torch.get_num_threads()} (torch intra-op), cpu_count {os.cpu_count()}, load average "
         f"{load} at the start; torchfuse kernels: {kernels} ({why}); "
         f"compiler: {cxx} {' '.join(compiler_flags(cxx))}; torch {torch.__version__}; "
         f"{args.stat} of {args.repeat} calls\n")
    table = []
    for name, (fn, make) in rows.items():
        if only and name not in only:
            continue
        inputs = make()
        ref = fn(*inputs)
        row = {"name": name}
        for v in variants:
            if v == "eager":
                compiled = fn
            elif v == "torchfuse":
                compiled = tf.compile(fn)
            else:
                torch._dynamo.reset()
                compiled = torch.compile(fn)
            try:
                t0 = time.perf_counter()
                out = compiled(*inputs)
                first = time.perf_counter() - t0
                stat = min if args.stat == "min" else statistics.median
                row[v] = (_time(compiled, inputs, args.repeat, stat), first, _same(out, ref))
            except Exception as e:  # a failing variant is a cell, not the end of the run
                row[v] = (math.nan, math.nan, f"{type(e).__name__}: {e}"[:60])
        table.append(row)
        print(_line(row, variants), flush=True)  # progress; the table follows
    heads = " | ".join(f"{v} speedup | {v} first call s | ok" for v in variants[1:])
    emit(f"| row | eager ms | {heads} |")
    emit("|---|---:|" + "---:|---:|---|" * (len(variants) - 1))
    for row in table:
        emit(_line(row, variants))
    for v in variants[1:]:
        ratios = [row["eager"][0] / row[v][0] for row in table if row[v][0] == row[v][0]]
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            emit(f"\ngeometric-mean speedup over eager, {v}: {gm:.2f}x over {len(ratios)} rows")
    emit(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")
    return 0


def _line(row: dict, variants: list[str]) -> str:
    eager = row["eager"][0]
    cells = [row["name"], f"{eager * 1e3:.3f}"]
    for v in variants[1:]:
        t, first, ok = row[v]
        speedup = f"{eager / t:.2f}x" if t == t else "error"
        cells += [speedup, f"{first:.2f}", "yes" if ok is True else str(ok)]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    raise SystemExit(main())
