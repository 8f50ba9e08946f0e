"""Graph rewrites for convolution networks, on the decomposed graph before lowering.

After an extern convolution, what a network does per channel and per element (bias, batch
norm, activation, residual add) should be one pointwise kernel that reads the convolution's
output once. The scheduler already fuses pointwise ops after an extern call; these rewrites
turn what stood in its way into pointwise ops:

* **Batch norm folded into the convolution** (inference). A batch norm on running
  statistics (``training=False``) whose input is a convolution read by nothing else becomes
  the convolution with scaled weights, plus a per-channel shift::

      scale = weight / sqrt(running_var + eps);  shift = bias - running_mean * scale  # [C], fp32
      bn(conv(x, W, b))  ==  conv(x, W * scale[:, None, None, None]) + (shift + b * scale)[:, None, None]

  The scaled weights are one small pointwise op on the parameters (fused with autocast's
  weight cast when there is one); the shift is added in the kernel after the convolution,
  in float32, with the activation and the residual add. The batch norm, an ATen kernel that
  read and wrote every activation, is gone. The parameters stay inputs (no freezing), so the
  Program stays valid when the weights change.
* **The other inference batch norms as pointwise ops**: ``x * scale + shift`` per channel,
  which fuse into the kernels around them.
* **The convolution bias out of the extern call, on CUDA**. ATen's cuDNN convolution adds the
  bias in a second pass over the output (``output.add_(bias)``, rounded to 16 bits in
  between in half precision); added in the kernel after the convolution instead it costs no
  pass and no rounding. (On the CPU, oneDNN adds it inside the convolution: left there.)
* **The bias inside the extern matmul** (float16/bfloat16). Autograd's decomposition of
  ``addmm`` is ``mm`` then ``add``: in half precision the product is rounded to 16 bits,
  then the bias is added and the sum rounded again. ``add(mm(a, b), bias)`` with a bias in the
  product's dtype is put back together as ``addmm(bias, a, b)``, which cuBLAS computes with a
  single rounding, as eager's ``linear`` does (a ViT's every linear layer, a ResNet's
  classifier). In float32 the split form stays: the bias add fuses with what follows.

Training batch norms (``training=True``) are decomposed into per-channel reductions and
pointwise ops (`torchfuse.inductor.decompositions`) before this pass, and fuse with the
activation and residual add around them. Convolutions are extern calls of ATen's
convolution (cuDNN), depthwise and grouped ones included: none of them takes a path of ours.

Each rewrite keeps the graph's inputs and outputs and the recorded layout of every value
it replaces (``decompose``'s ``_as_recorded``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torchfuse.autograd import decompose
from torchfuse.graph import schema as S
from torchfuse.graph.ops import node_inputs, resolve_op

aten = torch.ops.aten

_HALF = {"float16", "bfloat16"}
_CONV = "aten.convolution.default"
_BN_EVAL = ("aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default")
_MM, _ADD = "aten.mm.default", "aten.add.Tensor"


def _users(graph: S.Graph) -> dict[str, list[S.Node]]:
    out: dict[str, list[S.Node]] = {}
    for n in graph.nodes:
        for v in set(node_inputs(n)):
            out.setdefault(v, []).append(n)
    return out


def _graph_outputs(graph: S.Graph) -> set[str]:
    names: set[str] = set()

    def walk(a: S.Argument) -> None:
        if isinstance(a, S.TensorRef):
            names.add(a.name)
        elif isinstance(a, S.ListArg):
            for x in a.items:
                walk(x)

    for o in graph.outputs:
        walk(o.value)
    return names


def _bool(arg: S.Argument) -> bool | None:
    return arg.value if isinstance(arg, S.Bool) else None


def _is_eval_bn(node: S.Node) -> bool:
    if node.op == _BN_EVAL[1]:
        return True
    return node.op == _BN_EVAL[0] and len(node.args) > 5 and _bool(node.args[5]) is False


def _only_first_output_used(node: S.Node, users: dict[str, list[S.Node]], outputs: set[str]) -> bool:
    return all(not name or (name not in users and name not in outputs) for name in node.outputs[1:])


def _bn_args(node: S.Node, args: list[Any]) -> tuple[Any, Any, Any, Any, Any, float]:
    """(x, weight, bias, running_mean, running_var, eps) of either eval batch-norm op."""
    if node.op == _BN_EVAL[0]:  # (x, w, b, rm, rv, training, momentum, eps)
        return args[0], args[1], args[2], args[3], args[4], float(args[7])
    return args[0], args[1], args[2], args[3], args[4], float(args[6])  # (x, w, b, rm, rv, momentum, eps)


def _bn_scale_shift(w: Any, b: Any, rm: torch.Tensor, rv: torch.Tensor, eps: float):
    """Per-channel float32 ``scale``, ``shift`` with ``bn(x) == x * scale + shift``."""
    f32 = torch.float32
    scale = aten.rsqrt.default(aten.add.Scalar(aten._to_copy.default(rv, dtype=f32), eps))
    if w is not None:
        scale = aten.mul.Tensor(scale, aten._to_copy.default(w, dtype=f32))
    shift = aten.neg.default(aten.mul.Tensor(aten._to_copy.default(rm, dtype=f32), scale))
    if b is not None:
        shift = aten.add.Tensor(shift, aten._to_copy.default(b, dtype=f32))
    return scale, shift


def _per_channel(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """``v`` [C] as [C, 1, ..., 1] (``ndim`` dims in all)."""
    return aten.view.default(v, [v.shape[0], *([1] * (ndim - 1))])


def _plus_per_channel(y: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``y + shift`` along dim 1, computed in float32, in ``y``'s dtype."""
    yf = aten._to_copy.default(y, dtype=torch.float32) if y.dtype != torch.float32 else y
    out = aten.add.Tensor(yf, _per_channel(aten._to_copy.default(shift, dtype=torch.float32), y.dim() - 1))
    return aten._to_copy.default(out, dtype=y.dtype) if y.dtype != torch.float32 else out


