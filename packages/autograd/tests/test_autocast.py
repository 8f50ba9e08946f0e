"""Training under ``torch.autocast``: the joint graph, the partition and the saved values keep
the dtypes autocast gave each op when the graph was recorded, as eager computes them.

A recorded graph already holds autocast's work (its casts are ``_to_copy`` nodes). The passes
and the compiled halves run it with autocast off: re-running it under the autocast that still
encloses the call (``with torch.autocast(...): loss = compiled(...)``) used to cast it a second
time, which (a) turned the float32 matmul of a ``torch.autocast(enabled=False)`` region (rotary
embeddings) and the float32 matmuls inside SDPA's math kernel into bf16 ones, and (b) could
make a saved value come out of the forward in another dtype than the backward declares
(``_safe_softmax`` under CUDA autocast). Decompositions of low-precision ops compute in float32
and round once, as eager kernels do, and produce the dtypes the graph recorded.

The models are small hand-made functions, and a real ``transformers`` Llama's rotary embeddings
when ``transformers`` is installed; ``tests/models`` runs whole models.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchfuse.autograd import DEFAULT_TABLE, aot, decompose, joint_graph, partition
from torchfuse.graph import run, trace
from torchfuse.graph.ops import to_dtype

BF16 = torch.bfloat16


def _autocast():
    return torch.autocast("cpu", dtype=BF16)


def _checked(graph, example_inputs, seen):
    """The reference compiler, checking every input and output tensor against the dtype the
    graph declares for it (what the runtime checks before it launches a Program)."""
    seen.append(graph)

    def call(*inputs):
        for inp, t in zip(graph.inputs, inputs, strict=True):
            if isinstance(t, torch.Tensor):
                want = to_dtype(graph.values[inp.name].dtype)
                assert t.dtype == want, f"{graph.name} input {inp.name!r}: {t.dtype}, declared {want}"
        outs = run(graph, *inputs)
        for o, t in zip(graph.outputs, outs, strict=True):
            if isinstance(t, torch.Tensor):
                want = to_dtype(graph.values[o.value.name].dtype)
                assert t.dtype == want, f"{graph.name} output {o.value.name!r}: {t.dtype}, declared {want}"
        return outs

    return call


def _block(x, wq, wv, inv_freq, mask):
    """Attention with rotary-style float32 angles: the three places autocast decides."""
    b, t, d = x.shape
    q = (x @ wq).view(b, t, 2, d // 2).transpose(1, 2)           # autocast: a bf16 mm
    v = (x @ wv).view(b, t, 2, d // 2).transpose(1, 2)
    with torch.autocast("cpu", enabled=False):                    # forced float32, as HF rotary
        pos = torch.arange(t, dtype=torch.float32) * 37.0         # positions far from 0
        freqs = (inv_freq[:, None] @ pos[None, :]).t()            # a float32 mm
        cos = torch.cat([freqs, freqs], -1).cos()
    q = q * cos                                                   # bf16 * f32 -> f32
    # the math kernel: float32 bmm's inside the (autocast-wrapped) sdpa, a saved _safe_softmax
    a = F.scaled_dot_product_attention(q, q, v, attn_mask=mask)
    return (a.float() * q).sum()


def _block_inputs():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    wq, wv = torch.randn(16, 16) / 4, torch.randn(16, 16) / 4
    inv_freq = 1.0 / (100 ** (torch.arange(0, 4).float() / 4))
    keep = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    keep[1, :, 7, :] = False                                      # a fully masked row
    mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    return x, wq, wv, inv_freq, mask


def _eager_block(inputs):
    x, wq, wv, inv_freq, mask = inputs
    wq, wv = wq.clone().requires_grad_(), wv.clone().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH), _autocast():
        loss = _block(x, wq, wv, inv_freq, mask)
    loss.backward()                                               # outside autocast, as advised
    return loss, wq.grad, wv.grad


@pytest.mark.parametrize("decompositions", [DEFAULT_TABLE, {}], ids=["default_table", "no_table"])
def test_training_under_an_enclosing_autocast_matches_eager(decompositions):
    inputs = _block_inputs()
    with sdpa_kernel(SDPBackend.MATH), _autocast():
        graph, consts = trace(_block, *inputs, name="block")
    assert not consts
    ops = {n.op for n in graph.nodes}
    assert {"aten._safe_softmax.default", "aten.bmm.default"} <= ops
    seen: list = []
    compiler = functools.partial(_checked, seen=seen)
    fn = aot(graph, compiler, compiler, decompositions=decompositions)

    x, wq, wv, inv_freq, mask = inputs
    wq, wv = wq.clone().requires_grad_(), wv.clone().requires_grad_()
    with _autocast():   # the caller's autocast is still on while the compiled graph runs
        (loss,) = fn(x, wq, wv, inv_freq, mask)
    loss.backward()
    want, gq, gv = _eager_block(inputs)

    assert loss.dtype == want.dtype == torch.float32
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wq.grad, gq, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wv.grad, gv, rtol=1e-4, atol=1e-5)
    forward, backward = seen
    # the float32 work stays float32 in the joint graph and the forward, as in eager
    mms = [forward.values[n.outputs[0]].dtype for n in forward.nodes
           if n.op in ("aten.mm.default", "aten.bmm.default")]
    assert mms.count("float32") == 3 and mms.count("bfloat16") == 2, mms
    # every saved value has the dtype the backward declares for it
    saved = {o.value.name: forward.values[o.value.name].dtype
             for o in forward.outputs if o.kind == "saved_value"}
    declared = {i.name: backward.values[i.name].dtype for i in backward.inputs if i.name in saved}
    assert saved == declared
    assert saved, "the partition saved nothing"


def test_joint_graph_ignores_an_enclosing_autocast():
    inputs = _block_inputs()
    with sdpa_kernel(SDPBackend.MATH), _autocast():
        graph, _ = trace(_block, *inputs, name="block")
    rg = [False, True, True, False, False]
    plain = joint_graph(graph, rg)
    with _autocast():
        under = joint_graph(graph, rg)
        under_dec = decompose(under)
        under_part = partition(under_dec)
    assert [(n.op, [under.values[o].dtype for o in n.outputs if o]) for n in under.nodes] == \
           [(n.op, [plain.values[o].dtype for o in n.outputs if o]) for n in plain.nodes]
    part = partition(decompose(plain))
    assert part.saved == under_part.saved


def test_backward_called_inside_autocast_runs_the_traced_dtypes():
    inputs = _block_inputs()
    with sdpa_kernel(SDPBackend.MATH), _autocast():
        graph, _ = trace(_block, *inputs, name="block")
    seen: list = []
    compiler = functools.partial(_checked, seen=seen)
    fn = aot(graph, compiler, compiler)
    x, wq, wv, inv_freq, mask = inputs
    wq, wv = wq.clone().requires_grad_(), wv.clone().requires_grad_()
    with _autocast():
        (loss,) = fn(x, wq, wv, inv_freq, mask)
        loss.backward()   # the checked backward would see bf16 values if autocast reached it
    _, gq, gv = _eager_block(inputs)
    torch.testing.assert_close(wq.grad, gq, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wv.grad, gv, rtol=1e-4, atol=1e-5)


@pytest.fixture
def cuda_softmax_policy():
    """CUDA autocast runs ``softmax`` in float32; CPU autocast leaves it alone. This registers
    CUDA's policy for the CPU, for the test's duration, so that the failure seen with BERT on
    the GPU can be reproduced here: ``_safe_softmax``'s kernel calls ``softmax``."""
    lib = torch.library.Library("aten", "IMPL")

    def softmax_in_float32(x, dim, dtype=None):
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.softmax.int(x.float() if x.dtype == BF16 else x, dim, dtype)

    lib.impl("softmax.int", softmax_in_float32, "AutocastCPU")
    try:
        with _autocast():
            assert torch.ops.aten._safe_softmax(torch.randn(2, 3, dtype=BF16), -1).dtype == torch.float32
        yield
    finally:
        lib._destroy()


