"""Python operators on Vars: arithmetic, comparison, truth, subscripts, membership.

Tensor operands go to torch (recorded); constant operands are folded; containers of Vars are
handled structurally (``[a] + [b]``, ``t[1:]``).
"""

from __future__ import annotations

import inspect
import operator
import types
from collections.abc import Iterator
from typing import Any

import torch
from torchfuse.capture import floats
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.source import ItemSource, ModuleAttrSource, ModuleStateSource
from torchfuse.capture.values import contains_tensor, from_py, python_override, to_py
from torchfuse.graph.symbolic import SpecializationError

BINARY: dict[str, Any] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE: dict[str, Any] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}
UNARY: dict[str, Any] = {"-": operator.neg, "+": operator.pos, "~": operator.invert,
                         "not": operator.not_, "abs": abs}


_FLOAT_OPS = frozenset({"+", "-", "*", "/", "//", "%", "**", "+=", "-=", "*=", "/=", "//=",
                        "%=", "**="})


_INT_DRAW_OPS = frozenset({"+", "-", "*", "/", "//", "%", "+=", "-=", "*=", "/=", "//=", "%="})


def _int_operands(tensor: V.TensorVar, draw: V.ConstVar, tensor_first: bool) -> list[Any] | None:
    """Operands for a tensor op with the 0-d int64 carrier of an int draw or of
    ``math.floor(f)`` (an ``int_carrier`` Var) in place of the int:
    against a 0-d integral tensor of another dtype the carrier is cast to it, which is the
    dtype a Python int keeps (0-d against 0-d would promote to int64)."""
    dt = tensor.fake.dtype
    if dt.is_complex:
        return None
    carrier = draw.carrier
    if tensor.fake.dim() == 0 and not dt.is_floating_point and dt not in (torch.bool, torch.int64):
        carrier = current().call_torch(torch.Tensor.to, [carrier, dt], {})
    return [tensor.fake, carrier] if tensor_first else [carrier, tensor.fake]


def _float_operands(a: V.Var, b: V.Var, op: str = "==") -> list[Any] | None:
    """Operands for a tensor op with a float argument's carrier in place of the float, cast
    so that the result has the dtype a Python float gives: the tensor's for a floating
    tensor, the default dtype for an integral one. ``None`` where that cannot be kept.
    An int draw's carrier is used likewise (`_int_operands`)."""
    tensor, flt = (a, b) if isinstance(a, V.TensorVar) else (b, a)
    if isinstance(tensor, V.TensorVar) and getattr(type(flt), "int_carrier", False):
        return _int_operands(tensor, flt, tensor is a) if op in _INT_DRAW_OPS or op in COMPARE else None
    if not isinstance(tensor, V.TensorVar) or not isinstance(flt, V.FloatArgVar):
        return None
    dt = tensor.fake.dtype
    if dt.is_complex:
        return None
    carrier = flt.carrier
    if not dt.is_floating_point:  # int/bool tensor with a float: the default float dtype
        carrier = current().call_torch(torch.Tensor.to, [carrier, torch.get_default_dtype()], {})
    elif tensor.fake.dim() == 0 and dt is not torch.float64:  # 0-d vs 0-d: keep the tensor's
        carrier = current().call_torch(torch.Tensor.to, [carrier, dt], {})
    return [tensor.fake, carrier] if tensor is a else [carrier, tensor.fake]


def _numpy(a: V.Var, b: V.Var | None = None) -> Any:
    """The numpy tracer, when an operand is a traced ndarray (else ``None``)."""
    arrays = V.TracedArrayVar | V.NdarrayVar
    if not (isinstance(a, arrays) or isinstance(b, arrays)):
        return None
    if isinstance(a, V.TensorVar) or isinstance(b, V.TensorVar):
        raise Unsupported("an operator between a numpy array and a tensor", current().loc)
    from torchfuse.capture import numpy_trace

    return numpy_trace


