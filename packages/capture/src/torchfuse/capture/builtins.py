"""Builtins, ``operator``, ``math`` and the grad-mode/autocast context managers.

`handler_for` maps a Python callable to the function that evaluates it on Vars. The
table is written out here, in one place; callables not in it fall to the generic rules of
[`torchfuse.capture.calls`][torchfuse.capture.calls].
"""

from __future__ import annotations

import builtins
import copy
import functools
import inspect
import math
import operator
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture import floats, stdlib
from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dynamic import SYM_TYPES, concrete
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.source import AttrSource
from torchfuse.capture.values import from_py, to_py
from torchfuse.graph.symbolic import SpecializationError

Handler = Callable[[list[V.Var], dict[str, V.Var]], V.Var]


def _const_args(args: list[V.Var], kwargs: dict[str, V.Var]) -> bool:
    from torchfuse.capture.values import contains_tensor

    return all(isinstance(a, V.ConstVar | V.ObjVar | V.ListVar | V.DictVar | V.SetVar)
               and not contains_tensor(a)
               for a in [*args, *kwargs.values()])


def _math(fn: Callable[..., Any]) -> Handler:
    """``math.sqrt(f)`` and the like: kept in the graph for a varying float (`floats.math_call`),
    else folded."""
    fold = _fold(fn)

    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        kept = floats.math_call(fn, args, kwargs)
        return kept if kept is not None else fold(args, kwargs)
    return h


def _fold(fn: Callable[..., Any]) -> Handler:
    # text and hashing need the number itself: a symbolic size is specialized first
    # (str(SymInt) would print the expression, "s0")
    prep = concrete if fn in _NEEDS_NUMBERS else (lambda v: v)

    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        if not _const_args(args, kwargs):
            raise Unsupported(f"{fn.__name__}() on non-constant arguments", current().loc)
        try:
            return from_py(fn(*[prep(a.python()) for a in args],
                              **{k: prep(v.python()) for k, v in kwargs.items()}))
        except SpecializationError:
            raise
        except Exception as e:  # what eager would raise
            raise UserException(e, current().loc) from e
    return h


_NEEDS_NUMBERS = {str, repr, format, hash, chr, bin, hex, oct}
_HASH = _fold(hash)


def _call(fn: V.Var, *args: V.Var) -> V.Var:
    from torchfuse.capture.calls import call

    return call(fn, list(args), {})


