"""``compile_graph``: the inductor pipeline, one flat list of named passes.

    layout -> decompose -> matmuls -> conv -> lower -> dead_code -> schedule (fusion, verified) -> combo
    -> codegen -> combo_kernels -> plan -> user_kernels -> in_place

Every pass returns a new artifact stamped with its name and duration (`Stage`);
the debug files (``ir_pre_fusion.txt``, ``ir_post_fusion.txt``, ``fusion.txt`` (each fusion
decision and, for a node kept out of a kernel it shares reads with, why), ``output_code.py``,
``timings.txt``) are just these artifacts printed, kept in ``Program.meta`` and written by
`write_debug`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from torchfuse.autograd import DecompositionError, decompose
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.kernel_source import mark_trusted
from torchfuse.graph.observe import Stage
from torchfuse.inductor import ir
from torchfuse.inductor.cache import graph_device
from torchfuse.inductor.codegen import generate_kernel
from torchfuse.inductor.combo import combo_kernels, plan_combos
from torchfuse.inductor.config import InductorConfig, cpu_kernels
from torchfuse.inductor.config import config as default_config
from torchfuse.inductor.conv import rewrite_convolution_graphs
from torchfuse.inductor.cpp_codegen import generate_kernel as cpp_kernel
from torchfuse.inductor.decompositions import DECOMPOSITIONS, DECOMPOSITIONS_BN_TRAINING
from torchfuse.inductor.inplace import write_in_place
from torchfuse.inductor.kernel_groups import KERNEL_KINDS
from torchfuse.inductor.layout import layout_pass
from torchfuse.inductor.lowering import lower
from torchfuse.inductor.pad_mm import pad_matmuls
from torchfuse.inductor.plan import build_program
from torchfuse.inductor.rules import RULE_MODULES as RULE_MODULES  # registers every lowering rule
from torchfuse.inductor.scheduler import (
    dead_code_elimination,
    format_decisions,
    format_schedule,
    schedule,
    verify_schedule,
)
from torchfuse.inductor.templates import apply_mm_templates
from torchfuse.inductor.user_kernels import launch_user_kernels
from torchfuse.runtime.cpp import vouch
from torchfuse.runtime.standalone import standalone_source

DEBUG_FILES = ("ir_pre_fusion.txt", "ir_post_fusion.txt", "fusion.txt", "output_code.py", "timings.txt",
               "fallbacks.txt")
"""The debug artifacts a compile keeps in ``Program.meta`` and ``write_debug`` writes."""


def _vouch(program: S.Program) -> None:
    """``program``'s kernels are this user's own code: compiled by this process, or read back
    from the user's own compile cache (inside the user's trust boundary already; see the trust
    model in the format docs). Its C++ kernels then run without ``trust_code``
    (`torchfuse.runtime.cpp.vouch`) and its Triton sources are imported without the AST check
    (`torchfuse.graph.kernel_source.mark_trusted`), which was 1-1.5 ms a kernel of a warm
    start on the GPU machine (ResNet-18 inference: 36 of about 250 ms). The same bytes from
    anywhere are the same code; any other source is checked as always."""
    vouch(program)
    for kernel in program.kernels:
        if kernel.language == "triton":
            mark_trusted(kernel.source)


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What [`compile_graph_stages`][torchfuse.inductor.compile_graph_stages] returns: the
    Program and every pass's output, in pipeline order."""

    program: S.Program
    stages: tuple[Stage, ...]

    @property
    def artifacts(self) -> dict[str, str]:
        return {k: self.program.meta[k] for k in DEBUG_FILES if k in self.program.meta}

    def write_debug(self, directory: str | os.PathLike) -> list[str]:
        return write_debug(self.program, directory)


DECOMPOSE_NOTE = "inductor.decompose"
"""``Graph.meta`` key under which `_decompose` says why a symbolic graph was compiled
undecomposed (it ends up in ``fallbacks.txt``)."""


