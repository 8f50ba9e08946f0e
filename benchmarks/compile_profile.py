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
lists the N slowest single Triton compiles, and ``triton_pool`` is the wall time of a row's
compiles spread over ``--workers N`` (15) processes longest first, as the runtime's pool hands
them out: on this machine's clock, the lower bound of a cold GPU first call's compiling.

The numbers are one process's, in table order, after one warm-up compile (imports paid), like
the "cold" column of ``benchmarks/run.py``. Each graph's stages run with the garbage collector
paused (`torchfuse.graph.collector.gc_paused`), as in the real path, where capture holds the
pause around an inference graph's compile and ``aot`` around a training plan and its
compilers; ``--gc-pause on,off`` measures both settings (``TORCHFUSE_GC_PAUSE``), in turn.
``--repeat N`` runs everything N times and keeps the minimum of every cell. ``--cache`` runs
each compile a second time through the program cache (``torchfuse.inductor.cache``) and
reports the hit's time.

``--hashes FILE`` writes a hash of every captured graph, training half and Program (times
and guards left out) to compare before and after a compiler change; ``--retarget cuda:0``
compiles the graphs inductor gets for the GPU (moved after aot; no load or callgen), the
Python side of the GPU's pipeline on a CPU-only machine.

``--models gpt2,llama`` (or ``all``) profiles the real ``transformers`` models of
``benchmarks/models.py`` instead (``--model-modes inference,training``), as rows
``gpt2/inference``, ``gpt2/training``.

Two more modes run the real first call instead of the stages one by one, on any device:

    python benchmarks/compile_profile.py --real --only softmax --device cuda
    python benchmarks/compile_profile.py --warm --small --device cpu --only softmax,layer_norm_train
    python benchmarks/compile_profile.py --warm --models gpt2 --model-modes training --device cuda

