"""End to end: ``torchfuse.capture.compile`` through autograd, inductor and the runtime.

Everything runs on the CPU through Triton's interpreter (small tensors), compared with eager
PyTorch: values, gradients, a training loop, and a custom op registered with torch.library.
"""

from __future__ import annotations

import pytest
import torch
import torchfuse.capture as tfc


def seed_function(x, y):
    a = x + y
    b = a * 2.0
    c = torch.relu(b)
    e = torch.nn.functional.silu(c)
    d = e.sum(dim=1)
    return d.mean()


def norm_mlp(x, w, b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    return torch.softmax(torch.nn.functional.linear(h, w, b), dim=-1)


def grads(fn, inputs):
    leaves = [t for t in inputs if t.requires_grad]
    out = fn(*inputs)
    return out, torch.autograd.grad(out.sum(), leaves)


def fresh(inputs):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]


@pytest.mark.parametrize(
    "fn, make",
    [
        (seed_function, lambda: [torch.randn(16, 24), torch.randn(16, 24)]),
        (norm_mlp, lambda: [torch.randn(4, 8, 32), torch.randn(16, 32), torch.randn(16)]),
    ],
    ids=["seed_function", "norm_mlp"],
)
def test_inference_matches_eager(fn, make):
    tfc.reset()
    inputs = make()
    compiled = tfc.compile(fn)
    with torch.no_grad():
        for _ in range(2):  # the second call is a cache hit
            torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn, make", [
    (seed_function, lambda: [torch.randn(16, 24, requires_grad=True), torch.randn(16, 24)]),
    (norm_mlp, lambda: [torch.randn(4, 8, 32, requires_grad=True), torch.randn(16, 32, requires_grad=True),
                        torch.randn(16, requires_grad=True)]),
], ids=["seed_function", "norm_mlp"])
def test_gradients_match_eager(fn, make):
    tfc.reset()
    inputs = make()
    out, gs = grads(tfc.compile(fn), fresh(inputs))
    ref, ref_gs = grads(fn, fresh(inputs))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(gs, ref_gs, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


class TinyClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 20)
        self.norm = torch.nn.LayerNorm(20)
        self.fc2 = torch.nn.Linear(20, 5)

    def forward(self, x, target):
        h = torch.nn.functional.gelu(self.norm(self.fc1(x)))
        return torch.nn.functional.cross_entropy(self.fc2(h), target)


def test_training_loop_follows_eager_for_20_steps():
    tfc.reset()
    torch.manual_seed(0)
    model, ref = TinyClassifier(), TinyClassifier()
    ref.load_state_dict(model.state_dict())
    compiled = tfc.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    x, target = torch.randn(8, 12), torch.randint(0, 5, (8,))
    losses, ref_losses = [], []
    for _ in range(20):
        for m, o, out in ((compiled, opt, losses), (ref, ref_opt, ref_losses)):
            loss = m(x, target)
            o.zero_grad()
            loss.backward()
            o.step()
            out.append(loss.item())
    assert max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)) < 1e-5
    assert losses[-1] < losses[0]  # it actually trained
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@torch.library.custom_op("torchfuse_e2e::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _scaled_tanh_fake(x, scale):
    return torch.empty_like(x)


def _scaled_tanh_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _scaled_tanh_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


def uses_custom_op(x, y):
    return (scaled_tanh(x * 2, 3.0) + y).relu().sum(dim=-1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_custom_op_is_one_opaque_node_with_its_gradient(backend):
    tfc.reset()
    x, y = torch.randn(6, 10, requires_grad=True), torch.randn(6, 10)
    ex = tfc.explain(uses_custom_op)(x, y)
    ops = [n.op for n in ex.graphs[0].nodes]
    assert ops.count("torchfuse_e2e.scaled_tanh.default") == 1
    out, (gx,) = grads(tfc.compile(uses_custom_op, backend=backend), fresh([x, y]))
    ref, (rx,) = grads(uses_custom_op, fresh([x, y]))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, rx)


def inference_body(x, w):
    with torch.no_grad():
        return torch.softmax(x @ w, dim=-1) * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor", "cudagraphs"])
def test_a_body_under_no_grad_compiles_for_inference(backend):
    # Called with grad mode on and inputs that require grad, but every op runs under
    # no_grad: no joint graph, and the output does not require grad, as in eager.
    tfc.reset()
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 6, requires_grad=True)
    got = tfc.compile(inference_body, backend=backend)(x, w)
    ref = inference_body(x, w)
    assert got.requires_grad is ref.requires_grad is False
    assert got.grad_fn is None
    torch.testing.assert_close(got, ref)


def test_max_autotune_mode_reaches_the_inductor():
    """compile(mode="max-autotune") reaches the inductor: the matmul becomes a Triton
    template kernel (forced with the mm_templates option on the CPU), equal to eager."""
    import torch.nn.functional as F
    from torchfuse.graph import observe

    a, w = torch.randn(33, 17), torch.randn(40, 17)
    fn = lambda a, w: F.relu(a @ w.t())
    with observe.collect() as art:
        f = tfc.compile(fn, mode="max-autotune", options={"mm_templates": "always", "cache": False})
        torch.testing.assert_close(f(a, w), fn(a, w))
    assert "tl.dot" in (art.get("output_code.py") or "")


def _shifted_windows(x):
    """Swin's pattern: a region mask built by writes into slices of ``new_zeros``, a cyclic
    shift with ``roll``, writes through ``x[i]`` and a masked fill."""
    mask = x.new_zeros((8, 8))
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    shifted = torch.roll(x, shifts=(-2, -2), dims=(1, 2))
    y = shifted * 2
    y[0] = y[0] + 1
    y = y + mask.masked_fill(mask != 0, -100.0)[None, :, :, None]
    return torch.roll(y, shifts=(2, 2), dims=(1, 2)).sum(-1)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_writes_into_slices_and_roll_fuse_without_fallbacks(training):
    from torchfuse.graph import observe

    tfc.reset()
    x = torch.randn(3, 8, 8, 5, requires_grad=training)
    with observe.collect() as art:
        compiled = tfc.compile(_shifted_windows, options={"cache": False})
        out, (grad,) = grads(compiled, fresh([x])) if training else (compiled(x), (None,))
    ref, (ref_grad,) = grads(_shifted_windows, fresh([x])) if training else (_shifted_windows(x), (None,))
    torch.testing.assert_close(out, ref)
    if training:
        torch.testing.assert_close(grad, ref_grad)
    assert not (art.get("fallbacks.txt") or "").strip(), art.get("fallbacks.txt")
    assert "slice_scatter" in (art.get("output_code.py") or "")
