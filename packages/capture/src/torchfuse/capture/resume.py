"""Graph breaks that resume: compile the graph so far, run the break in Python, capture on.

When capture of a frame stops at an instruction it cannot put in a graph, `plan_break`
turns the frame's state before that instruction (the outermost
[`BreakState`][torchfuse.capture.frame.BreakState]) into a `BreakPlan`: the graph so far
gets one output per tensor live on the stack, in locals or in cells, and each live value gets
a *spec* saying how to rebuild it from the graph outputs. At run time the compiled entry
(`BreakRunner`):

1. runs the graph and replays the side effects recorded before the break;
2. rebuilds the live stack values, locals and cells;
3. runs the break instruction alone in ordinary Python (a generated *step* function, see
   [`torchfuse.capture.codegen`][torchfuse.capture.codegen]); a call to a user function there goes through
   ``compile`` too, so its own frame is captured separately;
4. hands a `Continue` to the caller's trampoline: the *resume function* that starts
   right after the instruction (or at its jump target), with the values it needs. Resume
   functions are [`CompiledFunction`][torchfuse.capture.compiler.CompiledFunction] s of their own:
   captured on first call, with their own guards and cache entries, cached per (original
   code object, offset, stack layout, live locals).

A break inside an inlined call breaks the outermost frame at its call instruction (the call
then runs in Python, compiled separately). The trampoline keeps loops flat: a break in a
loop body resumes in the body, iteration after iteration, without nesting Python frames.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture import codegen
from torchfuse.capture import variables as V
from torchfuse.capture.context import Capture
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.output import OutputBuilder, Spec, _targets, new_object, rewritten
from torchfuse.capture.source import AttrSource, ClosureSource, ItemSource, Source
from torchfuse.capture.variables import TRACE_RANGE
from torchfuse.capture.versions import (
    BREAK_PROLOGUE,
    exception_table,
    for_iter_exit,
    instructions,
    is_cleanup_handler,
    is_with_handler,
    method_load,
    stack_io,
)

ORIGIN = codegen.ORIGIN

_GRAD_CONTEXTS = {"no_grad": torch.no_grad, "enable_grad": torch.enable_grad,
                  "set_grad_enabled": torch.set_grad_enabled}


class TransparentRange:
    """What a profiler or tracing range (`builtins.TRACE_RANGE`) live at a graph break is
    rebuilt as: a context manager that does nothing, as the range does inside capture."""

    def __init__(self, name: Any = None, *args: Any, **kwargs: Any) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_CONTEXTS: dict[str, Callable[..., Any]] = {**_GRAD_CONTEXTS, TRACE_RANGE: TransparentRange}
"""The ``with`` blocks capture models that a graph break inside can resume in."""


class ForeignExitVar(V.Var):
    """The ``__exit__`` of a context manager that capture does not model (its ``__enter__``
    ran in Python, at a graph break on ``BEFORE_WITH``): calling it is a graph break, so it
    runs in Python too, and an exception raised by a later break in the block reaches it."""

    def __init__(self, value: Any, source: Source) -> None:
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def python(self) -> Any:
        raise Unsupported(f"the {self.describe()}")

    def describe(self) -> str:
        return f"__exit__ of {type(self.value.__self__).__qualname__} (runs in Python)"


class OpaqueVar(V.Var):
    """A value handed to a resume function that capture must pass along untouched
    (an iterator in the middle of a loop): any use of it is a graph break."""

    def __init__(self, value: Any, source: Source) -> None:
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"{type(self.value).__name__} (resumed)"


class Fallback(Unsupported):
    """Why a graph break cannot resume: the whole frame runs eagerly (said in explain/logs)."""


@dataclasses.dataclass
class BreakPlan:
    """Everything a compiled entry needs to resume after a graph break."""

    code: types.CodeType
    """The user's code object (never a resume function's)."""
    offset: int
    stack: list[Spec | None]
    """Specs of the stack slots before the instruction; ``None`` for a NULL slot."""
    local_names: tuple[str, ...]
    locals: list[Spec]
    cells: list[Spec | None]
    """One per `codegen.closure_names` of ``code``."""
    kw_names: tuple[str, ...]
    consumed: int
    outs: tuple[int, int | None]
    exits: tuple[int | None, int | None]
    """The offsets where the code continues after falling through / after jumping."""
    method_load: bool
    error: Unsupported
    effect_ops: list[tuple] = dataclasses.field(default_factory=list)
    """Side effects recorded before the break (replayed before it runs)."""
    grad_enabled: bool = True
    """Grad mode to set after the graph, before the ``with`` blocks live on the stack are
    entered again (each re-entered block then switches it as it did in the user's code)."""
    step_code: types.CodeType | None = None
    """The instruction alone (`codegen.step_code`)."""
    layouts: tuple[tuple[bool, ...] | None, ...] = (None, None)
    """Per exit, the NULL slots of the stack the resume function starts with."""
    loop_step: bool = False
    """The ``FOR_ITER`` of a loop resumed after a break in its body: how the loop goes on
    in Python, not a break of its own (explain, export and the log leave it out)."""


# ----------------------------------------------------------------------------- at capture time


class LiveBuilder(OutputBuilder):
    """Specs for live values at a break: everything `OutputBuilder` handles, plus
    iterators, methods, functions made in the frame, ``with`` exits and cells."""

    def __init__(self, ctx: Capture) -> None:
        super().__init__(ctx)
        self.cell_keys: dict[int, int] = {}
        self.shared: dict[int, int] = {}
        self._keep: list[V.Var] = []

    live = True
    """False while writing side-effect specs: those are run by `output.compile_spec`."""
    tensor_fixups = False

    def spec(self, var: V.Var) -> Spec:
        if not self.live:
            return super().spec(var)
        if var is V.NULL or var is V.UNBOUND:
            raise Fallback(f"a {var.describe()} value is live at the break", self.ctx.loc)
        if isinstance(var, V.TensorVar):
            return super().spec(var)
        if isinstance(var, V.ConstVar) and var.source is not None and \
                rewritten(var.source.expr(), _targets(self.ctx.side_effects)):
            return ("c", var.python())  # its place is written before the break: the old value
        if isinstance(var, OpaqueVar) or (isinstance(var, V.ConstVar) and var.source is not None):
            return ("s", var.source.expr())  # read again on each call: no guard needed
        if isinstance(var, V.IteratorVar):
            rest = var.drained()
            if rest is None:
                raise Fallback("an endless iterator (itertools.count, cycle) is live at the break",
                               self.ctx.loc)
            return ("iter", [self.spec(v) for v in rest])
        if isinstance(var, V.MethodVar):
            return ("method", self.spec(var.obj), var.name)
        if isinstance(var, V.BoundMethodVar):
            return ("bound", self.spec(var.func), self.spec(var.self_var))
        if isinstance(var, V.FunctionVar) and var.source is None:
            return ("fn", var.code, var.f_globals, [self.spec(d) for d in var.defaults],
                    {k: self.spec(v) for k, v in var.kwdefaults.items()},
                    [self.cell(c) for c in var.closure])
        if isinstance(var, ForeignExitVar):
            return ("exit_fn", ("s", var.source.expr()))
        if isinstance(var, V.UserExitVar):  # so that an exception the break raises reaches it
            return ("exit_fn", self.spec(var.exit))
        if isinstance(var, V.ExitVar):
            if var.ctx.kind not in _CONTEXTS:
                raise Fallback(f"a `with {var.ctx.kind}` block is active at the break", self.ctx.loc)
            return ("exit", var.ctx.kind, var.ctx.args)
        if isinstance(var, V.ContextVar):
            if var.kind not in _CONTEXTS:
                raise Fallback(f"context {var.kind} is live at the break", self.ctx.loc)
            return ("ctx", var.kind, var.args)
        if isinstance(var, V.CellVar):
            return self.cell(var)
        if var.source is None and (isinstance(var, V.DictVar | V.SetVar | V.UserObjVar)
                                   or (isinstance(var, V.ListVar) and not var.is_tuple)):
            # one object however many places hold it (a local and a call argument)
            key = self.shared.get(id(var))
            if key is None:
                key = self.shared[id(var)] = len(self.shared)
                self._keep.append(var)
            return ("shared", key, super().spec(var))
        return super().spec(var)

    def cell(self, cell: V.CellVar) -> Spec:
        if isinstance(cell.source, ClosureSource):
            return ("s", f"C[{cell.source.index}]")
        key = self.cell_keys.setdefault(id(cell), len(self.cell_keys))
        contents = None if cell.contents is V.UNBOUND else self.spec(cell.contents)
        return ("cell", key, contents)


def origin_of(code: types.CodeType, offset: int) -> tuple[types.CodeType, int]:
    """The user's code object and offset behind an offset of (possibly) a resume function."""
    found = ORIGIN.get(code)
    if found is None:
        return code, offset
    return found[0], found[1][offset]


def precheck(error: Unsupported) -> None:
    """Raise `Fallback` when the break cannot resume (the frame then runs eagerly)."""
    if not error.break_chain:
        raise Fallback("the break is not at an instruction", error.loc)
    if not getattr(error, "resumable", True) or error.internal:
        raise Fallback("capture gave up on this frame", error.loc)
    state = error.break_chain[-1]
    code, offset = origin_of(state.frame.code, state.instruction.offset)
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):  # generator, coroutine, async
        raise Fallback("graph break in a generator or coroutine", error.loc)
    insts, index_of = instructions(code)
    inst = insts[index_of[offset]]
    for start, end, target, _depth, _lasti in exception_table(code):
        if start <= offset < end and not is_with_handler(insts, index_of, target) and \
                not is_cleanup_handler(insts, index_of, target):
            raise Fallback("the break is inside a try block (its except/finally code must see "
                           "any exception the break raises)", error.loc)
    if stack_io(inst) is None:
        raise Fallback(f"cannot resume after {inst.opname}", error.loc)


