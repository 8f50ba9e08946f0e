"""Functionalization: rewrite a graph so that no op mutates a tensor or returns an alias
that is later written through.

How it works. The graph is re-run on fake tensors under a [`Recorder`][torchfuse.graph.Recorder].
Every value is described by its *storage root* (a graph input or the output of a non-view
op) and the *view chain* that leads from the root to it. A mutating op (found through the
alias annotations of its schema) is replaced by its functional variant (``add_`` →
``add``, ``bernoulli_.float`` → ``bernoulli.p``, ``copy_`` → ``copy``); when it wrote
through a view, the root's new contents are rebuilt by scattering the new view back,
one chain step at a time (``slice`` → ``slice_scatter``, ``select`` → ``select_scatter``,
``transpose`` → ``transpose`` …; ``as_strided_scatter`` where no inverse is known). Any
other view of that root is re-derived by replaying its chain the next time it is read.

Graph inputs whose contents changed get an extra output of kind ``mutated_input`` (target =
input name) that the caller copies back; outputs that are views of an input are marked with
``aliases_input``.

Before::

    def f(x: f32[4, 4], y: f32[4]):
        row = aten.select.int(x, 0, 1)
        add = aten.add_.Tensor(row, y)          # writes into x through a view
        mul = aten.mul.Tensor(x, 2)             # must see the write
        return (mul,)

After::

    def f(x: f32[4, 4], y: f32[4]):
        select = aten.select.int(x, 0, 1)
        add = aten.add.Tensor(select, y)
        select_scatter = aten.select_scatter.default(x, add, 0, 1)
        mul = aten.mul.Tensor(select_scatter, 2)
        return (mul, select_scatter)            # the second: mutated_input x
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

import torch
from torchfuse.autograd.common import (
    IDENTITY_OPS,
    AutogradError,
    PassRecorder,
    decode,
    eliminate_dead_code,
    fake_from_meta,
    retrace_builder,
    retracing,
    where,
)
from torchfuse.graph import schema as S
from torchfuse.graph.ops import flatten_result, op_name, resolve_op
from torchfuse.graph.symbolic import SizeEnv
from torchfuse.graph.tracing import Recorder, mutated_arguments

aten = torch.ops.aten


class ViewKind(Enum):
    """How to write a new value of a view back into the tensor it views."""

    SLICE = auto()
    SELECT = auto()
    DIAGONAL = auto()
    RESHAPE = auto()
    TRANSPOSE = auto()
    PERMUTE = auto()
    SPLIT = auto()
    SPLIT_SIZES = auto()
    UNBIND = auto()
    AS_STRIDED = auto()
    IDENTITY = auto()
    BROADCAST = auto()


VIEW_KINDS: dict[str, ViewKind] = {
    "aten.slice.Tensor": ViewKind.SLICE,
    "aten.select.int": ViewKind.SELECT,
    "aten.diagonal.default": ViewKind.DIAGONAL,
    "aten.view.default": ViewKind.RESHAPE,
    "aten._unsafe_view.default": ViewKind.RESHAPE,
    "aten.reshape.default": ViewKind.RESHAPE,
    "aten.unsqueeze.default": ViewKind.RESHAPE,
    "aten.squeeze.default": ViewKind.RESHAPE,
    "aten.squeeze.dim": ViewKind.RESHAPE,
    "aten.squeeze.dims": ViewKind.RESHAPE,
    "aten.flatten.using_ints": ViewKind.RESHAPE,
    "aten.unflatten.int": ViewKind.RESHAPE,
    "aten.view_as.default": ViewKind.RESHAPE,
    "aten.transpose.int": ViewKind.TRANSPOSE,
    "aten.t.default": ViewKind.TRANSPOSE,
    "aten.permute.default": ViewKind.PERMUTE,
    "aten.split.Tensor": ViewKind.SPLIT,
    "aten.split_with_sizes.default": ViewKind.SPLIT_SIZES,
    "aten.unbind.int": ViewKind.UNBIND,
    "aten.as_strided.default": ViewKind.AS_STRIDED,
    "aten.alias.default": ViewKind.IDENTITY,
    "aten.detach.default": ViewKind.IDENTITY,
    "aten.expand.default": ViewKind.BROADCAST,
}

# Ops whose schema does not declare a mutation they perform: op -> (functional op, args written).
# native_batch_norm updates running_mean / running_var (args 3, 4) when training.
HIDDEN_MUTATIONS: dict[str, tuple[str, tuple[int, ...]]] = {
    "aten.native_batch_norm.default": ("aten._native_batch_norm_legit_functional.default", (3, 4)),
}


class FunctionalizeError(AutogradError):
    """A mutation that cannot be expressed functionally (e.g. a write into an ``expand``)."""


@dataclass(frozen=True, slots=True)
class ViewStep:
    """One link of a view chain: ``op(base, *args, **kwargs)[index]``."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    index: int


