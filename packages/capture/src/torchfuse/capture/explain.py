"""``explain(fn)(*args)``: what capture makes of a function, without keeping anything.

Reports the graphs, graph breaks (reason, file, line, source text), ops per graph, guards
and capture time. Since capture resumes after a break, finding *every* break means running
the call: explain compiles ``fn`` afresh with the ``eager`` backend, runs it once on the
arguments (so the function's own side effects, a ``print`` say, do happen), and reports
every capture made on the way; an exception the call raises is swallowed, the report then
stops where it happened. Nothing is cached for later calls.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture.errors import call_stack
from torchfuse.graph import schema as S
from torchfuse.graph.printer import describe_guard


@dataclasses.dataclass(frozen=True)
class BreakReason:
    """One graph break: why, and where in the user's code."""

    reason: str
    filename: str | None
    lineno: int | None
    text: str | None
    function: str | None = None
    fallback: str | None = None
    """Set when capture could not resume after this break: why the frame runs eagerly."""
    stack: tuple[str, ...] = ()
    """For a break inside calls: ``file:line in function`` of each call that led to it,
    outermost first (the break's own line is ``filename``/``lineno``)."""

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}" if self.filename else "<unknown>"
        if self.function:
            where += f" in {self.function}"
        out = f"{self.reason}\n    at {where}"
        if self.text:
            out += f"\n      {self.text}"
        if self.stack:
            out += "\n    called from (outermost first):" + "".join(f"\n      {s}" for s in self.stack)
        if self.fallback:
            out += f"\n    not resumed, the frame runs eagerly: {self.fallback}"
        return out


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What [`explain`][torchfuse.capture.explain.explain] found; ``str()`` of it is a readable report."""

    graphs: list[S.Graph]
    """Every graph captured, in the order the call reached them."""
    break_reasons: list[BreakReason]
    """Each distinct graph break: reason, file, line, source text and the calls leading to it."""
    guards: list[S.Guard]
    """The guards of every graph: what must hold for a compiled entry to be reused."""
    compile_time_s: float
    """Seconds spent capturing (the backend is ``eager``: no compile time of its own)."""
    pieces: list[int] = dataclasses.field(default_factory=list)
    """Per graph, how many pieces it is compiled as: 1, or one per gradient bucket for a
    graph captured inside a DDP forward ([`torchfuse.capture.distributed`][torchfuse.capture.distributed])."""

    @property
    def graph_count(self) -> int:
        """How many graphs the call captured."""
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        """How many distinct graph breaks it met."""
        return len(self.break_reasons)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        """The ops (``aten.add.Tensor`` …) of each graph, in node order."""
        return [[n.op for n in g.nodes] for g in self.graphs]

    @property
    def op_count(self) -> int:
        """The number of nodes over all graphs."""
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
        if any(n > 1 for n in self.pieces):
            lines.append(f"Pieces per graph (DDP buckets): {self.pieces}")
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"Ops in graph {i}:")
            lines += [f"  {op}" for op in ops]
        if self.guards:
            lines.append("Guards:")
            lines += [f"  {describe_guard(g)}" for g in self.guards]
        return "\n".join(lines)


def explain(fn: Callable[..., Any]) -> Callable[..., Explanation]:
    """What capture makes of ``fn``: ``explain(fn)(*args, **kwargs)`` reports, keeping nothing.

    The returned function compiles ``fn`` afresh with the ``eager`` backend, runs it once on
    its arguments (so the function's own side effects happen) and reports every capture made
    on the way. An exception the call raises is swallowed; the report stops where it happened.

    Args:
        fn: A function, a bound method, an ``nn.Module``, or what
            [`compile`][torchfuse.capture.compile] returned for one (its ``dynamic`` setting is
            kept).

    Returns:
        A function taking ``fn``'s arguments and returning an
        [`Explanation`][torchfuse.capture.Explanation]: graph and break counts, each break's
        reason and source line, the ops per graph, the guards and the capture time.

    Raises:
        TypeError: ``fn`` is not a function, method or module.
        DynamicShapeError: A ``mark_dynamic`` request could not be kept (raised by the call).

    Examples:
        >>> import torch
        >>> from torchfuse.capture import explain
        >>> def f(x):
        ...     y = x.sin()
        ...     print("in the middle")        # a graph break: capture resumes after it
        ...     return y.cos()
        >>> report = explain(f)(torch.randn(3))
        in the middle
        >>> report.graph_count, report.graph_break_count
        (2, 1)
        >>> report.ops_per_graph
        [['aten.sin.default'], ['aten.cos.default']]
    """
    from torchfuse.capture.compiler import CompiledFunction, CompiledModule

    bound_self = None
    dynamic: bool | None = None
    if isinstance(fn, CompiledModule):
        dynamic = fn._compiled.dynamic
        fn = fn._orig_mod
    if isinstance(fn, CompiledFunction):
        bound_self, fn, dynamic = fn.bound_self, fn.fn, fn.dynamic
    if isinstance(fn, torch.nn.Module):
        bound_self, fn = fn, type(fn).forward
    elif isinstance(fn, types.MethodType):
        bound_self, fn = fn.__self__, fn.__func__
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"explain() takes a function or module, not {type(fn).__name__}")
    func: types.FunctionType = fn

    def run(*args: Any, **kwargs: Any) -> Explanation:
        results = collect(func, bound_self, args, kwargs, dynamic)
        from torchfuse.capture.compiler import counts_as_graph

        graphs = [r.graph for r in results if counts_as_graph(r)]
        guards = [e.record for r in results for e in r.checks.entries]
        pieces = [len(r.ddp_plan.cuts) + 1 if r.ddp_plan is not None else 1
                  for r in results if counts_as_graph(r)]
        return Explanation(graphs, break_reasons(results), guards, sum(r.seconds for r in results),
                           pieces)

    return run


def collect(func: types.FunctionType, bound_self: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any], dynamic: bool | None = None) -> list[Any]:
    """Run ``func`` once through a fresh eager-backend compile; every capture it made.
    ``dynamic`` is the ``compile`` setting (a compiled function's own, when explained)."""
    from torchfuse.capture.compiler import CompiledFunction
    from torchfuse.capture.errors import DynamicShapeError

    cf = CompiledFunction(func, backend="eager", fullgraph=False, dynamic=dynamic, mode=None,
                          options=None, bound_self=bound_self)
    cf._warned_eager = True  # explain reports its breaks itself
    try:
        cf(*args, **kwargs)
    except DynamicShapeError:
        raise  # capture's own answer about this call, not the user's error: say it
    except Exception:  # the user's own error: report what was captured up to it
        pass
    results = list(cf.results)
    cf.reset()
    return results


def break_reasons(results: list[Any]) -> list[BreakReason]:
    """Each distinct graph break of these captures, in the order they were met."""
    out: list[BreakReason] = []
    seen: set[tuple] = set()
    from torchfuse.capture.resume import is_user_break

    for r in results:
        err = r.error
        if not is_user_break(r):
            continue
        loc = err.loc
        key = (err.reason, loc.file if loc else None, loc.line if loc else None)
        if key in seen:
            continue
        seen.add(key)
        out.append(BreakReason(err.reason, loc.file if loc else None, loc.line if loc else None,
                               loc.text if loc else None, loc.function if loc else None,
                               None if r.plan is not None else getattr(err, "fallback", None),
                               call_stack(err)))
    return out