def decomposes_batch_norm(graph: S.Graph, cfg: InductorConfig) -> bool:
    """Whether ``graph``'s training batch norms become our reductions
    (``InductorConfig.batch_norm_training``; ``"auto"``: when the graph runs on a CUDA device)."""
    if cfg.batch_norm_training != "auto":
        return cfg.batch_norm_training == "decompose"
    return any(v.device.startswith("cuda") for v in graph.values.values())


def _decompose(graph: S.Graph, cfg: InductorConfig) -> S.Graph:
    if not cfg.decompose:
        return graph
    # autograd owns the one retracing decompose(); the table of inductor's primitives is ours
    table = DECOMPOSITIONS_BN_TRAINING if decomposes_batch_norm(graph, cfg) else DECOMPOSITIONS
    if not _is_symbolic(graph):
        return decompose(graph, table)
    try:
        out = decompose(graph, table)
    except DecompositionError as e:  # the graph as captured is a correct fallback (see below)
        why = f"decompose failed on symbolic sizes ({type(e).__name__}: {e})"
    else:
        why = _lost_generality(graph, out)
        if why is None:
            return out
    # The undecomposed graph is right at every size (ops without a lowering are extern
    # calls); a decomposed one that specialized a size, or that needs a relation nobody
    # checks at run time, would be wrong at other sizes. Said in fallbacks.txt, and logged.
    observe.get_logger("schedule").warning("graph %s compiled without decomposition: %s", graph.name, why)
    return msgspec.structs.replace(graph, meta={**graph.meta, DECOMPOSE_NOTE: why})


def _is_symbolic(graph: S.Graph) -> bool:
    return bool(graph.symbols) or any(isinstance(s, str) for m in graph.values.values() for s in m.sizes)


def _lost_generality(before: S.Graph, after: S.Graph) -> str | None:
    """Why ``after`` (a decomposition of symbolic ``before``) is not valid at every size
    ``before`` is, or None when it is: the same symbols and ranges, the same input and output
    sizes, and no size guard of its own (nothing would check it when the Program runs)."""
    def ranges(g: S.Graph) -> set[tuple]:
        return {(s.name, s.min, s.max, s.source) for s in g.symbols}

    if ranges(before) != ranges(after):
        return f"the symbols changed from {sorted(ranges(before))} to {sorted(ranges(after))}"
    pairs = [(i.name, j.name) for i, j in zip(before.inputs, after.inputs, strict=True)]
    pairs += [(o.value.name, p.value.name) for o, p in zip(before.outputs, after.outputs, strict=True)
              if isinstance(o.value, S.TensorRef) and isinstance(p.value, S.TensorRef)]
    for name, new_name in pairs:  # outputs may be renamed; they keep their positions
        was, now = before.values[name], after.values[new_name]
        if (was.sizes, was.strides) != (now.sizes, now.strides):
            return f"{name} changed from {(was.sizes, was.strides)} to {(now.sizes, now.strides)}"
    old = {g.expr for g in before.guards if isinstance(g, S.SymbolGuard)}
    new = sorted(g.expr for g in after.guards if isinstance(g, S.SymbolGuard) and g.expr not in old)
    if new:
        return f"it added size guards {new}"
    return None


def _rewrite_matmuls(st: dict[str, Any], cfg: InductorConfig) -> S.Graph:
    """Matmul rewrites on the decomposed graph: Triton templates with fused epilogues where
    they beat cuBLAS (``max-autotune`` only; the benchmark compiles its candidates in default
    mode, which is what keeps it from recursing), then padding of unaligned half-precision
    CUDA matmuls (`.pad_mm`) for the ones left to cuBLAS."""
    graph = st["decompose"]
    if st["mode"] == "max-autotune" and cfg.mm_templates != "never":
        graph = apply_mm_templates(graph, device=graph_device(graph), policy=cfg.mm_templates,
                                   compile_candidate=compile_candidate)
    return pad_matmuls(graph) if cfg.pad_mm else graph