def _folded_conv(conv_args: list[Any], bn: tuple[Any, ...]) -> torch.Tensor:
    x, weight, bias, *rest = conv_args
    _, w, b, rm, rv, eps = bn
    scale, shift = _bn_scale_shift(w, b, rm, rv, eps)
    f32 = torch.float32
    new_w = aten.mul.Tensor(aten._to_copy.default(weight, dtype=f32), _per_channel(scale, weight.dim()))
    if bias is not None:
        shift = aten.add.Tensor(shift, aten.mul.Tensor(aten._to_copy.default(bias, dtype=f32), scale))
    y = aten.convolution.default(x, aten._to_copy.default(new_w, dtype=weight.dtype), None, *rest)
    return _plus_per_channel(y, shift)


def _bias_after(node: S.Node, args: list[Any], kwargs: dict) -> torch.Tensor:
    x, weight, bias, *rest = args
    return _plus_per_channel(aten.convolution.default(x, weight, None, *rest, **kwargs), bias)


def _pointwise_bn(bn: tuple[Any, ...]) -> torch.Tensor:
    x, w, b, rm, rv, eps = bn
    scale, shift = _bn_scale_shift(w, b, rm, rv, eps)
    xf = aten._to_copy.default(x, dtype=torch.float32) if x.dtype != torch.float32 else x
    channels = x.dim() - 1
    out = aten.add.Tensor(aten.mul.Tensor(xf, _per_channel(scale, channels)), _per_channel(shift, channels))
    return aten._to_copy.default(out, dtype=x.dtype) if x.dtype != torch.float32 else out


def _rewrite(graph: S.Graph, plan: dict[str, Callable[..., Any]]) -> S.Graph:
    """``graph`` re-traced with the node named ``n`` computed by ``plan[n](node, args)``
    (``decompose``'s one-pass rewrite; its rules are per op, so each op's rule walks that op's
    nodes in graph order, the order ``decompose`` visits them in)."""
    ops = {n.op for n in graph.nodes if n.name in plan}
    queues: dict[str, Iterator[S.Node]] = {op: iter([n for n in graph.nodes if n.op == op]) for op in ops}

    def rule_for(op: str) -> Callable[..., Any]:
        def rule(*args: Any, **kwargs: Any) -> Any:
            node = next(queues[op])
            fn = plan.get(node.name)
            return fn(node, list(args), kwargs) if fn else resolve_op(op)(*args, **kwargs)
        return rule

    return decompose(graph, {op: rule_for(op) for op in ops}, once=True)


