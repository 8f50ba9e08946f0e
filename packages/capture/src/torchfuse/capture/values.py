"""Converting between Vars and the Python/fake values torch calls take and return.

`size_of` is the one place a tensor size becomes a Python value: an ``int``, or a
``SymInt`` for a symbolic size (see [`torchfuse.capture.dynamic`][torchfuse.capture.dynamic]).
"""

from __future__ import annotations

from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dynamic import SYM_TYPES, plain
from torchfuse.capture.errors import Unsupported


def size_of(var: V.TensorVar) -> torch.Size:
    """The sizes of a tensor as capture-time Python values (the dynamic-shapes seam): ints,
    and ``SymInt`` s for symbolic sizes (Python arithmetic on them builds expressions; a
    branch on them adds a guard; ``int()`` of one specializes)."""
    return torch.Size(plain(s) for s in var.fake.shape)


def to_py(var: V.Var) -> Any:
    """The value a torch call receives for ``var`` (fakes for tensors)."""
    if isinstance(var, V.TensorVar):
        return var.fake
    if isinstance(var, V.ConstVar | V.ObjVar):
        return var.python()
    if isinstance(var, V.ListVar):
        return V.make_sequence(var.kind, [to_py(i) for i in var.items])
    if isinstance(var, V.DictVar):
        return {k: to_py(v) for k, v in var.items.items()}
    if isinstance(var, V.SetVar):
        return var.python()
    if isinstance(var, V.ModuleVar):
        return var.value
    if isinstance(var, V.UserObjVar) and not var.is_new:
        return var.value
    raise Unsupported(f"cannot pass {var.describe()} to a torch function", current().loc)


def from_py(value: Any) -> V.Var:
    """A Var for what a torch call returned (fakes, Python scalars, tuples of those)."""
    ctx = current()
    if isinstance(value, torch.Tensor):
        known = ctx.tensor_vars.get(id(value))
        if known is not None:
            return known
        if not hasattr(value, "fake_device"):
            return ctx.wrap_tensor(value, None)
        var = V.TensorVar(value)
        ctx.tensor_vars[id(value)] = var
        ctx._keep.append(value)
        return var
    if isinstance(value, SYM_TYPES):
        return V.ConstVar(plain(value))
    if V.is_constant(value):
        return V.ConstVar(value)
    if isinstance(value, tuple | list):
        return V.ListVar([from_py(v) for v in value], type(value))
    if isinstance(value, dict):
        return V.DictVar({k: from_py(v) for k, v in value.items()})
    if isinstance(value, torch.nn.Module):
        return ctx.wrap(value, None)
    return V.ObjVar(value)


def contains_tensor(var: V.Var) -> bool:
    if isinstance(var, V.TensorVar):
        return True
    if isinstance(var, V.ListVar):
        return any(contains_tensor(i) for i in var.items)
    if isinstance(var, V.DictVar):
        return any(contains_tensor(i) for i in var.items.values())
    return False



HEAPTYPE = V.HEAPTYPE


def python_override(cls: type, name: str, base: type) -> Any:
    """What a subclass of builtin ``base`` defines in Python for ``name`` (in a class above
    the first C-implemented one, such as ``OrderedDict``), or None."""
    for klass in cls.__mro__:
        if klass is base or not klass.__flags__ & HEAPTYPE:
            return None
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None
