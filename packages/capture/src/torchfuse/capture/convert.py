"""Capturing one call of a function: bytecode in, Graph + guards + side effects out.

The pipeline, in order:

1. ``bind``        arguments to the function's locals (the generated binder);
2. ``wrap``        each argument, closure cell into a Var (tensors become graph inputs);
3. ``interpret``   the bytecode symbolically ([`Frame`][torchfuse.capture.frame.Frame]);
4. ``outputs``     flatten the return value and side effects into specs + graph outputs;
5. ``guards``      generate the check functions.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import time
import types
from collections.abc import Callable
from typing import Any

import msgspec
import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import Capture, InputSlot
from torchfuse.capture.dynamic import DynamicPolicy, bind_scalar_arguments, bind_size_arguments
from torchfuse.capture.errors import DynamicShapeError, Unsupported
from torchfuse.capture.frame import Frame
from torchfuse.capture.guards import CheckFunctions, autocast_state, storage_groups
from torchfuse.capture.output import OutputBuilder, Spec
from torchfuse.capture.pyrandom import DrawNeeded
from torchfuse.capture.source import (
    ClosureSource,
    FloatCarrierSource,
    FromNumpySource,
    LocalSource,
    ScalarCarrierSource,
)
from torchfuse.graph import schema as S
from torchfuse.graph.ops import resolve_op
from torchfuse.graph.symbolic import SpecializationError
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED, records_grad
from torchfuse.graph.tracing import is_view_op, mutated_arguments, no_user_saved_tensor_hooks


@dataclasses.dataclass
class CaptureResult:
    """What capturing one call produced. ``error`` is the graph break met, if any: with a
    ``plan`` capture resumes after it, without one the frame runs eagerly."""

    name: str
    graph: S.Graph | None
    inputs: list[InputSlot]
    out_spec: Spec | None
    side_effects: list[tuple]
    checks: CheckFunctions
    error: Unsupported | None
    seconds: float
    uses_modules: bool
    plan: Any = None
    """A [`BreakPlan`][torchfuse.capture.resume.BreakPlan] when ``error`` is a graph break that
    resumes: ``graph`` is then the graph up to the break."""
    part: bool = False
    """Captured from a resume function or a function called at a break (not the whole call)."""
    dynamic_dims: dict[tuple[str, int], str] = dataclasses.field(default_factory=dict)
    """(source expression, dim) -> the size symbol that input dim was captured as."""
    scalar_symbols: dict[str, str] = dataclasses.field(default_factory=dict)
    """Int arguments captured as symbols: source expression (``L[1]``) -> symbol name."""
    effect_notes: list[Any] = dataclasses.field(default_factory=list)
    """One [`EffectNote`][torchfuse.capture.output.EffectNote] per entry of ``side_effects`` (the
    whole-function capture only)."""
    grad_entry: bool = False
    """Called with grad mode off, the code turns it on (``with torch.enable_grad():``): the
    graph then starts by switching grad off and runs with grad mode on, so that backends,
    which decide from the mode at entry whether to record a backward, record one."""
    ddp_plan: Any = None
    """A [`BucketPlan`][torchfuse.capture.distributed.BucketPlan] when the graph was captured
    inside a DDP forward: where it was cut into pieces, one per gradient bucket."""
    random_generators: list[Any] = dataclasses.field(default_factory=list)
    """The ``random.Random`` s that gathering this graph's inputs draws from (`pyrandom`)."""
    codes: frozenset[types.CodeType] = frozenset()
    """Every code object capture interpreted: the function and what it inlined."""
    from_disk: bool = False
    """Rebuilt from an entry an earlier process kept (`torchfuse.capture.entry_cache`), not
    captured: nothing was interpreted."""
    debug_name: str = ""
    """The folder its artifacts go to (``<function>/entry_<n>``, given when it is recorded;
    see ``torchfuse.graph.observe.entry_folder``)."""


def varkw_index(code: types.CodeType) -> int | None:
    """The local slot of a function's ``**kwargs``, or ``None`` when it has none."""
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return None
    return code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)


