"""``aot``: a Graph plus two compilers become one differentiable function.

The pipeline, per pattern of inputs that require grad::

    functionalize  -> mutations become outputs, view outputs marked (once per graph)
    joint_graph    -> primals + tangents -> outputs + gradients (eager autograd on fakes)
    decompose      -> smaller op set (the table is a parameter)
    cse            -> one node per distinct computation
    drop_unread    -> arguments a backward op ignores become None (`torchfuse.autograd.unread`)
    partition      -> forward graph (outputs + saved values) and backward graph
    fw_compiler    -> on the first call, with the real inputs as examples
    bw_compiler    -> on the first backward, with the saved values and tangents

With grad disabled, or when no input requires grad, the *inference path* skips the joint
graph: functionalize, decompose, and compile the forward only.

A graph with size symbols keeps them through every pass (the retraces run on fakes whose
sizes are ``SymInt`` objects), so one plan serves every size. A relation between sizes that a
pass depends on but the capture did not (a decomposition or a derivative formula branching on
``s0 > 4``) becomes a guard of the plan's graphs; each call checks those guards against the sizes bound
from its inputs, and when one fails a second plan is built from the call's sizes (the reason
is logged on the ``aot`` channel). Plans are tried in the order they were built.

A *compiler* is ``compiler(graph, example_inputs) -> callable(*inputs) -> list``; the
reference one is ``lambda g, ex: functools.partial(torchfuse.graph.run, g)``.

With a *plan cache* (``aot(..., cache=)``, any object with the methods of `PlanCache`;
the inductor backend passes an on-disk one), a training plan built once -- by this process or
another -- is read back instead of rebuilt: functionalize, joint graph, decompositions and
partition are skipped, and the forward and backward graphs are exactly those built the first
time. The key is the graph *before* functionalization (plus the requires-grad pattern and
the partition settings), so a hit runs no pass at all; functionalization runs only when a
plan is built (`AotFunction.functional` is computed on first use). The record keeps, beside
the two halves, the functional graph's *interface* (its inputs, outputs and their metadata,
no nodes): what the call needs to write mutated inputs back and re-make views of inputs. A
record read back is data from outside: one whose names do not fit the graph is reported as
invalid and the plan rebuilt.

``compile_backward_early=True`` (for compilers that need no example inputs, such as
inductor's) compiles the backward graph together with the forward, on the first call, and
calls the compiled backward's ``precompile_async()`` when it has one, so that its kernels are
built while the forward runs instead of after it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import torch
from torchfuse.autograd.common import (
    AutogradError,
    eliminate_common_subexpressions,
    format_graph,
    output_sources,
)
from torchfuse.autograd.config import config
from torchfuse.autograd.decompositions import DEFAULT_TABLE, Table, decompose
from torchfuse.autograd.functionalize import functionalize
from torchfuse.autograd.joint import joint_graph, tangent_index
from torchfuse.autograd.opclass import is_random
from torchfuse.autograd.output_views import alias_input, views_made_plain
from torchfuse.autograd.partition import Partition, Strategy, num_saved, partition
from torchfuse.autograd.unread import drop_unread_arguments
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.collector import gc_paused
from torchfuse.graph.expr import evaluate
from torchfuse.graph.interpreter import bind_symbols, device_types, no_autocast
from torchfuse.graph.observe import Stage
from torchfuse.graph.ops import to_dtype
from torchfuse.graph.torchfuse_ops import records_grad

Compiled = Callable[..., Sequence[Any]]
Compiler = Callable[[S.Graph, Sequence[Any]], Compiled]
"""What compiles one half of the partition: ``compiler(graph, example_inputs) -> callable``."""


class PlanCache(Protocol):
    """Where training plans are kept between processes (bytes in, bytes out).

    ``material`` identifies a plan (graph, requires-grad pattern, partition settings); the
    cache derives its key from it. ``invalid`` reports an entry that did not decode.
    """

    def get(self, material: bytes) -> bytes | None: ...

    def put(self, material: bytes, data: bytes) -> None: ...

    def invalid(self, material: bytes, reason: str) -> None: ...


class _PlanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a plan cache keeps of a training plan: the partition, and the interface of the
    functional graph it was cut from (`_interface`)."""

    interface: S.Graph
    forward: S.Graph
    backward: S.Graph
    saved: tuple[tuple[str, int], ...]
    recomputed: tuple[str, ...]
    strategy: str


