"""Per-Python-version bytecode differences, in one place.

3.11: ``PRECALL`` before ``CALL``; ``LOAD_METHOD``; ``POP_JUMP_FORWARD/BACKWARD_IF_*``;
``JUMP_IF_*_OR_POP``; comprehensions are nested functions; ``FOR_ITER`` pops the exhausted
iterator itself.
3.12: no ``PRECALL``; ``LOAD_ATTR`` carries the method bit (``arg & 1``); ``LOAD_SUPER_ATTR``;
``RETURN_CONST``; ``LOAD_FAST_CHECK``/``LOAD_FAST_AND_CLEAR``; comprehensions inlined
(PEP 709); ``END_FOR``; ``BINARY_SLICE``/``STORE_SLICE``; ``CALL_INTRINSIC_1``; the
exhausted ``FOR_ITER`` jumps past the ``END_FOR`` that follows its target.
"""

from __future__ import annotations

import dis
import functools
import sys
import types

PY312 = sys.version_info >= (3, 12)

if sys.version_info < (3, 11) or sys.version_info >= (3, 13):  # pragma: no cover
    raise ImportError(f"torchfuse-capture supports Python 3.11 and 3.12, not {sys.version}")

LOAD_ATTR_HAS_METHOD_BIT = PY312
"""``LOAD_ATTR`` pushes ``(NULL, attr)`` or ``(method, self)`` when ``arg & 1`` (3.12)."""

INTRINSIC_1 = {1: "print", 2: "import_star", 3: "stopiteration_error", 4: "async_gen_wrap",
               5: "unary_positive", 6: "list_to_tuple", 7: "typevar", 8: "paramspec",
               9: "typevartuple", 10: "subscript_generic", 11: "typealias"}
"""``CALL_INTRINSIC_1`` operand names (3.12)."""


SEND_POPS_RECEIVER = not PY312
"""An exhausted ``SEND`` pops the sub-iterator itself (3.11); 3.12 leaves it for ``END_SEND``."""


@functools.lru_cache(maxsize=4096)
def instructions(code: types.CodeType) -> tuple[tuple[dis.Instruction, ...], dict[int, int]]:
    """The instructions of ``code`` (caches hidden) and a map from offset to index."""
    insts = tuple(dis.get_instructions(code))
    return insts, {inst.offset: i for i, inst in enumerate(insts)}


@functools.lru_cache(maxsize=4096)
def exception_table(code: types.CodeType) -> tuple[tuple[int, int, int, int, bool], ...]:
    """``(start, end, target, depth, lasti)`` entries; ``start <= offset < end``."""
    return tuple((e.start, e.end, e.target, e.depth, e.lasti)
                 for e in dis.Bytecode(code).exception_entries)


def compare_op(inst: dis.Instruction) -> str:
    """``<``, ``==`` …; 3.12 packs extra bits in the arg, ``dis`` decodes it in argval."""
    return str(inst.argval)


def binary_op(inst: dis.Instruction) -> str:
    return inst.argrepr


def kw_names(code: types.CodeType, inst: dis.Instruction) -> tuple[str, ...]:
    """The names ``KW_NAMES`` sets (3.11 and 3.12 both take a ``co_consts`` index)."""
    return tuple(code.co_consts[inst.arg])


def for_iter_exit(insts: tuple[dis.Instruction, ...], target: int) -> int:
    """Where an exhausted ``FOR_ITER`` continues: 3.12 skips the ``END_FOR`` at its target."""
    if target < len(insts) and insts[target].opname == "END_FOR":
        return target + 1
    return target


# ----------------------------------------------------------------------------- graph breaks

_ONE_TO_ONE = frozenset({
    "UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "GET_ITER", "GET_LEN", "CALL_INTRINSIC_1",
    "LOAD_ATTR", "LOAD_METHOD", "GET_YIELD_FROM_ITER"})