def biases_after_convolutions(graph: S.Graph) -> S.Graph:
    """A CUDA convolution's bias added after it, in the kernel that follows (see the module
    doc); ``graph`` itself when none has a bias or the graph is not on CUDA."""
    plan: dict[str, Callable[..., Any]] = {}
    for n in graph.nodes:
        if (n.op == _CONV and len(n.args) > 2 and isinstance(n.args[2], S.TensorRef)
                and graph.values[n.outputs[0]].device.startswith("cuda")):
            plan[n.name] = _bias_after
    return _rewrite(graph, plan) if plan else graph


def _remembering(op: Any, seen: dict[int, list[Any]]) -> Callable[..., Any]:
    """A rewrite step that runs ``op`` and remembers its arguments under its result's id, for
    a later step that takes the result apart again."""
    def step(node: S.Node, args: list[Any], kwargs: dict) -> Any:
        out = op(*args, **kwargs)
        seen[id(out)] = args
        return out
    return step


def fold_batch_norms(graph: S.Graph) -> S.Graph:
    """Inference batch norms folded into the convolution before them, the others written as
    pointwise ops (see the module doc); ``graph`` itself when it has none."""
    users, outputs = _users(graph), _graph_outputs(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    conv_args: dict[int, list[Any]] = {}  # id of a folded convolution's result -> its arguments
    plan: dict[str, Callable[..., Any]] = {}

    remember = _remembering(aten.convolution.default, conv_args)

    def fold(node: S.Node, args: list[Any], kwargs: dict) -> Any:
        bn = _bn_args(node, args)
        first = conv_args.pop(id(bn[0]), None)
        out = _folded_conv(first, bn) if first is not None else _pointwise_bn(bn)
        return out, bn[3], bn[4]  # the statistics outputs are read by nobody

    for n in graph.nodes:
        if not (_is_eval_bn(n) and isinstance(n.args[0], S.TensorRef)
                and _only_first_output_used(n, users, outputs)):
            continue
        src = n.args[0].name
        conv = producer.get(src)
        if (conv is not None and conv.op == _CONV and len(conv.args) > 6 and _bool(conv.args[6]) is False
                and len(users.get(src, [])) == 1 and src not in outputs
                and graph.values[src].sizes[1:2] == graph.values[n.outputs[0]].sizes[1:2]):
            plan[conv.name] = remember
        plan[n.name] = fold
    return _rewrite(graph, plan) if plan else graph


def bias_into_matmuls(graph: S.Graph) -> S.Graph:
    """``add(mm(a, b), bias)`` in float16/bfloat16 put back together as ``addmm(bias, a, b)``
    (see the module doc); ``graph`` itself when there is none."""
    users, outputs = _users(graph), _graph_outputs(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    products: dict[int, list[Any]] = {}
    plan: dict[str, Callable[..., Any]] = {}

    remember = _remembering(aten.mm.default, products)

    def add_bias(node: S.Node, args: list[Any], kwargs: dict) -> Any:
        lhs, rhs = args[0], args[1]
        mm, bias = (lhs, rhs) if id(lhs) in products else (rhs, lhs)
        if id(mm) not in products:  # the product was re-laid out on the way: keep the add
            return aten.add.Tensor(lhs, rhs, **kwargs)
        a, b = products.pop(id(mm))
        return aten.addmm.default(bias, a, b)

    for n in graph.nodes:
        if n.op != _ADD or n.kwargs or len(n.args) != 2 or not all(isinstance(a, S.TensorRef)
                                                                    for a in n.args):
            continue
        out = graph.values[n.outputs[0]]
        for mm_arg, bias_arg in (n.args, n.args[::-1]):
            mm = producer.get(mm_arg.name)
            bias = graph.values[bias_arg.name]
            if (mm is None or mm.op != _MM or mm.name in plan or len(users.get(mm_arg.name, [])) != 1
                    or mm_arg.name in outputs):
                continue
            product = graph.values[mm_arg.name]
            if (product.dtype not in _HALF or bias.dtype != product.dtype or out.dtype != product.dtype
                    or len(bias.sizes) != 1 or bias.sizes[0] != product.sizes[1]
                    or out.sizes != product.sizes):
                continue
            plan[mm.name] = remember
            plan[n.name] = add_bias
            break
    return _rewrite(graph, plan) if plan else graph


def rewrite_convolution_graphs(graph: S.Graph, enabled: bool = True) -> S.Graph:
    """The pipeline's ``conv`` pass: `fold_batch_norms`, `biases_after_convolutions`, then
    `bias_into_matmuls`."""
    if not enabled:
        return graph
    return bias_into_matmuls(biases_after_convolutions(fold_batch_norms(graph)))
