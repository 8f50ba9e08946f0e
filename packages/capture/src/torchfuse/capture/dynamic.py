"""Dynamic shapes in capture: which input sizes become symbols, and what sizes are at capture time.

The symbolic core (`torchfuse.graph.symbolic`) owns symbols, ranges and guards. This
module is capture's side of it:

* `DynamicPolicy` answers "which dims of this input tensor are symbolic?" from the
  ``compile(dynamic=...)`` setting, the dims automatic dynamic has seen change, and the
  tensor's own `mark_dynamic` requests;
* `size_changes` finds, after a guard miss, the input sizes that differ from what a
  compiled entry was specialized to (automatic dynamic makes those dims symbolic next time);
* `concrete` / `plain` turn size values (``SymInt`` …) into Python numbers where
  a plain value is needed (specializing) or already known (a constant expression);
* `read_expr` writes a size expression as Python over the frame's inputs, so a size
  the function returns or leaves live at a graph break is computed from the call's own
  arguments and never baked in as a constant.

Example: ``compile(f)`` (automatic dynamic) called with ``x`` of shape ``(4, 16)`` then
``(5, 16)``: the first entry is specialized to ``(4, 16)``; its ``TensorGuard`` fails on
``L[0]`` dim 0, which is remembered, and the recompile captures ``x`` as ``(s0, 16)`` with
``s0 >= 2``; every later batch size reuses that entry.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Set
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.symbolic import node_of

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


# ----------------------------------------------------------------------------- mark_dynamic


def mark_dynamic(tensor: torch.Tensor, dim: int, min: int | None = None, max: int | None = None) -> None:
    """Make dimension ``dim`` of ``tensor`` symbolic when a compiled function receives it.

    The dimension is symbolic from the first compile, with the range ``[min, max]`` (``min``
    is at least 2: sizes 0 and 1 are always specialized). A call whose size falls outside
    the range fails the guard and recompiles, with the dimension specialized if it is still
    outside. If the traced code needs the size as a plain number (``int(x.shape[0])``,
    ``range(x.shape[0])``), capture raises
    [`DynamicShapeError`][torchfuse.capture.errors.DynamicShapeError] naming that line.

    The request lives on the tensor (``tensor._torchfuse_dynamic``), like a tensor
    attribute: it travels with the object and dies with it.

    Args:
        tensor: The input tensor to mark, before the call that compiles.
        dim: The dimension (negative counts from the end).
        min: The smallest size the compiled entry serves (at least 2).
        max: The largest size the compiled entry serves (``None``: no bound).

    Raises:
        IndexError: ``dim`` is out of range for the tensor.
        ValueError: ``min`` is larger than ``max``.

    Examples:
        >>> import torch
        >>> from torchfuse.capture import compile, mark_dynamic
        >>> f = compile(lambda x: x * 2, backend="eager")
        >>> x = torch.randn(8, 4)
        >>> mark_dynamic(x, 0)
        >>> f(x).shape, f(torch.randn(16, 4)).shape     # one entry serves both sizes
        (torch.Size([8, 4]), torch.Size([16, 4]))
        >>> len(f.entries)
        1
    """
    if not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(f"mark_dynamic: dim {dim} out of range for a {tensor.dim()}-d tensor")
    if min is not None and max is not None and min > max:
        raise ValueError(f"mark_dynamic: min {min} is larger than max {max}")
    requests = getattr(tensor, "_torchfuse_dynamic", None)
    if requests is None:
        requests = {}
        tensor._torchfuse_dynamic = requests
    requests[dim % tensor.dim()] = (min, max)


def dynamic_requests(tensor: torch.Tensor) -> dict[int, tuple[int | None, int | None]]:
    """The ``mark_dynamic`` requests recorded for ``tensor`` (dim -> (min, max))."""
    return dict(getattr(tensor, "_torchfuse_dynamic", None) or {})


# ----------------------------------------------------------------------------- policy


@dataclasses.dataclass(frozen=True, slots=True)
class DimRequest:
    """How one dim of an input should be symbolic."""

    min: int | None = None
    max: int | None = None
    strict: bool = False
    """From ``mark_dynamic``: specializing it is an error, not a guard."""


@dataclasses.dataclass(slots=True)
class DynamicPolicy:
    """Which sizes of a frame's input tensors become symbols.

    ``mode`` is ``compile(dynamic=...)``: ``None`` (automatic: only the dims in ``auto``),
    ``True`` (every dim), ``False`` (none). ``mark_dynamic`` requests apply in every mode.
    ``auto`` maps a source expression (``L[0]``) to the dims seen changing; it is owned by
    the compiled function and grows as guards fail.
    """

    mode: bool | None = False
    auto: Mapping[str, set[int]] = dataclasses.field(default_factory=dict)
    scalars: Set[str] = frozenset()
    """Automatic dynamic for Python ints: the arguments (``L[1]``) seen changing value."""
    modules: Set[str] = frozenset()
    """Module arguments seen to be a new module of the same class on a later call (a module
    made in the function, passed to a resume function): guarded on their type
    (`torchfuse.capture.source.FreshModuleSource`)."""

    def fresh_module(self, source_expr: str) -> bool:
        return self.mode is not False and source_expr in self.modules

    def scalar(self, source_expr: str, value: Any) -> bool:
        """Whether the int or float argument ``value`` read through ``source_expr`` becomes a
        symbol (an int) or a graph input (a float): in automatic mode once it changed, with
        ``dynamic=True`` always, never with ``dynamic=False``; ints only from 2 (a symbol's
        range, as for sizes)."""
        if self.mode is False or not (is_float_scalar(value) or (type(value) is int and value >= 2)):
            return False
        return self.mode is True or source_expr in self.scalars

    def dims(self, source_expr: str, t: torch.Tensor) -> dict[int, DimRequest]:
        """The dims of ``t`` (read through ``source_expr``) that should be symbolic."""
        out: dict[int, DimRequest] = {}
        if self.mode is True:
            out = {d: DimRequest() for d in range(t.dim())}
        elif self.mode is None:
            out = {d: DimRequest() for d in self.auto.get(source_expr, ())}
        for d, (lo, hi) in dynamic_requests(t).items():
            out[d] = DimRequest(lo, hi, strict=True)
        return out


def symbolic_dims(t: torch.Tensor, wanted: Mapping[int, DimRequest]) -> dict[int, DimRequest]:
    """The requested dims that can be symbolic: size 2 or more, inside the requested range,
    on a dense tensor at offset 0 whose strides follow its sizes (sizes 0/1, and layouts the
    strides cannot be written for, stay specialized)."""
    keep = {}
    for d, req in wanted.items():
        n = int(t.shape[d])
        if n < 2 or (req.min is not None and n < req.min) or (req.max is not None and n > req.max):
            continue
        keep[d] = req
    if not keep or t.storage_offset() != 0 or t.layout is not torch.strided:
        return {}
    return keep if _strides_follow_sizes(t) else {}


def _strides_follow_sizes(t: torch.Tensor) -> bool:
    # the layout symbolic_fake gives a tensor: strides are products of the sizes inside them
    shape, stride = list(t.shape), list(t.stride())
    order = sorted(range(len(shape)), key=lambda d: (stride[d], shape[d]))
    expected = 1
    for d in order:
        if stride[d] != expected:
            return False
        expected *= shape[d]
    return True


# ----------------------------------------------------------------------------- size values


def is_symbolic(value: Any) -> bool:
    """A ``SymInt``/``SymFloat``/``SymBool`` whose value is not a known constant."""
    return isinstance(value, SYM_TYPES) and plain(value) is value


def plain(value: Any) -> Any:
    """``value`` as a Python number when it is a constant ``SymInt`` & co., else itself."""
    if not isinstance(value, SYM_TYPES):
        return value
    node = node_of(value)
    if node is None:
        return value
    if node.expr.is_Number:
        return node.pytype(node.hint)
    if node.expr in (True, False):
        return bool(node.expr)
    return value


def contains_symbolic(value: Any) -> bool:
    if isinstance(value, SYM_TYPES):
        return is_symbolic(value)
    if isinstance(value, tuple | list):
        return any(contains_symbolic(v) for v in value)
    if isinstance(value, slice):
        return any(contains_symbolic(v) for v in (value.start, value.stop, value.step))
    return False


def concrete(value: Any) -> Any:
    """``value`` with every size value turned into a plain number: specializes (a guard
    ``s0 == 5``, or [`SpecializationError`][torchfuse.graph.symbolic.SpecializationError] for a symbol
    from ``mark_dynamic``)."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.Size):
        return torch.Size(concrete(v) for v in value)
    if type(value) in (tuple, list):
        return type(value)(concrete(v) for v in value)
    if isinstance(value, slice):
        return slice(concrete(value.start), concrete(value.stop), concrete(value.step))
    return value


