"""Decompositions: rewrite a graph into a smaller op set, using a table of Python rules.

A table maps an op name (``"aten.silu.default"``, or the ``OpOverload`` itself) to a Python
function with the op's schema signature, written with ordinary torch calls::

    DEFAULT_TABLE["aten.silu.default"] = lambda x: x * torch.sigmoid(x)

`decompose` re-runs the graph on fake tensors under a Recorder and, for each node whose
op is in the table, calls the rule instead of the op; what the rule calls is recorded, so the
result is again a graph of ATen ops. Rules may produce ops that are themselves in the table:
decomposition repeats until none is left (or ``max_rounds`` is reached).

Before::

    silu = aten.silu.default(x)

After::

    sigmoid = aten.sigmoid.default(x)
    mul = aten.mul.Tensor(x, sigmoid)

Every entry of `DEFAULT_TABLE` is tested against eager PyTorch on random inputs.

A graph with size symbols stays symbolic: its inputs are fakes with ``SymInt`` sizes, rules
compute with size expressions (``torch.sum(x, 0) / x.shape[0]`` records a division by ``s0``),
and the result has the same symbols. A relation a rule branches on that the graph did not
already guard is appended to the result's guards as a
[`SymbolGuard`][torchfuse.graph.schema.SymbolGuard] located at the node being decomposed; a rule that
needs a size as a plain ``int`` specializes it (guard ``s0 == 7``). Callers that must stay
general compare ``result.guards`` with ``graph.guards``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torchfuse.autograd.common import (
    AutogradError,
    PassRecorder,
    decode,
    eliminate_dead_code,
    fake_from_meta,
    retrace_builder,
    retracing,
    strip_identities,
    where,
)
from torchfuse.graph import schema as S
from torchfuse.graph.layouts import dense_strides, is_dense
from torchfuse.graph.ops import encode_arg, flatten_result, op_name, resolve_op, to_dtype

Rule = Callable[..., Any]
Table = Mapping[str | torch._ops.OpOverload, Rule]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _dims(x: torch.Tensor, dim: int | Sequence[int] | None) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        return [dim % max(x.dim(), 1)]
    return [d % max(x.dim(), 1) for d in dim] or list(range(x.dim()))


# ----------------------------------------------------------------------------- activations


def _one_minus(x):
    # ``1 - x`` would record aten.rsub, itself a table entry
    return torch.neg(x) + 1


def _opmath(*xs):
    """Tensors widened to the precision eager's kernels compute in (``float16``/``bfloat16`` ->
    ``float32``; a pointwise kernel rounds only its result). Computing a rule's steps in the
    narrow dtype would round after every step: a bf16 ``silu`` written as ``x * sigmoid(x)``
    differs from eager's in a quarter of its elements."""
    return tuple(x.to(_compute_dtype(x.dtype)) if isinstance(x, torch.Tensor) else x for x in xs)


def silu(x):
    (xf,) = _opmath(x)
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def silu_backward(grad_output, x):
    g, xf = _opmath(grad_output, x)
    s = torch.sigmoid(xf)
    return (g * s * (1 + xf * _one_minus(s))).to(grad_output.dtype)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_C = 0.044715


def gelu(x, *, approximate="none"):
    (xf,) = _opmath(x)
    if approximate == "tanh":
        # x**3 first, then its coefficient: eager's kernel rounds in this order
        inner = _SQRT_2_OVER_PI * (xf + _GELU_C * (xf * (xf * xf)))
        return (0.5 * xf * (1 + torch.tanh(inner))).to(x.dtype)
    return (0.5 * xf * (1 + torch.erf(xf * (1 / math.sqrt(2))))).to(x.dtype)


def gelu_backward(grad_output, x, *, approximate="none"):
    g, xf = _opmath(grad_output, x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (xf + _GELU_C * xf * xf * xf)
        t = torch.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_C * xf * xf)
        out = g * (0.5 * (1 + t) + 0.5 * xf * _one_minus(t * t) * d_inner)
        return out.to(grad_output.dtype)
    cdf = 0.5 * (1 + torch.erf(xf * (1 / math.sqrt(2))))
    pdf = torch.exp(-0.5 * xf * xf) * (1 / math.sqrt(2 * math.pi))
    return (g * (cdf + xf * pdf)).to(grad_output.dtype)


