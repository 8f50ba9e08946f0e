"""Strides equal eager's: every decomposed op, on dense, permuted, channels-last, expanded and
sliced inputs, gives outputs and gradients laid out as eager lays them out.

A later ``view`` reads the strides the graph recorded; a decomposition that returns another
layout than eager's kernel makes a ``view`` that eager accepts fail (or read the wrong
elements once a kernel trusts the recorded strides). Each case runs eager and ``aot`` (the
decomposed joint graph, run by the reference interpreter) side by side and compares the
sizes and strides of the outputs and of every input gradient, then the values. Gradients
are compared for a tangent laid out as its output (what an upstream gradient computed from
the output has, and the layout the backward graph is traced with); a tangent in another
layout is copied into that one, so its gradient's values are eager's and its strides follow
the output's, as torch.compile's do (``test_a_tangent_in_another_layout``).

Besides the decomposed ops, the table has the ops of vision models whose layouts a later
``view`` depends on: convolution, batch norm, layer norm over channels-last data, permute and
view/reshape, Swin's window partition, roll, pad, expand and slices. Where eager's ``view``
rejects a layout, tracing must reject it too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import aot, interpreter_compiler
from torchfuse.graph import trace


def _dense(*shape):
    return torch.randn(*shape)


def _permuted(*shape):  # the last two dims swapped in memory: a transpose's layout
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


def _channels_last(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


def _expanded(*shape):  # stride 0 along the first dim
    return torch.randn(1, *shape[1:]).expand(*shape)


def _sliced(*shape):  # every other element of a longer last dim
    return torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]


LAYOUTS = {"dense": _dense, "permuted": _permuted, "channels_last": _channels_last,
           "expanded": _expanded, "sliced": _sliced}

OPS = {
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "softmax_dim1": lambda x: x.softmax(1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "var_mean": lambda x: torch.var_mean(x, -1, keepdim=True)[0] + x,
    "std": lambda x: x.std(-1, keepdim=True) * x,
    "mse": lambda x: F.mse_loss(x, torch.zeros_like(x), reduction="none"),
    "rsub": lambda x: 1 - x,
    # the weights are arguments of their own (tensors a function closes over are not traced)
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (4, 3, 3, 3), (4,)),
    "conv2d_depthwise": (lambda x, w: F.conv2d(x, w, None, padding=1, groups=3), (3, 1, 3, 3)),
    "conv2d_1x1": (lambda x, w: F.conv2d(x, w), (6, 3, 1, 1)),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (3,), (3,)),
    "batch_norm_eval": (lambda x, m, v: F.batch_norm(x, m, v.abs() + 0.5, None, None, training=False),
                        (3,), (3,)),
    "layer_norm_channels": lambda x: F.layer_norm(x.permute(0, 2, 3, 1), (3,)).permute(0, 3, 1, 2),
    "permute_view": lambda x: (x.permute(0, 2, 3, 1) * 2).view(2, 20, 3),
    "permute_reshape": lambda x: (x.permute(0, 2, 3, 1) * 2).reshape(2, 20, 3),
    "window_partition": lambda x: ((x.permute(0, 2, 3, 1) + 1).view(2, 2, 2, 1, 5, 3)
                                   .permute(0, 1, 3, 2, 4, 5).reshape(-1, 10, 3)),
    "roll": lambda x: torch.roll(x * 2, shifts=(1, 2), dims=(2, 3)),
    "pad": lambda x: F.pad(x, (1, 2, 0, 1)),
    "expand": lambda x: x[:, :1].expand(2, 3, 4, 5).exp(),
    "slice": lambda x: x[..., 1:4].sin(),
    "slice_step": lambda x: x[:, ::2] * 2,
}


def _op(name: str) -> tuple:
    """The function of an op of the table and its extra (weight) arguments, seeded."""
    entry = OPS[name]
    if callable(entry):
        return entry, ()
    torch.manual_seed(0)
    return entry[0], tuple(torch.randn(shape) for shape in entry[1:])


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride() if t.numel() > 1 else None


META_DIFFERS = {("roll", "channels_last"): "torch's meta kernel of roll returns a contiguous "
                "tensor, its CPU kernel a channels-last one for a channels-last input (a permuted "
                "one it makes contiguous); the graph records the meta's, and the backward is a "
                "roll of the channels-last tangent"}
CASES = [pytest.param(op, layout, marks=[pytest.mark.xfail(strict=True, reason=META_DIFFERS[op, layout])]
                      if (op, layout) in META_DIFFERS else [])
         for op in OPS for layout in LAYOUTS]


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_outputs_and_gradients_take_eagers_strides(op, layout):
    torch.manual_seed(1)  # the inputs do not depend on what ran before on the worker
    fn, extra = _op(op)
    x = LAYOUTS[layout](2, 3, 4, 5)
    xe, xa = x.detach().requires_grad_(), x.detach().requires_grad_()  # same layout, two leaves
    try:
        want = fn(xe, *extra)
    except RuntimeError as e:  # a view eager rejects for this layout: tracing rejects it too
        with pytest.raises(Exception, match="view"):
            trace(fn, x, *extra)
        assert "view" in str(e)
        return
    graph, _ = trace(fn, x, *extra)
    compiled = aot(graph, interpreter_compiler, interpreter_compiler)
    (got,) = compiled(xa, *extra)
    assert _layout(got) == _layout(want), f"{op}/{layout} output"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(want)  # laid out as the output, as most upstream gradients are
    (gx_e,) = torch.autograd.grad(want, xe, g)
    (gx_a,) = torch.autograd.grad(got, xa, g)
    assert _layout(gx_a) == _layout(gx_e), f"{op}/{layout} gradient"
    torch.testing.assert_close(gx_a, gx_e, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["permuted", "channels_last", "dense"])
@pytest.mark.parametrize("tangent", ["dense", "permuted", "expanded"])
def test_a_tangent_in_another_layout(layout, tangent):
    """A tangent laid out unlike its output is copied into the output's layout: eager's
    values; the gradient's strides are those of a tangent laid out as the output."""
    fn = OPS["gelu"]
    x = LAYOUTS[layout](2, 3, 4, 5)
    graph, _ = trace(fn, x)
    compiled = aot(graph, interpreter_compiler, interpreter_compiler)
    xe, xa = x.detach().requires_grad_(), x.detach().requires_grad_()
    want, (got,) = fn(xe), compiled(xa)
    g = LAYOUTS[tangent](2, 3, 4, 5)
    (gx_e,) = torch.autograd.grad(want, xe, g)
    (gx_a,) = torch.autograd.grad(got, xa, g)
    (gx_like,) = torch.autograd.grad(fn(xe), xe, torch.empty_like(want).copy_(g))
    assert _layout(gx_a) == _layout(gx_like)
    torch.testing.assert_close(gx_a, gx_e, atol=1e-5, rtol=1e-4)


def test_view_after_a_decomposed_op_on_a_permuted_input():
    # layer norm of a permuted (channels-last-like) tensor, then a view that needs the dense
    # result eager returns: convnext's block, in small
    def fn(x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],))
        return y.view(x.shape[0], -1, x.shape[1]).sum()

    x = torch.randn(2, 4, 3, 3).requires_grad_()
    graph, _ = trace(fn, x)
    compiled = aot(graph, interpreter_compiler, interpreter_compiler)
    xa = x.detach().requires_grad_()
    (got,) = compiled(xa)
    torch.testing.assert_close(got, fn(x))
    got.backward()
    fn(x).backward()
    assert xa.grad.stride() == x.grad.stride()
    torch.testing.assert_close(xa.grad, x.grad)
