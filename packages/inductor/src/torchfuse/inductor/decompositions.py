"""Inductor's decomposition table: composite ATen ops rewritten into the primitive set the
lowering knows (pointwise ops, ``sum``/``amax``/``amin``…, views, ``mm``).

There is one table of decomposition rules, autograd's
(`torchfuse.autograd.decompositions.DEFAULT_TABLE`, which joint graphs are decomposed
with); inductor's `DECOMPOSITIONS` is that table, less the ops its lowering handles
directly (`LOWERED_DIRECTLY`), plus rules for the ops autograd leaves alone
(`RULES`), so a forward graph compiled for inference and one compiled for training
decompose ``gelu`` or ``softmax`` the same way.

The table maps an op name to a Python function written with torch calls. It is
applied by re-running the graph on fake tensors under a [`Recorder`][torchfuse.graph.Recorder]
(`decompose`): a node whose op is in the table runs its function, so the ops that
function calls are recorded in its place; every other node is recorded as it is.

Example (``softmax``, autograd's rule)::

    before:  _softmax = aten._softmax.default(x, -1, False)
    after:   amax = aten.amax(x, [-1], True); sub = aten.sub.Tensor(x, amax)
             exp = aten.exp(sub); sum_1 = aten.sum.dim_IntList(exp, [-1], True)
             div = aten.div.Tensor(exp, sum_1)

Half-precision inputs are widened to float32 inside each decomposition and narrowed at the
end, matching what eager kernels do internally (the casts disappear in fused kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torchfuse.autograd.decompositions import DEFAULT_TABLE
from torchfuse.graph.checkpoint_region import run_region

aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)


def _up(x: torch.Tensor) -> torch.Tensor:
    return aten._to_copy.default(x, dtype=torch.float32) if x.dtype in _HALF else x


def _down(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return aten._to_copy.default(x, dtype=dtype) if x.dtype != dtype else x


def _dims(x: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.dim(), 1) for d in dims]


def _numel(x: torch.Tensor, dims: list[int]) -> int:
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def logsumexp(x, dim, keepdim=False):
    xf = _up(x)
    dims = _dims(x, dim)
    if _numel(x, dims) == 0:  # amax has no identity; the sum of nothing is 0, its log -inf
        out = aten.log.default(aten.sum.dim_IntList(aten.exp.default(xf), dims, keepdim))
        return _down(out, x.dtype)
    m = aten.amax.default(xf, dims, True)
    # rows that are all -inf must give -inf, not nan
    m = aten.where.self(aten.isinf.default(m), aten.zeros_like.default(m), m)
    s = aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(xf, m)), dims, True)
    out = aten.add.Tensor(aten.log.default(s), m)
    if not keepdim:
        out = aten.squeeze.dims(out, dims)
    return _down(out, x.dtype)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    xf = _up(x)
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    eps = torch.finfo(xf.dtype).eps if eps is None else eps
    ms = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(xf, xf), dims, True), _numel(x, dims))
    out = aten.mul.Tensor(xf, aten.rsqrt.default(aten.add.Scalar(ms, eps)))
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    return _down(out, x.dtype)


def _var(x, dim, correction, keepdim):
    xf = _up(x)
    dims = _dims(x, dim)
    n = _numel(x, dims)
    c = 1 if correction is None else correction
    mean = aten.div.Scalar(aten.sum.dim_IntList(xf, dims, True), n)
    xc = aten.sub.Tensor(xf, mean)
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(xc, xc), dims, keepdim), max(n - c, 0))
    return var, (mean if keepdim else aten.squeeze.dims(mean, dims))


def var(x, dim=None, *, correction=None, keepdim=False):
    return _down(_var(x, dim, correction, keepdim)[0], x.dtype)


def std(x, dim=None, *, correction=None, keepdim=False):
    return _down(aten.sqrt.default(_var(x, dim, correction, keepdim)[0]), x.dtype)


def mean_dim(x, dim, keepdim=False, *, dtype=None):
    out_dtype = dtype or x.dtype
    acc = torch.float32 if out_dtype in _HALF else out_dtype
    dims = _dims(x, dim)
    s = aten.sum.dim_IntList(x, dims, keepdim, dtype=acc)
    return _down(aten.div.Scalar(s, _numel(x, dims)), out_dtype)


def mean_default(x, *, dtype=None):
    return mean_dim(x, None, False, dtype=dtype)


def nll_loss_forward(x, target, weight, reduction, ignore_index):
    batched = x.dim() == 2
    xs = x if batched else aten.unsqueeze.default(x, 0)
    t = target if batched else aten.unsqueeze.default(target, 0)
    valid = aten.ne.Scalar(t, ignore_index)
    safe_t = aten.where.self(valid, t, aten.zeros_like.default(t))
    picked = aten.squeeze.dim(aten.gather.default(xs, 1, aten.unsqueeze.default(safe_t, 1)), 1)
    w = aten._to_copy.default(valid, dtype=x.dtype)
    if weight is not None:
        w = aten.mul.Tensor(w, aten.index_select.default(weight, 0, safe_t))
    loss = aten.neg.default(aten.mul.Tensor(picked, w))
    total = aten.sum.default(w)
    if reduction == 0:  # none
        return (loss if batched else aten.squeeze.dim(loss, 0)), aten.zeros.default(
            [], dtype=x.dtype, device=x.device
        )
    s = aten.sum.default(loss)
    if reduction == 1:  # mean
        s = aten.div.Tensor(s, total)
    return s, total


def _bn_axes(x: torch.Tensor) -> tuple[list[int], int, list[int]]:
    """A batch norm's reduced dims (all but the channels, dim 1), their element count, and the
    shape ``[1, C, 1, ...]`` a per-channel value is viewed with."""
    axes = [0, *range(2, x.dim())]
    return axes, _numel(x, axes), [1, x.shape[1], *([1] * (x.dim() - 2))]


def _bn_per_channel(v: torch.Tensor | None, shape: list[int]) -> torch.Tensor | None:
    return None if v is None else aten.view.default(_up(v), shape)


def _bn_train(x, weight, bias, eps):
    """Training batch norm on batch statistics, in float32 for half inputs as ATen computes it:
    ``(out, mean [C], invstd [C], biased var [C], n)``. Two reductions per channel (the mean,
    then the centred squares), which the scheduler fuses with whatever reads ``x``."""
    axes, n, shape = _bn_axes(x)
    xf = _up(x)
    mean = aten.div.Scalar(aten.sum.dim_IntList(xf, axes, True), n)
    centred = aten.sub.Tensor(xf, mean)
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(centred, centred), axes, True), n)
    invstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    out = aten.mul.Tensor(centred, invstd)
    if weight is not None:
        out = aten.mul.Tensor(out, _bn_per_channel(weight, shape))
    if bias is not None:
        out = aten.add.Tensor(out, _bn_per_channel(bias, shape))
    c = [x.shape[1]]
    return (_down(out, x.dtype), aten.view.default(mean, c), aten.view.default(invstd, c),
            aten.view.default(var, c), n)


def _running(stat: torch.Tensor, batch: torch.Tensor, momentum: float) -> torch.Tensor:
    """``(1 - momentum) * stat + momentum * batch`` in float32, in ``stat``'s dtype (eager's
    in-place update of a running statistic)."""
    new = aten.add.Tensor(aten.mul.Scalar(_up(stat), 1.0 - momentum), aten.mul.Scalar(batch, momentum))
    return _down(new, stat.dtype)


def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """``_native_batch_norm_legit_functional``: ``(out, save_mean, save_invstd, new_running_mean,
    new_running_var)``. The running variance takes the unbiased batch variance
    (``var * n / (n - 1)``), as eager's update does."""
    if not training:
        return (*batch_norm_eval(x, weight, bias, running_mean, running_var, eps), running_mean, running_var)
    out, mean, invstd, var, n = _bn_train(x, weight, bias, eps)
    unbiased = aten.mul.Scalar(var, n / (n - 1)) if n > 1 else aten.mul.Scalar(var, math.inf)
    return (out, mean, invstd, _running(running_mean, mean, momentum),
            _running(running_var, unbiased, momentum))


