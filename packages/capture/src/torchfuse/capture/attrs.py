"""Attribute reads and writes on Vars (``LOAD_ATTR``, ``STORE_ATTR``, ``getattr``)."""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import sys
import types
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.source import (
    AttrSource,
    ClassAttrSource,
    ModuleAttrSource,
    ModuleGlobalSource,
    ModuleStateSource,
    Source,
)
from torchfuse.capture.values import HEAPTYPE, from_py, python_override, size_of

# Tensor attributes that are plain metadata: answered from the fake, never recorded.
_TENSOR_META = {"dtype", "ndim", "is_cuda", "is_sparse", "is_quantized", "is_meta", "layout",
                "requires_grad", "is_leaf"}
# Tensor attributes that need values or autograd state capture does not model.
_TENSOR_UNSUPPORTED = {"grad", "grad_fn", "data", "_version", "untyped_storage", "storage"}


def getattr_var(obj: V.Var, name: str) -> V.Var:
    ctx = current()
    if name == "__class__" and isinstance(obj, V.ModuleVar | V.UserObjVar | V.TensorVar | V.ListVar
                                          | V.DictVar | V.SetVar):
        # wrapping these guarded their type (modules by identity), so the class is known
        return V.ObjVar(obj.python_type())
    if isinstance(obj, V.TensorVar):
        return _tensor_attr(obj, name)
    if isinstance(obj, V.ModuleVar):
        return _module_attr(obj, name)
    if isinstance(obj, V.UserObjVar):
        return _object_attr(obj, name)
    if isinstance(obj, V.DequeVar) and name == "maxlen":
        return V.ConstVar(obj.maxlen)
    if isinstance(obj, V.ListVar):
        fields = obj.fields
        if fields and name in fields:
            return obj.items[fields.index(name)]
        native = name in _NAMEDTUPLE_NATIVE and hasattr(obj.kind, "_fields")
        if V.is_tuple_subclass(obj.kind) and not native:
            raw = python_override(obj.kind, name, tuple)  # a method or property of the subclass
            if raw is not None:
                return bind_class_attr(obj, obj.kind, raw, name)
        return _container_method(obj, obj.kind, name)
    if isinstance(obj, V.DictVar) and obj.kind is not dict:
        return _dict_subclass_attr(obj, name)
    if isinstance(obj, V.DictVar | V.SetVar):
        return _container_method(obj, obj.python_type(), name)
    if isinstance(obj, V.PartialVar):
        return _partial_attr(obj, name)
    if isinstance(obj, V.TracedArrayVar):
        from torchfuse.capture import numpy_trace

        return numpy_trace.attr(obj, name)
    if isinstance(obj, V.NdarrayVar):
        from torchfuse.capture.arrays import METADATA, array_attr

        if name not in METADATA:  # the array as a traced one, over its from_numpy graph input
            from torchfuse.capture import numpy_trace

            return numpy_trace.attr(numpy_trace.as_traced(obj), name)

        return array_attr(obj, name)
    if isinstance(obj, V.ConstVar):
        try:
            value = getattr(obj.value, name)
        except AttributeError as e:
            raise UserException(e, ctx.loc) from e
        if callable(value) and not isinstance(value, type):
            return V.MethodVar(obj, name)
        return from_py(value) if obj.source is None else V.ConstVar(value, AttrSource(obj.source, name))
    if isinstance(obj, V.ObjVar):
        try:
            value = getattr(obj.value, name)
        except AttributeError as e:
            raise UserException(e, ctx.loc) from e
        if isinstance(obj.value, types.ModuleType):
            # functions, classes and constants of Python modules are assumed stable: no guard;
            # tensors, containers and objects, which change, are read through a source
            source = None
            if isinstance(value, torch.Tensor | dict | list | set) or _is_mutable_object(value):
                source = AttrSource(obj.source, name) if obj.source is not None else \
                    _module_member_source(obj.value, name)
            return ctx.wrap(value, source)
        if isinstance(obj.value, type):
            raw = inspect.getattr_static(obj.value, name, None)
            if isinstance(raw, classmethod):
                return V.BoundMethodVar(V.ObjVar(raw.__func__), obj)
        return ctx.wrap(value, AttrSource(obj.source, name) if obj.source is not None else None)
    if isinstance(obj, V.SuperVar):
        return _super_attr(obj, name)
    if isinstance(obj, V.BoundMethodVar):
        if name == "__self__":
            return obj.self_var
        if name == "__func__":
            return obj.func
    if isinstance(obj, V.FunctionVar):
        return _function_attr(obj, name)
    if isinstance(obj, V.CachedFunctionVar):
        return _cached_function_attr(obj, name)
    raise Unsupported(f"attribute {name!r} of {obj.describe()}", ctx.loc)


