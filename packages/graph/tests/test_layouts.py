"""Fake tensors take eager's memory format where torch's meta kernels do not
(`torchfuse.graph.layouts`): a convolution of channels-last data is channels-last, as ATen's
CPU (oneDNN) and CUDA (cuDNN) kernels make it, and the graph records eager's strides."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torchfuse.graph import trace
from torchfuse.graph.layouts import channels_last_strides, strides_like_channels_last
from torchfuse.graph.tracing import FakeTensor

CL = torch.channels_last
SHAPES = [(2, 8, 5, 5), (2, 8, 1, 1), (2, 1, 5, 5), (1, 8, 1, 5), (1, 1, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_channels_last_strides_are_recognized_as_aten_recognizes_them(shape, fmt):
    t = torch.empty(shape, memory_format=fmt)
    # channels-last unless its strides are the contiguous ones too (then ATen says contiguous)
    expected = fmt == CL and t.stride() != torch.empty(shape).stride()
    assert strides_like_channels_last(shape, t.stride()) == expected
    assert channels_last_strides(shape) == torch.empty(shape, memory_format=CL).stride()


CONVS = [((2, 8, 5, 5), (6, 8, 3, 3), 1), ((2, 8, 5, 5), (6, 8, 1, 1), 1), ((2, 8, 5, 5), (8, 1, 3, 3), 8),
         ((2, 8, 1, 1), (6, 8, 1, 1), 1), ((2, 3, 7, 7), (16, 3, 3, 3), 1)]


@pytest.mark.parametrize(("xs", "ws", "groups"), CONVS)
@pytest.mark.parametrize(("xf", "wf"), list(itertools.product([torch.contiguous_format, CL], repeat=2)))
def test_convolution_of_fakes_is_laid_out_as_eagers(xs, ws, groups, xf, wf):
    x = torch.randn(xs).contiguous(memory_format=xf)
    w = torch.randn(ws).contiguous(memory_format=wf)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    want = torch.ops.aten.convolution.default(x, w, None, *args)
    fake = torch.ops.aten.convolution.default(FakeTensor(x.to("meta"), "cpu"), FakeTensor(w.to("meta"), "cpu"),
                                              None, *args)
    assert fake.stride() == want.stride()


def test_a_traced_convolution_records_eagers_strides():
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=CL)
    w = torch.randn(8, 4, 3, 3)
    graph, _ = trace(lambda x, w: F.conv2d(x, w, padding=1).relu(), x, w)
    want = F.conv2d(x, w, padding=1)
    conv = next(n for n in graph.nodes if n.op == "aten.convolution.default")
    relu = next(n for n in graph.nodes if n.op == "aten.relu.default")
    assert tuple(graph.values[conv.outputs[0]].strides) == want.stride() == channels_last_strides((2, 8, 6, 6))
    assert tuple(graph.values[relu.outputs[0]].strides) == want.relu().stride()


VIEWS = [((3, 4), (4, 1), 0), ((3, 4), (1, 3), 2), ((2, 3), (0, 1), 5), ((0,), (10,), 5), ((4, 0, 3), (7, 9, 1), 3),
         ((), (), 6), ((5, 1), (1, 100), 0)]


@pytest.mark.parametrize(("sizes", "strides", "offset"), VIEWS)
def test_storage_extent_is_the_storage_a_real_view_needs(sizes, strides, offset):
    from torchfuse.graph.layouts import storage_extent

    n = storage_extent(sizes, strides, offset)
    base = torch.arange(max(n, 1), dtype=torch.float32)
    view = base[:n].as_strided(sizes, strides, offset)  # raises when n is too small
    if view.numel():  # and n is no larger than the furthest element it reaches, plus one
        assert n == int(torch.as_strided(torch.arange(n), sizes, strides, offset).max()) + 1


def test_storage_extent_keeps_symbols():
    import sympy
    from torchfuse.graph.layouts import storage_extent

    s = sympy.Symbol("s0", integer=True, positive=True)
    assert sympy.expand(storage_extent([s, 4], [4, 1], 2) - (4 * s + 2)) == 0
    assert storage_extent([s, sympy.Integer(0)], [4, 1], 2) == 2


@pytest.mark.parametrize(("sizes", "strides", "offset"), VIEWS)
def test_fake_from_meta_takes_any_view_with_an_offset(sizes, strides, offset):
    from torchfuse.graph import schema as S
    from torchfuse.graph.tracing import fake_from_meta

    meta = S.TensorMeta(dtype="float32", sizes=list(sizes), strides=list(strides), storage_offset=offset)
    fake = fake_from_meta(meta)
    assert (tuple(fake.shape), fake.stride(), fake.storage_offset()) == (sizes, strides, offset)
