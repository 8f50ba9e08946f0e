"""The reference interpreter: the living definition of what a Graph means.

``run(graph, *inputs)`` calls each node's ATen op eagerly, in order, and returns the graph's
outputs as a list. Every other consumer of a Graph (inductor, the runtime, autograd's
retracing) is tested against it.

:class:`Interpreter` is overridable, node by node, like ``torch.fx.Interpreter``: autograd
re-runs graphs on fake tensors through it, and tests can intercept single ops.

A Graph runs with **autocast off**. Capture records autocast's work as it happened: every cast
autocast inserted is a ``_to_copy`` node, and every op carries the dtype autocast gave it
(ops inside ``torch.autocast(enabled=False)`` regions or inside composite kernels, which
autocast leaves alone in eager, stay as they ran). Re-running those ops under an autocast that
is still enabled around the call would cast them a second time, and differently from eager
(an fp32 ``bmm`` of rotary embeddings would become bf16), so :meth:`Interpreter.run` and every
pass or compiled function that runs a Graph's ops does it inside :class:`no_autocast`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.ops import decode_arg, flatten_result, resolve_op


class InterpreterError(RuntimeError):
    """A node failed while the graph ran; the message names the node and its source line."""


def bind_symbols(symbols: Sequence[S.Symbol], inputs: Sequence[Any]) -> dict[str, int]:
    """Values of size symbols whose ``source`` is ``input:<i>.size(<d>)``."""
    env: dict[str, int] = {}
    for sym in symbols:
        src = sym.source or ""
        if src.startswith("input:") and ".size(" in src:
            idx, dim = src[len("input:"):].split(".size(")
            env[sym.name] = int(inputs[int(idx)].shape[int(dim.rstrip(")"))])
        elif sym.hint is not None:
            env[sym.name] = sym.hint
    return env


def _autocast_types() -> tuple[str, ...]:
    names = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu", "privateuseone")
    found = []
    for name in names:
        try:
            if torch.amp.is_autocast_available(name):
                torch.is_autocast_enabled(name)
                found.append(name)
        except (RuntimeError, ValueError, TypeError, AttributeError):
            continue
    return tuple(found)


AUTOCAST_DEVICE_TYPES: tuple[str, ...] = _autocast_types()
"""Device types this torch build has an autocast state for (``cpu``, ``cuda``, ...)."""


def device_types(graph: S.Graph) -> tuple[str, ...]:
    """The device types (``"cpu"``, ``"cuda"``) of ``graph``'s values, sorted: the ones whose
    autocast state can change what its ops compute."""
    return tuple(sorted({torch.device(m.device).type for m in graph.values.values()} or {"cpu"}))


class _AutocastOff:
    """Turns autocast off for ``types`` on entry and back on at exit."""

    __slots__ = ("_types",)

    def __init__(self, types: list[str]) -> None:
        self._types = types

    def __enter__(self) -> None:
        for d in self._types:
            torch.set_autocast_enabled(d, False)

    def __exit__(self, *exc: object) -> None:
        for d in self._types:
            torch.set_autocast_enabled(d, True)


_NOTHING_TO_DO = contextlib.nullcontext()


def no_autocast(device_types: Iterable[str] | None = None) -> contextlib.AbstractContextManager:
    """A context manager with autocast disabled, for the device types given (default: all),
    while a Graph's ops run; the state is restored on exit.

    The device types are read when it is made (``with no_autocast(): ...``). It costs one
    ``torch.is_autocast_enabled`` per device type when autocast is off, and only flips the
    enabled flag when it is on, so the nesting level and the cast cache of the enclosing
    ``torch.autocast`` are left alone.
    """
    types = AUTOCAST_DEVICE_TYPES if device_types is None else device_types
    on = [d for d in types if torch.is_autocast_enabled(d)]
    return _AutocastOff(on) if on else _NOTHING_TO_DO


class Interpreter:
    """Runs a Graph node by node, with autocast off (see the module doc). Override
    :meth:`call_node` to change how ops run."""

    def __init__(self, graph: S.Graph) -> None:
        self.graph = graph

    def call_node(self, node: S.Node, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return resolve_op(node.op)(*args, **kwargs)

    def run(self, *inputs: Any) -> list[Any]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise InterpreterError(
                f"graph {g.name!r} takes {len(g.inputs)} inputs "
                f"({', '.join(i.name for i in g.inputs)}), got {len(inputs)}"
            )
        env: dict[str, Any] = {inp.name: v for inp, v in zip(g.inputs, inputs, strict=True)}
        self.symbols = bind_symbols(g.symbols, inputs)
        with no_autocast():
            return self._run_nodes(env)

    def _run_nodes(self, env: dict[str, Any]) -> list[Any]:
        g = self.graph
        for node in g.nodes:
            args = [decode_arg(a, env, self.symbols) for a in node.args]
            kwargs = {k: decode_arg(a, env, self.symbols) for k, a in node.kwargs.items()}
            try:
                result = self.call_node(node, args, kwargs)
            except Exception as e:
                where = f" (from {node.loc}: {node.loc.text})" if node.loc and node.loc.text else (
                    f" (from {node.loc})" if node.loc else "")
                raise InterpreterError(f"node {node.name!r} [{node.op}] failed{where}: {e}") from e
            flat = flatten_result(result)
            if len(node.outputs) > len(flat):
                raise InterpreterError(
                    f"node {node.name!r} [{node.op}] returned {len(flat)} values, "
                    f"graph expects {len(node.outputs)}"
                )
            for name, value in zip(node.outputs, flat[: len(node.outputs)], strict=True):
                if name:
                    env[name] = value
        return [self.output_value(o.value, env) for o in g.outputs]

    def output_value(self, value: S.Argument, env: dict[str, Any]) -> Any:
        if isinstance(value, S.SymRef):
            return evaluate(value.expr, self.symbols)
        return decode_arg(value, env, self.symbols)


def run(graph: S.Graph, *inputs: Any) -> list[Any]:
    """Run ``graph`` eagerly on ``inputs``; returns the list of outputs.

    >>> run(graph, torch.ones(2), torch.ones(2))   # doctest: +SKIP
    [tensor([2., 2.])]
    """
    return Interpreter(graph).run(*inputs)