def binary(op: str, a: V.Var, b: V.Var) -> V.Var:
    fn = BINARY[op]
    np_trace = _numpy(a, b)
    if np_trace is not None:
        return np_trace.binary(op, a, b)
    if isinstance(a, V.TensorVar) or isinstance(b, V.TensorVar):
        operands = _float_operands(a, b, op) if op in _FLOAT_OPS else None
        if operands is not None:
            return from_py(current().call_torch(fn, operands, {}, f"operator {op}"))
        return from_py(current().call_torch(fn, [to_py(a), to_py(b)], {}, f"operator {op}"))
    kept = floats.binary(op, a, b)  # f * 2 of a float input, n / 2 of an int symbol
    if kept is not None:
        return kept
    got = _dict_subclass_binary(op, a, b)  # Counter's + - | &, interpreted
    if got is not None:
        return got
    base = op.rstrip("=") if op not in ("==",) else op
    if base in _SET_OPS and (_is_set_view(a) or _is_set_view(b)):
        # a keys/items view is a set, the result a ``set`` whatever the other iterable was
        return fold(lambda x, y: fn(_plain_set(x), _plain_set(y)), _as_set(a), _as_set(b))
    if isinstance(a, V.ListVar) and isinstance(b, V.ListVar) and base == "+":
        if op == "+=" and not a.is_tuple:
            mutate(a)
            a.items.extend(b.items)
            return a
        return V.ListVar(a.items + b.items, tuple if a.is_tuple else list)
    if isinstance(a, V.ListVar) and base == "+" and isinstance(b, V.ConstVar) and \
            isinstance(b.value, tuple | list):
        return binary(op, a, V.ListVar([V.ConstVar(v) for v in b.python()], tuple))
    if isinstance(a, V.ConstVar) and isinstance(a.value, tuple) and isinstance(b, V.ListVar) and base == "+":
        return V.ListVar([V.ConstVar(v) for v in a.python()] + b.items, tuple)
    if isinstance(a, V.ListVar) and base == "*" and isinstance(b, V.ConstVar):
        n = b.python()
        if op == "*=" and not a.is_tuple:
            mutate(a)
            a.items[:] = a.items * n
            return a
        return V.ListVar(a.items * n, tuple if a.is_tuple else list)
    if isinstance(a, V.DictVar) and isinstance(b, V.DictVar) and base == "|":
        if op == "|=":
            mutate(a)
            a.items.update(b.items)
            return a
        return V.DictVar({**a.items, **b.items})
    if (isinstance(a, V.ListVar | V.DictVar) and contains_tensor(a)) or \
            (isinstance(b, V.ListVar | V.DictVar) and contains_tensor(b)):
        raise Unsupported(f"operator {op} on {a.describe()} and {b.describe()}", current().loc)
    return fold(fn, a, b)


_SET_OPS = frozenset({"&", "|", "-", "^"})
_DUNDER_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
                 "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift",
                 ">>": "rshift"}


def _dict_subclass_binary(op: str, a: V.Var, b: V.Var) -> V.Var | None:
    """``a op b`` where an operand is a dict subclass made of Python (``Counter``) whose class
    defines the operator in Python: its methods, as Python tries them (in-place, then plain,
    then the right operand's reflected one), interpreted. ``None`` when no such method."""
    base = op.rstrip("=") if op.endswith("=") and op not in ("==",) else op
    name = _DUNDER_NAMES.get(base)
    if name is None:
        return None
    tries = []
    if isinstance(a, V.DictVar) and a.kind is not dict:
        tries += [(a, f"__i{name}__", b)] if op != base else []
        tries.append((a, f"__{name}__", b))
    same_kind = isinstance(a, V.DictVar) and isinstance(b, V.DictVar) and a.kind is b.kind
    if isinstance(b, V.DictVar) and b.kind is not dict and not same_kind:  # Python skips __r…__ then
        tries.append((b, f"__r{name}__", a))
    return _first_python_dunder(tries)