def threshold_backward(grad_output, x, threshold):
    return torch.where(x <= threshold, torch.zeros_like(grad_output), grad_output)


def sigmoid_backward(grad_output, output):
    g, o = _opmath(grad_output, output)
    return (g * o * _one_minus(o)).to(grad_output.dtype)


def tanh_backward(grad_output, output):
    g, o = _opmath(grad_output, output)
    return (g * _one_minus(o * o)).to(grad_output.dtype)


# ----------------------------------------------------------------------------- softmax family


def _is_zero(n: Any) -> bool:
    return isinstance(n, int) and n == 0  # a symbolic size is never 0 (0 is specialized)


def softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.dim() and _is_zero(x.shape[dim]):  # amax over nothing has no value: nothing to do
        return torch.empty_like(x, dtype=out_dtype)
    xf = x.to(_compute_dtype(x.dtype))
    e = torch.exp(xf - torch.amax(xf, dim, keepdim=True))
    return (e / torch.sum(e, dim, keepdim=True)).to(out_dtype)


def softmax_backward_data(grad_output, output, dim, input_dtype):
    g = grad_output.to(_compute_dtype(grad_output.dtype))
    o = output.to(g.dtype)
    return (o * (g - torch.sum(g * o, dim, keepdim=True))).to(input_dtype)


def log_softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.dim() and _is_zero(x.shape[dim]):  # amax over nothing has no value: nothing to do
        return torch.empty_like(x, dtype=out_dtype)
    xf = x.to(_compute_dtype(x.dtype))
    shifted = xf - torch.amax(xf, dim, keepdim=True)
    return (shifted - torch.log(torch.sum(torch.exp(shifted), dim, keepdim=True))).to(out_dtype)


def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g = grad_output.to(_compute_dtype(grad_output.dtype))
    o = output.to(g.dtype)
    return (g - torch.exp(o) * torch.sum(g, dim, keepdim=True)).to(input_dtype)


# ----------------------------------------------------------------------------- normalization


