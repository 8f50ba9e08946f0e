"""``scaled_dot_product_attention`` is captured as the fused kernel eager runs on the GPU.

On the CPU the device's choice is stood in for (there is no CUDA kernel to ask), and the graph
is checked for the kernel and the preparation of its arguments; on a GPU (marked ``gpu``) the
compiled values and gradients are compared with eager's for each kind of call.
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torchfuse.capture import attention, compile, explain


def _ops(fn, *args):
    e = explain(fn)(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    return collections.Counter(n.op for n in e.graphs[0].nodes)


@pytest.fixture
def choose(monkeypatch):
    """Have capture treat the CPU like a GPU whose answer is ``backend``."""
    def set_backend(backend: SDPBackend) -> None:
        monkeypatch.setattr(attention, "FUSED_DEVICES", ("cpu",))
        monkeypatch.setattr(attention, "_device_choice", lambda *a: backend.value)
    return set_backend


def _qkv(heads=4, kv_heads=4, head_dim=16, keys=8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 8, head_dim, generator=g)
    k = torch.randn(2, kv_heads, keys, head_dim, generator=g)
    v = torch.randn(2, kv_heads, keys, head_dim, generator=g)
    return q, k, v


def test_memory_efficient_kernel_with_a_padding_mask(choose):
    choose(SDPBackend.EFFICIENT_ATTENTION)
    mask = torch.ones(2, 1, 8, 12, dtype=torch.bool)
    mask[1, :, :, :3] = False

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    ops = _ops(f, *_qkv(keys=12), mask)
    assert ops["aten._scaled_dot_product_efficient_attention.default"] == 1
    assert ops["aten.where.self"] == 1  # the boolean mask made additive
    assert ops["aten.constant_pad_nd.default"] == 1  # rows of 12: padded to an 8-element stride
    assert not any("softmax" in op or "bmm" in op for op in ops)
    ops = _ops(f, *_qkv(keys=16), torch.ones(2, 1, 8, 16, dtype=torch.bool))
    assert ops["aten.constant_pad_nd.default"] == 0  # aligned already


def test_flash_kernel_pads_an_odd_head_dim(choose):
    choose(SDPBackend.FLASH_ATTENTION)
    ops = _ops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               *_qkv(head_dim=12))
    assert ops["aten._scaled_dot_product_flash_attention.default"] == 1
    assert ops["aten.constant_pad_nd.default"] == 3


def test_grouped_query_attention_repeats_key_and_value(choose):
    choose(SDPBackend.CUDNN_ATTENTION)
    ops = _ops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
               *_qkv(heads=4, kv_heads=2))
    assert ops["aten._scaled_dot_product_cudnn_attention.default"] == 1
    assert ops["aten.repeat_interleave.self_int"] + ops["aten.index_select.default"] >= 2 or \
        ops["aten.expand.default"] >= 2


def test_math_choice_and_dropout_keep_the_composite(choose):
    choose(SDPBackend.MATH)
    ops = _ops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *_qkv())
    assert not any("efficient" in op or "cudnn" in op for op in ops)
    choose(SDPBackend.EFFICIENT_ATTENTION)
    torch.manual_seed(0)
    ops = _ops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5), *_qkv())
    assert not any("efficient" in op for op in ops)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@_CUDA
@pytest.mark.parametrize("kind", ["none", "causal", "bool_mask", "float_mask", "gqa", "head_80"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fused_attention_matches_eager_on_the_gpu(kind, backend):
    heads, kv_heads, d = (8, 2, 64) if kind == "gqa" else (8, 8, 80 if kind == "head_80" else 64)
    g = torch.Generator(device="cuda").manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(4, heads, 128, d), make(4, kv_heads, 128, d), make(4, kv_heads, 128, d)
    mask = None
    if kind == "bool_mask":
        mask = torch.ones(4, 1, 128, 128, dtype=torch.bool, device="cuda")
        mask[1, ..., :40] = False
    elif kind == "float_mask":
        mask = torch.zeros(4, 1, 128, 128, dtype=torch.bfloat16, device="cuda")
        mask[2, ..., 100:] = float("-inf")

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal",
                                              enable_gqa=kind == "gqa")

    ops = _ops(f, q, k, v)
    assert any(op.startswith("aten._scaled_dot_product_") and "math" not in op for op in ops), ops
    got = compile(f, backend=backend)(q, k, v)
    want = f(q, k, v)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(got.float().square().sum(), (q, k, v))
    wants = torch.autograd.grad(want.float().square().sum(), (q, k, v))
    for a, b in zip(grads, wants, strict=True):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
@_CUDA
@pytest.mark.parametrize("kind", ["none", "causal", "bool_mask"])
def test_fused_attention_without_grad_matches_eager_on_the_gpu(kind):
    # Inference: no log-sum-exp is asked for, and cuDNN leaves it undefined (None) though its
    # meta kernel plans one. The compiled Program must pass that through (a GPT-2 inference run
    # once failed on it with "'NoneType' object has no attribute 'stride'").
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 8, 128, 64, generator=g, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    mask = None
    if kind == "bool_mask":
        mask = torch.ones(4, 1, 128, 128, dtype=torch.bool, device="cuda")
        mask[1, ..., :40] = False

    def f(q, k, v):
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")

    got = compile(f, backend="inductor")(q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=2e-2, atol=2e-2)
