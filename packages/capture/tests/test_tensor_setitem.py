"""``t[key] = value``: eager's values, mutations and errors; a number written through a view
key is recorded as ``fill_`` on the view (no CPU scalar tensor in the graph)."""

from __future__ import annotations

import collections

import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile, explain


def _ops(fn, *args) -> collections.Counter:
    e = explain(fn)(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    return collections.Counter(n.op for n in e.graphs[0].nodes)


def _mask(x):
    m = x.new_zeros((6, 6))
    count = 0
    for h in ((0, -3), (-3, -1), (-1, None)):
        for w in ((0, -3), (-3, -1), (-1, None)):
            m[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    return x + m


def _int_key(x):
    y = x.clone()
    y[1] = 2
    y[0, 3] = -1.5
    y[..., 0] = True
    y[None, 2:, ::2] = 4
    return y


@pytest.mark.parametrize("fn", [_mask, _int_key], ids=["window_mask", "int_keys"])
def test_number_through_a_view_key_is_fill(fn):
    cf = compile(fn, backend="eager")
    x = torch.randn(6, 6)
    assert_same(cf(x), fn(x))
    ops = _ops(fn, x)
    assert ops["aten.fill_.Scalar"] > 0
    assert not any("scalar_tensor" in op for op in ops), ops


def test_number_into_an_argument_mutates_it_like_eager():
    def f(x):
        x[1:3] = 0.5
        return x.sum()

    cf = compile(f, backend="eager")
    a, b = torch.randn(4, 3), None
    b = a.clone()
    assert_same(cf(a), f(b))
    assert_same(a, b)


def test_int_dtype_and_bool_dtype_targets():
    def f(x, m):
        x = x.clone()
        m = m.clone()
        x[2:] = 7
        m[:, 1] = True
        return x, m

    cf = compile(f, backend="eager")
    x, m = torch.arange(6).reshape(3, 2), torch.zeros(3, 2, dtype=torch.bool)
    assert_same(cf(x, m), f(x, m))


def test_advanced_keys_keep_index_put():
    def f(x, i):
        y = x.clone()
        y[i] = 3.0          # a tensor key: index_put, not a view
        y[y > 2.5] = -1.0   # a mask key
        y[[0, 2]] = 9.0     # a list key
        return y

    cf = compile(f, backend="eager")
    x, i = torch.randn(4, 3), torch.tensor([1, 3])
    assert_same(cf(x, i), f(x, i))
    assert _ops(f, x, i)["aten.fill_.Scalar"] == 0


def test_leaf_requiring_grad_raises_eagers_error():
    def f(x):
        x[0] = 1.0
        return x

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        f(x)
    with pytest.raises(RuntimeError) as ours:
        compile(f, backend="eager")(x)
    assert "leaf" in str(eager.value) and "leaf" in str(ours.value)


def test_out_of_range_index_raises_index_error():
    def f(x):
        y = x.clone()
        y[5] = 1.0
        return y

    with pytest.raises(IndexError):
        f(torch.randn(3))
    with pytest.raises(IndexError):
        compile(f, backend="eager")(torch.randn(3))
