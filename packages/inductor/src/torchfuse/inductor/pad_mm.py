"""Padding matmuls whose leading dimensions are not 16-byte aligned (GPU, 16-bit dtypes).

cuBLAS picks its fast tensor-core kernels only when every matrix's leading dimension (the
stride of its non-unit-stride dim) and base address are 16-byte aligned. GPT-2's vocabulary,
50257, is odd, so its logits matmul ``[4096, 768] @ [768, 50257]`` in bf16 writes an output
whose leading dimension is 50257 elements: on the H200 it ran on a CUTLASS ``align1`` kernel in
2.53 ms, against 0.505 ms with N padded to 50264 (``benchmarks/gpt2_profile.py``, run
``gpu_20261130_1350``; 3.36 of our 4.21 ms of GPU time for a whole GPT-2 inference call).

The rewrite, for ``aten.mm(a[M, K], b[K, N])`` with float16/bfloat16 operands on CUDA, static
sizes, and at least `MIN_FLOPS` of work:

* K unaligned (``a``'s leading dim when ``a`` is row-major, ``b``'s when ``b`` is
  column-major, as in ``x @ w.t()``): both operands padded along K with zeros, which add
  nothing to the products;
* N unaligned (the output's leading dim, and ``b``'s when row-major): ``b`` padded along N;
* M unaligned while ``a`` is column-major (``dlogits.t() @ h`` in a backward): ``a`` padded
  along M.

Each pad keeps its operand's memory order: a column-major operand is padded as its row-major
transpose and transposed back (two views around the pad). Padding it as it stands would
write a row-major copy, and the kernel producing that copy would walk the operand's source
across its rows: GPT-2's dlogits kernel read the logits 50257 elements apart from one
thread to the next and took 2.70 of the 10.7 ms of a training step on the H200 (run
``gpu_20261130_1535``).


then the product of the padded operands is sliced back to ``[M, N]``: a view whose rows are
``N + pad`` elements apart. Kernels read it in place and so does cuBLAS (its leading dimension
is now aligned); an inference graph's output keeps that layout rather than eager's contiguous
one. (The forward half of a training graph copies a changed output back to the layout the
backward was compiled for.) Copying every output contiguous was measured first: GPT-2's
logits then existed twice (peak 810 MB against eager's 587, run ``gpu_20261130_1425``).
The pads are ``constant_pad_nd``, pointwise ops that fuse into the kernels producing the
operands (GPT-2's weight cast writes the padded copy at no extra cost). The cost model is
simple: a pad writes the padded operand once, which is small next to what an ``align1``
kernel loses on any matmul big enough to qualify.
"""

from __future__ import annotations

import msgspec
import torch
from torchfuse.autograd import OpClass, classify, decompose, eliminate_common_subexpressions
from torchfuse.graph import schema as S
from torchfuse.graph.ops import UnknownOpError, rename_arg, resolve_op
from torchfuse.graph.tracing import mutated_arguments

aten = torch.ops.aten

MIN_FLOPS = 1 << 30
"""Matmuls with fewer multiply-adds than this are left alone (launch-bound either way)."""

_HALF = {"float16", "bfloat16"}
_ALIGN_ELEMENTS = 8  # 16 bytes of a 2-byte dtype


def _pad_to(n: int) -> int:
    return -n % _ALIGN_ELEMENTS


def _plan(a_meta: S.TensorMeta, b_meta: S.TensorMeta, device_types: tuple[str, ...] = ("cuda",),
          min_flops: int = MIN_FLOPS) -> tuple[int, int, int] | None:
    """(pad M, pad K, pad N) for ``mm(a, b)``, or None when nothing needs padding."""
    if a_meta.dtype not in _HALF or b_meta.dtype not in _HALF:
        return None
    if a_meta.device.split(":")[0] not in device_types:
        return None
    dims = (*a_meta.sizes, *a_meta.strides, *b_meta.sizes, *b_meta.strides)
    if len(a_meta.sizes) != 2 or len(b_meta.sizes) != 2 or not all(isinstance(d, int) for d in dims):
        return None
    (m, k), (_, n) = a_meta.sizes, b_meta.sizes
    if m * n * k < min_flops:
        return None
    a_column_major = a_meta.strides[0] == 1 and m > 1
    pad_m = _pad_to(m) if a_column_major else 0
    pad_k, pad_n = _pad_to(k), _pad_to(n)
    return (pad_m, pad_k, pad_n) if pad_m or pad_k or pad_n else None


def needs_padding(graph: S.Graph, device_types: tuple[str, ...] = ("cuda",),
                  min_flops: int = MIN_FLOPS) -> bool:
    """True when some matmul of ``graph`` would be padded (cheap: reads the value table)."""
    return any(
        _plan(graph.values[node.args[0].name], graph.values[node.args[1].name], device_types, min_flops)
        for node in graph.nodes
        if node.op == "aten.mm.default" and all(isinstance(a, S.TensorRef) for a in node.args[:2])
    )


def _padded_mm(a: torch.Tensor, b: torch.Tensor, device_types: tuple[str, ...],
               min_flops: int) -> torch.Tensor:
    from torchfuse.graph.ops import meta_of

    plan = _plan(meta_of(a), meta_of(b), device_types, min_flops)
    if plan is None:
        return aten.mm.default(a, b)
    pad_m, pad_k, pad_n = plan
    m, n = a.shape[0], b.shape[1]
    a = _pad(a, pad_m, pad_k)
    b = _pad(b, pad_k, pad_n)
    out = aten.mm.default(a, b)
    if pad_m or pad_n:  # a view: no copy (see the module doc)
        out = aten.slice.Tensor(aten.slice.Tensor(out, 0, 0, m), 1, 0, n)
    return out