``--real``: each row compiled by the ``inductor`` backend and called once, in a fresh process
over a fresh cache directory, with what every compiled entry recorded
(``torchfuse.graph.observe``: the stages of ``timings.json``, the runtime's first-call phases,
Triton compiles and cache hits, the on-disk cache lookups) summed over the row's entries,
forward and backward together, after one untimed eager step (``--no-eager-first``: without).
``--warm``: a cold process and then a warm one over one fresh
cache directory (``TORCHFUSE_CACHE_DIR``, ``TRITON_CACHE_DIR``), printed side by side: where a
warm start's time goes, and whether it missed a cache (the counts say). On the CPU the
kernels are the C++ ones (``TORCHFUSE_CPU_BACKEND=cpp``, the CPU default; the cold process
builds them with the system compiler, the warm one loads the shared objects from the cache);
``--cpu-backend triton`` runs Triton's interpreter instead (slow: use ``--small``). On a GPU
``runtime.run`` is the first launches. ``--repeat N``: N (cold, warm) pairs, each over a fresh
cache, the minimum per cell; ``--gc-pause on,off``: each row under both settings;
``--cprofile N`` (with ``--warm``): the warm process's first call under cProfile, its N
hottest functions by own time and by cumulative time; ``--pstats FILE`` also writes each
row's profile to ``FILE.<row>``, for ``pstats`` (who calls what: ``print_callers``).
``--torch-profile N`` (with ``--warm``): the warm process's first call under
``torch.profiler`` (CPU and, on a GPU, CUDA activities), its N ops and API calls of most
own CPU time: where time inside C calls goes (first launches, cuBLAS or cuDNN first calls),
which cProfile shows as one opaque call.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STARTED = time.perf_counter()
"""When this script started running (its own imports done): a child's setup is timed from here."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated workload names (default: all runnable)")
    p.add_argument("--small", action="store_true", help="tiny shapes instead of the full ones")
    p.add_argument("--triton", action="store_true", help="also compile every kernel with Triton for sm_90")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N hottest functions")
    p.add_argument("--torch-profile", type=int, default=0, metavar="N",
                   help="with --warm: the warm first call under torch.profiler, "
                        "its N ops of most own CPU time")
    p.add_argument("--pstats", default="", metavar="FILE",
                   help="with --cprofile, --real/--warm: also write each row's profile to "
                        "FILE.<row> (pstats)")
    p.add_argument("--cache", action="store_true", help="also time a program-cache hit per graph")
    p.add_argument("--slowest", type=int, default=0, metavar="N",
                   help="with --triton: list the N slowest Triton compiles (kernel, constexprs, warps)")
    p.add_argument("--workers", type=int, default=15, metavar="N",
                   help="with --triton: the triton_pool column spreads each row's compiles over N "
                        "workers, longest first (default 15, the GPU machine's 16 cores less one)")
    p.add_argument("--models", default="", help="comma-separated models of benchmarks/models.py, or 'all'")
    p.add_argument("--model-modes", default="inference,training", help="with --models: inference, training")
    p.add_argument("--real", action="store_true",
                   help="the real first call, with every entry's recorded stages")
    p.add_argument("--warm", action="store_true", help="--real in a cold and then a warm fresh process")
    p.add_argument("--device", default="cpu", help="with --real/--warm: cpu or cuda")
    p.add_argument("--timeout", type=float, default=540, help="with --real/--warm: seconds per child process")
    p.add_argument("--cpu-backend", default="cpp", choices=("cpp", "triton"),
                   help="with --real/--warm on the CPU: C++ kernels, or Triton's interpreter")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run N times, keep the minimum per cell")
    p.add_argument("--gc-pause", default="on", help="on, off or on,off: TORCHFUSE_GC_PAUSE for the compiles")
    p.add_argument("--no-eager-first", action="store_true",
                   help="with --real/--warm: no untimed eager step before the compiled first call")
    p.add_argument("--retarget", default="", metavar="DEVICE",
                   help="stage mode: graphs moved to DEVICE (cuda:0) before inductor (after aot), "
                        "so that the GPU's Triton pipeline is profiled on this CPU; no load/callgen")
    p.add_argument("--hashes", default="", metavar="FILE",
                   help="stage mode: write a hash of every graph and Program made to FILE (JSON), "
                        "to check that a change keeps the outputs identical")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- rows


Builder = Callable[[str, Any], tuple[Callable[..., Any], Callable[[Any], Any]]]


class Row:
    """One thing to compile: a workload of ``workloads.py`` or a model of ``models.py``."""

    def __init__(self, name: str, build: Builder) -> None:
        self.name = name
        self.build = build
        """``build(device, scale) -> (fn, step)``: ``step(compiled_fn)`` makes the first call."""


def workload_rows(names: list[str]) -> list[Row]:
    import workloads
    from run import make_step

    def build_for(wl: Any) -> Builder:
        def build(device: str, scale: str) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
            case = wl.make_case(device, None, scale)
            return case.fn, lambda compiled: make_step(wl, case, compiled)()
        return build

    return [Row(w.name, build_for(w)) for w in workloads.select(names) if w.available()]


def model_rows(names: str, modes: str) -> list[Row]:
    import models
    import vision_models

    vision_models.ensure_importable()  # before transformers imports torchvision

    specs = list(models.MODELS) if names == "all" else models.select(names, "")

    def build_for(spec: Any, training: bool) -> Builder:
        def build(device: str, scale: str) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
            import torch

            model, _ = models.build_model(spec, scale, device)
            model.train(training)
            inputs = models.make_inputs(spec, model.config, scale, device, training)
            params = tuple(p for p in model.parameters() if p.requires_grad)
            kind = torch.device(device).type
            return model, lambda compiled: models.make_step(compiled, inputs, training, params, kind)()
        return build

    return [Row(f"{spec.name}/{mode}", build_for(spec, mode == "training"))
            for spec in specs for mode in modes.split(",") if mode]


class Recorder:
    """A capture backend that keeps the graph and its example inputs and runs nothing compiled."""

    def __init__(self) -> None:
        self.graphs: list[tuple[Any, list[Any], float, bool]] = []

    def __call__(self, graph: Any, example_inputs: Sequence[Any]) -> Callable[..., list[Any]]:
        import torch
        from torchfuse.graph import run

        self.graphs.append((graph, list(example_inputs), time.perf_counter(), torch.is_grad_enabled()))
        return lambda *inputs: run(graph, *inputs)


def _timed(times: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    times[name] = times.get(name, 0.0) + time.perf_counter() - t0
    return out


class Options:
    """Stage mode's settings that reach every compile: ``--retarget`` and ``--hashes``."""

    retarget = ""
    """The device the captured graphs are moved to before aot and inductor ('': as captured)."""
    hashing = False
    hashes: list[tuple[str, str]] = []
    """(what, digest) of every graph and Program made, in order, for ``--hashes``."""
    workers = 15
    """``--workers``: the pool ``triton_pool`` spreads a row's Triton compiles over."""