def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = list(range(x.dim() - len(normalized_shape), x.dim()))
    xf = x.to(_compute_dtype(x.dtype))
    mean = torch.mean(xf, axes, keepdim=True)
    centered = xf - mean
    var = torch.mean(centered * centered, axes, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    # mean and rstd stay in the compute dtype, as the meta kernel (and eager on cuda, and on
    # cpu with float32 weights) returns them; decompose casts to the recorded dtype if needed
    return out.to(x.dtype), mean, rstd


def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = list(range(x.dim() - len(normalized_shape), x.dim()))
    lead = list(range(x.dim() - len(normalized_shape)))
    n = math.prod(normalized_shape)
    dtype = _compute_dtype(x.dtype)
    g, xf = grad_out.to(dtype), x.to(dtype)
    x_hat = (xf - mean.to(dtype)) * rstd.to(dtype)
    g_hat = g * weight.to(dtype) if weight is not None else g
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        a = torch.sum(g_hat, axes, keepdim=True)
        b = torch.sum(g_hat * x_hat, axes, keepdim=True)
        d_input = ((rstd.to(dtype) / n) * (n * g_hat - a - x_hat * b)).to(x.dtype)
    if output_mask[1] and weight is not None:
        d_weight = (torch.sum(g * x_hat, lead) if lead else g * x_hat).to(weight.dtype)
    if output_mask[2] and bias is not None:
        d_bias = (torch.sum(g, lead) if lead else g.clone()).to(bias.dtype)
    return d_input, d_weight, d_bias


def var_mean(x, dim=None, *, correction=None, keepdim=False):
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    (xf,) = _opmath(x)
    mean = torch.mean(xf, dims, keepdim=True)
    centered = xf - mean
    c = 1 if correction is None else correction
    var = torch.sum(centered * centered, dims, keepdim=keepdim) / max(n - c, 0)
    mean = mean if keepdim else torch.squeeze(mean, dims)
    return var.to(x.dtype), mean.to(x.dtype)


def var(x, dim=None, *, correction=None, keepdim=False):
    return var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def std(x, dim=None, *, correction=None, keepdim=False):
    return torch.sqrt(var(x, dim, correction=correction, keepdim=keepdim))


def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, mean = var_mean(x, dim, correction=correction, keepdim=keepdim)
    return torch.sqrt(v), mean


# ----------------------------------------------------------------------------- losses


_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _nll_weights(x, target, weight, ignore_index):
    mask = target != ignore_index
    safe = torch.where(mask, target, torch.zeros_like(target))
    w = torch.ones_like(safe, dtype=x.dtype) if weight is None else weight[safe]
    return safe, w * mask.to(x.dtype)


def nll_loss_forward(x, target, weight, reduction, ignore_index):
    safe, w = _nll_weights(x, target, weight, ignore_index)
    class_dim = 0 if x.dim() == 1 else 1
    picked = torch.gather(x, class_dim, safe.unsqueeze(class_dim)).squeeze(class_dim)
    losses = -picked * w
    total = torch.sum(w)
    if reduction == _REDUCTION_NONE:
        return losses, torch.zeros_like(total)
    if reduction == _REDUCTION_SUM:
        return torch.sum(losses), total
    return torch.sum(losses) / total, total


def nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    safe, w = _nll_weights(x, target, weight, ignore_index)
    class_dim = 0 if x.dim() == 1 else 1
    scale = -w * grad_output
    if reduction == _REDUCTION_MEAN:
        scale = scale / total_weight
    grad = torch.zeros_like(x)
    return torch.scatter(grad, class_dim, safe.unsqueeze(class_dim), scale.unsqueeze(class_dim))


def mse_loss(x, target, reduction=_REDUCTION_MEAN):
    # eager's kernel rounds ``x - target`` before squaring it (on cpu and cuda alike), so the
    # steps stay in the input dtype here too
    d = x - target
    sq = d * d
    if reduction == _REDUCTION_NONE:
        return sq
    return torch.sum(sq) if reduction == _REDUCTION_SUM else torch.mean(sq)


def mse_loss_backward(grad_output, x, target, reduction):
    # eager's CPU and CUDA kernels write a contiguous gradient whatever the input's layout
    # (``zeros_like(x, LEGACY_CONTIGUOUS_MEMORY_FORMAT)``); torch's meta kernel keeps x's
    n = x.numel()
    if reduction == _REDUCTION_MEAN and not isinstance(n, int):
        # 2 / n as a float would pin the sizes; divide by the size expression instead
        out = grad_output * (x - target) * 2 / n
    else:
        out = grad_output * (x - target) * (2 / n if reduction == _REDUCTION_MEAN else 2)
    return out.contiguous()


# ----------------------------------------------------------------------------- linear algebra, views


def addmm(bias, mat1, mat2, *, beta=1, alpha=1):
    prod = torch.mm(mat1, mat2)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return prod + (bias if beta == 1 else bias * beta)


def t(x):
    return x if x.dim() < 2 else torch.transpose(x, 0, 1)


def rsub(x, other, alpha=1):
    scaled = x * alpha if alpha != 1 else x
    if isinstance(other, torch.Tensor):
        return other - scaled
    return torch.neg(scaled) + other


def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    # a low-precision gradient is accumulated in float32 and rounded once, as eager's cuda
    # kernel does (accumulating bf16 rows one add at a time loses the small ones)
    if grad_output.dtype in _LOW_PRECISION:
        out = embedding_dense_backward(grad_output.to(torch.float32), indices, num_weights,
                                       padding_idx, scale_grad_by_freq)
        return out.to(grad_output.dtype)
    d = grad_output.shape[-1]
    flat_idx = indices.reshape(-1)
    g = grad_output.reshape(-1, d)
    if padding_idx >= 0:
        g = g * (flat_idx != padding_idx).unsqueeze(1).to(g.dtype)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=g.dtype, device=g.device)
        counts = torch.index_put(counts, [flat_idx], torch.ones_like(flat_idx, dtype=g.dtype),
                                 accumulate=True)
        g = g / counts[flat_idx].unsqueeze(1)
    out = torch.zeros(num_weights, d, dtype=g.dtype, device=g.device)
    return torch.index_put(out, [flat_idx], g, accumulate=True)