def compile_candidate(graph: S.Graph, device: str) -> Callable[..., Any]:
    """A matmul-template benchmark candidate compiled as default mode compiles it (no
    templates inside, which is what keeps the benchmark from recursing) and loaded by the
    runtime: handed to the templates pass, which never imports this pipeline."""
    import torch
    from torchfuse.runtime import load

    return load(compile_graph(graph, mode="default"), device=torch.device(device).type)


def _config(options: dict | None) -> tuple[InductorConfig, str]:
    """The config of one compile, its ``cpu_backend`` resolved (`cpu_kernels`: ``"auto"``
    becomes ``"cpp"`` or ``"triton"``, so the cache key names what was generated), and why."""
    cfg = default_config.with_options(options)
    backend, why = cpu_kernels(cfg)
    return dataclasses.replace(cfg, cpu_backend=backend), why


def _is_cpu(device: str) -> bool:
    return device.split(":")[0] == "cpu"


def _codegen(sched, prog: ir.LoopProgram, cfg: InductorConfig) -> dict[int, S.Kernel]:
    # the CPU's C++ kernels come from the same groups (`.cpp_codegen`); Triton elsewhere
    gen = cpp_kernel if cfg.cpu_backend == "cpp" and _is_cpu(prog.device) else generate_kernel
    return {g.index: gen(g, prog, cfg) for g in sched.groups if g.kind in KERNEL_KINDS}


PASSES: tuple[tuple[str, Callable[..., Any]], ...] = (
    # channels-last per graph: before decompose, whose rules then see the new layout
    ("layout", lambda st, cfg: layout_pass(st["graph"], cfg.channels_last)),
    ("decompose", lambda st, cfg: _decompose(st["layout"], cfg)),
    # needs decomposed ops (addmm -> mm + add, gelu -> erf ...); before lowering
    ("matmuls", _rewrite_matmuls),
    # batch norms folded into convolutions, half-precision biases back into their matmuls
    ("conv", lambda st, cfg: rewrite_convolution_graphs(st["matmuls"], cfg.conv_rewrites)),
    ("lower", lambda st, cfg: ir.verify(lower(st["conv"], cfg))),
    # dead code goes after lowering: decompositions return values (mean, rstd) nobody reads
    ("dead_code", lambda st, cfg: ir.verify(dead_code_elimination(st["lower"]))),
    ("schedule", lambda st, cfg: verify_schedule(schedule(st["dead_code"], cfg), st["dead_code"])),
    # independent small pointwise kernels adjacent (members moved up), for one launch each run
    ("combo", lambda st, cfg: plan_combos(st["schedule"], st["dead_code"], cfg)),
    ("codegen", lambda st, cfg: _codegen(st["combo"], st["dead_code"], cfg)),
    # from the members' generated kernels: each keeps its body, under a branch of its own
    ("combo_kernels", lambda st, cfg: combo_kernels(st["combo"], st["codegen"])),
    ("plan", lambda st, cfg: build_program(st["dead_code"], st["combo"], st["codegen"], st["combo_kernels"])),
    ("user_kernels", lambda st, cfg: launch_user_kernels(st["plan"])),  # needs the plan's frees
    # an ATen training batch norm's running statistics updated in the inputs themselves (needs
    # the graph's output kinds: which outputs are the new values of which inputs); not under
    # reduce-overhead, whose CUDA graphs cannot replay a Program that writes its inputs
    ("in_place", lambda st, cfg: st["user_kernels"] if st["mode"] == "reduce-overhead"
     else write_in_place(st["user_kernels"], st["graph"])),
)
"""The pipeline, in order. Each entry reads earlier artifacts by pass name."""