def _first_python_dunder(tries: list[tuple[V.Var, str, V.Var]]) -> V.Var | None:
    """The first of ``(x, method, y)`` whose ``x`` is a dict subclass defining ``method`` in
    Python and whose call ``x.method(y)``, interpreted, is not ``NotImplemented``; else None."""
    for x, method, y in tries:
        if isinstance(x, V.DictVar) and x.kind is not dict and \
                isinstance(python_override(x.kind, method, dict), types.FunctionType):
            got = _dunder(x, method, [y])
            if not _not_implemented(got):
                return got
    return None


def _is_set_view(v: V.Var) -> bool:
    """``d.keys()`` and ``d.items()`` are sets for operators (``d.values()`` is not)."""
    return isinstance(v, V.DictViewVar) and v.part != "values"


def _as_set(v: V.Var) -> V.Var:
    """The operand of a set operator or comparison with a view: a view, list or tuple as
    the set of its items (a view takes any iterable), anything else as it is."""
    if isinstance(v, V.DictViewVar | V.ListVar):
        return V.ConstVar(frozenset(i.python() for i in v.items))
    if isinstance(v, V.SetVar):
        return V.ConstVar(frozenset(v.python()))
    return v


def _plain_set(value: Any) -> Any:
    return set(value) if isinstance(value, frozenset) else value


def fold(fn: Any, *vars_: V.Var) -> V.Var:
    """Apply a Python function to constant operands."""
    vals = [v.python() for v in vars_]
    try:
        out = fn(*vals)
    except SpecializationError:
        raise
    except Exception as e:  # what eager would raise here, with these constants
        raise UserException(e, current().loc) from e
    return from_py(out)


def unary(op: str, a: V.Var) -> V.Var:
    if isinstance(a, V.TracedArrayVar | V.NdarrayVar) and op != "not":
        return _numpy(a).unary(op, a)
    if op == "not":
        return V.ConstVar(not truth(a))
    if isinstance(a, V.TensorVar):
        return from_py(current().call_torch(UNARY[op], [a.fake], {}, f"operator {op}"))
    if op == "-":
        kept = floats.neg(a)
        if kept is not None:
            return kept
    return fold(UNARY[op], a)


def compare(op: str, a: V.Var, b: V.Var) -> V.Var:
    np_trace = _numpy(a, b)
    if np_trace is not None:
        return np_trace.compare(op, a, b)
    if isinstance(a, V.UserObjVar) or isinstance(b, V.UserObjVar):
        return _rich_compare(op, a, b)  # a tensor's own method returns NotImplemented
    if isinstance(a, V.TensorVar) or isinstance(b, V.TensorVar):
        if op in ("==", "!=") and not (isinstance(a, V.TensorVar) and isinstance(b, V.TensorVar)):
            other = b if isinstance(a, V.TensorVar) else a
            if not isinstance(other, V.ConstVar) or other.value is None:
                return V.ConstVar(op == "!=")  # tensor == object: Python falls back to identity
        operands = _float_operands(a, b)
        if operands is not None:
            return from_py(current().call_torch(COMPARE[op], operands, {}, f"operator {op}"))
        return from_py(current().call_torch(COMPARE[op], [to_py(a), to_py(b)], {}, f"operator {op}"))
    got = _dict_subclass_compare(op, a, b)  # Counter's ==, <=, … (zero counts ignored)
    if got is not None:
        return got
    if _is_set_view(a) or _is_set_view(b):  # d.keys() == {1, 2}, d.keys() <= other.keys()
        a, b = (_as_set(v) if _is_set_view(v) or isinstance(v, V.SetVar) else v for v in (a, b))
        if not all(isinstance(v, V.ConstVar) and isinstance(v.value, frozenset) for v in (a, b)):
            return V.ConstVar(op == "!=") if op in ("==", "!=") else fold(COMPARE[op], a, b)
    structural = V.ConstVar | V.ListVar | V.DictVar | V.SetVar
    if op in ("==", "!=") and not (isinstance(a, structural) and isinstance(b, structural)):
        same = is_same(a, b)
        return V.ConstVar(same if op == "==" else not same)
    if isinstance(a, V.ListVar) and isinstance(b, V.ListVar) and op in ("==", "!="):
        if len(a.items) != len(b.items) or a.is_tuple != b.is_tuple:
            return V.ConstVar(op == "!=")
        eq = all(truth(compare("==", x, y)) for x, y in zip(a.items, b.items, strict=True))
        return V.ConstVar(eq if op == "==" else not eq)
    return fold(COMPARE[op], a, b)


