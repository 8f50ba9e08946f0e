"""``MyFunction.apply(...)`` with grad mode on and an input that requires grad: the Function's
``forward`` and ``backward`` both captured, joined by the format's ``torchfuse.custom_grad``
op (`torchfuse.graph.custom_grad`).

What eager does, and capture with it:

- ``forward`` runs with grad mode off: capture interprets it between two
  ``torchfuse.set_grad_enabled`` nodes, with a ``ctx`` made in the graph (the same
  `NoGradCtx` as under ``no_grad``) whose ``needs_input_grad`` is the inputs'
  ``requires_grad``;
- the outputs that are floating-point tensors, and not marked non-differentiable, come back
  as new tensors whose gradient is the Function's ``backward``. Capture interprets
  ``backward(ctx, *grads)`` at once, on fakes of its own, into a separate Graph: its inputs
  are the tensors ``forward`` saved (``ctx.save_for_backward`` and tensors kept as ``ctx``
  attributes) and one gradient per such output; its outputs are one gradient per input that
  requires grad. The backward's reads of Python state are guarded like any other read;
- the ``custom_grad`` node then stands in the graph for those outputs, and every stage
  differentiates it by running that Graph (``torchfuse.autograd``'s joint graph records its
  ops as it records ATen's derivative formulas).

Size symbols of the outer graph are the backward Graph's too, bound from its own inputs.

What stays a graph break (the Function runs in Python with its own backward, as before): a
saved tensor with symbolic sizes that is not dense; ``mark_dirty`` or
``set_materialize_grads(False)``; an input handed back as an output; keyword arguments; a
``backward`` that writes outside itself (a side effect: DDP's ``_DDPSink`` queues the delayed
all-reduce there), reads a tensor that ``forward`` did not save, breaks, raises, or returns
gradients whose number, sizes or dtypes differ from what eager accepts without converting.
Higher-order gradients through the Function differentiate the backward Graph's ops, not a
``backward`` of ``backward``.
"""

from __future__ import annotations

from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dtype_rules import CheckingRecorder
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.values import from_py
from torchfuse.graph import custom_grad
from torchfuse.graph import schema as S
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED
from torchfuse.graph.tracing import GraphBuilder, is_symbolic

_CTX_FIELDS = ("needs_input_grad", "saved_tensors", "dirty", "materialize_grads", "non_differentiable")


def apply(owner: type, name: str, args: list[V.Var], interp: Any, make_ctx: Any) -> V.Var:
    """The Vars ``owner.apply(*args)`` gives (see the module doc); Unsupported when it must
    run in Python."""
    ctx = current()
    tensors = [a for a in args if isinstance(a, V.TensorVar)]
    needs = tuple(isinstance(a, V.TensorVar) and a.fake.requires_grad for a in args)
    fctx = make_ctx(needs)
    setup = getattr(owner.setup_context, "__func__", owner.setup_context)
    _set_grad(False)
    try:
        if setup is not torch.autograd.Function.setup_context:
            out = interp.inline(V.ObjVar(owner.forward), list(args), {})
            interp.inline(V.ObjVar(setup), [fctx, V.ListVar(list(args), tuple), out], {})
        else:
            out = interp.inline(V.ObjVar(owner.forward), [fctx, *args], {})
    finally:
        _set_grad(True)
    state = dict(fctx.overrides)
    if _items(state.get("dirty")):
        raise Unsupported("ctx.mark_dirty", ctx.loc)
    if state.get("materialize_grads") is not None and state["materialize_grads"].python() is not True:
        raise Unsupported("ctx.set_materialize_grads(False)", ctx.loc)
    items = out.items if type(out) is V.ListVar else [out]
    if any(v is a for v in items for a in tensors):
        raise Unsupported("forward hands back an input", ctx.loc)
    skip = {id(v) for v in _items(state.get("non_differentiable"))}
    outs = [v for v in items if isinstance(v, V.TensorVar) and id(v) not in skip and
            (v.fake.dtype.is_floating_point or v.fake.dtype.is_complex)]
    wanted = [a for a in tensors if a.fake.requires_grad]
    if not outs or not wanted:
        return out  # nothing to differentiate: as eager, the outputs do not require grad
    saved = _saved_tensors(state)
    graph = _trace_backward(owner, state, saved, outs, items, args, needs, interp, make_ctx)
    fakes = ctx.call_torch(torch.ops.torchfuse.custom_grad.default,
                           [custom_grad.dumps(graph), [a.fake for a in wanted], [o.fake for o in outs],
                            [s.fake for s in saved]], {}, f"{name}.apply")
    fresh = {id(o): from_py(f) for o, f in zip(outs, fakes, strict=True)}
    new = [fresh.get(id(v), v) for v in items]
    return V.ListVar(new, out.kind) if type(out) is V.ListVar else new[0]


def _set_grad(enabled: bool) -> None:
    """``builtins.set_grad``'s switch, written here: importing builtins (even inside a
    function) would put this module in the interpreter's import cycle."""
    ctx = current()
    if torch.is_grad_enabled() != enabled:
        torch.set_grad_enabled(enabled)
        ctx.add_node(SET_GRAD_ENABLED, [S.Bool(value=enabled)])