def code_signature(fn: types.FunctionType) -> inspect.Signature:
    """The signature Python binds a call of ``fn`` by: its code's parameters and its defaults,
    whatever ``__signature__`` or ``__wrapped__`` claim (a decorator's ``*args, **kwargs``
    wrapper may carry the signature of the function it wraps: transformers'
    ``use_kernel_forward_from_hub`` functions)."""
    code = fn.__code__
    names = code.co_varnames
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    P = inspect.Parameter
    params = []
    for i, name in enumerate(names[:npos]):
        kind = P.POSITIONAL_ONLY if i < code.co_posonlyargcount else P.POSITIONAL_OR_KEYWORD
        d = i - (npos - len(defaults))
        params.append(P(name, kind, default=defaults[d] if d >= 0 else P.empty))
    at = npos + nkw
    if code.co_flags & inspect.CO_VARARGS:
        params.append(P(names[at], P.VAR_POSITIONAL))
        at += 1
    for name in names[npos:npos + nkw]:
        params.append(P(name, P.KEYWORD_ONLY, default=kwdefaults.get(name, P.empty)))
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append(P(names[at], P.VAR_KEYWORD))
    return inspect.Signature(params)


def make_binder(fn: types.FunctionType) -> Callable[..., tuple[Any, ...]]:
    """A function with ``fn``'s signature returning its arguments as a tuple in
    ``co_varnames`` order: binding at C speed, the same errors as calling ``fn``."""
    sig = code_signature(fn)
    parts: list[str] = []
    ns: dict[str, Any] = {}
    names: list[str] = []
    had_posonly = False
    star_done = False
    for p in sig.parameters.values():
        if p.kind is p.POSITIONAL_ONLY:
            had_posonly = True
        elif had_posonly:
            parts.append("/")
            had_posonly = False
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text = "*" + p.name
            star_done = True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        if p.default is not p.empty:
            ns[f"_d_{p.name}"] = p.default
            text += f"=_d_{p.name}"
        parts.append(text)
        names.append(p.name)
    if had_posonly:
        parts.append("/")
    code = fn.__code__
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    order = code.co_varnames[:n]
    src = f"def bind({', '.join(parts)}):\n    return ({''.join(v + ', ' for v in order)})\n"
    exec(compile(src, "<torchfuse binder>", "exec"), ns)
    binder = ns["bind"]
    binder.__name__ = binder.__qualname__ = code.co_name  # errors name the user's function
    # the very tuple and dict of fn: an entry's guards check them by identity, and a miss
    # with ``fn.__defaults__`` / ``__kwdefaults__`` replaced makes the binder anew
    if binder.__defaults__ == fn.__defaults__:
        binder.__defaults__ = fn.__defaults__
    if binder.__kwdefaults__ == fn.__kwdefaults__:
        binder.__kwdefaults__ = fn.__kwdefaults__
    return binder


def def_location(fn: types.FunctionType) -> S.SourceLoc:
    from torchfuse.capture.codegen import user_code

    code = user_code(fn.__code__)  # a resume function: the user's def line
    text = linecache.getline(code.co_filename, code.co_firstlineno).strip() or None
    return S.SourceLoc(file=code.co_filename, line=code.co_firstlineno, function=code.co_qualname,
                       text=text)


def capture(fn: types.FunctionType, L: tuple[Any, ...], name: str, *,
            wrap_arg: Callable[..., V.Var] | None = None,
            dynamic: DynamicPolicy | None = None) -> CaptureResult:
    """Interpret ``fn`` on the bound arguments ``L``; never raises Unsupported.

    A graph break that can resume yields the graph up to it plus a resume plan
    ([`torchfuse.capture.resume`][torchfuse.capture.resume]); ``wrap_arg(ctx, value, source)`` replaces
    ``ctx.wrap`` for the arguments (resume functions receive iterators, exits...).
    ``dynamic`` says which input sizes are symbolic (default: only ``mark_dynamic`` ones).
    Raises [`DynamicShapeError`][torchfuse.capture.errors.DynamicShapeError] when the code makes a
    ``mark_dynamic`` size constant."""
    try:
        with no_user_saved_tensor_hooks():  # the caller's would be handed fakes
            return _capture(fn, L, name, wrap_arg, dynamic)
    except SpecializationError as e:
        if isinstance(e, DynamicShapeError):
            raise
        raise DynamicShapeError(e, getattr(e, "loc", None)) from e