def _dict_subclass_compare(op: str, a: V.Var, b: V.Var) -> V.Var | None:
    """``a op b`` where a dict subclass made of Python (``Counter``) defines the comparison
    in Python: the left operand's method, then the right one's reflected one, interpreted;
    ``None`` when neither is such a method or both give ``NotImplemented``."""
    return _first_python_dunder([(a, _RICH[op], b), (b, _RICH[_REFLECTED[op]], a)])


_RICH = {"==": "__eq__", "!=": "__ne__", "<": "__lt__", ">": "__gt__", "<=": "__le__",
         ">=": "__ge__"}
_REFLECTED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _not_implemented(v: Any) -> bool:
    return v is NotImplemented or (isinstance(v, V.ConstVar) and v.value is NotImplemented)


def _rich_compare(op: str, a: V.Var, b: V.Var) -> V.Var:
    """``a op b`` where an operand is a user object, as Python runs it: the left operand's
    method, then the right one's reflected method (first when the right operand's class is a
    subclass of the left one's), then identity for ``==``/``!=`` or a ``TypeError``. The
    classes' methods written in Python (``__eq__`` of a dataclass too) are interpreted."""
    ta, tb = _type_of(a), _type_of(b)
    tries = [(a, op, b), (b, _REFLECTED[op], a)]
    if ta is not tb and isinstance(b, V.UserObjVar) and ta is not None and issubclass(tb, ta):
        tries.reverse()
    for x, xop, y in tries:
        got = _rich_method(x, xop, y)
        if not _not_implemented(got):
            return got
    if op in ("==", "!="):
        same = is_same(a, b)
        return V.ConstVar(same if op == "==" else not same)
    names = [t.__name__ if t is not None else v.describe() for t, v in ((ta, a), (tb, b))]
    raise UserException(TypeError(f"'{op}' not supported between instances of "
                                  f"{names[0]!r} and {names[1]!r}"), current().loc)


def _type_of(v: V.Var) -> type | None:
    try:
        return v.python_type()
    except Unsupported:
        return None


def _rich_method(x: V.Var, op: str, y: V.Var) -> Any:
    """What ``type(x).__op__(x, y)`` returns (a Var, or ``NotImplemented``)."""
    if not isinstance(x, V.UserObjVar):
        # builtins, tensors, modules, functions: their methods know no user class
        return V.ConstVar(True) if op == "==" and is_same(x, y) else NotImplemented
    name = _RICH[op]
    got = python_dunder(x, name, [y])
    if got is not NotImplemented:
        return got
    raw = inspect.getattr_static(x.python_type(), name)
    if raw is not getattr(object, name):
        raise Unsupported(f"{name} of {x.describe()} is written in C ({type(raw).__name__})",
                          current().loc)
    if op == "==":
        return V.ConstVar(True) if is_same(x, y) else NotImplemented
    if op == "!=":  # object.__ne__ inverts the class's own __eq__
        eq = _rich_method(x, "==", y)
        return eq if _not_implemented(eq) else V.ConstVar(not truth(eq))
    return NotImplemented


def is_same(a: V.Var, b: V.Var) -> bool:
    """``a is b`` on Vars."""
    if a is b:
        return True
    if isinstance(a, V.ConstVar) and isinstance(b, V.ConstVar):
        return a.python() is b.python()
    if isinstance(a, V.ConstVar) or isinstance(b, V.ConstVar):
        c, other = (a, b) if isinstance(a, V.ConstVar) else (b, a)
        if isinstance(other, V.ObjVar | V.ModuleVar | V.UserObjVar):
            return c.python() is other.value
        return False
    if isinstance(a, V.TensorVar) and isinstance(b, V.TensorVar):
        return a.fake is b.fake
    if isinstance(a, V.ObjVar | V.ModuleVar | V.UserObjVar) and \
            isinstance(b, V.ObjVar | V.ModuleVar | V.UserObjVar):
        return a.value is b.value
    return False


