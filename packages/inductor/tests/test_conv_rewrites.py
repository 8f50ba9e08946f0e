"""The convolution-graph rewrites (`torchfuse.inductor.conv`): batch norms folded into the
convolution before them, the others pointwise, CUDA convolution biases moved after the extern
call, half-precision matmul biases back inside ``addmm``. Each rewritten graph is checked
against eager, run by the reference interpreter and compiled (Triton in the interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import decompose
from torchfuse.autograd.joint import retarget_device
from torchfuse.graph.interpreter import run
from torchfuse.graph.tracing import trace
from torchfuse.graph.verify import verify
from torchfuse.inductor import compile_graph
from torchfuse.inductor.conv import (
    bias_into_matmuls,
    biases_after_convolutions,
    fold_batch_norms,
    rewrite_convolution_graphs,
)
from torchfuse.inductor.decompositions import DECOMPOSITIONS
from torchfuse.runtime import load

BN = ("aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default")


def _ops(graph):
    return [n.op for n in graph.nodes]


def _inputs(channels_last=False, bias=True, depthwise=False, dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 6)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 1 if depthwise else 4, 3, 3)
    return [t.to(dtype) if t is not None else t for t in
            (x, w, torch.randn(4) if bias else None, torch.rand(4) + 0.5, torch.randn(4), torch.randn(4),
             torch.rand(4) + 0.5, torch.randn(2, 4, 6, 6))]


def _fn(depthwise):
    def fn(x, w, cb, g, b, rm, rv, residual):
        y = F.conv2d(x, w, cb, padding=1, groups=4 if depthwise else 1)
        return (F.batch_norm(y, rm, rv, g, b, training=False, eps=1e-3) + residual).relu()
    return fn


@pytest.mark.parametrize("variant", ["dense", "channels_last", "no_bias", "depthwise"])
def test_batch_norm_folded_into_the_convolution(variant):
    depthwise = variant == "depthwise"
    args = _inputs(channels_last=variant == "channels_last", bias=variant != "no_bias", depthwise=depthwise)
    if args[2] is None:
        args = [a for a in args if a is not None]
        fn = lambda x, w, g, b, rm, rv, r: _fn(depthwise)(x, w, None, g, b, rm, rv, r)
    else:
        fn = _fn(depthwise)
    graph = decompose(trace(fn, *args)[0], DECOMPOSITIONS)
    assert any(op in BN for op in _ops(graph))
    folded = fold_batch_norms(graph)
    verify(folded)
    assert not any(op in BN for op in _ops(folded))
    conv = next(n for n in folded.nodes if n.op == "aten.convolution.default")
    assert conv.args[2].__class__.__name__ == "NoneArg"  # the shift is added after the call
    want = fn(*args)
    (got,) = run(folded, *args)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (compiled,) = load(compile_graph(graph, options={"cache": False}))(*args)
    torch.testing.assert_close(compiled, want, rtol=1e-5, atol=1e-5)


def test_a_batch_norm_after_another_op_becomes_pointwise():
    def fn(x, g, b, rm, rv):
        return F.batch_norm(x.sigmoid(), rm, rv, g, b, training=False).relu()

    args = [torch.randn(2, 3, 4, 4), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]
    graph = decompose(trace(fn, *args)[0], DECOMPOSITIONS)
    out = fold_batch_norms(graph)
    assert not any(op in BN for op in _ops(out))
    assert "aten.convolution.default" not in _ops(out)
    torch.testing.assert_close(run(out, *args)[0], fn(*args), rtol=1e-5, atol=1e-6)


def test_a_convolution_read_twice_is_not_folded():
    def fn(x, w, g, b, rm, rv):
        y = F.conv2d(x, w)
        return F.batch_norm(y, rm, rv, g, b, training=False) + y

    args = [torch.randn(2, 3, 4, 4), torch.randn(3, 3, 1, 1), torch.rand(3) + 0.5, torch.randn(3),
            torch.randn(3), torch.rand(3) + 0.5]
    out = fold_batch_norms(decompose(trace(fn, *args)[0], DECOMPOSITIONS))
    conv = [n for n in out.nodes if n.op == "aten.convolution.default"]
    assert len(conv) == 1 and conv[0].args[1].name == "arg1"  # the weights as they were
    assert not any(op in BN for op in _ops(out))  # the batch norm is pointwise instead
    torch.testing.assert_close(run(out, *args)[0], fn(*args), rtol=1e-5, atol=1e-5)


def test_training_batch_norm_is_left_alone():
    def fn(x, w, g, b):
        return F.batch_norm(F.conv2d(x, w), None, None, g, b, training=True)

    args = [torch.randn(2, 3, 4, 4), torch.randn(3, 3, 1, 1), torch.rand(3) + 0.5, torch.randn(3)]
    graph = decompose(trace(fn, *args)[0], DECOMPOSITIONS)
    assert fold_batch_norms(graph) is graph


def test_a_cuda_convolution_bias_moves_after_the_call():
    def fn(x, w, b):
        return F.conv2d(x, w, b).relu()

    args = [torch.randn(2, 3, 4, 4), torch.randn(5, 3, 1, 1), torch.randn(5)]
    cpu = decompose(trace(fn, *args)[0], DECOMPOSITIONS)
    assert biases_after_convolutions(cpu) is cpu  # oneDNN adds it inside the convolution
    out = biases_after_convolutions(retarget_device(cpu, "cpu", "cuda"))
    conv = next(n for n in out.nodes if n.op == "aten.convolution.default")
    assert conv.args[2].__class__.__name__ == "NoneArg"
    back = retarget_device(out, "cuda", "cpu")  # the same ops, run here
    torch.testing.assert_close(run(back, *args)[0], fn(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_half_precision_bias_goes_back_into_the_matmul(dtype):
    def fn(x, w, b):
        return F.linear(x, w, b)

    torch.manual_seed(0)
    args = [torch.randn(8, 16, dtype=dtype), torch.randn(12, 16, dtype=dtype), torch.randn(12, dtype=dtype)]
    graph = decompose(trace(fn, *args)[0], DECOMPOSITIONS)
    assert "aten.addmm.default" not in _ops(graph)  # autograd's rule split it
    out = bias_into_matmuls(graph)
    if dtype == torch.float32:
        assert out is graph
        return
    assert "aten.addmm.default" in _ops(out) and "aten.mm.default" not in _ops(out)
    want = fn(*args)
    torch.testing.assert_close(run(out, *args)[0], want, rtol=0, atol=0)  # eager's own addmm
    (compiled,) = load(compile_graph(graph, options={"cache": False}))(*args)
    torch.testing.assert_close(compiled, want, rtol=0, atol=0)


def test_the_pass_can_be_switched_off():
    args = _inputs()
    graph = decompose(trace(_fn(False), *args)[0], DECOMPOSITIONS)
    assert rewrite_convolution_graphs(graph, enabled=False) is graph
    assert not any(op in BN for op in _ops(rewrite_convolution_graphs(graph)))


def test_conv_bn_add_relu_is_the_convolution_and_one_kernel_after_it():
    """Inference ``relu(bn(conv(x)) + r)``: the extern convolution, then one kernel that reads
    its output once and applies the shift, the residual add and the relu (plus the small
    kernel scaling the weights); without the pass batch norm was an extern call of its own."""
    def fn(x, w, g, b, rm, rv, r):
        return (F.batch_norm(F.conv2d(x, w, padding=1), rm, rv, g, b, training=False) + r).relu()

    args = _inputs(bias=False)
    args = [a for a in args if a is not None]
    graph = trace(fn, *args)[0]
    for on, externs in ((True, ["aten.convolution.default"]),
                        (False, ["aten.convolution.default", "aten.native_batch_norm.default"])):
        program = compile_graph(graph, options={"cache": False, "conv_rewrites": on})
        assert [s.op for s in program.steps if hasattr(s, "op")] == externs
        assert len(program.kernels) == (2 if on else 1)
        (got,) = load(program)(*args)
        torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-5)


def test_bfloat16_error_is_eagers():
    """A ResNet block and classifier in bf16 autocast, compiled to C++ (whose bf16 casts round
    to nearest even, as eager's and as Triton's on the GPU; Triton's CPU interpreter truncates,
    which would measure the interpreter): the error against a float32 reference is eager's."""
    from torchfuse.capture import compile, reset

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics of a trained network, not 0 and 1
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
    x = torch.randn(4, 3, 16, 16)

    def bf16(fn):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(x).double()

    with torch.no_grad():
        ref = net(x).double()
    reset()
    got = bf16(compile(net, backend="inductor", options={"cpu_backend": "cpp", "cache": False}))
    want = bf16(net)
    err = lambda y: float((y - ref).norm() / ref.norm())
    assert err(got) <= 1.25 * err(want), (err(got), err(want))