def plan_break(ctx: Capture, error: Unsupported) -> BreakPlan:
    """Turn the outermost frame's state before a break into a plan. Raises
    `Fallback` when it cannot resume."""
    precheck(error)
    state = error.break_chain[-1]
    frame = state.frame
    code, offset = origin_of(frame.code, state.instruction.offset)
    insts, index_of = instructions(code)
    inst = insts[index_of[offset]]
    io = stack_io(inst)
    assert io is not None
    consumed, out_next, out_jump = io
    is_method = method_load(inst)
    exits = _exits(insts, index_of, inst, out_jump is not None)
    nodes, effects = state.mark
    _cut(ctx, nodes, effects)
    builder = LiveBuilder(ctx)
    # an UNBOUND slot is what CPython's LOAD_FAST_AND_CLEAR leaves: a NULL (3.12 comprehensions)
    stack = [None if v is V.NULL or v is V.UNBOUND else builder.spec(v) for v in state.stack]
    names = tuple(n for n in state.locals if not n.startswith(codegen.STACK_PREFIX)
                  and state.locals[n] is not V.UNBOUND)
    local_specs = [builder.spec(state.locals[n]) for n in names]
    cells = []
    for name in codegen.closure_names(code):
        cell = frame.cells.get(name)
        cells.append(builder.cell(cell) if cell is not None else ("cell", -1 - len(cells), None))
    builder.live = False
    effect_ops = builder.side_effects()
    active = [v for v in state.stack if isinstance(v, V.ExitVar) and v.ctx.kind in _GRAD_CONTEXTS]
    grad = bool(active[0].ctx.saved) if active else torch.is_grad_enabled()
    plan = BreakPlan(code=code, offset=offset, stack=stack, local_names=names, locals=local_specs,
                     cells=cells, kw_names=state.kw_names if inst.opname == "CALL" else (),
                     consumed=consumed, outs=(out_next + is_method, out_jump), exits=exits,
                     method_load=is_method, error=error, effect_ops=effect_ops,
                     grad_enabled=grad,
                     loop_step=inst.opname == "FOR_ITER" and isinstance(state.stack[-1], OpaqueVar))
    try:  # generate now: a failure here is a visible fallback, never a crash at run time
        _generate(plan)
    except Unsupported as e:
        raise Fallback(e.reason, error.loc) from e
    except Exception as e:
        raise Fallback(f"cannot generate the code to resume: {type(e).__name__}: {e}", error.loc) from e
    return plan