class DoubleBackwardError(AutogradError):
    """Differentiating a compiled backward again (``create_graph=True`` then another grad)."""


@dataclass(slots=True)
class _Plan:
    """Everything compiled for one requires-grad pattern (and, for a graph with size symbols,
    every size that satisfies `guards`)."""

    training: bool
    functional: S.Graph
    """The functionalized graph this plan was built from (from a plan cache: its interface,
    the inputs and outputs without nodes)."""
    forward_graph: S.Graph
    forward: Compiled | None = None
    partition: Partition | None = None
    backward: Compiled | None = None
    tangent_of: dict[int, int] = field(default_factory=dict)
    """Forward output index -> position among the backward's tangent inputs."""
    grad_of: list[int] = field(default_factory=list)
    """For each backward output: the index of the input it is the gradient of."""
    grad_sources: list[frozenset[int]] = field(default_factory=list)
    """For each backward output: the positions among the tangent inputs it is computed from."""
    stages: list[Stage] = field(default_factory=list)
    guards: tuple[S.SymbolGuard, ...] = ()
    """Size relations the passes added (the input graph's own guards are the caller's to check)."""
    mutated_input_positions: list[int] = field(default_factory=list)
    """Positions of the inputs the graph writes (its ``mutated_input`` outputs, in order)."""

    def failing_guard(self, sizes: dict[str, int]) -> S.SymbolGuard | None:
        """The first of `guards` that ``sizes`` violate, else None."""
        for g in self.guards:
            if not evaluate(g.expr, sizes):
                return g
        return None


def _log(title: str, graph: S.Graph, artifact: str | None = None) -> None:
    """Log a graph under ``aot`` and hand it to the debug directory / artifact collectors as
    ``artifact`` (``joint.py``, ``forward.py``, ``backward.py``)."""
    if config.log_aot:
        observe.get_logger("aot", force=True).info("%s:\n%s", title, format_graph(graph))
    if artifact is not None and observe.wants_artifacts():
        from torchfuse.graph.printer import to_python

        observe.emit(artifact, to_python(graph))


def _log_text(text: str) -> None:
    if config.log_aot:
        observe.get_logger("aot", force=True).info("%s", text)


def _sizes_text(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(sizes.items())) or "(none)"


def _verify(stage: str, graph: S.Graph) -> None:
    if not config.verify_passes:
        return
    from torchfuse.graph.verify import verify

    try:
        verify(graph)
    except ValueError as e:
        raise AutogradError(f"pass {stage!r} produced an invalid graph: {e}") from e


def _flatten_outputs(graph: S.Graph) -> tuple[S.Graph, list[int]]:
    """One output per tensor: list outputs split; returns the list lengths (-1: not a list)."""
    outs: list[S.GraphOutput] = []
    spec: list[int] = []
    for o in graph.outputs:
        if isinstance(o.value, S.ListArg):
            spec.append(len(o.value.items))
            outs.extend(msgspec.structs.replace(o, value=item) for item in o.value.items)
        else:
            spec.append(-1)
            outs.append(o)
    return msgspec.structs.replace(graph, outputs=tuple(outs)), spec


