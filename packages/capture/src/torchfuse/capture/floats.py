"""Python arithmetic on numbers that vary between calls, kept in the graph.

A float argument that changed is a 0-d ``float64`` graph input (`FloatArgVar`, see
"Number arguments" in the capture guide); an int that changed is a size symbol. Python
arithmetic on them — ``f * 2``, ``1 - f``, ``-f``, ``f * n``, ``n / 2``, ``float(n)`` — is
recorded on the carrier as float64 ops on 0-d tensors, whose results are correctly rounded
exactly as Python's floats are, and gives a `FloatExprVar`::

    def g(x, f):
        return x * (f * 2) + (1 - f)
    # graph: mul(f_float, 2) -> t; mul(x, t); rsub(f_float, 1) -> u; add(..., u)

so that entry serves every float. The Var keeps the value the arguments of this capture
give: when Python needs it (a branch, a torch function taking a number, ``str``), the
arguments it was computed from are guarded as constants (specialized) and the value is used,
as for a float argument itself.

Only ``+``, ``-``, ``*``, and ``/`` by a nonzero constant are kept (Python raises
``ZeroDivisionError`` where a tensor gives ``inf``; ``//``, ``%`` and ``**`` differ from
torch's float ops at their edges); numpy float32/16 arguments compute in their own precision
and specialize too.

One-argument ``math`` functions of such a float (`MATH`: ``math.sqrt``, ``exp``, ``log``,
``sin``, ``cos`` …) are kept too, as the torch op on the float64 carrier (a 0-d tensor runs
the same C library function Python does)::

    def h(x, f):
        return x * math.sqrt(f + 1)
    # graph: add(f_float, 1) -> t; sqrt(t) -> u; mul(x, u)
    # guard: _math_ok(math.sqrt, (L[1] + 1))

Where Python raises (``math.sqrt(-1)``, ``math.exp(1000)``, ``math.sin(inf)``) a tensor gives
``nan`` or ``inf``; so each such call adds a guard that runs the Python function on the
call's value (the Var's ``text``, an expression over the arguments' sources) and holds while
it does not raise: a value out of the domain recompiles, and that capture raises as eager
does. A float with no such expression (one computed from a random draw) specializes.
``math.floor``/``ceil``/``trunc`` of a float give an `IntExprVar`, an int64 carrier.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.dynamic import concrete

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class _Computed:
    """What `FloatExprVar` and `IntExprVar` share: a value computed from ``roots`` (read
    through them, which guards them), and ``carrier``, its 0-d graph value, recorded by
    ``record`` when a tensor op first uses it."""

    def _init(self, compute: Any, record: Any, roots: list[V.Var]) -> None:
        V.Var.__init__(self)  # type: ignore[arg-type]
        self.compute = compute
        self.record = record
        self._carrier: Any = None
        self.roots = roots
        self.source = None

    @property
    def carrier(self) -> Any:
        if self._carrier is None:
            self._carrier = self.record()
        return self._carrier

    @carrier.setter
    def carrier(self, value: Any) -> None:
        self._carrier = value

    def _guard_roots(self) -> None:
        for r in self.roots:
            r.python() if isinstance(r, V.FloatArgVar) else concrete(r.value)


class FloatExprVar(_Computed, V.FloatArgVar):
    """A float computed in the graph from float arguments, int symbols and Python random
    draws (``roots``). ``carrier``, its 0-d float64 graph value, is recorded when a tensor op
    first uses it (a float that Python only reads leaves no node). Its value is computed when
    read, from the roots' values, which guards them (or, for a draw, breaks at the draw:
    `torchfuse.capture.pyrandom`)."""

    py_float = True

    def __init__(self, compute: Any, record: Any, roots: list[V.Var], text: str | None = None) -> None:
        self._init(compute, record, roots)
        self.text = text
        """Python computing the value from the call's arguments (for guards), or None."""

    @property
    def value(self) -> Any:  # type: ignore[override]
        return self.compute()

    @value.setter
    def value(self, _: Any) -> None:
        pass

    def python(self) -> Any:
        self._guard_roots()
        return self.value

    def python_type(self) -> type:
        return float

    def describe(self) -> str:
        return "a float computed from varying numbers (in the graph)"


