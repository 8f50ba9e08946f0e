"""Capture answers repeated ops from the meta-kernel memo (`torchfuse.graph.meta_memo`):
the graph is the one captured with every meta kernel run, and computes what eager does."""

from __future__ import annotations

import pytest
import torch
import torchfuse.capture as tf
from torchfuse.capture import config
from torchfuse.capture.config import from_environment
from torchfuse.graph.meta_memo import MEMO


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x))) * 0.5


class _Stack(torch.nn.Module):
    """Identical layers: the second and third meet the first one's ops with the same metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x, mask):
        for b in self.blocks:
            x = b(x)
        # a view, an in-place op and a dtype change: answered by their meta kernels
        y = x.transpose(0, 1)
        y.mul_(2)
        return y.masked_fill(mask.t(), 0).to(torch.float64).sum(dim=0)


def capture_stack():
    """`_Stack` on fixed inputs, captured with a backend that keeps the graph: (the graph, the
    compiled output, eager's). The disk memo's test runs it in a fresh process."""
    torch.manual_seed(0)
    model = _Stack()
    x, mask = torch.randn(4, 8), torch.rand(4, 8) > 0.5
    graphs = []

    def keep(graph, example_inputs):
        graphs.append(graph)
        return tf.backends.eager(graph, example_inputs)

    out = tf.compile(model, backend=keep)(x, mask)
    (graph,) = graphs
    return graph, out, model(x, mask)


def _captured(memo_on: bool):
    MEMO.clear()
    with config.patch(meta_memo=memo_on):
        graph, out, expected = capture_stack()
    return graph, out, expected, MEMO.hits


@pytest.mark.parametrize("memo_on", [True, False])
def test_values_equal_eager(memo_on):
    _, out, expected, hits = _captured(memo_on)
    torch.testing.assert_close(out, expected)
    assert out.dtype == expected.dtype and out.stride() == expected.stride()
    assert (hits > 0) is memo_on


def test_the_graph_is_the_one_every_meta_kernel_makes():
    with_memo, _, _, hits = _captured(True)
    without, _, _, _ = _captured(False)
    assert hits >= 4, "the second and third layers should be answered from the memo"
    # the guards name the two model objects' addresses; everything computed is equal
    for field in ("inputs", "outputs", "nodes", "values", "symbols"):
        assert getattr(with_memo, field) == getattr(without, field), field


def test_the_switch():
    assert from_environment({}).meta_memo
    assert not from_environment({"TORCHFUSE_META_MEMO": "0"}).meta_memo


def test_calls_on_parameters_are_answered(monkeypatch):
    """A layer's parameters are real tensors: described by their metadata, the second and third
    layers' ``native_layer_norm`` and ``addmm`` are answered without running a meta kernel."""
    from torchfuse.graph import tracing

    ran: list[str] = []
    real_run = tracing._run_on_meta

    def counting(func, args, kwargs):
        ran.append(str(func))
        return real_run(func, args, kwargs)

    monkeypatch.setattr(tracing, "_run_on_meta", counting)
    _, out, expected, _ = _captured(True)
    torch.testing.assert_close(out, expected)
    assert ran.count("aten.native_layer_norm.default") == 1
    ran.clear()
    _captured(False)
    assert ran.count("aten.native_layer_norm.default") == 3


def test_real_tensors_are_keyed_by_their_metadata():
    from torchfuse.graph.meta_memo import MetaMemo

    memo = MetaMemo()
    op = torch.ops.aten.add.Tensor
    a, b = torch.zeros(2, 3), torch.zeros(3, 2).t()
    key = memo.key(op, (a, a), {}, lambda name: False, real_tensors=True)
    assert key is not None
    assert memo.key(op, (a, a), {}, lambda name: False) is None  # not asked to describe them
    assert memo.key(op, (a, b), {}, lambda name: False, real_tensors=True) != key  # other strides
    assert memo.key(op, (a, a.double()), {}, lambda name: False, real_tensors=True) != key
    sparse = torch.zeros(2, 3).to_sparse()
    assert memo.key(op, (sparse, sparse), {}, lambda name: False, real_tensors=True) is None


def test_the_default_dtype_is_part_of_the_key():
    """``torch.ones(n)`` answers with the default dtype: a memo filled under float32 must not
    answer a capture under float64 (its graph recorded float32 buffers)."""

    def f(x):
        return x + torch.ones(x.shape[0])

    def recorded_dtypes(x):
        graphs = []

        def keep(graph, example_inputs):
            graphs.append(graph)
            return tf.backends.eager(graph, example_inputs)

        tf.reset()
        out = tf.compile(f, backend=keep)(x)
        (graph,) = graphs
        return out, [graph.values[o].dtype for n in graph.nodes for o in n.outputs]

    MEMO.clear()
    _, dtypes32 = recorded_dtypes(torch.randn(3))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.randn(3, dtype=torch.float32)
        out, dtypes64 = recorded_dtypes(x)
        expected = f(x)
    finally:
        torch.set_default_dtype(previous)
    assert set(dtypes32) == {"float32"}
    assert set(dtypes64) == {"float64"} and out.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(out, expected)
