"""Loads and stores: locals, globals, cells, attributes, imports."""

from __future__ import annotations

import builtins

from torchfuse.capture import variables as V
from torchfuse.capture.attrs import getattr_var, setattr_var
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.source import GlobalSource, ModuleGlobalSource


def load_const(frame, inst) -> None:
    frame.push(V.ConstVar(inst.argval))


def load_fast(frame, inst) -> None:
    v = frame.locals.get(inst.argval, V.UNBOUND)
    if v is V.UNBOUND:
        raise Unsupported(f"UnboundLocalError: local {inst.argval!r} read before assignment")
    frame.push(v)


def load_fast_and_clear(frame, inst) -> None:
    frame.push(frame.locals.pop(inst.argval, V.UNBOUND))


def store_fast(frame, inst) -> None:
    v = frame.pop()
    if v is V.UNBOUND:
        frame.locals.pop(inst.argval, None)
    else:
        frame.locals[inst.argval] = v


def delete_fast(frame, inst) -> None:
    frame.locals.pop(inst.argval, None)


def load_global(frame, inst) -> None:
    name = inst.argval
    if inst.arg & 1:
        frame.push(V.NULL)
    frame.push(global_var(frame, name))


def global_var(frame, name: str) -> V.Var:
    ctx = frame.ctx
    g = frame.f_globals
    override = ctx.global_overrides.get((id(g), name))
    if override is not None:
        return override
    if name in g:
        if g is ctx.f_globals:
            source = GlobalSource(name)
        else:
            mod = g.get("__name__")
            import sys

            source = ModuleGlobalSource(mod, name) if mod in sys.modules and \
                sys.modules[mod].__dict__ is g else None
        return ctx.wrap(g[name], source)
    b = g.get("__builtins__", builtins)
    b = b if isinstance(b, dict) else b.__dict__
    if name in b:
        return V.ObjVar(b[name])
    raise UserException(NameError(f"name {name!r} is not defined"))


def store_global(frame, inst) -> None:
    v = frame.pop()
    ctx = frame.ctx
    if frame.f_globals is not ctx.f_globals:
        raise Unsupported("assignment to a global of another module")
    ctx.global_overrides[(id(frame.f_globals), inst.argval)] = v
    ctx.side_effects.append(("setglobal", inst.argval, v, ctx.loc))


def load_deref(frame, inst) -> None:
    cell = frame.cells.get(inst.argval)
    if cell is None:
        raise Unsupported(f"free variable {inst.argval!r} is not known")
    if cell.contents is V.UNBOUND:
        raise Unsupported(f"NameError: free variable {inst.argval!r} referenced before assignment")
    frame.push(cell.contents)


def store_deref(frame, inst) -> None:
    v = frame.pop()
    cell = frame.cells.get(inst.argval)
    if cell is None:
        cell = frame.cells[inst.argval] = V.CellVar()
    if cell.source is not None:
        raise Unsupported(f"assignment to closure variable {inst.argval!r} of the compiled function")
    cell.contents = v


def delete_deref(frame, inst) -> None:
    frame.cells[inst.argval].contents = V.UNBOUND


def load_closure(frame, inst) -> None:
    frame.push(frame.cells[inst.argval])


def load_attr(frame, inst) -> None:
    obj = frame.pop()
    method = bool(inst.arg & 1) if inst.opname == "LOAD_ATTR" and _has_method_bit() else \
        inst.opname == "LOAD_METHOD"
    attr = getattr_var(obj, inst.argval)
    if method:
        frame.push(V.NULL)
    frame.push(attr)


def _has_method_bit() -> bool:
    from torchfuse.capture.versions import LOAD_ATTR_HAS_METHOD_BIT

    return LOAD_ATTR_HAS_METHOD_BIT


def load_super_attr(frame, inst) -> None:
    self_var = frame.pop()
    cls = frame.pop()
    frame.pop()  # the global `super`
    from torchfuse.capture.attrs import _super_attr

    attr = _super_attr(V.SuperVar(cls.python(), self_var), inst.argval)
    if inst.arg & 1:
        frame.push(V.NULL)
    frame.push(attr)


def store_attr(frame, inst) -> None:
    obj = frame.pop()
    value = frame.pop()
    setattr_var(obj, inst.argval, value)


def delete_attr(frame, inst) -> None:
    from torchfuse.capture.builtins import delattr_var

    delattr_var(frame.pop(), inst.argval)


def import_name(frame, inst) -> None:
    fromlist = frame.pop().python()
    level = frame.pop().python()
    try:
        module = __import__(inst.argval, frame.f_globals, None, fromlist, level)
    except ImportError as e:
        raise UserException(e) from e
    frame.push(V.ObjVar(module))


def import_from(frame, inst) -> None:
    frame.push(getattr_var(frame.stack[-1], inst.argval))


def load_assertion_error(frame, inst) -> None:
    frame.push(V.ObjVar(AssertionError))


HANDLERS = {
    "LOAD_CONST": load_const, "LOAD_FAST": load_fast, "LOAD_FAST_CHECK": load_fast,
    "LOAD_FAST_AND_CLEAR": load_fast_and_clear, "STORE_FAST": store_fast,
    "DELETE_FAST": delete_fast, "LOAD_GLOBAL": load_global, "STORE_GLOBAL": store_global,
    "LOAD_DEREF": load_deref, "LOAD_CLASSDEREF": load_deref, "STORE_DEREF": store_deref,
    "DELETE_DEREF": delete_deref, "LOAD_CLOSURE": load_closure, "LOAD_ATTR": load_attr,
    "LOAD_METHOD": load_attr, "LOAD_SUPER_ATTR": load_super_attr, "STORE_ATTR": store_attr,
    "DELETE_ATTR": delete_attr,
    "IMPORT_NAME": import_name, "IMPORT_FROM": import_from,
    "LOAD_ASSERTION_ERROR": load_assertion_error,
}