def truth(a: V.Var) -> bool:
    """``bool(a)`` at capture time; a tensor's truth is data-dependent."""
    if isinstance(a, V.TracedArrayVar):
        raise Unsupported("data-dependent branch: the truth value of a numpy array", current().loc)
    if isinstance(a, V.TensorVar):
        value = current().rec.known.get(a.fake)  # made from constants alone (see known.py)
        if value is not None and value.numel() == 1:
            return bool(value)
        raise Unsupported("data-dependent branch: the truth value of a tensor (`if tensor:`) "
                          "is unknown while capturing", current().loc,
                          "use torch.where, or compute the condition outside the compiled function")
    if isinstance(a, V.ConstVar):
        return bool(a.python())
    if isinstance(a, V.ListVar):
        return bool(a.items)
    if isinstance(a, V.DictVar | V.SetVar):
        return bool(a.items)
    if isinstance(a, V.ModuleVar):
        guard_children(a)
        return bool(a.value)
    if isinstance(a, V.ObjVar):
        return bool(a.value)
    if isinstance(a, V.UserObjVar):
        for name in ("__bool__", "__len__"):  # what Python asks, in its order
            got = python_dunder(a, name, [])
            if got is None:
                continue
            if got is NotImplemented:
                raise Unsupported(f"truth value of {a.describe()}", current().loc)
            if not isinstance(got, V.ConstVar) or not isinstance(got.value, int):
                raise Unsupported(f"truth value of {a.describe()}: {name} gave {got.describe()}",
                                  current().loc)
            return bool(got.value)
        return True
    return True


def contains(container: V.Var, item: V.Var) -> bool:
    if isinstance(container, V.DictVar):
        return item.python() in container.items
    if isinstance(container, V.SetVar):
        return container.key(item) in container.items
    if isinstance(container, V.ListVar):
        for x in container.items:
            if isinstance(x, V.TensorVar) or isinstance(item, V.TensorVar):
                if is_same(x, item):
                    return True
            elif is_same(x, item) or truth(compare("==", x, item)):  # identity first, as Python
                return True
        return False
    if isinstance(container, V.ModuleVar):
        guard_children(container)
        return item.python() in container.value
    if isinstance(container, V.TensorVar):
        raise Unsupported("`in` on a tensor is data-dependent", current().loc)
    return item.python() in container.python()


def mutate(var: V.Var) -> None:
    """Note that a container from outside the frame changed (replayed after the graph)."""
    ctx = current()
    if var.source is not None and id(var) not in ctx.mutated:
        ctx.mutated[id(var)] = var
        ctx.side_effects.append(("contents", var, ctx.loc))


