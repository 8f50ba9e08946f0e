"""numpy arrays at the graph's edge.

An ``ndarray`` argument (or global, or attribute) is an `NdarrayVar`, guarded on its type
only, so a new array on every call reuses the compiled entry:

* ``a.shape``, ``a.ndim``, ``a.dtype``, ``a.size``, ``len(a)`` are read through the array's
  source and guarded where the code uses them;
* ``torch.from_numpy(a)`` is a graph input, ``torch.from_numpy(L[1])`` read on each call
  (`FromNumpySource`): it shares the array's memory, as eager's does; ``torch.as_tensor(a)``
  and ``torch.asarray(a)`` are the same input (cast when a ``dtype`` or ``device`` is given),
  ``torch.tensor(a)`` a copy of it.

Other attributes and methods, numpy functions and operators over it are traced as torch ops
over that graph input (`torchfuse.capture.numpy_trace`); what the tracer does not know is a
graph break that hands the real array to Python.
"""

from __future__ import annotations

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.source import AttrSource, FromNumpySource

METADATA = ("shape", "ndim", "dtype", "size", "itemsize", "nbytes")
TO_TENSOR = {torch.from_numpy: "share", torch.as_tensor: "share", torch.asarray: "share",
              torch.tensor: "copy"}


def array_attr(obj: V.NdarrayVar, name: str) -> V.Var:
    if name not in METADATA:
        raise Unsupported(f"attribute {name!r} of a numpy array", current().loc)
    return current().wrap(getattr(obj.value, name), AttrSource(obj.source, name))


def array_len(obj: V.NdarrayVar) -> V.Var:
    if obj.value.ndim == 0:
        raise Unsupported("len() of a 0-d numpy array", current().loc)
    shape = array_attr(obj, "shape")
    return V.ConstVar(shape.python()[0])


def converts(fn: object, args: list[V.Var]) -> bool:
    """``fn(args…)`` makes a tensor of an ndarray argument."""
    try:
        return fn in TO_TENSOR and bool(args) and isinstance(args[0], V.NdarrayVar)
    except TypeError:
        return False


def to_tensor(fn: object, args: list[V.Var], kwargs: dict[str, V.Var], cast: object) -> V.Var:
    """The tensor input for the array, then the copy or cast the call asks for; ``cast`` is
    the interpreter's ``Tensor.to`` (handed in: this module does not import the core)."""
    ctx = current()
    arr = args[0]
    assert isinstance(arr, V.NdarrayVar)
    extra = set(kwargs) - {"dtype", "device"}
    if len(args) > 1 or extra or (fn is torch.from_numpy and kwargs):
        raise Unsupported(f"{getattr(fn, '__name__', fn)} of a numpy array with {sorted(extra)}", ctx.loc)
    tensor = arr.tensor
    if tensor is None:
        try:
            real = torch.from_numpy(arr.value)
        except (TypeError, ValueError) as e:  # an object array, negative strides …
            raise Unsupported(f"torch.from_numpy: {e}", ctx.loc) from e
        # guarded on the array, in printable terms (a guard never calls from_numpy): the
        # tensor input then has the same dtype, shape and strides on every call
        ctx.guards.constant(AttrSource(AttrSource(arr.source, "dtype"), "str"), arr.value.dtype.str)
        for attr in ("shape", "strides"):
            ctx.guards.constant(AttrSource(arr.source, attr), getattr(arr.value, attr))
        tensor = arr.tensor = ctx.wrap_tensor(real, FromNumpySource(arr.source), guarded=False)
    if TO_TENSOR[fn] == "copy":
        kwargs = {**kwargs, "copy": V.ConstVar(True)}
    return cast(tensor, kwargs) if kwargs else tensor


__all__ = ["METADATA", "TO_TENSOR", "array_attr", "array_len", "converts", "to_tensor"]
