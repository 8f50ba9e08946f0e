"""The C++ rendering of the loop IR's scalar vocabulary: one table, `RENDER`, from each
[`VOp`][torchfuse.inductor.ir.VOp] to the C++ expression that computes it, the CPU twin of
[`torchfuse.inductor.triton_ops`][torchfuse.inductor.triton_ops] (same keys, same NaN
behaviour, the same formulas where eager's are reproducible)::

    RENDER[VOp.MAX](["tmp3", "0.0f"], "float32")  ->  "tf_max(tmp3, 0.0f)"

Every value of a kernel is a typed scalar (`CPP_TYPE`): half types are held as ``float``
(eager computes them in float32 on the CPU too) and converted only on load and store
(`load_text`, `store_text`). Expressions may call the inline helpers of `HELPERS`
(``tf_max(a, b)``); `helpers_in` finds the ones a text uses and `helper_source` writes
them, each under an include guard, so the kernels of one Program can share a translation
unit.
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

CPP_TYPE: Mapping[str, str] = {
    "float32": "float",
    "float64": "double",
    "float16": "float",
    "bfloat16": "float",
    "int64": "int64_t",
    "int32": "int32_t",
    "int16": "int16_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "bool": "bool",
}
"""The C++ type a value of each dtype is computed in."""

STORAGE_TYPE: Mapping[str, str] = {**CPP_TYPE, "float16": "uint16_t", "bfloat16": "uint16_t"}
"""The C++ element type of a buffer of each dtype."""

PRELUDE = """#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#if defined(TORCHFUSE_LIBMVEC) && !defined(TORCHFUSE_VECTOR_MATH)
#define TORCHFUSE_VECTOR_MATH
extern "C" {
#pragma omp declare simd notinbranch
float sinf(float) noexcept;
#pragma omp declare simd notinbranch
float cosf(float) noexcept;
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
float logf(float) noexcept;
#pragma omp declare simd notinbranch
float powf(float, float) noexcept;
}
#endif
"""
"""Headers every kernel source starts with (include-guarded: repeats in one unit are free).
With ``TORCHFUSE_LIBMVEC`` (set by the runtime when the compiler links glibc's vector math
library), the float ``sin``/``cos``/``exp``/``log``/``pow`` are declared SIMD-callable, so an
``omp simd`` loop calls their vector forms (``_ZGVdN8v_sinf``) instead of one scalar call per
element: a chain of 20 sin/cos ran 2.2x slower than eager before."""

HELPERS: Mapping[str, str] = {
    # eager max/min propagate NaN (relu, clamp, hardtanh lower to these)
    "tf_max": "template <class T> static inline T tf_max(T a, T b) "
              "{ return a != a ? a : (b != b ? b : (a > b ? a : b)); }",
    "tf_min": "template <class T> static inline T tf_min(T a, T b) "
              "{ return a != a ? a : (b != b ? b : (a < b ? a : b)); }",
    # expf without a libm call, so that loops over it vectorize (glibc's expf is a scalar call
    # unless -ffast-math): Cephes' polynomial on x - n*ln2, scaled by 2^n in two steps so
    # that results down to the subnormals are right; about 1 ulp, NaN and +-inf as libm.
    "tf_exp": "static inline float tf_exp(float x) {\n"
              "  const float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);\n"
              "  const float n = std::floor(c * 1.44269504088896341f + 0.5f);\n"
              "  const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;\n"
              "  float p = 1.9875691500e-4f;\n"
              "  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;\n"
              "  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;\n"
              "  const float y = p * r * r + r + 1.0f;\n"
              "  const int32_t k = (int32_t)n, k1 = k / 2, k2 = k - k1;\n"
              "  const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;\n"
              "  float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);\n"
              "  return x != x ? x : y * s1 * s2;\n}\n"
              "static inline double tf_exp(double x) { return std::exp(x); }",
    "tf_tanh": "static inline float tf_tanh(float x) {  // the Triton path's formula, vectorizable\n"
               "  const float a = x < 0.0f ? -x : x;\n"
               "  const float a2 = a * a;  // near 0 a series: the exp form cancels there\n"
               "  const float s = a + a * a2 * (-0.333333333f + a2 * (0.133333333f + a2 * -0.0539682540f));\n"
               "  const float t = a < 0.0625f ? s : 1.0f - 2.0f / (tf_exp(2.0f * a) + 1.0f);\n"
               "  return x < 0.0f ? -t : (x != x ? x : t);\n}\n"
               "static inline double tf_tanh(double x) { return std::tanh(x); }",
    "tf_sigmoid": "static inline float tf_sigmoid(float x) { return 1.0f / (1.0f + tf_exp(-x)); }\n"
                  "static inline double tf_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }",
    "tf_bf16_to_f32": "static inline float tf_bf16_to_f32(uint16_t h) "
                      "{ uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f; }",
    # round to nearest even, NaN kept quiet (as c10::BFloat16)
    "tf_f32_to_bf16": "static inline uint16_t tf_f32_to_bf16(float f) {\n"
                      "  uint32_t u; std::memcpy(&u, &f, 4);\n"
                      "  if (f != f) return 0x7fc0;\n"
                      "  u += 0x7fff + ((u >> 16) & 1);\n"
                      "  return (uint16_t)(u >> 16);\n}",
    "tf_round_bf16": "static inline float tf_round_bf16(float f) "
                     "{ return tf_bf16_to_f32(tf_f32_to_bf16(f)); }",
    "tf_f16_to_f32": "static inline float tf_f16_to_f32(uint16_t h) {\n"
                     "  uint32_t sign = (uint32_t)(h & 0x8000) << 16;\n"
                     "  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, u;\n"
                     "  if (e == 0x1f) u = sign | 0x7f800000 | (m << 13);\n"
                     "  else if (e != 0) u = sign | ((e + 112) << 23) | (m << 13);\n"
                     "  else if (m == 0) u = sign;\n"
                     "  else {  // subnormal: m * 2^-24, exact in fp32\n"
                     "    float f = (float)m * 5.9604644775390625e-8f;\n"
                     "    std::memcpy(&u, &f, 4); u |= sign;\n  }\n"
                     "  float f; std::memcpy(&f, &u, 4); return f;\n}",
    # round to nearest even, overflow to inf, subnormals kept (as c10::Half)
    "tf_f32_to_f16": "static inline uint16_t tf_f32_to_f16(float f) {\n"
                     "  uint32_t u; std::memcpy(&u, &f, 4);\n"
                     "  uint16_t sign = (uint16_t)((u >> 16) & 0x8000); uint32_t a = u & 0x7fffffff;\n"
                     "  if (a > 0x7f800000) return sign | 0x7e00;\n"
                     "  if (a >= 0x477ff000) return sign | 0x7c00;\n"
                     "  if (a < 0x38800000) {  // subnormal or zero: round by adding 0.5 (exact in fp32)\n"
                     "    float r = std::fabs(f) + 0.5f; uint32_t v; std::memcpy(&v, &r, 4);\n"
                     "    return sign | (uint16_t)(v - 0x3f000000);\n  }\n"
                     "  uint32_t odd = (a >> 13) & 1; a += 0xc8000fff + odd;\n"
                     "  return sign | (uint16_t)(a >> 13);\n}",
    "tf_round_f16": "static inline float tf_round_f16(float f) { return tf_f16_to_f32(tf_f32_to_f16(f)); }",
}
"""Inline C++ helpers by name."""

_HELPER_DEPS = {"tf_round_bf16": ("tf_bf16_to_f32", "tf_f32_to_bf16"),
                "tf_round_f16": ("tf_f16_to_f32", "tf_f32_to_f16"),
                "tf_sigmoid": ("tf_exp",), "tf_tanh": ("tf_exp",)}


def floating(dtype: str) -> bool:
    return dtype in ir.FLOAT_DTYPES


def _one(dt: str) -> str:
    return "1.0" if dt == "float64" else "1.0f"


def _minmax(helper: str, cmp: str) -> Render:
    def rule(a: Sequence[str], dt: str) -> str:
        t = CPP_TYPE[dt]
        if floating(dt):
            return f"{helper}<{t}>({a[0]}, {a[1]})"
        return f"(({t})({a[0]}) {cmp} ({t})({a[1]}) ? ({t})({a[0]}) : ({t})({a[1]}))"

    return rule


def _floordiv(a: Sequence[str], dt: str) -> str:
    if floating(dt):
        return f"std::floor({a[0]} / {a[1]})"
    return f"(({a[0]} / {a[1]}) - ((({a[0]} % {a[1]}) != 0) & (({a[0]} < 0) != ({a[1]} < 0))))"


def _rem(a: Sequence[str], dt: str) -> str:
    if floating(dt):
        return f"({a[0]} - {a[1]} * std::floor({a[0]} / {a[1]}))"
    r = f"({a[0]} % {a[1]})"
    return f"(({r} != 0 && (({r} < 0) != ({a[1]} < 0))) ? {r} + {a[1]} : {r})"


def _sign(a: Sequence[str], dt: str) -> str:
    return f"(({CPP_TYPE[dt]})(0 < {a[0]}) - ({CPP_TYPE[dt]})({a[0]} < 0))"


def _round(a: Sequence[str], dt: str) -> str:
    # half to even, as eager (the default rounding mode)
    return f"std::nearbyint({a[0]})" if floating(dt) else a[0]


RENDER: Mapping[VOp, Render] = {
    VOp.ADD: _arith("+", "|"),
    VOp.SUB: _infix("-"),
    VOp.MUL: _arith("*", "&"),
    VOp.TRUEDIV: _infix("/"),
    VOp.FLOORDIV: _floordiv,
    VOp.REM: _rem,
    VOp.POW: _call("std::pow"),
    VOp.MAX: _minmax("tf_max", ">"),
    VOp.MIN: _minmax("tf_min", "<"),
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
    VOp.ABS: lambda a, dt: f"std::abs({a[0]})" if dt != "bool" else a[0],
    VOp.EXP: _call("tf_exp"),
    VOp.EXP2: _call("std::exp2"),
    VOp.LOG: _call("std::log"),
    VOp.LOG2: _call("std::log2"),
    VOp.LOG1P: _call("std::log1p"),
    VOp.EXPM1: _call("std::expm1"),
    VOp.SQRT: _call("std::sqrt"),
    VOp.RSQRT: lambda a, dt: f"({_one(dt)} / std::sqrt({a[0]}))",
    VOp.SIN: _call("std::sin"),
    VOp.COS: _call("std::cos"),
    VOp.TAN: _call("std::tan"),
    VOp.TANH: _call("tf_tanh"),
    VOp.SIGMOID: _call("tf_sigmoid"),
    VOp.ERF: _call("std::erf"),
    VOp.RECIPROCAL: lambda a, dt: f"({_one(dt)} / {a[0]})",
    VOp.FLOOR: lambda a, dt: f"std::floor({a[0]})" if floating(dt) else a[0],
    VOp.CEIL: lambda a, dt: f"std::ceil({a[0]})" if floating(dt) else a[0],
    VOp.ROUND: _round,
    VOp.TRUNC: lambda a, dt: f"std::trunc({a[0]})" if floating(dt) else a[0],
    VOp.SIGN: _sign,
    VOp.NOT: lambda a, dt: f"({a[0]} == 0)",
    VOp.ISNAN: lambda a, dt: f"({a[0]} != {a[0]})",
    VOp.ISINF: lambda a, dt: f"({a[0]} == INFINITY || {a[0]} == -INFINITY)",
    # ~ on a bool is ``not`` in eager (C++'s ~true is -2, which is true again)
    VOp.BITNOT: lambda a, dt: f"(!{a[0]})" if dt == "bool" else f"(~{a[0]})",
    VOp.WHERE: lambda a, dt: f"({a[0]} ? ({CPP_TYPE[dt]})({a[1]}) : ({CPP_TYPE[dt]})({a[2]}))",
}
"""Each scalar op of the loop IR as a C++ expression over its operands' texts."""


