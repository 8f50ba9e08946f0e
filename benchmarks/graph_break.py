"""A graph break costs what its two graphs cost: a ``print`` between two chunks of work.

``f`` does pointwise + reduction work, prints, then more of it. Compiled, capture makes two
graphs and runs the ``print`` in Python between them (a resume function continues after
it). Reported, per call (median):

* ``eager``          the function run by PyTorch;
* ``compiled``       the function compiled by torchfuse, graph break included;
* ``graphs alone``   the two compiled graphs called directly on their inputs, plus the
                     ``print`` alone: what a break-free world would pay;
* ``overhead``       compiled - graphs alone: guards, rebuilding live values, the step that
                     runs the ``print``, the trampoline into the resume function.

Uses the GPU and the ``inductor`` backend when CUDA is available, else the CPU and the
``eager`` backend (Triton on the CPU is interpreted, far too slow to time). Output of the
``print`` goes to a buffer in every measurement alike.

    python benchmarks/graph_break.py [--size N] [--iters K]

Writes ``benchmarks/results/graph_break_<device>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torchfuse.capture import compile as tf_compile

ROOT = Path(__file__).resolve().parent.parent


def f(x, y):
    a = torch.relu((x + y) * 2).sin()
    s = a.sum(dim=1, keepdim=True)
    a = a / (s + 1)
    print("between the two chunks")
    b = (a * y).cos() + x.mean(dim=0)
    return b.sum(dim=1), b.amax()


def timed(fn, args, iters: int, repeats: int, sync) -> float:
    """Median milliseconds per call."""
    for _ in range(3):
        fn(*args)
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        sync()
        samples.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(samples)


def graph_callables(cf, args):
    """Each captured graph's compiled callable with the flat inputs it ran on."""
    cf(*args)
    from torchfuse.capture.convert import make_binder

    out = []
    L = make_binder(cf.fn)(*args)
    root = cf.entries[0]
    out.append((root.compiled, list(root.gather(L, cf.globals, cf.closure, root.params))))
    # the resume function's inputs are what the break hands it: replay one call to get them
    outs = root.compiled(*out[0][1])
    with contextlib.redirect_stdout(io.StringIO()):
        cont = root.breaker(outs, L, cf.globals, cf.closure)
    (rf,) = cf.resumes.values()
    entry = rf.entries[0]
    out.append((entry.compiled, list(entry.gather(cont.args, rf.globals, cont.cells, entry.params))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    opts = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backend = "inductor" if cuda else "eager"
    n = opts.size or (4096 if cuda else 512)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if not cuda:
        torch.set_num_threads(1)  # steadier numbers on a shared CPU
    torch.manual_seed(0)
    args = (torch.randn(n, n, device=device), torch.randn(n, n, device=device))

    cf = tf_compile(f, backend=backend)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.testing.assert_close(cf(*args), f(*args), rtol=1e-3, atol=1e-3)
        graphs = graph_callables(cf, args)
        assert cf.graph_count() == 2, cf.graph_count()
        eager = timed(f, args, opts.iters, opts.repeats, sync)
        compiled = timed(cf, args, opts.iters, opts.repeats, sync)
        alone = [timed(g, inputs, opts.iters, opts.repeats, sync) for g, inputs in graphs]
        printing = timed(print, ("between the two chunks",), opts.iters, opts.repeats, sync)
    sum_alone = sum(alone) + printing
    rows = {"device": device, "backend": backend, "size": [n, n], "eager_ms": eager,
            "compiled_ms": compiled, "graph1_ms": alone[0], "graph2_ms": alone[1],
            "print_ms": printing, "graphs_alone_ms": sum_alone,
            "overhead_us": (compiled - sum_alone) * 1e3,
            "python": platform.python_version(), "torch": torch.__version__}
    print(f"graph break benchmark on {device} ({backend} backend), x, y: {n}x{n} float32")
    print("| eager ms | compiled ms | graph 1 ms | graph 2 ms | print ms | graphs alone ms | overhead us |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {eager:.3f} | {compiled:.3f} | {alone[0]:.3f} | {alone[1]:.3f} | {printing:.4f} "
          f"| {sum_alone:.3f} | {rows['overhead_us']:.1f} |")
    out = ROOT / "benchmarks" / "results" / f"graph_break_{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
