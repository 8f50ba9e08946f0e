"""The op vocabulary autograd reasons about: each ATen op falls into one `OpClass`.

Partitioning asks one question of an op, "may the backward recompute it?", and answers it
from the class alone (`RECOMPUTE_TIERS`). Classes come from an explicit table first,
then from torch's own op tags (``pointwise``, ``reduction``, ``nondeterministic_seeded``)
and schema alias annotations (views).
"""

from __future__ import annotations

from enum import Enum, auto
from functools import cache

import torch
from torchfuse.graph.ops import resolve_op
from torchfuse.graph.tracing import is_view_op


class OpClass(Enum):
    """What kind of op a node is, as the partitioner sees it (what is cheap to recompute)."""

    POINTWISE = auto()
    VIEW = auto()
    CAST = auto()
    REDUCTION = auto()
    FACTORY = auto()
    """Creates a tensor from sizes/scalars only (``zeros``, ``full``, ``arange``)."""
    INDEXING = auto()
    """Gathers or scatters by index tensors (``gather``, ``index``, ``embedding``)."""
    MATMUL = auto()
    RANDOM = auto()
    OTHER = auto()


CHEAP = frozenset({OpClass.POINTWISE, OpClass.VIEW, OpClass.CAST, OpClass.REDUCTION, OpClass.FACTORY})
"""Classes the backward may recompute at the default memory budget."""

NEVER_RECOMPUTE = frozenset({OpClass.MATMUL, OpClass.RANDOM})
"""Recomputing these costs FLOPs (matmuls) or changes results (random ops)."""

RECOMPUTE_TIERS: tuple[frozenset[OpClass], ...] = (
    CHEAP,
    CHEAP | {OpClass.INDEXING, OpClass.OTHER},
)
"""Ever larger recomputable sets, tried in order while saved bytes exceed the budget."""
assert all(not (tier & NEVER_RECOMPUTE) for tier in RECOMPUTE_TIERS)

# Packets (op name without overload) whose class the tags do not give, or give wrongly.
_EXPLICIT: dict[str, OpClass] = {
    **dict.fromkeys(
        ["aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten.addbmm", "aten.matmul",
         "aten.mv", "aten.dot", "aten.vdot", "aten.convolution", "aten.convolution_backward",
         "aten._convolution", "aten.linear", "aten._scaled_mm", "aten.addmv", "aten.einsum",
         "aten._scaled_dot_product_flash_attention",
         "aten._scaled_dot_product_efficient_attention",
         "aten._scaled_dot_product_cudnn_attention",
         "aten._scaled_dot_product_flash_attention_backward",
         "aten._scaled_dot_product_efficient_attention_backward",
         "aten._scaled_dot_product_cudnn_attention_backward",
         "aten._scaled_dot_product_flash_attention_for_cpu",
         "aten._scaled_dot_product_flash_attention_for_cpu_backward"], OpClass.MATMUL),
    **dict.fromkeys(
        ["aten._to_copy", "aten.to", "aten.type_as", "aten.view_as_real",
         "aten.view_as_complex", "aten._convert_element_type"], OpClass.CAST),
    **dict.fromkeys(
        ["aten.zeros", "aten.ones", "aten.full", "aten.empty", "aten.empty_strided",
         "aten.scalar_tensor", "aten.arange", "aten.zeros_like", "aten.ones_like",
         "aten.full_like", "aten.empty_like", "aten.new_zeros", "aten.new_ones",
         "aten.new_full", "aten.new_empty", "aten.linspace", "aten.eye"], OpClass.FACTORY),
    **dict.fromkeys(
        ["aten.gather", "aten.scatter", "aten.scatter_add", "aten.index", "aten.index_put",
         "aten.index_select", "aten.embedding", "aten.embedding_dense_backward",
         "aten.select_scatter", "aten.slice_scatter", "aten.diagonal_scatter",
         "aten.as_strided_scatter", "aten.index_add", "aten.scatter_reduce"], OpClass.INDEXING),
    **dict.fromkeys(
        ["aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.max", "aten.min",
         "aten.prod", "aten.var", "aten.var_mean", "aten.std", "aten.argmax", "aten.argmin",
         "aten.any", "aten.all", "aten.logsumexp", "aten.norm", "aten.linalg_vector_norm"],
        OpClass.REDUCTION),
    **dict.fromkeys(
        ["aten.cat", "aten.stack", "aten.clone", "aten.contiguous", "aten.where",
         "aten.masked_fill", "aten.constant_pad_nd", "aten.copy", "aten.repeat",
         "aten.lift_fresh_copy"], OpClass.POINTWISE),
}


@cache
def classify(op: str) -> OpClass:
    """The class of an op given by name (``"aten.add.Tensor"``)."""
    packet = op.rsplit(".", 1)[0]
    if packet in _EXPLICIT:
        return _EXPLICIT[packet]
    try:
        overload = resolve_op(op)
    except LookupError:
        return OpClass.OTHER
    tags = set(overload.tags)
    if torch.Tag.nondeterministic_seeded in tags:
        return OpClass.RANDOM
    if is_view_op(overload):
        return OpClass.VIEW
    if torch.Tag.pointwise in tags:
        return OpClass.POINTWISE
    if torch.Tag.reduction in tags:
        return OpClass.REDUCTION
    return OpClass.OTHER


def recomputable(op: str, tier: frozenset[OpClass] = CHEAP) -> bool:
    """May the backward recompute ``op``? Never for matmuls and random ops."""
    cls = classify(op)
    return cls in tier and cls not in NEVER_RECOMPUTE


def is_random(node: object) -> bool:
    """True for nodes of random ops (an ``S.Node`` or anything with an ``op`` name)."""
    return classify(getattr(node, "op", "")) is OpClass.RANDOM
