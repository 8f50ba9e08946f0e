"""What every target's rendering table shares (`triton_ops`, `cpp_ops`): the shape of a
rendering, and the helpers that make infix, call and bool-aware arithmetic renderings.

A rendering takes the operands' rendered texts and the result's dtype and returns the
expression's text in the target's language.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Render = Callable[[Sequence[str], str], str]
"""``(operand texts, result dtype) -> expression text``."""


def infix(sym: str) -> Render:
    """``(a sym b)``."""
    return lambda a, dt: f"({a[0]} {sym} {a[1]})"


def call(fn: str) -> Render:
    """``fn(a, b, ...)``."""
    return lambda a, dt: f"{fn}({', '.join(a)})"


def arith(sym: str, logical: str) -> Render:
    """``(a sym b)``, or ``(a logical b)`` when the result is a bool: bools add as *or* and
    multiply as *and* in eager; 1-bit integer arithmetic would wrap (``1 + 1 = 0``)."""
    return lambda a, dt: f"({a[0]} {logical if dt == 'bool' else sym} {a[1]})"


__all__ = ["Render", "arith", "call", "infix"]
