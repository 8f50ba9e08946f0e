"""A custom ``torch.autograd.Function``: with grad mode on, its forward and its backward are
captured, joined by the format's ``torchfuse.custom_grad`` op
(`torchfuse.capture.custom_backward`), and what capture cannot model stays a break that runs
it in Python with its own backward. Under ``no_grad`` eager records no backward either, and
its forward alone is captured (`torchfuse.capture.custom_function`), with eager's results,
object identities and errors."""

from __future__ import annotations

import pytest
import torch
from torchfuse.capture import compile, explain


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def f(x):
    return Twice.apply(x.sin()).cos().sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_custom_function_keeps_its_backward(backend):
    x = torch.randn(5, requires_grad=True)
    out = compile(f, backend=backend)(x)
    (got,) = torch.autograd.grad(out, x)
    xe = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(f(xe), xe)
    torch.testing.assert_close(out, f(xe))
    torch.testing.assert_close(got, want)


def test_custom_function_is_captured_with_its_backward():
    e = explain(f)(torch.randn(5, requires_grad=True))
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
    ops = [n.op for g in e.graphs for n in g.nodes]
    assert "torchfuse.custom_grad.default" in ops


# ---------------------------------------------------------------- under no_grad: forward captured


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        assert ctx.needs_input_grad == (x.requires_grad, False)  # as eager's, under no_grad too
        return x * k + x.sin()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class Pass(torch.autograd.Function):
    """Hands its first input back unchanged: eager's apply returns a view of it."""

    @staticmethod
    def forward(ctx, x, y):
        return x, y * 2

    @staticmethod
    def backward(ctx, g, h):
        return g, h * 2