def digest(what: str, obj: Any) -> None:
    """Record a hash of ``obj`` (a Graph or Program) for ``--hashes``: its serialized form with
    the measured times of its ``meta`` left out, and a graph's guards (they name the addresses
    of the model's objects); everything else, debug texts included, counts."""
    import hashlib

    import msgspec

    if not Options.hashing:
        return
    meta = getattr(obj, "meta", None)
    if isinstance(meta, dict):
        obj = msgspec.structs.replace(obj, meta={k: v for k, v in meta.items() if "timings" not in k})
    if hasattr(obj, "guards"):
        obj = msgspec.structs.replace(obj, guards=())
    Options.hashes.append((what, hashlib.sha256(msgspec.msgpack.encode(obj)).hexdigest()[:16]))


def compile_stages(graph: Any, times: dict[str, float], triton: bool, cache: bool) -> Any:
    """The inductor pipeline + the runtime's load on one graph, each stage added to ``times``."""
    from torchfuse.graph.collector import gc_paused
    from torchfuse.inductor import compile_graph_stages
    from torchfuse.runtime import load

    with gc_paused():  # as in the real path: capture's (inference) or aot's (training) pause
        return _compile_stages(graph, times, triton, cache, compile_graph_stages, load)


def _compile_stages(graph: Any, times: dict[str, float], triton: bool, cache: bool,
                    compile_graph_stages: Callable[..., Any], load: Callable[..., Any]) -> Any:
    t0 = time.perf_counter()
    result = compile_graph_stages(graph)
    total = time.perf_counter() - t0
    for stage in result.stages:
        times[stage.name] = times.get(stage.name, 0.0) + stage.seconds
    times["meta"] = times.get("meta", 0.0) + total - sum(s.seconds for s in result.stages)
    program = result.program
    digest(f"program {graph.name}", program)
    if not Options.retarget:  # a retargeted Program's runtime needs the device
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


def pool_makespan(seconds: Sequence[float], workers: int) -> float:
    """Wall time of ``seconds`` of compiles over ``workers`` processes handed out longest first
    (as the runtime's pool does): each goes to the worker that frees up first."""
    loads = [0.0] * max(1, workers)
    for took in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + took)
    return max(loads)


