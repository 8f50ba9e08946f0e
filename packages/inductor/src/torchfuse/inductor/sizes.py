"""Symbolic sizes in the inductor: what is decided from algebra, from bounds, and from hints.

A graph whose sizes are symbols (``s0``, ``s1`` …, each with a range ``[min, max]`` and the
*hint*, the value seen at capture) compiles into ONE Program that must be right at every size
the ranges allow. Every decision the compiler makes about a size falls in one of three kinds,
and each kind has one source of truth:

1. **Equality of sizes is algebra.** Fusion asks "do these two nodes iterate over the same
   domain?" and "is this value read at the point where it is computed?". Both are answered by
   sympy equality after `simplify_index`, never by hints: two
   sizes that only happen to be equal for the example inputs are different sizes.
2. **Whatever correctness depends on comes from bounds** (the symbols' ranges, here
   `SizeInfo.upper`):

   * a *persistent* reduction keeps a whole row in registers, so its ``RBLOCK`` must cover the
     longest row: a symbolic row length is persistent only when its upper bound is at most
     ``persistent_rnumel_max``, and ``RBLOCK`` is the next power of two of that bound. An
     unbounded row length is reduced by the *looped* form (chunks of ``RBLOCK``, online
     softmax where it applies), which is right for any length. When the hint's row would
     fit, the looped kernel also holds the persistent form with ``RBLOCK`` the hint's power
     of two and picks one per call (``if rnumel <= RBLOCK``): rows like the example rows
     are read once, longer rows loop -- the choice is made where the length is known;
   * index arithmetic is 32-bit only when every tensor a kernel indexes, and its iteration
     domain, provably hold fewer than 2**31 elements; a symbol without a ``max`` makes them
     64-bit (``tl.program_id(0).to(tl.int64)``, ``i64`` size parameters). Triton would
     otherwise wrap around silently past 2**31 elements: the cost of 64-bit index math is
     small next to a wrong answer at a size the compiler never saw.
3. **Performance choices come from hints** (`SizeInfo.hint`): ``XBLOCK``, warps, the
   looped ``RBLOCK`` candidates, the fusion cost model's byte counts, and whether (and in how
   many parts) a reduction is split. A choice made from a hint must be correct for every
   size: a split reduction over a symbolic row length ``n`` cuts it into ``k`` chunks of
   ``ceil(n / k)`` elements and masks the tail, so any ``n >= 1`` gives the right result
   (when a factor of ``n`` is known, e.g. ``16*s0``, the chunks divide it and need no mask).
   Blocks are *capped* by bounds, not hints (a block larger than a size that is small for
   sure wastes lanes; a symbolic size may be large at the next call), and a symbolic
   pointwise kernel never takes the one-element-per-thread block meant for tiny tensors
   unless its bound keeps it tiny.

Sizes 0 and 1 are never symbols (capture specializes them), so a symbol's range starts at 2.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.symbolic import interval
from torchfuse.inductor import ir

INT32_LIMIT = 2**31
DEFAULT_HINT = 4096
"""The hint of a symbol that has none (a hand-built graph): a mid-sized dimension."""


@dataclass(frozen=True, slots=True)
class SizeInfo:
    """Hints and ranges of a graph's size symbols."""

    hints: dict[sympy.Symbol, int]
    ranges: dict[sympy.Symbol, tuple[float, float]]
    """Inclusive ``(min, max)``; ``math.inf`` for a symbol without a ``max``."""

    def hint(self, e: sympy.Expr | int) -> int:
        """The value of ``e`` for the example sizes (a performance decision's input)."""
        e = sympy.sympify(e)
        if e.is_Integer:
            return int(e)
        value = e.xreplace({s: sympy.Integer(self.hints.get(s, DEFAULT_HINT)) for s in e.free_symbols})
        return int(value) if value.is_number else DEFAULT_HINT

    def upper(self, e: sympy.Expr | int) -> int | None:
        """An inclusive upper bound of ``e`` over every allowed size, or None when unbounded."""
        hi = self.interval(sympy.sympify(e))[1]
        return None if hi == math.inf else int(hi)

    def fits_int32(self, e: sympy.Expr | int) -> bool:
        ub = self.upper(e)
        return ub is not None and ub < INT32_LIMIT

    def interval(self, e: sympy.Expr) -> tuple[float, float]:
        """``(lo, hi)`` holding every value of ``e`` (interval arithmetic; loose, never wrong):
        the format package's [`interval`][torchfuse.graph.symbolic.interval], taught the loop IR's
        ``FloorDiv`` and ``ModIdx``."""
        return interval(e, lambda s: self.ranges.get(s, (-math.inf, math.inf)), _index_functions)


def _index_functions(e: sympy.Basic, rec) -> tuple[float, float] | None:
    if isinstance(e, ir.FloorDiv):
        (alo, ahi), (blo, bhi) = rec(e.args[0]), rec(e.args[1])
        if alo >= 0 and blo > 0:
            return (math.floor(alo / bhi) if bhi != math.inf else 0,
                    math.floor(ahi / blo) if ahi != math.inf else math.inf)
        return None
    if isinstance(e, ir.ModIdx):
        (alo, ahi), (_, bhi) = rec(e.args[0]), rec(e.args[1])
        return (0, min(ahi, bhi - 1)) if alo >= 0 else None
    return None


@functools.lru_cache(maxsize=256)
def size_info(symbols: tuple[S.Symbol, ...]) -> SizeInfo:
    """The `SizeInfo` of a graph's (or Program's) symbol table."""
    hints: dict[sympy.Symbol, int] = {}
    ranges: dict[sympy.Symbol, tuple[float, float]] = {}
    for s in symbols:
        sym = ir.size_symbol(s.name)
        lo = max(s.min, 0)
        hi = math.inf if s.max is None else s.max
        ranges[sym] = (lo, hi)
        hint = s.hint if s.hint is not None else DEFAULT_HINT
        hints[sym] = int(min(max(hint, lo), hi))
    return SizeInfo(hints, ranges)
