"""``torch.utils.checkpoint.checkpoint(function, *args, ...)`` (activation checkpointing, what
``model.gradient_checkpointing_enable()`` makes every transformers layer call), as capture
meets it.

Called on fakes, torch would run ``function`` behind capture's back, so it was a break
around every checkpointed layer, and the layers ran eagerly in Python. Now ``function`` is
interpreted into a Graph of its own (its tensor arguments and the parameters, buffers and
constants it reads become that Graph's inputs, lifted from the outer graph as it uses them),
and one ``torchfuse.checkpoint`` node runs it (`torchfuse.graph.checkpoint_region`). Its
derivative keeps only the region's inputs and runs the region again in backward, as eager's
checkpoint does, so the memory a user turns checkpointing on for is saved in compiled
training too.

As eager: under grad mode off the function is simply called (interpreted inline); keyword
arguments are passed to it with ``use_reentrant=False``; ``preserve_rng_state``,
``determinism_check``, ``debug`` and ``early_stop`` change nothing a Graph computes.

What stays a break (torch runs the call, with its own checks and warnings): ``use_reentrant``
not given (torch warns, then picks the reentrant variant) or not a constant; the reentrant
variant with keyword arguments (torch raises) or with no tensor argument that requires grad
(its outputs then require no grad, and the region's parameters get no gradient); a
``context_fn`` (selective checkpointing policies); a region whose random op (eager
replays the generator's state to draw the same numbers when it recomputes; here what it drew
is kept, `checkpoint_region.keep_draws`) has several outputs or a layout a copy would not
keep; one that writes outside itself (eager runs the write twice); results other than tensors and
constants, flat or in one tuple or list; a checkpoint inside a checkpointed function.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.utils.checkpoint
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.custom_function import Interpreter
from torchfuse.capture.dtype_rules import CheckingRecorder
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.values import from_py
from torchfuse.graph import checkpoint_region, custom_grad
from torchfuse.graph import schema as S
from torchfuse.graph.ops import meta_of, resolve_op
from torchfuse.graph.tracing import GraphBuilder

_CHECKPOINT = torch.utils.checkpoint.checkpoint
_NO_EFFECT = frozenset({"preserve_rng_state", "determinism_check", "debug", "early_stop"})


class RegionRecorder(CheckingRecorder):
    """Records a region into its own Graph; a tensor of the outer graph it meets becomes an
    input of that Graph (`lifted`, in the order met)."""

    def __init__(self, builder: GraphBuilder, outer: CheckingRecorder) -> None:
        super().__init__(builder)
        self.outer = outer
        self.lifted: dict[str, torch.Tensor] = {}

    def name_of(self, t: torch.Tensor) -> str:
        if id(t) not in self.names and id(t) in self.outer.names:
            name = self.builder.add_input(meta_of(t), name="lifted", kind="user_input")
            self.bind(t, name)
            self.lifted[name] = t
        return super().name_of(t)


def apply(value: Any, args: list[V.Var], kwargs: dict[str, V.Var], interp: Interpreter) -> V.Var | None:
    """The Var of ``checkpoint(...)`` when ``value`` is torch's checkpoint (None when not)."""
    if value is not _CHECKPOINT:
        return None
    ctx = current()
    try:
        bound = _signature().bind(*args, **kwargs)
    except TypeError:
        raise Unsupported("torch.utils.checkpoint with arguments it does not take", ctx.loc) from None
    function = bound.arguments["function"]
    fargs = list(bound.arguments.get("args", ()))
    extra = dict(bound.arguments.get("kwargs", {}))
    reentrant = bound.arguments.get("use_reentrant")
    for name in _NO_EFFECT & set(extra):
        extra.pop(name)
    if "context_fn" in bound.arguments:
        raise Unsupported("torch.utils.checkpoint with a context_fn", ctx.loc)
    if not isinstance(reentrant, V.ConstVar) or type(reentrant.python()) is not bool:
        raise Unsupported("torch.utils.checkpoint without a constant use_reentrant", ctx.loc,
                          "pass use_reentrant=False (torch recommends it)")
    if reentrant.python() and extra:
        raise Unsupported("torch.utils.checkpoint(use_reentrant=True) with keyword arguments", ctx.loc)
    if not torch.is_grad_enabled():
        return interp.call(function, fargs, extra)  # nothing to recompute: eager calls it
    if reentrant.python() and not any(isinstance(a, V.TensorVar) and a.fake.requires_grad for a in fargs):
        raise Unsupported("torch.utils.checkpoint(use_reentrant=True) with no input that requires grad",
                          ctx.loc)
    return _region(function, fargs, extra, interp)


