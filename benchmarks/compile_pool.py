"""Triton compiles one after another, in threads, and in worker processes, on a real model.

    python benchmarks/compile_pool.py                        # GPT-2 training, full config
    python benchmarks/compile_pool.py --model llama --modes sequential,pool2

Needs no GPU: each mode runs in a fresh process over a fresh Triton cache, which captures the
model (``benchmarks/models.py``), builds its autograd plan and compiles the forward and the
backward Programs with Triton kernels, then hands every (kernel, config, specialization) a
cold first call compiles to ``torchfuse.runtime.kernels.precompile`` for an sm_90 target (a
stub driver names it, as in the runtime's worker tests). The configs are the runtime's own
choice for a cold start (``prune_candidates`` limited to ``autotune_default_max`` for
kernels it tunes, the cheapest to compile for small launches). Only ``precompile`` is
timed. Modes: ``sequential`` (one thread, no workers), ``threadsN`` (N threads),
``poolN`` (N worker processes, then this process loads every binary from the disk cache);
``MODE+warm`` the same over a disk cache that already holds every binary (a warm start).
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
from typing import Any

HERE = Path(__file__).resolve().parent
MARK = "COMPILE_POOL "


def programs_of(model: str, scale: str) -> list[Any]:
    """The Programs (with Triton kernels) a cold compile of ``model``'s training step makes."""
    import torch
    import torchfuse.capture as tf
    from compile_profile import Recorder, aot_stages, model_rows
    from torchfuse.inductor import compile_graph

    (row,) = model_rows(model, "training")
    fn, step = row.build("cpu", scale)
    rec = Recorder()
    tf.reset()
    step(tf.compile(fn, backend=rec))
    out = []
    for graph, examples, _, grad_mode in rec.graphs:
        rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        if not (grad_mode and any(rg)):
            out.append(compile_graph(graph, options={"cache": False}))
            continue
        plan = aot_stages(graph, rg, examples, {}, False)
        out += [compile_graph(g, options={"cache": False})
                for g in (plan.partition.forward, plan.partition.backward)]
    return out


def jobs_of(programs: list[Any], root: Path) -> list[Any]:
    """Every warm-up job a cold first call runs for these Programs, on real ``JITFunction``s."""
    import importlib.util

    import torchfuse.runtime.config as rconfig
    import triton
    from torchfuse.graph.expr import evaluate
    from torchfuse.graph.ops import to_dtype
    from torchfuse.runtime.autotune import cheapest_to_compile, launch_bytes, prune_candidates
    from torchfuse.runtime.checks import buffer_table
    from torchfuse.runtime.codegen import launch_values
    from torchfuse.runtime.kernels import WarmupJob

    cfg_rt = rconfig.config
    fns: dict[str, Any] = {}
    jobs, seen = [], set()
    for p_index, program in enumerate(programs):
        env = {s.name: int(s.hint) for s in program.symbols}
        buffers = buffer_table(program)
        kmap = {k.name: k for k in program.kernels}
        for step in program.steps:
            kernel = kmap.get(getattr(step, "kernel", None))
            if kernel is None:
                continue
            key = kernel.source
            if key not in fns:  # equal code, one function (the runtime's load_kernel does the same)
                path = root / f"k{len(fns)}.py"
                path.write_text(kernel.source)
                name = f"compile_pool_k{len(fns)}"
                spec = importlib.util.spec_from_file_location(name, path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                spec.loader.exec_module(mod)
                fns[key] = getattr(mod, kernel.entry or kernel.name)
                assert type(fns[key]) is triton.runtime.jit.JITFunction
            fn = fns[key]
            args = []
            for param, a in zip(kernel.signature, step.args, strict=True):
                kind = type(a).__name__
                if kind == "TensorRef":
                    buf = buffers.get(a.name)
                    args.append(to_dtype(param.dtype or (buf.dtype if buf else "float32")))
                elif kind == "SymRef":
                    args.append(evaluate(a.expr, env))
                elif kind == "Float":
                    args.append(float(a.value))
                else:
                    args.append(getattr(a, "value", None))
            configs: list[Any] = list(kernel.configs) or [None]
            if len(configs) > 1:
                moved = launch_bytes(program, kernel, env, buffers)
                configs = ([cheapest_to_compile(kernel.configs)] if moved is not None
                           and moved < cfg_rt.autotune_min_bytes
                           else prune_candidates(program, kernel, env, cfg_rt.autotune_default_max))
            for cfg in configs:
                values = launch_values(kernel, cfg, fn, args)
                kw = (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages)) if cfg else ()
                same = (id(fn), tuple(map(repr, values)), kw)
                if same not in seen:
                    seen.add(same)
                    jobs.append(WarmupJob(f"p{p_index}.{kernel.name}", fn, tuple(values), kw))
    return jobs


