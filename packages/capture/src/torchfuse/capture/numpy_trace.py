"""numpy inside a compiled function, traced as torch ops.

``x.numpy()`` of a tensor captured in the graph (on the CPU, not requiring grad) is a
`TracedArrayVar`: an ndarray whose data is the tensor's fake, sharing its memory as eager's
does. numpy calls over such arrays and Python constants are recorded as the torch ops with
the same meaning, and the result is again a traced array:

* creation: ``np.ones``/``zeros``/``empty``/``full`` (and ``*_like``), ``np.arange``,
  ``np.array``/``asarray``, ``np.meshgrid``, ``np.linspace`` of constants;
* reductions: ``np.sum``/``mean``/``prod``/``max``/``min`` (``amax``/``amin``), as functions
  and methods, with ``axis`` and ``keepdims``;
* elementwise ufuncs (``np.exp``, ``np.sqrt``, ``np.maximum`` …), ``np.clip`` by constants,
  the arithmetic and comparison operators, ``np.where``, ``np.concatenate``/``stack``;
* shape: ``reshape``, ``transpose``/``.T``, ``astype``, ``copy``, ``flatten``/``ravel``,
  indexing by constants; attributes ``shape``, ``ndim``, ``dtype``, ``size``, ``itemsize``.

Result dtypes are numpy's, not torch's: each op first asks numpy what dtype it would give for
0-d arrays of the operands' dtypes (and the Python scalars as they are, which numpy 2 treats
as weak), then casts the operands to it, so ``np.exp`` of an int array is float64 and
``np.ones(3)`` is float64, as in numpy. ``torch.from_numpy(a)`` of a traced array is the
tensor itself; a traced array returned by the function is made an ndarray at the graph's
edge (``.numpy()`` of the graph output). Anything else done to a traced array (a numpy
function not in the table, ``float(a)``, ``if a:``, passing it to Python code that capture
does not see) is a graph break.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.values import from_py, size_of

_DTYPES = {np.dtype(n): getattr(torch, n) for n in (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128")}
_NP_OF = {t: d for d, t in _DTYPES.items()}


def from_tensor(t: V.TensorVar) -> V.Var:
    """``t.numpy()``: a traced array over the tensor's own data."""
    ctx = current()
    if t.fake.requires_grad or t.fake.device.type != "cpu" or t.fake.dtype not in _NP_OF:
        raise Unsupported("data-dependent: Tensor.numpy() of a tensor that requires grad, is not "
                          "on the CPU or has no numpy dtype", ctx.loc)
    return V.TracedArrayVar(t.fake)


def _torch_dtype(dt: Any) -> torch.dtype:
    try:
        return _DTYPES[np.dtype(dt)]
    except (TypeError, KeyError) as e:
        raise Unsupported(f"numpy dtype {dt!r} has no torch equivalent", current().loc) from e


def _dummy(v: V.Var) -> Any:
    """What numpy is asked the result dtype with: a 0-d array of a traced array's dtype, a
    Python number as it is (weak), else `Unsupported`."""
    if isinstance(v, V.TracedArrayVar):
        return np.ones((), v.np_dtype)
    if isinstance(v, V.ConstVar) and type(v.value) in (int, float, bool, complex):
        return v.python()
    if isinstance(v, V.ConstVar) and isinstance(v.value, np.generic):
        return np.ones((), v.value.dtype)
    raise Unsupported(f"numpy call with {v.describe()} (numpy is traced over arrays from "
                      f"tensors and Python numbers only)", current().loc)


def _operand(v: V.Var, dt: torch.dtype | None) -> Any:
    if isinstance(v, V.TracedArrayVar):
        return v.fake if dt is None or v.fake.dtype == dt else _torch(torch.Tensor.to, v.fake, dt)
    if isinstance(v, V.ConstVar) and isinstance(v.value, np.generic):
        return v.python().item()
    return v.python()


def _torch(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return current().call_torch(fn, list(args), kwargs, getattr(fn, "__name__", "numpy op"))


def _out(value: Any, scalar: bool = False) -> V.Var:
    if isinstance(value, torch.Tensor):
        return V.TracedArrayVar(value, scalar and value.dim() == 0)
    if isinstance(value, tuple | list):
        return V.ListVar([_out(v) for v in value], type(value))
    return from_py(value)


def _dtype_of(fn: Any, args: list[V.Var]) -> np.dtype:
    with np.errstate(all="ignore"):
        try:
            return np.asarray(fn(*[_dummy(a) for a in args])).dtype
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsupported(f"numpy: {e}", current().loc) from e


def is_traced(v: V.Var) -> bool:
    return isinstance(v, V.TracedArrayVar)


# ----------------------------------------------------------------------------- operators

_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "//": operator.floordiv, "%": operator.mod, "**": operator.pow}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}


