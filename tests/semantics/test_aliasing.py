"""Mutation and aliasing: returned inputs keep their identity, views write through, and
inputs that share memory are detected at the guard (their own entry, run as eager runs)."""

from __future__ import annotations

import torch
from semantics_helpers import compiled


def add_one_in_place(x):
    x.add_(1)
    return x


def returns_input(x, y):
    return x, y * 2


def returns_view(x):
    return x[1:]


def mutate_one_read_other(a, b):
    a.mul_(2)
    return a + b


def mutate_view(x):
    x[0].add_(10)
    return x.sum()


def test_returned_input_is_the_object(backend):
    x = torch.zeros(3)
    out = compiled(add_one_in_place, backend)(x)
    assert out is x and torch.equal(x, torch.ones(3))
    a, b = torch.randn(2), torch.randn(2)
    got = compiled(returns_input, backend)(a, b)
    assert got[0] is a


def test_returned_view_writes_through(backend):
    x = torch.zeros(4)
    v = compiled(returns_view, backend)(x)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    v.add_(1)
    assert torch.equal(x, torch.tensor([0.0, 1, 1, 1]))


def test_mutation_of_a_view_reaches_the_base(backend):
    x, ref = torch.arange(4.0), torch.arange(4.0)
    torch.testing.assert_close(compiled(mutate_view, backend)(x), mutate_view(ref))
    assert torch.equal(x, ref)


def test_overlapping_inputs_with_mutation(backend):
    f = compiled(mutate_one_read_other, backend)
    base, ref = torch.arange(6.0), torch.arange(6.0)
    want = mutate_one_read_other(ref[0:4], ref[2:6])
    got = f(base[0:4], base[2:6])
    assert torch.equal(got, want) and torch.equal(base, ref)
    assert torch.equal(want, torch.tensor([4.0, 8, 8, 11]))
    # inputs that do not overlap take another entry, compiled
    a, b = torch.arange(4.0), torch.arange(4.0) + 2
    torch.testing.assert_close(f(a, b), mutate_one_read_other(torch.arange(4.0), torch.arange(4.0) + 2))
    assert len(f.entries) == 2 and sum(e.eager for e in f.entries) == 1
    # and the overlapping call finds its entry again
    base = torch.arange(6.0)
    assert torch.equal(f(base[0:4], base[2:6]), want)
    assert len(f.entries) == 2


def test_same_tensor_twice(backend):
    x, ref = torch.arange(4.0), torch.arange(4.0)
    want = mutate_one_read_other(ref, ref)
    assert torch.equal(compiled(mutate_one_read_other, backend)(x, x), want) and torch.equal(x, ref)


def shift_right(ids):
    # transformers' shift_tokens_right: writes through views of a tensor made in the function
    s = ids.new_zeros(ids.shape)
    s[:, 1:] = ids[:, :-1].clone()
    s[:, 0] = 7
    s.masked_fill_(s == -100, 0)
    return s


def test_writes_through_views_of_an_intermediate(backend):
    ids = torch.arange(16).reshape(2, 8)
    ids[1, 3] = -100
    got = compiled(shift_right, backend)(ids)
    want = shift_right(ids)
    assert got.dtype == want.dtype and torch.equal(got, want)
    x = torch.randn(4, 6)  # float, grad off: the inference path of every backend
    torch.testing.assert_close(compiled(first_column_ones, backend)(x), first_column_ones(x))


def first_column_ones(x):
    t = x.new_zeros(4, 6)
    t[:, 0] = 1.0
    return t * x