@dataclass(slots=True)
class _Alias:
    root: str
    chain: tuple[ViewStep, ...] = ()


@dataclass(slots=True)
class _State:
    rec: Recorder
    current: dict[str, Any] = field(default_factory=dict)      # value name -> fake
    alias: dict[str, _Alias] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)      # root -> writes so far
    made_at: dict[str, int] = field(default_factory=dict)      # value -> root version
    inputs: set[str] = field(default_factory=set)

    def read(self, name: str) -> Any:
        a = self.alias.get(name)
        if a is None:
            return self.current[name]
        if self.made_at.get(name) != self.version[a.root]:
            t = self.current[a.root]
            for step in a.chain:
                t = _apply_view(step, t)
            self.current[name] = t
            self.made_at[name] = self.version[a.root]
        return self.current[name]

    def define(self, name: str, value: Any, alias: _Alias) -> None:
        self.current[name] = value
        self.alias[name] = alias
        self.version.setdefault(alias.root, 0)
        self.made_at[name] = self.version[alias.root]

    def write(self, name: str, new: Any, node: S.Node) -> _Alias:
        """``name``'s contents become ``new``; propagate to its root."""
        a = self.alias[name]
        root_value = new
        if a.chain:
            bases = [self.current[a.root]]
            for step in a.chain[:-1]:
                bases.append(_apply_view(step, bases[-1]))
            for step, base in zip(reversed(a.chain), reversed(bases), strict=True):
                root_value = _scatter(step, base, root_value, node)
        if root_value.shape != self.current[a.root].shape:
            raise FunctionalizeError(f"{where(node)}: the write changes the shape of its base")
        self.version[a.root] += 1
        self.current[a.root] = root_value
        self.made_at[a.root] = self.version[a.root]
        self.current[name] = new
        self.made_at[name] = self.version[a.root]
        return a


def _apply_view(step: ViewStep, base: Any) -> Any:
    out = resolve_op(step.op)(base, *step.args, **step.kwargs)
    return flatten_result(out)[step.index]


def _scatter(step: ViewStep, base: torch.Tensor, src: torch.Tensor, node: S.Node) -> torch.Tensor:
    """The tensor ``base`` would become if its view ``step`` were overwritten by ``src``."""
    kind = VIEW_KINDS.get(step.op)
    args = list(step.args)
    if kind is ViewKind.SLICE:
        dim, start, end, stp = (args + [0, None, None, 1][len(args):])[:4]
        return aten.slice_scatter(base, src, dim, start, end, stp)
    if kind is ViewKind.SELECT:
        return aten.select_scatter(base, src, args[0], args[1])
    if kind is ViewKind.UNBIND:
        return aten.select_scatter(base, src, args[0] if args else 0, step.index)
    if kind is ViewKind.DIAGONAL:
        off, d1, d2 = (args + [0, 0, 1][len(args):])[:3]
        return aten.diagonal_scatter(base, src, off, d1, d2)
    if kind is ViewKind.SPLIT:
        size, dim = (args + [0][len(args) - 1:])[:2]
        start = step.index * size
        return aten.slice_scatter(base, src, dim, start, min(start + size, base.shape[dim]), 1)
    if kind is ViewKind.SPLIT_SIZES:
        sizes, dim = (args + [0][len(args) - 1:])[:2]
        start = sum(sizes[: step.index])
        return aten.slice_scatter(base, src, dim, start, start + sizes[step.index], 1)
    if kind is ViewKind.RESHAPE:
        return aten.reshape(src, list(base.shape))
    if kind is ViewKind.TRANSPOSE:
        return aten.t(src) if not args else aten.transpose(src, args[0], args[1])
    if kind is ViewKind.PERMUTE:
        dims = [d % base.dim() for d in args[0]]
        inverse = sorted(range(len(dims)), key=dims.__getitem__)
        return aten.permute(src, inverse)
    if kind is ViewKind.IDENTITY:
        return src
    if kind is ViewKind.AS_STRIDED:
        return aten.as_strided_scatter(base, src, *args)
    if kind is ViewKind.BROADCAST:
        raise FunctionalizeError(f"{where(node)} writes into an expanded view: several elements "
                                 f"share one memory location (eager PyTorch rejects this too)")
    # Unknown view op: place the values by their strides relative to a dense base.
    if not base.is_contiguous():
        raise FunctionalizeError(f"{where(node)} writes through a view made by {step.op}, "
                                 "which functionalize does not know how to invert")
    view = _apply_view(step, base)
    return aten.as_strided_scatter(base, src, list(view.shape), list(view.stride()),
                                   view.storage_offset() - base.storage_offset())