def native_dropout_backward(grad_output, mask, scale):
    (g,) = _opmath(grad_output)
    return (g * mask.to(g.dtype) * scale).to(grad_output.dtype)


DEFAULT_TABLE: dict[str, Rule] = {
    "aten.silu.default": silu,
    "aten.silu_backward.default": silu_backward,
    "aten.gelu.default": gelu,
    "aten.gelu_backward.default": gelu_backward,
    "aten.threshold_backward.default": threshold_backward,
    "aten.sigmoid_backward.default": sigmoid_backward,
    "aten.tanh_backward.default": tanh_backward,
    "aten._softmax.default": softmax,
    "aten._softmax_backward_data.default": softmax_backward_data,
    "aten._log_softmax.default": log_softmax,
    "aten._log_softmax_backward_data.default": log_softmax_backward_data,
    "aten.native_layer_norm.default": native_layer_norm,
    "aten.native_layer_norm_backward.default": native_layer_norm_backward,
    "aten.var_mean.correction": var_mean,
    "aten.nll_loss_forward.default": nll_loss_forward,
    "aten.nll_loss_backward.default": nll_loss_backward,
    "aten.mse_loss.default": mse_loss,
    "aten.mse_loss_backward.default": mse_loss_backward,
    "aten.addmm.default": addmm,
    "aten.t.default": t,
    "aten.rsub.Tensor": rsub,
    "aten.rsub.Scalar": rsub,
    "aten.native_dropout_backward.default": native_dropout_backward,
}
"""The decompositions autograd applies to joint graphs (and forward-only graphs) by default.

``embedding_dense_backward`` is not one of them: as an ``index_put`` with ``accumulate`` it
runs ATen's sort-based indexing-backward kernel, which serializes on repeated indices (T5's
relative-position buckets: 40 ms of a 53 ms training step on an H200), while ATen's own
``embedding_dense_backward`` kernel, run as an extern call, is what eager runs. The rule
above stays available for a table that asks for it (`EMBEDDING_AS_INDEX_PUT`)."""

EMBEDDING_AS_INDEX_PUT: dict[str, Rule] = {
    "aten.embedding_dense_backward.default": embedding_dense_backward,
}
"""An explicit override: ``embedding_dense_backward`` as a zero-filled ``index_put``."""

SYMBOLIC_PRE_AUTOGRAD: dict[str, Rule] = {
    "aten.var.correction": var,
    "aten.std.correction": std,
    "aten.var_mean.correction": var_mean,
    "aten.std_mean.correction": std_mean,
}
"""Ops whose derivative formulas turn sizes into a float (``var``'s ``2 / (n - 1)``), which
the format can only write by pinning the sizes: in a graph with size symbols the joint graph
differentiates these rules instead of the ops, and the sizes stay symbolic."""


# ----------------------------------------------------------------------------- the pass


class DecompositionError(AutogradError):
    """A rule failed, or decomposition did not converge."""


def _normalize(table: Table) -> dict[str, Rule]:
    return {k if isinstance(k, str) else op_name(k): v for k, v in table.items()}


def decompose(graph: S.Graph, table: Table = DEFAULT_TABLE, *, max_rounds: int = 8,
              once: bool = False) -> S.Graph:
    """``graph`` with every op found in ``table`` replaced by what its rule records.

    Inputs, outputs (kinds, targets, aliases) and their order are unchanged; dead nodes left
    behind are removed. Raises `DecompositionError` when table ops remain after
    ``max_rounds`` passes (a rule that keeps emitting its own op). With ``once`` the rules are
    rewrites rather than decompositions: one pass, and what they record stays, their own op
    included (padding a matmul's unaligned dims records a matmul).
    """
    rules = _normalize(table)
    if once:
        return _decompose_once(graph, rules) if any(n.op in rules for n in graph.nodes) else graph
    for _ in range(max_rounds):
        if not any(n.op in rules for n in graph.nodes):
            return graph
        graph = _decompose_once(graph, rules)
    left = sorted({n.op for n in graph.nodes if n.op in rules})
    raise DecompositionError(f"decomposition did not converge; still present: {', '.join(left)}")


