"""Calling Vars: inlining user code, calling torch on fakes, builtins, classes.

`call` is the single entry every ``CALL`` goes through. The rule, in order:

1. bound methods / partials unwrap to their function;
2. methods of tensors and containers (``x.relu()``, ``lst.append``);
3. builtins and the ``operator``/``math`` modules (`torchfuse.capture.builtins`);
4. grad-mode and autocast context managers;
5. torch library code (``torch.*`` functions, ``torch.nn.functional``, ``torch.nn`` leaf
   modules) is *called directly on fakes* under the recorder when its arguments are tensors
   and constants — nothing of torch's own Python is interpreted;
6. everything else written in Python (user functions, ``forward`` s, methods, properties,
   lambdas, comprehensions) is inlined: its bytecode runs in a child frame.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import inspect
import operator
import sys
import types
import weakref
from typing import Any

import torch
from torchfuse.capture import checkpoint, custom_function, modules_made, pyrandom, scan
from torchfuse.capture import variables as V
from torchfuse.capture.attention import SDPA, fused_call, without_noop_mask
from torchfuse.capture.context import current
from torchfuse.capture.distributed import is_distributed_runtime
from torchfuse.capture.dynamic import SYM_TYPES, concrete, contains_symbolic
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.source import AttrSource, ItemSource, Source
from torchfuse.capture.values import from_py, to_py
from torchfuse.graph.symbolic import SpecializationError

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def call(fn: V.Var, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """Call ``fn`` with Var arguments; returns the result Var."""
    from torchfuse.capture import builtins as B
    from torchfuse.capture import methods as M

    ctx = current()
    if isinstance(fn, V.BoundMethodVar):
        if isinstance(fn.self_var, V.ModuleVar) and isinstance(fn.func, V.ObjVar) and \
                isinstance(fn.func.value, types.FunctionType):
            # methods of modules are interpreted, torch's own (Sequential.forward) included:
            # calling them natively would touch real parameters behind capture's back
            return inline(fn.func, [fn.self_var, *args], kwargs)
        return call(fn.func, [fn.self_var, *args], kwargs)
    if isinstance(fn, V.PartialVar):
        return call(fn.func, [*fn.args, *args], {**fn.kwargs, **kwargs})
    if isinstance(fn, V.MethodVar):
        return M.call_method(fn.obj, fn.name, args, kwargs)
    if isinstance(fn, V.FunctionVar):
        return inline(fn, args, kwargs)
    if isinstance(fn, V.CachedFunctionVar):
        from torchfuse.capture import stdlib

        return stdlib.cached_call(B.STDLIB_CORE, fn, args, kwargs)
    if isinstance(fn, V.ExitVar):
        return B.exit_context(fn.ctx)
    if isinstance(fn, V.UserExitVar):
        return call(fn.exit, args, kwargs)
    if isinstance(fn, V.ModuleVar):
        return call_module(fn, args, kwargs)
    if isinstance(fn, V.UserObjVar):
        traced = _numpy_call(fn.value, args, kwargs)  # a ufunc (np.exp) is an object with __call__
        if traced is not None:
            return traced
        return call(_attr(fn, "__call__"), args, kwargs)
    if isinstance(fn, V.ContextVar) and len(args) == 1 and not kwargs and \
            isinstance(args[0], V.FunctionVar | V.ObjVar | V.BoundMethodVar):
        return V.DecoratedVar(fn, args[0])  # @torch.no_grad() on a function made here
    if isinstance(fn, V.DecoratedVar):
        region = V.ContextVar(fn.context.kind, fn.context.args)  # one per call, as Python's
        B.enter_context(region)
        try:
            out = call(fn.func, args, kwargs)
        except UserException:
            B.exit_context(region)
            raise
        B.exit_context(region)
        return out
    if isinstance(fn, V.SuperVar | V.NullVar | V.CellVar | V.IteratorVar):
        raise Unsupported(f"call of {fn.describe()}", ctx.loc)
    if isinstance(fn, V.ConstVar | V.TensorVar | V.ListVar | V.DictVar | V.SetVar):
        raise Unsupported(f"{fn.describe()} is not callable", ctx.loc)
    value = fn.python()
    applied = custom_function.apply(value, args, kwargs, _INTERPRETER)  # MyFunction.apply(...)
    if applied is None:
        applied = scan.apply(value, args, kwargs, _INTERPRETER)  # associative_scan(combine_fn, ...)
    if applied is None:
        applied = checkpoint.apply(value, args, kwargs, _INTERPRETER)  # torch.utils.checkpoint
    if applied is not None:
        return applied
    constant = _marked_constant(value, args, kwargs)
    if constant is not None:
        return constant
    from torchfuse.capture.compiler import CompiledFunction

    if isinstance(value, CompiledFunction):  # compiled inside compiled: capture it inline
        inner = [ctx.wrap(value.bound_self, None)] if value.bound_self is not None else []
        return inline(V.ObjVar(value.fn), [*inner, *args], kwargs)
    traced = _numpy_call(value, args, kwargs)
    if traced is not None:
        return traced
    if value is OBJECT_NEW or value is TUPLE_NEW:
        made = (object_new if value is OBJECT_NEW else tuple_new)(args, kwargs)
        if made is not None:
            return made
    if value is TYPE_CALL and args and isinstance(args[0], V.ObjVar) and isinstance(args[0].value, type):
        return construct_instance(args[0].value, args[1:], kwargs)  # super().__call__ in a metaclass
    handler = B.handler_for(value)
    if handler is not None:
        return handler(args, kwargs)
    drawn = pyrandom.draw(value, args, kwargs)  # random.random(): a graph input drawn per call
    if drawn is not None:
        return drawn
    if type(value) in (operator.itemgetter, operator.attrgetter) and len(args) == 1 and not kwargs:
        return _getter_call(value, args[0])
    if type(value) is weakref.ref and not args and not kwargs:
        # the referent, as an object the capture already knows when it is one (identity
        # checks such as ``ref() is weight`` then fold)
        return ctx.wrap(value(), None)
    if isinstance(value, functools._lru_cache_wrapper):
        # a cache that lives outside the frame: its function is traced, the cache ignored
        # (as TorchDynamo does), so the graph computes what a miss would
        src = AttrSource(fn.source, "__wrapped__") if fn.source is not None else None
        return call(ctx.wrap(value.__wrapped__, src), args, kwargs)
    if isinstance(value, functools.partial):
        pv = V.PartialVar(ctx.wrap(value.func, None), [ctx.wrap(a, None) for a in value.args],
                          {k: ctx.wrap(v, None) for k, v in value.keywords.items()})
        return call(pv, args, kwargs)
    if isinstance(value, types.MethodType):
        return call(V.BoundMethodVar(ctx.wrap(value.__func__, None), ctx.wrap(value.__self__, None)),
                    args, kwargs)
    if is_torch_callable(value):
        return call_torch_function(value, args, kwargs)
    if getattr(value, "__code__", None) in _CONTEXTMANAGER_CODES:
        # a @contextmanager generator: capture collects generators whole, which would run the
        # code after its yield now; it is made in Python, and ``with`` on it resumes
        raise Unsupported(f"calling @contextmanager {_qualname(value)} (its __enter__ and "
                          f"__exit__ run in Python)", ctx.loc)
    if isinstance(value, types.FunctionType):
        return inline(fn, args, kwargs)
    if isinstance(value, type):
        return construct(value, args, kwargs)
    raise Unsupported(f"call to {_qualname(value)} is not supported", ctx.loc,
                      "move it out of the compiled function")


_CONTEXTMANAGER_CODES = frozenset(
    getattr(deco(lambda: None), "__code__", None) for deco in
    (contextlib.contextmanager, getattr(contextlib, "asynccontextmanager", contextlib.contextmanager)))


_LITERALS = (type(None), bool, int, float, str)


def _literal(v: Any, depth: int = 0) -> bool:
    if type(v) in _LITERALS:
        return True
    return type(v) in (tuple, frozenset) and depth < 4 and all(_literal(i, depth + 1) for i in v)


def _marked_constant(value: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """A call of a function its library marks as a trace-time constant (``fn._dynamo_marked_constant
    = True``, the marker TorchDynamo's ``assume_constant_result`` sets and transformers sets on
    its install probes, ``is_torch_available`` and the like, under their ``lru_cache``), with
    constant arguments: made for real, its result a constant of the graph, no guard (the
    library vouches that it does not change in the process). Tracing them read
    ``importlib.metadata`` (a break on ``vars``, in every Wav2Vec2 and Mamba forward). None
    when it is not such a call, or its result is not a literal (then it is traced)."""
    # the function's own __dict__ (update_wrapper copies it onto the lru_cache wrapper): a
    # dict lookup on every call capture interprets, no descriptor run
    marked = value.__dict__.get("_dynamo_marked_constant") \
        if isinstance(value, types.FunctionType | functools._lru_cache_wrapper) else None
    if marked is not True or not all(type(a) is V.ConstVar for a in [*args, *kwargs.values()]):
        return None
    try:
        out = value(*[a.python() for a in args], **{k: v.python() for k, v in kwargs.items()})
    except Exception as e:
        raise UserException(e, current().loc) from e
    return from_py(out) if _literal(out) else None


def _attr(obj: V.Var, name: str) -> V.Var:
    from torchfuse.capture.attrs import getattr_var

    return getattr_var(obj, name)


def _qualname(value: Any) -> str:
    mod = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)
    return f"{mod}.{name}" if mod and mod != "builtins" else name


_TORCH_PREFIXES = ("torch.", "torch")


def _numpy_call(value: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """A numpy function traced as torch ops (`torchfuse.capture.numpy_trace`), or None when
    ``value`` is not one it handles (or numpy was never imported)."""
    if "numpy" not in sys.modules:
        return None
    from torchfuse.capture import numpy_trace

    return numpy_trace.call_function(value, args, kwargs) if numpy_trace.handles(value) else None


_INLINED_TORCH_MODULES = frozenset({"torch.nn.utils.parametrize"})
"""torch's own Python code that is interpreted, not called on fakes: a parametrized module's
property getter (``weight_norm``'s ``weight``) reads the module, which a call on fakes cannot."""


def is_torch_callable(value: Any) -> bool:
    """Library code of torch itself (called directly on fakes, never inlined)."""
    if isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return True
    if isinstance(value, type):
        return False
    objclass = getattr(value, "__objclass__", None)
    if objclass is not None and issubclass(objclass, torch._C.TensorBase):
        return True
    mod = getattr(value, "__module__", None) or ""
    if mod in _INLINED_TORCH_MODULES:
        return False
    if mod == "torch" or (mod.startswith("torch.") and not mod.startswith("torch.testing")):
        return True
    self_ = getattr(value, "__self__", None)
    return isinstance(self_, types.ModuleType) and self_.__name__.startswith("torch")


def _symbolic_scalar_tensor(value: Any, kwargs: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
    """``torch.tensor(n)`` of a size value: torch cannot infer a dtype from a ``SymInt``. An
    int stays symbolic (``scalar_tensor(s0)``, int64 as for an int); a ``SymBool`` or
    ``SymFloat`` is specialized (its relation becomes a guard) and made from the plain value."""
    if set(kwargs) - {"dtype", "device", "requires_grad"}:
        raise Unsupported(f"torch.tensor of a size value with {sorted(kwargs)}", current().loc)
    if isinstance(value, torch.SymInt):
        return torch.scalar_tensor, [value], {"dtype": torch.int64, **kwargs}
    return torch.tensor, [concrete(value)], kwargs


def _symbolic_list_tensor(items: Any, rest: list[Any], kwargs: dict[str, Any]) -> V.Var:
    """``torch.tensor([n, m * 2])`` of a flat list of ints and size values: the scalars
    stacked, sizes kept symbolic; a list with ``SymBool``/``SymFloat`` items or nested lists is
    made from the plain values (each relation a guard), as `_symbolic_scalar_tensor` does."""
    ctx = current()
    if not rest and all(type(v) is int or isinstance(v, torch.SymInt) for v in items) and \
            not set(kwargs) - {"dtype", "device"}:
        dtype = kwargs.get("dtype") or torch.int64
        device = kwargs.get("device")
        parts = [ctx.call_torch(torch.scalar_tensor, [v], {"dtype": dtype, "device": device}, "torch.tensor")
                 for v in items]
        return from_py(ctx.call_torch(torch.stack, [parts], {}, "torch.tensor"))
    return from_py(ctx.call_torch(torch.tensor, [concrete(items), *rest], kwargs, "torch.tensor"))


def _getter_call(getter: Any, obj: V.Var) -> V.Var:
    """``operator.itemgetter(1)(obj)`` / ``attrgetter("a.b")(obj)`` (sort keys, ``Counter``'s
    ``most_common``): the reads they stand for, one item or a tuple of them."""
    from torchfuse.capture import operators as O
    from torchfuse.capture.attrs import getattr_var

    keys = getter.__reduce__()[1]
    if type(getter) is operator.itemgetter:
        got = [O.getitem(obj, V.ConstVar(k)) for k in keys]
    else:
        got = []
        for dotted in keys:
            v = obj
            for part in dotted.split("."):
                v = getattr_var(v, part)
            got.append(v)
    return got[0] if len(got) == 1 else V.ListVar(got, tuple)


_UNSUPPORTED_TORCH = {"manual_seed", "set_grad_enabled", "save", "load", "compile"}


def call_torch_function(value: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    name = getattr(value, "__name__", "")
    from torchfuse.capture import arrays

    if args and isinstance(args[0], V.TracedArrayVar) and value in arrays.TO_TENSOR:
        from torchfuse.capture.numpy_trace import to_tensor

        return to_tensor(value, args[0], kwargs)
    if arrays.converts(value, args):
        from torchfuse.capture.methods import call_method

        return arrays.to_tensor(value, args, kwargs, lambda t, kw: call_method(t, "to", [], kw))
    if name in _UNSUPPORTED_TORCH:
        raise Unsupported(f"torch.{name} inside a compiled function", ctx.loc)
    if is_distributed_runtime(value):
        raise Unsupported(f"{_qualname(value)} is a torch.distributed runtime call", ctx.loc,
                          "it runs in Python, between graphs: collectives, DDP's reducer and "
                          "FSDP's hooks talk to the other ranks (docs/distributed.md)")
    if name == "is_grad_enabled":
        state = torch.is_grad_enabled()
        ctx.guards.grad_mode(state)
        return V.ConstVar(state)
    for a in [*args, *kwargs.values()]:
        if isinstance(a, V.FunctionVar | V.BoundMethodVar | V.UserObjVar | V.ModuleVar):
            # torch would run Python on (or mutate) the real object behind capture's back
            raise Unsupported(f"{_qualname(value)} with a {a.describe()} argument", ctx.loc)
    pargs = [to_py(a) for a in args]
    pkwargs = {k: to_py(v) for k, v in kwargs.items()}
    if value in (torch.tensor, torch.as_tensor) and pargs and isinstance(pargs[0], SYM_TYPES):
        return from_py(ctx.call_torch(*_symbolic_scalar_tensor(pargs[0], pkwargs)))
    if value in (torch.tensor, torch.as_tensor) and pargs and \
            type(pargs[0]) in (list, tuple, torch.Size) and contains_symbolic(pargs[0]):
        return _symbolic_list_tensor(list(pargs[0]), pargs[1:], pkwargs)
    if value is SDPA:  # the fused kernel eager would run, not the composite's math fallback
        pargs, pkwargs = without_noop_mask(pargs, pkwargs, ctx.rec.known)
        fused = fused_call(pargs, pkwargs)
        if fused is not None:
            return from_py(ctx.call_torch(fused, [], {}, "scaled_dot_product_attention"))
    return from_py(ctx.call_torch(value, pargs, pkwargs, _qualname(value)))


# ----------------------------------------------------------------------------- modules


def _is_torch_leaf(mod: torch.nn.Module) -> bool:
    for m in mod.modules():
        if not type(m).__module__.startswith("torch.nn.modules"):
            return False
        if isinstance(m, torch.nn.Sequential | torch.nn.ModuleList | torch.nn.ModuleDict):
            return False
    return True


def call_module(fn: V.ModuleVar, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    mod = fn.value
    from torchfuse.capture.compiler import CompiledModule

    if isinstance(mod, CompiledModule):  # a compiled module inside a compiled function
        from torchfuse.capture.source import AttrSource

        inner = mod.__dict__["_orig_mod"]
        fn = ctx.wrap(inner, AttrSource(fn.source, "_orig_mod") if fn.source is not None else None)
        mod = inner
    glob = torch.nn.modules.module
    if mod._backward_hooks or getattr(mod, "_backward_pre_hooks", None) or \
            glob._global_forward_hooks or glob._global_forward_pre_hooks or \
            glob._global_backward_hooks or glob._global_backward_pre_hooks:
        raise Unsupported(f"module {type(mod).__name__} has backward or global hooks", ctx.loc)
    from torchfuse.capture.hooks import distributed_hooks

    if distributed_hooks(mod):
        err = Unsupported(f"module {type(mod).__name__} has torch.distributed forward hooks (FSDP)",
                          ctx.loc, "its call runs the hooks in Python and its forward is compiled "
                          "as a graph of its own (docs/distributed.md)")
        err.compile_callee = True
        raise err
    pre_hooks = _module_hooks(fn, "_forward_pre_hooks")
    post_hooks = _module_hooks(fn, "_forward_hooks")
    if not pre_hooks and not post_hooks:
        return _run_forward(fn, args, kwargs)
    # forward hooks run as nn.Module.__call__ runs them: interpreted like any Python
    args_var: V.Var = V.ListVar(list(args), tuple)
    kwargs_var: V.Var = V.DictVar(dict(kwargs))
    for hook_id, hook in pre_hooks:
        if hook_id in mod._forward_pre_hooks_with_kwargs:
            res = call(hook, [fn, args_var, kwargs_var], {})
            if not _is_none(res):
                from torchfuse.capture.operators import iterate

                pair = iterate(res)
                if len(pair) != 2:
                    raise Unsupported("forward pre-hook must return None or (args, kwargs)", ctx.loc)
                args_var, kwargs_var = pair
        else:
            res = call(hook, [fn, args_var], {})
            if not _is_none(res):
                args_var = res if isinstance(res, V.ListVar) and res.is_tuple else V.ListVar([res], tuple)
    from torchfuse.capture.operators import iterate

    if not isinstance(kwargs_var, V.DictVar):
        raise Unsupported("forward pre-hook returned non-dict kwargs", ctx.loc)
    result = _run_forward(fn, iterate(args_var), {str(k): v for k, v in kwargs_var.items.items()})
    for hook_id, hook in post_hooks:
        if hook_id in mod._forward_hooks_with_kwargs:
            res = call(hook, [fn, args_var, kwargs_var, result], {})
        else:
            res = call(hook, [fn, args_var, result], {})
        if not _is_none(res):
            result = res
    return result


def _is_none(v: V.Var) -> bool:
    return isinstance(v, V.ConstVar) and v.value is None


def _module_hooks(fn: V.ModuleVar, table: str) -> list[tuple[int, V.Var]]:
    """The forward hooks of one table, guarded: which hooks (ids, identity) are installed."""
    from torchfuse.capture.source import ItemSource, ModuleAttrSource

    ctx = current()
    hooks = fn.value.__dict__.get(table) or {}
    src = ModuleAttrSource(fn.source, table) if fn.source is not None else None
    if src is not None:
        ctx.guards.keys(src, tuple(hooks))  # a module guard: checked when modules change
    return [(hid, ctx.wrap(h, ItemSource(src, hid) if src is not None else None))
            for hid, h in hooks.items()]


def _run_forward(fn: V.ModuleVar, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    mod = fn.value
    prev_path = ctx.module_path
    from torchfuse.capture.source import qualified_name

    if fn.source is not None:
        ctx.module_path = qualified_name(fn.source) or prev_path
    try:
        if _is_torch_leaf(mod) and not contains_python_objects(args, kwargs):
            # bind parameters/buffers as graph inputs first, then let torch's forward run
            from torchfuse.capture.attrs import getattr_var

            for name, _ in mod.named_parameters(recurse=False):
                getattr_var(fn, name)
            for name, b in mod.named_buffers(recurse=False):
                if b is not None:
                    getattr_var(fn, name)
            for name, sub in mod.named_children():
                sub_var = getattr_var(fn, name)
                for pname, _ in sub.named_parameters(recurse=False):
                    getattr_var(sub_var, pname)
                for bname, _ in sub.named_buffers(recurse=False):
                    getattr_var(sub_var, bname)
            _guard_leaf_attributes(fn)
            return call_torch_function(mod.forward, args, kwargs)
        from torchfuse.capture.attrs import method_source

        forward = inspect.getattr_static(type(mod), "forward")
        return call(V.BoundMethodVar(V.ObjVar(forward, method_source(fn, type(mod), "forward")), fn),
                    args, kwargs)
    finally:
        ctx.module_path = prev_path


def _guard_leaf_attributes(fn: V.ModuleVar) -> None:
    """A torch module run directly reads its plain attributes (``training``, ``p``, ``eps``)."""
    from torchfuse.capture.source import ModuleAttrSource

    if fn.source is None:
        return
    ctx = current()
    for name, value in fn.value.__dict__.items():
        if not name.startswith("_") and V.is_constant(value):
            ctx.guards.constant(ModuleAttrSource(fn.source, name), value)


def contains_python_objects(args: list[V.Var], kwargs: dict[str, V.Var]) -> bool:
    return any(isinstance(a, V.FunctionVar | V.UserObjVar) for a in [*args, *kwargs.values()])


# ----------------------------------------------------------------------------- classes


def construct(cls: type, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        bound = inspect.signature(cls).bind(*args, **kwargs)
        bound.apply_defaults()
        items = [v if isinstance(v, V.Var) else V.ConstVar(v) for v in bound.arguments.values()]
        return V.ListVar(items, cls)
    if issubclass(cls, dict) and dataclasses.is_dataclass(cls):
        return _construct_data_mapping(cls, args, kwargs)
    if issubclass(cls, torch.nn.Module):
        return modules_made.construct(cls, args, kwargs, _INTERPRETER)
    if cls in (operator.itemgetter, operator.attrgetter) and not kwargs and \
            all(type(a) is V.ConstVar for a in args):  # called later by `_getter_call`
        return V.ObjVar(cls(*[a.python() for a in args]))
    if cls.__module__ == "builtins" or cls.__module__.startswith("torch"):
        if all(isinstance(a, V.ConstVar) for a in [*args, *kwargs.values()]):
            return from_py(cls(*[a.python() for a in args], **{k: v.python() for k, v in kwargs.items()}))
        raise Unsupported(f"constructing {cls.__qualname__} from non-constant arguments", ctx.loc)
    meta = type(cls)
    if meta not in (type, abc.ABCMeta):
        meta_call = inspect.getattr_static(meta, "__call__", None)
        if isinstance(meta_call, types.FunctionType):  # the metaclass's __call__, interpreted
            return call(V.BoundMethodVar(V.ObjVar(meta_call), ctx.wrap(cls, None)), args, kwargs)
        if meta_call is not TYPE_CALL:
            raise Unsupported(f"class {cls.__qualname__} with a metaclass whose __call__ is not "
                              f"Python", ctx.loc)
    return construct_instance(cls, args, kwargs)


TYPE_CALL = type.__dict__["__call__"]
OBJECT_NEW = object.__new__
TUPLE_NEW = tuple.__new__


def tuple_new(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """``tuple.__new__(cls, iterable=())`` of a tuple subclass written in Python (what its
    own ``__new__`` ends with): a sequence Var of that class over the iterable's items; None
    when it is not that."""
    from torchfuse.capture.operators import iterate

    if kwargs or not 1 <= len(args) <= 2 or not isinstance(args[0], V.ObjVar) or \
            not V.is_tuple_subclass(args[0].value):
        return None
    return V.ListVar(iterate(args[1]) if len(args) > 1 else [], args[0].value)


def construct_instance(cls: type, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """What ``type.__call__(cls, ...)`` does: ``cls.__new__`` (a Python ``__new__`` is
    interpreted), then ``__init__`` when the result is an instance of ``cls``."""
    ctx = current()
    if issubclass(cls, BaseException) and _builtin_exception_init(cls) and \
            all(isinstance(a, V.ConstVar) for a in [*args, *kwargs.values()]):
        # an exception class of Python code that keeps BaseException's construction
        # (dataclasses.FrozenInstanceError): made for real, as builtin exceptions are
        try:
            return V.ObjVar(cls(*[a.python() for a in args],
                                **{k: v.python() for k, v in kwargs.items()}))
        except Exception as e:
            raise UserException(e, ctx.loc) from e
    if cls.__new__ is not object.__new__:
        new = inspect.getattr_static(cls, "__new__")
        fn = new.__func__ if isinstance(new, staticmethod) else None
        modelled = _plain_instances(cls) or V.is_tuple_subclass(cls)
        if new is TUPLE_NEW and V.is_tuple_subclass(cls):
            made = tuple_new([ctx.wrap(cls, None), *args], kwargs)
        elif not isinstance(fn, types.FunctionType) or not modelled:
            raise Unsupported(f"class {cls.__qualname__} with a custom __new__ or metaclass", ctx.loc)
        else:
            made = call(V.ObjVar(fn), [ctx.wrap(cls, None), *args], kwargs)
        if isinstance(made, V.ListVar) and made.kind is cls:
            pass  # a tuple subclass's instance, made by tuple.__new__
        elif not isinstance(made, V.UserObjVar) or not isinstance(made.value, cls):
            if isinstance(made.python_type(), type) and issubclass(made.python_type(), cls):
                raise Unsupported(f"{cls.__qualname__}.__new__ returned an instance capture "
                                  f"does not model", ctx.loc)
            return made  # type.__call__ skips __init__ for what is not an instance of cls
        elif not made.is_new:  # a cached instance (a singleton): __init__ would run on it again
            raise Unsupported(f"{cls.__qualname__}.__new__ returned an existing object", ctx.loc)
        var = made
    else:
        var = V.UserObjVar(object.__new__(cls), None, is_new=True)
    init = inspect.getattr_static(cls, "__init__")
    if init is not object.__init__:
        call(V.BoundMethodVar(V.ObjVar(init), var), args, kwargs)
    elif (args or kwargs) and cls.__new__ is object.__new__:
        raise Unsupported(f"{cls.__qualname__}() takes no arguments", ctx.loc)
    return var


def _builtin_exception_init(cls: type) -> bool:
    """``__new__`` and ``__init__`` of the exception class are builtin ones (C code)."""
    return not any(isinstance(inspect.getattr_static(cls, name), types.FunctionType | staticmethod)
                   for name in ("__new__", "__init__"))


def _plain_instances(cls: type) -> bool:
    """Instances are made by ``object.__new__`` (no builtin base such as tuple or dict)."""
    return all(k is object or k.__module__ != "builtins" for k in cls.__mro__)


def object_new(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """``object.__new__(cls)`` (``super().__new__(cls)`` in a Python ``__new__``) of a plain
    user class: a new object of the interpreter; ``None`` when it is not that."""
    if not args or kwargs or not isinstance(args[0], V.ObjVar) or not isinstance(args[0].value, type):
        return None
    cls = args[0].value
    if not _plain_instances(cls):
        return None
    return V.UserObjVar(object.__new__(cls), None, is_new=True)


def _construct_data_mapping(cls: type, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """A dataclass that is also a dict (model outputs): a record of values, so its constructor
    runs natively on stand-ins — fakes for tensors, placeholders for other objects — and the
    items and attributes it stored are mapped back to the Vars they stand for."""
    ctx = current()
    back: dict[int, V.Var] = {}

    def stand_in(v: V.Var) -> Any:
        if isinstance(v, V.TensorVar):
            back[id(v.fake)] = v
            return v.fake
        if isinstance(v, V.ConstVar):
            return v.python()  # guarded: the value may end up in the output as a constant
        if isinstance(v, V.ListVar) and v.is_tuple and all(isinstance(i, V.TensorVar | V.ConstVar)
                                                            for i in v.items):
            value = V.make_sequence(v.kind, [stand_in(i) for i in v.items])
            back[id(value)] = v
            return value
        placeholder = _StandIn(v)
        back[id(placeholder)] = v
        return placeholder

    pargs = [stand_in(a) for a in args]
    pkwargs = {k: stand_in(v) for k, v in kwargs.items()}
    try:
        obj = cls(*pargs, **pkwargs)
    except SpecializationError:
        raise
    except Exception as e:  # what eager would raise
        from torchfuse.capture.errors import UserException

        raise UserException(e, ctx.loc) from e

    def var_of(value: Any) -> V.Var:
        known = back.get(id(value))
        if known is not None:
            return known
        if V.is_constant(value):
            return V.ConstVar(value)
        raise Unsupported(f"{cls.__qualname__}() made a value capture cannot follow", ctx.loc)

    items = {k: var_of(v) for k, v in dict.items(obj)}
    attrs = {k: var_of(v) for k, v in vars(obj).items()}
    return V.DictVar(items, kind=cls, attrs=attrs)


class _StandIn:
    """Holds the place of a non-tensor Var while a record class is built natively."""

    __slots__ = ("var",)

    def __init__(self, var: V.Var) -> None:
        self.var = var


# ----------------------------------------------------------------------------- inlining


def inline(fn: V.Var, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """Run a Python function's bytecode in a child frame and return what it returns."""
    from torchfuse.capture.frame import Frame

    ctx = current()
    parent = Frame.current_frame()
    depth = parent.depth + 1 if parent is not None else 0
    from torchfuse.capture.config import config

    if depth > config.inline_depth_limit:
        raise Unsupported("recursion too deep to inline", ctx.loc)
    if isinstance(fn, V.FunctionVar):
        code, f_globals = fn.code, fn.f_globals
        defaults, kwdefaults, cells = list(fn.defaults), dict(fn.kwdefaults), list(fn.closure)
    else:
        func = fn.python()
        code, f_globals = func.__code__, func.__globals__
        src = fn.source  # a helper read from a global: its defaults and cells are guarded too

        def sub(attr: str, key: object) -> Source | None:
            return ItemSource(AttrSource(src, attr), key) if src is not None else None

        defaults = [ctx.wrap(d, sub("__defaults__", i)) for i, d in enumerate(func.__defaults__ or ())]
        kwdefaults = {k: ctx.wrap(v, sub("__kwdefaults__", k))
                      for k, v in (func.__kwdefaults__ or {}).items()}
        # a method's ``__class__`` cell (``super()``) holds its class for good: no source
        cells = [V.CellVar(_cell_value(ctx, c, AttrSource(sub("__closure__", i), "cell_contents")
                                       if src is not None and var != "__class__" else None))
                 for i, (var, c) in enumerate(zip(code.co_freevars, func.__closure__ or (), strict=True))]
    if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"async function {code.co_name}", ctx.loc)
    local_vars = bind_arguments(code, defaults, kwdefaults, args, kwargs)
    frame = Frame(ctx, code, f_globals, local_vars,
                  dict(zip(code.co_freevars, cells, strict=True)), parent=parent, depth=depth)
    return frame.run()


def _cell_value(ctx: Any, cell: Any, source: Source | None) -> V.Var:
    try:
        value = cell.cell_contents
    except ValueError:
        return V.UNBOUND
    return ctx.wrap(value, source)


def bind_arguments(code: types.CodeType, defaults: list[V.Var], kwdefaults: dict[str, V.Var],
                   args: list[V.Var], kwargs: dict[str, V.Var]) -> dict[str, V.Var]:
    """Arguments to locals by the rules of a Python call (what ``inspect.Signature.bind`` does)."""
    ctx = current()
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kw_names = names[nargs:nargs + nkw]
    out: dict[str, V.Var] = {}
    kwargs = dict(kwargs)
    extra = args[nargs:]
    for name, a in zip(pos_names, args[:nargs], strict=False):
        out[name] = a
    posonly = set(pos_names[:code.co_posonlyargcount])
    varkw = bool(code.co_flags & CO_VARKEYWORDS)
    varkw_items: dict[str, V.Var] = {}
    for k in list(kwargs):
        if k in out or (k in pos_names and k not in posonly) or k in kw_names:
            if k in out:
                raise Unsupported(f"{code.co_name}() got multiple values for argument {k!r}", ctx.loc)
            out[k] = kwargs.pop(k)
    for k in list(kwargs):
        if varkw:
            varkw_items[k] = kwargs.pop(k)
        else:
            raise Unsupported(f"{code.co_name}() got an unexpected keyword argument {k!r}", ctx.loc)
    first_default = nargs - len(defaults)
    for i, name in enumerate(pos_names):
        if name not in out:
            if i >= first_default:
                out[name] = defaults[i - first_default]
            else:
                raise Unsupported(f"{code.co_name}() missing argument {name!r}", ctx.loc)
    for name in kw_names:
        if name not in out:
            if name not in kwdefaults:
                raise Unsupported(f"{code.co_name}() missing keyword argument {name!r}", ctx.loc)
            out[name] = kwdefaults[name]
    idx = nargs + nkw
    if code.co_flags & CO_VARARGS:
        out[names[idx]] = V.ListVar(list(extra), tuple)
        idx += 1
    elif extra:
        raise Unsupported(f"{code.co_name}() takes {nargs} positional arguments but "
                          f"{len(args)} were given", ctx.loc)
    if varkw:
        out[names[idx]] = V.DictVar(varkw_items)
    return out


__all__ = ["bind_arguments", "call", "construct", "inline"]


def _call_method(obj: V.Var, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture import methods as M

    return M.call_method(obj, name, args, kwargs)


_INTERPRETER = custom_function.Interpreter(inline=inline, construct=construct_instance, getattr=_attr,
                                           call_method=_call_method, call=call)
"""What `custom_function.apply`, `scan.apply`, `checkpoint.apply` and `modules_made.construct`
call back into."""