def _masked_attention(x, wq, wk, mask):
    q, k = x @ wq, x @ wk                                        # bf16
    s = q @ k.t() + mask                                         # bf16 (the mask is bf16)
    # inside SDPA's autocast wrapper the math kernel runs with autocast excluded: its
    # _safe_softmax stays bf16 in eager, and is recorded so
    with torch.autocast("cpu", enabled=False):
        p = torch.ops.aten._safe_softmax(s, -1)
    return (p @ q).float().square().sum()                        # p is saved for the backward


def test_saved_safe_softmax_keeps_its_recorded_dtype(cuda_softmax_policy):
    """BERT under bf16 autocast on the GPU: ``expected dtype bfloat16, got torch.float32`` for
    the saved ``safe_softmax``. The graph records it bf16; run again under the caller's autocast,
    its kernel's ``softmax`` went to float32 and the saved value no longer matched."""
    torch.manual_seed(0)
    x, wq, wk = torch.randn(6, 8), torch.randn(8, 8) / 3, torch.randn(8, 8) / 3
    mask = torch.zeros(6, 6, dtype=BF16)
    mask[:, 4:] = float("-inf")
    mask[5] = float("-inf")                                      # a fully masked row
    with _autocast():
        graph, _ = trace(_masked_attention, x, wq, wk, mask, name="attention")
    (node,) = [n for n in graph.nodes if n.op == "aten._safe_softmax.default"]
    assert graph.values[node.outputs[0]].dtype == "bfloat16"
    seen: list = []
    compiler = functools.partial(_checked, seen=seen)
    fn = aot(graph, compiler, compiler)
    ours = [w.clone().requires_grad_() for w in (wq, wk)]
    ref = [w.clone().requires_grad_() for w in (wq, wk)]
    with _autocast():
        (loss,) = fn(x, *ours, mask)
        want = _masked_attention(x, *ref, mask)
    loss.backward()
    want.backward()
    forward, _ = seen
    assert any(o.kind == "saved_value" and forward.values[o.value.name].dtype == "bfloat16"
               for o in forward.outputs)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def _layer_norm_head(x, w1, lw, lb):
    """A bf16 activation into a LayerNorm with float32 weights (BERT's prediction head)."""
    h = F.gelu(x @ w1)                                            # bf16
    return F.layer_norm(h, (h.shape[-1],), lw, lb).float().square().sum()


