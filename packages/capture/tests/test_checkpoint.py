"""``torch.utils.checkpoint.checkpoint`` is captured as a ``torchfuse.checkpoint`` node that
runs the region as a Graph of its own (`torchfuse.capture.checkpoint`): values and gradients
as eager's, the region's activations recomputed in backward instead of saved, and a break,
with torch's own behaviour, for what capture does not model."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchfuse.capture import compile, explain


class Block(nn.Module):
    def __init__(self, width=32, p=0.0):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.p = p

    def forward(self, x, scale=1.0):
        h = torch.nn.functional.gelu(self.up(x))
        h = torch.nn.functional.dropout(h, self.p, self.training)
        return x + self.down(h) * scale


class Net(nn.Module):
    def __init__(self, reentrant=False, use_checkpoint=True, p=0.0, **kwargs):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(p=p) for _ in range(3))
        self.reentrant, self.use_checkpoint, self.kwargs = reentrant, use_checkpoint, kwargs

    def forward(self, x):
        for block in self.blocks:
            if self.use_checkpoint:
                x = checkpoint(block, x, use_reentrant=self.reentrant, **self.kwargs)
            else:
                x = block(x)
        return x.square().mean()


def _grads(model, x, fn):
    model.zero_grad(set_to_none=True)
    loss = fn(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointed_blocks_are_one_graph_with_eagers_gradients(backend, reentrant):
    model = Net(reentrant=reentrant).train()
    x = torch.randn(4, 8, 32, requires_grad=True)
    e = explain(model)(x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    assert sum(n.op == "torchfuse.checkpoint.default" for g in e.graphs for n in g.nodes) == 3
    got_loss, got = _grads(model, x, compile(model, backend=backend))
    want_loss, want = _grads(model, x, model)
    torch.testing.assert_close(got_loss, want_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def _saved_activation_bytes(model, fn, x):
    """Bytes autograd keeps for the backward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        if t.untyped_storage().data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(x)
    loss.backward()
    return total


def test_the_region_is_recomputed_not_saved():
    x = torch.randn(16, 8, 32)
    saved = {}
    for use in (False, True):
        model = Net(use_checkpoint=use).train()
        compiled = compile(model, backend="aot_eager")
        compiled(x).backward()  # compile first: the hooks below see the compiled step only
        saved[use] = _saved_activation_bytes(model, compiled, x)
    # with checkpointing only (16, 8, 32) tensors are kept: the three blocks' inputs and the
    # loss's input; without, each block keeps a (16, 8, 128) activation as well
    width = 16 * 8 * 32 * 4
    assert saved[True] <= 4 * width < saved[False], saved


def test_under_no_grad_the_function_is_called_inline():
    model = Net().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        e = explain(model)(x)
        assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
        assert not any(n.op == "torchfuse.checkpoint.default" for g in e.graphs for n in g.nodes)
        torch.testing.assert_close(compile(model, backend="eager")(x), model(x))


WRITES: list[int] = []


def _writes(x):
    WRITES.append(1)
    return x.sin()  # its backward reads x: eager's checkpoint recomputes the function


@pytest.mark.filterwarnings("ignore:torch.utils.checkpoint")
@pytest.mark.parametrize("make, reason", [
    (lambda: Net(reentrant=None), "without a constant use_reentrant"),
    (lambda: Net(reentrant=True, scale=2.0), "use_reentrant=True) with keyword arguments"),
    (lambda: Net(context_fn=lambda: (torch.no_grad(), torch.no_grad())), "with a context_fn"),
])
def test_what_capture_does_not_model_is_a_break(make, reason):
    model = make().train()
    x = torch.randn(2, 8, 32, requires_grad=True)
    e = explain(model)(x)
    assert e.graph_break_count >= 1 and any(reason in r.reason for r in e.break_reasons), e.break_reasons


def _dropped(model, x, fn, seed=123):
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    x.grad = None
    loss = fn(x)
    loss.backward()
    return [loss.detach(), x.grad.clone(), *(p.grad.clone() for p in model.parameters())]