def python_type(value: Any) -> type:
    """The type user code sees for a value: ``int`` for a ``SymInt`` and so on."""
    if isinstance(value, torch.SymInt):
        return int
    if isinstance(value, torch.SymFloat):
        return float
    if isinstance(value, torch.SymBool):
        return bool
    return type(value)


_NAME = re.compile(r"[A-Za-z_]\w*")


def read_expr(value: torch.SymInt, reads: Mapping[str, str]) -> str:
    """A Python expression computing ``value`` from the frame's inputs, e.g. ``(L[0].size(0))*2``.

    ``reads`` maps each symbol to the expression that reads it (``s0 -> L[0].size(0)``)."""
    node = node_of(value)
    assert node is not None
    text = node.env.text(node.expr)
    if isinstance(text, int):
        return str(text)

    def sub(m: re.Match) -> str:
        name = m.group(0)
        if name in ("min", "max"):
            return name
        return f"({reads[name]})"

    return _NAME.sub(sub, text)


# ----------------------------------------------------------------------------- resume arguments


def bind_size_arguments(ctx: Any, local_vars: dict[str, Any]) -> None:
    """Sizes a resume function receives as ints (``b, t, c = x.shape`` before a graph break,
    ``x.view(b, t, -1)`` after it) are the symbols of its tensor arguments' sizes, when
    their values match: ``b`` becomes ``s0`` under the guard ``L[2] == s0`` instead of a
    constant guard that would recompile the resume function for every size.

    Works on ints and flat tuples / ``torch.Size`` s of ints (``shape = x.shape``). An int
    equal to a size by chance costs at most a recompile: the guard keeps it exact.
    Symbols from ``mark_dynamic`` are left out (specializing such an int must stay legal)."""
    from torchfuse.capture import variables as V

    if ctx.dynamic.mode is False or not ctx.size_env.symbols:
        return
    by_hint: dict[int, Any] = {}
    for info in ctx.size_env.symbols.values():
        if not info.strict:  # an int equal by chance must not become an error when specialized
            by_hint.setdefault(info.hint, info)

    def sym_for(v: Any) -> Any:
        info = by_hint.get(v) if type(v) is int else None
        return v if info is None else ctx.size_env.size(info.symbol)

    for name, var in local_vars.items():
        if not isinstance(var, V.ConstVar) or var.source is None:
            continue
        value = var.value
        if type(value) is int:
            new = sym_for(value)
        elif type(value) in (tuple, torch.Size) and all(type(v) is int for v in value):
            new = type(value)(sym_for(v) for v in value)
        else:
            continue
        if not contains_symbolic(new):  # (never compare: == on a SymInt adds a guard)
            continue
        text = str(new) if isinstance(new, torch.SymInt) else \
            "(" + "".join(f"{v}, " for v in new) + ")"
        ctx.guards.size_value(var.source, type(value), text)
        local_vars[name] = V.ConstVar(new)