class AotFunction:
    """The callable returned by `aot`; keeps every intermediate graph in `stages`."""

    def __init__(self, graph: S.Graph, fw_compiler: Compiler, bw_compiler: Compiler, *,
                 requires_grad: Sequence[bool] | None, decompositions: Table,
                 strategy: Strategy, memory_budget: float, cache: PlanCache | None = None,
                 compile_backward_early: bool = False) -> None:
        self.graph = graph
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler
        self.requires_grad = None if requires_grad is None else tuple(bool(r) for r in requires_grad)
        if self.requires_grad is not None and len(self.requires_grad) != len(graph.inputs):
            raise AutogradError(f"requires_grad has {len(self.requires_grad)} entries; graph "
                                f"{graph.name!r} has {len(graph.inputs)} inputs")
        self.decompositions = decompositions
        self.strategy: Strategy = strategy
        self.memory_budget = memory_budget
        # Only the default table has a stable identity across processes; others are not cached.
        self.cache = cache if decompositions is DEFAULT_TABLE else None
        self.compile_backward_early = compile_backward_early
        # Artifacts of compiles that happen later (the backward, at the first .backward())
        # still belong to the graph being compiled now.
        self.debug_name = observe.current_graph() or graph.name
        # a body that runs entirely under no_grad needs no joint graph, whatever the caller's mode
        self._records_grad = records_grad(graph)
        self._autocast_types = device_types(graph)
        flat, self._spec = _flatten_outputs(graph)
        self._flat = flat
        self._functional: S.Graph | None = None
        self.stages: list[Stage] = []
        self.num_user_outputs = len(flat.outputs)
        self._hints = tuple(sorted((s.name, s.hint) for s in graph.symbols if s.hint is not None))
        self._own_guards = {g.expr for g in graph.guards if isinstance(g, S.SymbolGuard)}
        self._plans: dict[tuple[Any, ...], list[_Plan]] = {}

    @property
    def functional(self) -> S.Graph:
        """The functionalized graph (computed on first use: a plan read from the cache needs
        none)."""
        if self._functional is None:
            t0 = time.perf_counter()
            with gc_paused():
                functional = functionalize(self._flat)
            self.stages.append(Stage("functionalize", time.perf_counter() - t0, functional))
            observe.record_time("aot.functionalize", self.stages[-1].seconds)
            _verify("functionalize", functional)
            self._functional = functional
        return self._functional

    @property
    def num_plans(self) -> int:
        """How many plans have been built (one per requires-grad pattern and training flag,
        plus one per set of sizes that failed an earlier plan's guards)."""
        return sum(len(p) for p in self._plans.values())

    # -- building plans
    def sizes_key(self, inputs: Sequence[Any]) -> tuple[tuple[str, int], ...]:
        """The values of the graph's size symbols for these inputs (empty: no symbols)."""
        if not self.graph.symbols:
            return ()
        env = bind_symbols(self.graph.symbols, inputs)
        return tuple(sorted(env.items()))

    def plan(self, requires_grad: tuple[bool, ...], training: bool,
             sizes: tuple[tuple[str, int], ...] = ()) -> _Plan:
        """The plan for one requires-grad pattern whose guards hold for ``sizes`` (the values
        of the size symbols, from `sizes_key`; empty: the capture's hints).

        Sizes stay symbolic through the passes, so the first plan usually serves every size;
        another is built only when a guard that a pass added fails for ``sizes``.
        """
        key = (training, requires_grad if training else ())
        plans = self._plans.setdefault(key, [])
        env = dict(sizes or self._hints)
        for plan in plans:
            if not plan.guards or plan.failing_guard(env) is None:
                return plan
        if not plans:
            with gc_paused():
                plans.append(self._build(requires_grad, training, self._flat, lambda: self.functional))
            if plans[0].failing_guard(env) is None:
                return plans[0]
        failed = plans[-1].failing_guard(env)
        assert failed is not None
        where = f" (added at {failed.loc})" if failed.loc else ""
        _log_text(f"aot: guard {failed.expr}{where} of the compiled plan fails for sizes "
                  f"{_sizes_text(env)}; building a plan for these sizes")
        flat = self._flat_for(env)
        with gc_paused():
            plan = self._build(requires_grad, training, flat, lambda: functionalize(flat))
        bad = plan.failing_guard(env)
        if bad is not None:
            raise AutogradError(f"graph {self.graph.name!r}: a plan built for sizes "
                                f"{_sizes_text(env)} has the guard {bad.expr}, which they violate")
        plans.append(plan)
        return plan

    def _flat_for(self, sizes: dict[str, int]) -> S.Graph:
        """The graph with ``sizes`` as the symbols' hints: the passes then decide every
        relation the way these sizes need."""
        for sym in self.graph.symbols:
            n = sizes.get(sym.name)
            if n is not None and not (max(sym.min, 2) <= n <= (sym.max or n)):
                hi = "inf" if sym.max is None else sym.max
                raise AutogradError(f"graph {self.graph.name!r}: size {sym.name}={n} (from "
                                    f"{sym.source}) is outside the symbol's range "
                                    f"[{max(sym.min, 2)}, {hi}]; sizes 0 and 1 are specialized by "
                                    "the capture, which must guard on them")
        symbols = tuple(msgspec.structs.replace(s, hint=sizes.get(s.name, s.hint))
                        for s in self.graph.symbols)
        return msgspec.structs.replace(self._flat, symbols=symbols)

    def _added_guards(self, graph: S.Graph) -> tuple[S.SymbolGuard, ...]:
        return tuple(g for g in graph.guards
                     if isinstance(g, S.SymbolGuard) and g.expr not in self._own_guards)

    def _stage(self, plan: _Plan, name: str, fn: Callable[[], S.Graph]) -> S.Graph:
        t0 = time.perf_counter()
        graph = fn()
        plan.stages.append(Stage(name, time.perf_counter() - t0, graph))
        self.stages.append(plan.stages[-1])
        observe.record_time(f"aot.{name}", plan.stages[-1].seconds)
        _verify(name, graph)
        return graph

    def _build(self, requires_grad: tuple[bool, ...], training: bool, flat: S.Graph,
               functional_of: Callable[[], S.Graph]) -> _Plan:
        """A plan for ``flat`` (the graph before functionalization); ``functional_of()``
        functionalizes it, called only when the plan is not read from the cache."""
        if not training:
            functional = functional_of()
            plan = _Plan(training=False, functional=functional, forward_graph=functional)
            plan.forward_graph = self._stage(plan, "decompose",
                                             lambda: decompose(functional, self.decompositions))
            plan.guards = self._added_guards(plan.forward_graph)
            plan.mutated_input_positions = _mutated_positions(functional)
            _log("aot inference graph", plan.forward_graph, "forward.py")
            return plan
        material = self._cache_material(flat, requires_grad) if self.cache is not None else b""
        if self.cache is not None:
            cached = self._cached_plan(material)
            if cached is not None:
                return cached
        functional = functional_of()
        plan = _Plan(training=True, functional=functional, forward_graph=functional)
        part = self._partition(plan, functional, requires_grad)
        _fill_training_plan(plan, part, self._added_guards(part.forward))
        if self.cache is not None:
            record = _PlanRecord(interface=_interface(functional), forward=part.forward,
                                 backward=part.backward, saved=part.saved,
                                 recomputed=part.recomputed, strategy=part.strategy)
            self.cache.put(material, msgspec.json.encode(record))
        return plan

    def _cache_material(self, flat: S.Graph, requires_grad: tuple[bool, ...]) -> bytes:
        from torchfuse.graph.archive import to_json

        # "flat": the key is the graph before functionalization (keys of the functional
        # graph, written before, can never match one of these)
        settings = msgspec.json.encode(["flat", list(requires_grad), self.strategy, self.memory_budget])
        # only size guards decide a plan (the passes assume them); the others are capture's to
        # check, and some hold process-local addresses (an identity guard's description, a
        # constant guard on the keys of a dict keyed by ``id()``)
        sized = tuple(g for g in flat.guards if isinstance(g, S.SymbolGuard))
        if sized != flat.guards:
            flat = msgspec.structs.replace(flat, guards=sized)
        return settings + b"\0" + to_json(flat)

    def _cached_plan(self, material: bytes) -> _Plan | None:
        """The training plan the cache holds for ``material``, or None (a record that does not
        decode, or whose names do not fit this graph, is reported invalid)."""
        assert self.cache is not None
        t0 = time.perf_counter()
        data = self.cache.get(material)
        if data is None:
            return None
        try:
            rec = msgspec.json.decode(data, type=_PlanRecord)
            _check_record(rec, self._flat)
            part = Partition(forward=rec.forward, backward=rec.backward, saved=rec.saved,
                             recomputed=rec.recomputed, strategy=rec.strategy)
            plan = _Plan(training=True, functional=rec.interface, forward_graph=rec.interface)
            _fill_training_plan(plan, part, self._added_guards(part.forward))
        except (msgspec.MsgspecError, ValueError, KeyError, AutogradError) as e:
            self.cache.invalid(material, f"{type(e).__name__}: {e}")
            return None
        seconds = time.perf_counter() - t0
        observe.record_time("aot.cache_lookup", seconds)
        plan.stages += [Stage("cache.forward", seconds, part.forward),
                        Stage("cache.backward", 0.0, part.backward)]
        self.stages += plan.stages[-2:]
        return plan

    def _partition(self, plan: _Plan, functional: S.Graph, requires_grad: tuple[bool, ...]) -> Partition:
        """joint graph -> decompose -> cse -> partition (the passes a cached plan skips)."""
        joint = self._stage(plan, "joint_graph", lambda: joint_graph(functional, requires_grad))
        joint = self._stage(plan, "decompose", lambda: decompose(joint, self.decompositions))
        # decompositions of forward and backward ops recompute the same things (sigmoid)
        joint = self._stage(plan, "cse", lambda: eliminate_common_subexpressions(joint, is_random))
        # before the partition: an argument no kernel reads must not be saved for the backward
        joint = self._stage(plan, "drop_unread", lambda: drop_unread_arguments(joint))
        _log("aot joint graph", joint, "joint.py")
        t0 = time.perf_counter()
        part = partition(joint, strategy=self.strategy, memory_budget=self.memory_budget)
        seconds = time.perf_counter() - t0
        observe.record_time("aot.partition", seconds)
        plan.stages += [Stage("partition.forward", seconds, part.forward),
                        Stage("partition.backward", 0.0, part.backward)]
        _verify("partition.forward", part.forward)
        _verify("partition.backward", part.backward)
        self.stages += plan.stages[-2:]
        return part

    # -- calling
    def __call__(self, *inputs: Any) -> list[Any]:
        if len(inputs) != len(self.graph.inputs):
            raise AutogradError(f"graph {self.graph.name!r} takes {len(self.graph.inputs)} inputs, "
                                f"got {len(inputs)}")
        rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
        if self.requires_grad is not None:
            rg = tuple(a and b for a, b in zip(rg, self.requires_grad, strict=True))
        training = torch.is_grad_enabled() and any(rg) and self._records_grad
        # the graph's ops carry autocast's dtypes already: passes, compilers and the compiled
        # halves all run with autocast off, or an enclosing autocast would cast them again
        with no_autocast(self._autocast_types):
            with observe.compiling(self.debug_name):
                plan = self.plan(rg, training, self.sizes_key(inputs))
            if plan.forward is None:
                with gc_paused():  # the compilers' lowering allocates as much as the passes
                    early = training and self.compile_backward_early and plan.backward is None
                    if early and config.forward_first:
                        self._compile_forward(plan, inputs, start=True)
                    if early:
                        assert plan.partition is not None
                        with observe.compiling(self.debug_name, role="backward"):
                            plan.backward = self.bw_compiler(plan.partition.backward, [])
                        _start_precompile(plan.backward)
                    if plan.forward is None:
                        self._compile_forward(plan, inputs)
            if training:
                outs = list(_CompiledFunction.apply(self, plan, *inputs))
            else:
                with torch.no_grad():
                    outs = list(plan.forward(*inputs))[: len(plan.functional.outputs)]
            return self._epilogue(plan.functional, inputs, outs)

    def _compile_forward(self, plan: _Plan, inputs: Sequence[Any], start: bool = False) -> None:
        """Compile the forward half into ``plan``; ``start``: begin its kernels' compiles now,
        in the background (the first call then waits for them, as for the backward's)."""
        with observe.compiling(self.debug_name):
            plan.forward = self.fw_compiler(plan.forward_graph, list(inputs))
        if start:
            _start_precompile(plan.forward)

    def _epilogue(self, g: S.Graph, inputs: Sequence[Any], outs: list[Any]) -> list[Any]:
        position = {i.name: k for k, i in enumerate(g.inputs)}
        if len(outs) > self.num_user_outputs:
            _write_back(g, self.num_user_outputs, position, inputs, outs)
        user = [alias_input(g, o, v, inputs, position)
                for o, v in zip(g.outputs[: self.num_user_outputs], outs, strict=False)]
        grouped: list[Any] = []
        it = iter(user)
        for n in self._spec:
            grouped.append(next(it) if n < 0 else [next(it) for _ in range(n)])
        return grouped