def _as_recorded(value: torch.Tensor, meta: S.TensorMeta | None) -> torch.Tensor:
    """A rule's result in the dtype and memory order the graph recorded for the op's output:
    the nodes reading it (and, in a joint graph, the backward formulas and the saved values)
    were traced against them, which are what eager's kernel returns (``native_layer_norm``'s
    ``mean`` is float32 for a bf16 input; its output is dense whatever its input's order, so a
    ``view`` after it that eager accepts must not meet the permuted order of a pointwise rule)."""
    if meta is None:
        return value
    dtype = to_dtype(meta.dtype)
    if value.dtype != dtype:
        value = value.to(dtype)
    return _in_recorded_order(value, meta)


def _in_recorded_order(value: torch.Tensor, meta: S.TensorMeta) -> torch.Tensor:
    sizes, strides = meta.sizes, meta.strides
    if not all(isinstance(x, int) for x in (*sizes, *strides)) or len(sizes) != value.dim() or \
            any(isinstance(x, torch.SymInt) for x in (*value.shape, *value.stride())):
        return value
    have = value.stride()
    if all(have[d] == st for d, (n, st) in enumerate(zip(sizes, strides, strict=True)) if n > 1):
        return value
    if not is_dense(value.shape, have):
        return value  # a view a rule made on purpose (pad_mm's padded product): its own business
    for fmt, order in _FORMATS.get(len(sizes), _FORMATS[0]):
        dense = dense_strides(sizes, order)
        if all(dense[d] == st for d, (n, st) in enumerate(zip(sizes, strides, strict=True)) if n > 1):
            return value.contiguous(memory_format=fmt)
    return value  # an order no memory format names: left to the consumers


_FORMATS: dict[int, list[tuple[torch.memory_format, tuple[int, ...] | None]]] = {
    0: [(torch.contiguous_format, None)],
    4: [(torch.contiguous_format, None), (torch.channels_last, (1, 3, 2, 0))],
    5: [(torch.contiguous_format, None), (torch.channels_last_3d, (1, 4, 3, 2, 0))],
}
"""Memory formats by rank, with the order of dims from the fastest varying (``None``: the last
dim fastest)."""


def _decompose_once(graph: S.Graph, rules: dict[str, Rule]) -> S.Graph:
    builder, sizes = retrace_builder(graph, graph.name)
    rec = PassRecorder(builder)
    if sizes is not None:  # a guard a rule adds names the node it was decomposing
        sizes.loc_fn = lambda: rec.loc
    env: dict[str, Any] = {}
    with retracing(sizes), rec, torch.no_grad():
        for inp in graph.inputs:
            env[inp.name] = rec.input(fake_from_meta(graph.values[inp.name], sizes), name=inp.name,
                                      kind=inp.kind, target=inp.target)
        for node in graph.nodes:
            args = [decode(a, env, sizes) for a in node.args]
            kwargs = {k: decode(a, env, sizes) for k, a in node.kwargs.items()}
            rule = rules.get(node.op)
            rec.loc, rec.module_path = node.loc, node.module_path
            try:
                result = rule(*args, **kwargs) if rule else resolve_op(node.op)(*args, **kwargs)
            except Exception as e:
                raise DecompositionError(f"{where(node)}: {type(e).__name__}: {e}") from e
            flat = flatten_result(result)
            for name, value in zip(node.outputs, flat[: len(node.outputs)], strict=True):
                if name:
                    if not isinstance(value, torch.Tensor):
                        raise DecompositionError(f"{where(node)}: rule returned {value!r} for "
                                                 f"output {name!r}")
                    if rule is not None:
                        value = _as_recorded(value, graph.values.get(name))
                    env[name] = value
        rec.loc = rec.module_path = None
    for o in graph.outputs:
        value = o.value
        if isinstance(value, S.TensorRef | S.ListArg):
            value = encode_arg(decode(value, env, sizes), rec.name_of)
        builder.add_output(value, kind=o.kind, target=o.target, aliases_input=o.aliases_input)
    return eliminate_dead_code(strip_identities(builder.build()))
