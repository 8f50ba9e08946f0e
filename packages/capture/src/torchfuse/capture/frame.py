"""A frame of the symbolic interpreter: stack, locals, cells, instruction pointer.

`Frame.run` steps through the code's instructions, dispatching each to its handler in
`torchfuse.capture.ops.DISPATCH`. A handler that meets something it cannot capture
raises [`Unsupported`][torchfuse.capture.errors.Unsupported]; the loop stamps the error with the
user's source location and a `BreakState` — the instruction and a copy of the stack
and locals as they were *before* it ran — so that graph-break resumption can compile the
graph so far and continue from that point.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import linecache
import types
from typing import Any

from torchfuse.capture import variables as V
from torchfuse.capture.codegen import user_code
from torchfuse.capture.config import config
from torchfuse.capture.context import Capture
from torchfuse.capture.errors import Unsupported, UserException
from torchfuse.capture.versions import exception_table, instructions
from torchfuse.graph.schema import SourceLoc
from torchfuse.graph.symbolic import SpecializationError

_FRAMES: list[Frame] = []


@functools.lru_cache(maxsize=1 << 14)
def _source_loc(code: types.CodeType, line: int, col: int | None) -> SourceLoc:
    """The location of a line of ``code`` (one per line a frame reaches; remembered, since a
    model runs the same layer's code once per layer: Llama's capture met 1.7k line changes
    in 0.3k places)."""
    text = linecache.getline(code.co_filename, line).strip() or None
    return SourceLoc(file=code.co_filename, line=line, col=col, function=user_code(code).co_qualname,
                     text=text)


@dataclasses.dataclass
class BreakState:
    """Where a frame stopped: enough to compile the graph so far and resume after it."""

    frame: Frame
    index: int
    instruction: dis.Instruction
    stack: list[V.Var]
    locals: dict[str, V.Var]
    mark: tuple[int, int] = (0, 0)
    """Graph nodes and side effects recorded before the instruction started."""
    kw_names: tuple[str, ...] = ()
    """The keyword names a ``KW_NAMES`` set for the instruction (a ``CALL``)."""
    step: int = 0
    """How many instructions this frame had started, this one included (for stopping a
    second capture right before it)."""


class Frame:
    """One code object being interpreted (the captured function or an inlined call)."""

    def __init__(self, ctx: Capture, code: types.CodeType, f_globals: dict[str, Any],
                 local_vars: dict[str, V.Var], freevars: dict[str, V.CellVar], *,
                 parent: Frame | None = None, depth: int = 0) -> None:
        self.ctx = ctx
        self.code = code
        ctx.codes.add(code)
        self.f_globals = f_globals
        self.locals = dict(local_vars)
        self.cells: dict[str, V.CellVar] = dict(freevars)
        self.parent = parent
        self.depth = depth
        self.insts, self.index_of = instructions(code)
        self.ip = 0
        self.stack: list[V.Var] = []
        self.kw_names: tuple[str, ...] = ()
        self.result: V.Var | None = None
        self.yields: list[V.Var] | None = None
        self.exc_info: list[V.Var] = []
        """Exceptions being handled (``PUSH_EXC_INFO`` / ``POP_EXCEPT``)."""
        self.is_root = parent is None and depth == 0
        self.stop: tuple[int, Unsupported] | None = None
        """``(step, error)``: raise ``error`` instead of running the ``step``-th instruction."""
        self._line: int | None = None

    @staticmethod
    def current_frame() -> Frame | None:
        return _FRAMES[-1] if _FRAMES else None

    # -- stack helpers used by handlers
    def push(self, v: V.Var) -> None:
        self.stack.append(v)

    def pop(self) -> V.Var:
        return self.stack.pop()

    def popn(self, n: int) -> list[V.Var]:
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    def jump(self, offset: int) -> None:
        self.ip = self.index_of[offset]

    def location(self, inst: dis.Instruction) -> SourceLoc | None:
        pos = inst.positions
        line = pos.lineno if pos is not None else None
        if line is None:
            return self.ctx.loc
        return _source_loc(self.code, line, pos.col_offset if pos is not None else None)

    def _handle(self, e: UserException, inst: dis.Instruction, before: list[V.Var]) -> bool:
        """Jump to the ``except``/``finally`` handler covering ``inst``, as CPython would."""
        for start, end, target, depth, lasti in exception_table(self.code):
            if start <= inst.offset < end:
                self.stack = before[:depth]
                if lasti:
                    self.push(V.ConstVar(inst.offset))
                self.push(V.ObjVar(e.exc))
                self.jump(target)
                return True
        return False

    # -- the loop
    def run(self) -> V.Var:
        from torchfuse.capture.ops import DISPATCH

        _FRAMES.append(self)
        ctx = self.ctx
        saved_loc = ctx.loc
        steps = 0
        try:
            while self.result is None:
                inst = self.insts[self.ip]
                index = self.ip
                self.ip += 1
                pos = inst.positions
                if pos is not None and pos.lineno is not None and pos.lineno != self._line:
                    self._line = pos.lineno
                    ctx.loc = self.location(inst)
                handler = DISPATCH.get(inst.opname)
                steps += 1
                if steps > config.max_loop_iterations:
                    err = Unsupported("loop ran too long to unroll", ctx.loc)
                    err.resumable = False  # type: ignore[attr-defined]
                    raise err
                before = list(self.stack)
                kw = self.kw_names
                mark = (len(ctx.rec.builder.nodes), len(ctx.side_effects))
                try:
                    if self.stop is not None and steps == self.stop[0]:
                        raise self.stop[1]  # the break a first capture found: stop before it
                    if handler is None:
                        raise Unsupported(f"bytecode {inst.opname} is not supported", ctx.loc)
                    handler(self, inst)
                except UserException as e:
                    if self._handle(e, inst, before):
                        continue
                    if e.loc is None:
                        e.loc = ctx.loc
                    e.break_chain.append(BreakState(self, index, inst, before, dict(self.locals),
                                                     mark, kw, steps))
                    raise
                except Unsupported as e:
                    if e.loc is None:
                        e.loc = ctx.loc
                    e.break_chain.append(BreakState(self, index, inst, before, dict(self.locals),
                                                     mark, kw, steps))
                    raise
                except SpecializationError as e:
                    if getattr(e, "loc", None) is None:
                        e.loc = ctx.loc  # type: ignore[attr-defined]
                    raise  # a mark_dynamic size made constant: reported to the user as is
                except Exception as e:
                    # a bug in capture must not break the user's program: run eagerly, say why
                    err = Unsupported(f"internal capture error on {inst.opname}: "
                                      f"{type(e).__name__}: {e}", ctx.loc)
                    err.break_chain.append(BreakState(self, index, inst, before, dict(self.locals),
                                                     mark, kw, steps))
                    err.internal = True
                    raise err from e
            return self.result
        finally:
            _FRAMES.pop()
            ctx.loc = saved_loc