def _cached_function_attr(fn: V.CachedFunctionVar, name: str) -> V.Var:
    """What ``update_wrapper`` stored (``__wrapped__``, ``__name__`` …), its ``__dict__``,
    and the methods ``cache_info``/``cache_clear``."""
    if name in fn.attrs.items:
        return fn.attrs.items[name]
    if name == "__dict__":
        return fn.attrs
    if name in ("cache_info", "cache_clear"):
        return V.MethodVar(fn, name)
    cls = fn.python_type()
    if instance_lookup(cls, name) is _MISSING:
        raise UserException(AttributeError(f"{cls.__qualname__!r} object has no attribute {name!r}"),
                            current().loc)
    raise Unsupported(f"attribute {name!r} of {fn.describe()}", current().loc)


def _function_attr(fn: V.FunctionVar, name: str) -> V.Var:
    """An attribute of a function made during capture, as CPython's function object has it:
    what was stored on it first (``__name__`` set by ``functools.wraps``, ``__wrapped__``),
    then the function's own metadata."""
    if fn.attrs is not None and name in fn.attrs.items:
        return fn.attrs.items[name]
    code = fn.code
    doc = code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else None
    own = {"__name__": code.co_name, "__qualname__": getattr(code, "co_qualname", code.co_name),
           "__code__": code, "__module__": fn.f_globals.get("__name__"), "__doc__": doc,
           "__type_params__": ()}
    if name in own:
        return V.ConstVar(own[name])
    if name == "__dict__":
        return fn.attr_dict()
    if name == "__annotations__":
        return fn.attr_dict().items.setdefault("__annotations__", V.DictVar({}))
    if name == "__defaults__":
        return V.ListVar(list(fn.defaults), tuple) if fn.defaults else V.ConstVar(None)
    if name == "__kwdefaults__":
        return V.DictVar(dict(fn.kwdefaults)) if fn.kwdefaults else V.ConstVar(None)
    if inspect.getattr_static(types.FunctionType, name, _MISSING) is _MISSING:
        raise UserException(AttributeError(f"'function' object has no attribute {name!r}"), current().loc)
    raise Unsupported(f"attribute {name!r} of {fn.describe()}", current().loc)


_NAMEDTUPLE_NATIVE = frozenset({"_asdict", "_replace"})
"""Methods ``namedtuple`` writes that the sequence Var answers itself (`methods.list_method`)."""


def _container_method(obj: V.Var, cls: type, name: str) -> V.Var:
    """A method of a list, tuple, dict or set; what the class lacks is eager's AttributeError
    (so ``hasattr(d, "to")`` is False, as duck-typing code expects)."""
    if instance_lookup(cls, name) is _MISSING:
        raise UserException(AttributeError(f"{cls.__name__!r} object has no attribute {name!r}"),
                            current().loc)
    return V.MethodVar(obj, name)


def _partial_attr(obj: V.PartialVar, name: str) -> V.Var:
    """``functools.partial``'s three public attributes, from the Vars it was made of."""
    if name == "func":
        return obj.func
    if name == "args":
        return V.ListVar(list(obj.args), tuple)
    if name == "keywords":
        return V.DictVar(dict(obj.kwargs))
    if inspect.getattr_static(functools.partial, name, _MISSING) is _MISSING:
        raise UserException(AttributeError(f"'functools.partial' object has no attribute {name!r}"),
                            current().loc)
    raise Unsupported(f"attribute {name!r} of a functools.partial", current().loc)


def _is_mutable_object(value: Any) -> bool:
    return not isinstance(value, type | types.ModuleType | types.FunctionType | types.BuiltinFunctionType
                          | types.MethodType) and type(value).__flags__ & HEAPTYPE and \
        hasattr(value, "__dict__") and not callable(value)


def _module_member_source(module: types.ModuleType, name: str) -> Any:
    import sys

    from torchfuse.capture.source import ModuleGlobalSource

    mod = getattr(module, "__name__", None)
    return ModuleGlobalSource(mod, name) if mod and sys.modules.get(mod) is module else None