def _kind(v: V.Var) -> str | None:
    """``"float"``: a float input (Python or numpy float64 value); ``"sym"``: an int symbol;
    ``"const"``: a plain int or float constant; else ``None``."""
    if getattr(type(v), "py_float", False):  # a computed float, a random draw
        return "float"
    if isinstance(v, V.FloatArgVar):
        return "float" if isinstance(v.value, float) else None
    if type(v) is not V.ConstVar:
        return None
    if isinstance(v.value, torch.SymInt):
        return "sym"
    if type(v.value) in (int, float):
        return "const"
    return None


def _hint(v: V.Var) -> Any:
    if isinstance(v, V.FloatArgVar):
        return v.value
    value = v.value
    if isinstance(value, torch.SymInt):
        return int(value.node.hint)
    return value


def _operand(v: V.Var) -> Any:
    return v.carrier if isinstance(v, V.FloatArgVar) else v.value


def binary(op: str, a: V.Var, b: V.Var) -> V.Var | None:
    """``a <op> b`` kept in the graph, or ``None`` (then Python folds it, specializing)."""
    base = op.rstrip("=")
    fn = _OPS.get(base)
    kinds = (_kind(a), _kind(b))
    if fn is None or None in kinds or ("float" not in kinds and not (base == "/" and "sym" in kinds)):
        return None
    if base == "/" and (kinds[1] != "const" or b.value == 0):
        return None  # a divisor that varies could be 0: Python raises, a tensor gives inf
    from torchfuse.capture.context import current

    ctx = current()
    # int / int is a float: then start from a float64 tensor
    start = kinds[0] == "sym" or (kinds[0] == "const" and kinds[1] == "sym")

    def record() -> Any:
        left = as_carrier(a) if start else _operand(a)
        return ctx.call_torch(fn, [left, _operand(b)], {}, f"operator {base}")

    roots = [v for v, k in zip((a, b), kinds, strict=True) if k != "const"]
    ta, tb = _text(a), _text(b)
    return FloatExprVar(lambda: fn(_hint(a), _hint(b)), record,
                        [r for v in roots for r in getattr(v, "roots", [v])],
                        f"({ta} {base} {tb})" if ta is not None and tb is not None else None)


def neg(a: V.Var) -> V.Var | None:
    if _kind(a) != "float":
        return None
    from torchfuse.capture.context import current

    ctx = current()
    ta = _text(a)
    return FloatExprVar(lambda: -a.value, lambda: ctx.call_torch(operator.neg, [a.carrier], {}, "operator -"),
                        list(getattr(a, "roots", [a])), f"(-{ta})" if ta is not None else None)


def as_carrier(v: V.Var) -> Any:
    """A 0-d float64 graph value of an int symbol or constant."""
    from torchfuse.capture.context import current

    return current().call_torch(torch.scalar_tensor, [v.value], {"dtype": torch.float64}, "float()")


def to_float(v: V.Var) -> V.Var | None:
    """``float(n)`` of an int symbol, or of a float input (itself)."""
    kind = _kind(v)
    if kind == "float":
        return v
    if kind != "sym":
        return None
    ta = _text(v)
    return FloatExprVar(lambda: float(_hint(v)), lambda: as_carrier(v), [v], f"float({ta})" if ta else None)


def _text(v: V.Var) -> str | None:
    """Python that computes ``v``'s value on a call, over the sources of the arguments
    (``(L[1] + 1)``), or None where there is none (a random draw, an int symbol of a size)."""
    kind = _kind(v)
    if kind == "const":
        return repr(v.value)
    if isinstance(v, FloatExprVar):
        return v.text
    if kind == "float":
        return v.source.expr() if v.source is not None else None
    if kind == "sym":
        from torchfuse.capture.context import current

        name = str(v.value.node.expr)
        found = [src for src, sym in current().scalar_symbols.items() if sym == name]
        return found[0] if found else None
    return None


