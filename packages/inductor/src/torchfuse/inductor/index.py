"""Index algebra of the loop IR: floor division and modulo as sympy functions we control
(`FloorDiv`, `ModIdx`), exact division, bounds of index expressions over loop
ranges and size symbols, simplification, printing, and the shape helpers (``unflatten``,
``contiguous_strides``, ``product``). [`torchfuse.inductor.ir`][torchfuse.inductor.ir] re-exports all of it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import sympy

# sympy's ``Add.flatten`` imports this module (and sympy.combinatorics with it) the first time
# two symbolic terms are added: 30-70 ms inside the first compile of the process that indexes
# anything in two dimensions. It is an import, paid here with sympy's own: torch.compile's
# first compile of even ``t * 2 + 1`` imports it too.
import sympy.tensor.tensor


def exact_div(t: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    """``t / b`` when it is an integer expression for sure (a multiple by construction),
    else None. Cheap on purpose: coefficient divisibility and shared factors only."""
    if b == 1:
        return t
    if b.is_Integer:
        c, rest = t.as_coeff_Mul()
        if c.is_Integer and int(c) % int(b) == 0:
            return sympy.Integer(int(c) // int(b)) * rest
        return None
    tf = list(sympy.Mul.make_args(t))
    for f in sympy.Mul.make_args(b):
        if f.is_Integer:
            c = next((x for x in tf if x.is_Integer and int(x) % int(f) == 0), None)
            if c is None:
                return None
            tf.remove(c)
            tf.append(sympy.Integer(int(c) // int(f)))
        elif f in tf:
            tf.remove(f)
        else:
            # a power of the factor: s0**2 / s0 is s0
            base, exp = f.as_base_exp()
            p = next((x for x in tf if x.is_Pow and x.base == base and x.exp.is_Integer
                      and exp.is_Integer and int(x.exp) >= int(exp)), None)
            if p is None:
                return None
            tf.remove(p)
            tf.append(base ** (int(p.exp) - int(exp)))
    return sympy.Mul(*tf)


class FloorDiv(sympy.Function):
    """``a // b`` for non-negative integer ``a`` and positive integer ``b``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        # (b*y + z) // b == y + z // b for integer y: pull exact multiples out
        if isinstance(a, sympy.Add):
            whole, rest = [], []
            for t in a.args:
                q = exact_div(t, b)
                if q is not None:
                    whole.append(q)
                else:
                    rest.append(t)
            if whole:
                return sympy.Add(*whole) + FloorDiv(sympy.Add(*rest), b)
        return exact_div(a, b)