def test_a_region_that_draws_keeps_its_draws_for_the_recompute():
    """Dropout inside checkpointed blocks: one graph; the region's draws are kept (one
    ``clone`` per draw, the region's extra outputs), and the recompute reads them: with the
    generator seeded alike, loss and gradients are eager's (eager replays the generator)."""
    from torchfuse.graph import checkpoint_region

    model = Net(p=0.5).train()
    x = torch.randn(2, 8, 32, requires_grad=True)
    e = explain(model)(x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    regions = [checkpoint_region.loads(n.args[0].value) for g in e.graphs for n in g.nodes
               if n.op == "torchfuse.checkpoint.default"]
    assert [checkpoint_region.draws(r) for r in regions] == [1, 1, 1]
    again = checkpoint_region.recompute_graph(regions[0])
    assert len(again.inputs) == len(regions[0].inputs) + 1 and len(again.outputs) == len(regions[0].outputs) - 1
    assert not any(n.op.startswith("aten.bernoulli") for n in again.nodes)
    for got, want in zip(_dropped(model, x, compile(model, backend="aot_eager")), _dropped(model, x, model),
                         strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_recompute_reads_the_numbers_the_forward_drew(backend):
    """Inductor draws numbers of its own, not eager's, so compare with the forward's own
    mask: for ``out = dropout(x, p) * a`` the gradients are ``x.grad = mask * a / (1 - p)``
    and ``a.grad = out.sum() / a``, which only hold if the recompute masked as the forward."""
    a = torch.tensor(1.5, requires_grad=True)

    def region(h):
        return torch.nn.functional.dropout(h, 0.5, True) * a

    def f(x):
        return checkpoint(region, x, use_reentrant=False)

    x = torch.randn(64, 32, requires_grad=True)
    assert explain(f)(x).graph_break_count == 0
    out = compile(f, backend=backend)(x)
    out.sum().backward()
    kept = (out != 0).float()
    assert 0.3 < kept.mean().item() < 0.7  # it did drop
    torch.testing.assert_close(x.grad, kept * 1.5 / 0.5)
    torch.testing.assert_close(a.grad, out.sum().detach() / 1.5)


def test_a_region_that_writes_outside_itself_is_a_break_and_writes_as_eager():
    def f(x):
        return checkpoint(_writes, x, use_reentrant=False).sum()

    x = torch.randn(3, requires_grad=True)
    e = explain(f)(x)
    assert any("writes outside itself" in r.reason for r in e.break_reasons), e.break_reasons
    WRITES.clear()
    compile(f, backend="eager")(x).backward()
    compiled = len(WRITES)
    WRITES.clear()
    f(x).backward()
    assert compiled == len(WRITES) == 2  # forward, then the recompute: Python ran it as eager


def _clamped(x, w):
    h = x @ w
    causal = torch.arange(h.shape[0], device=x.device)[:, None] >= torch.arange(h.shape[1], device=x.device)
    return torch.where(causal, h, -1.0).exp()  # a factory naming the input's device: the CPU here


def test_a_region_with_a_factory_naming_a_device_is_captured():
    # the op's meta kernel once ran the region on meta tensors, where `arange(device=cpu)`
    # made a real CPU tensor beside meta ones: "Tensor on device meta is not on the
    # expected device cpu" (T5's causal position-bias mask), a break at every layer
    def f(x, w):
        return checkpoint(_clamped, x, w, use_reentrant=False).sum()

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    e = explain(f)(x, w)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    got = torch.autograd.grad(compile(f, backend="aot_eager")(x, w), [x, w])
    want = torch.autograd.grad(f(x, w), [x, w])
    for g, wt in zip(got, want, strict=True):
        torch.testing.assert_close(g, wt)


def test_a_size_that_changes_keeps_the_region_in_the_graph():
    # the second length makes the sequence size a symbol: the region Graph takes the
    # symbol from its own inputs instead of being a break
    model = Net().train()
    compiled = compile(model, backend="aot_eager")
    for n in (8, 12, 5):
        x = torch.randn(2, n, 32, requires_grad=True)
        got_loss, got = _grads(model, x, compiled)
        want_loss, want = _grads(model, x, model)
        torch.testing.assert_close(got_loss, want_loss)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    assert compiled.graph_count() == 2  # the first length, then the symbolic entry


def test_a_checkpoint_inside_a_checkpointed_function_is_a_break_with_eagers_gradients():
    inner = Block()

    def outer_fn(x):
        return checkpoint(inner, x, use_reentrant=False) * 2

    def f(x):
        return checkpoint(outer_fn, x, use_reentrant=False).square().mean()

    x = torch.randn(2, 4, 32, requires_grad=True)
    e = explain(f)(x)
    assert any("inside a checkpointed function" in r.reason for r in e.break_reasons), e.break_reasons
    (got,) = torch.autograd.grad(compile(f, backend="aot_eager")(x), x)
    (want,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_checkpointed_blocks_on_the_gpu_with_triton_kernels():
    model = Net().cuda().train()
    x = torch.randn(4, 8, 32, device="cuda", requires_grad=True)
    got_loss, got = _grads(model, x, compile(model))
    want_loss, want = _grads(model, x, model)
    torch.testing.assert_close(got_loss, want_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-3)


def test_the_callers_saved_tensor_hooks_see_no_fakes():
    """Under the caller's ``saved_tensors_hooks`` (activation offloading), capture and the
    joint graph run ops on fakes with hooks of their own: a checkpointed function is one
    graph (it fell back to eager: the caller's hook was handed a fake), and the caller's
    hook packs only real tensors."""
    from torchfuse.graph.tracing import FakeTensor

    model = Net().train()
    x = torch.randn(2, 8, 32, requires_grad=True)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    compiled = compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = compiled(x)
    loss.backward()
    assert packed and not any(isinstance(t, FakeTensor) for t in packed)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).backward()
    for g, want in zip(got, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(g, want)
