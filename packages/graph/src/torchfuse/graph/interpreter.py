"""The reference interpreter: the living definition of what a Graph means.

``run(graph, *inputs)`` calls each node's ATen op eagerly, in order, and returns the graph's
outputs as a list. Every other consumer of a Graph (inductor, the runtime, autograd's
retracing) is tested against it.

:class:`Interpreter` is overridable, node by node, like ``torch.fx.Interpreter``: autograd
re-runs graphs on fake tensors through it, and tests can intercept single ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


class Interpreter:
    """Runs a Graph node by node. Override :meth:`call_node` to change how ops run."""

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