def is_user_break(result: Any) -> bool:
    """Whether a capture result's break is one the user wrote (not a resumed loop's step)."""
    return result.error is not None and not (result.plan is not None and result.plan.loop_step)


def _generate(plan: BreakPlan) -> None:
    below = len(plan.stack) - plan.consumed
    below_nulls = tuple(s is None for s in plan.stack[:below])
    operand_nulls = tuple(s is None for s in plan.stack[below:])
    # a method load runs alone as a plain attribute load: the NULL below is the layout's
    step_outs = (plan.outs[0] - plan.method_load, plan.outs[1])
    plan.step_code = codegen.step_code(plan.code, plan.offset, operand_nulls, plan.kw_names,
                                       step_outs, f"torchfuse_step_{plan.code.co_name}_at_{plan.offset}")
    layouts: list[tuple[bool, ...] | None] = []
    for exit_id, offset in enumerate(plan.exits):
        n = plan.outs[exit_id]
        if offset is None or n is None:
            layouts.append(None)
            continue
        if exit_id == 0 and plan.method_load:
            layout = (*below_nulls, True, *(False,) * (n - 1))
        else:
            layout = (*below_nulls, *(False,) * n)
        resume_code_for(plan.code, offset, layout, plan.local_names)
        layouts.append(layout)
    plan.layouts = tuple(layouts)


