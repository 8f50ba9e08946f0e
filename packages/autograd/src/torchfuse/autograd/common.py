"""Helpers shared by the passes: fakes from metadata, byte sizes, dead code, printing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec
import torch
from torchfuse.autograd.config import config
from torchfuse.graph import printer
from torchfuse.graph import schema as S
from torchfuse.graph.collector import gc_paused
from torchfuse.graph.expr import evaluate
from torchfuse.graph.interpreter import no_autocast
from torchfuse.graph.layouts import storage_extent
from torchfuse.graph.meta_memo import MEMO, Entry
from torchfuse.graph.ops import (
    decode_arg,
    encode_arg,
    node_inputs,
    op_name,
    rename_arg,
    tensor_refs,
    to_dtype,
)
from torchfuse.graph.symbolic import SizeEnv, env_from_symbols
from torchfuse.graph.tracing import FakeTensor, GraphBuilder, Recorder, outside_dispatch
from torchfuse.graph.tracing import fake_from_meta as tracing_fake_from_meta


class AutogradError(RuntimeError):
    """A graph that torchfuse-autograd cannot transform; the message names the node."""


def _concrete_dense(t: torch.Tensor) -> bool:
    """Concrete sizes and strides, every element once and no gaps (any dim order)."""
    if not all(isinstance(v, int) for v in (*t.shape, *t.stride())):
        return False
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


EAGER_LAYOUTS: dict[str, str] = {
    # ``zeros_like(self, LEGACY_CONTIGUOUS_MEMORY_FORMAT)`` in the CPU and CUDA kernels; the
    # meta kernel keeps self's layout
    "aten.mse_loss_backward.default": "contiguous",
}
"""Ops whose meta kernel lays the result out unlike eager's CPU and CUDA kernels, and eager's
rule: [`PassRecorder`][torchfuse.autograd.common.PassRecorder] records a copy into eager's
layout after them (``clone`` to contiguous, or to the input's dim order between two
``permute``s), so the
strides the graph records, and the ``view``s that read them, are eager's."""