def getitem(obj: V.Var, key: V.Var) -> V.Var:
    ctx = current()
    if isinstance(obj, V.TracedArrayVar):
        return _numpy(obj).getitem(obj, key)
    if isinstance(obj, V.TensorVar):
        return from_py(ctx.call_torch(operator.getitem, [obj.fake, to_py(key)], {}, "indexing"))
    if isinstance(obj, V.ListVar):
        k = key.python()
        if isinstance(k, slice):
            return V.ListVar(obj.items[k], tuple if obj.is_tuple else list)
        try:
            return obj.items[k]
        except (IndexError, TypeError) as e:
            raise UserException(e, ctx.loc) from e
    if isinstance(obj, V.DictVar) and obj.kind is not dict and \
            isinstance(python_override(obj.kind, "__getitem__", dict), types.FunctionType):
        return _dunder(obj, "__getitem__", [key])
    if isinstance(obj, V.DictVar):
        k = key.python()
        if k not in obj.items:
            from torchfuse.capture.builtins import STDLIB_CORE
            from torchfuse.capture.stdlib import is_defaultdict, missing_item

            if is_defaultdict(obj):
                return missing_item(STDLIB_CORE, obj, k)
            if obj.kind is not dict and isinstance(python_override(obj.kind, "__missing__", dict),
                                                   types.FunctionType):
                return _dunder(obj, "__missing__", [key])  # Counter's 0, as dict.__getitem__ calls it
            raise UserException(KeyError(k), ctx.loc)
        return obj.items[k]
    if isinstance(obj, V.ModuleVar):
        return module_getitem(obj, key.python())
    if isinstance(obj, V.ConstVar | V.ObjVar):
        return fold(operator.getitem, obj, key)
    if isinstance(obj, V.UserObjVar):
        return _dunder(obj, "__getitem__", [key])
    raise Unsupported(f"subscript of {obj.describe()}", ctx.loc)


def python_dunder(obj: V.UserObjVar, name: str, args: list[V.Var]) -> V.Var | None:
    """Call the special method ``name`` of the object's class, interpreted, when the class
    defines it in Python; ``None`` when it does not (``NotImplemented``: a C one, or none)."""
    raw = inspect.getattr_static(type(obj.value), name, None)
    if not isinstance(raw, types.FunctionType):
        return None if raw is None else NotImplemented
    from torchfuse.capture.calls import call

    return call(V.BoundMethodVar(V.ObjVar(raw), obj), args, {})


def _dunder(obj: V.Var, name: str, args: list[V.Var]) -> V.Var:
    """A special method of a user class, called as Python does (looked up on the type)."""
    from torchfuse.capture.attrs import getattr_var
    from torchfuse.capture.calls import call

    ctx = current()
    if inspect.getattr_static(obj.python_type(), name, None) is None:
        raise UserException(TypeError(f"{obj.python_type().__name__!r} object does not support "
                                      f"{name}"), ctx.loc)
    return call(getattr_var(obj, name), args, {})


def guard_children(obj: V.ModuleVar) -> None:
    """A container module's children, as capture unrolled them (their names, in order),
    guarded with the module guards: ``len``, ``in``, iteration and indexing read them."""
    if obj.source is not None:
        current().guards.keys(ModuleAttrSource(obj.source, "_modules"), tuple(obj.value._modules))


def module_getitem(obj: V.ModuleVar, k: Any) -> V.Var:
    ctx = current()
    mod = obj.value
    sub = mod[k]
    if not isinstance(k, str):
        guard_children(obj)
    if isinstance(k, int) and obj.source is not None:
        keys = list(mod._modules)
        return ctx.wrap(sub, ModuleStateSource(obj.source, "_modules", keys[k]))
    if isinstance(k, str) and obj.source is not None:
        return ctx.wrap(sub, ModuleStateSource(obj.source, "_modules", k))
    if isinstance(k, slice) and obj.source is not None:
        # a new container of the same children: name the children first, so their
        # parameters stay parameters (wrap() finds each child by identity)
        for i in range(*k.indices(len(mod))):
            module_getitem(obj, i)
    return ctx.wrap(sub, None)


def _basic_key(key: Any) -> bool:
    """Whether ``t[key]`` is a view (ints, slices of ints, ``None``, ``...``; no tensors, lists
    or bools), so that ``t[key] = number`` is ``t[key].fill_(number)``."""
    parts = key if type(key) is tuple else (key,)
    for k in parts:
        if type(k) is slice:
            if not all(type(v) in (int, type(None)) for v in (k.start, k.stop, k.step)):
                return False
        elif type(k) is not int and k is not None and k is not Ellipsis:
            return False
    return True


def _fill_view(t: Any, key: Any, value: Any) -> None:
    t[key].fill_(value)


