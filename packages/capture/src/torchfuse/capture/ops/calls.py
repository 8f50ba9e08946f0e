"""The call protocol: KW_NAMES + CALL, CALL_FUNCTION_EX, MAKE_FUNCTION.

Both 3.11 and 3.12 lay out ``[NULL or callable, callable or self, *args]`` below a ``CALL``:
when the lower slot is NULL the upper one is the callable; otherwise the lower one is the
callable and the upper one its first argument.
"""

from __future__ import annotations

from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.calls import call as call_var
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.versions import kw_names


def kw_names_(frame, inst) -> None:
    frame.kw_names = kw_names(frame.code, inst)


def call(frame, inst) -> None:
    args = frame.popn(inst.arg)
    names = frame.kw_names
    frame.kw_names = ()
    upper = frame.pop()
    lower = frame.pop()
    if lower is V.NULL:
        fn = upper
    else:
        fn, args = lower, [upper, *args]
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[len(args) - len(names):], strict=True))
        args = args[:len(args) - len(names)]
    frame.push(call_var(fn, args, kwargs))


def call_function_ex(frame, inst) -> None:
    kwargs_var = frame.pop() if inst.arg & 1 else V.DictVar({})
    args_var = frame.pop()
    fn = frame.pop()
    if frame.stack and frame.stack[-1] is V.NULL:
        frame.pop()
    if not isinstance(kwargs_var, V.DictVar):
        raise Unsupported(f"** of {kwargs_var.describe()}")
    frame.push(call_var(fn, O.iterate(args_var), dict(kwargs_var.items)))


def make_function(frame, inst) -> None:
    code = frame.pop().python()
    flags = inst.arg
    closure = tuple(frame.pop().items) if flags & 0x08 else ()
    if flags & 0x04:
        frame.pop()  # annotations are not needed
    kwdefaults = dict(_dict_items(frame.pop())) if flags & 0x02 else {}
    defaults = tuple(O.iterate(frame.pop())) if flags & 0x01 else ()
    frame.push(V.FunctionVar(code, frame.f_globals, defaults, kwdefaults, closure,
                             frame.f_globals is frame.ctx.f_globals))


def _dict_items(var: V.Var) -> dict:
    if isinstance(var, V.DictVar):
        return var.items
    return {k: V.ConstVar(v) for k, v in var.python().items()}


HANDLERS = {
    "KW_NAMES": kw_names_, "CALL": call, "CALL_FUNCTION_EX": call_function_ex,
    "MAKE_FUNCTION": make_function,
}
