"""``scaled_dot_product_attention`` on a GPU: captured as the fused kernel eager would run.

``torch.nn.functional.scaled_dot_product_attention`` is a composite. It asks the device which
kernel fits the call (flash, memory-efficient, cuDNN, or the math fallback), prepares the
arguments for it and calls it. Asked on capture's fake tensors, which have no data, the CUDA
answer is the math fallback for calls that eager runs fused (measured on an H200: BERT, ViT);
the graph then holds two batched matmuls and an fp32 softmax over the whole score matrix,
several times slower than eager and with a score matrix per layer in memory.

So for CUDA fakes capture asks the question itself, on real tensors with the sizes, strides,
dtypes and ``requires_grad`` of the fakes (allocated, never initialized: the choice reads
metadata only), and records the chosen kernel with the preparation eager gives it:

- **flash** (no mask): the head dim padded to a multiple of 8, the output sliced back;
- **memory-efficient**: a boolean mask made additive (``-inf`` where it is false), its rows
  padded to an 8-element stride when they are not, expanded to ``(B, H, L, S)``;
- **cuDNN**: a boolean mask made additive with ``-65504`` (what torch does for cuDNN);
- the log-sum-exp is computed when a gradient will be asked for (grad mode on and an input
  that requires grad), as eager does, and is what the backward kernel reads.

A mask that is known to mask nothing (made from constants alone, all ``True``; see
`torchfuse.capture.known`) is dropped first, on every device: ``transformers`` builds such
a mask when it cannot look at the data (under a compiler), and drops it in eager mode, where
the GPU then runs flash attention. BERT called without padding gets flash in training too.
A mask known to be the causal one (``ones(L, S).tril()``, built from position indices) becomes
``is_causal=True`` the same way: a causal model called without padding runs what eager runs.

With ``enable_gqa`` and fewer key/value heads than query heads, key and value are repeated
to the query's heads first (what the math fallback does), and the choice is asked for that.
A call with dropout, symbolic sizes or any argument that is not a CUDA fake is left to the
composite as it is. The fused kernels are ATen operators with meta kernels and derivative
formulas, so the joint graph gets their backward kernels, and the inductor runs both as
extern calls.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend
from torchfuse.capture.known import KnownValues, causal_mask, noop_mask
from torchfuse.graph.tracing import FakeTensor, is_symbolic

SDPA = torch.nn.functional.scaled_dot_product_attention
FUSED_DEVICES = ("cuda",)
"""Device types whose choice capture asks on real tensors (on the CPU the fakes get eager's)."""


def _signature(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> None:
    """The parameters of `SDPA` (a builtin without a signature of its own)."""


_SIG = inspect.signature(_signature)


def fused_call(args: list[Any], kwargs: dict[str, Any],
               choose: Callable[..., int] | None = None) -> Callable[[], Any] | None:
    """For a call of `SDPA` on CUDA fakes, a function of no arguments that computes it
    with the kernel eager would pick (run it under the recorder); ``None`` to call the
    composite as it is. ``choose`` replaces the device's choice (for tests)."""
    try:
        bound = _SIG.bind(*args, **kwargs)
    except TypeError:
        return None  # the composite raises the error eager raises
    a = bound.arguments
    q, k, v = a["query"], a["key"], a["value"]
    mask = a.get("attn_mask")
    dropout_p, is_causal = a.get("dropout_p", 0.0), a.get("is_causal", False)
    scale, gqa = a.get("scale"), a.get("enable_gqa", False)
    tensors = [q, k, v] + ([mask] if mask is not None else [])
    if not all(isinstance(t, FakeTensor) for t in tensors) or any(is_symbolic(t) for t in tensors):
        return None
    if dropout_p or q.fake_device.type not in FUSED_DEVICES or q.dim() != 4:
        return None  # dropout draws random numbers in the kernel; other devices are answered right
    repeat = 1
    if gqa and q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
            return None
        repeat = q.shape[1] // k.shape[1]
    kv_shape = (k.shape[0], q.shape[1], *k.shape[2:]) if repeat > 1 else None
    choice = (choose or _device_choice)(q, k, v, mask, is_causal, scale, kv_shape)
    if choice == SDPBackend.FLASH_ATTENTION.value and mask is None:
        make = _flash
    elif choice == SDPBackend.EFFICIENT_ATTENTION.value:
        make = _efficient
    elif choice == SDPBackend.CUDNN_ATTENTION.value:
        make = _cudnn
    else:
        return None

    def run() -> Any:
        key, value = k, v
        if repeat > 1:
            key, value = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return make(q, key, value, mask, is_causal, scale)
    return run


def without_noop_mask(args: list[Any], kwargs: dict[str, Any],
                      known: KnownValues) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments with an ``attn_mask`` that is known to mask nothing (see
    [`noop_mask`][torchfuse.capture.known.noop_mask]) replaced by ``None``, and one known to be
    the causal mask ([`causal_mask`][torchfuse.capture.known.causal_mask]) replaced by
    ``is_causal=True``: the same result, and the kernel choice eager gets when the library
    skips such a mask itself (``transformers`` does, in eager mode, for a model called
    without padding)."""
    try:
        bound = _SIG.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    a = bound.arguments
    mask = a.get("attn_mask")
    if mask is None:
        return args, kwargs
    if noop_mask(mask, known):
        a["attn_mask"] = None
    elif not a.get("is_causal", False) and causal_mask(mask, known) and \
            tuple(mask.shape[-2:]) == (a["query"].shape[-2], a["key"].shape[-2]):
        a["attn_mask"], a["is_causal"] = None, True  # what eager runs with the mask skipped
    else:
        return args, kwargs
    return list(bound.args), dict(bound.kwargs)


def _device_choice(q: FakeTensor, k: FakeTensor, v: FakeTensor, mask: FakeTensor | None,
                   is_causal: bool, scale: float | None, kv_shape: tuple[int, ...] | None) -> int:
    """The device's answer for real (uninitialized) tensors shaped like the fakes."""
    def real(t: FakeTensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if shape is not None:  # the repeated key/value heads: dense, in the query's layout
            return torch.empty(shape, dtype=t.dtype, device=t.fake_device).requires_grad_(t.requires_grad)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.fake_device)
        return out.requires_grad_(t.requires_grad) if t.dtype.is_floating_point else out
    with torch.no_grad() if not torch.is_grad_enabled() else torch.enable_grad():
        return int(torch._fused_sdp_choice(
            real(q), real(k, kv_shape), real(v, kv_shape), real(mask) if mask is not None else None,
            0.0, is_causal, scale=scale, enable_gqa=False))


def _wants_lse(q: Any, k: Any, v: Any) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _additive(mask: Any, dtype: torch.dtype, fill: float) -> Any:
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), fill, zero)


def _flash(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: float | None) -> Any:
    head = q.shape[-1]
    pad = (-head) % 8
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    softmax_scale = scale if scale is not None else 1.0 / math.sqrt(head)
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False,
                                                             scale=softmax_scale)[0]
    return out[..., :head] if pad else out


def _efficient(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: float | None) -> Any:
    bias = _additive(mask, q.dtype, -math.inf)
    if bias is not None:
        aligned = bias.stride(-1) == 1 and all(bias.stride(d) % 8 == 0 for d in range(bias.dim() - 1))
        if not aligned:
            n = bias.shape[-1]
            bias = torch.nn.functional.pad(bias, (0, 8 - n % 8))[..., :n]
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, _wants_lse(q, k, v), 0.0, is_causal, scale=scale)[0]


def _cudnn(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: float | None) -> Any:
    bias = _additive(mask, q.dtype, -65504.0)
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, _wants_lse(q, k, v), 0.0, is_causal, False, scale=scale)[0]


__all__ = ["SDPA", "fused_call", "without_noop_mask"]