def as_traced(v: V.NdarrayVar) -> V.Var:
    """An ndarray from outside as a traced array over its ``from_numpy`` graph input."""
    return _plain(v)


def _traced(v: V.Var) -> V.Var:
    """An ndarray from outside as a traced array (over its from_numpy input); else ``v``."""
    return _plain(v) if isinstance(v, V.NdarrayVar) else v


def binary(op: str, a: V.Var, b: V.Var) -> V.Var:
    a, b = _traced(a), _traced(b)
    base = op.rstrip("=") if op.endswith("=") and op not in _COMPARE else op
    fn = _ARITH.get(base)
    if fn is None:
        raise Unsupported(f"operator {op} on a traced numpy array", current().loc)
    dt = _torch_dtype(_dtype_of(fn, [a, b]))
    if base != op:  # in place: numpy casts the result into the left array ("same_kind")
        if not isinstance(a, V.TracedArrayVar) or (dt != a.fake.dtype and \
                not torch.can_cast(dt, a.fake.dtype)):
            raise Unsupported(f"operator {op}: numpy cannot cast the result in place", current().loc)
        iop = {"+": torch.Tensor.add_, "-": torch.Tensor.sub_, "*": torch.Tensor.mul_,
               "/": torch.Tensor.div_, "//": torch.Tensor.floor_divide_,
               "%": torch.Tensor.remainder_, "**": torch.Tensor.pow_}.get(base)
        if iop is None:
            raise Unsupported(f"operator {op} in place on a traced numpy array", current().loc)
        _torch(iop, a.fake, _operand(b, None))
        return a
    return _out(_torch(fn, _operand(a, dt), _operand(b, dt)), _scalars(a, b))


def _scalars(*vs: V.Var) -> bool:
    """numpy scalars in, a numpy scalar out (no array among the operands)."""
    return all(v.scalar for v in vs if isinstance(v, V.TracedArrayVar))


def compare(op: str, a: V.Var, b: V.Var) -> V.Var:
    a, b = _traced(a), _traced(b)
    common = _torch_dtype(np.result_type(_dummy(a), _dummy(b)))
    return _out(_torch(_COMPARE[op], _operand(a, common), _operand(b, common)), _scalars(a, b))


def unary(op: str, a: V.Var) -> V.Var:
    a = _traced(a)
    fns = {"-": torch.neg, "+": torch.positive, "~": torch.bitwise_not}
    if op not in fns:
        raise Unsupported(f"operator {op} on a traced numpy array", current().loc)
    return _out(_torch(fns[op], a.fake), a.scalar)


# ----------------------------------------------------------------------------- attributes, methods

def attr(a: V.TracedArrayVar, name: str) -> V.Var:
    if name == "shape":
        return V.ConstVar(tuple(size_of(V.TensorVar(a.fake))))
    if name == "ndim":
        return V.ConstVar(a.fake.dim())
    if name == "dtype":
        return V.ConstVar(a.np_dtype)
    if name == "size":
        n = 1
        for s in size_of(V.TensorVar(a.fake)):
            n *= s
        return V.ConstVar(n)
    if name == "itemsize":
        return V.ConstVar(a.np_dtype.itemsize)
    if name == "T":
        return _out(_torch(torch.permute, a.fake, list(range(a.fake.dim()))[::-1]))
    if name in _METHODS:
        return V.MethodVar(a, name)
    raise Unsupported(f"attribute {name!r} of a traced numpy array", current().loc)


