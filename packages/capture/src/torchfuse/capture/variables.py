"""Variables: how the symbolic interpreter represents Python values.

Every value on the interpreter's stack or in its locals is a `Var`. A Var knows its
[`Source`][torchfuse.capture.source.Source] when it came from outside the frame (then reading
its value installs a guard), and carries enough to be computed on symbolically:

==================  ===================================================================
``ConstVar``        an immutable Python value (int, float, str, None, tuple of those,
                    ``torch.Size``, dtype, device, slice…): folded at capture time; a
                    size may be a ``SymInt`` (arithmetic on it builds an expression)
``TensorVar``       a [`FakeTensor`][torchfuse.graph.tracing.FakeTensor] bound to a graph value
``ListVar``         list / tuple / namedtuple / structseq of Vars
``DictVar``         dict with constant keys; ``SetVar`` a set (tensors by identity)
``ObjVar``          an opaque object the interpreter only looks into (functions, classes,
                    Python modules, torch functions)
``ModuleVar``       an ``nn.Module``; ``UserObjVar`` an instance of a user class
``FunctionVar``     a function made by ``MAKE_FUNCTION`` inside the captured code
``BoundMethodVar``, ``PartialVar``, ``CellVar``, ``IteratorVar``, ``SuperVar``,
``ContextVar`` (grad mode / autocast), ``NullVar`` (the NULL the call protocol pushes)
==================  ===================================================================
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
from torchfuse.capture.dynamic import python_type as size_python_type
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.source import Source

CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                  type(NotImplemented), torch.dtype, torch.device, torch.layout,
                  torch.memory_format, slice, range, frozenset, types.CodeType,
                  # sizes: symbolic ones are expressions over the inputs' sizes
                  torch.SymInt, torch.SymFloat, torch.SymBool)


def is_constant(value: Any) -> bool:
    """Immutable values that capture folds (tuples count when all items do)."""
    if isinstance(value, CONSTANT_TYPES):
        return not isinstance(value, slice) or all(
            is_constant(v) for v in (value.start, value.stop, value.step))
    if type(value) in (tuple, torch.Size):
        return all(is_constant(v) for v in value)
    return False


class Var:
    """Base of all interpreter values."""

    source: Source | None = None

    def python(self) -> Any:
        """The concrete Python value; guards the source. Unsupported when not a constant."""
        raise Unsupported(f"{self.describe()} has no value known at capture time")

    def python_type(self) -> type:
        raise Unsupported(f"type of {self.describe()} is unknown")

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class NullVar(Var):
    """The NULL the 3.11/3.12 call protocol pushes below a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVar()


class UnboundVar(Var):
    """What ``LOAD_FAST_AND_CLEAR`` pushes for a local that had no value."""


UNBOUND = UnboundVar()


class ConstVar(Var):
    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def python(self) -> Any:
        if self.source is not None:
            from torchfuse.capture.context import current

            current().guards.constant(self.source, self.value)
        return self.value

    def python_type(self) -> type:
        return size_python_type(self.value)

    def describe(self) -> str:
        return f"constant {self.value!r}"


class FloatArgVar(ConstVar):
    """A ``float`` argument captured as a graph input (automatic dynamic for floats): a 0-d
    float64 ``carrier`` input made from the argument on each call. Arithmetic and comparisons
    with tensors use the carrier (`torchfuse.capture.operators.binary`); any other use reads
    the value, which guards it as a constant (``python()``), i.e. specializes."""

    def __init__(self, value: float, source: Any, carrier: Any) -> None:
        super().__init__(value, source)
        self.carrier = carrier

    def describe(self) -> str:
        return f"float argument {self.value!r} (a graph input)"


class TensorVar(Var):
    """A fake tensor recorded in the graph. ``py_type`` is the class the user sees."""

    def __init__(self, fake: torch.Tensor, source: Source | None = None,
                 py_type: type = torch.Tensor) -> None:
        self.fake = fake
        self.source = source
        self.py_type = py_type

    def python_type(self) -> type:
        return self.py_type

    def describe(self) -> str:
        return f"tensor {tuple(self.fake.shape)} {str(self.fake.dtype).removeprefix('torch.')}"