def profile_workload(row: Row, scale: str, triton: bool, cache: bool) -> dict[str, float]:
    import torch
    import torchfuse.capture as tf

    fn, step = row.build("cpu", scale)
    first_compile = len(SLOWEST)
    rec = Recorder()
    tf.reset()
    compiled = tf.compile(fn, backend=rec)
    t0 = time.perf_counter()
    step(compiled)
    if not rec.graphs:
        raise RuntimeError(f"{row.name}: nothing was captured")
    times = {"capture": rec.graphs[0][2] - t0}
    for graph, examples, _, grad_mode in rec.graphs:
        digest(f"captured {graph.name}", graph)
        training = grad_mode and any(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        if not training:
            compile_stages(_on_target(graph), times, triton, cache)
            continue
        rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        plan = aot_stages(graph, rg, examples, times, cache)
        digest(f"forward {graph.name}", plan.partition.forward)
        digest(f"backward {graph.name}", plan.partition.backward)
        compile_stages(_on_target(plan.partition.forward), times, triton, cache)
        compile_stages(_on_target(plan.partition.backward), times, triton, cache)
    if triton:
        times["triton_pool"] = pool_makespan([r[0] for r in SLOWEST[first_compile:]], Options.workers)
    return times


def _on_target(graph: Any) -> Any:
    """``graph`` moved to ``--retarget``'s device, for inductor. (After aot, not before: its
    decompositions run real layout calls on the graph's device, which a CPU build lacks.)"""
    if not Options.retarget:
        return graph
    from torchfuse.autograd.joint import retarget_device

    return retarget_device(graph, "cpu", Options.retarget)


def _keep(g: Any, ex: Sequence[Any]) -> Callable[..., Any]:
    return lambda *a: None  # the halves are compiled (and timed) by compile_stages


def aot_stages(graph: Any, rg: tuple[bool, ...], examples: Sequence[Any], times: dict[str, float],
               cache: bool) -> Any:
    """autograd's training plan for ``graph``, its stages added to ``times``."""
    from torchfuse.autograd import aot
    from torchfuse.graph.collector import gc_paused

    fn = aot(graph, _keep, _keep)
    with gc_paused():  # aot holds it around functionalize and the plan in the real path
        _timed(times, "aot.functionalize", lambda: fn.functional)
        plan = fn.plan(rg, True, fn.sizes_key(examples))
    for stage in fn.stages[1:]:
        name = "aot." + stage.name.split(".")[0]
        times[name] = times.get(name, 0.0) + stage.seconds
    if cache:
        from torchfuse.inductor.cache import PlanCache

        def plan_through_cache() -> None:
            cached = aot(graph, _keep, _keep, cache=PlanCache())
            with gc_paused():
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


# ----------------------------------------------------------------------------- --real / --warm

REAL_MARK = "COMPILE_PROFILE_REAL "
REAL_COLUMNS = ("capture", "aot", "inductor", "inductor.cache_lookup", "runtime.load", "runtime.wait",
                "runtime.choose", "runtime.precompile", "runtime.tune", "runtime.generate", "runtime.run",
                "runtime.background", "runtime.later")
OVERLAPPING = ("runtime.background", "runtime.later")
"""Stages that ran beside the others (a backward's compiles during the forward): shown, but
not in the ``stages`` sum, whose time they overlap (``runtime.wait`` is what they added)."""
"""Stage groups of a real first call (a recorded stage counts in the most specific one)."""
REAL_COUNTS = ("capture.from_disk",
               "runtime.triton_compiles", "runtime.triton_cache_hits", "inductor.cache.program_hits",
               "inductor.cache.program_misses", "aot.cache.hits", "aot.cache.misses", "runtime.kernels",
               "runtime.handles_kept")


def real_first_call(row: Row, device: str, scale: str, eager_first: bool = True,
                    prof: cProfile.Profile | None = None) -> dict[str, Any]:
    """Compile ``row`` with the inductor backend and call it once; what its entries recorded.
    ``tuned_s``: from the same start until a second call returned, made once the background
    compiles were done (`torchfuse.runtime.wait_for_background`): when tuning deferred past
    the first call is over (on the CPU, which tunes nothing, the first call's time).

    ``eager_first``: one eager step before, untimed, as ``models.py`` runs eager before the
    compilers: the model's own first-use costs (``transformers`` imports modules lazily on a
    first forward: 0.5-1.3 s of small Llama's first call) are not the compiler's. Then one full
    collection, untimed: the objects those imports left would otherwise make the compiled
    call's first collection a full one (0.3-0.6 s in a warm small-Llama process, where the
    warm compile itself adds some 36k tracked objects to 394k). ``prof`` profiles the
    compiled first call."""
    import torch
    import torchfuse.capture as tf
    from torchfuse.graph import observe
    from torchfuse.runtime import wait_for_background

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    fn, step = row.build(device, scale)
    t1 = time.perf_counter()
    if eager_first:
        step(fn)
    sync()
    gc.collect()
    setup = {"build": t1 - t0, "eager": time.perf_counter() - t1}
    # every entry keeps its stages and counts while this runs, and renders no debug text
    # (graph.py, guards.txt, IR dumps: what a real first call without TORCHFUSE_DEBUG skips)
    with observe.collect(artifacts=False):
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        compiled = tf.compile(fn)
        step(compiled)
        sync()
        seconds = time.perf_counter() - t0
        if prof:
            prof.disable()
        tuned = seconds
        if device.startswith("cuda"):  # the CPU tunes nothing: no second step to take there
            # until tuned: tuning deferred past the first call (the runtime's autotune_later)
            # waits for its candidates' background compiles, then the second call tunes
            wait_for_background()
            step(compiled)
            sync()
            tuned = time.perf_counter() - t0
        stages: dict[str, float] = {}
        counts: dict[str, int] = {}
        for graph in observe.timed_graphs():
            st, ct = observe.timings_of(graph)
            for k, v in st.items():
                group = _real_group(k.removeprefix("backward."))
                stages[group] = stages.get(group, 0.0) + v
                if group == "runtime.later":  # and its phases, kept in the JSON (not the table)
                    phase = k.removeprefix("backward.")
                    stages[phase] = stages.get(phase, 0.0) + v
            for k, v in ct.items():
                k = k.removeprefix("backward.")
                counts[k] = counts.get(k, 0) + v
    return {"first_call_s": seconds, "tuned_s": tuned, "stages_s": stages, "counts": counts,
            "setup_s": setup}


def _real_group(stage: str) -> str:
    for col in sorted(REAL_COLUMNS, key=len, reverse=True):
        if stage == col or stage.startswith(col + "."):
            return col
    return stage.split(".")[0]


def real_child(args: argparse.Namespace) -> int:
    """One row's real first call in this (fresh) process, printed as one JSON line."""
    import torch
    import torchfuse.capture as tf

    (row,) = select_rows(args)
    t0 = time.perf_counter()
    x = torch.ones(8, device=args.device)
    tf.compile(lambda t: t * 2 + 1)(x)  # imports and first-use costs paid, as in run.py
    tf.reset()
    setup = {"imports": t0 - STARTED, "warm_up": time.perf_counter() - t0}
    prof: Any = cProfile.Profile() if args.cprofile else None
    if args.torch_profile:
        prof = _TorchProfile(args.device)
    scale = "small" if args.small else "full"
    result = real_first_call(row, args.device, scale, not args.no_eager_first, prof)
    result["setup_s"] = {**setup, **result.get("setup_s", {})}
    print(REAL_MARK + json.dumps(result), flush=True)
    if isinstance(prof, _TorchProfile):
        print(prof.table(args.torch_profile), flush=True)
    elif prof:
        if args.pstats:
            prof.dump_stats(args.pstats)
        for order, n in (("tottime", args.cprofile), ("cumulative", args.cprofile * 2)):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(order).print_stats(n)
            print(out.getvalue(), flush=True)
    return 0


class _TorchProfile:
    """``torch.profiler`` with cProfile's ``enable``/``disable``, for `real_first_call`."""

    def __init__(self, device: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        self.prof = profile(activities=acts)

    def enable(self) -> None:
        self.prof.start()

    def disable(self) -> None:
        self.prof.stop()

    def table(self, n: int) -> str:
        return self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=n)


def child_env(args: argparse.Namespace, root: str, gc_pause: str) -> dict[str, str]:
    """A child's environment: fresh caches under ``root``, the CPU kernels asked for, the
    collector's pause on or off."""
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=os.path.join(root, "torchfuse"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"),
               TORCHFUSE_GC_PAUSE="1" if gc_pause == "on" else "0")
    if not args.device.startswith("cuda"):
        env["TORCHFUSE_CPU_BACKEND"] = args.cpu_backend
        if args.cpu_backend == "triton":
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
    return env


def _min_cells(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The minimum of every cell over repeated runs of one row (counts: the first run's)."""
    stages: dict[str, float] = {}
    for r in runs:
        for k, v in r["stages_s"].items():
            stages[k] = min(stages.get(k, v), v)
    return {"first_call_s": min(r["first_call_s"] for r in runs),
            "tuned_s": min(r.get("tuned_s", float("inf")) for r in runs), "stages_s": stages,
            "counts": runs[0]["counts"], "runs": len(runs), "setup_s": runs[0].get("setup_s", {})}


def child_rows(rows: list[Row], args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Each row (under each ``--gc-pause`` setting) cold -- and with ``--warm`` then warm --
    in fresh processes over one fresh cache directory, ``--repeat`` times, min per cell."""
    from run import _pin_ptxas

    _pin_ptxas()  # one ptxas for both children (Triton keys its cache by its version)
    phases = ("cold", "warm") if args.warm else ("cold",)
    settings = [g.strip() for g in args.gc_pause.split(",") if g.strip()]
    out = []
    for row in rows:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--device", args.device,
               *row_flags(row)]
        cmd += ["--small"] if args.small else []
        cmd += ["--no-eager-first"] if args.no_eager_first else []
        for gc_pause in settings:
            label = row.name if settings == ["on"] else f"{row.name} gc={gc_pause}"
            runs: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
            for rep in range(args.repeat):
                env = child_env(args, tempfile.mkdtemp(prefix="torchfuse_profile_warm_"), gc_pause)
                for phase in phases:
                    dump = ["--pstats", f"{args.pstats}.{row.name.replace('/', '_')}"] if args.pstats else []
                    last = phase == phases[-1] and rep == args.repeat - 1
                    profiled = ["--cprofile", str(args.cprofile), *dump] if args.cprofile and last else []
                    if args.torch_profile and last:
                        profiled += ["--torch-profile", str(args.torch_profile)]
                    result = _run_child([*cmd, *profiled], env, args.timeout, f"{label} {phase}")
                    if result is None:
                        break
                    runs[phase].append(result)
            out += [(f"{label} {p}", _min_cells(r)) for p, r in runs.items() if r]
    return out


def _run_child(cmd: list[str], env: dict[str, str], timeout: float, label: str) -> dict[str, Any] | None:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{label}: timed out after {timeout:.0f} s", file=sys.stderr)
        return None
    wall = time.perf_counter() - t0
    lines = proc.stdout.splitlines()
    found = [k for k, line in enumerate(lines) if line.startswith(REAL_MARK)]
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"{label}: failed: {' | '.join(tail)}", file=sys.stderr)
        return None
    result = json.loads(lines[found[0]][len(REAL_MARK):])
    setup = ", ".join(f"{k} {v:.1f}" for k, v in result.get("setup_s", {}).items())
    print(f"{label}: {result['first_call_s']:.2f} s (process {wall:.1f} s: {setup}; "
          f"until tuned {result.get('tuned_s', 0.0):.1f})", file=sys.stderr, flush=True)
    rest = "\n".join(lines[found[0] + 1:]).strip()
    if rest:  # the child's profile tables
        print(f"--- {label}: profile of the first call\n{rest}\n")
    return result


def print_real_table(rows: list[tuple[str, dict[str, Any]]]) -> None:
    cols = [c for c in REAL_COLUMNS if any(c in r["stages_s"] for _, r in rows)]
    extra = sorted({k for _, r in rows for k in r["stages_s"]
                    if not k.startswith("runtime.later.")} - set(cols))
    counts = [c for c in REAL_COUNTS if any(c in r["counts"] for _, r in rows)]
    short = {"capture.from_disk": "cap.kept",
             "runtime.triton_compiles": "tr.comp", "runtime.triton_cache_hits": "tr.hit",
             "inductor.cache.program_hits": "prog hit", "inductor.cache.program_misses": "prog miss",
             "aot.cache.hits": "aot hit", "aot.cache.misses": "aot miss", "runtime.kernels": "kernels",
             "runtime.handles_kept": "kept"}
    head = ["row", "first call", *cols, *extra, "stages", *(short[c] for c in counts)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, r in rows:
        st = r["stages_s"]
        cells = [f"{st[c] * 1e3:.0f}" if c in st else "" for c in [*cols, *extra]]
        cnt = [str(r["counts"].get(c, "")) for c in counts]
        serial = sum(v for k, v in st.items() if k not in OVERLAPPING and not k.startswith("runtime.later."))
        print(f"| {name} | {r['first_call_s'] * 1e3:.0f} | " + " | ".join(cells)
              + f" | {serial * 1e3:.0f} | " + " | ".join(cnt) + " |")
    runs = max((int(r.get("runs", 1)) for _, r in rows), default=1)
    print("(milliseconds, forward and backward entries summed; first call = wall time of the step; "
          "runtime.run = the kernels' first run; runtime.background = a backward's compiles while the "
          "forward ran, not in 'stages', and runtime.wait = its first call waiting for them; "
          "runtime.later = the second call's tuning of what the first deferred, not in 'stages'; "
          "kept = handle keys a warm start launched from as an earlier process kept them, warming "
          "nothing up; cap.kept = entries rebuilt from what an earlier process captured, "
          "interpreting nothing"
          + (f"; the minimum of {runs} runs per cell" if runs > 1 else "") + ")")
    pairs: dict[str, dict[str, tuple[float, float]]] = {}
    for name, r in rows:
        base, _, phase = name.rpartition(" ")
        compile_side = sum(v for k, v in r["stages_s"].items() if k != "runtime.run" and k not in OVERLAPPING
                           and not k.startswith("runtime.later."))
        pairs.setdefault(base, {})[phase] = (r["first_call_s"], compile_side)
    for base, p in pairs.items():
        if "cold" in p and "warm" in p and p["cold"][0] and p["cold"][1]:
            print(f"{base}: warm / cold = {p['warm'][0] / p['cold'][0]:.1%} of the first call, "
                  f"{p['warm'][1] / p['cold'][1]:.1%} of the stages before runtime.run")


def add_row_arguments(p: argparse.ArgumentParser) -> None:
    """The row options of the scripts that run rows in child processes (``compile_targets``,
    ``triton_compile_times``): ``--only``, ``--models``, ``--model-modes``, ``--small``."""
    p.add_argument("--only", default="", help="comma-separated workloads of workloads.py, or 'all'")
    p.add_argument("--models", default="", help="comma-separated models of models.py, or 'all'")
    p.add_argument("--model-modes", default="inference,training", help="with --models: inference, training")
    p.add_argument("--small", action="store_true", help="tiny shapes instead of the full ones")


def row_flags(row: Row) -> list[str]:
    """The command-line words that select ``row`` alone, for a child process."""
    if "/" in row.name:
        model, mode = row.name.split("/")
        return ["--models", model, "--model-modes", mode]
    return ["--only", row.name]


def select_rows(args: argparse.Namespace) -> list[Row]:
    """The ``--only`` workloads (``all``: every one), then the ``--models`` rows; neither
    named: every workload."""
    only = [n for n in args.only.split(",") if n]
    micro = [] if args.models and not only else workload_rows([] if only == ["all"] else only)
    if args.models:
        return micro + model_rows(args.models, args.model_modes)
    return micro


SLOWEST: list[tuple[float, str, dict[str, Any], int]] = []
"""Every Triton compile of the run: (seconds, kernel, constexprs, warps), for ``--slowest``."""

NOT_SECONDS = ("kernels", "compiles", "cache_hit", "triton_max", "triton_pool")
COLUMNS = ("capture", "aot.functionalize", "aot.joint_graph", "aot.decompose", "aot.cse", "aot.partition",
           "layout", "decompose", "matmuls", "conv", "lower", "dead_code", "schedule", "combo", "codegen",
           "combo_kernels", "plan", "user_kernels", "in_place", "meta", "load", "callgen",
           "triton", "triton_max", "triton_pool", "cache_hit")


def print_table(rows: list[tuple[str, dict[str, float]]]) -> None:
    # the stages COLUMNS does not name (passes added to the pipeline since) still count
    extra = sorted({k for _, t in rows for k in t} - set(COLUMNS) - set(NOT_SECONDS))
    cols = [c for c in COLUMNS if any(c in t for _, t in rows)] + extra
    head = ["workload", *[c.removeprefix("aot.") if c.startswith("aot.") else c for c in cols], "total", "k"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, t in rows:
        total = sum(t.get(c, 0.0) for c in cols if c not in ("cache_hit", "triton_max", "triton_pool"))
        cells = [f"{t[c] * 1000:.0f}" if c in t else "" for c in cols]
        k = f"{int(t.get('kernels', 0))}" + (f"/{int(t['compiles'])}" if "compiles" in t else "")
        print(f"| {name} | " + " | ".join(cells) + f" | {total * 1000:.0f} | {k} |")
    print("(milliseconds; k = kernels generated / Triton compiles a cold first call runs"
          + (f"; triton_pool = those compiles over {Options.workers} workers, longest first"
             if any("triton_pool" in t for _, t in rows) else "") + ")")


def _set_gc_pause(setting: str) -> None:
    """``TORCHFUSE_GC_PAUSE`` for the compiles that follow in this process."""
    from torchfuse.graph import observe

    if setting not in ("on", "off"):
        raise SystemExit(f"--gc-pause: {setting!r}; use on, off or on,off")
    os.environ["TORCHFUSE_GC_PAUSE"] = "1" if setting == "on" else "0"
    observe.reload_config()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.real or args.warm or args.child:
        sys.path.insert(0, str(HERE))
        if args.child:  # the parent set the environment (`child_env`)
            return real_child(args)
        print_real_table(child_rows(select_rows(args), args))
        return 0
    if args.triton:
        os.environ.pop("TRITON_INTERPRET", None)  # real JITFunctions for triton.compile
        # a fresh Triton cache: every compile is a cold one
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchfuse_profile_triton_")
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TORCHFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="torchfuse_profile_"))
    sys.path.insert(0, str(HERE))
    import torch

    if args.triton:
        # The runtime refuses CPU programs without the interpreter; load through a stub.
        import torchfuse.runtime.program as rp

        rp.triton_interpreting = lambda: True  # type: ignore[assignment]
    selected = select_rows(args)
    scale = "small" if args.small else "full"
    torch.manual_seed(0)
    # Warm-up: imports and first-use costs (sympy caches, op schemas) paid before timing.
    profile_workload(workload_rows(["seed_fn_1k"])[0], "small", False, False)
    Options.retarget, Options.hashing, Options.workers = args.retarget, bool(args.hashes), args.workers
    Options.hashes.clear()  # the warm-up's
    prof = cProfile.Profile() if args.cprofile else None
    rows = []
    settings = [g.strip() for g in args.gc_pause.split(",") if g.strip()]
    for wl in selected:
        for gc_pause in settings:
            _set_gc_pause(gc_pause)
            label = wl.name if settings == ["on"] else f"{wl.name} gc={gc_pause}"
            runs = []
            for _ in range(args.repeat):
                try:
                    if prof:
                        prof.enable()
                    runs.append(profile_workload(wl, scale, args.triton, args.cache))
                except Exception as e:  # keep going: one failing workload must not hide the others
                    print(f"{label}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                    break
                finally:
                    if prof:
                        prof.disable()
                spent = sum(v for k, v in runs[-1].items() if k not in NOT_SECONDS)
                print(f"{label}: {spent:.2f} s", file=sys.stderr, flush=True)
            if runs:
                rows.append((label, {k: min(r.get(k, float("inf")) for r in runs) for k in runs[0]}))
    _set_gc_pause("on")
    print_table(rows)
    if args.hashes:
        Path(args.hashes).write_text(json.dumps(Options.hashes, indent=0) + "\n")
        print(f"{len(Options.hashes)} hashes written to {args.hashes}")
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