def hasattr_var(obj: V.Var, name: str) -> bool:
    try:
        getattr_var(obj, name)
    except UserException as e:
        if isinstance(e.exc, AttributeError):
            return False
        raise
    except Unsupported as e:
        if not e.reason.startswith(("attribute ", "tensor has no attribute", "tensor attribute ")):
            raise
        # not modelled: what the class defines exists whatever capture can read of it
        try:
            cls = obj.python_type()
        except Unsupported:
            return False
        return instance_lookup(cls, name) is not _MISSING
    return True


def _tensor_attr(obj: V.TensorVar, name: str) -> V.Var:
    ctx = current()
    fake = obj.fake
    if name == "shape":
        return V.ConstVar(size_of(obj))
    if name == "device":
        return V.ConstVar(fake.fake_device)
    if name in _TENSOR_META:
        return V.ConstVar(getattr(fake, name))
    if name == "grad_fn" and not fake.requires_grad:  # no autograd history without grad
        return V.ConstVar(None)
    if name in _TENSOR_UNSUPPORTED:
        raise Unsupported(f"tensor attribute .{name} is not captured", ctx.loc)
    raw = getattr(torch.Tensor, name, None)
    if raw is None:
        raise UserException(AttributeError(f"'Tensor' object has no attribute {name!r}"), ctx.loc)
    if callable(raw) and not isinstance(raw, property):
        return V.MethodVar(obj, name)
    return from_py(ctx.call_torch(getattr, [fake, name], {}, f"Tensor.{name}"))


def _module_attr(obj: V.ModuleVar, name: str) -> V.Var:
    ctx = current()
    if name in obj.overrides:
        return obj.overrides[name]
    mod = obj.value
    src = obj.source
    d = mod.__dict__
    for table in ("_parameters", "_buffers", "_modules"):
        tbl = d.get(table)
        if tbl is not None and name in tbl:
            value = tbl[name]
            if value is None:
                return V.ConstVar(None)
            return ctx.wrap(value, ModuleStateSource(src, table, name) if src is not None else None)
    if name in ("_parameters", "_buffers", "_modules"):
        # torch's own module code walks these dicts; their entries keep module-state sources
        table = d[name]
        if src is not None:  # what the module has (a ModuleList's layers), when modules change
            ctx.guards.keys(ModuleAttrSource(src, name), tuple(table))
        items = {k: (ctx.wrap(v, ModuleStateSource(src, name, k) if src is not None else None)
                     if v is not None else V.ConstVar(None)) for k, v in table.items()}
        return V.DictVar(items, ModuleAttrSource(src, name) if src is not None else None)
    if name in d:
        value = d[name]
        return ctx.wrap(value, ModuleAttrSource(src, name) if src is not None else None)
    return _class_attr(obj, type(mod), name)


# Logging methods are not captured: a message logged while capturing is emitted by the
# eager run of the first call, but not by the compiled graph (logging is no computation).
_LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log")


def _log_noop(*args: Any, **kwargs: Any) -> None:
    return None


def _object_attr(obj: V.UserObjVar, name: str, plain: bool = False) -> V.Var:
    """``obj.<name>``; ``plain``: as ``object.__getattribute__`` reads it (what a class's own
    ``__getattribute__`` reaches through ``super()``)."""
    ctx = current()
    if not plain and obj.is_new:
        custom = inspect.getattr_static(type(obj.value), "__getattribute__", None)
        if isinstance(custom, types.FunctionType):  # made during capture: interpret it
            from torchfuse.capture.calls import call

            return call(V.BoundMethodVar(V.ObjVar(custom), obj), [V.ConstVar(name)], {})
    if name in obj.overrides:
        return obj.overrides[name]
    if name == "__dict__" and obj.source is not None and not obj.overrides and \
            type(getattr(obj.value, "__dict__", None)) is dict:
        # the instance's own dict, read (and written) like any dict from outside
        return ctx.wrap(obj.value.__dict__, AttrSource(obj.source, "__dict__"))
    if name == "__dict__" and obj.is_new and all(isinstance(k, str) for k in obj.overrides):
        # an object made during capture: its attributes are its dict (one mapping, shared)
        view = V.DictVar({})
        view.items = obj.overrides
        return view
    if isinstance(obj.value, logging.Logger) and name.startswith(_LOG_LEVELS) and \
            callable(getattr(obj.value, name, None)):
        return V.ObjVar(_log_noop)
    d = getattr(obj.value, "__dict__", {})
    if not obj.is_new and _custom_getattribute(type(obj.value)):
        return _native_attr(obj, name)
    if name in d and not obj.is_new:
        return ctx.wrap(d[name], AttrSource(obj.source, name) if obj.source is not None else None)
    return _class_attr(obj, type(obj.value), name)