class ModIdx(sympy.Function):
    """``a % b`` for non-negative integer ``a`` and positive integer ``b``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if isinstance(a, ModIdx) and a.args[1].is_Integer and b.is_Integer and int(a.args[1]) % int(b) == 0:
            return ModIdx(a.args[0], b)
        if isinstance(a, sympy.Add):
            keep = [t for t in a.args if exact_div(t, b) is None]
            if len(keep) != len(a.args):
                return ModIdx(sympy.Add(*keep), b)
        if exact_div(a, b) is not None:
            return sympy.Integer(0)
        return None


def _is_int_poly(e: sympy.Expr) -> bool:
    """True when ``e`` is a sum of products of integer constants and integer symbols/calls."""
    if e.is_Integer:
        return True
    if e.is_Symbol or isinstance(e, FloorDiv | ModIdx):
        return bool(e.is_integer)
    if isinstance(e, sympy.Add | sympy.Mul):
        return all(_is_int_poly(a) for a in e.args)
    if isinstance(e, sympy.Pow):
        return e.exp.is_Integer and int(e.exp) >= 0 and _is_int_poly(e.base)
    return False


def loop_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def size_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def upper_bound(e: sympy.Expr, bounds: Mapping[sympy.Symbol, sympy.Expr]) -> int | None:
    """An inclusive upper bound of a non-negative index expression, or None if unknown."""
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        b = bounds.get(e)
        return None if b is None or not sympy.sympify(b).is_Integer else int(b) - 1
    if isinstance(e, ModIdx):
        b = e.args[1]
        inner = upper_bound(e.args[0], bounds)
        if b.is_Integer:
            return int(b) - 1 if inner is None else min(int(b) - 1, inner)
        return inner
    if isinstance(e, FloorDiv):
        inner = upper_bound(e.args[0], bounds)
        return None if inner is None or not e.args[1].is_Integer else inner // int(e.args[1])
    if isinstance(e, sympy.Add):
        parts = [upper_bound(a, bounds) for a in e.args]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]
    if isinstance(e, sympy.Mul):
        # a product of non-negative factors (indices, sizes, non-negative constants): the
        # product of their upper bounds bounds it
        out = 1
        for f in e.args:
            if f.is_nonnegative is not True:
                return None
            ub = upper_bound(f, bounds)
            if ub is None:
                return None
            out *= ub
        return out
    return None


def _non_negative(e: sympy.Expr) -> bool:
    """True when ``e`` is an expression that is ``>= 0`` for every value of its size symbols
    (positive integers) and index functions (non-negative): after expansion, no negative
    term, and the constant covered by the terms that are at least 1."""
    const, least = 0, 0
    for term in sympy.Add.make_args(sympy.expand(e)):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return False
        if rest == 1:
            const += int(coeff)
            continue
        if coeff < 0:
            return False
        factors = sympy.Mul.make_args(rest)
        if not all(_is_size(f) or isinstance(f, FloorDiv | ModIdx) for f in factors):
            return False
        if all(_is_size(f) for f in factors):
            least += int(coeff)  # a product of sizes is at least 1
    return const + least >= 0


def _is_size(f: sympy.Expr) -> bool:
    base = f.base if f.is_Pow and f.exp.is_Integer and int(f.exp) > 0 else f
    return bool(base.is_Symbol and base.is_positive)


def symbolic_upper(e: sympy.Expr, bounds: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr | None:
    """An inclusive upper bound of a non-negative index expression written over the size
    symbols (a loop variable ``v`` is below ``bounds[v]``, a size symbol bounds itself), or
    None. With symbolic sizes, ``(x2 + s0*x1) // s0`` is ``x1`` because ``x2 < s0``: this is
    how such facts are proved."""
    if e.is_Integer:
        return e
    if e.is_Symbol:
        if e in bounds:
            return sympy.sympify(bounds[e]) - 1
        return e if e.is_positive else None
    if isinstance(e, ModIdx):
        inner = symbolic_upper(e.args[0], bounds)
        top = e.args[1] - 1
        return inner if inner is not None and _non_negative(top - inner) else top
    if isinstance(e, FloorDiv):
        inner = symbolic_upper(e.args[0], bounds)
        if inner is None:
            return None
        q = exact_div(sympy.expand(inner + 1), e.args[1])  # a < q*b: a // b <= q - 1
        return q - 1 if q is not None else FloorDiv(inner, e.args[1])
    if isinstance(e, sympy.Add):
        parts = [symbolic_upper(a, bounds) for a in e.args]
        return None if any(p is None for p in parts) else sympy.Add(*parts)
    if isinstance(e, sympy.Mul):
        coeff, rest = e.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        if not coeff.is_Integer or any(f.is_nonnegative is not True for f in factors):
            return None  # bounds of products hold for non-negative factors only
        if int(coeff) < 0:
            return sympy.Integer(0)  # -c*t with t >= 0 is at most 0
        parts = [symbolic_upper(f, bounds) for f in factors]
        return None if any(p is None for p in parts) else coeff * sympy.Mul(*parts)
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        base = symbolic_upper(e.base, bounds)
        return None if base is None else base ** e.exp
    return None


def _below(a: sympy.Expr, b: sympy.Expr, bounds: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    """True when ``0 <= a < b`` holds at every index in range and every size."""
    ub = upper_bound(a, bounds)
    if ub is not None and b.is_Integer:
        return ub < int(b)
    sub = symbolic_upper(a, bounds)
    return sub is not None and _non_negative(b - 1 - sub)


def _by_range(e: sympy.Expr, bounds: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """Drop ``a // b`` and ``a % b`` made trivial by the range of ``a``."""
    if not e.args:
        return e
    if isinstance(e, FloorDiv | ModIdx):
        a, b = _by_range(e.args[0], bounds), e.args[1]
        if _below(a, b, bounds):
            return sympy.Integer(0) if isinstance(e, FloorDiv) else a
        return e.func(a, b) if a is not e.args[0] else e
    new = [_by_range(x, bounds) for x in e.args]
    return e.func(*new) if any(n is not o for n, o in zip(new, e.args, strict=True)) else e


@functools.lru_cache(maxsize=1 << 16)
def substitute(e: sympy.Expr, varmap: tuple[tuple[sympy.Symbol, sympy.Expr], ...]) -> sympy.Expr:
    """``e.xreplace(dict(varmap))``, remembered: a node's loads are placed into the loop
    variables of every kernel they could join (Swin-T training: 16k substitutions, mostly
    repeats, each walking the whole expression)."""
    return e.xreplace(dict(varmap))


def simplify_index(e: sympy.Expr, bounds: Mapping[sympy.Symbol, sympy.Expr] | None = None) -> sympy.Expr:
    """Normalize an index: drop ``a // b``, ``a % b`` made trivial by ``a``'s range and fold
    ``c*b*(e // b) + c*(e % b)`` back into ``c*e``."""
    return _simplify_cached(e, tuple(sorted((bounds or {}).items(), key=lambda kv: kv[0].name)))


@functools.lru_cache(maxsize=65536)
def _simplify_cached(e: sympy.Expr, bounds_items: tuple) -> sympy.Expr:
    bounds = dict(bounds_items)
    for _ in range(8):
        before = e
        e = _fold(sympy.expand(_by_range(e, bounds)))
        if e == before:
            break
    return e