# ----------------------------------------------------------------------------- int arguments


def bind_scalar_arguments(ctx: Any, local_vars: dict[str, Any]) -> None:
    """Int arguments the policy makes symbolic (`DynamicPolicy.scalar`) become size symbols:
    ``g(x, n)`` with ``n = 7`` is captured with ``n`` as ``s0`` (hint 7, range ``[2, inf)``),
    guarded ``type(L[1]) is int and 2 <= (s0 := L[1])``, so one entry serves every such int.
    Arithmetic on it stays symbolic (``x * n`` records ``mul(x, s0)``, ``torch.ones(n)`` a
    symbolic size); a branch on it is a symbol guard (``s0 > 4``); what needs a plain int
    specializes (``s0 == 7``), as sizes do.

    The graph binds symbols from input sizes only, so each such int gets a *carrier* input,
    an empty ``(0, n)`` tensor made from the argument on each call (`ScalarCarrierSource`)."""
    from torchfuse.capture import variables as V
    from torchfuse.capture.context import InputSlot
    from torchfuse.capture.guards import SymbolBinding
    from torchfuse.capture.source import LocalSource, ScalarCarrierSource

    device = _carrier_device(local_vars)
    for name, var in local_vars.items():
        if type(var) is not V.ConstVar or not isinstance(var.source, LocalSource):
            continue
        src = var.source.expr()
        if not ctx.dynamic.scalar(src, var.value):
            continue
        n = var.value
        if is_float_scalar(n):
            _float_input(ctx, name, var, local_vars, device)
            continue
        k = len(ctx.rec.builder.inputs)  # the graph input the carrier is about to become
        sym = ctx.size_env.symbol(n, source=f"input:{k}.size(1)")
        info = ctx.size_env.symbols[sym.node.expr.name]
        carrier = torch.empty(0, n, device=device)
        fake = ctx.rec.input(carrier, name=f"{name}_int", kind="user_input", sizes=[0, sym])
        ctx.inputs.append(InputSlot(ctx.rec.names[id(fake)], "user_input",
                                    ScalarCarrierSource(var.source, device)))
        ctx._keep.append(carrier)
        ctx.guards.scalar_symbol(var.source, SymbolBinding(info.name, info.min, info.max))
        ctx.symbol_reads[info.name] = src
        ctx.scalar_symbols[src] = info.name
        local_vars[name] = V.ConstVar(sym)


