"""``explain(fn)(*args)``: what capture makes of a function, without keeping anything.

Reports the graphs, graph breaks (reason, file, line, source text), ops per graph, guards
and capture time. Nothing is cached: the same call run through ``compile`` later captures
afresh.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture.convert import capture, make_binder
from torchfuse.capture.guards import describe
from torchfuse.graph import schema as S


@dataclasses.dataclass(frozen=True)
class BreakReason:
    """One graph break: why, and where in the user's code."""

    reason: str
    filename: str | None
    lineno: int | None
    text: str | None
    function: str | None = None

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}" if self.filename else "<unknown>"
        if self.function:
            where += f" in {self.function}"
        out = f"{self.reason}\n    at {where}"
        if self.text:
            out += f"\n      {self.text}"
        return out


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What :func:`explain` found."""

    graphs: list[S.Graph]
    break_reasons: list[BreakReason]
    guards: list[S.Guard]
    compile_time_s: float

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [[n.op for n in g.nodes] for g in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(len(g.nodes) for g in self.graphs)

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {self.op_count}",
                 f"Capture time: {self.compile_time_s * 1000:.1f} ms"]
        if self.break_reasons:
            lines.append("Break reasons:")
            for i, b in enumerate(self.break_reasons, 1):
                lines.append(f"  {i}. {b}")
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"Ops in graph {i}:")
            lines += [f"  {op}" for op in ops]
        if self.guards:
            lines.append("Guards:")
            lines += [f"  {describe(g)}" for g in self.guards]
        return "\n".join(lines)


def explain(fn: Callable[..., Any]) -> Callable[..., Explanation]:
    """``explain(fn)(*args, **kwargs)`` captures ``fn`` for these arguments and reports."""
    from torchfuse.capture.compiler import CompiledFunction, CompiledModule

    bound_self = None
    if isinstance(fn, CompiledModule):
        fn = fn._orig_mod
    if isinstance(fn, CompiledFunction):
        bound_self, fn = fn.bound_self, fn.fn
    if isinstance(fn, torch.nn.Module):
        bound_self, fn = fn, type(fn).forward
    elif isinstance(fn, types.MethodType):
        bound_self, fn = fn.__self__, fn.__func__
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"explain() takes a function or module, not {type(fn).__name__}")
    func: types.FunctionType = fn

    def run(*args: Any, **kwargs: Any) -> Explanation:
        if bound_self is not None:
            args = (bound_self, *args)
        L = make_binder(func)(*args, **kwargs)
        result = capture(func, L, func.__qualname__)
        graphs = [result.graph] if result.graph is not None else []
        breaks = []
        if result.error is not None:
            loc = result.error.loc
            breaks.append(BreakReason(result.error.reason, loc.file if loc else None,
                                      loc.line if loc else None, loc.text if loc else None,
                                      loc.function if loc else None))
        guards = list(result.checks.entries and [e.record for e in result.checks.entries])
        return Explanation(graphs, breaks, guards, result.seconds)

    return run