class ListVar(Var):
    """A list, tuple, namedtuple or structseq. ``kind`` is the Python class."""

    def __init__(self, items: list[Var], kind: type = list, source: Source | None = None) -> None:
        self.items = list(items)
        self.kind = kind
        self.source = source

    @property
    def is_tuple(self) -> bool:
        return issubclass(self.kind, tuple)

    @property
    def fields(self) -> tuple[str, ...] | None:
        return getattr(self.kind, "_fields", None) or getattr(self.kind, "__match_args__", None)

    def python_type(self) -> type:
        return self.kind

    def python(self) -> Any:
        vals = [i.python() for i in self.items]
        return make_sequence(self.kind, vals)

    def describe(self) -> str:
        return f"{self.kind.__name__} of {len(self.items)}"


class DictViewVar(ListVar):
    """``d.keys()``, ``d.values()`` or ``d.items()``: read like a list, but live, as Python's
    views are: an item stored in ``d`` after the view was made is in it."""

    def __init__(self, mapping: DictVar, part: str) -> None:
        self.mapping = mapping
        self.part = part
        self.kind = list
        self.source = None

    @property
    def items(self) -> list[Var]:  # type: ignore[override]
        items = self.mapping.items
        if self.part == "keys":
            return [ConstVar(k) for k in items]
        if self.part == "values":
            return list(items.values())
        return [ListVar([ConstVar(k), v], tuple) for k, v in items.items()]

    @items.setter
    def items(self, value: list[Var]) -> None:
        raise TypeError(f"dict_{self.part} does not support assignment")


class DequeVar(ListVar):
    """A ``collections.deque`` made in the function: a list of Vars plus its ``maxlen``
    (methods in `torchfuse.capture.stdlib`)."""

    def __init__(self, items: list[Var], maxlen: int | None) -> None:
        import collections

        keep = items[max(0, len(items) - maxlen):] if maxlen is not None else items
        super().__init__(keep, collections.deque)
        self.maxlen = maxlen


class TracedArrayVar(Var):
    """An ndarray computed in the graph (``x.numpy()``, ``np.ones(3)``): ``fake`` holds its
    data; numpy calls on it are traced as torch ops (`torchfuse.capture.numpy_trace`)."""

    def __init__(self, fake: torch.Tensor, scalar: bool = False) -> None:
        self.fake = fake
        self.source = None
        self.scalar = scalar
        """A numpy scalar (``np.float32``), as numpy's full reductions return, not a 0-d array."""

    @property
    def np_dtype(self) -> Any:
        import numpy as np

        return np.dtype(str(self.fake.dtype).removeprefix("torch."))

    def python_type(self) -> type:
        import numpy as np

        return np.ndarray

    def describe(self) -> str:
        return f"ndarray {tuple(self.fake.shape)} {self.np_dtype} (traced)"


class NdarrayVar(Var):
    """A numpy array read from outside the frame, guarded on its type only: its metadata
    (``shape``, ``dtype`` …) is read through its source (guarded when used), and
    ``torch.from_numpy`` of it is a graph input; any other use is a graph break
    (`torchfuse.capture.arrays`)."""

    def __init__(self, value: Any, source: Source) -> None:
        self.value = value
        self.source = source
        self.tensor: TensorVar | None = None
        """The graph input ``torch.from_numpy`` of it made (one, however often it is called)."""

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"ndarray {self.value.shape} {self.value.dtype}"


HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class statement made it, not C code


def is_tuple_subclass(kind: Any) -> bool:
    """A tuple subclass written in Python (``class Pair(tuple)``, a namedtuple)."""
    return isinstance(kind, type) and issubclass(kind, tuple) and kind is not tuple and \
        bool(kind.__flags__ & HEAPTYPE)


def make_sequence(kind: type, vals: list[Any]) -> Any:
    """The object a sequence Var stands for. A Python tuple subclass is made as
    ``tuple.__new__`` made it inside its ``__new__``, without running that again."""
    if kind is list or kind is tuple:
        return kind(vals)
    if hasattr(kind, "_make"):
        return kind._make(vals)
    if is_tuple_subclass(kind):
        return tuple.__new__(kind, vals)
    return kind(vals)