# ----------------------------------------------------------------------------- functional variants


def _arg_signature(op: torch._ops.OpOverload) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The op computing the same values as a mutating ``op`` without writing anything.

    Found by schema name: ``aten.add_.Tensor`` → ``aten.add.Tensor``; otherwise the overload
    of the un-underscored name with the same argument names and types
    (``bernoulli_.float`` → ``bernoulli.p``); otherwise ``<name>_functional``.
    """
    ns, name = op._schema.name.split("::")
    overload = op._overloadname
    packet_names = [name[:-1]] if name.endswith("_") else []
    packet_names.append(name + "_functional")
    sig = _arg_signature(op)
    for pname in packet_names:
        packet = getattr(getattr(torch.ops, ns), pname, None)
        if packet is None:
            continue
        candidates = [overload] + [o for o in packet.overloads() if o != overload]
        for o in candidates:
            cand = getattr(packet, o, None)
            if cand is None:
                continue
            if _arg_signature(cand) == sig and not mutated_arguments(cand):
                return cand
    raise FunctionalizeError(f"no functional variant of {ns}.{name}.{overload}")


# ----------------------------------------------------------------------------- the pass


def functionalize(graph: S.Graph) -> S.Graph:
    """A graph computing the same values as ``graph`` with no mutation and no view writes.

    Inputs keep their names; outputs keep their order and gain ``aliases_input`` where they
    view an input; one ``mutated_input`` output (target = input name) is appended per input
    whose contents the graph changed. Example, for ``buf.add_(x); return x * 2``::

        before:  add = aten.add_.Tensor(buf, x)      after:  add = aten.add.Tensor(buf, x)
                 mul = aten.mul.Tensor(x, 2)                 mul = aten.mul.Tensor(x, 2)
                 return (mul,)                               return (mul, add)  # add: mutated_input buf

    The method (storage roots, view chains, scatters) is in the module docstring.
    """
    builder, env = retrace_builder(graph, graph.name)
    rec = PassRecorder(builder)
    input_names = [i.name for i in graph.inputs]
    st = _State(rec, inputs=set(input_names))
    with retracing(env), rec:
        for inp in graph.inputs:
            fake = rec.input(fake_from_meta(graph.values[inp.name], env), name=inp.name,
                             kind=inp.kind, target=inp.target)
            st.define(inp.name, fake, _Alias(inp.name))
        for node in graph.nodes:
            _functionalize_node(node, st, env)
    already_written = {o.target for o in graph.outputs if o.kind == "mutated_input"}
    for o in graph.outputs:
        value = o.value
        aliases = o.aliases_input
        if isinstance(value, S.TensorRef):
            a = st.alias[value.name]
            if a.root in input_names and aliases is None:
                aliases = a.root
            value = S.TensorRef(name=rec.name_of(st.read(value.name)))
        builder.add_output(value, kind=o.kind, target=o.target, aliases_input=aliases)
    for name in input_names:
        if st.version.get(name, 0) > 0 and name not in already_written:
            builder.add_output(S.TensorRef(name=rec.name_of(st.current[name])),
                               kind="mutated_input", target=name)
    return eliminate_dead_code(builder.build())


def _decode(args: Sequence[S.Argument], st: _State, env: SizeEnv | None) -> list[Any]:
    return [_decode_one(a, st, env) for a in args]


def _decode_one(a: S.Argument, st: _State, env: SizeEnv | None) -> Any:
    if isinstance(a, S.TensorRef):
        return st.read(a.name)
    if isinstance(a, S.ListArg):
        return [_decode_one(x, st, env) for x in a.items]
    return decode(a, {}, env)


def _schema_arg_names(op: torch._ops.OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments]


def _mutated_refs(node: S.Node, positions: Sequence[int], op: torch._ops.OpOverload) -> list[str]:
    names = _schema_arg_names(op)
    out = []
    for p in positions:
        arg = node.args[p] if p < len(node.args) else node.kwargs.get(names[p])
        if isinstance(arg, S.TensorRef):
            out.append(arg.name)
        elif arg is not None and not isinstance(arg, S.NoneArg):
            raise FunctionalizeError(f"{where(node)} mutates a list of tensors; not supported")
    return out


def _functionalize_node(node: S.Node, st: _State, env: SizeEnv | None) -> None:
    op = resolve_op(node.op)
    args = _decode(node.args, st, env)
    kwargs = {k: _decode_one(a, st, env) for k, a in node.kwargs.items()}
    hidden = HIDDEN_MUTATIONS.get(node.op)
    written = mutated_arguments(op)
    if hidden is not None and _training(node, args):
        _functional_call(node, resolve_op(hidden[0]), list(hidden[1]), args, kwargs, st, op,
                         new_returns_first=False)
        return
    if node.op == "aten.copy_.default":
        _copy(node, args, st)
        return
    if written:
        fop = functional_variant(op)
        _functional_call(node, fop, written, args, kwargs, st, op, new_returns_first=True)
        return
    result = op(*args, **kwargs)
    flat = flatten_result(result)
    is_view = node.op in VIEW_KINDS or _returns_alias(op)
    for i, (name, value) in enumerate(zip(node.outputs, flat[: len(node.outputs)], strict=True)):
        if not name:
            continue
        if is_view and isinstance(node.args[0], S.TensorRef) and node.op not in IDENTITY_OPS:
            base = st.alias[node.args[0].name]
            step = ViewStep(node.op, tuple(args[1:]), kwargs, i)
            st.define(name, value, _Alias(base.root, (*base.chain, step)))
        elif is_view and isinstance(node.args[0], S.TensorRef):
            st.define(name, value, st.alias[node.args[0].name])
        else:
            st.define(name, value, _Alias(name))


def _copy(node: S.Node, args: list[Any], st: _State) -> None:
    # aten.copy has no derivative formula; the new contents are just src, cast and broadcast
    dst, src = args[0], args[1]
    new = src
    if new.dtype != dst.dtype:
        new = aten._to_copy(new, dtype=dst.dtype)
    if new.shape != dst.shape:
        new = aten.expand(new, list(dst.shape))
    assert isinstance(node.args[0], S.TensorRef)
    alias = st.write(node.args[0].name, new, node)
    for name in node.outputs:
        if name:
            st.define(name, new, alias)


def _call_by_name(op: torch._ops.OpOverload, fop: torch._ops.OpOverload, args: list[Any],
                  kwargs: dict[str, Any]) -> Any:
    """Call ``fop`` with the arguments given to ``op``, schema defaults filled in by name."""
    named: dict[str, Any] = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            named[a.name] = args[i]
        elif a.name in kwargs:
            named[a.name] = kwargs[a.name]
        elif a.has_default_value():
            named[a.name] = a.default_value
    pos = [named[a.name] for a in fop._schema.arguments if not a.kwarg_only and a.name in named]
    kw = {a.name: named[a.name] for a in fop._schema.arguments if a.kwarg_only and a.name in named}
    return fop(*pos, **kw)


def _training(node: S.Node, args: list[Any]) -> bool:
    return len(args) > 5 and bool(args[5]) and args[3] is not None


def _returns_alias(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _functional_call(node: S.Node, fop: torch._ops.OpOverload, written: list[int], args: list[Any],
                     kwargs: dict[str, Any], st: _State, op: torch._ops.OpOverload, *,
                     new_returns_first: bool) -> None:
    targets = _mutated_refs(node, written, op)
    result = flatten_result(_call_by_name(op, fop, args, kwargs))
    if new_returns_first:
        # add_(self) -> add(self): the functional result *is* the new value of self; an
        # in-place view op (t_, unsqueeze_) turns self's name into a view instead
        if _returns_alias(fop):
            base = st.alias[targets[0]]
            if not base.chain and base.root in st.inputs:
                raise FunctionalizeError(f"{where(node)} changes the shape or strides of a graph "
                                         "input in place; use the out-of-place op")
            step = ViewStep(op_name(fop), tuple(args[1:]), kwargs, 0)
            for name in node.outputs[:1]:
                if name:
                    st.define(name, result[0], _Alias(base.root, (*base.chain, step)))
            return
        new_values = result[: len(targets)]
        extra: list[Any] = []
    else:
        n_ret = len(op._schema.returns)
        new_values = result[n_ret: n_ret + len(targets)]
        extra = result[:n_ret]
    for target, new in zip(targets, new_values, strict=True):
        alias = st.write(target, new, node)
        if new_returns_first:
            for name in node.outputs:
                if name:
                    st.define(name, new, alias)
                    st.made_at[name] = st.version[alias.root]
    for name, value in zip(node.outputs, extra[: len(node.outputs)], strict=False):
        if name:
            st.define(name, value, _Alias(name))


def has_mutations(graph: S.Graph) -> bool:
    """True when some node writes to a tensor (by schema or a known hidden mutation)."""
    return any(mutated_arguments(resolve_op(n.op)) or n.op in HIDDEN_MUTATIONS for n in graph.nodes)