_TWO_TO_ONE = frozenset({"BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "CONTAINS_OP", "IS_OP"})
_POP_JUMPS = frozenset(f"{p}{w}" for p in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_",
                                           "POP_JUMP_BACKWARD_IF_")
                       for w in ("TRUE", "FALSE", "NONE", "NOT_NONE"))


def stack_io(inst: dis.Instruction) -> tuple[int, int, int | None] | None:
    """How a graph-break instruction uses the stack, for running it alone in Python:
    ``(consumed, left after falling through, left after jumping)`` counted from the top;
    ``None`` when resuming after this instruction is not supported (the frame then runs
    eagerly). A method load counts its NULL/self slot as a separate output (see
    `method_load`)."""
    name, arg = inst.opname, inst.arg or 0
    if name in _ONE_TO_ONE:
        return 1, 1, None
    if name in _TWO_TO_ONE:
        return 2, 1, None
    if name == "CALL":
        return arg + 2, 1, None
    if name == "CALL_FUNCTION_EX":
        return 3 + (arg & 1), 1, None
    if name in _POP_JUMPS:
        return 1, 0, 0
    if name in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
        return 1, 0, 1
    if name == "FOR_ITER":
        return 1, 2, 0  # the exhausted iterator is popped on 3.11 and 3.12 alike
    if name == "BEFORE_WITH":  # __enter__ runs in Python; the block resumes with its __exit__
        return 1, 2, None
    if name == "FORMAT_VALUE":
        return 1 + bool(arg & 0x04), 1, None
    if name == "UNPACK_SEQUENCE":
        return 1, arg, None
    if name == "STORE_SUBSCR":
        return 3, 0, None
    if name == "STORE_ATTR":
        return 2, 0, None
    if name == "BINARY_SLICE":
        return 3, 1, None
    if name == "STORE_SLICE":
        return 4, 0, None
    if name == "RAISE_VARARGS":
        return arg, 0, None
    if name in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        return 0, 1, None
    if name == "STORE_DEREF":
        return 1, 0, None
    return None


def method_load(inst: dis.Instruction) -> bool:
    """``LOAD_METHOD`` (3.11) or ``LOAD_ATTR`` with the method bit (3.12): pushes two slots.
    Run alone it becomes a plain attribute load with a NULL below the bound attribute."""
    if inst.opname == "LOAD_METHOD":
        return True
    return LOAD_ATTR_HAS_METHOD_BIT and inst.opname == "LOAD_ATTR" and bool((inst.arg or 0) & 1)


CALL_NEEDS_PRECALL = not PY312
"""3.11 runs ``PRECALL n`` before every ``CALL n``."""

FOR_ITER_SKIPS_END_FOR = PY312
"""An exhausted ``FOR_ITER`` jumps one instruction past its target (the ``END_FOR``)."""


def forward_jump(opname: str) -> str:
    """The forward form of a conditional jump (3.11 names its direction; 3.12 only jumps
    forward with ``POP_JUMP_IF_*``)."""
    return opname.replace("_BACKWARD_", "_FORWARD_")


def plain_attr_arg(arg: object) -> object:
    """The ``bytecode`` argument of a plain ``LOAD_ATTR`` made from a method load's."""
    if PY312:
        return (False, arg[1])  # type: ignore[index]
    return arg


def is_method_load_arg(opname: str, arg: object) -> bool:
    """Whether a ``bytecode`` instruction is a method load (see `method_load`)."""
    if opname == "LOAD_METHOD":
        return True
    return PY312 and opname == "LOAD_ATTR" and isinstance(arg, tuple) and bool(arg[0])

BREAK_PROLOGUE = frozenset({"MAKE_CELL", "COPY_FREE_VARS", "RESUME", "NOP", "CACHE",
                            "EXTENDED_ARG", "PRECALL", "KW_NAMES"})
"""Instructions a resume function need not start at (set-up, or bound to the next one)."""


_CLEANUP_ONLY = frozenset({"SWAP", "POP_TOP", "STORE_FAST", "COPY", "NOP", "RERAISE"})


def is_cleanup_handler(insts: tuple[dis.Instruction, ...], index_of: dict[int, int], target: int) -> bool:
    """Whether the handler at ``target`` only restores locals and re-raises (the one a 3.12
    inlined comprehension has): an exception escaping the frame makes it moot."""
    i = index_of.get(target)
    if i is None:
        return False
    for inst in insts[i:]:
        if inst.opname not in _CLEANUP_ONLY:
            return False
        if inst.opname == "RERAISE":
            return True
    return False


def is_with_handler(insts: tuple[dis.Instruction, ...], index_of: dict[int, int], target: int) -> bool:
    """Whether the exception handler at ``target`` is a ``with`` block's ``__exit__`` path."""
    i = index_of.get(target)
    if i is None:
        return False
    names = [x.opname for x in insts[i:i + 3]]
    return "WITH_EXCEPT_START" in names
