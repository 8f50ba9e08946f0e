"""Where torchfuse's compile time goes: a per-stage breakdown for every benchmark workload.

    python benchmarks/compile_profile.py                       # every workload, full shapes, CPU
    python benchmarks/compile_profile.py --only softmax,layer_norm_train --cprofile 25
    python benchmarks/compile_profile.py --triton              # + Triton's sm_90 compile per kernel

Runs on the CPU and runs no kernel: each workload is captured (``torchfuse.capture`` with a
backend that only records the graph), then the stages the ``inductor`` backend would run are
called one by one and timed: for training rows ``functionalize``, ``joint_graph``,
``decompose``, ``cse``, ``partition`` (torchfuse.autograd), then for each graph the inductor
passes (``decompose``, ``lower``, ``dead_code``, ``schedule``, ``codegen``, ``plan``, and
``meta``: the debug texts kept in ``Program.meta``), and the runtime's share of a first call
(``load``: kernel sources written and imported; ``callgen``: the call function generated).
``--triton`` adds ``triton``: Triton's real compiler run on every kernel for an sm_90 target
(no GPU needed), the cost a cold GPU process pays once per kernel (on a cache hit Triton
loads the binaries from its disk cache instead). ``--cprofile N`` prints the N functions with
the most own time over all the workloads' compile stages; ``--slowest N`` (with ``--triton``)
lists the N slowest single Triton compiles.

The numbers are one process's, in table order, after one warm-up compile (imports paid), like
the "cold" column of ``benchmarks/run.py``. ``--cache`` runs each compile a second time
through the program cache (``torchfuse.inductor.cache``) and reports the hit's time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated workload names (default: all runnable)")
    p.add_argument("--small", action="store_true", help="tiny shapes instead of the full ones")
    p.add_argument("--triton", action="store_true", help="also compile every kernel with Triton for sm_90")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N hottest functions")
    p.add_argument("--cache", action="store_true", help="also time a program-cache hit per graph")
    p.add_argument("--slowest", type=int, default=0, metavar="N",
                   help="with --triton: list the N slowest Triton compiles (kernel, constexprs, warps)")
    return p.parse_args(argv)


class Recorder:
    """A capture backend that keeps the graph and its example inputs and runs nothing compiled."""

    def __init__(self) -> None:
        self.graphs: list[tuple[Any, list[Any], float]] = []

    def __call__(self, graph: Any, example_inputs: Sequence[Any]) -> Callable[..., list[Any]]:
        from torchfuse.graph import run

        self.graphs.append((graph, list(example_inputs), time.perf_counter()))
        return lambda *inputs: run(graph, *inputs)


def _timed(times: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    times[name] = times.get(name, 0.0) + time.perf_counter() - t0
    return out


def compile_stages(graph: Any, times: dict[str, float], triton: bool, cache: bool) -> Any:
    """The inductor pipeline + the runtime's load on one graph, each stage added to ``times``."""
    from torchfuse.inductor import compile_graph_stages
    from torchfuse.runtime import load

    t0 = time.perf_counter()
    result = compile_graph_stages(graph)
    total = time.perf_counter() - t0
    for stage in result.stages:
        times[stage.name] = times.get(stage.name, 0.0) + stage.seconds
    times["meta"] = times.get("meta", 0.0) + total - sum(s.seconds for s in result.stages)
    program = result.program
    compiled = _timed(times, "load", lambda: load(program, device="cpu"))
    _timed(times, "callgen", lambda: compiled.source)
    if triton:
        triton_compile(program, times)
    if cache:
        from torchfuse.inductor import compile_graph

        compile_graph(graph)  # a miss: compiles again and stores
        _timed(times, "cache_hit", lambda: load(compile_graph(graph), device="cpu").source)
    times["kernels"] = times.get("kernels", 0) + len(program.kernels)
    return program


def profile_workload(wl: Any, scale: str, triton: bool, cache: bool) -> dict[str, float]:
    import torch
    import torchfuse.capture as tf

    case = wl.make_case("cpu", None, scale)
    rec = Recorder()
    tf.reset()
    compiled = tf.compile(case.fn, backend=rec)
    t0 = time.perf_counter()
    compiled(*case.inputs)
    if not rec.graphs:
        raise RuntimeError(f"{wl.name}: nothing was captured")
    times = {"capture": rec.graphs[0][2] - t0}
    for graph, examples, _ in rec.graphs:
        training = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        if not training:
            compile_stages(graph, times, triton, cache)
            continue
        rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        plan = aot_stages(graph, rg, examples, times, cache)
        compile_stages(plan.partition.forward, times, triton, cache)
        compile_stages(plan.partition.backward, times, triton, cache)
    return times


def _keep(g: Any, ex: Sequence[Any]) -> Callable[..., Any]:
    return lambda *a: None  # the halves are compiled (and timed) by compile_stages


def aot_stages(graph: Any, rg: tuple[bool, ...], examples: Sequence[Any], times: dict[str, float],
               cache: bool) -> Any:
    """autograd's training plan for ``graph``, its stages added to ``times``."""
    from torchfuse.autograd import aot

    fn = _timed(times, "aot.functionalize", lambda: aot(graph, _keep, _keep))
    plan = fn.plan(rg, True, fn.sizes_key(examples))
    for stage in fn.stages[1:]:
        name = "aot." + stage.name.split(".")[0]
        times[name] = times.get(name, 0.0) + stage.seconds
    if cache:
        from torchfuse.inductor.cache import PlanCache

        def plan_through_cache() -> None:
            cached = aot(graph, _keep, _keep, cache=PlanCache())
            cached.plan(rg, True, cached.sizes_key(examples))

        plan_through_cache()  # a miss: builds and stores
        _timed(times, "cache_hit", plan_through_cache)
    return plan