@pytest.mark.parametrize("decompositions", [DEFAULT_TABLE, {}], ids=["default_table", "no_table"])
def test_mixed_dtype_layer_norm_trains_through_the_decompositions(decompositions):
    torch.manual_seed(0)
    x, w1 = torch.randn(6, 8), torch.randn(8, 8) / 3
    lw, lb = torch.randn(8), torch.randn(8)
    with _autocast():
        graph, _ = trace(_layer_norm_head, x, w1, lw, lb, name="head")
    (ln,) = [n for n in graph.nodes if n.op == "aten.native_layer_norm.default"]
    assert [graph.values[o].dtype for o in ln.outputs] == ["bfloat16", "float32", "float32"]
    seen: list = []
    compiler = functools.partial(_checked, seen=seen)
    fn = aot(graph, compiler, compiler, decompositions=decompositions)
    ours = [t.clone().requires_grad_() for t in (w1, lw, lb)]
    ref = [t.clone().requires_grad_() for t in (w1, lw, lb)]
    with _autocast():
        (loss,) = fn(x, *ours)
        want = _layer_norm_head(x, *ref)
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    # eager's cpu kernel for a bf16 input rounds the weight and bias gradients at bf16
    # precision; the table's rule keeps them in float32 (as the cuda kernel does)
    tol = {} if decompositions else {"rtol": 1e-5, "atol": 1e-5}
    for p, q in zip(ours, ref, strict=True):
        assert p.grad.dtype == q.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, **(tol or {"rtol": 1e-2, "atol": 1e-2}))


_LOW_PRECISION_RULES = {
    "aten.silu.default": lambda x, g: (x,),
    "aten.silu_backward.default": lambda x, g: (g, x),
    "aten.gelu.default": lambda x, g: (x,),
    "aten.gelu_backward.default": lambda x, g: (g, x),
    "aten.sigmoid_backward.default": lambda x, g: (g, torch.sigmoid(x)),
    "aten.tanh_backward.default": lambda x, g: (g, torch.tanh(x)),
    "aten.native_dropout_backward.default": lambda x, g: (g, x > 0, 1.25),
}


_LOW_PRECISION_CASES = [(name, {}) for name in sorted(_LOW_PRECISION_RULES)] + [
    (name, {"approximate": "tanh"}) for name in ("aten.gelu.default", "aten.gelu_backward.default")]


@pytest.mark.parametrize(("name", "kwargs"), _LOW_PRECISION_CASES,
                         ids=[n + ("-tanh" if k else "") for n, k in _LOW_PRECISION_CASES])
def test_low_precision_rules_round_once_like_eager(name, kwargs):
    torch.manual_seed(0)
    x = torch.randn(4096, dtype=BF16) * 3
    g = torch.randn(4096, dtype=BF16)
    args = _LOW_PRECISION_RULES[name](x, g)
    op = getattr(torch.ops.aten, name.split(".")[1]).default
    want = op(*args, **kwargs)
    got = DEFAULT_TABLE[name](*args, **kwargs)
    assert got.dtype == want.dtype
    exact = op(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args], **kwargs)
    # eager's kernel computes in float32 and rounds once; so must the rule: its error is
    # eager's (rounding after every bf16 step made it 1.2-3.3 times larger)
    ratio = (got.double() - exact).abs().mean() / (want.double() - exact).abs().mean()
    assert ratio < 1.02, f"{name}: error {ratio:.2f} times eager's"


def test_llama_rotary_attention_scores_train_under_autocast():
    """A real ``transformers`` Llama's rotary embeddings (float32 inside
    ``autocast(enabled=False)``) between two bf16 projections: the compiled step matches eager
    at positions where bf16 angles would be off by radians."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=4096)
    rotary = LlamaRotaryEmbedding(cfg)
    t = 64
    positions = torch.arange(2048 - t, 2048)[None]

    def scores(x, wq, wk):
        q = (x @ wq).view(1, t, 2, 16).transpose(1, 2)
        k = (x @ wk).view(1, t, 2, 16).transpose(1, 2)
        cos, sin = rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return (q @ k.transpose(-1, -2)).float().square().mean()

    torch.manual_seed(0)
    x, wq, wk = torch.randn(1, t, 32), torch.randn(32, 32) / 6, torch.randn(32, 32) / 6
    with _autocast():
        graph, consts = trace(scores, x, wq, wk, name="scores")
    fn = aot(graph, functools.partial(_checked, seen=[]), functools.partial(_checked, seen=[]))
    ours = [w.clone().requires_grad_() for w in (wq, wk)]
    ref = [w.clone().requires_grad_() for w in (wq, wk)]
    with _autocast():
        (loss,) = fn(x, *ours, *consts.values())
        want = scores(x, *ref)
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