def _dict_subclass_attr(obj: V.DictVar, name: str) -> V.Var:
    """Instance attributes, then what the subclass defines in Python, then dict's methods."""
    if obj.attrs is not None and name in obj.attrs:
        return obj.attrs[name]
    raw = python_override(obj.kind, name, dict)
    if raw is not None:
        return bind_class_attr(obj, obj.kind, raw, name)
    if hasattr(dict, name) or (name == "move_to_end" and issubclass(obj.kind, collections.OrderedDict)):
        return V.MethodVar(obj, name)
    raw = inspect.getattr_static(obj.kind, name, _MISSING)
    if raw is _MISSING:
        raise UserException(AttributeError(f"{obj.kind.__name__!r} object has no attribute {name!r}"),
                            current().loc)
    return bind_class_attr(obj, obj.kind, raw, name)


def _custom_getattribute(cls: type) -> bool:
    return inspect.getattr_static(cls, "__getattribute__", None) is not object.__getattribute__


def _native_attr(obj: V.UserObjVar, name: str) -> V.Var:
    """``obj.<name>`` through the class's own ``__getattribute__`` (aliasing configs and the
    like), run natively: its answer is guarded under the same expression, which re-runs it."""
    ctx = current()
    try:
        value = getattr(obj.value, name)
    except AttributeError as e:
        raise UserException(e, ctx.loc) from e
    if isinstance(value, types.MethodType) and value.__self__ is obj.value:
        return V.BoundMethodVar(ctx.wrap(value.__func__, None), obj)
    return ctx.wrap(value, AttrSource(obj.source, name) if obj.source is not None else None)


def _class_attr(obj: V.Var, cls: type, name: str) -> V.Var:
    ctx = current()
    raw = instance_lookup(cls, name)
    if raw is _MISSING:
        getattr_fn = inspect.getattr_static(cls, "__getattr__", None)
        if getattr_fn is not None and getattr_fn is not torch.nn.Module.__getattr__:
            from torchfuse.capture.calls import call

            return call(V.BoundMethodVar(V.ObjVar(getattr_fn), obj), [V.ConstVar(name)], {})
        raise UserException(AttributeError(f"{cls.__name__!r} object has no attribute {name!r}"),
                            ctx.loc)
    return bind_class_attr(obj, cls, raw, name)


_MISSING = object()


