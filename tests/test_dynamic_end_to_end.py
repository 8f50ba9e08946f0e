"""Dynamic shapes end to end: capture -> autograd -> inductor -> runtime, against eager.

The default backend (``inductor``) on the CPU through Triton's interpreter, small tensors: the
compile counts the dynamic-shapes issue asks for, values and gradients at every size, and a
transformer-block-shaped module over varying sequence lengths.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import torchfuse.capture as tfc
from torchfuse.capture import config as capture_config


def mul_sum(x, y):
    return (x * y).sum(-1) + 1


def _inputs(b):
    return torch.randn(b, 16), torch.randn(b, 16)


@pytest.mark.parametrize("dynamic, most", [(None, 2), (True, 1)])
def test_batch_sizes_2_to_13_compile_at_most_twice(dynamic, most):
    compiled = tfc.compile(mul_sum, dynamic=dynamic)
    for b in range(2, 14):
        x, y = _inputs(b)
        torch.testing.assert_close(compiled(x, y), mul_sum(x, y))
    assert compiled.graph_count() == most


def test_dynamic_false_compiles_per_size_then_runs_eagerly_with_a_warning():
    limit = 3
    compiled = tfc.compile(mul_sum, dynamic=False)
    with capture_config.patch(recompile_limit=limit), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in range(2, 8):
            x, y = _inputs(b)
            torch.testing.assert_close(compiled(x, y), mul_sum(x, y))
    assert compiled.graph_count() == limit
    assert any("recompile limit" in str(w.message) for w in caught)


class Block(torch.nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        h = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(h)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def test_transformer_block_over_sequence_lengths_compiles_once_after_the_first_recompile():
    torch.manual_seed(0)
    block = Block()
    compiled = tfc.compile(block)
    for t in (5, 6, 7, 9):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    assert compiled.graph_count() == 2


def test_training_with_a_symbolic_batch_matches_eager_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    compiled = tfc.compile(model, dynamic=True)
    for b in (3, 7, 12):
        x, target = torch.randn(b, 8), torch.randint(0, 4, (b,))
        loss = F.cross_entropy(compiled(x), target)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want_loss = F.cross_entropy(model(x), target)
        want = torch.autograd.grad(want_loss, list(model.parameters()))
        torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert compiled.graph_count() == 1
