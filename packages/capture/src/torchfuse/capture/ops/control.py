"""Control flow: jumps (folded on constants), loops (unrolled), with, return, yield, raise."""

from __future__ import annotations

import contextlib
import inspect

from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.builtins import context_of_object, enter_context
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.versions import SEND_POPS_RECEIVER, for_iter_exit


def jump(frame, inst) -> None:
    frame.jump(inst.argval)


def _pop_jump(when: str):
    def h(frame, inst) -> None:
        v = frame.pop()
        if when == "none":
            taken = O.is_same(v, V.ConstVar(None))
        elif when == "not_none":
            taken = not O.is_same(v, V.ConstVar(None))
        else:
            taken = O.truth(v) == (when == "true")
        if taken:
            frame.jump(inst.argval)
    return h


def _jump_or_pop(when: bool):
    def h(frame, inst) -> None:
        if O.truth(frame.stack[-1]) == when:
            frame.jump(inst.argval)
        else:
            frame.pop()
    return h


def get_iter(frame, inst) -> None:
    v = frame.pop()
    frame.push(v if isinstance(v, V.IteratorVar) else V.IteratorVar(O.iterate(v)))


def for_iter(frame, inst) -> None:
    it = frame.stack[-1]
    if not isinstance(it, V.IteratorVar):
        raise Unsupported(f"FOR_ITER over {it.describe()}")
    if frame.yields is not None and not it.bounded:
        # a generator is collected whole: over an endless iterator it would never end
        raise Unsupported("a generator looping over an endless iterator (itertools.count, cycle)")
    v = it.next()
    if v is None:
        frame.pop()
        frame.ip = for_iter_exit(frame.insts, frame.index_of[inst.argval])
    else:
        frame.push(v)


def return_value(frame, inst) -> None:
    _return(frame, frame.pop())


def return_const(frame, inst) -> None:
    _return(frame, V.ConstVar(inst.argval))


def _return(frame, value: V.Var) -> None:
    if frame.yields is not None:
        value = V.IteratorVar(frame.yields)
    frame.result = value


def return_generator(frame, inst) -> None:
    frame.yields = []
    frame.push(V.ConstVar(None))


def yield_value(frame, inst) -> None:
    if frame.yields is None:
        raise Unsupported("yield outside a generator being collected")
    frame.yields.append(frame.pop())
    frame.push(V.ConstVar(None))


def get_yield_from_iter(frame, inst) -> None:
    get_iter(frame, inst)


def send(frame, inst) -> None:
    """``yield from``: our generators are collected whole, so SEND just drains the
    sub-iterator one item per round trip through YIELD_VALUE."""
    frame.pop()  # the value sent in (always None here)
    it = frame.stack[-1]
    if not isinstance(it, V.IteratorVar):
        raise Unsupported(f"yield from {it.describe()}")
    v = it.next()
    if v is not None:
        frame.push(v)
        return
    if SEND_POPS_RECEIVER:
        frame.pop()
    frame.push(V.ConstVar(None))  # the sub-generator's return value
    frame.jump(inst.argval)


def end_send(frame, inst) -> None:
    value = frame.pop()
    frame.pop()
    frame.push(value)


_PURE_CONTEXTS = (contextlib.nullcontext, contextlib.suppress)
"""contextlib's classes whose ``__enter__``/``__exit__`` only return and compare: interpreted.
(``transformers`` 5.17's ``maybe_autocast`` returns a ``nullcontext`` outside autocast, which
broke Llama's rotary embedding out of the graph when every contextlib object ran in Python.)"""