def _capture(fn: types.FunctionType, L: tuple[Any, ...], name: str,
             wrap_arg: Callable[..., V.Var] | None, dynamic: DynamicPolicy | None) -> CaptureResult:
    t0 = time.perf_counter()
    code = fn.__code__
    grad = torch.is_grad_enabled()
    stop: tuple[int, Unsupported] | None = None
    break_draws: set[int] = set()
    while True:  # twice when a break resumes: the second run stops cleanly before it
        ctx = Capture(name, fn.__globals__, fn.__closure__, dynamic)
        ctx.break_draws = break_draws
        ctx.entry_grad = grad
        out_spec = None
        effects: list[tuple] = []
        notes: list[Any] = []
        graph = None
        error: Unsupported | None = None
        plan = None
        again = False
        with ctx.active():
            ctx.loc = def_location(fn)
            ctx.guards.grad_mode(grad)
            ctx.guards.autocast(autocast_state())
            ctx.guards.default_dtype(torch.get_default_dtype())
            if fn.__defaults__ is not None or fn.__kwdefaults__ is not None:
                ctx.guards.defaults(fn)  # the binder bound these: replacing them recompiles
            try:
                wrap = ctx.wrap if wrap_arg is None else (lambda v, src, c=ctx: wrap_arg(c, v, src))
                local_vars = {nm: wrap(v, LocalSource(i, nm))
                              for i, (nm, v) in enumerate(zip(code.co_varnames, L, strict=False))}
                if wrap_arg is not None:  # a resume function: sizes computed before the break
                    bind_size_arguments(ctx, local_vars)
                elif varkw_index(code) is not None:  # the binder makes **kwargs anew
                    ctx.fresh_locals.add(varkw_index(code))
                bind_scalar_arguments(ctx, local_vars)
                cells = {}
                for i, (nm, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or (), strict=True)):
                    try:
                        contents = ctx.wrap(cell.cell_contents, ClosureSource(i, nm))
                    except ValueError:
                        contents = V.UNBOUND
                    cells[nm] = V.CellVar(contents, ClosureSource(i, nm))
                frame = Frame(ctx, code, fn.__globals__, local_vars, cells)
                frame.stop = stop
                ret = frame.run()
                ctx.loc = None
                builder = OutputBuilder(ctx)
                out_spec = builder.spec(ret)
                effects = builder.side_effects()
                notes = builder.effect_notes
                graph = _finish(ctx, name)
            except Unsupported as e:
                error = e
                if isinstance(e, DrawNeeded) and e.ordinal not in break_draws:
                    # Python needs a random draw's value: start over, breaking at the draw
                    break_draws.add(e.ordinal)
                    stop = None
                    again = True
                elif stop is None and _resumable(e):
                    # capture again, stopping before the breaking instruction: what it did
                    # before raising (an inlined call that broke deep inside) leaves no trace
                    at = Unsupported(e.reason, e.loc, e.hint)
                    at.inside_call = len(e.break_chain) > 1 or e.compile_callee
                    stop = (e.break_chain[-1].step, at)
                    first = e
                    again = True
                else:
                    try:
                        plan = _plan(ctx, e)
                    except DrawNeeded as live:  # a draw live at the break: break at the draw
                        plan = None
                        e.fallback = f"cannot resume: {live.reason}"
                        if live.ordinal not in break_draws:
                            break_draws.add(live.ordinal)
                            stop, again = None, True
                            continue
                    if stop is not None:
                        error = stop[1].original = first  # the user sees the real break
                        error.fallback = getattr(e, "fallback", None)
                    if plan is not None:
                        effects = plan.effect_ops
                        graph = _finish(ctx, name)
            finally:
                ctx.close_contexts()
                torch.set_grad_enabled(grad)
                # Under an autocast region opened by the caller, torch code run on the real
                # parameters (nn.Linear's forward) cached their casts, which are fakes here:
                # Python that runs in the same region after capture must not be handed them.
                torch.clear_autocast_cache()
        if not again:
            break
    if ctx.overlap and graph is not None:
        error, plan, graph, effects = _overlap_error(ctx, fn), None, None, []
        error.fallback = "inputs share memory"
    return CaptureResult(name=name, graph=graph, inputs=ctx.inputs, out_spec=out_spec,
                         side_effects=effects, checks=ctx.guards.build(), error=error,
                         seconds=time.perf_counter() - t0, uses_modules=ctx.uses_modules,
                         plan=plan, dynamic_dims=dict(ctx.dynamic_dims), effect_notes=notes,
                         scalar_symbols=dict(ctx.scalar_symbols),
                         grad_entry=ctx.grad_entry, random_generators=list(ctx.random_generators),
                         codes=frozenset(ctx.codes))