def render(op: VOp, args: Sequence[str], dtype: str) -> str:
    """The C++ expression of ``op`` over ``args`` with result ``dtype``."""
    return RENDER[op](args, dtype)


def cast_text(x: str, dtype: str) -> str:
    """``x`` converted to ``dtype``: a test against zero for ``bool``, a rounding for half types
    (the value stays a ``float``)."""
    if dtype == "bool":
        return f"({x} != 0)"
    if dtype == "bfloat16":
        return f"tf_round_bf16((float)({x}))"
    if dtype == "float16":
        return f"tf_round_f16((float)({x}))"
    return f"static_cast<{CPP_TYPE[dtype]}>({x})"


def load_text(ptr: str, index: str, dtype: str) -> str:
    """The element ``ptr[index]`` of a ``dtype`` buffer, as its compute type."""
    if dtype == "bfloat16":
        return f"tf_bf16_to_f32({ptr}[{index}])"
    if dtype == "float16":
        return f"tf_f16_to_f32({ptr}[{index}])"
    return f"{ptr}[{index}]"


def store_text(x: str, dtype: str) -> str:
    """The value ``x`` as an element of a ``dtype`` buffer."""
    if dtype == "bfloat16":
        return f"tf_f32_to_bf16((float)({x}))"
    if dtype == "float16":
        return f"tf_f32_to_f16((float)({x}))"
    if dtype == "bool":
        return f"({x} != 0)"
    return f"static_cast<{CPP_TYPE[dtype]}>({x})"