class Doubled(torch.autograd.Function):
    """In place, marked dirty: eager's apply returns the input object itself."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Setup(torch.autograd.Function):
    """``setup_context`` style: eager calls it under no_grad too."""

    @staticmethod
    def forward(x, k):
        return x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, k = inputs
        if k < 0:
            raise ValueError("k must not be negative")
        ctx.save_for_backward(x)
        ctx.k = k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class Reads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (int(x.sum().item() > 0) + 1)  # data-dependent: a break inside forward

    @staticmethod
    def backward(ctx, g):
        return g


def inner_no_grad(x, y):
    with torch.no_grad():
        a = Scale.apply(x, 3.0)
        b, c = Pass.apply(x, y)
        d = Setup.apply(y, 2.0)
        e = Doubled.apply(y.clone())
    return a + c, b, d, e, b is x


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
            assert g.requires_grad == w.requires_grad
        else:
            assert g == w


def test_under_no_grad_forward_is_captured_into_the_graph():
    x, y = torch.randn(5), torch.randn(5)
    e = explain(inner_no_grad)(x, y)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
    got, want = compile(inner_no_grad, backend="aot_eager")(x, y), inner_no_grad(x, y)
    _same(got, want)
    assert got[4] is False and got[1]._base is x  # a view of x, as eager's apply gives
    # x requiring grad: Scale reads needs_input_grad (True, False) as in eager, and Pass hands
    # back x, whose view under eager's apply does not require grad: that one is a break
    x.requires_grad_()
    e = explain(inner_no_grad)(x, y)
    assert e.graph_break_count == 1 and "hands back an input that requires grad" in e.break_reasons[0].reason
    _same(compile(inner_no_grad, backend="aot_eager")(x, y), inner_no_grad(x, y))


def test_outer_no_grad_captures_forward_and_grad_on_still_breaks():
    def f(x):
        return Scale.apply(x, 2.0).cos()

    x = torch.randn(5, requires_grad=True)
    with torch.no_grad():
        e = explain(f)(x)
        assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
        out = compile(f, backend="eager")(x)
        torch.testing.assert_close(out, f(x))
        assert not out.requires_grad
    e = explain(f)(x)  # grad on: forward and backward both captured
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)


def test_marked_dirty_input_comes_back_itself():
    def f(x):
        with torch.no_grad():
            y = x.clone()
            out = Doubled.apply(y)
            return out, out is y, y

    x = torch.randn(4)
    got, want = compile(f, backend="eager")(x), f(x)
    _same(got, want)
    assert got[1] is True


def test_a_break_or_an_error_inside_forward_is_a_break_at_apply():
    def reads(x):
        with torch.no_grad():
            return Reads.apply(x.sin()).cos()

    x = torch.randn(4)
    e = explain(reads)(x)
    assert e.graph_break_count == 1 and e.break_reasons[0].reason.startswith("Reads.apply under no_grad")
    torch.testing.assert_close(compile(reads, backend="eager")(x), reads(x))

    def negative(x):
        with torch.no_grad():
            return Setup.apply(x, -1.0)

    with pytest.raises(ValueError, match="must not be negative"):
        negative(x)
    with pytest.raises(ValueError, match="must not be negative"):
        compile(negative, backend="eager")(x)


# ------------------------------------------------------- grad on: forward and backward captured


class Halves(torch.autograd.Function):
    """Saves a forward result and an input, keeps a constant and a tensor on ctx, returns a
    non-differentiable index beside two outputs, and gives no gradient to its second input."""

    @staticmethod
    def forward(ctx, x, w, k):
        y = torch.tanh(x @ w)
        idx = y.argmax(-1)
        ctx.save_for_backward(y, w)
        ctx.k = k
        ctx.scale = x.new_full((), 0.5)  # a tensor kept as an attribute
        ctx.mark_non_differentiable(idx)
        return y * k, idx, y.sum(-1)

    @staticmethod
    def backward(ctx, gy, gidx, gsum):
        y, w = ctx.saved_tensors
        g = (gy * ctx.k + gsum[..., None]) * (1 - y * y) * ctx.scale  # not the true derivative
        return g @ w.t(), None, None


def halves(x, w):
    y, idx, s = Halves.apply(x.sin(), w, 3.0)
    return (y.cos() * s[..., None]).sum(), idx


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_grad_on_captures_forward_and_backward_with_eagers_gradients(backend):
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    e = explain(halves)(x, w)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
    got_loss, got_idx = compile(halves, backend=backend)(x, w)
    gx, gw = torch.autograd.grad(got_loss, [x, w], allow_unused=True)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    want_loss, want_idx = halves(xe, we)
    ex, ew = torch.autograd.grad(want_loss, [xe, we], allow_unused=True)
    torch.testing.assert_close(got_loss, want_loss)
    assert torch.equal(got_idx, want_idx) and not got_idx.requires_grad
    torch.testing.assert_close(gx, ex)
    assert gw is None and ew is None  # backward gives w no gradient


def test_an_input_without_a_gradient_gets_none_as_in_eager():
    def g(x, w):
        return Halves.apply(x, w, 2.0)[0].sum()

    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    for fn in (compile(g, backend="aot_eager"), g):
        x.grad = w.grad = None
        fn(x, w).backward()
        assert x.grad is not None and w.grad is None


BACKWARD_CALLS: list[int] = []
SECRET = torch.full((3,), 2.0)


class Doubles(torch.autograd.Function):
    """The forward of the Functions below, which differ in their backward."""

    @staticmethod
    def forward(ctx, x):
        return x * 2


class Logs(Doubles):
    @staticmethod
    def backward(ctx, g):
        BACKWARD_CALLS.append(1)  # a side effect eager runs on every backward
        return g * 2


class ReadsGlobal(Doubles):
    @staticmethod
    def backward(ctx, g):
        return g * SECRET  # a tensor forward did not save


class TooMany(Doubles):
    @staticmethod
    def backward(ctx, g):
        return g, g


@pytest.mark.parametrize("fn, reason", [
    (Logs, "backward writes outside itself"),
    (ReadsGlobal, "backward reads a tensor forward did not save"),
    (Pass, "forward hands back an input"),
    (TooMany, "backward returns 2 gradients for 1 inputs"),
])
def test_what_capture_cannot_model_is_a_break_that_runs_in_python(fn, reason):
    def g(x):
        out = fn.apply(x) if fn is not Pass else fn.apply(x, x)[1]
        return out.sin().sum()

    x = torch.randn(3, requires_grad=True)
    e = explain(g)(x)
    assert e.graph_break_count == 1 and reason in e.break_reasons[0].reason, e.break_reasons
    if fn is TooMany:  # eager's own error, from its own backward
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            g(x).backward()
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            compile(g, backend="eager")(x).backward()
        return
    BACKWARD_CALLS.clear()
    (got,) = torch.autograd.grad(compile(g, backend="aot_eager")(x), x)
    (want,) = torch.autograd.grad(g(x), x)
    torch.testing.assert_close(got, want)
    if fn is Logs:
        assert BACKWARD_CALLS == [1, 1]


# ================================= library operators (torch.library.custom_op) with a backward


@torch.library.custom_op("tfcapture_test::scaled_rows", mutates_args=())
def scaled_rows(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    start = 0
    for i, n in enumerate(counts.tolist()):  # data-dependent, as transformers' grouped_mm fallback
        out[start:start + n] *= i + 1
        start += n
    return out


@scaled_rows.register_fake
def _(x, counts):
    return torch.empty_like(x)


def _scaled_rows_backward(ctx, grad):
    g = grad.clone()
    start = 0
    for i, n in enumerate(ctx.counts.tolist()):  # needs the data: cannot run on fake tensors
        g[start:start + n] *= i + 1
        start += n
    return g, None


def _scaled_rows_setup(ctx, inputs, output):
    ctx.counts = inputs[1]


scaled_rows.register_autograd(_scaled_rows_backward, setup_context=_scaled_rows_setup)


@torch.library.custom_op("tfcapture_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


double.register_autograd(lambda ctx, g: g * 2)


def rows(x, w, counts):
    return scaled_rows(x @ w, counts).tanh().sum()


def twice(x, w):
    return double(x @ w).tanh().sum()


def test_library_op_whose_backward_needs_data_is_a_break_with_eagers_gradients():
    x, w, counts = torch.randn(5, 3), torch.randn(3, 3, requires_grad=True), torch.tensor([2, 0, 3])
    e = explain(rows)(x, w, counts)
    assert e.graph_break_count == 1
    assert "tfcapture_test.scaled_rows" in e.break_reasons[0].reason
    assert "registered backward cannot be traced" in e.break_reasons[0].reason
    out = compile(rows, backend="aot_eager")(x, w, counts)
    (got,) = torch.autograd.grad(out, w)
    we = w.detach().clone().requires_grad_()
    want_out = rows(x, we, counts)
    (want,) = torch.autograd.grad(want_out, we)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(got, want)


def test_library_op_whose_backward_needs_data_stays_in_the_graph_under_no_grad():
    x, w, counts = torch.randn(5, 3), torch.randn(3, 3, requires_grad=True), torch.tensor([2, 0, 3])
    with torch.no_grad():
        e = explain(rows)(x, w, counts)
        assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
        torch.testing.assert_close(compile(rows, backend="eager")(x, w, counts), rows(x, w, counts))


def test_library_op_with_a_traceable_backward_stays_in_the_graph():
    x, w = torch.randn(5, 3), torch.randn(3, 3, requires_grad=True)
    e = explain(twice)(x, w)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    out = compile(twice, backend="aot_eager")(x, w)
    (got,) = torch.autograd.grad(out, w)
    we = w.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(twice(x, we), we)
    torch.testing.assert_close(got, want)


def test_a_size_that_changes_keeps_the_function_in_the_graph():
    def g(x, w):
        return halves(x, w)[0]

    compiled = compile(g, backend="aot_eager")
    w = torch.randn(3, 3, requires_grad=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 3, requires_grad=True)
        (got,) = torch.autograd.grad(compiled(x, w), [x])
        xe = x.detach().clone().requires_grad_()
        (want,) = torch.autograd.grad(g(xe, w), [xe])
        torch.testing.assert_close(got, want)
    assert compiled.graph_count() == 2  # the first size, then the symbolic entry


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_custom_function_on_the_gpu_with_triton_kernels():
    x = torch.randn(4, 3, device="cuda", requires_grad=True)
    w = torch.randn(3, 3, device="cuda", requires_grad=True)
    got_loss, _ = compile(halves)(x, w)
    (gx,) = torch.autograd.grad(got_loss, [x])
    xe = x.detach().clone().requires_grad_()
    want_loss, _ = halves(xe, w)
    (ex,) = torch.autograd.grad(want_loss, [xe])
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gx, ex, atol=1e-5, rtol=1e-4)
