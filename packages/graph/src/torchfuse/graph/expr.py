"""The expression grammar of the format, with a parser and evaluator that need no sympy.

Sizes, strides, offsets, grids and guard relations are written as strings in this grammar::

    expr    := compare
    compare := sum (("==" | "!=" | "<=" | "<" | ">=" | ">") sum)?
    sum     := product (("+" | "-") product)*
    product := unary (("*" | "//" | "%") unary)*
    unary   := "-" unary | atom
    atom    := INT | NAME | ("min" | "max") "(" expr "," expr ")" | "(" expr ")"

``NAME`` is a size symbol (``s0``, ``s12``) or, in a kernel grid, a launch-config name
(``XBLOCK``). ``//`` is floor division and ``%`` is Python's modulo (both as in Python on
integers). Comparisons evaluate to ``True``/``False``. Example::

    >>> evaluate("(s0*s1 + XBLOCK - 1) // XBLOCK", {"s0": 4, "s1": 100, "XBLOCK": 128})
    4
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

_TOKEN = re.compile(r"[ \t]*(?:([0-9]{1,40})|([A-Za-z_][A-Za-z_0-9]*)|(//|==|!=|<=|>=|[-+*%(),<>]))")

MAX_LENGTH = 16384
"""The longest expression string `parse` reads (a format document comes from anywhere:
its expressions are bounded in length, literal size and nesting)."""
MAX_NESTING = 64
"""The deepest nesting of parentheses, calls and unary minus signs `parse` accepts."""
MAX_DEPTH = 256
"""The deepest expression tree `parse` accepts (``a + b + c`` is two deep): every walk
over a tree is recursive, so depth is what must stay bounded."""


class ExprError(ValueError):
    """An expression string that does not follow the grammar."""


@dataclass(frozen=True, slots=True)
class Num:
    value: int


@dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    lhs: Ast
    rhs: Ast


@dataclass(frozen=True, slots=True)
class Call:
    fn: str
    args: tuple[Ast, ...]


Ast = Num | Name | BinOp | Call


def _tokenize(text: str) -> list[str]:
    if not isinstance(text, str):
        raise ExprError(f"an expression is an int or a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression of {len(text)} characters is longer than {MAX_LENGTH}")
    pos, out = 0, []
    text = text.rstrip(" \t")
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character {text[pos:pos + 1]!r} at {pos} in {text!r}")
        out.append(m.group(m.lastindex))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ExprError(f"expected {expected or 'a token'} at token {self.i} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Ast:
        node = self.compare()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()!r} in {self.text!r}")
        return node

    def compare(self) -> Ast:
        lhs = self.sum()
        if self.peek() in ("==", "!=", "<=", "<", ">=", ">"):
            op = self.take()
            return BinOp(op, lhs, self.sum())
        return lhs

    def sum(self) -> Ast:
        node = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = BinOp(op, node, self.product())
        return node

    def product(self) -> Ast:
        node = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Ast:
        if self.peek() == "-":
            self.take()
            self.depth += 1
            try:
                if self.depth > MAX_NESTING:
                    raise ExprError(f"expression nests deeper than {MAX_NESTING} in {self.text[:80]!r}")
                return BinOp("-", Num(0), self.unary())
            finally:
                self.depth -= 1
        return self.atom()

    def atom(self) -> Ast:
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise ExprError(f"expression nests deeper than {MAX_NESTING} in {self.text[:80]!r}")
            return self._atom()
        finally:
            self.depth -= 1

    def _atom(self) -> Ast:
        tok = self.take()
        if tok.isdigit():
            return Num(int(tok))
        if tok == "(":
            node = self.compare()
            self.take(")")
            return node
        if tok in ("min", "max") and self.peek() == "(":
            self.take("(")
            a = self.compare()
            self.take(",")
            b = self.compare()
            self.take(")")
            return Call(tok, (a, b))
        if tok[0].isalpha() or tok[0] == "_":
            return Name(tok)
        raise ExprError(f"unexpected {tok!r} in {self.text!r}")


@lru_cache(maxsize=4096)
def parse(text: str) -> Ast:
    """Parse an expression string into a small immutable AST."""
    tree = _Parser(text).parse()
    if _depth(tree) > MAX_DEPTH:
        raise ExprError(f"expression tree deeper than {MAX_DEPTH}: {text[:80]!r}...")
    return tree


def _depth(tree: Ast) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, BinOp):
            stack += [(node.lhs, d + 1), (node.rhs, d + 1)]
        elif isinstance(node, Call):
            stack += [(a, d + 1) for a in node.args]
    return deepest


_BINOPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}


def _eval(node: Ast, env: Mapping[str, int]) -> int:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        try:
            return env[node.name]
        except KeyError:
            raise ExprError(f"unbound symbol {node.name!r}") from None
    if isinstance(node, BinOp):
        lhs, rhs = _eval(node.lhs, env), _eval(node.rhs, env)
        if node.op in ("//", "%") and rhs == 0:
            raise ExprError(f"division by zero ({_show(node)} with {dict(env)})")
        return _BINOPS[node.op](lhs, rhs)
    args = [_eval(a, env) for a in node.args]
    return min(args) if node.fn == "min" else max(args)


def _show(node: Ast) -> str:
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Name):
        return node.name
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(_show(a) for a in node.args)})"
    return f"({_show(node.lhs)} {node.op} {_show(node.rhs)})"


def evaluate(expr: int | str, env: Mapping[str, int] | None = None) -> int:
    """Evaluate an expression (or pass an ``int`` through) with symbol values from ``env``."""
    if isinstance(expr, int):
        return expr
    return _eval(parse(expr), env or {})


def free_symbols(expr: int | str) -> frozenset[str]:
    """The names an expression mentions."""
    if isinstance(expr, int):
        return frozenset()
    out: set[str] = set()

    def walk(node: Ast) -> None:
        if isinstance(node, Name):
            out.add(node.name)
        elif isinstance(node, BinOp):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, Call):
            for a in node.args:
                walk(a)

    walk(parse(expr))
    return frozenset(out)


def to_python(expr: int | str) -> str:
    """The expression as Python source (it already is, after validation)."""
    if isinstance(expr, int):
        return str(expr)
    parse(expr)
    return expr