class DictVar(Var):
    """A dict whose keys are constants (or objects hashed by identity)."""

    def __init__(self, items: dict[Any, Var], source: Source | None = None, kind: type = dict,
                 attrs: dict[str, Var] | None = None) -> None:
        self.items = dict(items)
        self.source = source
        self.kind = kind
        self.attrs = attrs
        """Instance attributes of a dict subclass built during capture (dataclass fields)."""

    def python_type(self) -> type:
        return self.kind

    def python(self) -> Any:
        return {k: v.python() for k, v in self.items.items()}


class SetVar(Var):
    """A set of Vars, keyed by value (constants, modules) or identity (tensors)."""

    def __init__(self, items: list[Var], source: Source | None = None) -> None:
        self.items: dict[Any, Var] = {}
        self.source = source
        for v in items:
            self.add(v)

    @staticmethod
    def key(v: Var) -> Any:
        if isinstance(v, TensorVar):
            return ("<tensor>", id(v.fake))
        return v.python()

    def add(self, v: Var) -> None:
        self.items.setdefault(self.key(v), v)

    def python_type(self) -> type:
        return set

    def python(self) -> Any:
        return {v.python() for v in self.items.values()}


class ObjVar(Var):
    """An object capture only looks into: functions, classes, Python modules, torch APIs."""

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def python(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        name = getattr(self.value, "__qualname__", None) or type(self.value).__name__
        return f"{type(self.value).__name__} {name}"


class ModuleVar(Var):
    """An ``nn.Module``. ``overrides`` hold attributes written during capture. ``is_new``:
    being built by its ``__init__`` inside the frame, whose writes nothing outside sees."""

    def __init__(self, module: torch.nn.Module, source: Source | None, is_new: bool = False) -> None:
        self.value = module
        self.source = source
        self.is_new = is_new
        self.overrides: dict[str, Var] = {}

    def python(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"module {type(self.value).__name__}"


class UserObjVar(Var):
    """An instance of a user class. ``is_new``: created during capture (no source)."""

    def __init__(self, value: Any, source: Source | None, is_new: bool = False) -> None:
        self.value = value
        self.source = source
        self.is_new = is_new
        self.overrides: dict[str, Var] = {}

    def python(self) -> Any:
        if self.is_new:
            raise Unsupported(f"object of {type(self.value).__name__} created during capture "
                              "used as a Python value")
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"{type(self.value).__name__} object"


class CellVar(Var):
    """A closure cell; ``contents`` is a Var or `UNBOUND`."""

    def __init__(self, contents: Var = UNBOUND, source: Source | None = None) -> None:
        self.contents = contents
        self.source = source


class FunctionVar(Var):
    """A function made by ``MAKE_FUNCTION`` while capturing (a lambda, a nested def)."""

    def __init__(self, code: types.CodeType, f_globals: dict[str, Any], defaults: tuple[Var, ...],
                 kwdefaults: dict[str, Var], closure: tuple[CellVar, ...],
                 globals_source_root: bool) -> None:
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.globals_source_root = globals_source_root
        self.attrs: DictVar | None = None
        """The function's ``__dict__``, made when first read or written (``functools.wraps``
        sets ``__wrapped__``, ``__name__`` … on the wrapper)."""

    def attr_dict(self) -> DictVar:
        if self.attrs is None:
            self.attrs = DictVar({})
        return self.attrs

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {self.code.co_name}"


class BoundMethodVar(Var):
    def __init__(self, func: Var, self_var: Var) -> None:
        self.func = func
        self.self_var = self_var

    def python_type(self) -> type:
        return types.MethodType


class MethodVar(Var):
    """``obj.name`` where ``obj`` is a tensor or container and ``name`` a method of its type."""

    def __init__(self, obj: Var, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"


class PartialVar(Var):
    def __init__(self, func: Var, args: list[Var], kwargs: dict[str, Var]) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs

    def python_type(self) -> type:
        import functools

        return functools.partial


class CachedFunctionVar(Var):
    """``functools.lru_cache(maxsize, typed)(func)`` (and ``functools.cache``) made in the
    frame. Its cache starts empty on every call of the compiled function, so capture keeps
    it exactly: ``cache`` maps a call's key (constants by value, other Vars by identity) to
    the Var it returned, least recently used first; ``hits``/``misses`` are
    ``cache_info()``'s counts. ``attrs`` is its ``__dict__`` (``update_wrapper`` fills it)."""

    def __init__(self, func: Var, maxsize: int | None, typed: bool) -> None:
        import collections

        self.func = func
        self.maxsize = maxsize
        self.typed = typed
        self.cache: collections.OrderedDict[Any, Var] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0
        self.attrs = DictVar({})

    def python_type(self) -> type:
        import functools

        return functools._lru_cache_wrapper

    def describe(self) -> str:
        return "an lru_cache wrapper made in the function"


class IteratorVar(Var):
    """An iterator over Vars. Most are a list fixed when the iterator was made (loops over them
    are unrolled); a *lazy* one (``gen``: a Python generator of Vars) makes its items only as
    they are asked for, as ``itertools.count``/``cycle`` and ``zip`` over them do. A lazy
    iterator that may never end (``bounded=False``) refuses to be drained whole (`rest`).

    ``zip(itertools.count(2), [x, y])``, pulled row by row, is the Vars ``(2, x), (3, y)``:
    the third ``next`` of ``count`` happens (as in Python) before zip sees the list end."""

    def __init__(self, items: list[Var], gen: Iterator[Var] | None = None, bounded: bool = True) -> None:
        self.items = items
        self.pos = 0
        self.gen = gen
        self.bounded = bounded

    def next(self) -> Var | None:
        if self.pos >= len(self.items):
            if self.gen is None:
                return None
            v = next(self.gen, None)
            if v is None:
                self.gen = None
                return None
            self.items.append(v)
        self.pos += 1
        return self.items[self.pos - 1]

    def rest(self) -> list[Var]:
        if self.gen is not None:
            if not self.bounded:
                from torchfuse.capture.context import current

                raise Unsupported("an infinite iterator consumed to its end", current().loc)
            self.items.extend(self.gen)
            self.gen = None
        out = self.items[self.pos:]
        self.pos = len(self.items)
        return out

    def drained(self) -> list[Var] | None:
        """The items still to come, or None for an endless one: without moving it."""
        if self.gen is not None:
            if not self.bounded:
                return None
            self.items.extend(self.gen)
            self.gen = None
        return self.items[self.pos:]


class SuperVar(Var):
    def __init__(self, cls: type, self_var: Var) -> None:
        self.cls = cls
        self.self_var = self_var


TRACE_RANGE = "trace_range"
"""The `ContextVar` kind of profiler and tracing ranges (``torch.profiler.record_function``,
``torch.cuda.nvtx.range``): transparent to capture, as they are to ``torch.compile``. They
mark time in a profile and change no value, so a compiled graph drops them (the profile then
shows the graph's kernels, not the range); entering and leaving one records nothing."""


class ContextVar(Var):
    """A grad-mode or autocast context manager (``torch.no_grad()`` …), or a profiler range
    (`TRACE_RANGE`)."""

    def __init__(self, kind: str, args: tuple[Any, ...] = ()) -> None:
        self.kind = kind
        self.args = args
        self.saved: Any = None

    def describe(self) -> str:
        return f"context {self.kind}{self.args}"


class DecoratedVar(Var):
    """A function decorated by a context manager made in the frame (``@torch.no_grad()`` on
    a nested ``def``): calling it enters ``context``, calls ``func`` and exits again."""

    def __init__(self, context: ContextVar, func: Var) -> None:
        self.context = context
        self.func = func

    def describe(self) -> str:
        return f"{self.func.describe()} decorated by {self.context.describe()}"


class UserExitVar(Var):
    """The ``__exit__`` that ``BEFORE_WITH`` pushes for a context manager whose methods are
    interpreted (a user class): called like the bound method it wraps; at a graph break it is
    rebuilt as a ``with`` exit, which an exception raised by the break reaches."""

    def __init__(self, exit: Var) -> None:
        self.exit = exit

    def describe(self) -> str:
        return f"__exit__ {self.exit.describe()}"


class ExitVar(Var):
    """The ``__exit__`` that ``BEFORE_WITH`` pushes."""

    def __init__(self, ctx: ContextVar) -> None:
        self.ctx = ctx