def setitem(obj: V.Var, key: V.Var, value: V.Var) -> None:
    ctx = current()
    if isinstance(obj, V.TensorVar):
        k, v = to_py(key), to_py(value)
        if type(v) in (int, float, bool) and _basic_key(k):
            # what eager's indexing does, without the CPU scalar tensor it makes on the way
            # (in a GPU graph that tensor would keep the write out of the fused kernels)
            ctx.call_torch(_fill_view, [obj.fake, k, v], {}, "index assignment")
        else:
            ctx.call_torch(operator.setitem, [obj.fake, k, v], {}, "index assignment")
        return
    if isinstance(obj, V.ListVar) and not obj.is_tuple:
        k = key.python()
        mutate(obj)
        if isinstance(k, slice):
            obj.items[k] = iterate(value)
        else:
            obj.items[k] = value
        return
    if isinstance(obj, V.DictVar) and obj.kind is not dict and \
            isinstance(python_override(obj.kind, "__setitem__", dict), types.FunctionType):
        _dunder(obj, "__setitem__", [key, value])
        return
    if isinstance(obj, V.DictVar):
        mutate(obj)
        obj.items[key.python()] = value
        return
    raise Unsupported(f"item assignment on {obj.describe()}", ctx.loc)


def delitem(obj: V.Var, key: V.Var) -> None:
    if isinstance(obj, V.DictVar) and obj.kind is not dict and \
            isinstance(python_override(obj.kind, "__delitem__", dict), types.FunctionType):
        _dunder(obj, "__delitem__", [key])
        return
    if isinstance(obj, V.ListVar | V.DictVar) and not (isinstance(obj, V.ListVar) and obj.is_tuple):
        mutate(obj)
        del obj.items[key.python()]
        return
    raise Unsupported(f"del on {obj.describe()}", current().loc)


def pull(var: V.Var) -> Iterator[V.Var]:
    """The items of ``var`` one at a time, as Python's ``iter(var)`` hands them out: an
    iterator Var advances only as far as it is pulled (``zip`` over ``itertools.count``)."""
    if isinstance(var, V.IteratorVar):
        return iter(var.next, None)
    return iter(iterate(var))  # a container's items are read now, as iter() reads them


def is_endless(var: V.Var) -> bool:
    return isinstance(var, V.IteratorVar) and not var.bounded


def iterate(var: V.Var) -> list[V.Var]:
    """The items a ``for`` loop over ``var`` sees, fixed now (loops are unrolled)."""
    ctx = current()
    if isinstance(var, V.ListVar):
        return list(var.items)
    if isinstance(var, V.IteratorVar):
        return var.rest()
    if isinstance(var, V.DictVar):
        return [V.ConstVar(k) for k in var.items]
    if isinstance(var, V.SetVar):
        return list(var.items.values())
    if isinstance(var, V.TensorVar):
        if var.fake.dim() == 0:
            raise Unsupported("iteration over a 0-d tensor", ctx.loc)
        return [getitem(var, V.ConstVar(i)) for i in range(var.fake.shape[0])]
    if isinstance(var, V.ModuleVar):
        mod = var.value
        guard_children(var)
        if isinstance(mod, torch.nn.ModuleDict):
            return [V.ConstVar(k) for k in mod]
        if hasattr(type(mod), "__iter__"):
            return [module_getitem(var, i) for i in range(len(mod))]
        raise Unsupported(f"iteration over {var.describe()}", ctx.loc)
    if isinstance(var, V.ConstVar):
        return [V.ConstVar(v) for v in var.python()]
    if isinstance(var, V.ObjVar) and var.source is not None:
        return [ctx.wrap(v, ItemSource(var.source, i)) for i, v in enumerate(var.value)]
    if isinstance(var, V.UserObjVar):
        # ``__iter__`` written in Python (``collections.abc.Sequence``'s own, over the class's
        # ``__len__``/``__getitem__``, included): run it interpreted, a generator to its end
        result = python_dunder(var, "__iter__", [])
        if result is not None and result is not NotImplemented and result is not var:
            return iterate(result)
    raise Unsupported(f"iteration over {var.describe()}", ctx.loc)
