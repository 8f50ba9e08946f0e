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
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.dynamic import concrete

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class FloatExprVar(V.FloatArgVar):
    """A float computed in the graph from float arguments, int symbols and Python random
    draws (``roots``). ``carrier``, its 0-d float64 graph value, is recorded when a tensor op
    first uses it (a float that Python only reads leaves no node). Its value is computed when
    read, from the roots' values, which guards them (or, for a draw, breaks at the draw:
    `torchfuse.capture.pyrandom`)."""

    py_float = True

    def __init__(self, compute: Any, record: Any, roots: list[V.Var]) -> None:
        V.Var.__init__(self)
        self.compute = compute
        self.record = record
        self._carrier: Any = None
        self.roots = roots
        self.source = None

    @property
    def carrier(self) -> Any:  # type: ignore[override]
        if self._carrier is None:
            self._carrier = self.record()
        return self._carrier

    @carrier.setter
    def carrier(self, value: Any) -> None:
        self._carrier = value

    @property
    def value(self) -> Any:  # type: ignore[override]
        return self.compute()

    @value.setter
    def value(self, _: Any) -> None:
        pass

    def python(self) -> Any:
        for r in self.roots:
            r.python() if isinstance(r, V.FloatArgVar) else concrete(r.value)
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
    return FloatExprVar(lambda: fn(_hint(a), _hint(b)), record,
                        [r for v in roots for r in getattr(v, "roots", [v])])


def neg(a: V.Var) -> V.Var | None:
    if _kind(a) != "float":
        return None
    from torchfuse.capture.context import current

    ctx = current()
    return FloatExprVar(lambda: -a.value, lambda: ctx.call_torch(operator.neg, [a.carrier], {}, "operator -"),
                        list(getattr(a, "roots", [a])))


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
    return FloatExprVar(lambda: float(_hint(v)), lambda: as_carrier(v), [v])


__all__ = ["FloatExprVar", "binary", "neg", "to_float"]