def _start_precompile(compiled: Any) -> None:
    """Start a compiled half's kernel compiles in the background, when its compiler offers it
    (``precompile_async``, as the inductor backend's callables do)."""
    start = getattr(compiled, "precompile_async", None)
    if start is not None:
        start()


def _fill_training_plan(plan: _Plan, part: Partition, guards: tuple[S.SymbolGuard, ...]) -> None:
    """Everything a training plan derives from its partition and its functional graph."""
    _log("aot forward graph", part.forward, "forward.py")
    _log("aot backward graph", part.backward, "backward.py")
    plan.partition = part
    plan.forward_graph = part.forward
    plan.guards = guards
    tangents = part.backward.inputs[num_saved(part.backward):]
    plan.tangent_of = {tangent_index(t.target): k for k, t in enumerate(tangents)}
    position = {i.name: k for k, i in enumerate(plan.functional.inputs)}
    plan.grad_of = [position[o.target or ""] for o in part.backward.outputs]
    plan.grad_sources = output_sources(part.backward, [t.name for t in tangents])
    plan.mutated_input_positions = _mutated_positions(plan.functional)


def _mutated_positions(functional: S.Graph) -> list[int]:
    position = {i.name: k for k, i in enumerate(functional.inputs)}
    return [position[o.target or ""] for o in functional.outputs if o.kind == "mutated_input"]


