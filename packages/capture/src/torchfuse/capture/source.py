"""Sources: where a value the interpreter reads lives in the caller's world.

A source is a small frozen record that prints as a Python expression over three names that
the generated guard and input-gathering functions receive:

* ``L`` — the tuple of the compiled function's arguments, in ``co_varnames`` order;
* ``G`` — the function's globals dict;
* ``C`` — the function's ``__closure__`` tuple.

Guards, graph inputs (parameters, buffers), side effects and rebuilt outputs are all
written in terms of sources, so the same expression both explains a guard to a reader and
runs as the check.
"""

from __future__ import annotations

from dataclasses import dataclass


class Source:
    """Base of all sources."""

    __slots__ = ()

    def expr(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.expr()

    @property
    def is_module_state(self) -> bool:
        """True when the value hangs off an ``nn.Module`` (checked through the module version)."""
        return False


@dataclass(frozen=True, slots=True)
class LocalSource(Source):
    """An argument of the compiled function."""

    index: int
    name: str

    def expr(self) -> str:
        return f"L[{self.index}]"


@dataclass(frozen=True, slots=True)
class FreshModuleSource(LocalSource):
    """An ``nn.Module`` argument that is a new object on every call (a module made in the
    function, handed to the resume function after its constructor's break): guarded on its
    type, not its identity. What hangs off it is no module state: the module version never
    moves for a module nobody watched, so its guards and parameters are read on every call."""


def under_fresh_module(source: Source) -> bool:
    """Whether ``source`` is a `FreshModuleSource` or hangs off one."""
    while not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
        if source is None:
            return False
    return isinstance(source, FreshModuleSource)


@dataclass(frozen=True, slots=True)
class GlobalSource(Source):
    name: str

    def expr(self) -> str:
        return f"G[{self.name!r}]"


@dataclass(frozen=True, slots=True)
class ClosureSource(Source):
    """The contents of the compiled function's ``index``-th closure cell."""

    index: int
    name: str

    def expr(self) -> str:
        return f"C[{self.index}].cell_contents"


@dataclass(frozen=True, slots=True)
class AttrSource(Source):
    """An attribute of a plain object. Not module state: a model's config can change
    without any module attribute being set, so its guards run on every call."""

    base: Source
    name: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.name}"


@dataclass(frozen=True, slots=True)
class ModuleStateSource(Source):
    """A parameter, buffer or submodule read straight from a module's dicts (fast, no
    ``__getattr__``); ``table`` is ``_parameters``, ``_buffers`` or ``_modules``."""

    base: Source
    table: str
    key: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.table}[{self.key!r}]"

    @property
    def is_module_state(self) -> bool:
        return not under_fresh_module(self.base)


@dataclass(frozen=True, slots=True)
class ModuleAttrSource(AttrSource):
    """A plain attribute of a module (``self.training``, ``self.eps``)."""

    @property
    def is_module_state(self) -> bool:
        return not under_fresh_module(self.base)


@dataclass(frozen=True, slots=True)
class ItemSource(Source):
    base: Source
    key: object

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key!r}]"

    @property
    def is_module_state(self) -> bool:
        return self.base.is_module_state


def module_root(source: Source) -> Source:
    """The first non-module-state source a module-state source hangs from."""
    while source.is_module_state:
        source = source.base  # type: ignore[attr-defined]
    return source


def qualified_name(source: Source) -> str:
    """``layers.0.weight`` for a chain of module-state sources."""
    parts: list[str] = []
    while isinstance(source, ModuleStateSource | ModuleAttrSource):
        parts.append(source.key if isinstance(source, ModuleStateSource) else source.name)
        source = source.base
    return ".".join(reversed(parts))


@dataclass(frozen=True, slots=True)
class DictItemSource(ItemSource):
    """An item of a dict subclass read with ``dict``'s own lookup, never the subclass's
    ``__getitem__`` (guards must not run the user's Python)."""

    def expr(self) -> str:
        return f"dict.__getitem__({self.base.expr()}, {self.key!r})"


@dataclass(frozen=True, slots=True)
class DictValueSource(ItemSource):
    """The ``key``-th value of a dict whose key has no literal form (a class): read by
    position, which the guard on the dict's keys makes stable."""

    def expr(self) -> str:
        return f"tuple(dict.values({self.base.expr()}))[{self.key!r}]"


@dataclass(frozen=True, slots=True)
class ClassAttrSource(Source):
    """An attribute of an object's class (``type(obj).name``). Checked on every call even
    when ``obj`` is a module: assigning to a class does not move the module version."""

    base: Source
    name: str

    def expr(self) -> str:
        return f"type({self.base.expr()}).{self.name}"


@dataclass(frozen=True, slots=True)
class MethodCallSource(Source):
    """What a method of a number returns (``L[1].is_integer()``): guarded without guarding
    the number itself."""

    base: Source
    name: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.name}()"


@dataclass(frozen=True, slots=True)
class ModuleGlobalSource(Source):
    """A global of another Python module (a helper function's globals)."""

    module: str
    name: str

    def expr(self) -> str:
        return f"sys.modules[{self.module!r}].__dict__[{self.name!r}]"


@dataclass(frozen=True, slots=True)
class FromNumpySource(Source):
    """The tensor ``torch.from_numpy`` makes of an ndarray argument, read anew on each call
    (it shares the array's memory: what the graph writes to it, the array sees)."""

    base: Source

    def expr(self) -> str:
        return f"sys.modules['torch'].from_numpy({self.base.expr()})"



@dataclass(frozen=True, slots=True)
class ScalarCarrierSource(Source):
    """The graph input that carries an int argument made a symbol (``n`` → ``s0``): an empty
    tensor of shape ``(0, n)``, made anew on each call. The format binds symbols from input
    sizes (``input:<k>.size(1)``), so the int travels as a size; no element is ever read."""

    base: Source
    device: str | None = None  # the frame's accelerator, when its tensors are on one

    def expr(self) -> str:
        on = f", device={self.device!r}" if self.device else ""
        return f"sys.modules['torch'].empty(0, {self.base.expr()}{on})"


@dataclass(frozen=True, slots=True)
class FloatCarrierSource(Source):
    """The graph input that carries a float argument: a 0-d float64 tensor of its value,
    made anew on each call, on the frame's accelerator when its tensors are on one (a kernel
    there reads it; a CPU tensor cannot be read by a GPU kernel)."""

    base: Source
    device: str | None = None

    def expr(self) -> str:
        on = f", device={self.device!r}" if self.device else ""
        return f"sys.modules['torch'].full((), {self.base.expr()}, dtype=sys.modules['torch'].float64{on})"


@dataclass(frozen=True, slots=True)
class PythonExprSource(Source):
    """A Python expression over other sources, evaluated by a guard (the domain check of a
    ``math`` call kept in the graph: `torchfuse.capture.floats.math_call`)."""

    text: str

    def expr(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class IntCarrierSource(FloatCarrierSource):
    """The graph input that carries a Python int drawn on each call (``random.randint``):
    a 0-d int64 tensor of its value (`torchfuse.capture.pyrandom`)."""

    def expr(self) -> str:
        on = f", device={self.device!r}" if self.device else ""
        return f"sys.modules['torch'].full((), {self.base.expr()}, dtype=sys.modules['torch'].int64{on})"