def _finish(ctx: Capture, name: str) -> S.Graph:
    ctx.sync_constants()
    builder = ctx.rec.builder
    if not ctx.entry_grad and records_grad(builder, grad_enabled_at_entry=False):
        builder.add_node(SET_GRAD_ENABLED, [S.Bool(value=False)], {}, [])
        builder.nodes.insert(0, builder.nodes.pop())  # see CaptureResult.grad_entry
        ctx.grad_entry = True
    # a tensor made of an ndarray argument, or a carrier of a number, is a new object on
    # every call: never one of these (evaluating a random draw's carrier would draw)
    tensor_args = [s.source for s in ctx.inputs if s.kind == "user_input" and s.source is not None
                   and not isinstance(s.source, FromNumpySource | ScalarCarrierSource | FloatCarrierSource)]
    if len(tensor_args) > 1:
        ctx.guards.distinct(tensor_args)
    _guard_overlap(ctx)
    for g in ctx.size_env.guard_records():  # after every tensor guard: they bind the symbols
        ctx.guards.symbol(g)
    graph = ctx.rec.builder.build()
    return msgspec.structs.replace(graph, name=name, guards=ctx.guards.records())


def _writes_to_inputs(builder: Any) -> bool:
    """Whether an op writes in place into a user input or a view of one."""
    root = {i.name: i.name for i in builder.inputs if i.kind == "user_input"}
    for n in builder.nodes:
        if not n.op.startswith("aten."):
            continue
        op = resolve_op(n.op)
        written = [n.args[k] for k in mutated_arguments(op) if k < len(n.args)]
        if any(isinstance(a, S.TensorRef) and a.name in root for a in written):
            return True
        if is_view_op(op) and n.args and isinstance(n.args[0], S.TensorRef) and n.args[0].name in root:
            for out in n.outputs:
                if out:
                    root[out] = root[n.args[0].name]
    return False


def _guard_overlap(ctx: Capture) -> None:
    """A graph that writes into an input is correct only for inputs that do not share memory
    (the backends functionalize it: each input is read as it was at entry). Its entry is guarded
    on which inputs share storage; when some do, ``ctx.overlap`` says which, and that entry
    runs the function in Python (`_overlap_error`), where writes through one view are
    seen through the others, as in eager."""
    if len(ctx.input_tensors) < 2 or not _writes_to_inputs(ctx.rec.builder):
        return
    sources = [s for s, _ in ctx.input_tensors]
    groups = storage_groups(tuple(t for _, t in ctx.input_tensors))
    ctx.guards.storage(sources, groups)
    shared = [(sources[g].expr(), sources[i].expr()) for i, g in enumerate(groups) if g != i]
    if shared:
        ctx.overlap = shared


def _overlap_error(ctx: Capture, fn: types.FunctionType) -> Unsupported:
    pairs = ", ".join(f"{a} and {b}" for a, b in ctx.overlap)
    return Unsupported(f"inputs that share memory ({pairs}) with a write in place: this entry "
                       f"runs in Python, as eager does", def_location(fn),
                       "pass tensors that do not overlap to run the compiled graph")


def _resumable(error: Unsupported) -> bool:
    from torchfuse.capture.resume import Fallback, precheck

    try:
        precheck(error)
    except Fallback as why:
        error.fallback = why.reason
        return False
    return True


def _plan(ctx: Capture, error: Unsupported) -> Any:
    """The resume plan of a graph break, or ``None`` (then the frame runs eagerly; the
    reason it cannot resume is kept on the error as ``fallback``)."""
    from torchfuse.capture.resume import Fallback, plan_break

    try:
        return plan_break(ctx, error)
    except DrawNeeded:
        raise  # the resume would need a random draw's value: capture starts over (above)
    except Unsupported as why:
        error.fallback = why.reason if isinstance(why, Fallback) else f"cannot resume: {why.reason}"
        return None
