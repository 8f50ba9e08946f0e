"""Training batch norms decomposed (`torchfuse.inductor.decompositions`): the rules against
ATen's kernels on real tensors (values, saved statistics, running-stat updates, gradients; fp32
and bf16), then compiled end to end through the autograd glue: values, gradients and the
buffers' updates vs eager, with no batch-norm extern left in either Program."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import aot
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.inductor.backend import compiler
from torchfuse.inductor.compile import decomposes_batch_norm
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.decompositions import (
    BATCH_NORM_TRAINING,
    DECOMPOSITIONS,
    batch_norm_backward,
    batch_norm_functional,
    batch_norm_no_stats,
)

aten = torch.ops.aten
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _bn_inputs(dtype, shape=(4, 3, 5, 6)):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 1).to(dtype)
    c = shape[1]
    w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    rm, rv = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    return x, w, b, rm, rv


DECOMPOSE = {"cache": False, "batch_norm_training": "decompose"}


def test_training_batch_norm_ops_are_in_their_own_table():
    # chosen per graph (batch_norm_training, "auto" by default): not in the default table
    for op in ("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.no_stats",
               "aten.native_batch_norm_backward.default"):
        assert op in BATCH_NORM_TRAINING and op not in DECOMPOSITIONS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (8, 5), (2, 4, 3, 2, 2)])
def test_functional_batch_norm_matches_aten(dtype, shape):
    x, w, b, rm, rv = _bn_inputs(dtype, shape)
    want = aten._native_batch_norm_legit_functional.default(x, w, b, rm, rv, True, 0.1, 1e-5)
    got = batch_norm_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert got[0].dtype == want[0].dtype == dtype
    torch.testing.assert_close(got[0], want[0], **TOL[dtype])
    for g, e in zip(got[1:], want[1:], strict=True):  # statistics and running stats: float32
        torch.testing.assert_close(g.to(e.dtype), e, rtol=1e-4, atol=1e-4)
    # the running variance takes the unbiased batch variance, as eager's update does
    n = x.numel() // x.shape[1]
    var = x.float().transpose(0, 1).reshape(x.shape[1], -1).var(dim=1, unbiased=True)
    torch.testing.assert_close(got[4], 0.9 * rv + 0.1 * var, rtol=1e-4, atol=1e-4)
    assert n > 1


def test_no_stats_batch_norm_matches_aten():
    x, w, b, _, _ = _bn_inputs(torch.float32)
    want = aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    got = batch_norm_no_stats(x, w, b, True, 0.1, 1e-5)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_matches_aten(dtype, train, affine):
    x, w, _, rm, rv = _bn_inputs(dtype)
    w = w if affine else None
    _, mean, invstd = aten.native_batch_norm.default(x, w, None, rm, rv, True, 0.1, 1e-5)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    mask = [True, affine, affine]
    want = aten.native_batch_norm_backward.default(grad, x, w, rm, rv, mean, invstd, train, 1e-5, mask)
    got = batch_norm_backward(grad, x, w, rm, rv, mean, invstd, train, 1e-5, mask)
    for g, e in zip(got, want, strict=True):
        if e is None or not mask[0]:
            continue
        torch.testing.assert_close(g.to(e.dtype), e, **TOL[dtype])


def _block(x, w, b, rm, rv, residual):
    return (F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5) + residual).relu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_training_batch_norm_matches_eager(dtype):
    x, w, b, rm, rv = _bn_inputs(dtype)
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    ours = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_(),
            rm.clone(), rv.clone(), residual]
    theirs = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_(),
              rm.clone(), rv.clone(), residual]
    graph, _ = trace(_block, *ours)
    programs: list[S.Program] = []

    def comp(g, inputs):
        fn = compiler(g, inputs, options=DECOMPOSE)
        programs.append(fn.program)
        return fn

    fn = aot(graph, comp, comp, compile_backward_early=True)
    out = fn(*ours)
    out = out[0] if isinstance(out, list | tuple) else out
    want = _block(*theirs)
    torch.testing.assert_close(out, want, **TOL[dtype])
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    out.backward(grad)
    want.backward(grad)
    for a, e in zip(ours[:3], theirs[:3], strict=True):
        torch.testing.assert_close(a.grad, e.grad, **TOL[dtype])
    torch.testing.assert_close(ours[3], theirs[3], rtol=1e-4, atol=1e-4)  # running mean, written back
    torch.testing.assert_close(ours[4], theirs[4], rtol=1e-4, atol=1e-4)  # running var
    assert len(programs) == 2  # forward and backward
    externs = [s.op for p in programs for s in p.steps if isinstance(s, S.ExternStep)]
    assert not [op for op in externs if "batch_norm" in op], externs
    # the normalization, the residual add and the relu are one kernel after the statistics
    names = [k.name for p in programs for k in p.kernels]
    assert any("relu" in k and "add" in k and "rsqrt" in k for k in names), names


def test_decomposed_batch_norm_of_a_leaf_without_grad_matches_eager():
    # the input needs no gradient: the backward's output_mask leaves it out, yet the recorded
    # node names that output (the rule must still return a tensor for it)
    x, w, b, rm, rv = _bn_inputs(torch.float32)
    ours = [x, w.clone().requires_grad_(), b.clone().requires_grad_(), rm.clone(), rv.clone()]
    theirs = [x, w.clone().requires_grad_(), b.clone().requires_grad_(), rm.clone(), rv.clone()]

    def f(x, w, b, rm, rv):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1).relu().sum()

    graph, _ = trace(f, *ours)
    fn = aot(graph, lambda g, i: compiler(g, i, options=DECOMPOSE), lambda g, i: compiler(g, i, options=DECOMPOSE))
    out = fn(*ours)
    out = out[0] if isinstance(out, list | tuple) else out
    want = f(*theirs)
    torch.testing.assert_close(out, want, **TOL[torch.float32])
    out.backward()
    want.backward()
    for a, e in zip(ours[1:3], theirs[1:3], strict=True):
        torch.testing.assert_close(a.grad, e.grad, **TOL[torch.float32])
    torch.testing.assert_close(ours[3], theirs[3])
    torch.testing.assert_close(ours[4], theirs[4])


@pytest.mark.parametrize(("policy", "device", "want"), [
    ("auto", "cpu", False), ("auto", "cuda:0", True), ("aten", "cuda:0", False), ("decompose", "cpu", True)])
def test_batch_norm_policy_per_graph(policy, device, want):
    # "auto" (the default) decomposes the batch norms of a CUDA graph, keeps ATen's on the CPU
    assert InductorConfig().batch_norm_training == "auto"
    x, w, b, rm, rv = _bn_inputs(torch.float32)
    graph, _ = trace(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=True), x, w, b, rm, rv)
    values = {k: S.TensorMeta(**{**{f: getattr(v, f) for f in v.__struct_fields__}, "device": device})
              for k, v in graph.values.items()}
    graph = S.Graph(**{**{f: getattr(graph, f) for f in graph.__struct_fields__}, "values": values})
    assert decomposes_batch_norm(graph, InductorConfig(batch_norm_training=policy)) is want


def test_batch_norm_policy_rejects_unknown_values():
    with pytest.raises(ValueError, match="batch_norm_training='cudnn'"):
        InductorConfig(batch_norm_training="cudnn")
