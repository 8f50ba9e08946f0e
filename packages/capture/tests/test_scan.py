"""``associative_scan`` with a Python ``combine_fn`` is written into the graph
(`torchfuse.capture.scan`): values and gradients as torch's eager ``combine_mode="generic"``
scan, forward and reversed, a guard on the constants that pick the scan, and torch's own
error where eager raises one."""

from __future__ import annotations

import importlib

import pytest
import torch
from torchfuse.capture import compile, explain

associative_scan = importlib.import_module("torch._higher_order_ops.associative_scan").associative_scan


def affine(left, right):
    """Composing ``h -> a * h + b`` maps (Mamba's recurrence): associative, not commutative."""
    return left[0] * right[0], right[0] * left[1] + right[1]


def scan_pair(a, b, reverse):
    return associative_scan(affine, (a, b), dim=1, reverse=reverse, combine_mode="generic")


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_scan_of_a_pair_is_one_graph_with_eagers_values(n, reverse):
    a, b = torch.randn(2, n, 3), torch.randn(2, n, 3)
    e = explain(scan_pair)(a, b, reverse)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    got = compile(scan_pair, backend="aot_eager")(a, b, reverse)
    want = scan_pair(a, b, reverse)
    assert type(got) is type(want) and len(got) == len(want)
    for g, w, x in zip(got, want, (a, b), strict=True):
        torch.testing.assert_close(g, w)
        assert g is not x  # new tensors, as torch's


def test_the_sequential_recurrence_is_what_it_computes():
    a, b = torch.rand(1, 6, 2), torch.randn(1, 6, 2)
    _, h = compile(scan_pair, backend="eager")(a, b, False)
    state = torch.zeros(1, 2)
    for i in range(6):
        state = a[:, i] * state + b[:, i]
        torch.testing.assert_close(h[:, i], state)


def cumulative(x):
    return associative_scan(lambda p, q: p + q, x, dim=-1, combine_mode="generic")


def test_a_single_tensor_scan_has_eagers_gradient():
    x = torch.randn(3, 7, requires_grad=True)
    want = cumulative(x)
    (gw,) = torch.autograd.grad((want * want).sum(), x)
    xc = x.detach().clone().requires_grad_()
    got = compile(cumulative, backend="aot_eager")(xc)
    (gg,) = torch.autograd.grad((got * got).sum(), xc)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, x.detach().cumsum(-1))
    torch.testing.assert_close(gg, gw)


def test_reverse_read_from_a_closure_is_guarded():
    def make(reverse):
        def f(a, b):
            return associative_scan(affine, (a, b), dim=1, reverse=reverse, combine_mode="generic")
        return f

    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    for reverse in (False, True):  # one code object: the second call must not reuse the first's graph
        f = make(reverse)
        for g, w in zip(compile(f, backend="eager")(a, b), f(a, b), strict=True):
            torch.testing.assert_close(g, w)


def test_pointwise_mode_on_the_cpu_raises_eagers_error():
    def f(x):
        return associative_scan(lambda p, q: p + q, x, dim=0)  # combine_mode="pointwise"

    x = torch.randn(4)
    with pytest.raises(ValueError) as eager:
        f(x)
    with pytest.raises(ValueError) as compiled:
        compile(f, backend="eager")(x)
    assert str(compiled.value) == str(eager.value)


def test_a_combine_fn_that_changes_the_dtype_is_left_to_torch():
    def f(x):
        return associative_scan(lambda p, q: (p + q).double(), x, dim=0, combine_mode="generic")

    e = explain(f)(torch.randn(4))
    assert e.graph_break_count == 1
    assert "combine_fn returns results unlike its inputs" in e.break_reasons[0].reason