def _exits(insts: tuple, index_of: dict[int, int], inst: Any, jumps: bool) -> tuple[int | None, int | None]:
    def resumable(i: int) -> int | None:
        while i < len(insts) and insts[i].opname in BREAK_PROLOGUE - {"KW_NAMES", "PRECALL"}:
            i += 1
        return insts[i].offset if i < len(insts) else None

    nxt = resumable(index_of[inst.offset] + 1)
    if not jumps:
        return nxt, None
    target = index_of[inst.argval]
    if inst.opname == "FOR_ITER":
        target = for_iter_exit(insts, target)
    return nxt, resumable(target)


def _cut(ctx: Capture, nodes: int, effects: int) -> None:
    """Forget what a partly captured instruction (an inlined call that broke) recorded."""
    builder = ctx.rec.builder
    for node in builder.nodes[nodes:]:
        for out in node.outputs:
            builder.values.pop(out, None)
    del builder.nodes[nodes:]
    del ctx.side_effects[effects:]


# ----------------------------------------------------------------------------- resume functions


def wrap_resume_arg(ctx: Capture, value: Any, source: Source) -> V.Var:
    """How a resume function's capture sees its arguments: like any argument, except values
    only a break can make (iterators in a loop, ``with`` exits, bound methods, closures)."""
    if isinstance(value, torch.Tensor) or V.is_constant(value):
        return ctx.wrap(value, source)
    cls = type(value)
    if hasattr(cls, "__next__") and not isinstance(value, torch.nn.Module):
        ctx.guards.type_(source, cls)
        return OpaqueVar(value, source)
    if isinstance(value, types.MethodType):
        self_ = value.__self__
        kind = next((k for k, c in _GRAD_CONTEXTS.items() if type(self_) is c), None)
        if kind is not None and value.__func__.__name__ == "__exit__":
            ctx.guards.type_(AttrSource(source, "__self__"), type(self_))
            ctx.guards.constant(AttrSource(AttrSource(source, "__self__"), "prev"), self_.prev)
            cv = V.ContextVar(kind, (self_.mode,) if kind == "set_grad_enabled" else ())
            cv.saved = self_.prev
            return V.ExitVar(cv)
        if type(self_) is TransparentRange and value.__func__.__name__ == "__exit__":
            ctx.guards.type_(AttrSource(source, "__self__"), TransparentRange)
            return V.ExitVar(V.ContextVar(TRACE_RANGE, (self_.name,)))
        if value.__func__.__name__ == "__exit__":  # a with block whose __enter__ ran in Python
            ctx.guards.type_(AttrSource(source, "__self__"), type(self_))
            return ForeignExitVar(value, source)
        func = ctx.wrap(value.__func__, AttrSource(source, "__func__"))
        return V.BoundMethodVar(func, wrap_resume_arg(ctx, self_, AttrSource(source, "__self__")))
    if isinstance(value, types.BuiltinMethodType) and isinstance(value.__self__, torch.Tensor):
        return V.MethodVar(ctx.wrap(value.__self__, AttrSource(source, "__self__")), value.__name__)
    if isinstance(value, types.FunctionType) and value.__closure__ is not None:
        ctx.guards.identity(AttrSource(source, "__code__"), value.__code__)
        # cells with a source: writing one (``nonlocal``) is a break, run in Python on the real cell
        cells = tuple(V.CellVar(_cell_contents(ctx, c, src), src)
                      for i, c in enumerate(value.__closure__)
                      for src in [ItemSource(AttrSource(source, "__closure__"), i)])
        defaults = tuple(ctx.wrap(d, ItemSource(AttrSource(source, "__defaults__"), i))
                         for i, d in enumerate(value.__defaults__ or ()))
        kwdefaults = {k: ctx.wrap(d, ItemSource(AttrSource(source, "__kwdefaults__"), k))
                      for k, d in (value.__kwdefaults__ or {}).items()}
        fv = V.FunctionVar(value.__code__, value.__globals__, defaults, kwdefaults, cells,
                           value.__globals__ is ctx.f_globals)
        fv.source = source
        return fv
    return ctx.wrap(value, source)