def compile_graph_stages(
    graph: S.Graph,
    example_inputs: Sequence[Any] | None = None,
    *,
    mode: str = "default",
    options: dict | None = None,
) -> CompileResult:
    """Run the pipeline and keep every stage (see `compile_graph`)."""
    cfg, why = _config(options)
    if mode not in ("default", "max-autotune", "reduce-overhead"):
        raise ValueError(f"unknown mode {mode!r}: use 'default', 'max-autotune' or 'reduce-overhead'")
    state: dict[str, Any] = {"graph": graph, "mode": mode}
    stages: list[Stage] = []
    for name, fn in PASSES:
        t0 = time.perf_counter()
        state[name] = fn(state, cfg)
        stages.append(Stage(name, time.perf_counter() - t0, state[name]))
    program: S.Program = state["in_place"]
    pre = ir.format_program(state["dead_code"])
    post = format_schedule(state["combo"])
    code = standalone_source(program)  # the runtime's own call function: what prints is what runs
    timings = "\n".join(f"{s.name:12s} {s.seconds * 1000:9.2f} ms" for s in stages)
    meta = dict(program.meta)
    # which code generator wrote the kernels, and why: the first line of fusion.txt, and logged
    kernels = (f"kernels: {cfg.cpu_backend} ({why})" if _is_cpu(program.device)
               else f"kernels: triton (device {program.device})")
    note = state["decompose"].meta.get(DECOMPOSE_NOTE)
    if note:
        meta["fallbacks"] = "\n".join(x for x in (f"decompose: {note}", meta.get("fallbacks", "")) if x)
    meta.update(
        {
            "ir_pre_fusion.txt": pre,
            "ir_post_fusion.txt": post,
            "fusion.txt": f"{kernels}\n" + format_decisions(state["combo"]),
            "kernels": kernels.removeprefix("kernels: "),
            "output_code.py": code,
            "timings.txt": timings + "\n",
            "fallbacks.txt": meta.get("fallbacks", ""),
            "timings_ms": json.dumps({s.name: round(s.seconds * 1000, 3) for s in stages}),
            "mode": mode,
        }
    )
    program = msgspec.structs.replace(program, meta=meta)
    _vouch(program)  # its kernels are ours: the runtime imports and runs them unchecked
    observe.get_logger("schedule", force="schedule" in cfg.logs).info("graph %s: %s", graph.name, kernels)
    if "schedule" in cfg.logs:
        observe.get_logger("schedule", force=True).info("%s", post)
        observe.get_logger("schedule", force=True).info("fusion decisions:\n%s", meta["fusion.txt"])
    if "output_code" in cfg.logs:
        observe.get_logger("output_code", force=True).info("%s", code)
    for st in stages:
        observe.record_time(f"inductor.{st.name}", st.seconds)
    _publish(program, graph.name, cfg)
    return CompileResult(program, tuple(stages))


def _publish(program: S.Program, graph_name: str, cfg: InductorConfig) -> None:
    """Hand the debug files to ``torchfuse_debug/run_<time>/<graph>/`` and to artifact
    collectors (`torchfuse.graph.observe`); an explicit ``debug_dir`` option without the
    global switch writes there instead."""
    if observe.wants_artifacts():
        for name in DEBUG_FILES:
            # observe writes the entry's timings.txt itself, every package's stages in it
            if name in program.meta and name != "timings.txt":
                observe.emit(name, program.meta[name], fallback_name=graph_name)
    elif cfg.debug:
        write_debug(program, os.path.join(cfg.debug_dir, f"{graph_name}_{time.strftime('%Y%m%d_%H%M%S')}"))


