"""``MyFunction.apply(...)`` of a custom ``torch.autograd.Function``, as capture meets it.

With grad mode on, `torchfuse.capture.custom_backward` captures ``forward`` and ``backward``
together (joined by the format's ``torchfuse.custom_grad`` op); what it cannot model is a
graph break at the call, and the Function runs in Python with its own backward.

With grad mode off (``torch.no_grad()`` around the call or the compiled function, which the
entry's grad-mode guard covers), eager records no backward either: ``apply`` runs ``forward``
with grad off and hands back its outputs. So capture inlines ``forward`` into the graph
(BLOOM's ``GeLUFunction`` in inference was a break per layer). Its ``ctx`` is a `NoGradCtx`
made in the graph: what a forward may call on it with no backward to feed. A
``setup_context``-style Function's forward is called without ``ctx``, then its
``setup_context(ctx, inputs, output)``, as eager does under ``no_grad`` too. As in eager, an input that
``forward`` returns unchanged comes back as a new tensor viewing it (``apply`` never hands
back its input object), unless ``ctx.mark_dirty`` named it; an input that requires grad
handed back so is a break (eager's view of it does not require grad, one made in the graph
would).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.errors import Unsupported, UserException

_FUNCTION_APPLY = torch.autograd.Function.apply.__func__
_BASE_SETUP_CONTEXT = torch.autograd.Function.setup_context


class NoGradCtx:
    """The ``ctx`` of a forward inlined with grad mode off: its saving and marking methods keep
    what a forward may read back (and, with grad on, what `custom_backward` reads of it)."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad  # as eager's: the inputs' requires_grad
        self.saved_tensors = ()
        self.dirty = ()
        self.materialize_grads = True
        self.non_differentiable = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        self.dirty = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def set_materialize_grads(self, value):
        self.materialize_grads = value


class Interpreter(NamedTuple):
    """The interpreter's functions `apply` (and `torchfuse.capture.scan`) call, handed in by
    `torchfuse.capture.calls` (these modules are below the interpreter's core, not in its
    import cycle)."""

    inline: Callable[[V.Var, list[V.Var], dict[str, V.Var]], V.Var]
    construct: Callable[[type, list[V.Var], dict[str, V.Var]], V.Var]
    getattr: Callable[[V.Var, str], V.Var]
    call_method: Callable[[V.Var, str, list[V.Var], dict[str, V.Var]], V.Var]
    call: Callable[[V.Var, list[V.Var], dict[str, V.Var]], V.Var]


def apply(value: Any, args: list[V.Var], kwargs: dict[str, V.Var], interp: Interpreter) -> V.Var | None:
    """What ``value(*args, **kwargs)`` gives when ``value`` is a custom Function's ``apply``
    (None when it is not): ``forward`` inlined under grad mode off, else a graph break."""
    if getattr(value, "__func__", value) is not _FUNCTION_APPLY:
        return None
    inline = interp.inline
    ctx = current()
    owner = getattr(value, "__self__", None) if isinstance(value, types.MethodType) else None
    if owner is None and args and isinstance(args[0], V.ObjVar):  # Function.apply(MyFunction, ...)
        owner, args = args[0].value, args[1:]
    name = owner.__qualname__ if isinstance(owner, type) else "Function"
    if not isinstance(owner, type):
        raise Unsupported(f"{name}.apply: a custom torch.autograd.Function runs in Python", ctx.loc)
    if kwargs:
        raise Unsupported(f"{name}.apply with keyword arguments", ctx.loc)
    if torch.is_grad_enabled():
        from torchfuse.capture import custom_backward

        def make_ctx(needs: tuple[bool, ...]) -> V.Var:
            return interp.construct(NoGradCtx, [V.ConstVar(needs)], {})

        try:
            return custom_backward.apply(owner, name, list(args), interp, make_ctx)
        except (Unsupported, UserException) as e:  # as below: a break at the apply call
            why = e.reason if isinstance(e, Unsupported) else f"it raises {type(e.exc).__name__}"
            raise Unsupported(f"{name}.apply: a custom torch.autograd.Function runs in Python "
                              f"(its forward and backward were not captured: {why})", ctx.loc,
                              "under torch.no_grad() its forward alone is captured") from None
    try:
        needs = tuple(isinstance(a, V.TensorVar) and a.fake.requires_grad for a in args)
        fctx = interp.construct(NoGradCtx, [V.ConstVar(needs)], {})
        setup = getattr(owner.setup_context, "__func__", owner.setup_context)
        if setup is not _BASE_SETUP_CONTEXT:  # forward(*args), then setup_context(ctx, inputs, output)
            out = inline(V.ObjVar(owner.forward), list(args), {})
            inline(V.ObjVar(setup), [fctx, V.ListVar(list(args), tuple), out], {})
        else:
            out = inline(V.ObjVar(owner.forward), [fctx, *args], {})
        marked = interp.getattr(fctx, "dirty")
        dirty = list(marked.items) if isinstance(marked, V.ListVar) else []
        return _fresh_outputs(out, [a for a in args if isinstance(a, V.TensorVar)], dirty, interp)
    except (Unsupported, UserException) as e:
        # a break (or an exception) inside forward is a break at the apply call: the frames
        # inlined here are not the callee's, so nothing may resume inside them; Python then
        # runs apply itself (and raises what forward raises)
        why = e.reason if isinstance(e, Unsupported) else f"it raises {type(e.exc).__name__}"
        raise Unsupported(f"{name}.apply under no_grad: its forward was not captured ({why})",
                          ctx.loc) from None


def _fresh_outputs(out: V.Var, inputs: list[V.Var], dirty: list[V.Var], interp: Interpreter) -> V.Var:
    """``out`` with every input tensor it hands back unchanged replaced by a view of it (one
    that requires grad: a break, since a view made in the graph would require grad too)."""
    def fresh(v: V.Var) -> V.Var:
        if not any(v is i for i in inputs) or any(v is d for d in dirty):
            return v
        if v.fake.requires_grad:  # eager's view of it does not require grad; one made here would
            raise Unsupported("forward hands back an input that requires grad", current().loc)
        return interp.call_method(v, "view_as", [v], {})

    if type(out) is V.ListVar:
        return V.ListVar([fresh(v) for v in out.items], out.kind)
    return fresh(out)