def triton_compile(program: Any, times: dict[str, float]) -> None:
    """Compile with Triton for an sm_90 GPU (no device needed) every (kernel, config) a cold
    first call compiles: all candidates of a kernel the runtime will tune, else the one it
    takes (:func:`torchfuse.runtime.autotune.cheapest_to_compile` for small launches).
    ``triton`` adds up the compile seconds, ``triton_max`` keeps the longest single compile
    (the wall time of a first call whose compiles all run in parallel)."""
    import importlib.util

    import torchfuse.runtime.config as rconfig
    import triton
    from torchfuse.runtime.autotune import cheapest_to_compile, launch_bytes
    from torchfuse.runtime.checks import buffer_table
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptr = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int64": "i64",
           "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}
    env = {s.name: s.hint for s in program.symbols}
    buffers = buffer_table(program)
    for kernel in program.kernels:
        path = Path(tempfile.mkdtemp()) / f"{kernel.name}.py"
        path.write_text(kernel.source)
        spec = importlib.util.spec_from_file_location(f"prof_{kernel.name}_{id(path)}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        configs = list(kernel.configs) or [None]
        if len(configs) > 1:
            moved = launch_bytes(program, kernel, env, buffers)
            if moved is not None and moved < rconfig.config.autotune_min_bytes:
                configs = [cheapest_to_compile(kernel.configs)]
        for cfg in configs:
            consts = {**kernel.constexprs, **(cfg.meta if cfg else {})}
            sig = {p.name: ("*" + ptr[p.dtype or "float32"]) if p.kind == "ptr" else p.kind
                   for p in kernel.signature}
            sig.update({c: "constexpr" for c in consts})
            src = ASTSource(fn=getattr(mod, kernel.entry or kernel.name), signature=sig, constexprs=consts)
            t0 = time.perf_counter()
            triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": cfg.num_warps if cfg else 4,
                                    "num_stages": cfg.num_stages if cfg else 3})
            took = time.perf_counter() - t0
            SLOWEST.append((took, kernel.name, dict(consts), cfg.num_warps if cfg else 4))
            times["triton"] = times.get("triton", 0.0) + took
            times["triton_max"] = max(times.get("triton_max", 0.0), took)
            times["compiles"] = times.get("compiles", 0) + 1


SLOWEST: list[tuple[float, str, dict[str, Any], int]] = []
"""Every Triton compile of the run: (seconds, kernel, constexprs, warps), for ``--slowest``."""

NOT_SECONDS = ("kernels", "compiles", "cache_hit", "triton_max")
COLUMNS = ("capture", "aot.functionalize", "aot.joint_graph", "aot.decompose", "aot.cse", "aot.partition",
           "decompose", "lower", "dead_code", "schedule", "codegen", "plan", "meta", "load", "callgen",
           "triton", "triton_max", "cache_hit")


def print_table(rows: list[tuple[str, dict[str, float]]]) -> None:
    cols = [c for c in COLUMNS if any(c in t for _, t in rows)]
    head = ["workload", *[c.removeprefix("aot.") if c.startswith("aot.") else c for c in cols], "total", "k"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, t in rows:
        total = sum(t.get(c, 0.0) for c in cols if c not in ("cache_hit", "triton_max"))
        cells = [f"{t[c] * 1000:.0f}" if c in t else "" for c in cols]
        k = f"{int(t.get('kernels', 0))}" + (f"/{int(t['compiles'])}" if "compiles" in t else "")
        print(f"| {name} | " + " | ".join(cells) + f" | {total * 1000:.0f} | {k} |")
    print("(milliseconds; k = kernels generated / Triton compiles a cold first call runs)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.triton:
        os.environ.pop("TRITON_INTERPRET", None)  # real JITFunctions for triton.compile
        # a fresh Triton cache: every compile is a cold one
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchfuse_profile_triton_")
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TORCHFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="torchfuse_profile_"))
    sys.path.insert(0, str(HERE))
    import torch
    import workloads

    if args.triton:
        # The runtime refuses CPU programs without the interpreter; load through a stub.
        import torchfuse.runtime.program as rp

        rp.triton_interpreting = lambda: True  # type: ignore[assignment]
    names = [n for n in args.only.split(",") if n]
    selected = [w for w in workloads.select(names) if w.available()]
    scale = "small" if args.small else "full"
    torch.manual_seed(0)
    # Warm-up: imports and first-use costs (sympy caches, op schemas) paid before timing.
    profile_workload(workloads.BY_NAME["seed_fn_1k"], "small", False, False)
    prof = cProfile.Profile() if args.cprofile else None
    rows = []
    for wl in selected:
        try:
            if prof:
                prof.enable()
            times = profile_workload(wl, scale, args.triton, args.cache)
        except Exception as e:  # keep going: one failing workload must not hide the others
            print(f"{wl.name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            continue
        finally:
            if prof:
                prof.disable()
        rows.append((wl.name, times))
        spent = sum(v for k, v in times.items() if k not in NOT_SECONDS)
        print(f"{wl.name}: {spent:.2f} s",
              file=sys.stderr, flush=True)
    print_table(rows)
    if args.slowest and SLOWEST:
        print(f"\nThe {args.slowest} slowest Triton compiles:")
        for took, name, consts, warps in sorted(SLOWEST, key=lambda r: -r[0])[: args.slowest]:
            print(f"  {took * 1e3:8.0f} ms  {name}  {consts}  num_warps={warps}")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.cprofile)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.cprofile * 2)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