def _items(var: V.Var | None) -> list[V.Var]:
    if var is None or (isinstance(var, V.ConstVar) and var.value in (None, ())):
        return []
    if type(var) is V.ListVar:
        return list(var.items)
    raise Unsupported(f"ctx state {var.describe()}", current().loc)


def _saved_tensors(state: dict[str, V.Var]) -> list[V.TensorVar]:
    """The tensors ``backward`` may read: saved ones, then tensor attributes of ``ctx``, each
    once."""
    found: dict[int, V.TensorVar] = {}
    for key, var in state.items():
        if key in _CTX_FIELDS and key != "saved_tensors":
            continue  # the ctx's own bookkeeping (marked outputs), not read by backward
        values = _items(var) if key == "saved_tensors" or type(var) is V.ListVar else [var]
        for v in values:
            if isinstance(v, V.TensorVar):
                found.setdefault(id(v), v)
            elif type(v) in (V.ListVar, V.DictVar):
                raise Unsupported(f"ctx.{key} holds a container", current().loc)
    return list(found.values())


def _trace_backward(owner: type, state: dict[str, V.Var], saved: list[V.TensorVar], outs: list[V.TensorVar],
                    items: list[V.Var], args: list[V.Var], needs: tuple[bool, ...], interp: Any,
                    make_ctx: Any) -> S.Graph:
    """``owner.backward`` interpreted into a Graph of its own (see the module doc). It gets a
    gradient per forward output, as eager passes them: an input of the Graph for each of
    ``outs``, zeros for another tensor output (non-differentiable), None for the rest."""
    ctx = current()
    main, effects, grad_mode = ctx.rec, len(ctx.side_effects), torch.is_grad_enabled()
    sub = CheckingRecorder(GraphBuilder(f"{owner.__qualname__}.backward"))
    sub.builder.size_env = ctx.size_env  # the outer graph's size symbols, bound below to its own inputs
    ctx.rec = sub
    try:
        torch.set_grad_enabled(False)  # eager's backward runs without recording (no create_graph)
        mapped = {id(s): _fresh(_input(sub, s.fake, "saved")) for s in saved}
        grads = {id(o): _fresh(_input(sub, o.fake, "grad", dense=True)) for o in outs}
        n_inputs = len(sub.builder.inputs)
        zeros = ctx.wrap(torch.zeros, None)
        per_output = [grads[id(v)] if id(v) in grads else
                      interp.call(zeros, [V.ConstVar(tuple(v.fake.shape))],
                                  {"dtype": V.ConstVar(v.fake.dtype), "device": V.ConstVar(v.fake.device)})
                      if isinstance(v, V.TensorVar) else V.ConstVar(None) for v in items]
        bctx = make_ctx(needs)
        for key, var in state.items():
            if key in _CTX_FIELDS and key != "saved_tensors":
                continue
            if type(var) is V.ListVar:
                bctx.overrides[key] = V.ListVar([mapped.get(id(v), v) for v in var.items], var.kind)
            else:
                bctx.overrides[key] = mapped.get(id(var), var)
        result = interp.inline(V.ObjVar(owner.backward), [bctx, *per_output], {})
        if len(ctx.side_effects) != effects:
            raise Unsupported("backward writes outside itself", ctx.loc)
        if len(sub.builder.inputs) != n_inputs:
            raise Unsupported("backward reads a tensor forward did not save", ctx.loc)
        got = result.items if type(result) is V.ListVar else [result]
        if len(got) != len(args):
            raise Unsupported(f"backward returns {len(got)} gradients for {len(args)} inputs", ctx.loc)
        for a, g, need in zip(args, got, needs, strict=True):
            if not need:
                continue
            if isinstance(g, V.ConstVar) and g.value is None:
                sub.builder.add_output(S.NoneArg(), kind="gradient")
                continue
            if not isinstance(g, V.TensorVar) or g.fake.shape != a.fake.shape or g.fake.dtype != a.fake.dtype:
                raise Unsupported("backward returns a gradient unlike its input", ctx.loc)
            try:
                sub.output(g.fake, kind="gradient")
            except RuntimeError as e:  # a tensor of the outer graph: not saved
                raise Unsupported("backward returns a tensor forward did not save", ctx.loc) from e
        graph = custom_grad.bound_to_inputs(sub.builder.build())
        if graph is None:
            raise Unsupported("backward uses a size symbol none of its inputs has", ctx.loc)
        return graph
    finally:
        ctx.rec = main
        torch.set_grad_enabled(grad_mode)


def _input(sub: CheckingRecorder, fake: torch.Tensor, name: str, dense: bool = False) -> torch.Tensor:
    """A new input of ``sub`` like ``fake`` (contiguous when ``dense``), its symbolic sizes
    kept symbolic."""
    if not is_symbolic(fake):
        return sub.input(fake.contiguous() if dense else fake, name=name, requires_grad=False)
    try:  # a symbolic input is made dense
        return sub.input(fake, name=name, requires_grad=False, sizes=list(fake.shape))
    except ValueError as e:
        raise Unsupported(f"a {name} tensor with symbolic sizes that is not dense", current().loc) from e


def _fresh(fake: torch.Tensor) -> V.Var:
    return from_py(fake)