def _reduce(np_fn: Any, a: V.Var, axis: Any = None, keepdims: bool = False,
            dtype: Any = None) -> V.Var:
    if not isinstance(a, V.TracedArrayVar):
        raise Unsupported(f"numpy.{np_fn.__name__} of {a.describe()}", current().loc)
    out = np.dtype(dtype) if dtype is not None else _dtype_of(np_fn, [a])
    t = _operand(a, _torch_dtype(out))
    dims = list(range(a.fake.dim())) if axis is None else \
        list(axis) if isinstance(axis, tuple | list) else [axis]
    name = np_fn.__name__
    full = axis is None and not keepdims  # numpy then returns a scalar
    if name in ("sum", "mean"):
        fn = torch.sum if name == "sum" else torch.mean
        return _out(_torch(fn, t, dims, keepdims), full)
    if name == "prod":
        if len(dims) != 1:
            t = _torch(torch.reshape, t, [-1]) if not keepdims and axis is None else t
            if not keepdims and axis is None:
                return _out(_torch(torch.prod, t), True)
            raise Unsupported("numpy.prod over several axes", current().loc)
        return _out(_torch(torch.prod, t, dims[0], keepdims))
    fn = torch.amax if name in ("max", "amax") else torch.amin
    return _out(_torch(fn, t, dims, keepdims), full)


def _astype(a: V.TracedArrayVar, dtype: Any, copy: bool = True) -> V.Var:
    dt = _torch_dtype(dtype)
    if dt == a.fake.dtype and not copy:
        return a
    return _out(_torch(torch.Tensor.to, a.fake, dt, copy=True))


def _reshape(a: V.TracedArrayVar, *shape: Any) -> V.Var:
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    return _out(_torch(torch.reshape, a.fake, list(shape)))


def _transpose(a: V.TracedArrayVar, *axes: Any) -> V.Var:
    if len(axes) == 1 and isinstance(axes[0], tuple | list):
        axes = tuple(axes[0])
    if not axes or axes == (None,):
        axes = tuple(range(a.fake.dim()))[::-1]
    return _out(_torch(torch.permute, a.fake, list(axes)))


_METHODS = {
    "sum": lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.sum, a, axis, keepdims, dtype),
    "mean": lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.mean, a, axis, keepdims, dtype),
    "prod": lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.prod, a, axis, keepdims, dtype),
    "max": lambda a, axis=None, keepdims=False: _reduce(np.max, a, axis, keepdims),
    "min": lambda a, axis=None, keepdims=False: _reduce(np.min, a, axis, keepdims),
    "astype": _astype,
    "reshape": _reshape,
    "transpose": _transpose,
    "copy": lambda a: _out(_torch(torch.clone, a.fake, memory_format=torch.contiguous_format)),
    "flatten": lambda a: _out(_torch(torch.clone, _torch(torch.reshape, a.fake, [-1]))),
    "ravel": lambda a: _out(_torch(torch.reshape, a.fake, [-1])),
}


