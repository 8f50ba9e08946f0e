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
