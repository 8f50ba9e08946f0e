"""Which size symbols a Graph uses, and which of its own inputs carries each.

A Graph cut out of another (the backward half of a joint graph, a custom Function's
backward, a checkpointed region) starts with the symbols of the graph it came from, whose
sources (``input:<k>.size(<d>)``) name that graph's inputs. `used_symbols` says which it
still mentions, and `carrier` finds the source that binds one from the cut graph's own
inputs.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchfuse.graph import schema as S
from torchfuse.graph.expr import free_symbols


def used_symbols(graph: S.Graph) -> set[str]:
    """Names of the size symbols ``graph``'s values, node arguments (lists included) and
    outputs mention."""
    exprs: list[S.Expr] = []
    for m in graph.values.values():
        exprs += [*m.sizes, *m.strides, m.storage_offset]

    def walk(args: Iterable[S.Argument]) -> None:
        for a in args:
            if isinstance(a, S.SymRef):
                exprs.append(a.expr)
            elif isinstance(a, S.ListArg):
                walk(a.items)

    for n in graph.nodes:
        walk([*n.args, *n.kwargs.values()])
    walk([o.value for o in graph.outputs])
    return set().union(*(free_symbols(e) for e in exprs if isinstance(e, str)))


def carrier(graph: S.Graph, symbol: str) -> str | None:
    """``input:<k>.size(<d>)`` of ``graph``'s first input whose size at ``d`` is exactly
    ``symbol``; None when no input has it as a size."""
    for k, inp in enumerate(graph.inputs):
        for d, n in enumerate(graph.values[inp.name].sizes):
            if n == symbol:
                return f"input:{k}.size({d})"
    return None
