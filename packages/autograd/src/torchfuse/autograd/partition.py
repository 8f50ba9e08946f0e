"""Partition a joint graph into a forward and a backward graph.

The forward graph computes the user outputs plus the *saved values*; the backward graph takes
the saved values and the tangents and computes the gradients. Which values to save is the
whole question:

* ``"save_all"``: every forward value the backward reads is saved; nothing is recomputed.
* ``"min_cut"`` (default): choose the saved set with the fewest bytes, letting the backward
  recompute cheap forward ops (pointwise, views, casts, reductions, factories; see
  `torchfuse.autograd.opclass`) from what was saved. Matmuls and random ops are never
  recomputed. This is a minimum s-t cut: every forward value ``v`` is an edge
  ``v_in -> v_out`` whose capacity is its size in bytes; the source feeds the primals and
  every op that may not be recomputed; every value the backward reads drains to the sink.
  The cut edges are the saved values.

``memory_budget`` below 1 asks for at most ``memory_budget * bytes(save_all)`` saved bytes;
when the cheap-op cut exceeds it, indexing and other non-matmul, non-random ops become
recomputable too ([`RECOMPUTE_TIERS`][torchfuse.autograd.opclass.RECOMPUTE_TIERS]). The best cut found is
returned even when the budget cannot be met.

Backward graph inputs are the saved values (kind ``user_input``; their number is in
``meta["autograd.num_saved"]``) followed by the tangents.

Symbolic sizes: both halves keep the joint graph's symbols, and each must bind them from its
own inputs. The forward's inputs are the primals, so the joint graph's sources hold; the
backward keeps only the symbols it uses, each with the source ``input:<k>.size(<d>)`` of a
saved value or tangent whose size ``d`` is exactly that symbol. When none is (the backward of
``x.sum()`` saves nothing but needs ``x``'s sizes), the primal that defines the symbol is
saved as well, and the cut is taken again with that primal free, so the backward recomputes
from it what it can. Byte sizes for the cut are evaluated at the symbols' hints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec
import networkx as nx
from torchfuse.autograd.common import AutogradError, nbytes, symbol_hints
from torchfuse.autograd.joint import num_fwd_outputs as _num_fwd_outputs
from torchfuse.autograd.opclass import CHEAP, RECOMPUTE_TIERS, OpClass, classify, recomputable
from torchfuse.graph import schema as S
from torchfuse.graph.collector import gc_paused
from torchfuse.graph.graph_symbols import carrier, used_symbols
from torchfuse.graph.ops import node_inputs, tensor_refs
from torchfuse.graph.verify import SYMBOL_SOURCE

NUM_SAVED = "autograd.num_saved"
Strategy = Literal["min_cut", "save_all"]


@dataclass(frozen=True, slots=True)
class Partition:
    """The two halves of a joint graph and what crosses between them."""

    forward: S.Graph
    backward: S.Graph
    saved: tuple[tuple[str, int], ...]
    """(value name, bytes) of each saved value, in forward-output order."""
    recomputed: tuple[str, ...] = ()
    """Names of forward nodes that the backward graph computes again."""
    strategy: str = "min_cut"

    @property
    def saved_bytes(self) -> int:
        return sum(b for _, b in self.saved)


class PartitionError(AutogradError):
    """A joint graph that cannot be split (malformed, or an unsavable value is needed)."""


@dataclass(frozen=True, slots=True)
class _Joint:
    graph: S.Graph
    n_fwd: int
    primals: tuple[str, ...]
    tangents: tuple[str, ...]
    producer: dict[str, S.Node]
    tangent_dependent: frozenset[str]
    """Names of nodes that read (transitively) a tangent: they can only run in the backward."""
    fwd_outputs: tuple[str, ...]
    needed: tuple[str, ...]
    """Tangent-free values the backward-only nodes (and gradient outputs) read."""


def _analyze(joint: S.Graph, n_fwd: int) -> _Joint:
    primals = tuple(i.name for i in joint.inputs if i.kind != "tangent")
    tangents = tuple(i.name for i in joint.inputs if i.kind == "tangent")
    producer = {o: n for n in joint.nodes for o in n.outputs if o}
    dependent_values = set(tangents)
    dependent_nodes = set()
    for n in joint.nodes:
        if any(v in dependent_values for v in node_inputs(n)):
            dependent_nodes.add(n.name)
            dependent_values.update(o for o in n.outputs if o)
    needed: dict[str, None] = {}
    for n in joint.nodes:
        if n.name in dependent_nodes:
            for v in node_inputs(n):
                if v not in dependent_values:
                    needed[v] = None
    for o in joint.outputs[n_fwd:]:
        for v in tensor_refs([o.value]):
            if v not in dependent_values:
                needed[v] = None
    fwd_outputs = tuple(tensor_refs([o.value for o in joint.outputs[:n_fwd]]))
    if any(v in dependent_values for v in fwd_outputs):
        raise PartitionError("a forward output depends on a tangent; is num_fwd_outputs right?")
    return _Joint(joint, n_fwd, primals, tangents, producer, frozenset(dependent_nodes),
                  fwd_outputs, tuple(needed))


def partition(
    joint: S.Graph,
    num_fwd_outputs: int | None = None,
    strategy: Strategy = "min_cut",
    memory_budget: float = 1.0,
) -> Partition:
    """Split ``joint`` (from [`joint_graph`][torchfuse.autograd.joint_graph]) into forward and backward.

    ``num_fwd_outputs`` defaults to what the joint graph recorded in its meta. Example, the
    joint graph of ``x.sin().cos()``::

        sin = aten.sin.default(x); cos = aten.cos.default(sin)                   # forward
        sin_1 = aten.sin.default(sin); neg = aten.neg.default(sin_1)             # backward
        mul = aten.mul.Tensor(tangent_0, neg); cos_1 = aten.cos.default(x)
        mul_1 = aten.mul.Tensor(mul, cos_1)
        return (cos, mul_1)

    ``save_all`` saves ``neg`` and ``cos_1`` (32 bytes for 4 floats); ``min_cut`` saves only
    ``x`` (16 bytes) and the backward recomputes ``sin`` from it::

        def forward(x):                      def backward(x, tangent_0):
            sin = aten.sin.default(x)            sin = aten.sin.default(x)
            cos = aten.cos.default(sin)          ... as in the joint graph ...
            return (cos, x)  # x: saved          return (mul_1,)  # gradient x
    """
    n_fwd = _num_fwd_outputs(joint) if num_fwd_outputs is None else num_fwd_outputs
    info = _analyze(joint, n_fwd)
    hints = symbol_hints(joint)
    size = {v: nbytes(m, hints) for v, m in joint.values.items()}
    if strategy == "save_all":
        return _build(info, list(info.needed), size, "save_all")
    if strategy != "min_cut":
        raise ValueError(f"unknown partition strategy {strategy!r}; use 'min_cut' or 'save_all'")
    budget = memory_budget * sum(size[v] for v in info.needed)
    best: Partition | None = None
    for tier in RECOMPUTE_TIERS if memory_budget < 1.0 else (CHEAP,):
        saved = _min_cut(info, size, tier)
        result = _build(info, saved, size, "min_cut")
        carriers = frozenset(v for v, _ in result.saved) - set(saved)
        if carriers:
            # primals saved only to carry a size symbol cost nothing more: cut again letting
            # the backward recompute from them what it can
            result = _build(info, _min_cut(info, size, tier, carriers), size, "min_cut")
        if best is None or result.saved_bytes < best.saved_bytes:
            best = result
        if best.saved_bytes <= budget:
            break
    assert best is not None
    return best


@gc_paused()  # networkx builds a flow graph of dicts: collections walked the whole process
def _min_cut(info: _Joint, size: dict[str, int], tier: frozenset[OpClass],
             free: frozenset[str] = frozenset()) -> list[str]:
    g = info.graph
    order = {v: i for i, v in enumerate(info.primals)}
    for n in g.nodes:
        for o in n.outputs:
            if o:
                order.setdefault(o, len(order))
    count = len(order)
    views = {o for n in g.nodes if classify(n.op) is OpClass.VIEW for o in n.outputs if o}

    def capacity(v: str) -> int:
        # bytes dominate; among equal sizes prefer saving later values (less recompute),
        # but never a view over its base (a view is free to recompute)
        if v in free:
            return 0
        return size[v] * scale + (count - order[v]) + (count if v in views else 0)

    scale = 2 * count * count + 1
    flow = nx.DiGraph()
    for v in info.primals:
        flow.add_edge("source", f"{v}:in")
        flow.add_edge(f"{v}:in", f"{v}:out", capacity=capacity(v))
    for n in g.nodes:
        if n.name in info.tangent_dependent:
            continue
        banned = not recomputable(n.op, tier)
        for o in n.outputs:
            if not o:
                continue
            flow.add_edge(f"{o}:in", f"{o}:out", capacity=capacity(o))
            if banned:
                flow.add_edge("source", f"{o}:in")
            for v in node_inputs(n):
                flow.add_edge(f"{v}:out", f"{o}:in")
    for v in info.needed:
        flow.add_edge(f"{v}:out", "sink")
    if not info.needed:
        return []
    try:
        _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    except nx.NetworkXUnbounded as e:
        raise PartitionError("no finite cut: the backward needs a value that cannot be saved") from e
    return [v for v in order if f"{v}:in" in reachable and f"{v}:out" not in reachable]


def _closure(info: _Joint, roots: Iterable[str], stop: set[str]) -> set[str]:
    """Names of tangent-free nodes needed to compute ``roots`` from the values in ``stop``."""
    seen: set[str] = set()
    todo = [v for v in roots if v not in stop]
    while todo:
        v = todo.pop()
        node = info.producer.get(v)
        if node is None:
            if v in info.primals:
                raise PartitionError(f"the backward needs primal {v!r}, which was not saved")
            raise PartitionError(f"value {v!r} has no producer")
        if node.name in seen:
            continue
        seen.add(node.name)
        todo.extend(u for u in node_inputs(node) if u not in stop)
    return seen


def _build(info: _Joint, saved: list[str], size: dict[str, int], strategy: str) -> Partition:
    g = info.graph
    saved_set = set(saved)
    fwd_nodes = _closure(info, [*info.fwd_outputs, *saved], set(info.primals))
    bwd_roots = [v for n in g.nodes if n.name in info.tangent_dependent for v in node_inputs(n)]
    bwd_roots += tensor_refs([o.value for o in g.outputs[info.n_fwd:]])
    available = saved_set | set(info.tangents) | {
        o for n in g.nodes if n.name in info.tangent_dependent for o in n.outputs if o}
    recomputed = _closure(info, [v for v in bwd_roots if v not in available], available)
    fwd_values = {i.name for i in g.inputs if i.kind != "tangent"}
    forward = S.Graph(
        name=f"{g.name}_forward".replace("_joint_forward", "_forward"),
        inputs=tuple(i for i in g.inputs if i.kind != "tangent"),
        outputs=(*g.outputs[: info.n_fwd],
                 *(S.GraphOutput(value=S.TensorRef(name=v), kind="saved_value", target=v) for v in saved)),
        nodes=tuple(n for n in g.nodes if n.name in fwd_nodes),
        symbols=g.symbols, guards=g.guards, opsets=g.opsets,
        meta={k: v for k, v in g.meta.items() if not k.startswith("autograd.")},
        values={},
    )
    for n in forward.nodes:
        fwd_values.update(o for o in n.outputs if o)
    forward = _with_values(forward, g, fwd_values)
    bwd_nodes = tuple(n for n in g.nodes if n.name in recomputed or n.name in info.tangent_dependent)
    backward = S.Graph(
        name=f"{g.name}_backward".replace("_joint_backward", "_backward"),
        inputs=(*(S.GraphInput(name=v, kind="user_input") for v in saved),
                *(i for i in g.inputs if i.kind == "tangent")),
        outputs=tuple(g.outputs[info.n_fwd:]),
        nodes=bwd_nodes,
        symbols=g.symbols, opsets=g.opsets,
        meta={NUM_SAVED: str(len(saved))},
        values={},
    )
    bwd_values = set(saved) | set(info.tangents) | {o for n in bwd_nodes for o in n.outputs if o}
    backward = _with_values(backward, g, bwd_values)
    used = used_symbols(backward)
    uncarried = [sym for sym in backward.symbols if sym.name in used and _from_input(sym)
                 and carrier(backward, sym.name) is None]
    if uncarried:
        # no saved value or tangent has the symbol as a size: save the primal it comes from
        extra = [v for v in dict.fromkeys(_source_primal(info, sym) for sym in uncarried)
                 if v not in saved_set]
        if not extra:
            raise PartitionError(f"the backward needs size symbols {[x.name for x in uncarried]}, "
                                 "which none of its inputs has as a size")
        return _build(info, [*saved, *extra], size, strategy)
    backward = _bind_symbols(backward)
    recomputed_names = tuple(n.name for n in g.nodes if n.name in recomputed)
    return Partition(forward, backward, tuple((v, size[v]) for v in saved), recomputed_names, strategy)


def _from_input(sym: S.Symbol) -> bool:
    return SYMBOL_SOURCE.fullmatch(sym.source or "") is not None


def _source_primal(info: _Joint, sym: S.Symbol) -> str:
    m = SYMBOL_SOURCE.fullmatch(sym.source or "")
    assert m is not None
    inputs = [i.name for i in info.graph.inputs]
    k = int(m.group(1))
    if k >= len(inputs) or inputs[k] not in info.primals:
        raise PartitionError(f"the backward needs size symbol {sym.name} (source {sym.source!r}), "
                             "which no saved value or tangent has as a size and no primal defines")
    return inputs[k]


def _bind_symbols(backward: S.Graph) -> S.Graph:
    """The backward graph with only the symbols it uses, each bound from one of its own inputs
    (a graph's symbols must be bindable from its inputs; the joint graph's sources name
    primals, which the backward does not receive)."""
    used = used_symbols(backward)
    # a symbol bound some other way (a hint, no input source) keeps its source
    symbols = tuple(msgspec.structs.replace(sym, source=carrier(backward, sym.name))
                    if _from_input(sym) else sym
                    for sym in backward.symbols if sym.name in used)
    return msgspec.structs.replace(backward, symbols=symbols)


def _with_values(graph: S.Graph, joint: S.Graph, names: set[str]) -> S.Graph:
    return msgspec.structs.replace(graph, values={k: v for k, v in joint.values.items() if k in names})


def num_saved(backward: S.Graph) -> int:
    """How many leading inputs of a backward graph are saved values."""
    return int(backward.meta.get(NUM_SAVED, "0"))