MATH = {math.sqrt: torch.sqrt, math.exp: torch.exp, math.log: torch.log, math.log2: torch.log2,
        math.log10: torch.log10, math.log1p: torch.log1p, math.expm1: torch.expm1, math.sin: torch.sin,
        math.cos: torch.cos, math.tan: torch.tan, math.tanh: torch.tanh, math.atan: torch.atan,
        math.fabs: torch.abs}
"""``math`` functions kept in the graph, with the torch op that computes them on a carrier."""


INT_MATH = {math.floor: torch.floor, math.ceil: torch.ceil, math.trunc: torch.trunc}
"""``math`` functions of a float that give an int, kept as an int64 carrier (`IntExprVar`)."""


def _math_ok(fn: Any, value: Any) -> bool:
    """The guard of a kept ``math`` call: Python's function does not raise on this value (and
    an int result fits the int64 carrier)."""
    try:
        got = fn(value)
    except (ValueError, OverflowError, TypeError):
        return False
    return type(got) is not int or -2 ** 63 <= got < 2 ** 63


class IntExprVar(_Computed, V.ConstVar):
    """An int computed in the graph from a varying float (``math.floor(f)``): ``carrier`` is a
    0-d int64 graph value, which tensor operators use as they use an int draw's
    (`torchfuse.capture.operators`). Any read of ``value`` is Python needing the int: it
    guards the roots (specializes) and gives it."""

    int_carrier = True

    def __init__(self, compute: Any, record: Any, roots: list[V.Var]) -> None:
        self._init(compute, record, roots)

    @property
    def value(self) -> Any:  # type: ignore[override]
        return self.python()

    @value.setter
    def value(self, _: Any) -> None:
        pass

    def python(self) -> Any:
        self._guard_roots()
        return self.compute()

    def python_type(self) -> type:
        return int

    def describe(self) -> str:
        return "an int computed from a varying float (in the graph)"


def math_call(fn: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """``math.sqrt(f)`` of a float input or int symbol kept in the graph, guarded on the
    domain (see the module docstring); ``None`` when it is not that (then Python folds it)."""
    op = MATH.get(fn) or INT_MATH.get(fn)
    if op is None or len(args) != 1 or kwargs:
        return None
    v = args[0]
    kind = _kind(v)
    if fn in INT_MATH and kind != "float":
        return None  # of an int it is the int itself: folded
    text = _text(v) if kind in ("float", "sym") else None
    if text is None:
        return None
    from torchfuse.capture.context import current
    from torchfuse.capture.source import PythonExprSource

    ctx = current()
    hint = _hint(v) if kind == "sym" else v.value
    if not _math_ok(fn, hint):
        return None  # Python raises on this call's value: folding raises it as eager does
    guards = ctx.guards
    call_text = f"{guards._obj(fn, 'F')}({text})"
    guards.constant(PythonExprSource(f"{guards._obj(_math_ok, 'F')}({guards._obj(fn, 'F')}, {text})"), True)

    def record() -> Any:
        carrier = as_carrier(v) if kind == "sym" else v.carrier
        out = ctx.call_torch(op, [carrier], {}, f"math.{fn.__name__}")
        return ctx.call_torch(torch.Tensor.to, [out, torch.int64], {}) if fn in INT_MATH else out

    if fn in INT_MATH:
        return IntExprVar(lambda: fn(v.value), record, list(getattr(v, "roots", [v])))
    return FloatExprVar(lambda: fn(_hint(v) if kind == "sym" else v.value), record,
                        list(getattr(v, "roots", [v])), call_text)


__all__ = ["INT_MATH", "MATH", "FloatExprVar", "IntExprVar", "binary", "math_call", "neg", "to_float"]
