"""Code objects for graph-break resumption, built with the ``bytecode`` library.

Two kinds, both derived from the user's code object so that tracebacks, line numbers and
exception tables stay the user's:

* a **resume function** starts the original code at an instruction offset. Its arguments
  are the values of the stack slots live there (``___stack<i>``; NULL slots are pushed by
  the prologue) and the bound locals by name; the code's cell and free variables all
  become free variables, so the function is made with the live cells as its closure. The
  prologue restores the stack and jumps to the offset; the rest is the original bytecode,
  exception table included (a resumed ``with`` body still reaches ``__exit__``).
* a **step function** runs exactly one instruction (the graph break) in ordinary Python:
  it pushes the instruction's operands (its arguments), runs it, and returns
  ``(results, exit)`` where ``results`` is the tuple of the values it left on the stack and
  ``exit`` is ``0`` (fell through) or ``1`` (jumped).
"""

from __future__ import annotations

import dis
import types
from typing import Any

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label
from bytecode.instr import InstrLocation
from torchfuse.capture import config as C
from torchfuse.capture.errors import Unsupported, where
from torchfuse.capture.versions import (
    CALL_NEEDS_PRECALL,
    FOR_ITER_SKIPS_END_FOR,
    forward_jump,
    is_method_load_arg,
    plain_attr_arg,
)

_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08

ORIGIN: dict[types.CodeType, tuple[types.CodeType, dict[int, int]]] = {}
"""Resume code object -> (the user's code object, its offsets -> the user's offsets)."""


def user_code(code: types.CodeType) -> types.CodeType:
    """The user's code object behind a resume function's code (itself otherwise)."""
    found = ORIGIN.get(code)
    return code if found is None else found[0]
STACK_PREFIX = "___stack"


def _aligned(code: types.CodeType) -> tuple[Bytecode, dict[int, Instr]]:
    """The abstract bytecode of ``code`` and a map from ``dis`` offset to its instruction."""
    bc = Bytecode.from_code(code)
    real = [i for i in bc if isinstance(i, Instr)]
    dis_insts = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    if len(real) != len(dis_insts) or any(d.opname != r.name for d, r in zip(dis_insts, real, strict=True)):
        raise Unsupported(f"cannot map the bytecode of {code.co_qualname} for resumption")
    return bc, {d.offset: r for d, r in zip(dis_insts, real, strict=True)}


def _location(code: types.CodeType) -> InstrLocation:
    return InstrLocation(code.co_firstlineno, code.co_firstlineno, None, None)


def closure_names(code: types.CodeType) -> tuple[str, ...]:
    """The free variables of resume and step functions: cell variables, then free variables."""
    return tuple(code.co_cellvars) + tuple(code.co_freevars)


def _to_free(ins: Instr) -> Instr:
    if isinstance(ins.arg, CellVar):
        return Instr(ins.name, FreeVar(ins.arg.name), location=ins.location)
    return ins


def resume_code(code: types.CodeType, offset: int, nulls: tuple[bool, ...],
                local_names: tuple[str, ...], name: str) -> tuple[types.CodeType, dict[int, int]]:
    """A code object running ``code`` from ``offset`` with the given stack layout and locals,
    and the map from its instruction offsets to those of ``code``."""
    bc, by_offset = _aligned(code)
    target = by_offset[offset]
    body: list = []
    for ins in bc:
        if isinstance(ins, Instr):
            if ins.name in ("MAKE_CELL", "COPY_FREE_VARS", "RESUME"):
                ins = Instr("NOP", location=ins.location)
            elif ins is not target:
                ins = _to_free(ins)
            else:
                ins = target = _to_free(ins)
        body.append(ins)
    start = Label()
    body.insert(next(i for i, x in enumerate(body) if x is target), start)
    loc = _location(code)
    stack_args = [f"{STACK_PREFIX}{i}" for i, null in enumerate(nulls) if not null]
    new = _new_bytecode(code, name, [*stack_args, *local_names])
    prologue = _free_vars_prologue(new, loc)
    it = iter(stack_args)
    for null in nulls:
        prologue.append(Instr("PUSH_NULL", location=loc) if null else
                        Instr("LOAD_FAST", next(it), location=loc))
    prologue.append(Instr("JUMP_FORWARD", start, location=loc))
    new.extend(prologue + body)
    # the exception table's stack depths are computed again: bytecode does not keep the
    # original ones when asked not to, and a handler entered at depth 0 would lose the
    # ``__exit__`` of a resumed ``with`` block
    out = new.to_code()
    mine = [i for i in dis.get_instructions(out) if i.opname != "EXTENDED_ARG"][len(prologue):]
    theirs = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    return out, {a.offset: b.offset for a, b in zip(mine, theirs, strict=True)}