def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    """``_native_batch_norm_legit.no_stats`` (no running statistics: always batch statistics)."""
    return _bn_train(x, weight, bias, eps)[:3]


def batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    """A batch norm on running statistics: ``(out, mean, invstd)``, the two [C] values of
    ATen's eval kernel (empty on the CPU; nothing reads them)."""
    _, _, shape = _bn_axes(x)
    invstd = aten.rsqrt.default(aten.add.Scalar(_up(running_var), eps))
    out = aten.mul.Tensor(aten.sub.Tensor(_up(x), aten.view.default(_up(running_mean), shape)),
                          aten.view.default(invstd, shape))
    if weight is not None:
        out = aten.mul.Tensor(out, _bn_per_channel(weight, shape))
    if bias is not None:
        out = aten.add.Tensor(out, _bn_per_channel(bias, shape))
    return _down(out, x.dtype), _up(running_mean), invstd


def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                        output_mask):
    """``native_batch_norm_backward`` in float32: with ``xmu = x - mean``,
    ``dx = (g - mean(g) - xmu * invstd² * mean(g · xmu)) · invstd · w`` when training (the
    batch statistics depend on ``x``), ``dx = g · invstd · w`` on running statistics;
    ``dw = sum(g · xmu) · invstd``, ``db = sum(g)``.

    All three are returned whatever ``output_mask`` says: the recorded node names every output
    (an unrequested one is an undefined tensor in eager, a value nobody reads here), and dead
    code elimination drops the ones nothing reads."""
    axes, n, shape = _bn_axes(x)
    if train:
        mean, invstd = _up(save_mean), _up(save_invstd)
    else:
        mean, invstd = _up(running_mean), aten.rsqrt.default(aten.add.Scalar(_up(running_var), eps))
    mean_c, invstd_c = aten.view.default(mean, shape), aten.view.default(invstd, shape)
    g, xmu = _up(grad_out), aten.sub.Tensor(_up(x), mean_c)
    sum_g = aten.sum.dim_IntList(g, axes, True)
    dot = aten.sum.dim_IntList(aten.mul.Tensor(g, xmu), axes, True)
    scale = invstd_c if weight is None else aten.mul.Tensor(invstd_c, _bn_per_channel(weight, shape))
    del output_mask  # see the docstring
    if train:
        proj_scale = aten.div.Scalar(aten.mul.Tensor(dot, aten.mul.Tensor(invstd_c, invstd_c)), n)
        proj = aten.mul.Tensor(xmu, proj_scale)
        centred = aten.sub.Tensor(aten.sub.Tensor(g, aten.div.Scalar(sum_g, n)), proj)
        d_input = _down(aten.mul.Tensor(centred, scale), x.dtype)
    else:
        d_input = _down(aten.mul.Tensor(g, scale), x.dtype)
    c = [x.shape[1]]
    wdtype = weight.dtype if weight is not None else x.dtype
    d_weight = _down(aten.view.default(aten.mul.Tensor(dot, invstd_c), c), wdtype)
    d_bias = _down(aten.view.default(sum_g, c), wdtype)
    return d_input, d_weight, d_bias