def _interface(functional: S.Graph) -> S.Graph:
    """``functional`` without its nodes: inputs, outputs, symbols and the metadata of the
    values they name (what a call reads of a plan's functional graph)."""
    names = {i.name for i in functional.inputs}
    names |= {o.value.name for o in functional.outputs if isinstance(o.value, S.TensorRef)}
    values = {k: v for k, v in functional.values.items() if k in names}
    return msgspec.structs.replace(functional, nodes=(), values=values, guards=(), meta={})


def _check_record(rec: _PlanRecord, flat: S.Graph) -> None:
    """Raise ValueError when a plan record read from a cache does not fit ``flat``: its
    interface must have the graph's inputs and at least its outputs, every name it writes
    back or re-views an input, and the halves the graph's input and output counts."""
    inputs = [i.name for i in flat.inputs]
    interface = rec.interface
    if [i.name for i in interface.inputs] != inputs:
        raise ValueError("the record's inputs are not the graph's")
    if len(interface.outputs) < len(flat.outputs):
        raise ValueError("the record has fewer outputs than the graph")
    known = set(inputs)
    for k, o in enumerate(interface.outputs):
        for name in (o.target if o.kind == "mutated_input" else None, o.aliases_input):
            if name is not None and name not in known:
                raise ValueError(f"output {k} names {name!r}, not an input")
        if isinstance(o.value, S.TensorRef) and o.value.name not in interface.values:
            raise ValueError(f"output {k}: no metadata for {o.value.name!r}")
    if len(rec.forward.inputs) != len(inputs):
        raise ValueError("the forward graph does not take the graph's inputs")
    if len(rec.forward.outputs) < len(interface.outputs):
        raise ValueError("the forward graph has fewer outputs than the graph")
    if any(o.target not in known for o in rec.backward.outputs):
        raise ValueError("a backward output is the gradient of no input")