def const_text(value: float | int | bool, dtype: str) -> str:
    """A Python scalar as a C++ literal of ``dtype`` (non-finite floats spelled out)."""
    if isinstance(value, bool) or dtype == "bool":
        return "true" if value else "false"
    if floating(dtype):
        v = float(value)
        suffix = "" if dtype == "float64" else "f"
        if math.isnan(v):
            return f"std::numeric_limits<{CPP_TYPE[dtype]}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'' if v > 0 else '-'}std::numeric_limits<{CPP_TYPE[dtype]}>::infinity()"
        text = repr(v)
        return f"{text}{suffix}" if ("." in text or "e" in text) else f"{text}.0{suffix}"
    n = int(value)
    return str(n) if -(2**31) < n < 2**31 else f"INT64_C({n})"


_HELPER_CALL = re.compile(r"\b(tf_[a-z0-9_]+)\b")


def helpers_in(text: str) -> set[str]:
    """Names of `HELPERS` that ``text`` calls (with the helpers they call)."""
    found = {m for m in _HELPER_CALL.findall(text) if m in HELPERS}
    for h in list(found):
        found |= set(_HELPER_DEPS.get(h, ()))
    return found


def helper_source(names: Iterable[str]) -> list[str]:
    """Source lines of the named helpers, dependencies first, each under an include guard."""
    order = sorted(names, key=lambda h: (h in _HELPER_DEPS, h))
    out: list[str] = []
    for h in order:
        guard = f"TORCHFUSE_HELPER_{h.upper()}"
        out += [f"#ifndef {guard}", f"#define {guard}", HELPERS[h], "#endif"]
    return out


__all__ = ["CPP_TYPE", "HELPERS", "PRELUDE", "RENDER", "STORAGE_TYPE", "Render", "cast_text", "const_text",
           "helper_source", "helpers_in", "load_text", "render", "store_text"]
