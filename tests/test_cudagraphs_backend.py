"""The ``cudagraphs`` backend: capture + extern calls + CUDA-graph replay, no codegen."""

import pytest
import torch
import torchfuse.capture as tfc
from torchfuse.inductor.cudagraphs import extern_program


def small_ops(x, y):
    for _ in range(3):
        x = torch.sin(x) * y + 0.5
        y = torch.cos(y) - x * 0.1
    return x, y


def test_registered_by_name():
    assert "cudagraphs" in tfc.list_backends()


def test_program_has_one_extern_step_per_node():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    graph = tfc.explain(small_ops)(x, y).graphs[0]
    program = extern_program(graph, device="cpu")
    assert len(program.steps) == len(graph.nodes)
    assert program.kernels == ()


@pytest.mark.parametrize("requires_grad", [False, True])
def test_matches_eager_on_cpu(requires_grad):
    tfc.reset()
    x = torch.randn(8, 8, requires_grad=requires_grad)
    y = torch.randn(8, 8)
    compiled = tfc.compile(small_ops, backend="cudagraphs")
    got = compiled(x, y)
    ref = small_ops(x, y)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r)
    if requires_grad:
        (gx,) = torch.autograd.grad(sum(t.sum() for t in got), [x])
        (rx,) = torch.autograd.grad(sum(t.sum() for t in ref), [x])
        torch.testing.assert_close(gx, rx)


@pytest.mark.gpu
def test_replays_on_the_gpu():
    tfc.reset()
    x, y = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    compiled = tfc.compile(small_ops, backend="cudagraphs")
    for _ in range(3):  # warm-up, record, replay
        got = [t.clone() for t in compiled(x, y)]
    for g, r in zip(got, small_ops(x, y), strict=True):
        torch.testing.assert_close(g, r)
