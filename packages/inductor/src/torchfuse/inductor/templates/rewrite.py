"""The graph rewrite: matmuls and their epilogues replaced by template launches (the pass
that decides which, `apply_mm_templates`, calls `rewrite`).

Before (``relu(x @ w.t() + b)``, decomposed)::

    t = aten.t.default(w)
    mm = aten.mm.default(x, t)
    add = aten.add.Tensor(mm, b)
    relu = aten.relu.default(add)

After::

    t = aten.t.default(w)
    relu_buf = aten.empty_strided.default([33, 40], [40, 1], dtype=float32, device=cuda:0)
    relu = torchfuse.triton_kernel.default('{"entry":"triton_tem_fused_mm_add_relu",...}',
                                           [x, t, b, relu_buf], [3])

The template's node defines the epilogue's last value under its own name, so everything
reading it (graph outputs included) is untouched. It sits where that value was defined:
every input it reads is defined before it, and `grow_epilogue` stops a
region at any node that may write memory, so moving the matmul's reads there is safe.
Inductor lowers the node as an opaque launch (`torchfuse.inductor.user_kernels`),
realizing ``t`` with the strides the graph records, and writes ``relu_buf`` in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
from torchfuse.graph import schema as S
from torchfuse.graph.compat import opsets_for
from torchfuse.graph.torchfuse_ops import TRITON_KERNEL
from torchfuse.graph.user_kernels import dumps
from torchfuse.inductor.templates.epilogue import grow_epilogue, value_uses
from torchfuse.inductor.templates.matmul import (
    MATMULS,
    Matmul,
    MMConfig,
    interpreting,
    kernel_source,
    kernel_spec,
    match_matmul,
    with_epilogue,
)

EMPTY_STRIDED = "aten.empty_strided.default"


def find_matmuls(graph: S.Graph, device_ok: Callable[[str], bool]) -> list[Matmul]:
    """Every matmul the template can compute, with its epilogue (regions never overlap)."""
    uses = value_uses(graph)
    claimed: set[int] = set()
    found: list[Matmul] = []
    for i, node in enumerate(graph.nodes):
        if node.op not in MATMULS:
            continue
        ops = match_matmul(graph, node, device_ok)
        if ops is None:
            continue
        epi = grow_epilogue(graph, i, ops.domain, ops.device, bias=ops.bias, claimed=frozenset(claimed),
                            uses=uses)
        if epi is None:
            continue
        claimed.update(epi.nodes)
        found.append(with_epilogue(ops, i, epi))
    return found


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def rewrite(graph: S.Graph, chosen: Sequence[tuple[Matmul, MMConfig]], *,
            fp32_precision: str = "ieee") -> S.Graph:
    """``graph`` with each chosen matmul and its epilogue replaced by an output allocation and
    one ``torchfuse.triton_kernel`` launch of the template with that config."""
    if not chosen:
        return graph
    taken = {n.name for n in graph.nodes} | set(graph.values) | {i.name for i in graph.inputs}
    values = dict(graph.values)
    placed: dict[int, tuple[S.Node, S.Node]] = {}
    dropped: set[int] = set()
    for mm, cfg in chosen:
        epi = mm.epilogue
        anchor = graph.nodes[mm.index]
        upcast = mm.dtype == "bfloat16" and interpreting()
        source = kernel_source(mm, fp32_precision=fp32_precision, upcast_dot=upcast)
        spec = dumps(kernel_spec(mm, source, cfg))
        meta = msgspec.structs.replace(epi.out_meta, requires_grad=False)
        buf = _fresh(f"{epi.out}_buf", taken)
        alloc = S.Node(
            name=buf, op=EMPTY_STRIDED,
            args=(S.ListArg(items=tuple(S.Int(value=int(s)) for s in meta.sizes)),
                  S.ListArg(items=tuple(S.Int(value=int(s)) for s in meta.strides))),
            kwargs={"dtype": S.DtypeArg(name=meta.dtype), "device": S.DeviceArg(name=meta.device)},
            outputs=(buf,), loc=anchor.loc, module_path=anchor.module_path)
        tensors = [*mm.tensors(), buf]
        call = S.Node(
            name=_fresh(f"{epi.out}_template", taken), op=TRITON_KERNEL,
            args=(S.Str(value=spec), S.ListArg(items=tuple(S.TensorRef(name=t) for t in tensors)),
                  S.ListArg(items=(S.Int(value=len(tensors) - 1),))),
            outputs=(epi.out,), loc=anchor.loc, module_path=anchor.module_path)
        region = (mm.index, *epi.nodes)
        placed[region[-1]] = (alloc, call)
        dropped.update(region)
        for j in region:
            for o in graph.nodes[j].outputs:
                if o and o != epi.out:
                    values.pop(o, None)
        values[buf] = msgspec.structs.replace(meta, storage_offset=0)
        values[epi.out] = meta
    nodes: list[S.Node] = []
    for j, node in enumerate(graph.nodes):
        if j in placed:
            nodes.extend(placed[j])
        elif j not in dropped:
            nodes.append(node)
    opsets = opsets_for((n.op for n in nodes), graph.opsets)
    return msgspec.structs.replace(graph, nodes=tuple(nodes), values=values, opsets=opsets)


__all__ = ["EMPTY_STRIDED", "find_matmuls", "rewrite"]