def addcmul(x, a, b, *, value=1):
    return aten.add.Tensor(x, aten.mul.Scalar(aten.mul.Tensor(a, b), value))


def addcdiv(x, a, b, *, value=1):
    return aten.add.Tensor(x, aten.mul.Scalar(aten.div.Tensor(a, b), value))


def lerp_scalar(x, end, weight):
    return aten.add.Tensor(x, aten.mul.Scalar(aten.sub.Tensor(end, x), weight))


def hardsigmoid(x):
    return aten.div.Scalar(aten.clamp.default(aten.add.Scalar(x, 3.0), 0.0, 6.0), 6.0)


def hardswish(x):
    return aten.mul.Tensor(x, hardsigmoid(x))


def leaky_relu(x, negative_slope=0.01):
    return aten.where.self(aten.gt.Scalar(x, 0), x, aten.mul.Scalar(x, negative_slope))


def softplus(x, beta=1, threshold=20):
    bx = aten.mul.Scalar(x, beta)
    soft = aten.div.Scalar(aten.log1p.default(aten.exp.default(bx)), beta)
    return aten.where.self(aten.gt.Scalar(bx, threshold), x, soft)


def stack(tensors, dim=0):
    d = dim % (tensors[0].dim() + 1)
    return aten.cat.default([aten.unsqueeze.default(t, d) for t in tensors], d)


def max_dim(x, dim, keepdim=False):
    return aten.amax.default(x, [dim], keepdim), aten.argmax.default(x, dim, keepdim)


def min_dim(x, dim, keepdim=False):
    return aten.amin.default(x, [dim], keepdim), aten.argmin.default(x, dim, keepdim)


def _max_all(x):
    return aten.amax.default(x, list(range(x.dim())), False)


def _min_all(x):
    return aten.amin.default(x, list(range(x.dim())), False)


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    """``nn.MultiheadAttention``'s inference fast path (torchvision's ViT, batch first): the
    input projection, scaled dot-product attention per head, the output projection. ATen's
    kernel returns an undefined tensor for the weights it was not asked for, which no buffer
    can hold; this returns an empty one, as its meta kernel does."""
    if mask is not None:
        raise NotImplementedError("_native_multi_head_attention with a mask")
    b, lq, e = query.shape
    d = e // num_head
    w_q, w_k, w_v = aten.split.Tensor(qkv_weight, e, 0)
    b_q, b_k, b_v = aten.split.Tensor(qkv_bias, e, 0)

    def heads(x, w, bias):
        n = x.shape[1]
        y = aten.addmm.default(bias, aten.view.default(x, [b * n, e]), aten.t.default(w))
        return aten.permute.default(aten.view.default(y, [b, n, num_head, d]), [0, 2, 1, 3])

    q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
    if need_weights:
        scores = aten.div.Scalar(aten.matmul.default(q, aten.transpose.int(k, -1, -2)), math.sqrt(d))
        weights = aten._softmax.default(scores, -1, False)
        attn = aten.matmul.default(weights, v)
        weights = aten.mean.dim(weights, [1]) if average_attn_weights else weights
    else:
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        weights = aten.empty.memory_format([0], dtype=query.dtype, device=query.device)
    attn = aten.view.default(aten.clone.default(aten.permute.default(attn, [0, 2, 1, 3]),
                                                memory_format=torch.contiguous_format), [b * lq, e])
    out = aten.view.default(aten.addmm.default(proj_bias, attn, aten.t.default(proj_weight)), [b, lq, e])
    return out, weights