def before_with(frame, inst) -> None:
    mgr = frame.pop()
    if isinstance(mgr, V.ObjVar):
        mgr = context_of_object(mgr.value) or mgr
    if isinstance(mgr, V.ContextVar):
        enter_context(mgr)
        frame.push(V.ExitVar(mgr))
        frame.push(V.ConstVar(None))
        return
    if isinstance(mgr, V.UserObjVar) and isinstance(mgr.value, contextlib.AbstractContextManager) \
            and type(mgr.value).__module__ == "contextlib" and type(mgr.value) not in _PURE_CONTEXTS:
        # a @contextmanager generator: interpreting it would run the code after its yield
        # at __enter__; both halves run in Python instead, the block resumes between them.
        # So do contextlib's classes that touch process state (redirect_stdout, chdir,
        # ExitStack's callbacks); its pure ones are interpreted as any other object
        what = "a @contextmanager generator" if inspect.isgenerator(getattr(mgr.value, "gen", None)) \
            else "contextlib"
        raise Unsupported(f"`with` on {type(mgr.value).__qualname__} ({what}; its __enter__ and "
                          f"__exit__ run in Python)")
    if isinstance(mgr, V.UserObjVar):
        from torchfuse.capture.attrs import getattr_var
        from torchfuse.capture.calls import call

        exit_fn = getattr_var(mgr, "__exit__")
        frame.push(V.UserExitVar(exit_fn))
        frame.push(call(getattr_var(mgr, "__enter__"), [], {}))
        return
    raise Unsupported(f"`with` on {mgr.describe()}")


def raise_varargs(frame, inst) -> None:
    if inst.arg == 0:  # bare ``raise``: the exception being handled
        if not frame.exc_info:
            raise UserException(RuntimeError("No active exception to reraise"))
        raise UserException(_exception(frame.exc_info[-1]))
    cause = frame.pop() if inst.arg == 2 else None
    value = _exception(frame.pop())
    if cause is not None:  # ``raise X from Y``: what Python sets on X
        c = None if isinstance(cause, V.ConstVar) and cause.value is None else _exception(cause)
        value.__cause__ = c
        value.__suppress_context__ = True
    raise UserException(value)


def _exception(var: V.Var) -> BaseException:
    value = var.value if isinstance(var, V.ObjVar | V.ConstVar) else None
    if isinstance(value, type) and issubclass(value, BaseException):
        value = value()
    if not isinstance(value, BaseException):
        raise Unsupported(f"raise of {var.describe()}")
    return value


def push_exc_info(frame, inst) -> None:
    exc = frame.pop()
    frame.push(frame.exc_info[-1] if frame.exc_info else V.ConstVar(None))
    frame.exc_info.append(exc)
    frame.push(exc)


def pop_except(frame, inst) -> None:
    frame.pop()
    if frame.exc_info:
        frame.exc_info.pop()


def check_exc_match(frame, inst) -> None:
    typ = frame.pop().python()
    exc = frame.stack[-1]
    frame.push(V.ConstVar(isinstance(exc.python(), typ)))


def reraise(frame, inst) -> None:
    exc = frame.pop()
    if isinstance(exc, V.ObjVar) and isinstance(exc.value, BaseException):
        raise UserException(exc.value)
    raise Unsupported(f"re-raise of {exc.describe()}")


def exception_path(frame, inst) -> None:
    raise Unsupported(f"exception handling ({inst.opname}) is not captured")


HANDLERS = {
    "JUMP_FORWARD": jump, "JUMP_BACKWARD": jump, "JUMP_BACKWARD_NO_INTERRUPT": jump,
    "JUMP": jump, "JUMP_NO_INTERRUPT": jump,
    "JUMP_IF_TRUE_OR_POP": _jump_or_pop(True), "JUMP_IF_FALSE_OR_POP": _jump_or_pop(False),
    "GET_ITER": get_iter, "FOR_ITER": for_iter, "RETURN_VALUE": return_value,
    "RETURN_CONST": return_const, "RETURN_GENERATOR": return_generator,
    "YIELD_VALUE": yield_value, "BEFORE_WITH": before_with, "RAISE_VARARGS": raise_varargs,
    "GET_YIELD_FROM_ITER": get_yield_from_iter, "SEND": send, "END_SEND": end_send,
}
for _when in ("TRUE", "FALSE", "NONE", "NOT_NONE"):
    for _prefix in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
        HANDLERS[_prefix + _when] = _pop_jump(_when.lower())
HANDLERS.update({"PUSH_EXC_INFO": push_exc_info, "POP_EXCEPT": pop_except,
                 "CHECK_EXC_MATCH": check_exc_match, "RERAISE": reraise})
for _name in ("WITH_EXCEPT_START", "CLEANUP_THROW", "SETUP_ANNOTATIONS",
              "LOAD_BUILD_CLASS"):
    HANDLERS[_name] = exception_path