def _carrier_device(local_vars: dict[str, Any]) -> str | None:
    """Where the carriers of scalar arguments go: the device of the frame's first tensor
    argument that is not on the CPU (its kernels read a float carrier, and a Program on a GPU
    takes its inputs there), else None (the CPU). A tensor on another device fails its own
    guard, so the choice is fixed for the entry."""
    from torchfuse.capture import variables as V

    for var in local_vars.values():
        if isinstance(var, V.TensorVar):
            dev = getattr(var.fake, "fake_device", var.fake.device)
            if dev.type not in ("cpu", "meta"):
                return str(dev)
    return None


def _float_input(ctx: Any, name: str, var: Any, local_vars: dict[str, Any], device: str | None) -> None:
    """A float argument (a Python or numpy float) as a 0-d float64 graph input, guarded on
    its type only (``type(L[1]) is numpy.float32``): with a tensor, a numpy float computes
    as a Python float does, so the carrier serves both."""
    from torchfuse.capture import variables as V
    from torchfuse.capture.context import InputSlot
    from torchfuse.capture.source import FloatCarrierSource

    carrier = torch.tensor(var.value, dtype=torch.float64, device=device)
    fake = ctx.rec.input(carrier, name=f"{name}_float", kind="user_input")
    ctx.inputs.append(InputSlot(ctx.rec.names[id(fake)], "user_input",
                                FloatCarrierSource(var.source, device)))
    ctx._keep.append(carrier)
    ctx.guards.type_(var.source, type(var.value))
    ctx.scalar_symbols[var.source.expr()] = ctx.rec.names[id(fake)]
    local_vars[name] = V.FloatArgVar(var.value, var.source, fake)


@dataclasses.dataclass(frozen=True, slots=True)
class ScalarChange:
    """An int argument whose value differs from the constant a compiled entry guarded."""

    source: str
    display: str
    old: Any  # an int, a float or a numpy float
    new: Any


def scalar_changes(entries: list[Any], L: Any) -> list[ScalarChange]:
    """The int arguments (``L[k]`` itself, not an item of one) whose constant guard in
    ``entries`` (``GuardEntry`` lists) fails because the call passes another int."""
    from torchfuse.capture.source import LocalSource

    found: dict[str, ScalarChange] = {}
    for guard_entries in entries:
        for e in guard_entries:
            if not isinstance(e.record, S.ConstantGuard) or not isinstance(e.source, LocalSource):
                continue
            old = _number(e.record.value)
            new = L[e.source.index] if e.source.index < len(L) else None
            if old is not None and type(new) is type(old) and new != old:
                found[e.source.expr()] = ScalarChange(e.source.expr(), f"L[{e.source.name!r}]", old, new)
    return list(found.values())


_NUMPY_FLOATS = ("float16", "float32", "float64")


def is_float_scalar(value: Any) -> bool:
    """A Python float, or a numpy float scalar (``np.float32(0.5)``; numpy stays optional)."""
    cls = type(value)
    return cls is float or (cls.__module__ == "numpy" and cls.__name__ in _NUMPY_FLOATS)