class PassRecorder(Recorder):
    """The Recorder our passes run under: a real tensor met while re-tracing (a wrapped
    number inside a derivative formula) becomes an ``aten.scalar_tensor`` node instead of a
    new graph input, so a pass never changes a graph's inputs. The ops of `EAGER_LAYOUTS`
    are followed by a copy into eager's layout where their meta kernel's differs."""

    def __init__(self, builder: GraphBuilder | None = None) -> None:
        super().__init__(builder)
        # sizes that are SymInts are decided by the size env as they are asked: never memoized
        self.memo = (MEMO.use_disk(config.meta_memo_disk)
                     if config.meta_memo and self.builder.size_env is None else None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = self.memo.key(func, args, kwargs, _special) if self.memo is not None else None
        if key is None:
            return self._dispatch(func, types, args, kwargs)
        entry = self.memo.get(key)
        if entry is not None:
            return self._replay(func, args, kwargs, entry)
        nodes = self.builder.nodes
        before = len(nodes)
        out = self._dispatch(func, types, args, kwargs)
        if len(nodes) == before + 1:  # recorded as one node: its outputs' metadata is the answer
            values = self.builder.values
            self.memo.put(key, out, [values[o] if o else None for o in nodes[-1].outputs])
        return out

    def _replay(self, func, args, kwargs, entry: Entry):
        """Record ``func`` as `Recorder` does, with the outputs `MEMO` remembered for these
        arguments instead of its meta kernel's."""
        enc_args = [encode_arg(a, self.name_of) for a in args]
        enc_kwargs = {k: encode_arg(v, self.name_of) for k, v in kwargs.items()}
        fakes = entry.fakes()
        names = self.builder.add_node(op_name(func), enc_args, enc_kwargs, entry.metas, loc=self.loc,
                                      module_path=self.module_path)
        for fake, name in zip(fakes, names, strict=True):
            self.bind(fake, name)
        return fakes[0] if entry.container is None else entry.container(fakes)

    def _dispatch(self, func, types, args, kwargs):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        rule = EAGER_LAYOUTS.get(op_name(func))
        if rule is None or not isinstance(out, torch.Tensor) or not _concrete_dense(out):
            return out
        aten = torch.ops.aten
        contiguous = {"memory_format": torch.contiguous_format}
        if rule == "contiguous":
            if out.is_contiguous():
                return out
            return super().__torch_dispatch__(aten.clone.default, types, (out,), contiguous)
        src = args[0]
        if not isinstance(src, torch.Tensor) or not _concrete_dense(src) or src.stride() == out.stride():
            return out
        # permute into the input's memory order, copy dense, permute back: src's strides,
        # and differentiable (the joint graph re-traces forward ops with grad)
        order = sorted(range(src.dim()), key=lambda d: (-src.stride()[d], d))
        back = sorted(range(src.dim()), key=order.__getitem__)
        t = super().__torch_dispatch__(aten.permute.default, types, (out, order), {})
        t = super().__torch_dispatch__(aten.clone.default, types, (t,), contiguous)
        return super().__torch_dispatch__(aten.permute.default, types, (t, back), {})

    def on_constant(self, t: torch.Tensor) -> str:
        if isinstance(t, FakeTensor) or t.dim() != 0:
            raise AutogradError(f"a pass met a real tensor of shape {tuple(t.shape)} that is not a "
                                "graph input; only scalars can be folded into the graph")
        from torchfuse.graph.ops import dtype_name, encode_arg, meta_of

        value = encode_arg(t.item(), self.name_of)
        kwargs = {"dtype": S.DtypeArg(name=dtype_name(t.dtype)), "device": S.DeviceArg(name=str(t.device))}
        (name,) = self.builder.add_node("aten.scalar_tensor.default", [value], kwargs, [meta_of(t)],
                                        hint="scalar")
        self.bind(t, name)
        return name


def _special(name: str) -> bool:
    """Ops the memo leaves alone: run by `Recorder` without a node (``prim``), rewritten by it
    (``lift_fresh``), or followed by a copy (`EAGER_LAYOUTS`)."""
    return name.startswith("prim.") or name == "aten.lift_fresh.default" or name in EAGER_LAYOUTS


def where(node: S.Node) -> str:
    """``node 'add' [aten.add_.Tensor] (from file.py:3)`` for error messages."""
    loc = f" (from {node.loc})" if node.loc else ""
    return f"node {node.name!r} [{node.op}]{loc}"


def symbol_hints(graph: S.Graph) -> dict[str, int]:
    """Symbol values used to *measure* a graph (byte sizes for the min-cut): the capture hints."""
    return {s.name: s.hint for s in graph.symbols if s.hint is not None}


def concrete(expr: S.Expr, hints: Mapping[str, int]) -> int:
    return expr if isinstance(expr, int) else evaluate(expr, hints)


def retrace_env(graph: S.Graph) -> SizeEnv | None:
    """A [`SizeEnv`][torchfuse.graph.symbolic.SizeEnv] holding ``graph``'s symbols (same names,
    ranges, hints and sources), for re-running it on fakes with symbolic sizes; None when the
    graph has no symbols.

    The graph's symbol guards are replayed as facts, so relations the capture already decided
    are decided again without a new guard; only relations a pass newly depends on are left in
    ``env.guards`` after the retrace (see `retrace_builder`).
    """
    if not graph.symbols:
        return None
    env = env_from_symbols(graph.symbols)
    for g in graph.guards:
        if isinstance(g, S.SymbolGuard):
            env.assume(env.to_sympy(g.expr), True)
    # the replayed guards are the input graph's already; the env still knows them as facts
    env.guards.clear()
    return env


class _RetraceBuilder(GraphBuilder):
    def __init__(self, name: str, symbols: tuple[S.Symbol, ...]) -> None:
        super().__init__(name)
        self._records = symbols

    def build(self) -> S.Graph:
        # a retrace makes no symbols: the input graph's records are exact (the env rounds a
        # range's min up to 2 and invents hints for symbols that have none)
        return msgspec.structs.replace(super().build(), symbols=self._records)


def retrace_builder(graph: S.Graph, name: str) -> tuple[GraphBuilder, SizeEnv | None]:
    """A builder for a pass that re-runs ``graph``: it carries the graph's symbols, guards and
    meta, and (for a symbolic graph) the size env whose new guards it appends on ``build``."""
    builder = _RetraceBuilder(name, graph.symbols)
    builder.symbols = list(graph.symbols)
    builder.guards = list(graph.guards)
    builder.meta = dict(graph.meta)
    env = builder.size_env = retrace_env(graph)
    return builder, env


def retracing(env: SizeEnv | None) -> contextlib.AbstractContextManager:
    """The context every pass re-runs a graph in: autocast off, since a graph's ops already
    carry the dtypes autocast gave them at capture (see `torchfuse.graph.interpreter.no_autocast`;
    an enclosing ``torch.autocast`` would cast them again, and the backward formulas too); the
    garbage collector paused (`torchfuse.graph.collector.gc_paused`); the grad mode restored
    on exit (a graph's ``torchfuse.set_grad_enabled`` nodes set it while they are re-run: a
    functionalize that ran inside a call, as a plan-cache miss does, left the call's grad
    mode off and its outputs without grads); and, for symbolic fakes, the Python dispatcher
    (see ``SizeEnv.tracing``)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.set_grad_enabled(torch.is_grad_enabled()))
    stack.enter_context(gc_paused())
    stack.enter_context(no_autocast())
    if env is not None:
        stack.enter_context(env.tracing())
    return stack


def decode(arg: S.Argument, values: Mapping[str, object], env: SizeEnv | None) -> object:
    """A format argument as the value a retrace passes to torch: tensors from ``values``;
    size expressions as ``SymInt``s of ``env`` (not evaluated, so they stay symbolic)."""
    if isinstance(arg, S.SymRef) and env is not None:
        return env.parse(arg.expr)
    if isinstance(arg, S.ListArg):
        return [decode(a, values, env) for a in arg.items]
    return decode_arg(arg, values)


def fake_from_meta(meta: S.TensorMeta, env: SizeEnv | None, requires_grad: bool = False) -> FakeTensor:
    """A fake tensor with exactly the metadata recorded in ``meta``: sizes written as
    expressions become ``SymInt``s of ``env`` (a graph without symbols passes None)."""
    dtype = to_dtype(meta.dtype)
    rg = requires_grad and (dtype.is_floating_point or dtype.is_complex)
    if env is not None:
        return tracing_fake_from_meta(meta, env=env, requires_grad=rg)
    sizes = [concrete(s, {}) for s in meta.sizes]
    strides = [concrete(s, {}) for s in meta.strides]
    offset = concrete(meta.storage_offset, {})
    # the passes call this inside their recorder: with it active, the meta tensor's factory
    # calls would be recorded as (dead) nodes that take names, and the fake would wrap a fake
    with outside_dispatch():
        if offset == 0:
            elem = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        else:
            storage = torch.empty(storage_extent(sizes, strides, offset), dtype=dtype, device="meta")
            elem = storage.as_strided(sizes, strides, offset)
    return FakeTensor(elem, meta.device, requires_grad=rg)


def nbytes(meta: S.TensorMeta, hints: Mapping[str, int] | None = None) -> int:
    """Bytes a value occupies if kept alive (elements times item size)."""
    numel = 1
    for s in meta.sizes:
        numel *= concrete(s, hints or {})
    return numel * to_dtype(meta.dtype).itemsize


def users(graph: S.Graph) -> dict[str, list[S.Node]]:
    out: dict[str, list[S.Node]] = {}
    for n in graph.nodes:
        for v in node_inputs(n):
            out.setdefault(v, []).append(n)
    return out


def output_sources(graph: S.Graph, sources: Sequence[str]) -> list[frozenset[int]]:
    """For each output of ``graph``: the positions in ``sources`` (names of its inputs) of
    the ones it is computed from, through any chain of nodes."""
    position = {name: k for k, name in enumerate(sources)}
    reach: dict[str, frozenset[int]] = {name: frozenset((k,)) for name, k in position.items()}
    empty: frozenset[int] = frozenset()
    for n in graph.nodes:
        found = empty.union(*(reach.get(v, empty) for v in node_inputs(n)))
        for out in n.outputs:
            if out:
                reach[out] = found
    return [empty.union(*(reach.get(v, empty) for v in tensor_refs([o.value]))) for o in graph.outputs]


def output_names(graph: S.Graph) -> set[str]:
    return set(tensor_refs([o.value for o in graph.outputs]))


def rename_node(node: S.Node, rename: Mapping[str, str]) -> S.Node:
    if not rename:
        return node
    return msgspec.structs.replace(
        node,
        args=tuple(rename_arg(a, rename) for a in node.args),
        kwargs={k: rename_arg(a, rename) for k, a in node.kwargs.items()},
    )


def rename_output(out: S.GraphOutput, rename: Mapping[str, str]) -> S.GraphOutput:
    return msgspec.structs.replace(out, value=rename_arg(out.value, rename))


IDENTITY_OPS = frozenset({"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default"})
"""Ops that are the identity on values once a graph is functional (autograd already ran)."""


def strip_identities(graph: S.Graph) -> S.Graph:
    """Drop ``detach``/``alias`` nodes, pointing their users at the input value."""
    rename: dict[str, str] = {}
    nodes = []
    for n in graph.nodes:
        n = rename_node(n, rename)
        if n.op in IDENTITY_OPS and isinstance(n.args[0], S.TensorRef):
            rename[n.outputs[0]] = n.args[0].name
            continue
        nodes.append(n)
    outputs = tuple(rename_output(o, rename) for o in graph.outputs)
    return prune_values(msgspec.structs.replace(graph, nodes=tuple(nodes), outputs=outputs))


def eliminate_common_subexpressions(graph: S.Graph, keep: Callable[[S.Node], bool]) -> S.Graph:
    """Merge nodes with the same op and arguments; ``keep(node)`` True exempts a node
    (random ops must never be merged: two draws are not one)."""
    rename: dict[str, str] = {}
    seen: dict[bytes, S.Node] = {}
    nodes: list[S.Node] = []
    for n in graph.nodes:
        n = rename_node(n, rename)
        if not keep(n):
            key = msgspec.json.encode((n.op, n.args, sorted(n.kwargs.items())))
            first = seen.get(key)
            if first is not None and len(first.outputs) == len(n.outputs):
                rename.update({o: f for o, f in zip(n.outputs, first.outputs, strict=True) if o})
                continue
            seen[key] = n
        nodes.append(n)
    outputs = tuple(rename_output(o, rename) for o in graph.outputs)
    return prune_values(msgspec.structs.replace(graph, nodes=tuple(nodes), outputs=outputs))


def eliminate_dead_code(graph: S.Graph) -> S.Graph:
    """Remove nodes none of whose outputs reach a graph output (graphs here are functional)."""
    live = output_names(graph)
    kept: list[S.Node] = []
    for n in reversed(graph.nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(node_inputs(n))
    return prune_values(msgspec.structs.replace(graph, nodes=tuple(reversed(kept))))


def prune_values(graph: S.Graph) -> S.Graph:
    """Keep only value-table entries that an input or node defines."""
    defined = {i.name for i in graph.inputs}
    for n in graph.nodes:
        defined.update(o for o in n.outputs if o)
    values = {k: v for k, v in graph.values.items() if k in defined}
    return msgspec.structs.replace(graph, values=values)


def format_graph(graph: S.Graph) -> str:
    """The graph as Python for the ``aot`` log, each output's kind listed after it."""
    try:
        text = printer.to_python(graph).rstrip()
    except Exception:  # a printer bug must never break compilation
        return printer.describe_graph(graph)
    kinds = [f"#   {i}: {printer.describe_output(o)}" for i, o in enumerate(graph.outputs)]
    return "\n".join([text, "# outputs:", *kinds])


def input_kinds(graph: S.Graph, kinds: Iterable[str]) -> list[S.GraphInput]:
    ks = set(kinds)
    return [i for i in graph.inputs if i.kind in ks]