def call_method(a: V.TracedArrayVar, name: str, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    fn = _METHODS.get(name)
    if fn is None:
        raise Unsupported(f"method {name!r} of a traced numpy array", current().loc)
    return fn(a, *[_plain(v) for v in args], **{k: _plain(v) for k, v in kwargs.items()})


def _plain(v: V.Var) -> Any:
    """An argument as the table's functions take it: traced arrays stay Vars, constants are
    their values (guarded)."""
    if isinstance(v, V.TracedArrayVar):
        return v
    if isinstance(v, V.ConstVar):
        return v.python()
    if isinstance(v, V.ObjVar) and (isinstance(v.value, np.dtype) or (
            isinstance(v.value, type) and issubclass(v.value, np.generic))):
        return v.value  # a dtype (np.int32, np.dtype("f4")), read off numpy
    if isinstance(v, V.NdarrayVar):  # an array from outside: its from_numpy graph input
        from torchfuse.capture.arrays import to_tensor as input_tensor

        t = input_tensor(torch.from_numpy, [v], {}, None)
        return V.TracedArrayVar(t.fake)
    if isinstance(v, V.ListVar):
        items = [_plain(i) for i in v.items]
        return items if not v.is_tuple else tuple(items)
    raise Unsupported(f"numpy call with {v.describe()}", current().loc)


def getitem(a: V.TracedArrayVar, key: V.Var) -> V.Var:
    k = _plain(key)
    parts = k if isinstance(k, tuple) else (k,)
    if not all(p is None or p is Ellipsis or type(p) in (int, slice) for p in parts):
        raise Unsupported("indexing a traced numpy array by arrays", current().loc)
    return _out(_torch(operator.getitem, a.fake, k))


# ----------------------------------------------------------------------------- numpy functions


def _creation(np_fn: Any, torch_fn: Any) -> Any:
    def make(shape: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> V.Var:
        n_fill = 1 if np_fn is np.full else 0
        if len(args) > n_fill:  # the dtype given by position: np.zeros((2,), "int32")
            args, dtype = args[:n_fill], args[n_fill]
        if kwargs or len(args) > n_fill + 1:
            raise Unsupported(f"numpy.{np_fn.__name__} with {sorted(kwargs)}", current().loc)
        dt = _torch_dtype(np_fn((), *args, dtype=dtype).dtype)
        size = [shape] if not isinstance(shape, tuple | list) else list(shape)
        return _out(_torch(torch_fn, size, *args, dtype=dt))
    return make


def _like(torch_fn: Any, np_fn: Any) -> Any:
    def make(a: Any, *args: Any, dtype: Any = None) -> V.Var:
        if not isinstance(a, V.TracedArrayVar):
            raise Unsupported(f"numpy.{np_fn.__name__} of a non-traced value", current().loc)
        dt = _torch_dtype(dtype if dtype is not None else
                          np_fn(np.ones((), a.np_dtype), *args).dtype)
        return _out(_torch(torch_fn, a.fake, *args, dtype=dt))
    return make


def _arange(*args: Any, dtype: Any = None) -> V.Var:
    dt = _torch_dtype(dtype if dtype is not None else np.result_type(*args))
    return _out(_torch(torch.arange, *args, dtype=dt))


def _array(obj: Any, dtype: Any = None, copy: bool = True) -> V.Var:
    if isinstance(obj, V.TracedArrayVar):
        return _astype(obj, dtype if dtype is not None else obj.np_dtype, copy)
    real = np.array(obj, dtype=dtype)  # constants: numpy's own reading of them
    if real.dtype not in _DTYPES:
        raise Unsupported(f"numpy.array of dtype {real.dtype}", current().loc)
    return _out(_torch(torch.tensor, real.tolist(), dtype=_DTYPES[real.dtype]))


def _linspace(*args: Any, **kwargs: Any) -> V.Var:
    """``np.linspace`` of constants: numpy's own values (its rounding differs from
    ``torch.linspace``'s), made as a constant array."""
    if any(isinstance(a, V.Var) for a in [*args, *kwargs.values()]) or kwargs.get("retstep"):
        raise Unsupported("numpy.linspace of traced values", current().loc)
    return _array(np.linspace(*args, **kwargs))


def _clip(a: Any, a_min: Any = None, a_max: Any = None) -> V.Var:
    """``np.clip(a, lo, hi)`` with constant bounds: ``clamp`` in numpy's result dtype."""
    if not isinstance(a, V.TracedArrayVar) or isinstance(a_min, V.Var) or isinstance(a_max, V.Var):
        raise Unsupported("numpy.clip of a non-traced array or traced bounds", current().loc)
    dt = _torch_dtype(np.clip(np.ones((), a.np_dtype), a_min, a_max).dtype)
    return _out(_torch(torch.clamp, _operand(a, dt), a_min, a_max))


def _meshgrid(*xi: Any, indexing: str = "xy") -> V.Var:
    ts = [x.fake if isinstance(x, V.TracedArrayVar) else None for x in xi]
    if None in ts:
        raise Unsupported("numpy.meshgrid of a non-traced value", current().loc)
    dt = _torch_dtype(np.result_type(*[x.np_dtype for x in xi]))
    grids = _torch(torch.meshgrid, *[_operand(x, dt) for x in xi], indexing=indexing)
    return V.ListVar([_out(_torch(torch.clone, g, memory_format=torch.contiguous_format))
                      for g in grids], tuple)  # numpy returns copies


def _where(cond: Any, a: Any, b: Any) -> V.Var:
    if not isinstance(cond, V.TracedArrayVar):
        raise Unsupported("numpy.where of a non-traced condition", current().loc)
    wrap = [x if isinstance(x, V.TracedArrayVar) else V.ConstVar(x) for x in (a, b)]
    dt = _torch_dtype(np.result_type(*[_dummy(x) for x in wrap]))
    ops = [_operand(x, dt) if isinstance(x, V.TracedArrayVar) else
           _torch(torch.scalar_tensor, x.python(), dtype=dt) for x in wrap]
    return _out(_torch(torch.where, _operand(cond, torch.bool), *ops))


def _join(torch_fn: Any) -> Any:
    def join(arrays: Any, axis: int = 0) -> V.Var:
        if not all(isinstance(x, V.TracedArrayVar) for x in arrays):
            raise Unsupported("numpy.concatenate/stack of non-traced values", current().loc)
        dt = _torch_dtype(np.result_type(*[x.np_dtype for x in arrays]))
        return _out(_torch(torch_fn, [_operand(x, dt) for x in arrays], axis))
    return join


def _ufunc(np_fn: Any, torch_fn: Any) -> Any:
    def apply(*args: Any) -> V.Var:
        vs = [x if isinstance(x, V.TracedArrayVar) else V.ConstVar(x) for x in args]
        if not any(isinstance(x, V.TracedArrayVar) for x in vs):
            raise Unsupported(f"numpy.{np_fn.__name__} of constants only", current().loc)
        dt = _torch_dtype(_dtype_of(np_fn, vs))
        ops = [_operand(x, dt) if isinstance(x, V.TracedArrayVar) else
               _torch(torch.scalar_tensor, x.python(), dtype=dt) for x in vs]
        return _out(_torch(torch_fn, *ops), _scalars(*vs))
    return apply


_UFUNCS = {np.exp: torch.exp, np.log: torch.log, np.sqrt: torch.sqrt, np.sin: torch.sin,
           np.cos: torch.cos, np.tanh: torch.tanh, np.abs: torch.abs, np.negative: torch.neg,
           np.floor: torch.floor, np.ceil: torch.ceil, np.sign: torch.sign, np.square: torch.square,
           np.add: torch.add, np.subtract: torch.sub, np.multiply: torch.mul,
           np.divide: torch.div, np.maximum: torch.maximum, np.minimum: torch.minimum,
           np.power: torch.pow}

FUNCTIONS: dict[Any, Any] = {
    np.ones: _creation(np.ones, torch.ones), np.zeros: _creation(np.zeros, torch.zeros),
    np.empty: _creation(np.zeros, torch.zeros),  # uninitialized in numpy: zeros are one answer
    np.full: _creation(np.full, torch.full),
    np.ones_like: _like(torch.ones_like, np.ones_like),
    np.zeros_like: _like(torch.zeros_like, np.zeros_like),
    np.arange: _arange, np.array: _array,
    np.asarray: lambda obj, dtype=None: _array(obj, dtype, copy=False),
    np.meshgrid: _meshgrid, np.where: _where, np.linspace: _linspace, np.clip: _clip,
    np.concatenate: _join(torch.cat), np.stack: _join(torch.stack),
    np.sum: lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.sum, a, axis, keepdims, dtype),
    np.mean: lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.mean, a, axis, keepdims, dtype),
    np.prod: lambda a, axis=None, dtype=None, keepdims=False: _reduce(np.prod, a, axis, keepdims, dtype),
    np.max: lambda a, axis=None, keepdims=False: _reduce(np.max, a, axis, keepdims),
    np.min: lambda a, axis=None, keepdims=False: _reduce(np.min, a, axis, keepdims),
    np.amax: lambda a, axis=None, keepdims=False: _reduce(np.max, a, axis, keepdims),
    np.amin: lambda a, axis=None, keepdims=False: _reduce(np.min, a, axis, keepdims),
    np.reshape: lambda a, shape: _reshape(a, shape) if isinstance(a, V.TracedArrayVar) else _array(a),
    np.transpose: lambda a, axes=None: _transpose(a, axes),
    **{k: _ufunc(k, v) for k, v in _UFUNCS.items()},
}


def handles(value: Any) -> bool:
    try:
        return value in FUNCTIONS
    except TypeError:
        return False


def call_function(value: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return FUNCTIONS[value](*[_plain(v) for v in args], **{k: _plain(v) for k, v in kwargs.items()})


def to_tensor(fn: Any, a: V.TracedArrayVar, kwargs: dict[str, V.Var]) -> V.Var:
    """``torch.from_numpy(a)`` / ``as_tensor`` / ``asarray`` / ``tensor`` of a traced array:
    the tensor itself (sharing memory), or the copy or cast asked for."""
    kw = {k: _plain(v) for k, v in kwargs.items()}
    if set(kw) - {"dtype"} or (fn is torch.from_numpy and kw):
        raise Unsupported(f"{fn.__name__} of a traced numpy array with {sorted(kw)}", current().loc)
    t = a.fake
    if fn is torch.tensor:
        t = _torch(torch.clone, t)
    if kw.get("dtype") is not None and kw["dtype"] != t.dtype:
        t = _torch(torch.Tensor.to, t, kw["dtype"])
    return from_py(t)


__all__ = ["FUNCTIONS", "attr", "binary", "call_function", "call_method",
           "compare", "from_tensor", "getitem", "handles", "is_traced", "to_tensor", "unary"]