LOWERED_DIRECTLY = frozenset({"aten.t.default", "aten.rsub.Tensor", "aten.rsub.Scalar"})
"""Ops of autograd's table that inductor does not decompose: its lowering has rules for them
(``t`` is a view; ``rsub`` is one subtraction)."""

OVERRIDES: Mapping[str, Callable[..., Any]] = {
    # autograd's rule weighs with ``ones_like(t) * mask`` and indexes the class weights with
    # ``weight[t]`` (a wrap of negative indices): one multiply and one select per element more
    # in the loss kernel than this one, which computes the same values
    "aten.nll_loss_forward.default": nll_loss_forward,
}
"""Ops of autograd's table that inductor decomposes its own way, each with its reason."""

RULES: Mapping[str, Callable[..., Any]] = {
    "aten.logsumexp.default": logsumexp,
    "aten.rms_norm.default": rms_norm,
    "aten._fused_rms_norm.default": lambda x, shape, w, eps: (rms_norm(x, shape, w, eps), None),
    "aten.var.correction": var,
    "aten.std.correction": std,
    "aten.mean.dim": mean_dim,
    "aten.mean.default": mean_default,
    "aten.addcmul.default": addcmul,
    "aten.addcdiv.default": addcdiv,
    "aten.lerp.Scalar": lerp_scalar,
    "aten.hardsigmoid.default": hardsigmoid,
    "aten.hardswish.default": hardswish,
    "aten.leaky_relu.default": leaky_relu,
    "aten.softplus.default": softplus,
    "aten.stack.default": stack,
    "aten.max.dim": max_dim,
    "aten.min.dim": min_dim,
    "aten.max.default": _max_all,
    "aten.min.default": _min_all,
    "aten._native_multi_head_attention.default": native_multi_head_attention,
    # a custom autograd.Function's outputs below autograd (torchfuse.graph.custom_grad):
    # copies, which fuse into the kernels that compute them
    "torchfuse.custom_grad.default": lambda backward, inputs, outputs, saved: [o.clone() for o in outputs],
    # an activation-checkpointed region below autograd (torchfuse.graph.checkpoint_region):
    # its own ops, inlined
    "torchfuse.checkpoint.default": lambda region, inputs: run_region(region, inputs),
    "torchfuse.after.default": lambda x, deps: torch.ops.aten.alias.default(x),
}
"""Inductor's own rules: ops autograd's table leaves alone that inductor's primitive set does
not have. None of them is in autograd's table (a test checks it)."""

BATCH_NORM_TRAINING: Mapping[str, Callable[..., Any]] = {
    "aten._native_batch_norm_legit_functional.default": batch_norm_functional,
    "aten._native_batch_norm_legit.no_stats": batch_norm_no_stats,
    "aten.native_batch_norm_backward.default": batch_norm_backward,
}
"""Training batch norms as our reductions and pointwise ops, used under
``batch_norm_training="decompose"`` (the inference ones are the conv pass's: folded or
pointwise). Not the default: on the H200 (run ``models_gpu_20261202_0738``, with channels-last
on as well) ResNet-18/50 training steps took 2-3x longer than with ATen's batch norm."""

DECOMPOSITIONS: Mapping[str, Callable[..., Any]] = {
    **{op: rule for op, rule in DEFAULT_TABLE.items() if op not in LOWERED_DIRECTLY},
    **OVERRIDES,
    **RULES,
}
"""op name -> decomposition function: autograd's table (one rule per op for both packages:
``gelu``, ``softmax``, ``layer_norm`` … are written once, there), less
`LOWERED_DIRECTLY`, plus `RULES`."""

DECOMPOSITIONS_BN_TRAINING: Mapping[str, Callable[..., Any]] = {**DECOMPOSITIONS, **BATCH_NORM_TRAINING}
"""`DECOMPOSITIONS` with `BATCH_NORM_TRAINING` (``batch_norm_training="decompose"``)."""