def _fold(e: sympy.Expr) -> sympy.Expr:
    """Fold ``c*b*(e // b) + c*(e % b)`` into ``c*e`` and ``c*b*((e // b) % m) + c*(e % b)``
    into ``c*(e % (b*m))`` in every sum of ``e`` (``c`` may hold size symbols:
    ``s0*(x // s0) + x % s0`` is ``x``). The second is how the rows of a tile over (h, w) of
    NCHW data read it: ``y % 56 + 56*((y // 56) % 56)`` is ``y % 3136``."""
    if not e.args:
        return e
    new = [_fold(a) for a in e.args]
    if any(n is not o for n, o in zip(new, e.args, strict=True)):
        e = e.func(*new)
    if not isinstance(e, sympy.Add):
        return e
    terms = list(e.args)
    changed = True
    while changed:
        changed = False
        for t in terms:
            factors = sympy.Mul.make_args(t)
            k = next((i for i, f in enumerate(factors) if isinstance(f, ModIdx)), None)
            if k is None:
                continue
            coeff = sympy.Mul(*factors[:k], *factors[k + 1:])
            inner, b = factors[k].args
            partner = sympy.expand(coeff * b * FloorDiv(inner, b))
            if partner in terms:
                terms.remove(t)
                terms.remove(partner)
                terms.append(sympy.expand(coeff * inner))
                changed = True
                break
            outer = _mod_partner(terms, t, sympy.expand(coeff * b), FloorDiv(inner, b))
            if outer is not None:
                u, m = outer
                terms.remove(t)
                terms.remove(u)
                terms.append(sympy.expand(coeff * ModIdx(inner, b * m)))
                changed = True
                break
    return sympy.expand(sympy.Add(*terms))


def _mod_partner(terms: list, t: sympy.Expr, coeff: sympy.Expr, quotient: sympy.Expr):
    """A term of ``terms`` other than ``t`` that is ``coeff * (quotient % m)``, with ``m``;
    or None."""
    for u in terms:
        if u is t:
            continue
        factors = sympy.Mul.make_args(u)
        k = next((i for i, f in enumerate(factors) if isinstance(f, ModIdx) and f.args[0] == quotient), None)
        if k is None:
            continue
        if sympy.expand(sympy.Mul(*factors[:k], *factors[k + 1:]) - coeff) == 0:
            return u, factors[k].args[1]
    return None


def print_index(e: sympy.Expr, names: Mapping | None = None, fmt: bool = False) -> str:
    """An index expression as Python/Triton source (``fmt``: the format's grammar, with
    ``min``/``max`` instead of ``tl.minimum``/``tl.maximum``).

    Remembered per (expression, names, ``fmt``): a model's kernels print the same index
    expressions again and again (Swin-T training: 279k calls, a third of code generation)."""
    key = tuple(names.items()) if names else ()
    return _print_index(e, key, fmt)


@functools.lru_cache(maxsize=1 << 16)
def _print_index(e: sympy.Expr, names_key: tuple, fmt: bool) -> str:
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return dict(names_key).get(e, e.name)
    if isinstance(e, sympy.Add):
        parts = [_print_index(a, names_key, fmt) for a in sorted(e.args, key=sympy.default_sort_key)]
        return "(" + " + ".join(parts) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + "*".join(_print_index(a, names_key, fmt) for a in e.args) + ")"
    if isinstance(e, FloorDiv):
        return f"({_print_index(e.args[0], names_key, fmt)} // {_print_index(e.args[1], names_key, fmt)})"
    if isinstance(e, ModIdx):
        return f"({_print_index(e.args[0], names_key, fmt)} % {_print_index(e.args[1], names_key, fmt)})"
    if isinstance(e, sympy.Min | sympy.Max):
        fn = (
            ("min" if isinstance(e, sympy.Min) else "max")
            if fmt
            else ("tl.minimum" if isinstance(e, sympy.Min) else "tl.maximum")
        )
        args = [_print_index(a, names_key, fmt) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + "*".join([_print_index(e.base, names_key, fmt)] * int(e.exp)) + ")"
    raise NotImplementedError(f"cannot print index expression {e}")


def unflatten(flat: sympy.Expr, sizes: Iterable[sympy.Expr]) -> list[sympy.Expr]:
    """Row-major coordinates of a flat index into ``sizes``."""
    sizes = list(sizes)
    if any(s == 0 for s in sizes):  # an empty iteration space: no index is ever computed, so
        return [flat] * len(sizes)  # any expression does (this one keeps loads and stores masked)
    out: list[sympy.Expr] = []
    rest = flat
    for i in range(len(sizes) - 1, -1, -1):
        out.append(ModIdx(rest, sizes[i]) if i > 0 else rest)
        rest = FloorDiv(rest, sizes[i])
    return out[::-1]


def contiguous_strides(sizes: Iterable[sympy.Expr]) -> list[sympy.Expr]:
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.S.One
    for s in reversed(list(sizes)):
        strides.append(acc)
        acc = acc * s
    return strides[::-1]


def product(xs: Iterable[sympy.Expr]) -> sympy.Expr:
    out: sympy.Expr = sympy.S.One
    for x in xs:
        out = out * x
    return out
