"""Host overhead per kernel launch of torchfuse-runtime's generated call function.

A Program of N tiny kernels (adds on 64 floats, so the GPU is never the bottleneck) is called
many times with one CUDA synchronize at the end; time per call divided by N is the host cost
of one launch (the minimum over ``--repeats`` runs, with the median beside it). Variants:

- ``fast``: the default path (launches through Triton's C launcher where the installed
  Triton's is known, see ``torchfuse.runtime.launchers``);
- ``fast, built launcher``: the same with ``TORCHFUSE_QUICK_LAUNCH=0``: under Triton 3.6, its
  C launcher built per signature instead of ``cuLaunchKernel`` through ``ctypes`` (the default,
  which builds nothing);
- ``fast, run()``: the same through ``CompiledKernel.run`` (``TORCHFUSE_DIRECT_LAUNCH=0``);
- ``fn[grid]``: the same Program with ``TORCHFUSE_FAST_LAUNCH=0`` (Triton's ``JITFunction.run``);
- ``fast+alloc``: every kernel writes a freshly allocated buffer (adds ``torch.empty_strided``);
- ``reduce-overhead``: the call replayed as a CUDA graph (includes the input copy);
- ``raw fn[grid]``: a bare Python loop of ``fn[grid](...)``, no torchfuse at all, for reference.

Usage: ``python benchmarks/launch_overhead.py [--kernels 100] [--iters 200] [--json out.json]``.
``--device cpu`` runs a tiny smoke test through the Triton interpreter (numbers meaningless).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

ADD_SRC = """
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
"""


def chain_program(n_kernels: int, size: int, device: str, reuse: bool):
    """x -> x + x -> (x + x) + x -> ...; with ``reuse`` two buffers alternate (no allocation)."""
    from torchfuse.graph import schema as S

    t = S.TensorRef
    kernel = S.Kernel(
        name="add_kernel", source=ADD_SRC,
        signature=(S.KernelParam(name="x_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="y_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="out_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="n", kind="i32")),
        configs=(S.LaunchConfig(meta={"BLOCK": 64}, num_warps=1),),
        grid=(f"({size} + BLOCK - 1) // BLOCK",),
    )
    buffers = [S.Buffer(name="x", dtype="float32", sizes=(size,), strides=(1,), device=device)]
    steps: list = []
    live: list[str] = []
    prev = "x"
    for i in range(n_kernels):
        name = f"buf{i}"
        buffers.append(S.Buffer(name=name, dtype="float32", sizes=(size,), strides=(1,), device=device))
        reuse_of = None
        if reuse and len(live) == 2:
            reuse_of = live.pop(0)
            steps.append(S.FreeStep(buffer=reuse_of))
        elif not reuse and len(live) == 2:
            steps.append(S.FreeStep(buffer=live.pop(0)))
        steps.append(S.AllocStep(buffer=name, reuse=reuse_of))
        steps.append(S.LaunchStep(kernel="add_kernel",
                                  args=(t(name=prev), t(name="x"), t(name=name), S.Int(value=size))))
        live.append(name)
        prev = name
    return S.Program(name=f"chain{n_kernels}", inputs=("x",), outputs=(t(name=prev),), buffers=tuple(buffers),
                     kernels=(kernel,), steps=tuple(steps), device=device)


def _time(fn, args, iters: int, sync, repeats: int = 5) -> tuple[float, float]:
    """(minimum, median) seconds per call over ``repeats`` runs of ``iters`` calls each. The
    minimum is the figure reported, as ``timeit`` does: host overhead only ever gets slower
    from outside noise (other processes, frequency changes), never faster."""
    for _ in range(3):
        fn(*args)
    sync()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        sync()
        runs.append((time.perf_counter() - start) / iters)
    runs.sort()
    return runs[0], runs[len(runs) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="runs of --iters calls; the minimum is kept")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    opts = parser.parse_args()
    if opts.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        opts.kernels, opts.iters, opts.repeats = min(opts.kernels, 4), min(opts.iters, 2), 1

    import torch
    import torchfuse.runtime.config as rconfig
    import triton
    from torchfuse.runtime import load

    if opts.device == "cuda" and not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA device (or --device cpu for a smoke test)", file=sys.stderr)
        return 1
    sync = torch.cuda.synchronize if opts.device == "cuda" else (lambda: None)
    n = opts.kernels
    x = torch.randn(opts.size, device=opts.device)
    want = x * (n + 1)
    rows = []

    def measure(label: str, fn, check: bool = True) -> None:
        per_call, median = _time(fn, (x,), opts.iters, sync, opts.repeats)
        if check:
            # A chain of n fp32 adds rounds differently from one multiply: scale the
            # tolerances with the chain length and the magnitude of the result.
            scale = float(want.abs().max())
            torch.testing.assert_close(fn(x)[0], want, rtol=1e-5 * max(1, n // 16),
                                       atol=1e-5 * max(1, n // 16) * scale)
        rows.append({"variant": label, "kernels": n, "us_per_call": per_call * 1e6,
                     "us_per_launch": per_call * 1e6 / n, "us_per_launch_median": median * 1e6 / n})

    measure("fast", load(chain_program(n, opts.size, opts.device, reuse=True)))
    measure("fast+alloc", load(chain_program(n, opts.size, opts.device, reuse=False)))
    saved = rconfig.config
    try:
        rconfig.config = dataclasses.replace(saved, quick_launch=False)
        measure("fast, built launcher", load(chain_program(n, opts.size, opts.device, reuse=True)))
        rconfig.config = dataclasses.replace(saved, direct_launch=False)
        measure("fast, run()", load(chain_program(n, opts.size, opts.device, reuse=True)))
        rconfig.config = dataclasses.replace(saved, fast_launch=False)
        measure("fn[grid]", load(chain_program(n, opts.size, opts.device, reuse=True)))
    finally:
        rconfig.config = saved
    if opts.device == "cuda":
        graph = load(chain_program(n, opts.size, opts.device, reuse=True), mode="reduce-overhead")
        measure("reduce-overhead", graph)
        assert graph.stats.graph_replays > 0, graph.stats.fallback_reasons

    # Reference: Triton's own launch path in a bare loop, no torchfuse code at all.
    jit = load(chain_program(1, opts.size, opts.device, reuse=True)).kernels["add_kernel"]
    out = torch.empty_like(x)
    grid = (triton.cdiv(opts.size, 64),)

    def raw(inp):
        for _ in range(n):
            jit[grid](inp, inp, out, opts.size, BLOCK=64, num_warps=1)
        return [out]

    measure("raw fn[grid]", raw, check=False)

    print(f"triton {triton.__version__}, torch {torch.__version__}, {n} kernels per call, "
          f"{opts.iters} calls, device {opts.device}")
    print(f"{'variant':<18}{'us/call':>12}{'us/launch':>12}{'median':>10}")
    for r in rows:
        print(f"{r['variant']:<18}{r['us_per_call']:>12.1f}{r['us_per_launch']:>12.2f}"
              f"{r['us_per_launch_median']:>10.2f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"triton": triton.__version__, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
