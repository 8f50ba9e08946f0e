"""Stack shuffling and no-ops."""

from __future__ import annotations

from torchfuse.capture import variables as V


def nop(frame, inst) -> None:
    pass


def pop_top(frame, inst) -> None:
    frame.pop()


def push_null(frame, inst) -> None:
    frame.push(V.NULL)


def copy(frame, inst) -> None:
    frame.push(frame.stack[-inst.arg])


def swap(frame, inst) -> None:
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


def end_for(frame, inst) -> None:
    frame.popn(2)


def make_cell(frame, inst) -> None:
    name = inst.argval
    frame.cells[name] = V.CellVar(frame.locals.pop(name, V.UNBOUND))


HANDLERS = {
    "NOP": nop, "RESUME": nop, "CACHE": nop, "EXTENDED_ARG": nop, "PRECALL": nop,
    "COPY_FREE_VARS": nop, "POP_TOP": pop_top, "PUSH_NULL": push_null, "COPY": copy,
    "SWAP": swap, "END_FOR": end_for, "MAKE_CELL": make_cell,
}
