"""The Triton rendering of the loop IR's scalar vocabulary: one table, `RENDER`, from
each [`VOp`][torchfuse.inductor.ir.VOp] to the text that computes it.

Every kernel that computes loop-IR values renders them here: the pointwise and reduction
kernels ([`torchfuse.inductor.codegen`][torchfuse.inductor.codegen]) and the epilogues of matmul templates
(`torchfuse.inductor.templates.matmul`), so an op has one formula and one NaN
behaviour wherever it runs. A rule takes the operands' texts and the result dtype and
returns an expression::

    RENDER[VOp.MAX](["tmp3", "0.0"], "float32")
        -> "tl.maximum(tmp3, 0.0, propagate_nan=tl.PropagateNan.ALL)"

Expressions may call the ``@triton.jit`` helpers of `HELPERS` by name (``_tanh(x)``);
`helpers_in` finds the ones a text uses, and `helper_source` writes them.

A second target (C++ for the CPU) is a module of the same shape: its own ``RENDER`` over the
same keys, its own helpers and dtype names; the test that ``set(RENDER) == set(VOp)`` is
written once for every target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from torchfuse.inductor import ir
from torchfuse.inductor.ir import VOp
from torchfuse.inductor.render import Render
from torchfuse.inductor.render import arith as _arith
from torchfuse.inductor.render import call as _call
from torchfuse.inductor.render import infix as _infix

"""Operand texts and the result dtype -> the expression."""

TL_DTYPE: Mapping[str, str] = {
    "float32": "tl.float32",
    "float64": "tl.float64",
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "int64": "tl.int64",
    "int32": "tl.int32",
    "int16": "tl.int16",
    "int8": "tl.int8",
    "uint8": "tl.uint8",
    "bool": "tl.int1",
}

NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"
"""``tl.maximum``/``tl.minimum`` as eager's: a NaN operand gives NaN (``max.NaN.f32`` on
NVIDIA GPUs, one instruction like the plain ``max``)."""

HELPERS: Mapping[str, str] = {
    "_prod_combine": "def _prod_combine(a, b):\n    return a * b\n",
    # eager max/min propagate NaN; tl.max/tl.min do not
    "_max_nan": f"def _max_nan(a, b):\n    return tl.maximum(a, b, {NAN_ALL})\n",
    "_min_nan": f"def _min_nan(a, b):\n    return tl.minimum(a, b, {NAN_ALL})\n",
    # eager argmax/argmin take the first NaN as the extreme value; ties go to the lower index
    "_argmax_nan": (
        "def _argmax_nan(a, ai, b, bi):\n"
        "    take = (a > b) | ((a != a) & (b == b)) | (((a == b) | ((a != a) & (b != b))) & (ai < bi))\n"
        "    return tl.where(take, a, b), tl.where(take, ai, bi)\n"
    ),
    "_argmin_nan": (
        "def _argmin_nan(a, ai, b, bi):\n"
        "    take = (a < b) | ((a != a) & (b == b)) | (((a == b) | ((a != a) & (b != b))) & (ai < bi))\n"
        "    return tl.where(take, a, b), tl.where(take, ai, bi)\n"
    ),
    # tl has no tanh on every backend. Absolute error about 1e-7, but no relative accuracy for
    # |x| < 1e-3 (the exp cancels: 4e-8 gives -1.2e-7). A series there (the templates' old
    # form) made gelu(tanh) at bf16, which is ALU-bound on an H200, 15-23% slower.
    "_tanh": "def _tanh(x):\n    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)\n",
    "_log1p": (
        "def _log1p(x):\n    u = 1.0 + x\n    d = u - 1.0\n"
        "    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))\n"
    ),
    "_expm1": (
        "def _expm1(x):\n    u = tl.exp(x)\n    d = u - 1.0\n    lu = tl.log(u)\n"
        "    r = d * (x / tl.where(lu == 0.0, 1.0, lu))\n"
        "    return tl.where(u == 1.0, x, tl.where(d == -1.0, -1.0, r))\n"
    ),
    "_pow": (
        "def _pow(a, b):\n    b = a * 0.0 + b\n    r = tl.exp2(b * tl.log2(tl.abs(a)))\n"
        "    odd = (b - 2.0 * tl.floor(b * 0.5)) == 1.0\n"
        "    r = tl.where((a < 0.0) & odd, -r, r)\n"
        "    r = tl.where((a < 0.0) & (tl.floor(b) != b), float('nan'), r)\n"
        "    return tl.where(b == 0.0, 1.0, r)\n"
    ),
    "_round": (
        "def _round(x):\n    r = tl.floor(x + 0.5)\n"
        "    tie = (r - x) == 0.5\n    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0\n"
        "    return tl.where(tie & odd, r - 1.0, r)\n"
    ),
    "_trunc": "def _trunc(x):\n    return tl.where(x >= 0.0, tl.floor(x), tl.ceil(x))\n",
}
"""``@triton.jit`` helpers by name (the source without the decorator)."""


def floating(dtype: str) -> bool:
    return dtype in ir.FLOAT_DTYPES


def _minmax(fn: str) -> Render:
    # NaN propagates, as in eager (relu, clamp, maximum, hardtanh all lower to these)
    return lambda a, dt: f"{fn}({a[0]}, {a[1]}, {NAN_ALL})" if floating(dt) else f"{fn}({a[0]}, {a[1]})"


def _floordiv(a: Sequence[str], dt: str) -> str:
    if floating(dt):
        return f"tl.floor({a[0]} / {a[1]})"
    return (f"tl.where((({a[0]} % {a[1]}) != 0) & (({a[0]} < 0) != ({a[1]} < 0)), "
            f"{a[0]} // {a[1]} - 1, {a[0]} // {a[1]})")


def _rem(a: Sequence[str], dt: str) -> str:
    if floating(dt):
        return f"({a[0]} - {a[1]} * tl.floor({a[0]} / {a[1]}))"
    return (f"tl.where((({a[0]} % {a[1]}) != 0) & ((({a[0]} % {a[1]}) < 0) != ({a[1]} < 0)), "
            f"{a[0]} % {a[1]} + {a[1]}, {a[0]} % {a[1]})")


def _sign(a: Sequence[str], dt: str) -> str:
    t = TL_DTYPE[dt]
    return f"((0 < {a[0]}).to({t}) - ({a[0]} < 0).to({t}))"


RENDER: Mapping[VOp, Render] = {
    VOp.ADD: _arith("+", "|"),
    VOp.SUB: _infix("-"),
    VOp.MUL: _arith("*", "&"),
    VOp.TRUEDIV: _infix("/"),
    VOp.FLOORDIV: _floordiv,
    VOp.REM: _rem,
    VOp.POW: _call("_pow"),
    VOp.MAX: _minmax("tl.maximum"),
    VOp.MIN: _minmax("tl.minimum"),
    VOp.EQ: _infix("=="),
    VOp.NE: _infix("!="),
    VOp.LT: _infix("<"),
    VOp.LE: _infix("<="),
    VOp.GT: _infix(">"),
    VOp.GE: _infix(">="),
    VOp.AND: _infix("&"),
    VOp.OR: _infix("|"),
    VOp.XOR: _infix("^"),
    VOp.NEG: lambda a, dt: f"(-{a[0]})",
    VOp.ABS: _call("tl.abs"),
    VOp.EXP: _call("tl.exp"),
    VOp.EXP2: _call("tl.exp2"),
    VOp.LOG: _call("tl.log"),
    VOp.LOG2: _call("tl.log2"),
    VOp.LOG1P: _call("_log1p"),
    VOp.EXPM1: _call("_expm1"),
    VOp.SQRT: _call("tl.sqrt"),
    VOp.RSQRT: _call("tl.rsqrt"),
    VOp.SIN: _call("tl.sin"),
    VOp.COS: _call("tl.cos"),
    VOp.TAN: lambda a, dt: f"(tl.sin({a[0]}) / tl.cos({a[0]}))",
    VOp.TANH: _call("_tanh"),
    VOp.SIGMOID: _call("tl.sigmoid"),
    VOp.ERF: _call("tl.erf"),
    VOp.RECIPROCAL: lambda a, dt: f"(1.0 / {a[0]})",
    VOp.FLOOR: _call("tl.floor"),
    VOp.CEIL: _call("tl.ceil"),
    VOp.ROUND: _call("_round"),
    VOp.TRUNC: _call("_trunc"),
    VOp.SIGN: _sign,
    VOp.NOT: lambda a, dt: f"({a[0]} == 0)",
    VOp.ISNAN: lambda a, dt: f"({a[0]} != {a[0]})",
    VOp.ISINF: lambda a, dt: f'(tl.abs({a[0]}) == float("inf"))',
    VOp.BITNOT: lambda a, dt: f"(~{a[0]})",
    VOp.WHERE: _call("tl.where"),
}
"""Each scalar op of the loop IR as a Triton expression over its operands' texts."""


