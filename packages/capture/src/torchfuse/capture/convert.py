"""Capturing one call of a function: bytecode in, Graph + guards + side effects out.

The pipeline, in order:

1. ``bind``        arguments to the function's locals (the generated binder);
2. ``wrap``        each argument, closure cell into a Var (tensors become graph inputs);
3. ``interpret``   the bytecode symbolically (:class:`~torchfuse.capture.frame.Frame`);
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
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.frame import Frame
from torchfuse.capture.guards import CheckFunctions, autocast_state
from torchfuse.capture.output import OutputBuilder, Spec
from torchfuse.capture.source import ClosureSource, LocalSource
from torchfuse.graph import schema as S


@dataclasses.dataclass
class CaptureResult:
    """What capturing one call produced. ``error`` is set when the frame must run eagerly."""

    name: str
    graph: S.Graph | None
    inputs: list[InputSlot]
    out_spec: Spec | None
    side_effects: list[tuple]
    checks: CheckFunctions
    error: Unsupported | None
    seconds: float
    uses_modules: bool


def make_binder(fn: types.FunctionType) -> Callable[..., tuple[Any, ...]]:
    """A function with ``fn``'s signature returning its arguments as a tuple in
    ``co_varnames`` order: binding at C speed, the same errors as calling ``fn``."""
    sig = inspect.signature(fn)
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
    return binder


def def_location(fn: types.FunctionType) -> S.SourceLoc:
    code = fn.__code__
    text = linecache.getline(code.co_filename, code.co_firstlineno).strip() or None
    return S.SourceLoc(file=code.co_filename, line=code.co_firstlineno, function=code.co_qualname,
                       text=text)


def capture(fn: types.FunctionType, L: tuple[Any, ...], name: str) -> CaptureResult:
    """Interpret ``fn`` on the bound arguments ``L``; never raises Unsupported."""
    t0 = time.perf_counter()
    code = fn.__code__
    ctx = Capture(name, fn.__globals__, fn.__closure__)
    grad = torch.is_grad_enabled()
    out_spec = None
    effects: list[tuple] = []
    graph = None
    error: Unsupported | None = None
    with ctx.active():
        ctx.loc = def_location(fn)
        ctx.guards.grad_mode(grad)
        ctx.guards.autocast(autocast_state())
        try:
            local_vars = {nm: ctx.wrap(v, LocalSource(i, nm))
                          for i, (nm, v) in enumerate(zip(code.co_varnames, L, strict=False))}
            cells = {}
            for i, (nm, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or (), strict=True)):
                try:
                    contents = ctx.wrap(cell.cell_contents, ClosureSource(i, nm))
                except ValueError:
                    contents = V.UNBOUND
                cells[nm] = V.CellVar(contents, ClosureSource(i, nm))
            frame = Frame(ctx, code, fn.__globals__, local_vars, cells)
            ret = frame.run()
            ctx.loc = None
            builder = OutputBuilder(ctx)
            out_spec = builder.spec(ret)
            effects = builder.side_effects()
            ctx.sync_constants()
            tensor_args = [s.source for s in ctx.inputs if s.kind == "user_input" and s.source is not None]
            if len(tensor_args) > 1:
                ctx.guards.distinct(tensor_args)
            graph = ctx.rec.builder.build()
            graph = msgspec.structs.replace(graph, name=name, guards=ctx.guards.records())
        except Unsupported as e:
            error = e
        finally:
            torch.set_grad_enabled(grad)
    return CaptureResult(name=name, graph=graph, inputs=ctx.inputs, out_spec=out_spec,
                         side_effects=effects, checks=ctx.guards.build(), error=error,
                         seconds=time.perf_counter() - t0, uses_modules=ctx.uses_modules)