def step_code(code: types.CodeType, offset: int, nulls: tuple[bool, ...], kw_names: tuple[str, ...],
              outs: tuple[int, int | None], name: str) -> types.CodeType:
    """A code object running the instruction at ``offset`` alone, see the module docstring.

    ``nulls`` is the layout of the operands it consumes, ``outs`` how many values it leaves
    when falling through and when jumping (``None``: it never jumps).
    """
    _, by_offset = _aligned(code)
    orig = by_offset[offset]
    loc = orig.location
    args = [f"{STACK_PREFIX}{i}" for i, null in enumerate(nulls) if not null]
    new = _new_bytecode(code, name, args)
    body = _free_vars_prologue(new, loc)
    it = iter(args)
    for null in nulls:
        body.append(Instr("PUSH_NULL", location=loc) if null else Instr("LOAD_FAST", next(it), location=loc))
    jumped = Label()
    if orig.name == "CALL":
        if kw_names:
            body.append(Instr("KW_NAMES", kw_names, location=loc))
        if CALL_NEEDS_PRECALL:
            body.append(Instr("PRECALL", orig.arg, location=loc))
        body.append(Instr("CALL", orig.arg, location=loc))
    elif method_load_instr(orig):
        body.append(Instr("LOAD_ATTR", plain_attr_arg(orig.arg), location=loc))
    elif isinstance(orig.arg, Label):  # the exit is always below: jump forward (3.11 names)
        body.append(Instr(forward_jump(orig.name), jumped, location=loc))
    else:
        body.append(_to_free(Instr(orig.name, orig.arg, location=loc) if orig.require_arg()
                             else Instr(orig.name, location=loc)))
    _pack_exit(body, outs[0], 0, loc)
    if outs[1] is not None:
        body.append(jumped)
        if orig.name == "FOR_ITER" and FOR_ITER_SKIPS_END_FOR:
            body.append(Instr("END_FOR", location=loc))  # skipped: 3.12 jumps past it
        _pack_exit(body, outs[1], 1, loc)
    new.extend(body)
    depth = len(nulls) + max(outs[0], outs[1] or 0) + 8
    return new.to_code(stacksize=depth, compute_exception_stack_depths=False)


def routed_code(code: types.CodeType, offset: int, depth: int, hook: object) -> types.CodeType:
    """``code`` with the ``CALL`` at ``offset`` calling ``hook(callable)`` in place of its
    callable, which sits ``depth`` slots below the top of the stack (1 is the top).

    A frame that runs in Python after a graph break it cannot resume from (the break is in a
    ``try`` block, say) runs this code instead of its own: the call that broke inside is then
    compiled as a frame of its own, as it would be after a break that resumes. The hook's
    call goes in before the ``KW_NAMES``/``PRECALL`` that belong to the ``CALL``."""
    bc, by_offset = _aligned(code)
    target = by_offset[offset]
    if target.name not in ("CALL", "CALL_FUNCTION_EX"):
        raise Unsupported(f"cannot route {target.name} at offset {offset}")
    at = next(i for i, x in enumerate(bc) if x is target)
    while target.name == "CALL" and at > 0 and isinstance(bc[at - 1], Instr) and \
            bc[at - 1].name in ("PRECALL", "KW_NAMES"):
        at -= 1
    loc = target.location
    seq = [Instr("SWAP", depth, location=loc)] if depth > 1 else []
    # [.., f] -> [.., NULL, hook, f] -> [.., hook(f)]
    seq += [Instr("PUSH_NULL", location=loc), Instr("SWAP", 2, location=loc),
            Instr("LOAD_CONST", hook, location=loc), Instr("SWAP", 2, location=loc)]
    if CALL_NEEDS_PRECALL:
        seq.append(Instr("PRECALL", 1, location=loc))
    seq.append(Instr("CALL", 1, location=loc))
    if depth > 1:
        seq.append(Instr("SWAP", depth, location=loc))
    bc[at:at] = seq
    return bc.to_code()