def render(op: VOp, args: Sequence[str], dtype: str) -> str:
    """The Triton expression of ``op`` over ``args`` with result ``dtype``."""
    return RENDER[op](args, dtype)


def cast_text(x: str, dtype: str) -> str:
    """``x`` converted to ``dtype`` (a conversion to ``bool`` is a test against zero)."""
    return f"({x} != 0)" if dtype == "bool" else f"{x}.to({TL_DTYPE[dtype]})"


def const_text(value: float | int | bool, dtype: str) -> str:
    """A Python scalar as a Triton literal of ``dtype`` (non-finite floats spelled out)."""
    if isinstance(value, bool) or dtype == "bool":
        return "True" if value else "False"
    if floating(dtype):
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


_HELPER_CALL = re.compile(r"(?<![\w.])(_[a-z][a-z0-9_]*)\(")


def helpers_in(text: str) -> set[str]:
    """Names of `HELPERS` that ``text`` calls."""
    return {m for m in _HELPER_CALL.findall(text) if m in HELPERS}


def helper_source(names: Iterable[str]) -> list[str]:
    """Source lines of the named helpers, each ``@triton.jit``, in name order."""
    out: list[str] = []
    for h in sorted(names):
        out += ["", "", "@triton.jit", HELPERS[h].rstrip()]
    return out


__all__ = ["HELPERS", "NAN_ALL", "RENDER", "TL_DTYPE", "Render", "cast_text", "const_text", "helper_source",
           "helpers_in", "render"]
