"""Real models built from ``torch.nn`` captured as one graph, compared with eager."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import compile, explain
from torchfuse.capture.backends import list_backends

needs_aot = pytest.mark.skipif("aot_eager" not in list_backends(),
                               reason="the aot_eager backend (torchfuse-autograd) is not installed")


class ResidualBlock(nn.Module):
    """A ResNet basic block: conv-bn-relu, conv-bn, identity shortcut, relu."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def _encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)


def _encoder_prenorm() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True,
                                      activation="gelu")


def _encoder_stack() -> nn.Module:
    return nn.TransformerEncoder(_encoder_layer(), 2, enable_nested_tensor=False)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "encoder_layer": (_encoder_layer, lambda: (torch.randn(2, 5, 16),)),
    "encoder_prenorm": (_encoder_prenorm, lambda: (torch.randn(2, 5, 16),)),
    "encoder_stack": (_encoder_stack, lambda: (torch.randn(2, 5, 16),)),
    "mha": (lambda: nn.MultiheadAttention(16, 4, batch_first=True),
            lambda: (torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(2, 7, 16))),
    "gru": (lambda: nn.GRU(8, 16, num_layers=2, batch_first=True), lambda: (torch.randn(2, 5, 8),)),
    "lstm": (lambda: nn.LSTM(8, 16, batch_first=True), lambda: (torch.randn(2, 5, 8),)),
    "resblock": (lambda: ResidualBlock(4), lambda: (torch.randn(2, 4, 6, 6),)),
}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", list(MODELS))
def test_nn_model_one_graph_matches_eager(name, mode):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    m = make()
    getattr(m, mode)()
    ref_model = copy.deepcopy(m)  # BatchNorm updates running stats in train mode
    args = inputs()
    e = explain(copy.deepcopy(m))(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e.break_reasons)
    c = compile(m, backend="eager")
    with torch.no_grad():
        assert_same(c(*args), ref_model(*args))
        args2 = inputs()
        assert_same(c(*args2), ref_model(*args2))
    if isinstance(m, ResidualBlock) and mode == "train":
        assert_same(m.bn1.running_mean, ref_model.bn1.running_mean)
        assert m.bn1.num_batches_tracked.item() == ref_model.bn1.num_batches_tracked.item()


def test_mha_with_causal_mask_and_weights():
    torch.manual_seed(0)
    m = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)

    def f(x):
        return m(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)

    x = torch.randn(2, 5, 16)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


@needs_aot
@pytest.mark.parametrize("name", ["encoder_prenorm", "gru", "resblock"])
def test_nn_model_training_step_aot_eager(name):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    m = make().train()
    ref_model = copy.deepcopy(m)
    args = inputs()

    def loss_of(model: nn.Module) -> Callable[..., torch.Tensor]:
        def step(*a: torch.Tensor) -> torch.Tensor:
            out = model(*a)
            out = out[0] if isinstance(out, tuple) else out
            return out.square().mean()
        return step

    loss = compile(loss_of(m), backend="aot_eager")(*args)
    loss.backward()
    ref = loss_of(ref_model)(*args)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for (pname, p), q in zip(m.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s, n=pname: f"{n}: {s}")