def child(args: argparse.Namespace) -> int:
    import dataclasses

    import torchfuse.runtime.config as rconfig
    import torchfuse.runtime.kernels as rk
    from torchfuse.runtime import compile_workers as cw
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    t0 = time.perf_counter()
    programs = programs_of(args.model, "small" if args.small else "full")
    pipeline = time.perf_counter() - t0
    driver.set_active(cw._StubDriver(GPUTarget("cuda", 90, 32)))
    root = Path(tempfile.mkdtemp(prefix="compile_pool_"))
    jobs = jobs_of(programs, root)
    mode, _, warm = args.child.partition("+")
    if warm:  # a warm start: the binaries are on disk, the functions new (as in a fresh process)
        rk.precompile(jobs, rk.CompileStats(), threads=1)
        jobs = jobs_of(programs, root)
    threads = 1 if mode == "sequential" else int(mode.removeprefix("threads")) if mode.startswith("threads") \
        else rconfig.config.compile_threads
    workers = int(mode.removeprefix("pool")) if mode.startswith("pool") else 0
    rconfig.config = dataclasses.replace(rconfig.config, compile_workers=workers, compile_workers_min=1)
    rk.triton_interpreting = lambda: False  # type: ignore[assignment]  # real compiles on the CPU
    pool_start = 0.0
    if workers:
        t0 = time.perf_counter()
        cw.get_pool(workers)  # the runtime starts it when it loads the first Program
        pool_start = time.perf_counter() - t0
    stats = rk.CompileStats()
    t0 = time.perf_counter()
    with rk.count_compiles(stats):
        rk.precompile(jobs, stats, threads=threads)
    seconds = time.perf_counter() - t0
    print(MARK + json.dumps({"mode": args.child, "seconds": seconds, "pool_start_s": pool_start,
                             "pipeline_s": pipeline, "programs": len(programs),
                             "kernels": sum(len(p.kernels) for p in programs), "jobs": len(jobs),
                             "here_compiles": stats.triton_compiles,
                             "here_cache_hits": stats.triton_cache_hits,
                             "worker_compiles": stats.worker_compiles, "cores": rconfig.cores()}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--small", action="store_true")
    p.add_argument("--modes", default="sequential,threads2,pool1,pool2")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.child:
        return child(args)
    rows = []
    for mode in args.modes.split(","):
        root = tempfile.mkdtemp(prefix="compile_pool_cache_")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TRITON_CACHE_DIR=os.path.join(root, "triton"),
                   TORCHFUSE_CACHE_DIR=os.path.join(root, "tf"), TORCHFUSE_CPU_BACKEND="triton")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--model", args.model, "--child", mode]
        cmd += ["--small"] if args.small else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE)
        found = [json.loads(line[len(MARK):]) for line in proc.stdout.splitlines() if line.startswith(MARK)]
        if not found:
            print(f"{mode}: failed: {proc.stderr.strip().splitlines()[-3:]}", file=sys.stderr)
            continue
        rows.append(found[0])
        print(f"{mode}: {found[0]['seconds']:.1f} s", file=sys.stderr, flush=True)
    print("| mode | precompile s | pool start s | jobs | kernels | compiled here | cache hits here "
          "| by workers |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds']:.2f} | {r['pool_start_s']:.2f} | {r['jobs']} | {r['kernels']} "
              f"| {r['here_compiles']} | {r['here_cache_hits']} | {r['worker_compiles']} |")
    if rows:
        print(f"({args.model} training, {'small' if args.small else 'full'} config, {rows[0]['programs']} "
              f"Programs, sm_90 target, {rows[0]['cores']} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
