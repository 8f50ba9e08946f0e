"""Symbolic sizes: size symbols with ranges, torch ``SymInt`` nodes backed by sympy, and guards.

Dynamic shapes need torch's own meta kernels to compute *with* sizes they do not know. torch
lets a Python object stand behind a ``torch.SymInt``: the C++ side calls methods such as
``add``, ``mul``, ``eq`` and ``guard_bool`` on it. `SymNode` is that object. It holds
a sympy expression over size symbols and the *hint* (the value the expression has for the
example inputs), so every question a kernel asks can be answered:

* arithmetic (``add``, ``floordiv``, ``sym_max`` …) builds a new node: expression and hint;
* a branch on a relation (``guard_bool``: "is ``s0 == 1``?") is first decided from the
  symbols' ranges; only when the ranges cannot decide it does the answer come from the hint,
  and then the relation that held is written down as a guard
  ([`SymbolGuard`][torchfuse.graph.schema.SymbolGuard]). That is how relations such as
  ``s0 == s1`` become guards only when the code depends on them;
* a demand for a plain ``int`` (``guard_int``) specializes: the guard ``expr == hint``.

A `SizeEnv` owns the symbols, their ranges and the guards of one trace. Sizes 0 and 1
are never symbolic (a symbol's range starts at 2), so broadcasting and empty-tensor checks
are decided by the ranges and add no guards. A symbol made with ``strict=True``
(``mark_dynamic``) may not be specialized: doing so raises `SpecializationError`
naming the source line that asked for it (``SizeEnv.loc``, kept current by capture).

Expressions leave this module as strings of the format's grammar (`to_text`) and come
back with `SizeEnv.parse`. Meta kernels written in Python need torch's Python
dispatcher to see symbolic sizes; `SizeEnv.tracing` turns it on for a trace.

Why sympy: it canonicalizes sums and products (``s0*64 == 64*s0``), cancels
(``(s0*64)//64 == s0``) and substitutes, which is the algebra shapes need; the inductor uses
the same library for its indices.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import BinOp, Call, Name, Num, parse

INF = math.inf


class SpecializationError(RuntimeError):
    """Code made a size that was asked to stay symbolic (``mark_dynamic``) a constant."""


@dataclass
class SymbolInfo:
    name: str
    symbol: sympy.Symbol
    hint: int
    min: int = 2
    max: int | None = None
    source: str | None = None
    strict: bool = False
    """Set by ``mark_dynamic``: specializing this symbol is an error."""


@dataclass
class SizeEnv:
    """The size symbols, their ranges and the guards of one trace."""

    symbols: dict[str, SymbolInfo] = field(default_factory=dict)
    guards: list[tuple[str, S.SourceLoc | None]] = field(default_factory=list)
    loc: S.SourceLoc | None = None
    """Where the traced code is now; guards and specialization errors name it."""
    loc_fn: Callable[[], S.SourceLoc | None] | None = None
    """When set, asked for the location instead of `loc` (capture's current line)."""
    replacements: dict[sympy.Symbol, sympy.Expr] = field(default_factory=dict)
    """Symbols a guard made equal to another expression (``s2 == s0``): written as that
    expression everywhere after, so equal sizes look equal to later passes."""
    _decided: dict[sympy.Basic, bool | None] = field(default_factory=dict)
    _guard_set: set[str] = field(default_factory=set)

    # -- symbols
    def symbol(self, hint: int, *, source: str | None = None, min: int = 2, max: int | None = None,
               strict: bool = False, name: str | None = None) -> torch.SymInt:
        """A new size symbol whose value for the example inputs is ``hint``."""
        if hint < 2:
            raise ValueError(f"sizes 0 and 1 are specialized; cannot make a symbol with hint {hint}")
        if min < 2:
            min = 2
        if max is not None and not min <= hint <= max:
            raise ValueError(f"size {hint} is outside the requested range [{min}, {max}]")
        if name is None:
            i = len(self.symbols)
            while f"s{i}" in self.symbols:  # an env rebuilt from a graph may skip numbers
                i += 1
            name = f"s{i}"
        elif name in self.symbols:
            raise ValueError(f"size symbol {name!r} exists already")
        sym = sympy.Symbol(name, integer=True, positive=True)
        self.symbols[name] = SymbolInfo(name, sym, hint, min, max, source, strict)
        return torch.SymInt(SymNode(sym, hint, int, self))

    def size(self, expr: sympy.Expr | int) -> int | torch.SymInt:
        """A plain int for a constant expression, else a ``SymInt`` over this env's symbols."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        return torch.SymInt(SymNode(expr, self.hint_of(expr), int, self))

    def parse(self, text: S.Expr) -> int | torch.SymInt:
        """A size written in the format's grammar as an int or a ``SymInt``."""
        if isinstance(text, int):
            return text
        return self.size(self.to_sympy(text))

    def to_sympy(self, text: S.Expr) -> sympy.Expr:
        if isinstance(text, int):
            return sympy.Integer(text)
        return self._ast_to_sympy(parse(text))

    def _ast_to_sympy(self, a: Any) -> sympy.Expr:
        if isinstance(a, Num):
            return sympy.Integer(a.value)
        if isinstance(a, Name):
            info = self.symbols.get(a.name)
            if info is None:
                raise KeyError(f"unknown size symbol {a.name!r}")
            return info.symbol
        if isinstance(a, Call):
            args = [self._ast_to_sympy(x) for x in a.args]
            return sympy.Max(*args) if a.fn == "max" else sympy.Min(*args)
        assert isinstance(a, BinOp)
        lhs, rhs = self._ast_to_sympy(a.lhs), self._ast_to_sympy(a.rhs)
        ops = {"+": lambda: lhs + rhs, "-": lambda: lhs - rhs, "*": lambda: lhs * rhs,
               "//": lambda: sympy.floor(lhs / rhs), "%": lambda: sympy.Mod(lhs, rhs),
               "==": lambda: sympy.Eq(lhs, rhs), "!=": lambda: sympy.Ne(lhs, rhs),
               "<": lambda: sympy.Lt(lhs, rhs), "<=": lambda: sympy.Le(lhs, rhs),
               ">": lambda: sympy.Gt(lhs, rhs), ">=": lambda: sympy.Ge(lhs, rhs)}
        return ops[a.op]()

    def hint_of(self, expr: sympy.Basic) -> Any:
        env = {info.symbol: info.hint for info in self.symbols.values()}
        value = expr.subs(env)
        if value is sympy.true or value is sympy.false:
            return bool(value)
        return int(value) if value.is_Integer else float(value)

    # -- records for the format
    def records(self) -> tuple[S.Symbol, ...]:
        return tuple(S.Symbol(name=i.name, min=i.min, max=i.max, hint=i.hint, source=i.source)
                     for i in self.symbols.values())

    def guard_records(self) -> tuple[S.SymbolGuard, ...]:
        return tuple(S.SymbolGuard(expr=e, loc=loc) for e, loc in self.guards)

    def canonical_meta(self, meta: S.TensorMeta) -> S.TensorMeta:
        """A value-table entry with the replacements applied to its expressions."""
        if not self.replacements:
            return meta
        import msgspec

        def fix(e: S.Expr) -> S.Expr:
            return e if isinstance(e, int) else self.text(self.to_sympy(e))

        return msgspec.structs.replace(meta, sizes=tuple(fix(e) for e in meta.sizes),
                                       strides=tuple(fix(e) for e in meta.strides),
                                       storage_offset=fix(meta.storage_offset))

    def current_loc(self) -> S.SourceLoc | None:
        return self.loc_fn() if self.loc_fn is not None else self.loc

    # -- deciding relations
    def bounds(self, e: sympy.Basic) -> tuple[float, float]:
        """An interval that holds every value ``e`` takes within the symbols' ranges."""
        return interval(e, self._range_of)

    def _range_of(self, s: sympy.Symbol) -> tuple[float, float]:
        info = self.symbols.get(s.name)
        if info is None:
            return -INF, INF
        return info.min, (info.max if info.max is not None else INF)

    def canonical(self, e: sympy.Basic) -> sympy.Basic:
        """``e`` with the replacements applied."""
        if not self.replacements or not e.free_symbols & self.replacements.keys():
            return e
        return e.xreplace(self.replacements)

    def text(self, e: sympy.Basic) -> S.Expr:
        return to_text(self.canonical(e))

    def decide(self, rel: sympy.Basic) -> bool | None:
        """True/False when the ranges settle ``rel`` for every value of the symbols, else None."""
        rel = self.canonical(rel)
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        if rel in self._decided:
            return self._decided[rel]
        out: bool | None = None
        if isinstance(rel, sympy.Not):
            inner = self.decide(rel.args[0])
            out = None if inner is None else not inner
        elif isinstance(rel, sympy.And | sympy.Or):
            parts = [self.decide(a) for a in rel.args]
            if isinstance(rel, sympy.And):
                out = False if False in parts else (True if all(p is True for p in parts) else None)
            else:
                out = True if True in parts else (False if all(p is False for p in parts) else None)
        elif isinstance(rel, sympy.Rel):
            # cheapest form first: the difference as built, then expanded, then factored
            # (s0*s1 - s0 has no bounds; s0*(s1 - 1) has); looser bounds are never wrong
            diff = rel.lhs - rel.rhs
            for form in (lambda d: d, sympy.expand, sympy.factor):
                diff = form(diff)
                out = _settle(type(rel), *self.bounds(diff))
                if out is not None:
                    break
        self._decided[rel] = out
        return out

    def assume(self, rel: sympy.Basic, value: bool) -> None:
        """The traced code took the branch where ``rel`` is ``value``: guard on it."""
        fact = self.canonical(rel if value else _negate(rel))
        if isinstance(fact, sympy.And):
            for a in fact.args:
                self.assume(a, True)
            return
        if fact is sympy.true:
            return
        if isinstance(fact, sympy.Or):
            # the format writes no disjunctions (unflatten asks "s0 == 2 or s0 % 2 == 0"):
            # guard on a disjunct that holds for the hints, which implies the whole; one
            # that pins a size to a number last (it would specialize)
            pins = lambda a: isinstance(a, sympy.Eq) and (a.lhs.is_Number or a.rhs.is_Number)
            for a in sorted(fact.args, key=pins):
                if self.hint_of(a) is True:
                    self.assume(a, True)
                    return
        if isinstance(fact, sympy.Eq | sympy.Ne) and _side_key(fact.lhs) > _side_key(fact.rhs):
            fact = type(fact)(fact.rhs, fact.lhs, evaluate=False)
        self._check_strict(fact)
        text = to_text(fact)
        if text not in self._guard_set:
            self._guard_set.add(text)
            self.guards.append((text, self.current_loc()))
        self._decided[fact] = True
        self._decided[_negate(fact)] = False
        if isinstance(fact, sympy.Eq):
            self._replace(fact)

    def _replace(self, fact: sympy.Eq) -> None:
        # s2 == s0: the newer symbol is written as the older one (or as the expression)
        syms = sorted((s for s in (fact.lhs, fact.rhs) if s.is_Symbol and s.name in self.symbols),
                      key=lambda s: _symbol_order(s.name))
        if not syms:
            return
        victim = syms[-1]
        other = fact.rhs if victim == fact.lhs else fact.lhs
        if victim in other.free_symbols:
            return
        self.replacements[victim] = other
        for k, v in list(self.replacements.items()):
            self.replacements[k] = v.xreplace({victim: other})
        self._decided.clear()

    def specialize(self, expr: sympy.Expr, hint: Any) -> None:
        """Code needs ``expr`` as a plain number: guard ``expr == hint``."""
        if expr.is_Number:
            return
        try:
            to_text(self.canonical(expr))
            integral = float(hint).is_integer()
        except ValueError:
            integral = False
        if integral:
            self.assume(sympy.Eq(expr, int(hint)), True)
            return
        # A float such as 2/(s0 - 1) (a derivative formula's scale) has no text in the
        # format's grammar, and neither would its guard: pin each of its symbols instead.
        for s in sorted(self.canonical(expr).free_symbols, key=lambda s: _symbol_order(s.name)):
            info = self.symbols.get(s.name)
            if info is not None:
                self.assume(sympy.Eq(s, info.hint), True)

    def _check_strict(self, fact: sympy.Basic) -> None:
        # A fact that pins a strict symbol to one value is a specialization.
        if not isinstance(fact, sympy.Eq):
            return
        for s in fact.free_symbols:
            info = self.symbols.get(s.name)
            if info is None or not info.strict:
                continue
            solved = sympy.solve(fact, s)
            if len(solved) == 1 and solved[0].is_Number:
                loc = self.current_loc()
                where = f"{loc.file}:{loc.line}" if loc else "an unknown line"
                text = f" ({loc.text.strip()})" if loc and loc.text else ""
                raise SpecializationError(
                    f"size symbol {s.name} (from {info.source}) was marked dynamic, but the code "
                    f"at {where}{text} made it the constant {solved[0]} ({to_text(fact)})")

    # -- tracing
    @contextlib.contextmanager
    def tracing(self) -> Iterator[SizeEnv]:
        """Run torch code on symbolic sizes: Python meta kernels need the Python dispatcher."""
        with torch._C._EnablePythonDispatcher():
            yield self


def _settle(kind: type, lo: float, hi: float) -> bool | None:
    """The truth of ``d <kind> 0`` for every ``d`` in ``[lo, hi]``, or None."""
    if kind is sympy.Eq:
        return False if lo > 0 or hi < 0 else (True if lo == hi == 0 else None)
    if kind is sympy.Ne:
        return True if lo > 0 or hi < 0 else (False if lo == hi == 0 else None)
    if kind is sympy.Lt:
        return True if hi < 0 else (False if lo >= 0 else None)
    if kind is sympy.Le:
        return True if hi <= 0 else (False if lo > 0 else None)
    if kind is sympy.Gt:
        return True if lo > 0 else (False if hi <= 0 else None)
    if kind is sympy.Ge:
        return True if lo >= 0 else (False if hi < 0 else None)
    return None


def _side_key(e: sympy.Basic) -> tuple[bool, str]:
    return bool(e.is_Number), str(e)  # symbols left, numbers right: "s0 == 7"


def _symbol_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("s")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def interval(e: sympy.Basic, range_of: Callable[[sympy.Symbol], tuple[float, float]],
             extra: Callable[[sympy.Basic, Callable], tuple[float, float] | None] | None = None,
             ) -> tuple[float, float]:
    """``(lo, hi)`` holding every value of the integer expression ``e`` when each symbol ``s``
    lies in ``range_of(s)`` (interval arithmetic: loose, never wrong). ``extra(e, recurse)``
    bounds node types this function does not know (the inductor's index functions), or
    returns None."""

    def rec(x: sympy.Basic) -> tuple[float, float]:
        return interval(x, range_of, extra)

    if e.is_Integer:
        return int(e), int(e)
    if e.is_Number:
        return float(e), float(e)
    if e.is_Symbol:
        return range_of(e)
    if e.is_Add:
        lo = hi = 0.0
        for a in e.args:
            alo, ahi = rec(a)
            lo, hi = lo + alo, hi + ahi
        return lo, hi
    if e.is_Mul:
        lo, hi = 1.0, 1.0
        for a in e.args:
            alo, ahi = rec(a)
            cands = [_mul(x, y) for x in (lo, hi) for y in (alo, ahi)]
            lo, hi = min(cands), max(cands)
        return lo, hi
    if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
        lo, hi = rec(e.args[0])
        if lo >= 0:
            return lo ** int(e.args[1]), hi ** int(e.args[1])
        return -INF, INF
    if isinstance(e, sympy.floor):
        lo, hi = rec(e.args[0])
        return math.floor(lo) if lo != -INF else lo, math.floor(hi) if hi != INF else hi
    if isinstance(e, sympy.Mod):
        (alo, ahi), (blo, bhi) = rec(e.args[0]), rec(e.args[1])
        if alo >= 0 and blo > 0:
            return (alo, ahi) if ahi < blo else (0, min(ahi, bhi - 1))  # 1 % s0 with s0 >= 2 is 1
        return -INF, INF
    if isinstance(e, sympy.Max | sympy.Min):
        parts = [rec(a) for a in e.args]
        pick = max if isinstance(e, sympy.Max) else min
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    found = extra(e, rec) if extra is not None else None
    return found if found is not None else (-INF, INF)


def _mul(x: float, y: float) -> float:
    if x == 0 or y == 0:
        return 0.0
    return x * y


def _negate(rel: sympy.Basic) -> sympy.Basic:
    if isinstance(rel, sympy.Eq):
        return sympy.Ne(rel.lhs, rel.rhs)
    if isinstance(rel, sympy.Ne):
        return sympy.Eq(rel.lhs, rel.rhs)
    if isinstance(rel, sympy.Lt):
        return sympy.Ge(rel.lhs, rel.rhs)
    if isinstance(rel, sympy.Le):
        return sympy.Gt(rel.lhs, rel.rhs)
    if isinstance(rel, sympy.Gt):
        return sympy.Le(rel.lhs, rel.rhs)
    if isinstance(rel, sympy.Ge):
        return sympy.Lt(rel.lhs, rel.rhs)
    # De Morgan, so that a negated "a or b" is two guards the grammar can write
    if isinstance(rel, sympy.Or):
        return sympy.And(*(_negate(a) for a in rel.args))
    if isinstance(rel, sympy.And):
        return sympy.Or(*(_negate(a) for a in rel.args))
    if isinstance(rel, sympy.Not):
        return rel.args[0]
    return sympy.Not(rel)


# ----------------------------------------------------------------------------- SymNode

_REL = {"eq": sympy.Eq, "ne": sympy.Ne, "lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge}
_PY_REL = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
           "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


class SymNode:
    """What stands behind a ``torch.SymInt``/``SymFloat``/``SymBool``: a sympy expression over
    size symbols, its value for the example inputs (``hint``), and the env that records guards."""

    __slots__ = ("env", "expr", "hint", "pytype")

    def __init__(self, expr: sympy.Basic, hint: Any, pytype: type, env: SizeEnv) -> None:
        self.expr, self.hint, self.pytype, self.env = expr, hint, pytype, env

    def _new(self, expr: sympy.Basic, hint: Any, pytype: type | None = None) -> SymNode:
        return SymNode(expr, hint, pytype or self.pytype, self.env)

    # -- kinds and constants
    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False

    def has_hint(self) -> bool:
        return True

    @property
    def _hint(self) -> Any:
        # torch's statically_known_true (inside Python meta kernels such as
        # native_layer_norm_backward's) reads the hint under this name
        return self.hint

    def maybe_as_int(self) -> int | None:
        return int(self.expr) if self.expr.is_Integer else None

    def maybe_as_bool(self) -> bool | None:
        return bool(self.expr) if self.expr in (sympy.true, sympy.false) else None

    def wrap_int(self, n: int) -> SymNode:
        return SymNode(sympy.Integer(n), n, int, self.env)

    def wrap_float(self, n: float) -> SymNode:
        return SymNode(sympy.Float(n), n, float, self.env)

    def wrap_bool(self, b: bool) -> SymNode:
        return SymNode(sympy.true if b else sympy.false, b, bool, self.env)

    def clone(self) -> SymNode:
        return self

    def str(self) -> str:
        return str(self.expr)

    def _graph_repr(self) -> str:
        return str(self.expr)

    def __str__(self) -> str:
        return str(self.expr)

    def __repr__(self) -> str:
        return f"SymNode({self.expr}, hint={self.hint})"

    # -- answers that make code depend on the value
    def guard_bool(self, file: str = "", line: int = 0) -> bool:
        decided = self.env.decide(self.expr)
        if decided is not None:
            return decided
        value = bool(self.hint)
        self.env.assume(self.expr, value)
        return value

    def guard_int(self, file: str = "", line: int = 0) -> int:
        self.env.specialize(self.expr, self.hint)
        return int(self.hint)

    def guard_float(self, file: str = "", line: int = 0) -> float:
        self.env.specialize(self.expr, self.hint)
        return float(self.hint)

    expect_true = guard_bool
    guard_size_oblivious = guard_bool  # symbols are >= 2 already: size-oblivious by range

    def guard_or_false(self, file: str = "", line: int = 0) -> bool:
        decided = self.env.decide(self.expr)
        return bool(decided) if decided is not None else self.guard_bool(file, line)

    def guard_or_true(self, file: str = "", line: int = 0) -> bool:
        decided = self.env.decide(self.expr)
        return bool(decided) if decided is not None else self.guard_bool(file, line)

    def statically_known_true(self, file: str = "", line: int = 0) -> bool:
        return self.env.decide(self.expr) is True

    def bool_(self) -> bool:
        return self.guard_bool()

    def int_(self) -> int:
        return self.guard_int()

    def expect_size(self, file: str = "", line: int = 0) -> bool:
        return self.guard_bool(file, line) if self.pytype is bool else True

    # -- arithmetic
    def add(self, o: SymNode) -> SymNode:
        return self._new(self.expr + o.expr, self.hint + o.hint, _num_type(self, o))

    def sub(self, o: SymNode) -> SymNode:
        return self._new(self.expr - o.expr, self.hint - o.hint, _num_type(self, o))

    def mul(self, o: SymNode) -> SymNode:
        return self._new(self.expr * o.expr, self.hint * o.hint, _num_type(self, o))

    def floordiv(self, o: SymNode) -> SymNode:
        return self._new(sympy.floor(self.expr / o.expr), self.hint // o.hint, _num_type(self, o))

    int_floordiv = floordiv

    def mod(self, o: SymNode) -> SymNode:
        return self._new(sympy.Mod(self.expr, o.expr), self.hint % o.hint, _num_type(self, o))

    def truediv(self, o: SymNode) -> SymNode:
        return self._new(self.expr / o.expr, self.hint / o.hint, float)

    float_truediv = int_truediv = truediv

    def pow(self, o: SymNode) -> SymNode:
        return self._new(self.expr ** o.expr, self.hint ** o.hint, _num_type(self, o))

    float_pow = pow_by_natural = pow

    def neg(self) -> SymNode:
        return self._new(-self.expr, -self.hint)

    def sym_max(self, o: SymNode) -> SymNode:
        return self._extreme(o, sympy.Max, max, sympy.Ge)

    def sym_min(self, o: SymNode) -> SymNode:
        return self._extreme(o, sympy.Min, min, sympy.Le)

    def _extreme(self, o: SymNode, fn: type, pick: Callable, wins: type) -> SymNode:
        # max(s0, 1) is s0 by the ranges: settle it there before sympy's slower Max does
        a, b = self.expr, o.expr
        if a == b or self.env.decide(wins(a, b, evaluate=False)) is True:
            return self._new(a, pick(self.hint, o.hint), _num_type(self, o))
        if self.env.decide(wins(b, a, evaluate=False)) is True:
            return self._new(b, pick(self.hint, o.hint), _num_type(self, o))
        return self._new(fn(a, b), pick(self.hint, o.hint), _num_type(self, o))

    def sym_sum(self, others: list[SymNode]) -> SymNode:
        expr, hint = sympy.Integer(0), 0
        for o in others:
            expr, hint = expr + o.expr, hint + o.hint
        return self._new(expr, hint, int)

    def sym_float(self) -> SymNode:
        return self._new(self.expr, float(self.hint), float)

    def sym_int(self) -> SymNode:
        return self._new(sympy.floor(self.expr), int(self.hint), int)

    def floor(self) -> SymNode:
        return self._new(sympy.floor(self.expr), math.floor(self.hint), int)

    def ceil(self) -> SymNode:
        return self._new(sympy.ceiling(self.expr), math.ceil(self.hint), int)

    def abs(self) -> SymNode:
        return self._new(sympy.Abs(self.expr), abs(self.hint))

    # -- relations and logic
    def _rel(self, o: SymNode, op: str) -> SymNode:
        hint = _PY_REL[op](self.hint, o.hint)
        a, b = self.expr, o.expr
        if (a.is_Number and b.is_Number) or a == b:
            # two constants, or one expression against itself: the answer is the hint's
            return self._new(sympy.true if hint else sympy.false, hint, bool)
        # built unevaluated: sympy's own evaluation of a relation costs more than deciding
        # it from the ranges (decide), and most relations meta kernels build are never asked
        return self._new(_REL[op](a, b, evaluate=False), hint, bool)

    def eq(self, o: SymNode) -> SymNode:
        return self._rel(o, "eq")

    def ne(self, o: SymNode) -> SymNode:
        return self._rel(o, "ne")

    def lt(self, o: SymNode) -> SymNode:
        return self._rel(o, "lt")

    def le(self, o: SymNode) -> SymNode:
        return self._rel(o, "le")

    def gt(self, o: SymNode) -> SymNode:
        return self._rel(o, "gt")

    def ge(self, o: SymNode) -> SymNode:
        return self._rel(o, "ge")

    def sym_and(self, o: SymNode) -> SymNode:
        if self.expr is sympy.true or o.expr is sympy.false:
            return o
        if o.expr is sympy.true or self.expr is sympy.false:
            return self
        return self._new(sympy.And(self.expr, o.expr), bool(self.hint and o.hint), bool)

    def sym_or(self, o: SymNode) -> SymNode:
        if self.expr is sympy.false or o.expr is sympy.true:
            return o
        if o.expr is sympy.false or self.expr is sympy.true:
            return self
        return self._new(sympy.Or(self.expr, o.expr), bool(self.hint or o.hint), bool)

    def sym_not(self) -> SymNode:
        return self._new(_negate(self.expr), not self.hint, bool)

    def sym_ite(self, then: SymNode, other: SymNode) -> SymNode:
        return then if self.guard_bool() else other

    # Contiguity questions on symbolic sizes: answered by the same rule eager uses.
    def is_contiguous(self, sizes: list, strides: list) -> SymNode:
        return self.wrap_bool(_contiguous(sizes, strides))

    def is_non_overlapping_and_dense(self, sizes: list, strides: list) -> SymNode:
        order = sorted(range(len(sizes)), key=lambda d: _hint(strides[d]))
        return self.wrap_bool(_contiguous([sizes[d] for d in reversed(order)],
                                          [strides[d] for d in reversed(order)]))


def _hint(x: Any) -> Any:
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return x.node.hint
    if isinstance(x, SymNode):
        return x.hint
    return x


def _contiguous(sizes: list, strides: list) -> bool:
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        n = _hint(size)
        if n == 0:
            return True
        if n != 1 and _hint(stride) != expected:
            return False
        expected *= n
    return True


def _num_type(a: SymNode, b: SymNode) -> type:
    return float if float in (a.pytype, b.pytype) else int


# ----------------------------------------------------------------------------- text


def node_of(x: Any) -> SymNode | None:
    """The `SymNode` behind a ``SymInt``/``SymFloat``/``SymBool`` of ours, else None."""
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        node = x.node
        return node if isinstance(node, SymNode) else None
    return None


def size_text(x: Any) -> S.Expr:
    """A size (int or ``SymInt``) as the format writes it: an int or an expression string."""
    node = node_of(x)
    if node is None:
        return int(x)
    return node.env.text(node.expr)


def to_text(e: sympy.Basic) -> S.Expr:
    """A sympy expression in the format's grammar (ints stay ints)."""
    if e.is_Integer:
        return int(e)
    return _text(e)


def _text(e: sympy.Basic) -> str:
    if e.is_Integer:
        v = int(e)
        return str(v) if v >= 0 else f"(0 - {-v})"
    if e.is_Symbol:
        return e.name
    if e is sympy.true or e is sympy.false:
        return "1 == 1" if e is sympy.true else "1 == 0"
    if e.is_Add:
        pos = [a for a in e.args if not _is_negative(a)]
        neg = [a for a in e.args if _is_negative(a)]
        text = " + ".join(_text(a) for a in pos) if pos else "0"
        for a in neg:
            text += " - " + _atom(-a)
        return text
    if e.is_Mul:
        num, den = sympy.fraction(e)
        if den != 1:
            raise ValueError(f"size expression {e} is not an integer expression")
        factors = []
        for a in sympy.Mul.make_args(num):
            if a.is_Pow and a.args[1].is_Integer and int(a.args[1]) > 0:
                factors += [_atom(a.args[0])] * int(a.args[1])
            else:
                factors.append(_atom(a))
        return "*".join(factors)
    if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
        return "*".join([_atom(e.args[0])] * int(e.args[1]))
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den == 1:
            return _text(num)
        return f"{_atom(num)}//{_atom(den)}"
    if isinstance(e, sympy.ceiling):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den == 1:
            return _text(num)
        return f"({_text(num)} + {_atom(den)} - 1)//{_atom(den)}"
    if isinstance(e, sympy.Mod):
        return f"{_atom(e.args[0])} % {_atom(e.args[1])}"
    if isinstance(e, sympy.Max | sympy.Min):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        args = [_text(a) for a in e.args]
        out = args[-1]
        for a in reversed(args[:-1]):
            out = f"{fn}({a}, {out})"
        return out
    if isinstance(e, sympy.Rel):
        op = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">",
              sympy.Ge: ">="}[type(e)]
        return f"{_text(e.lhs)} {op} {_text(e.rhs)}"
    raise ValueError(f"size expression {e} cannot be written in the format's grammar")


def _is_negative(a: sympy.Basic) -> bool:
    return a.could_extract_minus_sign()


def _atom(e: sympy.Basic) -> str:
    t = _text(e)
    return t if e.is_Symbol or (e.is_Integer and int(e) >= 0) else f"({t})"


def symbolic_fake_sizes(env: SizeEnv, meta: S.TensorMeta) -> tuple[list, list, Any]:
    """Sizes, strides and offset of a value-table entry as ints and ``SymInt``s."""
    return ([env.parse(s) for s in meta.sizes], [env.parse(s) for s in meta.strides],
            env.parse(meta.storage_offset))


def env_from_symbols(symbols: tuple[S.Symbol, ...], hints: Mapping[str, int] | None = None) -> SizeEnv:
    """A `SizeEnv` holding a graph's symbols (hints from ``hints`` when given), to
    retrace the graph with the same symbols."""
    env = SizeEnv()
    for s in symbols:
        hint = (hints or {}).get(s.name, s.hint)
        if hint is None:
            hint = max(s.min, 2) + 15
        env.symbol(hint, source=s.source, min=s.min, max=s.max, name=s.name)
    return env