def _write_back(g: S.Graph, first: int, position: dict[str, int], inputs: Sequence[Any],
                outs: list[Any]) -> None:
    """Copy the new values of mutated inputs (outputs ``first`` on) into the inputs.

    A target that records autograd history (grad enabled, requires grad) is written by its own
    ``copy_``; the rest (a batch norm's running statistics: dozens per model) by one
    ``_foreach_copy_`` per dtype under ``no_grad``, a single call instead of one per buffer (on
    the GPU one multi-tensor kernel; its fast path takes one dtype per list). An output that
    already is its input's contents (written in place) is skipped.
    """
    recording = torch.is_grad_enabled()
    targets: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for o, value in zip(g.outputs[first:], outs[first:], strict=True):
        if o.kind != "mutated_input":
            continue
        target = inputs[position[o.target or ""]]
        if _same_data(value, target):
            continue
        if recording and target.requires_grad:
            target.copy_(value)
        else:
            targets.append(target)
            values.append(value)
    if not targets:
        return
    with torch.no_grad():
        if len(targets) == 1 or not _foreach_safe(targets, values):
            for target, value in zip(targets, values, strict=True):
                target.copy_(value)
            return
        groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for target, value in zip(targets, values, strict=True):
            group = groups.setdefault(target.dtype, ([], []))
            group[0].append(target)
            group[1].append(value)
        for ts, vs in groups.values():
            torch._foreach_copy_(ts, vs)


def _same_data(value: Any, target: torch.Tensor) -> bool:
    """Whether ``value`` already is ``target``'s contents: the compiled forward wrote the input
    in place and returned it (``torch.autograd.Function`` hands it back as a view of itself)."""
    return value is target or (
        isinstance(value, torch.Tensor) and value.data_ptr() == target.data_ptr()
        and value.dtype == target.dtype and value.shape == target.shape
        and value.stride() == target.stride() and value.device == target.device)