def module_changes(checks: list[Any], L: Any) -> list[str]:
    """The module arguments (``L[k]``) whose identity guard in ``checks`` (`CheckFunctions`)
    fails because the call passes another module of the same class."""
    from torchfuse.capture.source import LocalSource

    found: list[str] = []
    for ch in checks:
        for e in ch.entries:
            if not isinstance(e.record, S.IdentityGuard) or type(e.source) is not LocalSource:
                continue
            old = ch.namespace.get(e.condition.rpartition(" is ")[2])
            new = L[e.source.index] if e.source.index < len(L) else None
            if isinstance(old, torch.nn.Module) and type(new) is type(old) and new is not old:
                found.append(e.source.expr())
    return list(dict.fromkeys(found))


def _number(text: str) -> Any:
    """The int or float a constant guard's value text is the repr of (numpy floats as numpy
    2 prints them, ``np.float32(0.5)``), else ``None``."""
    for name in _NUMPY_FLOATS:
        if text.startswith(f"np.{name}(") and text.endswith(")"):
            import numpy as np

            try:
                value = getattr(np, name)(text[len(name) + 4:-1])
            except ValueError:
                return None
            return value if repr(value) == text else None
    for cls in (int, float):
        try:
            value = cls(text)
        except ValueError:
            continue
        return value if repr(value) == text else None
    return None


# ----------------------------------------------------------------------------- automatic dynamic


@dataclasses.dataclass(frozen=True, slots=True)
class SizeChange:
    """An input dim whose size differs from what a compiled entry was specialized to."""

    source: str
    """The source expression (``L[0]``), the key of `DynamicPolicy.auto`."""
    display: str
    """The same source for people (``L['x']``)."""
    dim: int
    old: int
    new: int


def size_changes(entries: list[Any], L: Any, G: Any, C: Any) -> list[SizeChange]:
    """Input sizes that differ from the sizes the guards of ``entries`` (``GuardEntry``
    lists) pinned, per (source, dim), in the order met. Only tensors read from the
    frame's arguments count; parameters and buffers stay static."""
    from torchfuse.capture.context import source_root
    from torchfuse.capture.source import LocalSource

    found: dict[tuple[str, int], SizeChange] = {}
    for guard_entries, namespace in entries:
        for e in guard_entries:
            rec = e.record
            if not isinstance(rec, S.TensorGuard) or e.module_group or e.source is None:
                continue
            root = source_root(e.source)
            if not isinstance(root, LocalSource):
                continue
            try:
                t = eval(rec.source, {**namespace, "L": L, "G": G, "C": C})
            except Exception:
                continue
            if not isinstance(t, torch.Tensor) or t.dim() != len(rec.sizes):
                continue
            display = rec.source.replace(root.expr(), f"L[{root.name!r}]", 1)
            for d, (want, got) in enumerate(zip(rec.sizes, t.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    found[(rec.source, d)] = SizeChange(rec.source, display, d, want, int(got))
    return list(found.values())


def out_of_range(entry: Any, namespace: Mapping[str, Any], L: Any, G: Any, C: Any) -> str:
    """For a failed tensor guard: the symbolic dims whose size left the symbol's range
    (``"; L[0].size(0) = 1 is outside the range of s0 [2, inf]"``), else ``""``."""
    if not entry.symbols:
        return ""
    try:
        t = eval(entry.record.source, {**namespace, "L": L, "G": G, "C": C})
    except Exception:
        return ""
    if not isinstance(t, torch.Tensor) or t.dim() != len(entry.record.sizes):
        return ""
    out = ""
    for d, b in entry.symbols.items():
        n = int(t.shape[d])
        if n < b.min or (b.max is not None and n > b.max):
            hi = "inf" if b.max is None else b.max
            out += f"; {entry.record.source}.size({d}) = {n} is outside the range of {b.name} [{b.min}, {hi}]"
    return out


__all__ = [
    "DimRequest",
    "DynamicPolicy",
    "ScalarChange",
    "SizeChange",
    "bind_scalar_arguments",
    "concrete",
    "dynamic_requests",
    "is_float_scalar",
    "mark_dynamic",
    "module_changes",
    "out_of_range",
    "plain",
    "read_expr",
    "scalar_changes",
    "size_changes",
    "symbolic_dims",
]