def _len(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    (x,) = args
    if isinstance(x, V.ListVar | V.DictVar | V.SetVar):
        if x.source is not None and not isinstance(x, V.SetVar):
            current().guards.length(x.source, len(x.items))
        return V.ConstVar(len(x.items))
    if isinstance(x, V.NdarrayVar):
        from torchfuse.capture.arrays import array_len

        return array_len(x)
    if isinstance(x, V.TracedArrayVar):
        x = V.TensorVar(x.fake)  # len() of an array is its first size, as for a tensor
    if isinstance(x, V.TensorVar):
        from torchfuse.capture.values import size_of

        sizes = size_of(x)
        if not sizes:
            raise Unsupported("len() of a 0-d tensor", current().loc)
        return V.ConstVar(sizes[0])
    if isinstance(x, V.ModuleVar):
        O.guard_children(x)
        return V.ConstVar(len(x.value))
    if isinstance(x, V.UserObjVar):
        n = O.python_dunder(x, "__len__", [])  # the class's own, interpreted (and guarded)
        if n is not None and n is not NotImplemented:
            if not isinstance(n, V.ConstVar) or not isinstance(n.value, int) or n.value < 0:
                raise Unsupported(f"__len__ of {x.describe()} gave {n.describe()}", current().loc)
            return V.ConstVar(n.value)
    return V.ConstVar(len(x.python()))


def _hash(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``hash(x)``; a user class's own ``__hash__`` (a frozen dataclass's) is interpreted."""
    if len(args) == 1 and not kwargs and isinstance(args[0], V.UserObjVar):
        x = args[0]
        if inspect.getattr_static(x.python_type(), "__hash__", None) is None:
            raise UserException(TypeError(f"unhashable type: {x.python_type().__name__!r}"),
                                current().loc)
        h = O.python_dunder(x, "__hash__", [])
        if h is not None and h is not NotImplemented:
            if not isinstance(h, V.ConstVar) or type(h.value) not in (int, bool):
                raise UserException(TypeError("__hash__ method should return an integer"),
                                    current().loc)
            return V.ConstVar(hash(h.value))  # Python reduces it as hash() of the int
    return _HASH(args, kwargs)


def _isinstance(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    obj, cls = args
    classes = cls.python()
    if isinstance(obj, V.TensorVar):
        t = obj.py_type
        return V.ConstVar(issubclass(t, classes))
    if isinstance(obj, V.ConstVar):
        value = obj.python()
        if isinstance(value, SYM_TYPES):  # a symbolic size is an int to the user's code
            return V.ConstVar(issubclass(obj.python_type(), classes))
        return V.ConstVar(isinstance(value, classes))
    return V.ConstVar(issubclass(obj.python_type(), classes))


def _getattr(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.attrs import getattr_var, hasattr_var

    name = args[1].python()
    if len(args) == 3 and not hasattr_var(args[0], name):
        return args[2]
    return getattr_var(args[0], name)


def _hasattr(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.attrs import hasattr_var

    return V.ConstVar(hasattr_var(args[0], args[1].python()))


def _setattr(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.attrs import setattr_var

    setattr_var(args[0], args[1].python(), args[2])
    return V.ConstVar(None)


def _object_getattribute(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.attrs import _object_attr, getattr_var

    obj, name = args[0], args[1].python()
    return _object_attr(obj, name, plain=True) if isinstance(obj, V.UserObjVar) else getattr_var(obj, name)


def _object_setattr(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.attrs import setattr_var

    setattr_var(args[0], args[1].python(), args[2], plain=True)
    return V.ConstVar(None)


def _delattr(args: list[V.Var], kwargs: dict[str, V.Var], plain: bool = False) -> V.Var:
    delattr_var(args[0], args[1].python(), plain)
    return V.ConstVar(None)


def delattr_var(obj: V.Var, name: str, plain: bool = False) -> None:
    """``del obj.<name>`` on an object made during capture (its attributes are Vars)."""
    if isinstance(obj, V.UserObjVar) and obj.is_new and (plain or inspect.getattr_static(
            type(obj.value), "__delattr__") is object.__delattr__):
        if name not in obj.overrides:
            raise UserException(AttributeError(name), current().loc)
        del obj.overrides[name]
        return
    raise Unsupported(f"deleting attribute {name!r} of {obj.describe()}", current().loc)


def _seq(kind: type) -> Handler:
    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        items = O.iterate(args[0]) if args else []
        return V.ListVar(items, kind)
    return h


def _dict(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    out: dict[Any, V.Var] = {}
    if args:
        if isinstance(args[0], V.DictVar):
            out.update(args[0].items)
        else:
            for pair in O.iterate(args[0]):
                k, v = O.iterate(pair)
                out[k.python()] = v
    out.update(kwargs)
    return V.DictVar(out)


def _set(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return V.SetVar(O.iterate(args[0]) if args else [])


def _reduce_builtin(name: str) -> Handler:
    pyfn = getattr(builtins, name)

    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        items = O.iterate(args[0]) if len(args) == 1 or name == "sum" else list(args)
        if name in ("any", "all"):
            for it in items:
                t = O.truth(it)
                if t == (name == "any"):
                    return V.ConstVar(t)
            return V.ConstVar(name == "all")
        if name == "sum":
            acc = args[1] if len(args) > 1 else kwargs.get("start", V.ConstVar(0))
            for it in items:
                acc = O.binary("+", acc, it)
            return acc
        # min / max
        if "key" not in kwargs and _same_one_element_tensors(items):
            return _select_extreme(name, items)
        if any(isinstance(i, V.TensorVar) for i in items):
            raise Unsupported(f"{name}() over tensors compares values (data-dependent)", current().loc,
                              f"use torch.{name}imum or torch.stack(...).{name}()")
        key = kwargs.get("key")
        if key is None:
            vals = [i.python() for i in items]
            if vals and "default" not in kwargs and any(isinstance(v, torch.SymInt) for v in vals) and \
                    all(type(v) is int or isinstance(v, torch.SymInt) for v in vals):
                # max(n, 3) of an int symbol stays symbolic: no guard on which one is larger
                sym = torch.sym_max if name == "max" else torch.sym_min
                return V.ConstVar(functools.reduce(sym, vals))
            kw = {"default": kwargs["default"].python()} if "default" in kwargs else {}
            return from_py(pyfn(vals, **kw))
        keyed = [(_call(key, i).python(), n) for n, i in enumerate(items)]
        best = pyfn(keyed, key=lambda p: p[0])
        return items[best[1]]
    return h


def _same_one_element_tensors(items: list[V.Var]) -> bool:
    if len(items) < 2 or not all(isinstance(i, V.TensorVar) for i in items):
        return False
    first = items[0].fake
    return all(i.fake.dtype == first.dtype and i.fake.shape == first.shape for i in items) and \
        all(isinstance(n, int) for n in first.shape) and first.numel() == 1


def _select_extreme(name: str, items: list[V.Var]) -> V.Var:
    """``max(a, b, …)`` over one-element tensors of one dtype and shape, as Python runs it (the
    first of the largest: a later item wins only when ``item > best``), kept in the graph as
    ``where(item > best, item, best)`` rather than read out to decide."""
    ctx = current()
    best = items[0]
    for item in items[1:]:
        better = O.compare(">" if name == "max" else "<", item, best)
        best = from_py(ctx.call_torch(torch.where, [better.fake, item.fake, best.fake], {}, f"{name}()"))
    return best


def sorted_vars(items: list[V.Var], key: V.Var | None, reverse: bool) -> list[V.Var]:
    if key is not None and not (isinstance(key, V.ConstVar) and key.value is None):
        keys = [_call(key, i).python() for i in items]
    else:
        keys = [i.python() for i in items]
    order = sorted(range(len(items)), key=lambda n: keys[n], reverse=reverse)
    return [items[n] for n in order]


def _sorted(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    rev = kwargs.get("reverse")
    return V.ListVar(sorted_vars(O.iterate(args[0]), kwargs.get("key"), bool(rev.python()) if rev else False))


def _reversed(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return V.IteratorVar(list(reversed(O.iterate(args[0]))))


def _lazy(args: list[V.Var]) -> bool:
    """Over an iterator Var the result is lazy too, so that it pulls from it only as far as
    it is itself pulled (Python's order); over containers it is made now (loops unroll)."""
    return any(isinstance(a, V.IteratorVar) for a in args)


def _rows(make: Any, args: list[V.Var], bounded: bool) -> V.Var:
    """An iterator Var over what ``make(*pulls)`` (real zip/map/enumerate over Python iterators
    of the Vars) yields; eager's ValueError (``zip(strict=True)``) raised where it is pulled."""
    def gen() -> Any:
        it = make(*[O.pull(a) for a in args])
        while True:
            try:
                row = next(it)
            except StopIteration:
                return
            except ValueError as e:
                raise UserException(e, current().loc) from e
            yield row
    if _lazy(args):
        return V.IteratorVar([], gen(), bounded=bounded)
    return V.IteratorVar(list(gen()))


def _enumerate(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    start = (args[1] if len(args) > 1 else kwargs.get("start", V.ConstVar(0))).python()
    return _rows(lambda it: (V.ListVar([V.ConstVar(i), v], tuple) for i, v in enumerate(it, start)),
                 args[:1], not O.is_endless(args[0]))


def _zip(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    strict = kwargs.get("strict")
    strict = strict is not None and bool(strict.python())
    return _rows(lambda *its: (V.ListVar(list(row), tuple) for row in zip(*its, strict=strict)),
                 args, not args or not all(O.is_endless(a) for a in args))


def _map(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    fn, *its = args
    return _rows(lambda *cols: (_call(fn, *row) for row in zip(*cols, strict=False)),
                 its, not all(O.is_endless(a) for a in its))


def _filter(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    fn, it = args
    keep = []
    for v in O.iterate(it):
        ok = O.truth(v) if isinstance(fn, V.ConstVar) and fn.value is None else O.truth(_call(fn, v))
        if ok:
            keep.append(v)
    return V.IteratorVar(keep)


def _iter(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    if isinstance(args[0], V.IteratorVar):
        return args[0]
    return V.IteratorVar(O.iterate(args[0]))


def _next(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    it = args[0]
    if not isinstance(it, V.IteratorVar):
        raise Unsupported(f"next() on {it.describe()}", current().loc)
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise UserException(StopIteration(), current().loc)
    return v


def _type(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments", current().loc)
    return V.ObjVar(args[0].python_type())


def _abs(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return O.unary("abs", args[0])


def _print(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    raise Unsupported("print() inside a compiled function", current().loc,
                      "remove the print, or log outside the compiled function")


def _super(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.frame import Frame

    if len(args) == 2:
        return V.SuperVar(args[0].python(), args[1])
    frame = Frame.current_frame()
    if frame is None or "__class__" not in frame.cells:
        raise Unsupported("super() without a __class__ cell", current().loc)
    cls = frame.cells["__class__"].contents.python()
    self_var = frame.locals[frame.code.co_varnames[0]]
    return V.SuperVar(cls, self_var)


def _int_like(kind: type) -> Handler:
    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        if args and isinstance(args[0], V.TensorVar):
            value = current().rec.known.get(args[0].fake)  # made from constants (known.py)
            if value is not None and value.numel() == 1 and len(args) == 1 and not kwargs:
                return V.ConstVar(kind(value))
            raise Unsupported(f"{kind.__name__}(tensor) reads a value (data-dependent)", current().loc)
        if kind is float and len(args) == 1 and not kwargs:
            kept = floats.to_float(args[0])  # float(n) of an int symbol stays in the graph
            if kept is not None:
                return kept
        return _fold(kind)(args, kwargs)
    return h


def _id(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    (v,) = args
    if isinstance(v, V.ObjVar | V.ModuleVar) or (isinstance(v, V.UserObjVar) and not v.is_new):
        # functions, classes, modules: held by identity (guarded when read from outside),
        # so their id is the same on every call the graph serves
        return V.ConstVar(id(v.value))
    raise Unsupported("id() inside a compiled function: object identities differ between calls",
                      current().loc)


def _callable(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    v = args[0]
    if isinstance(v, V.FunctionVar | V.CachedFunctionVar | V.BoundMethodVar | V.PartialVar | V.ModuleVar
                  | V.MethodVar):
        return V.ConstVar(True)
    if isinstance(v, V.TensorVar | V.ListVar | V.DictVar | V.SetVar):
        return V.ConstVar(False)
    return V.ConstVar(callable(v.python()))


def _reduce(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    fn, seq = args[0], O.iterate(args[1])
    acc, rest = (args[2], seq) if len(args) > 2 else (seq[0], seq[1:])
    for v in rest:
        acc = _call(fn, acc, v)
    return acc


def _partial(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return V.PartialVar(args[0], list(args[1:]), dict(kwargs))


def _operator_binary(sym: str) -> Handler:
    return lambda args, kwargs: O.binary(sym, args[0], args[1])


def _operator_compare(sym: str) -> Handler:
    return lambda args, kwargs: O.compare(sym, args[0], args[1])


# ----------------------------------------------------------------------------- contexts


def _context(kind: str) -> Handler:
    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        return V.ContextVar(kind, tuple(a.python() for a in args) +
                            tuple((k, v.python()) for k, v in kwargs.items()))
    return h


TRACE_RANGE = V.TRACE_RANGE


def trace_range_makers() -> tuple[Any, ...]:
    """The callables that open a profiler or tracing range."""
    makers: list[Any] = [torch.autograd.profiler.record_function]
    nvtx = getattr(getattr(torch, "cuda", None), "nvtx", None)
    if nvtx is not None and hasattr(nvtx, "range"):
        makers.append(nvtx.range)
    return tuple(makers)


def context_of_object(obj: Any) -> V.ContextVar | None:
    """A grad-mode/autocast context manager object made outside capture (e.g. by the
    ``@torch.no_grad()`` decorator), or a profiler range, as a context variable."""
    if isinstance(obj, torch.autograd.profiler.record_function):
        return V.ContextVar(TRACE_RANGE, (obj.name,))
    if isinstance(obj, torch.no_grad):
        return V.ContextVar("no_grad")
    if isinstance(obj, torch.enable_grad):
        return V.ContextVar("enable_grad")
    if isinstance(obj, torch.set_grad_enabled):
        return V.ContextVar("set_grad_enabled", (obj.mode,))
    if isinstance(obj, torch.inference_mode):
        return V.ContextVar("inference_mode", (obj.mode,))
    if isinstance(obj, torch.autocast):
        return V.ContextVar("autocast", (obj.device, ("dtype", obj.fast_dtype), ("enabled", obj._enabled)))
    return None


def enter_context(ctxvar: V.ContextVar) -> None:
    ctx = current()
    if ctxvar.kind in ("no_grad", "enable_grad", "set_grad_enabled", "inference_mode"):
        enabled = {"no_grad": False, "enable_grad": True, "inference_mode": False}.get(
            ctxvar.kind, bool(ctxvar.args[0]) if ctxvar.args else True)
        if ctxvar.kind == "inference_mode" and ctxvar.args and not ctxvar.args[0]:
            enabled = torch.is_grad_enabled()
        ctxvar.saved = torch.is_grad_enabled()
        set_grad(enabled)
    elif ctxvar.kind == "autocast":
        args = [a for a in ctxvar.args if not isinstance(a, tuple)]
        kw = dict(a for a in ctxvar.args if isinstance(a, tuple))
        cm = torch.autocast(*args, **kw)
        cm.__enter__()
        ctxvar.saved = cm
        ctx.open_autocasts.append(cm)
    elif ctxvar.kind != TRACE_RANGE:
        raise Unsupported(f"context manager {ctxvar.kind}", ctx.loc)


def exit_context(ctxvar: V.ContextVar) -> V.Var:
    if ctxvar.kind == "autocast":
        ctxvar.saved.__exit__(None, None, None)
        open_cms = current().open_autocasts
        if ctxvar.saved in open_cms:
            open_cms.remove(ctxvar.saved)
    elif ctxvar.kind != TRACE_RANGE:
        set_grad(ctxvar.saved)
    return V.ConstVar(None)


def set_grad(enabled: bool) -> None:
    """Switch grad mode while capturing and record the switch as a graph node."""
    from torchfuse.capture.grad_op import SET_GRAD_ENABLED
    from torchfuse.graph import schema as S

    ctx = current()
    if torch.is_grad_enabled() != enabled:
        torch.set_grad_enabled(enabled)
        ctx.add_node(SET_GRAD_ENABLED, [S.Bool(value=enabled)])


# ----------------------------------------------------------------------------- the table


def _signature(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``inspect.signature`` reads only code objects and defaults: run it natively."""
    ctx = current()
    fn = args[0]
    if isinstance(fn, V.BoundMethodVar) and isinstance(fn.func, V.ObjVar) and \
            isinstance(fn.self_var, V.ObjVar | V.ModuleVar | V.UserObjVar):
        real = types.MethodType(fn.func.value, fn.self_var.value)
    elif isinstance(fn, V.ObjVar):
        real = fn.value
    else:
        raise Unsupported(f"inspect.signature of {fn.describe()}", ctx.loc)
    try:
        sig = inspect.signature(real, **{k: v.python() for k, v in kwargs.items()})
    except (TypeError, ValueError) as e:
        raise UserException(e, ctx.loc) from e
    return V.ObjVar(sig)


_COPY_HOOKS = ("__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__", "__getstate__",
               "__setstate__", "__slots__")


def _copy_var(var: V.Var, deep: bool, memo: dict[int, V.Var]) -> V.Var:
    """``copy.copy`` / ``copy.deepcopy`` of a Var, as the copy module does it for plain data:
    containers rebuilt, objects of plain Python classes (no copy or pickle hooks of their
    own) made anew with their attributes copied, constants, classes and functions shared.
    Every attribute is read through its source, so what the copy is used for is guarded."""
    ctx = current()
    if isinstance(var, V.ConstVar) or (isinstance(var, V.ObjVar) and
                                       isinstance(var.value, type | types.FunctionType
                                                  | types.BuiltinFunctionType)):
        return var
    if id(var) in memo:
        return memo[id(var)]
    item = (lambda v: _copy_var(v, deep, memo)) if deep else (lambda v: v)
    if isinstance(var, V.ListVar):
        out: V.Var = V.ListVar([item(v) for v in var.items], var.kind)
    elif isinstance(var, V.DictVar):
        out = V.DictVar({k: item(v) for k, v in var.items.items()}, kind=var.kind,
                        attrs=None if var.attrs is None else {k: item(v) for k, v in var.attrs.items()})
    elif isinstance(var, V.SetVar):
        out = V.SetVar([item(v) for v in var.items.values()])
    elif isinstance(var, V.UserObjVar) and _plainly_copyable(type(var.value)):
        new = V.UserObjVar(object.__new__(type(var.value)), None, is_new=True)
        memo[id(var)] = new
        state = {} if var.is_new else vars(var.value)
        for n in [*state, *(n for n in var.overrides if n not in state)]:
            if n in var.overrides:
                value = var.overrides[n]
            else:  # the instance's own attribute, read as it is stored
                value = ctx.wrap(state[n], AttrSource(var.source, n) if var.source is not None else None)
            new.overrides[n] = item(value)
        return new
    else:
        raise Unsupported(f"copy.{'deepcopy' if deep else 'copy'} of {var.describe()}", ctx.loc)
    memo[id(var)] = out
    return out


def _plainly_copyable(cls: type) -> bool:
    if cls.__new__ is not object.__new__:
        return False
    return not any(name in klass.__dict__ for klass in cls.__mro__[:-1] for name in _COPY_HOOKS)


def _copier(deep: bool) -> Handler:
    def handler(a: list[V.Var], k: dict[str, V.Var]) -> V.Var:
        if len(a) != 1 or k:
            raise Unsupported(f"copy.{'deepcopy' if deep else 'copy'} with a memo", current().loc)
        return _copy_var(a[0], deep, {})
    return handler


def _answer(value: Any) -> Handler:
    return lambda a, k: V.ConstVar(value)


def _core_call(fn: V.Var, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.calls import call

    return call(fn, args, kwargs)


def _core_list_method(obj: V.ListVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.methods import list_method

    return list_method(obj, name, args, kwargs)


STDLIB_CORE = stdlib.Core(iterate=O.iterate, pull=O.pull, binary=O.binary, mutate=O.mutate, call=_core_call,
                          make_dict=_dict, list_method=_core_list_method)
"""The interpreter functions the stdlib models (`torchfuse.capture.stdlib`) are handed."""


def _table() -> dict[Any, Handler]:
    t: dict[Any, Handler] = {
        len: _len, isinstance: _isinstance, getattr: _getattr, hasattr: _hasattr,
        setattr: _setattr, delattr: _delattr, list: _seq(list), tuple: _seq(tuple), dict: _dict, set: _set,
        frozenset: lambda a, k: V.ConstVar(frozenset(v.python() for v in O.iterate(a[0]))),
        sorted: _sorted, reversed: _reversed, enumerate: _enumerate, zip: _zip, map: _map,
        filter: _filter, iter: _iter, next: _next, type: _type, abs: _abs, print: _print,
        super: _super, callable: _callable, int: _int_like(int), float: _int_like(float),
        bool: lambda a, k: V.ConstVar(O.truth(a[0])) if a else V.ConstVar(False),
        functools.partial: _partial, functools.reduce: _reduce, issubclass: _fold(issubclass),
        object.__getattribute__: _object_getattribute, object.__setattr__: _object_setattr,
        object.__delattr__: lambda a, k: _delattr(a, k, plain=True),
        id: _id, inspect.signature: _signature, copy.copy: _copier(False), copy.deepcopy: _copier(True),
        warnings.warn: _answer(None),  # warnings are not captured, like logging
        torch.no_grad: _context("no_grad"), torch.enable_grad: _context("enable_grad"),
        torch.set_grad_enabled: _context("set_grad_enabled"),
        torch.inference_mode: _context("inference_mode"),
        torch.autocast: _context("autocast"),
        **{maker: _context(TRACE_RANGE) for maker in trace_range_makers()},
    }
    # Truthful answers to "what is running me?": capture is compiling (libraries then take
    # their compile-friendly paths, as under torch.compile); it is neither TorchScript nor a
    # jit trace nor an export-for-deployment.
    for fn, answer in ((torch.compiler.is_compiling, True),
                       (getattr(torch.compiler, "is_dynamo_compiling", None), True),
                       (getattr(torch.compiler, "is_exporting", None), False),
                       (torch.jit.is_tracing, False), (torch.jit.is_scripting, False),
                       (torch._C._get_tracing_state, None)):
        if fn is not None:
            t[fn] = _answer(answer)
    t.update(stdlib.handlers(STDLIB_CORE))
    for name in ("any", "all", "sum", "min", "max"):
        t[getattr(builtins, name)] = _reduce_builtin(name)
    for fn in (range, str, round, divmod, pow, repr, chr, ord, slice, format, bin, hex, oct):
        t[fn] = _fold(fn)
    t[hash] = _hash
    for sym, fn in O.BINARY.items():
        t[fn] = _operator_binary(sym)
    for sym, fn in O.COMPARE.items():
        t[fn] = _operator_compare(sym)
    t[operator.neg] = lambda a, k: O.unary("-", a[0])
    t[operator.pos] = lambda a, k: O.unary("+", a[0])
    t[operator.invert] = lambda a, k: O.unary("~", a[0])
    t[operator.not_] = lambda a, k: V.ConstVar(not O.truth(a[0]))
    t[operator.truth] = lambda a, k: V.ConstVar(O.truth(a[0]))
    t[operator.getitem] = lambda a, k: O.getitem(a[0], a[1])
    t[operator.contains] = lambda a, k: V.ConstVar(O.contains(a[0], a[1]))
    t[operator.is_] = lambda a, k: V.ConstVar(O.is_same(a[0], a[1]))
    t[operator.is_not] = lambda a, k: V.ConstVar(not O.is_same(a[0], a[1]))
    t[operator.index] = _fold(operator.index)
    return t


_TABLE = _table()
_MATH_TENSOR = {"sqrt", "exp", "log", "sin", "cos", "tanh", "floor", "ceil"}


def handler_for(value: Any) -> Handler | None:
    try:
        h = _TABLE.get(value)
    except TypeError:
        return None
    if h is not None:
        return h
    mod = getattr(value, "__module__", None)
    if mod == "math" or getattr(value, "__self__", None) is math:
        if value in floats.MATH or value in floats.INT_MATH:
            return _math(value)
        return _fold(value)
    if isinstance(value, type) and issubclass(value, torch.autocast):
        return _context("autocast")
    from torchfuse.capture.triton_kernels import handler_for as user_kernel_handler

    return user_kernel_handler(value)  # kernel[grid](...) of a user @triton.jit kernel


__all__ = ["delattr_var", "enter_context", "exit_context", "handler_for", "sorted_vars", "to_py"]