def _region(function: V.Var, args: list[V.Var], kwargs: dict[str, V.Var], interp: Interpreter) -> V.Var:
    ctx = current()
    if ctx.outer_rec is not None:  # the inner region would lift from the outer region's inputs
        raise Unsupported("torch.utils.checkpoint inside a checkpointed function", ctx.loc)
    main, effects = ctx.rec, len(ctx.side_effects)
    sub = RegionRecorder(GraphBuilder("checkpoint"), main)
    sub.builder.size_env = ctx.size_env  # the outer graph's size symbols, bound below to its own inputs
    ctx.rec, ctx.outer_rec = sub, main
    try:
        out = interp.call(function, args, kwargs)
        if not _restored(ctx.side_effects[effects:]):
            raise Unsupported("a checkpointed function that writes outside itself", ctx.loc)
        items = out.items if type(out) is V.ListVar else [out]
        if not all(isinstance(v, V.TensorVar | V.ConstVar) for v in items):
            raise Unsupported("a checkpointed function returning other than tensors and constants",
                              ctx.loc)
        tensors = [v for v in items if isinstance(v, V.TensorVar)]
        for v in tensors:
            sub.output(v.fake)
        graph = custom_grad.bound_to_inputs(sub.builder.build())
        if graph is None:
            raise Unsupported("a checkpointed function using a size symbol none of its inputs has", ctx.loc)
    finally:
        ctx.rec, ctx.outer_rec = main, None
    if any(_draws(n) for n in graph.nodes):  # kept for the recompute, as eager replays them
        kept = checkpoint_region.keep_draws(graph, _draws)
        if kept is None:
            raise Unsupported("a checkpointed function whose random op has several outputs or a "
                              "layout a copy would not keep", ctx.loc)
        graph = kept
    sources = {**sub.lifted, **sub.constants}
    if any(inp.name not in sources for inp in graph.inputs):
        raise Unsupported("a checkpointed function that makes graph inputs of its own", ctx.loc)
    inputs = [sources[inp.name] for inp in graph.inputs]
    fakes = ctx.call_torch(torch.ops.torchfuse.checkpoint.default,
                           [checkpoint_region.dumps(graph), inputs], {}, "torch.utils.checkpoint")
    fresh = {id(v): from_py(f) for v, f in zip(tensors, fakes[:len(tensors)], strict=True)}
    new = [fresh.get(id(v), v) for v in items]
    return V.ListVar(new, out.kind) if type(out) is V.ListVar else new[0]


def _draws(node: S.Node) -> bool:
    """Whether the node draws random numbers: a random op (torch's ``nondeterministic_seeded``
    tag), unless its dropout probability is 0 (attention kernels carry the tag for their
    ``dropout_p``; a model in training mode calls them with 0.0)."""
    op = resolve_op(node.op)
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    for k, arg in enumerate(op._schema.arguments):
        if arg.name in ("dropout_p", "p"):
            given = node.kwargs.get(arg.name, node.args[k] if k < len(node.args) else None)
            value = given.value if isinstance(given, S.Float | S.Int) else \
                arg.default_value if given is None and arg.has_default_value() else None
            return not (type(value) in (int, float) and value == 0)
    return True


def _restored(effects: list[Any]) -> bool:
    """Whether the region's writes outside itself leave everything as it was: only attribute
    writes, each attribute's last one putting back the value it holds now (transformers'
    output-capture context variable, set and reset around every layer). Then running the
    region once, or twice as eager's recompute does, comes to the same."""
    last: dict[tuple[int, str], tuple[Any, V.Var]] = {}
    for effect in effects:
        if effect[0] != "setattr":
            return False
        _, obj, name, value = effect[:4]
        last[(id(obj), name)] = (obj, value)
    for (_, name), (obj, value) in last.items():
        real = getattr(getattr(obj, "value", None), name, _MISSING)
        if not isinstance(value, V.ConstVar) or type(value.value) is not type(real) or value.value != real:
            return False
    return True


_MISSING = object()


@functools.cache
def _signature() -> inspect.Signature:
    return inspect.signature(_CHECKPOINT)
