"""Methods of tensors, containers and constants (``x.view(...)``, ``lst.append(v)``)."""

from __future__ import annotations

from typing import Any

import torch
from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dynamic import contains_symbolic
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.values import from_py, size_of, to_py

# Tensor methods that turn values into Python data: graph breaks, by name.
_DATA_METHODS = {"item": "Tensor.item() reads a value", "tolist": "Tensor.tolist() reads values",
                 "numpy": "Tensor.numpy() leaves torch", "__bool__": "truth value of a tensor",
                 "__int__": "int(tensor)", "__float__": "float(tensor)", "__index__": "index(tensor)",
                 "backward": "backward() inside a compiled function"}
_KNOWN_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__"})
"""Of those, the reads answered from a value known at capture (`.known`)."""


def call_method(obj: V.Var, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    if isinstance(obj, V.TensorVar):
        return tensor_method(obj, name, args, kwargs)
    if isinstance(obj, V.TracedArrayVar):
        from torchfuse.capture import numpy_trace

        return numpy_trace.call_method(obj, name, args, kwargs)
    if isinstance(obj, V.DequeVar):
        from torchfuse.capture.builtins import STDLIB_CORE
        from torchfuse.capture.stdlib import deque_method

        return deque_method(STDLIB_CORE, obj, name, args, kwargs)
    if isinstance(obj, V.CachedFunctionVar):
        from torchfuse.capture.stdlib import cached_method

        return cached_method(obj, name, args)
    if isinstance(obj, V.ListVar):
        return list_method(obj, name, args, kwargs)
    if isinstance(obj, V.DictVar):
        return dict_method(obj, name, args, kwargs)
    if isinstance(obj, V.SetVar):
        return set_method(obj, name, args, kwargs)
    if isinstance(obj, V.ConstVar):  # str.format, int.bit_length, torch.Size.numel …
        kept = _number_method(obj, name, args, kwargs)
        if kept is not None:
            return kept
        names = list(kwargs)
        return O.fold(lambda v, *a: getattr(v, name)(*a[:len(args)], **dict(
            zip(names, a[len(args):], strict=True))), obj, *args, *kwargs.values())
    raise Unsupported(f"method {name} of {obj.describe()}", ctx.loc)


def _number_method(obj: V.ConstVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """Methods of an int symbol or a float graph input that need not specialize it:
    ``n.bit_length()`` guards the power-of-two range of ``n`` (``4 <= s0 < 8`` for 3), not its
    value; ``conjugate()`` is the number itself; ``f.is_integer()`` guards that answer only."""
    if args or kwargs:
        return None
    if isinstance(obj, V.FloatArgVar):
        if name == "conjugate":
            return obj
        if name == "is_integer" and obj.source is not None:
            from torchfuse.capture.source import MethodCallSource

            answer = bool(obj.value.is_integer())
            current().guards.constant(MethodCallSource(obj.source, name), answer)
            return V.ConstVar(answer)
        return None
    value = obj.value
    if not isinstance(value, torch.SymInt):
        return None
    if name == "conjugate":
        return obj
    if name == "bit_length":
        k = int(value.node.hint).bit_length()
        if bool(value >= 2 ** (k - 1)) and bool(value < 2 ** k):  # each a guard on the symbol
            return V.ConstVar(k)
    return None


def _as_subclass(obj: V.TensorVar, cls: Any) -> V.Var:
    """``t.as_subclass(cls)``: an alias of ``t`` that the user sees as ``cls``."""
    from torchfuse.capture.context import check_subclass

    ctx = current()
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
        raise Unsupported(f"Tensor.as_subclass({cls!r})", ctx.loc)
    check_subclass(cls, ctx.loc)
    out = ctx.call_torch(torch.ops.aten.alias.default, [obj.fake], {}, "Tensor.as_subclass")
    var = V.TensorVar(out, None, cls)
    ctx.tensor_vars[id(out)] = var
    ctx.subclassed = ctx.subclassed or cls is not torch.Tensor
    return var


def tensor_method(obj: V.TensorVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    if name == "new_tensor" and len(args) == 1 and isinstance(args[0], V.ListVar | V.ConstVar) and \
            contains_symbolic(to_py(args[0])):  # t.new_tensor([n]) of sizes: torch.tensor's path
        from torchfuse.capture.calls import call_torch_function

        kw = {"dtype": V.ConstVar(obj.fake.dtype), "device": V.ConstVar(obj.fake.fake_device), **kwargs}
        return call_torch_function(torch.tensor, args, kw)
    if name in _KNOWN_READS and not args and not kwargs:
        value = ctx.rec.known.get(obj.fake)  # made from constants alone: eager's answer
        if value is not None and (name == "tolist" or value.numel() == 1):
            return from_py(getattr(value, name)())
    if name == "numpy" and not args and not kwargs:
        from torchfuse.capture.numpy_trace import from_tensor

        return from_tensor(obj)
    if _DATA_METHODS.get(name):
        raise Unsupported(f"data-dependent: {_DATA_METHODS[name]}", ctx.loc,
                          "keep the value as a tensor, or do this outside the compiled function")
    if name == "size":
        sizes = size_of(obj)
        if args or kwargs:
            dim = (args[0] if args else kwargs["dim"]).python()
            return V.ConstVar(sizes[dim])
        return V.ConstVar(sizes)
    if name == "dim" or name == "ndimension":
        return V.ConstVar(len(size_of(obj)))
    if name in ("numel", "nelement"):
        n = 1
        for s in size_of(obj):
            n *= s
        return V.ConstVar(n)
    if name in ("stride", "is_contiguous", "element_size", "get_device", "is_floating_point",
                "is_complex", "storage_offset", "data_ptr"):
        if name == "data_ptr":
            raise Unsupported("Tensor.data_ptr() inside a compiled function", ctx.loc)
        return from_py(getattr(obj.fake, name)(*[a.python() for a in args],
                                                **{k: v.python() for k, v in kwargs.items()}))
    if name == "type" and not args and not kwargs:
        return V.ConstVar(obj.fake.type())
    if name == "as_subclass" and len(args) == 1 and not kwargs:
        return _as_subclass(obj, to_py(args[0]))
    if name == "requires_grad_":
        return _requires_grad_(obj, args, kwargs)
    method = getattr(obj.fake, name, None)
    if method is None:
        raise Unsupported(f"tensor has no method {name!r}", ctx.loc)
    pargs = [to_py(a) for a in args]
    pkwargs = {k: to_py(v) for k, v in kwargs.items()}
    return from_py(ctx.call_torch(method, pargs, pkwargs, f"Tensor.{name}"))


def _requires_grad_(obj: V.TensorVar, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``t.requires_grad_(flag)`` (also ``t.requires_grad = flag``). The graph has no op for
    it: the fake's flag changes, and autograd then tracks it as a leaf. A tensor from outside
    the function would change for the caller, so that is a break; a tensor made here is
    noted (`Capture.made_leaves`)."""
    ctx = current()
    flag = bool(to_py(args[0]) if args else to_py(kwargs.get("requires_grad", V.ConstVar(True))))
    if obj.source is not None and flag != obj.fake.requires_grad:
        raise Unsupported("requires_grad_ changes a tensor from outside the function", ctx.loc)
    made = flag and obj.source is None and not obj.fake.requires_grad
    ctx.call_torch(obj.fake.requires_grad_, [flag], {}, "Tensor.requires_grad_")  # a non-leaf: a break
    if made:
        ctx.made_leaves[id(obj.fake)] = obj.fake
    return obj


def list_method(obj: V.ListVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    items = obj.items
    if obj.is_tuple and name not in ("index", "count", "_asdict", "_replace"):
        raise Unsupported(f"tuple method {name}", ctx.loc)
    if name == "append":
        O.mutate(obj)
        items.append(args[0])
    elif name == "extend":
        O.mutate(obj)
        items.extend(O.iterate(args[0]))
    elif name == "insert":
        O.mutate(obj)
        items.insert(args[0].python(), args[1])
    elif name == "pop":
        O.mutate(obj)
        return items.pop(args[0].python() if args else -1)
    elif name == "clear":
        O.mutate(obj)
        items.clear()
    elif name == "reverse":
        O.mutate(obj)
        items.reverse()
    elif name == "copy":
        return V.ListVar(list(items), list)
    elif name == "remove":
        O.mutate(obj)
        for i, x in enumerate(items):
            if O.is_same(x, args[0]) or (not isinstance(x, V.TensorVar)
                                          and O.truth(O.compare("==", x, args[0]))):
                del items[i]
                break
    elif name in ("index", "count"):
        target = args[0]
        matches = [i for i, x in enumerate(items) if O.is_same(x, target) or (
            not isinstance(x, V.TensorVar) and not isinstance(target, V.TensorVar)
            and O.truth(O.compare("==", x, target)))]
        if name == "count":
            return V.ConstVar(len(matches))
        if not matches:
            raise UserException(ValueError("list.index(x): x not in list"), ctx.loc)
        return V.ConstVar(matches[0])
    elif name == "sort":
        O.mutate(obj)
        from torchfuse.capture.builtins import sorted_vars

        reverse = bool(kwargs.get("reverse", V.ConstVar(False)).python())
        items[:] = sorted_vars(items, kwargs.get("key"), reverse)
    elif name == "_asdict":
        return V.DictVar(dict(zip(obj.fields or (), items, strict=True)))
    elif name == "_replace":
        new = list(items)
        for k, v in kwargs.items():
            new[(obj.fields or ()).index(k)] = v
        return V.ListVar(new, obj.kind)
    else:
        raise Unsupported(f"list method {name}", ctx.loc)
    return V.ConstVar(None)


def dict_method(obj: V.DictVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    items = obj.items
    if name in ("keys", "values", "items"):
        return V.DictViewVar(obj, name)
    if name == "get":
        k = args[0].python()
        default = args[1] if len(args) > 1 else V.ConstVar(None)
        return items.get(k, default)
    if name == "__getitem__":
        if obj.kind is not dict:  # dict's own lookup (``super().__getitem__`` in a subclass)
            k = args[0].python()
            if k not in items:
                raise UserException(KeyError(k), ctx.loc)
            return items[k]
        return O.getitem(obj, args[0])
    if name == "__setitem__":  # dict's own store, as a subclass's override reaches it
        O.mutate(obj)
        items[args[0].python()] = args[1]
        return V.ConstVar(None)
    if name == "__delitem__":
        O.mutate(obj)
        k = args[0].python()
        if k not in items:
            raise UserException(KeyError(k), ctx.loc)
        del items[k]
        return V.ConstVar(None)
    if name == "__setattr__" and obj.kind is not dict:  # object's store, for a dict subclass
        if obj.attrs is None:
            obj.attrs = {}
        obj.attrs[args[0].python()] = args[1]
        return V.ConstVar(None)
    if name == "copy":  # of the same class: an OrderedDict's or defaultdict's copy is one
        return V.DictVar(dict(items), kind=obj.kind,
                         attrs=dict(obj.attrs) if obj.attrs is not None and obj.kind is not dict else None)
    if name == "popitem":
        if not items:
            raise UserException(KeyError("popitem(): dictionary is empty"), ctx.loc)
        O.mutate(obj)
        last = args[0] if args else kwargs.get("last", V.ConstVar(True))
        k = next(reversed(items)) if last.python() else next(iter(items))
        return V.ListVar([V.ConstVar(k), items.pop(k)], tuple)
    if name == "move_to_end":  # OrderedDict's
        k = args[0].python()
        if k not in items:
            raise UserException(KeyError(k), ctx.loc)
        O.mutate(obj)
        value = items.pop(k)
        last = args[1] if len(args) > 1 else kwargs.get("last", V.ConstVar(True))
        if last.python():
            items[k] = value
        else:
            rest = dict(items)
            items.clear()
            items[k] = value
            items.update(rest)
        return V.ConstVar(None)
    if name == "pop":
        O.mutate(obj)
        k = args[0].python()
        if k in items:
            return items.pop(k)
        if len(args) > 1:
            return args[1]
        raise UserException(KeyError(k), ctx.loc)
    if name == "setdefault":
        k = args[0].python()
        if k not in items:
            O.mutate(obj)
            items[k] = args[1] if len(args) > 1 else V.ConstVar(None)
        return items[k]
    if name == "update":
        O.mutate(obj)
        if args:
            src = args[0]
            if isinstance(src, V.DictVar):
                items.update(src.items)
            else:
                for pair in O.iterate(src):
                    k, v = O.iterate(pair)
                    items[k.python()] = v
        for k, v in kwargs.items():
            items[k] = v
        return V.ConstVar(None)
    if name == "clear":
        O.mutate(obj)
        items.clear()
        return V.ConstVar(None)
    raise Unsupported(f"dict method {name}", ctx.loc)


def set_method(obj: V.SetVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    if name == "add":
        O.mutate(obj)
        obj.add(args[0])
        return V.ConstVar(None)
    if name == "update":
        O.mutate(obj)
        for a in args:
            for v in O.iterate(a):
                obj.add(v)
        return V.ConstVar(None)
    if name in ("discard", "remove"):
        O.mutate(obj)
        obj.items.pop(obj.key(args[0]), None)
        return V.ConstVar(None)
    if name in ("union", "intersection", "difference", "issubset", "issuperset"):
        other = [set(x.python() for x in O.iterate(a)) for a in args]
        return from_py(_setify(getattr(obj.python(), name)(*other)))
    raise Unsupported(f"set method {name}", ctx.loc)


def _setify(value: Any) -> Any:
    return frozenset(value) if isinstance(value, set) else value