def instance_lookup(cls: type, name: str) -> Any:
    """What an *instance* of ``cls`` finds for ``name`` in its class: the first entry in the
    dicts of ``cls.__mro__``, else ``_MISSING``. Not ``inspect.getattr_static(cls, name)``,
    which also looks in the metaclass: ``type.__name__`` is a class's name, and no instance
    has it (``getattr(obj, "__name__", None)`` is ``None`` in eager)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def bind_class_attr(obj: V.Var, cls: type, raw: Any, name: str) -> V.Var:
    """What ``obj.<name>`` is when the class holds ``raw`` (descriptors resolved)."""
    from torchfuse.capture.calls import call

    if isinstance(raw, staticmethod):
        return V.ObjVar(raw.__func__)
    if isinstance(raw, classmethod):
        return V.BoundMethodVar(V.ObjVar(raw.__func__), V.ObjVar(cls))
    if isinstance(raw, property):
        if raw.fget is None:
            raise Unsupported("unreadable property", current().loc)
        return call(V.ObjVar(raw.fget), [obj], {})
    if isinstance(raw, types.FunctionType):
        return V.BoundMethodVar(V.ObjVar(raw, method_source(obj, cls, name)), obj)
    if isinstance(raw, functools_cached_property()):
        return call(V.ObjVar(raw.func), [obj], {})
    if hasattr(raw, "__get__") and not isinstance(raw, type) and not V.is_constant(raw):
        if isinstance(raw, types.BuiltinFunctionType | types.WrapperDescriptorType
                      | types.MethodDescriptorType):
            return V.BoundMethodVar(V.ObjVar(raw), obj)
        raise Unsupported(f"descriptor {type(raw).__name__} on {cls.__name__}", current().loc)
    if V.is_constant(raw) and obj.source is not None:
        return V.ConstVar(raw, ClassAttrSource(obj.source, name))
    return current().wrap(raw, None)


def method_source(obj: V.Var, cls: type, name: str) -> Source | None:
    """Where a method ``cls.<name>`` is read from, so that what inlining it reads of the
    function (``__defaults__``, ``__kwdefaults__``) is guarded when it is used: the class as a
    module global when it is one (one guard however many instances call it), else
    ``type(obj).<name>``."""
    mod = sys.modules.get(cls.__module__)
    if mod is not None and getattr(mod, cls.__qualname__, None) is cls:
        return AttrSource(ModuleGlobalSource(cls.__module__, cls.__qualname__), name)
    if obj.source is not None and not obj.source.is_module_state and obj.python_type() is cls:
        return ClassAttrSource(obj.source, name)
    return None


def functools_cached_property() -> type:
    import functools

    return functools.cached_property


def _super_attr(obj: V.SuperVar, name: str) -> V.Var:
    self_type = obj.self_var.python_type() if not isinstance(obj.self_var, V.ObjVar) else obj.self_var.value
    mro = self_type.__mro__
    if obj.cls not in mro and isinstance(self_type, type):  # a metaclass method: self is a class
        mro = type(self_type).__mro__
    start = mro.index(obj.cls) + 1
    for klass in mro[start:]:
        if isinstance(obj.self_var, V.DictVar) and name in klass.__dict__ and \
                not klass.__flags__ & HEAPTYPE:
            return V.MethodVar(obj.self_var, name)  # dict's (or object's) own, in C
        if name in klass.__dict__:
            raw = klass.__dict__[name]
            if isinstance(raw, types.FunctionType):
                return V.BoundMethodVar(V.ObjVar(raw), obj.self_var)
            if name == "__new__":  # a static method: super().__new__(cls) passes cls itself
                return V.ObjVar(raw.__func__ if isinstance(raw, staticmethod) else raw)
            if klass is type and name == "__call__":  # super().__call__ in a metaclass
                return V.BoundMethodVar(V.ObjVar(raw), obj.self_var)
            return bind_class_attr(obj.self_var, klass, raw, name)
    raise Unsupported(f"super() has no attribute {name!r}", current().loc)


def setattr_var(obj: V.Var, name: str, value: V.Var, plain: bool = False) -> None:
    """``obj.<name> = value``; ``plain``: as ``object.__setattr__`` stores it."""
    ctx = current()
    if not plain and isinstance(obj, V.UserObjVar):
        custom = inspect.getattr_static(type(obj.value), "__setattr__", None)
        if isinstance(custom, types.FunctionType):  # the class's own (a frozen dataclass's): interpret it
            from torchfuse.capture.calls import call

            call(V.BoundMethodVar(V.ObjVar(custom), obj), [V.ConstVar(name), value], {})
            return
    if isinstance(obj, V.DictVar) and obj.kind is not dict and obj.source is None:
        from torchfuse.capture.calls import call

        override = python_override(obj.kind, "__setattr__", dict)
        if isinstance(override, types.FunctionType):
            call(V.BoundMethodVar(V.ObjVar(override), obj), [V.ConstVar(name), value], {})
        else:
            from torchfuse.capture.methods import dict_method

            dict_method(obj, "__setattr__", [V.ConstVar(name), value], {})
        return
    if isinstance(obj, V.ModuleVar | V.UserObjVar):
        prop = inspect.getattr_static(type(obj.value), name, None)
        if isinstance(prop, property):
            if prop.fset is None:
                raise Unsupported(f"property {name} has no setter", ctx.loc)
            from torchfuse.capture.calls import call

            call(V.ObjVar(prop.fset), [obj, value], {})
            return
        obj.overrides[name] = value
        if obj.source is not None or (isinstance(obj, V.ModuleVar) and not obj.is_new):
            if obj.source is None:
                raise Unsupported("attribute write on a module capture cannot name", ctx.loc)
            ctx.side_effects.append(("setattr", obj, name, value, ctx.loc))
        return
    if isinstance(obj, V.TensorVar) and name == "requires_grad":
        # as eager: the setter is ``requires_grad_`` (a non-leaf raises the same RuntimeError)
        from torchfuse.capture.calls import call

        call(getattr_var(obj, "requires_grad_"), [value], {})
        return
    if isinstance(obj, V.FunctionVar) and name not in ("__code__", "__defaults__", "__kwdefaults__",
                                                       "__dict__", "__closure__", "__globals__"):
        obj.attr_dict().items[name] = value  # made in the frame: nothing outside sees it
        return
    if isinstance(obj, V.CachedFunctionVar) and name != "__dict__":
        obj.attrs.items[name] = value
        return
    raise Unsupported(f"attribute assignment on {obj.describe()}", ctx.loc)