def _foreach_safe(targets: list[torch.Tensor], values: list[torch.Tensor]) -> bool:
    """Whether one ``_foreach_copy_`` writes what the copies one by one would: same dtypes and
    devices (its fast path), and no target starting where another target or a value does
    (the one-by-one order would then decide the result)."""
    device = targets[0].device
    starts = set()
    for t, v in zip(targets, values, strict=True):
        if t.dtype is not v.dtype or t.device != device or v.device != device:
            return False
        starts.add(t.data_ptr())
    if len(starts) != len(targets):
        return False
    return not any(v.data_ptr() in starts for v in values)


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: AotFunction, plan: _Plan, *inputs: Any):  # type: ignore[override]
        results = list(plan.forward(*inputs))
        n = len(plan.functional.outputs)
        user, saved = results[:n], results[n:]
        user = views_made_plain(user, saved)
        ctx.fn, ctx.plan = fn, plan
        # backward() takes None for a gradient autograd did not compute (and makes zeros only
        # where the backward graph reads one): autograd would otherwise make a zero tensor
        # for every output the loss did not use, running-statistics updates included
        ctx.set_materialize_grads(False)
        # a tangent autograd leaves out is made as zeros of the sizes of this call
        ctx.sizes = bind_symbols(plan.functional.symbols, inputs) if plan.functional.symbols else {}
        # weak: only needed to report double backward, must not keep activations alive
        ctx.input_refs = [weakref.ref(t) for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        # an input written back after the call must be saved as it was before the write
        written = {id(inputs[i]) for i in plan.mutated_input_positions}
        saved = [s.clone() if id(s) in written else s for s in saved]
        ctx.save_for_backward(*saved)  # saved values are tensors: the format has no others
        no_grad_outs = [u for i, u in enumerate(user)
                        if isinstance(u, torch.Tensor) and i not in plan.tangent_of]
        if no_grad_outs:
            ctx.mark_non_differentiable(*no_grad_outs)
        return tuple(user)

    @staticmethod
    def backward(ctx, *grads: Any):  # type: ignore[override]
        fn, plan = ctx.fn, ctx.plan
        saved = list(ctx.saved_tensors)
        part = plan.partition
        assert part is not None
        tangent_inputs = part.backward.inputs[len(saved):]
        tangents, unused = [], set()
        for k, t in enumerate(tangent_inputs):
            i = tangent_index(t.target)
            g = grads[i]
            if g is None:  # autograd passes None for outputs the loss did not use
                unused.add(k)
                g = _zeros(part.backward, t.name, ctx.sizes, device=_device_of(grads, saved))
            tangents.append(_laid_out(g, part.backward.values[t.name], ctx.sizes))
            assert plan.tangent_of[i] == k
        create_graph = torch.is_grad_enabled()
        # autocast off as in the forward: the backward graph's dtypes were fixed when it was
        # traced (an autocast around ``.backward()`` must not cast its ops again)
        with torch.no_grad(), no_autocast(fn._autocast_types):
            if plan.backward is None:
                with gc_paused(), observe.compiling(fn.debug_name, role="backward"):
                    plan.backward = fn.bw_compiler(part.backward, [*saved, *tangents])
            out = list(plan.backward(*saved, *tangents))
        result: list[Any] = [None] * len(plan.functional.inputs)
        for idx, g, sources in zip(plan.grad_of, out, plan.grad_sources, strict=True):
            # as eager: an input the loss reaches only through unused outputs gets no
            # gradient (None), not zeros (an optimizer skips a None; it would decay a zero)
            if not (sources and sources <= unused):
                result[idx] = g
        if create_graph:
            # route the gradients through a node whose backward raises, so that a second
            # differentiation fails with a clear message instead of silently being wrong
            # (anchored on whatever connects them to the inputs: saved primals, grad outputs)
            live = [r() for r in ctx.input_refs]
            anchors = [t for t in [*live, *grads] if isinstance(t, torch.Tensor) and t.requires_grad]
            positions = [k for k, r in enumerate(result) if isinstance(r, torch.Tensor)]
            wrapped = _NoDoubleBackward.apply(len(anchors), *anchors, *[result[k] for k in positions])
            for k, w in zip(positions, wrapped, strict=True):
                result[k] = w
        return (None, None, *result)


def _laid_out(g: torch.Tensor, meta: S.TensorMeta, sizes: dict[str, int]) -> torch.Tensor:
    """The gradient ``g`` in the layout its tangent input was traced with (the output's own
    when that is dense, see `joint.tangent_strides`): ``g`` itself when it already is, else
    a copy (an expanded gradient of a ``sum``, or one laid out unlike the output)."""
    strides = [evaluate(s, sizes) for s in meta.strides]
    if all(n == 1 or a == b for n, a, b in zip(g.shape, g.stride(), strides, strict=True)):
        return g
    out = torch.empty_strided(tuple(g.shape), strides, dtype=g.dtype, device=g.device)
    return out.copy_(g)


def _zeros(graph: S.Graph, name: str, sizes: dict[str, int], device: torch.device) -> torch.Tensor:
    meta = graph.values[name]
    shape, strides = [evaluate(s, sizes) for s in meta.sizes], [evaluate(s, sizes) for s in meta.strides]
    return torch.empty_strided(shape, strides, dtype=to_dtype(meta.dtype), device=device).zero_()


def _device_of(grads: Sequence[Any], saved: Sequence[Any]) -> torch.device:
    for t in [*grads, *saved]:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


_DOUBLE_BACKWARD_MESSAGE = (
    "torchfuse.autograd: the backward of a compiled graph is differentiable only once; "
    "double backward (torch.autograd.grad(..., create_graph=True) followed by another "
    "backward through it) is not supported. Run this region eagerly (e.g. compile with the "
    "'eager' backend) to take higher-order gradients."
)


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on gradients whose own backward raises `DoubleBackwardError`."""

    @staticmethod
    def forward(ctx, n_anchors: int, *tensors: torch.Tensor):  # type: ignore[override]
        return tuple(g.clone() for g in tensors[n_anchors:])

    @staticmethod
    def backward(ctx, *args: Any):  # type: ignore[override]
        raise DoubleBackwardError(_DOUBLE_BACKWARD_MESSAGE)


def aot(
    graph: S.Graph,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    requires_grad: Sequence[bool] | None = None,
    decompositions: Table = DEFAULT_TABLE,
    strategy: Strategy = "min_cut",
    memory_budget: float = 1.0,
    cache: PlanCache | None = None,
    compile_backward_early: bool = False,
) -> AotFunction:
    """Make ``graph`` a differentiable function whose halves are compiled by the compilers.

    The result is called with the flat inputs in ``graph.inputs`` order and returns the
    outputs in ``graph.outputs`` order (list outputs as lists); mutated inputs are written
    back in place. On the first call that needs gradients it builds the joint graph,
    decomposes and partitions it, and compiles the forward half; the backward half is
    compiled when the backward first runs (or with the forward, see
    ``compile_backward_early``).

    Args:
        graph: A captured graph (it may mutate its inputs; functionalization removes that).
        fw_compiler: Compiles the forward graph: ``compiler(graph, example_inputs) -> callable``.
        bw_compiler: Compiles the backward graph (default: ``fw_compiler``).
        requires_grad: Which inputs may receive gradients (default: those whose tensors
            require grad at call time).
        decompositions: The decomposition table applied to the joint graph.
        strategy: How the joint graph is split: ``"min_cut"`` saves the fewest bytes and
            recomputes only cheap ops; ``"save_all"`` saves every forward value the backward
            reads.
        memory_budget: The share of the saved bytes the partition may keep (``1.0``: no
            extra recomputation).
        cache: Keeps training plans between processes (see ``PlanCache``; only with the
            default ``decompositions``).
        compile_backward_early: Compile the backward on the first call, so its kernels build
            while the forward runs.

    Returns:
        An [`AotFunction`][torchfuse.autograd.AotFunction], differentiable through
        ``torch.autograd``.

    Examples:
        >>> import torch
        >>> from torchfuse.autograd import aot, interpreter_compiler
        >>> from torchfuse.graph import trace
        >>> graph, _ = trace(lambda x: (x * x).sum(), torch.randn(3))
        >>> f = aot(graph, interpreter_compiler)
        >>> x = torch.randn(3, requires_grad=True)
        >>> (loss,) = f(x)
        >>> loss.backward()
        >>> torch.allclose(x.grad, 2 * x)
        True
    """
    return AotFunction(graph, fw_compiler, bw_compiler or fw_compiler, requires_grad=requires_grad,
                       decompositions=decompositions, strategy=strategy, memory_budget=memory_budget,
                       cache=cache, compile_backward_early=compile_backward_early)
