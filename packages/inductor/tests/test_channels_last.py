"""Channels-last per graph (`torchfuse.inductor.layout`), forced on the CPU (oneDNN's
convolutions take NHWC data as cuDNN's do): values, gradients and output strides equal
eager's; the graph converts only at its edges (the input once, each weight once, each output
back), every convolution reads and writes channels-last buffers, and the policy decides when
it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import aot
from torchfuse.autograd.joint import retarget_device
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.graph.layouts import channels_last_strides
from torchfuse.inductor import compile_graph_stages, inductor
from torchfuse.inductor.backend import compiler
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.layout import MIN_CHANNELS, channels_last, layout_pass, wants_channels_last
from torchfuse.runtime import load

CL = torch.channels_last
ALWAYS = {"cache": False, "channels_last": "always"}


def net(x, w1, w2, w3, g, b, fc):
    """Two 3x3 convolutions with a residual add, a 1x1 convolution, a global pool, a matmul."""
    y = F.conv2d(x, w1, padding=1).relu()
    z = F.conv2d(y, w2, padding=1)
    z = (z * g.view(1, -1, 1, 1) + b.view(1, -1, 1, 1) + y).relu()
    z = F.conv2d(z, w3)
    return z.mean([2, 3]) @ fc, z


def _net_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 8, 8, generator=g), torch.randn(16, 3, 3, 3, generator=g) * 0.3,
            torch.randn(16, 16, 3, 3, generator=g) * 0.1, torch.randn(8, 16, 1, 1, generator=g) * 0.3,
            torch.rand(16, generator=g) + 0.5, torch.randn(16, generator=g), torch.randn(8, 4, generator=g)]


def _clones(graph: S.Graph) -> list[str]:
    return [n.kwargs["memory_format"].name for n in graph.nodes if n.op == "aten.clone.default"]


def _conv_buffers(program: S.Program) -> list[tuple]:
    """(input, weight, output) strides of every extern convolution of ``program``."""
    buffers = {b.name: b for b in program.buffers}
    out = []
    for step in program.steps:
        if isinstance(step, S.ExternStep) and step.op == "aten.convolution.default":
            names = [step.args[0].name, step.args[1].name, step.outputs[0]]
            out.append(tuple(tuple(buffers[n].strides) for n in names))
    return out


def test_inference_graph_runs_channels_last_and_converts_at_its_edges():
    args = _net_inputs()
    graph, _ = trace(net, *args)
    result = compile_graph_stages(graph, options=ALWAYS)
    laid_out = dict((s.name, s.value) for s in result.stages)["layout"]
    # the input once, w1 and w2 once each (w3 is 1x1: its contiguous layout is channels-last
    # in memory already), the 4-d output back to eager's contiguous layout; nothing else
    assert sorted(_clones(laid_out)) == ["channels_last"] * 3 + ["contiguous_format"]
    convs = _conv_buffers(result.program)
    assert len(convs) == 3
    for x_strides, w_strides, out_strides in convs:
        assert x_strides[1] == w_strides[1] == out_strides[1] == 1  # channels fastest
    want = net(*args)
    got = load(result.program)(*args)
    for o, w in zip(got, want, strict=True):
        assert o.stride() == w.stride()
        torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-4)


def test_channels_last_inputs_are_not_converted():
    args = _net_inputs()
    args[0] = args[0].contiguous(memory_format=CL)
    graph, _ = trace(net, *args)
    out = channels_last(graph)
    assert sorted(_clones(out)) == ["channels_last"] * 2  # the weights; z is channels-last in eager too
    want = net(*args)
    got = load(compile_graph_stages(graph, options=ALWAYS).program)(*args)
    assert got[1].stride() == want[1].stride() == channels_last_strides((2, 8, 8, 8))
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)


def test_a_view_that_needs_the_recorded_layout_gets_it():
    def fn(x, w):
        return F.conv2d(x, w, padding=1).view(2, -1).sigmoid()  # (N, C*H*W): NCHW order

    args = [torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)]
    graph, _ = trace(fn, *args)
    (got,) = load(compile_graph_stages(graph, options=ALWAYS).program)(*args)
    want = fn(*args)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_policy():
    args = _net_inputs()
    graph, _ = trace(net, *args)
    cuda = retarget_device(graph, "cpu", "cuda")
    assert not wants_channels_last(graph, "auto")       # CPU graphs: only when asked
    assert wants_channels_last(graph, "always")
    assert not wants_channels_last(cuda, "auto")        # 16 output channels at most: too few
    wide, _ = trace(lambda x, w: F.conv2d(x, w), torch.randn(1, 3, 4, 4), torch.randn(MIN_CHANNELS, 3, 1, 1))
    assert wants_channels_last(retarget_device(wide, "cpu", "cuda"), "auto")
    assert not wants_channels_last(wide, "auto")
    # "auto" leaves training graphs and grouped/depthwise convolutions in NCHW (measured slower)
    assert not wants_channels_last(retarget_device(wide, "cpu", "cuda"), "auto", training=True)
    assert wants_channels_last(wide, "always", training=True)
    dw, _ = trace(lambda x, w, v: F.conv2d(F.conv2d(x, w), v, groups=MIN_CHANNELS),
                  torch.randn(1, 3, 4, 4), torch.randn(MIN_CHANNELS, 3, 1, 1), torch.randn(MIN_CHANNELS, 1, 3, 3))
    assert not wants_channels_last(retarget_device(dw, "cpu", "cuda"), "auto")
    assert wants_channels_last(retarget_device(dw, "cpu", "cuda"), "always")
    assert InductorConfig().channels_last == "auto"
    assert not wants_channels_last(cuda, "never")
    plain, _ = trace(lambda x: x.relu(), torch.randn(2, 3, 4, 4))
    assert not wants_channels_last(plain, "always")     # no convolution
    assert not wants_channels_last(channels_last(graph), "always")  # done already: the halves
    assert layout_pass(plain, "always") is plain
    with pytest.raises(ValueError, match="channels_last"):
        wants_channels_last(graph, "sometimes")
    with pytest.raises(ValueError, match="channels_last"):
        InductorConfig(channels_last="sometimes")


def _block(x, w1, g1, b1, rm, rv, w2):
    y = F.conv2d(x, w1, padding=1)
    y = F.batch_norm(y, rm, rv, g1, b1, training=True).relu()
    return (F.conv2d(y, w2, padding=1) + y).relu()


def _block_inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 3, 6, 6, generator=g), torch.randn(8, 3, 3, 3, generator=g) * 0.3,
            torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g), torch.zeros(8), torch.ones(8),
            torch.randn(8, 8, 3, 3, generator=g) * 0.2]


def _train_args(base):
    grads = (1, 2, 3, 6)
    return [t.clone().requires_grad_(i in grads) for i, t in enumerate(base)]


def test_training_runs_channels_last_through_the_backward():
    base = _block_inputs()
    ours, theirs = _train_args(base), _train_args(base)
    graph, _ = trace(_block, *ours)
    programs: list[S.Program] = []

    def comp(g, inputs):
        fn = compiler(g, inputs, options=ALWAYS)
        programs.append(fn.program)
        return fn

    fn = aot(layout_pass(graph, "always"), comp, comp, compile_backward_early=True)
    (out,) = fn(*ours)
    want = _block(*theirs)
    assert out.stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    out.backward(grad)
    want.backward(grad)
    for a, e in zip(ours, theirs, strict=True):
        if e.grad is not None:
            assert a.grad.stride() == e.grad.stride()  # the parameters' layout
            torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours[4], theirs[4])  # running stats
    torch.testing.assert_close(ours[5], theirs[5])
    # the backward's convolutions take channels-last gradients and activations
    backward = [p for p in programs if any(isinstance(s, S.ExternStep) and s.op == "aten.convolution_backward.default"
                                           for s in p.steps)]
    assert len(backward) == 1
    buffers = {b.name: b for b in backward[0].buffers}
    for step in backward[0].steps:
        if isinstance(step, S.ExternStep) and step.op == "aten.convolution_backward.default":
            grad_out = buffers[step.args[0].name]
            assert grad_out.strides[1] == 1, grad_out


def _counted_block(*args):
    args[-1].add_(1)  # num_batches_tracked's in-place update: a write with no reader
    return _block(*args[:-1])


def test_the_inductor_backend_takes_the_option():
    base = _block_inputs()
    ours, theirs = [*_train_args(base), torch.zeros((), dtype=torch.int64)], \
        [*_train_args(base), torch.zeros((), dtype=torch.int64)]
    graph, _ = trace(_counted_block, *ours)
    fn = inductor(graph, ours, options=ALWAYS)
    (out,) = fn(*ours)
    want = _counted_block(*theirs)
    assert ours[-1].item() == theirs[-1].item() == 1  # the write survives the rewrite
    torch.testing.assert_close(ours[4], theirs[4])
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for a, e in zip(ours, theirs, strict=True):
        if e.grad is not None:
            assert a.grad.stride() == e.grad.stride()
            torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-4)