def _cell_contents(ctx: Capture, cell: Any, source: Source) -> V.Var:
    try:
        value = cell.cell_contents
    except ValueError:
        return V.UNBOUND
    return ctx.wrap(value, AttrSource(source, "cell_contents"))


_RESUME_CODES: dict[tuple, types.CodeType] = {}


def resume_code_for(code: types.CodeType, offset: int, nulls: tuple[bool, ...],
                    local_names: tuple[str, ...]) -> types.CodeType:
    """The resume code object of ``code`` at ``offset`` for this layout (made once)."""
    key = (code, offset, nulls, local_names)
    out = _RESUME_CODES.get(key)
    if out is None:
        name = f"torchfuse_resume_{code.co_name}_at_{offset}"
        out, offsets = codegen.resume_code(code, offset, nulls, local_names, name)
        ORIGIN[out] = (code, offsets)
        _RESUME_CODES[key] = out
    return out


# ----------------------------------------------------------------------------- at run time


@dataclasses.dataclass(slots=True)
class Continue:
    """What a compiled entry that broke returns to the trampoline: call ``target`` next."""

    target: Any
    args: tuple[Any, ...]
    cells: tuple[Any, ...]


Builder = Callable[[list[Any], Any, Any, Any, dict], Any]


def build_fn(spec: Spec, ns: dict[str, Any]) -> Builder:
    """A function ``(O, L, G, C, memo) -> value`` for a spec (closures built once)."""
    tag = spec[0]
    if tag == "t":
        i = spec[1]
        return lambda o, L, G, C, m: o[i]
    if tag == "np":  # a traced numpy array live at the break: an ndarray again
        i, scalar = spec[1], spec[2]
        if scalar:
            return lambda o, L, G, C, m: o[i].numpy()[()]
        return lambda o, L, G, C, m: o[i].numpy()
    if tag == "c":
        value = spec[1]
        return lambda o, L, G, C, m: value
    if tag in ("s", "e"):  # a source, or a size expression over sources
        fn = eval(f"lambda L, G, C: {spec[1]}", dict(ns))
        return lambda o, L, G, C, m: fn(L, G, C)
    if tag == "seq":
        kind, parts = spec[1], [build_fn(s, ns) for s in spec[2]]
        return lambda o, L, G, C, m: V.make_sequence(kind, [p(o, L, G, C, m) for p in parts])
    if tag == "dict":
        cls, keys, parts = spec[1], spec[2], [build_fn(s, ns) for s in spec[3]]
        if cls is dict:
            return lambda o, L, G, C, m: {k: p(o, L, G, C, m) for k, p in zip(keys, parts, strict=True)}

        def mapping(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            items = {k: p(o, L, G, C, m) for k, p in zip(keys, parts, strict=True)}
            return cls(**items) if dataclasses.is_dataclass(cls) else cls(items)
        return mapping
    if tag == "obj":
        cls, attrs = spec[1], {k: build_fn(s, ns) for k, s in spec[2].items()}

        def obj(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            return new_object(cls, {k: p(o, L, G, C, m) for k, p in attrs.items()})
        return obj
    if tag == "iter":
        parts = [build_fn(s, ns) for s in spec[1]]
        return lambda o, L, G, C, m: iter([p(o, L, G, C, m) for p in parts])
    if tag == "method":
        base, name = build_fn(spec[1], ns), spec[2]
        return lambda o, L, G, C, m: getattr(base(o, L, G, C, m), name)
    if tag == "bound":
        func, self_ = build_fn(spec[1], ns), build_fn(spec[2], ns)
        return lambda o, L, G, C, m: types.MethodType(func(o, L, G, C, m), self_(o, L, G, C, m))
    if tag == "fn":
        code, f_globals = spec[1], spec[2]
        defaults = [build_fn(s, ns) for s in spec[3]]
        kwdefaults = {k: build_fn(s, ns) for k, s in spec[4].items()}
        cells = [build_fn(s, ns) for s in spec[5]]

        def fn_(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            f = types.FunctionType(code, f_globals, code.co_name,
                                   tuple(d(o, L, G, C, m) for d in defaults) or None,
                                   tuple(c(o, L, G, C, m) for c in cells) or None)
            if kwdefaults:
                f.__kwdefaults__ = {k: d(o, L, G, C, m) for k, d in kwdefaults.items()}
            return f
        return fn_
    if tag == "cell":
        key = spec[1]
        contents = build_fn(spec[2], ns) if spec[2] is not None else None

        def cell(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            found = m.get(key)
            if found is None:
                found = m[key] = types.CellType()
                if contents is not None:
                    found.cell_contents = contents(o, L, G, C, m)
            return found
        return cell
    if tag == "shared":
        key, inner = ("shared", spec[1]), build_fn(spec[2], ns)

        def shared(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            found = m.get(key, m)
            if found is m:
                found = m[key] = inner(o, L, G, C, m)
            return found
        return shared
    if tag == "exit_fn":
        return build_fn(spec[1], ns)
    if tag == "exit":
        make_ctx = _context_factory(spec[1], spec[2])

        def exit_(o: Any, L: Any, G: Any, C: Any, m: dict) -> Any:
            cm = make_ctx()
            cm.__enter__()
            return cm.__exit__
        return exit_
    if tag == "ctx":
        make_ctx = _context_factory(spec[1], spec[2])
        return lambda o, L, G, C, m: make_ctx()
    raise AssertionError(spec)


def _context_factory(kind: str, args: tuple[Any, ...]) -> Callable[[], Any]:
    cls = _CONTEXTS[kind]
    return lambda: cls(*args)


class BreakRunner:
    """The part of a compiled entry after its graph: rebuild, step, continue."""

    def __init__(self, plan: BreakPlan, ns: dict[str, Any], owner: Any) -> None:
        self.plan = plan
        self.owner = owner
        ns = {**ns, "sys": sys}
        self.stack = [None if s is None else build_fn(s, ns) for s in plan.stack]
        self.locals = [build_fn(s, ns) for s in plan.locals]
        self.cells = [build_fn(s, ns) for s in plan.cells]
        below = len(plan.stack) - plan.consumed
        self.below = below
        self.is_exit = [s is not None and s[0] in ("exit", "exit_fn") for s in plan.stack[:below]]
        self.step_code = plan.step_code
        self.f_globals = owner.globals
        self.step_fn = None if self.step_code.co_freevars else \
            codegen.make_function(self.step_code, self.f_globals, ())
        self.targets: list[Any] = [None, None]
        insts, index_of = instructions(plan.code)
        self.user_call = insts[index_of[plan.offset]].opname in ("CALL", "CALL_FUNCTION_EX") and \
            getattr(plan.error, "inside_call", False)

    def __call__(self, outs: list[Any], L: Any, G: Any, C: Any) -> Any:
        memo: dict = {}
        stack = [None if b is None else b(outs, L, G, C, memo) for b in self.stack]
        local_values = tuple(b(outs, L, G, C, memo) for b in self.locals)
        cells = tuple(b(outs, L, G, C, memo) for b in self.cells)
        operands = [v for v, b in zip(stack[self.below:], self.stack[self.below:], strict=True)
                    if b is not None]
        if self.user_call:  # the break is inside the called function: compile it on its own
            compiled = self.owner.callee(operands[0])
            if compiled is not None:
                operands[0] = compiled
        step = self.step_fn or codegen.make_function(self.step_code, self.f_globals, cells)
        try:
            results, exit_id = step(*operands)
        except BaseException:
            exc = sys.exc_info()
            for v, is_exit in reversed(list(zip(stack[:self.below], self.is_exit, strict=True))):
                if is_exit:
                    v(*exc)
            raise
        offset, layout = self.plan.exits[exit_id], self.plan.layouts[exit_id]
        if offset is None or layout is None:
            raise Unsupported("a graph break resumed past the end of the code")
        target = self.targets[exit_id]
        if target is None:
            target = self.targets[exit_id] = self.owner.resume_function(
                self.plan.code, offset, layout, self.plan.local_names)
        values = [v for v, b in zip(stack[:self.below], self.stack[:self.below], strict=True)
                  if b is not None]
        return Continue(target, (*values, *results, *local_values), cells)


__all__ = ["BreakPlan", "BreakRunner", "Continue", "Fallback", "OpaqueVar", "plan_break",
           "wrap_resume_arg"]