def method_load_instr(ins: Instr) -> bool:
    return is_method_load_arg(ins.name, ins.arg)


def _pack_exit(body: list, n: int, exit_id: int, loc: InstrLocation) -> None:
    body += [Instr("BUILD_TUPLE", n, location=loc), Instr("LOAD_CONST", exit_id, location=loc),
             Instr("BUILD_TUPLE", 2, location=loc), Instr("RETURN_VALUE", location=loc)]


def _new_bytecode(code: types.CodeType, name: str, argnames: list[str]) -> Bytecode:
    new = Bytecode()
    new.argnames = list(argnames)
    new.argcount = len(argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.name = name
    new.qualname = f"{code.co_qualname}.<{name}>"
    new.filename = code.co_filename
    new.first_lineno = code.co_firstlineno
    new.flags = code.co_flags & ~(_CO_VARARGS | _CO_VARKEYWORDS)
    new.freevars = list(closure_names(code))
    new.cellvars = []
    return new


def _free_vars_prologue(new: Bytecode, loc: InstrLocation) -> list:
    out: list = []
    if new.freevars:
        out.append(Instr("COPY_FREE_VARS", len(new.freevars), location=loc))
    out.append(Instr("RESUME", 0, location=loc))
    return out


def make_function(code: types.CodeType, f_globals: dict, cells: tuple) -> types.FunctionType:
    """A function object for a resume/step code object with these cells as its closure."""
    if not code.co_freevars:
        return types.FunctionType(code, f_globals, code.co_name)
    if not cells:  # only the names are wanted: empty cells of the right number
        cells = tuple(types.CellType() for _ in code.co_freevars)
    return types.FunctionType(code, f_globals, code.co_name, None, tuple(cells))


def routed_eager_code(err: Unsupported, code: types.CodeType,
                      owner: Any) -> types.CodeType | None:
    """The code an eager frame runs when its break was inside a call: the same code, with that
    call going through ``owner.root.callee`` (`CompiledFunction.callee`: the callee is
    captured as a frame of its own, recursively). ``None`` when the break was not inside a
    call of this frame."""
    if len(err.break_chain) < 2:
        return None
    state = err.break_chain[-1]
    inst = state.instruction
    if state.frame.code is not code or inst.opname not in ("CALL", "CALL_FUNCTION_EX"):
        return None
    if inst.opname == "CALL_FUNCTION_EX":  # [NULL, callable, args, (kwargs)]
        depth = 2 + ((inst.arg or 0) & 1)
    else:  # [NULL, callable, args...] or [method, self, args...]
        from torchfuse.capture import variables as V

        argc = inst.arg or 0
        if len(state.stack) < argc + 2:
            return None
        below = state.stack[-(argc + 2)]
        depth = argc + 1 if below is V.NULL or below is V.UNBOUND else argc + 2
    root = owner.root

    def route(fn: Any) -> Any:
        compiled = root.callee(fn)
        return fn if compiled is None else compiled

    try:
        return routed_code(code, state.instruction.offset, depth, route)
    except Exception as e:  # the frame still runs, eagerly as before: say why in the log
        C.logger("breaks").info("cannot route the call at %s: %s: %s", where(err.loc),
                                type(e).__name__, e)
        return None


__all__ = ["closure_names", "make_function", "resume_code", "routed_code", "routed_eager_code",
           "step_code"]