def compile_graph(
    graph: S.Graph,
    example_inputs: Sequence[Any] | None = None,
    *,
    mode: str = "default",
    options: dict | None = None,
    functionalize: bool = False,
    on_miss: Callable[[], None] | None = None,
) -> S.Program:
    """Compile a functional Graph into a Program of Triton kernels and a launch plan.

    Results are cached on disk by the graph, ``mode`` and options (see
    ``torchfuse.inductor.cache``): a graph compiled before, by any process, is loaded instead
    of compiled. ``functionalize=True`` takes a graph that may write into its intermediates
    and functionalizes it (``torchfuse.autograd.functionalize``) before the passes, only
    when the cache misses: the key is the graph's as given, so a hit skips functionalization
    too. [`compile_graph_stages`][torchfuse.inductor.compile_graph_stages] always runs
    the passes and keeps each one's output.

    Args:
        graph: A functional graph (no in-place or view ops: run it through
            ``torchfuse.autograd.functionalize`` first, as the ``inductor`` backend does).
        example_inputs: Accepted for the backend protocol; sizes come from the graph.
        mode: ``"default"``, ``"max-autotune"`` (Triton matmul templates with fused
            epilogues, autotuned) or ``"reduce-overhead"`` (the runtime replays CUDA graphs).
        options: Overrides of [`InductorConfig`][torchfuse.inductor.InductorConfig] fields,
            e.g. ``{"persistent_rnumel_max": 1024}``.
        functionalize: ``graph`` may have mutations; functionalize it first when it does.
        on_miss: Called once before the passes run, when no cached Program serves (the
            ``inductor`` backend starts the runtime's compile workers then, for a GPU graph:
            they get ready while the passes run).

    Returns:
        The [`Program`][torchfuse.graph.Program]. Its ``meta`` keeps the debug artifacts
        under the names in ``DEBUG_FILES`` (``ir_pre_fusion.txt``, ``ir_post_fusion.txt``,
        ``output_code.py``, …); [`write_debug`][torchfuse.inductor.write_debug] writes them.

    Raises:
        ValueError: An unknown ``mode``.
        TypeError: An option that is not an ``InductorConfig`` field.
        LoweringError: An op with no lowering; the message names the node.

    Examples:
        >>> import torch
        >>> from torchfuse.graph import trace
        >>> from torchfuse.inductor import compile_graph
        >>> graph, _ = trace(lambda x: (x + 1).relu().sum(dim=1), torch.randn(4, 8))
        >>> program = compile_graph(graph, options={"cache": False})
        >>> [k.name for k in program.kernels]
        ['cpp_per_fused_add_relu_sum_0']
    """
    cfg, _ = _config(options)
    if not cfg.cache:
        if on_miss is not None:
            on_miss()
        graph = _functional(graph) if functionalize else graph
        return compile_graph_stages(graph, example_inputs, mode=mode, options=options).program
    from torchfuse.inductor import cache

    t0 = time.perf_counter()
    key = cache.program_key(graph, mode=mode, cfg=cfg)
    program = cache.lookup_program(key)
    observe.record_time("inductor.cache_lookup", time.perf_counter() - t0)
    observe.record_count(f"inductor.cache.program_{'hits' if program is not None else 'misses'}")
    if program is not None:
        _vouch(program)  # the user's own cache: as much ours as a Program compiled now
        _publish(program, graph.name, cfg)
        return program
    if on_miss is not None:
        on_miss()
    functional = _functional(graph) if functionalize else graph
    program = compile_graph_stages(functional, example_inputs, mode=mode, options=options).program
    t0 = time.perf_counter()
    cache.store_program(key, program)
    observe.record_time("inductor.cache_store", time.perf_counter() - t0)
    return program


def _functional(graph: S.Graph) -> S.Graph:
    from torchfuse.autograd.functionalize import functionalize, has_mutations

    if not has_mutations(graph):
        return graph
    t0 = time.perf_counter()
    out = functionalize(graph)
    observe.record_time("inductor.functionalize", time.perf_counter() - t0)
    return out


def write_debug(program: S.Program, directory: str | os.PathLike) -> list[str]:
    """Write the debug artifacts kept in ``program.meta`` into ``directory``."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name in DEBUG_FILES:
        if name in program.meta:
            path = os.path.join(directory, name)
            with open(path, "w") as f:
                f.write(program.meta[name])
            written.append(path)
    return written
