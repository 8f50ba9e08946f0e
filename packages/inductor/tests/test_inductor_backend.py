"""The ``inductor`` backend: direct compile without grads, through autograd with grads."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch
import torch.nn.functional as F
from torchfuse.graph import trace
from torchfuse.inductor import inductor


def seed_fn(x, y):
    return F.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean()


def test_entry_point_is_declared():
    eps = {ep.name: ep for ep in entry_points(group="torchfuse.backends")}
    assert eps["inductor"].load() is inductor


def test_backend_forward_without_grad():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    graph, _ = trace(seed_fn, x, y)
    out = inductor(graph, [x, y])(x, y)
    torch.testing.assert_close(out[0], seed_fn(x, y))


def test_backend_with_grad_matches_eager_gradients():
    x = torch.randn(4, 8, requires_grad=True)
    y = torch.randn(4, 8)
    graph, _ = trace(seed_fn, x, y)
    fn = inductor(graph, [x, y])
    out = fn(x, y)[0]
    out.backward()
    got = x.grad.clone()
    x.grad = None
    seed_fn(x, y).backward()
    torch.testing.assert_close(out, seed_fn(x, y))
    torch.testing.assert_close(got, x.grad)


def _fp32_angles(inv_freq, pos):
    # HF's rotary embeddings: a float32 matmul forced with autocast disabled
    with torch.autocast("cpu", enabled=False):
        return inv_freq[:, None] @ pos[None, :]


def test_extern_ops_run_with_autocast_off():
    """The graph's matmul is float32 (recorded inside ``autocast(enabled=False)``): calling the
    compiled Program under an enclosing autocast must not turn its extern ``mm`` into bf16."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    pos = torch.arange(1024, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graph, _ = trace(_fp32_angles, inv_freq, pos)
        fn = inductor(graph, [inv_freq, pos])
        (got,) = fn(inv_freq, pos)
    assert "aten.mm.default" in {n.op for n in graph.nodes}
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _fp32_angles(inv_freq, pos))
