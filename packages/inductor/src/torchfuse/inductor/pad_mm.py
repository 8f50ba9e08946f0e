"""Padding matmuls whose leading dimensions are not 16-byte aligned (GPU, 16-bit dtypes).

cuBLAS picks its fast tensor-core kernels only when every matrix's leading dimension (the
stride of its non-unit-stride dim) and base address are 16-byte aligned. GPT-2's vocabulary,
50257, is odd, so its logits matmul ``[4096, 768] @ [768, 50257]`` in bf16 writes an output
whose leading dimension is 50257 elements: on the H200 it ran on a CUTLASS ``align1`` kernel in
2.53 ms, against 0.505 ms with N padded to 50264 (``benchmarks/gpt2_profile.py``, run
``gpu_20261130_1350``; 3.36 of our 4.21 ms of GPU time for a whole GPT-2 inference call).

The rewrite, for ``aten.mm(a[M, K], b[K, N])`` with float16/bfloat16 operands on CUDA, static
sizes, and at least :data:`MIN_FLOPS` of work:

* K unaligned (``a``'s leading dim when ``a`` is row-major, ``b``'s when ``b`` is
  column-major, as in ``x @ w.t()``): both operands padded along K with zeros, which add
  nothing to the products;
* N unaligned (the output's leading dim, and ``b``'s when row-major): ``b`` padded along N;
* M unaligned while ``a`` is column-major (``dlogits.t() @ h`` in a backward): ``a`` padded
  along M, which also writes it row-major;

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
from torchfuse.autograd import decompose
from torchfuse.graph import schema as S

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
    if pad_k:
        a = aten.constant_pad_nd.default(a, [0, pad_k])
        b = aten.constant_pad_nd.default(b, [0, 0, 0, pad_k])
    if pad_m:
        a = aten.constant_pad_nd.default(a, [0, 0, 0, pad_m])
    if pad_n:
        b = aten.constant_pad_nd.default(b, [0, pad_n])
    out = aten.mm.default(a, b)
    if pad_m or pad_n:  # a view: no copy (see the module doc)
        out = aten.slice.Tensor(aten.slice.Tensor(out, 0, 0, m), 1, 0, n)
    return out


def pad_matmuls(graph: S.Graph, *, device_types: tuple[str, ...] = ("cuda",),
                min_flops: int = MIN_FLOPS) -> S.Graph:
    """``graph`` with its unaligned half-precision matmuls on ``device_types`` padded (see the
    module doc); ``graph`` itself when there are none."""
    if not needs_padding(graph, device_types, min_flops):
        return graph
    rules = {"aten.mm.default": lambda a, b: _padded_mm(a, b, device_types, min_flops)}
    return _keep_output_layouts(graph, decompose(graph, rules, once=True))


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