def _column_major(t: torch.Tensor) -> bool:
    return t.shape[0] > 1 and t.stride(0) == 1 and t.stride(1) >= t.shape[0]


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` (2-D) with ``rows`` zero rows and ``cols`` zero columns added, in ``t``'s memory order."""
    if not rows and not cols:
        return t
    if _column_major(t):  # pad the row-major transpose: the copy stays column-major
        return aten.t.default(aten.constant_pad_nd.default(aten.t.default(t), [0, rows, 0, cols]))
    return aten.constant_pad_nd.default(t, [0, cols, 0, rows])


def pad_matmuls(graph: S.Graph, *, device_types: tuple[str, ...] = ("cuda",),
                min_flops: int = MIN_FLOPS) -> S.Graph:
    """``graph`` with its unaligned half-precision matmuls on ``device_types`` padded (see the
    module doc); ``graph`` itself when there are none."""
    if not needs_padding(graph, device_types, min_flops):
        return graph
    rules = {"aten.mm.default": lambda a, b: _padded_mm(a, b, device_types, min_flops)}
    return _keep_output_layouts(graph, _share_pads(decompose(graph, rules, once=True)))


def _is_transpose(graph: S.Graph, n: S.Node) -> bool:
    """``n`` swaps the two dims of a 2-D value: ``t``, ``transpose(0, 1)`` or ``permute([1, 0])``."""
    if not n.args or not isinstance(n.args[0], S.TensorRef) or len(graph.values[n.args[0].name].sizes) != 2:
        return False
    if n.op == "aten.t.default":
        return True
    ints = [a.value for a in n.args[1:] if isinstance(a, S.Int)]
    if n.op == "aten.transpose.int":
        return len(ints) == 2 and {d % 2 for d in ints} == {0, 1}
    if n.op == "aten.permute.default" and isinstance(n.args[1], S.ListArg):
        return [getattr(a, "value", None) for a in n.args[1].items] in ([1, 0], [-1, -2], [1, -2], [-1, 0])
    return False


def _share_pads(graph: S.Graph) -> S.Graph:
    """One padded copy per operand and padding: a transpose of a transpose read as its source,
    then identical nodes merged. GPT-2's dlogits feeds two matmuls, ``dlogits @
    w`` (K padded) and ``dlogits.t() @ h`` (M padded, as the transpose of ``dlogits`` padded
    the same way); without this the kernel producing dlogits wrote the padded copy twice."""
    source: dict[str, str] = {}  # the output of t(v) -> v
    rename: dict[str, str] = {}
    outputs = {o.value.name for o in graph.outputs if isinstance(o.value, S.TensorRef)}
    nodes = []
    for n in graph.nodes:
        if rename:
            n = msgspec.structs.replace(n, args=tuple(rename_arg(a, rename) for a in n.args),
                                        kwargs={k: rename_arg(a, rename) for k, a in n.kwargs.items()})
        if _is_transpose(graph, n):
            inner = n.args[0].name
            if inner in source and n.outputs[0] not in outputs:
                rename[n.outputs[0]] = source[inner]
                continue
            source[n.outputs[0]] = inner
        nodes.append(n)
    graph = msgspec.structs.replace(graph, nodes=tuple(nodes))
    # any op may merge but a random one and one that writes into an argument (an inference
    # graph may still hold in-place ops): the views in front of the pads are often duplicates
    # too (two views of the same value, one per matmul)
    return eliminate_common_subexpressions(graph, keep=_must_stay)


def _must_stay(node: S.Node) -> bool:
    """A node common-subexpression elimination must not merge with an equal one."""
    if classify(node.op) is OpClass.RANDOM:
        return True
    try:
        return bool(mutated_arguments(resolve_op(node.op)))
    except UnknownOpError:
        return True  # an op we cannot read the schema of: assume it writes


def _keep_output_layouts(before: S.Graph, after: S.Graph) -> S.Graph:
    """``after`` with a contiguous copy for each output whose layout the padding changed, when
    something else was compiled against that layout: every output of a forward half of a
    training graph (its saved values are the backward's inputs, with the strides the partition
    recorded). The outputs of an inference graph go to the caller, who takes the view."""
    if not any(o.kind == "saved_value" for o in before.outputs):
        return after
    nodes, values, outputs = list(after.nodes), dict(after.values), []
    for old, new in zip(before.outputs, after.outputs, strict=True):
        if not (isinstance(old.value, S.TensorRef) and isinstance(new.value, S.TensorRef)):
            outputs.append(new)
            continue
        want, got = before.values[old.value.name], after.values[new.value.name]
        if (want.sizes, want.strides) == (got.sizes, got.strides):
            outputs.append(new)
            continue
        name = f"{new.value.name}_contiguous"
        while name in values:
            name += "_"
        values[name] = want
        nodes.append(S.Node(name=name, op="aten.clone.default", args=(new.value,),
                            kwargs={"memory_format": S.MemoryFormatArg(name="contiguous_format")},
                            outputs=(name,)))
        outputs.append(msgspec.structs.replace(new, value=S.TensorRef(name=name)))
    return msgspec.structs.replace(after, nodes=tuple(nodes), values=values, outputs=tuple(outputs))
