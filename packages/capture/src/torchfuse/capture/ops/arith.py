"""Operators: BINARY_OP, unary ops, comparisons, identity and membership tests."""

from __future__ import annotations

from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.versions import INTRINSIC_1, binary_op, compare_op


def binary(frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    frame.push(O.binary(binary_op(inst), a, b))


def _unary(sym: str):
    def h(frame, inst) -> None:
        frame.push(O.unary(sym, frame.pop()))
    return h


def compare(frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    frame.push(O.compare(compare_op(inst), a, b))


def is_op(frame, inst) -> None:
    b = frame.pop()
    a = frame.pop()
    same = O.is_same(a, b)
    frame.push(V.ConstVar(not same if inst.arg else same))


def contains_op(frame, inst) -> None:
    container = frame.pop()
    item = frame.pop()
    found = O.contains(container, item)
    frame.push(V.ConstVar(not found if inst.arg else found))


def intrinsic_1(frame, inst) -> None:
    kind = INTRINSIC_1.get(inst.arg, str(inst.arg))
    if kind == "unary_positive":
        frame.push(O.unary("+", frame.pop()))
    elif kind == "list_to_tuple":
        frame.push(V.ListVar(frame.pop().items, tuple))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {kind}")


HANDLERS = {
    "BINARY_OP": binary, "UNARY_NEGATIVE": _unary("-"), "UNARY_POSITIVE": _unary("+"),
    "UNARY_INVERT": _unary("~"), "UNARY_NOT": _unary("not"), "COMPARE_OP": compare,
    "IS_OP": is_op, "CONTAINS_OP": contains_op, "CALL_INTRINSIC_1": intrinsic_1,
}
