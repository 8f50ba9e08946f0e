"""``collections.Counter`` made in a compiled function (issue 20), and C classmethods read
from modules (``chain.from_iterable``). Each test compares with eager and counts graphs,
entries and breaks."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile


def _same_each_call(fn, args, calls=3):
    cf = compile(fn, backend="eager")
    for _ in range(calls):
        assert_same(cf(*args), fn(*args))
    return cf


def test_counter_made_in_the_function_is_one_graph():
    def f(x):
        c = collections.Counter("abca")
        c.update(["b", "z"])
        c["q"] += 2  # __missing__ gives 0
        d = collections.Counter({"q": 2}, r=3)
        return (x * c["a"] + c["missing"], c.most_common(1), c.most_common(), c, d,
                sorted(c.elements()), d.total(), c + d, "missing" in c)

    cf = _same_each_call(f, (torch.randn(3),))
    assert cf.graph_count() == 1 and len(cf.entries) == 1 and cf.recompiles == 0
    assert all(r.error is None for r in cf.results)


def test_counter_comparisons_are_counters_not_dicts():
    def f(x):
        c = collections.Counter("ab")
        c["z"] = 0  # a zero count: Counter's == ignores it, dict's does not
        return x, c == collections.Counter("ba"), c != collections.Counter("b"), c <= collections.Counter("abc")

    cf = _same_each_call(f, (torch.randn(3),))
    assert cf.graph_count() == 1 and all(r.error is None for r in cf.results)


def test_counters_from_outside_compare_as_counters():
    def f(x, c, d):
        return x, c == d, c >= d

    c = collections.Counter("ab")
    c["z"] = 0
    cf = _same_each_call(f, (torch.ones(1), c, collections.Counter("ba")))  # dict == said False
    assert cf.graph_count() == 1


def test_counter_of_tensor_sizes_and_of_a_list_argument():
    def f(x, names):
        c = collections.Counter(names)
        sizes = collections.Counter(x.shape)
        return x * c["w"] + sizes[4], c

    cf = _same_each_call(f, (torch.randn(4, 4, 2), ["w", "b", "w"]))
    assert cf.graph_count() == 1 and len(cf.entries) == 1


def test_counter_of_tensors_counts_as_eager_does():
    def f(x):
        return collections.Counter([x, x]), x + 1  # tensors hash by identity

    cf = compile(f, backend="eager")
    x = torch.randn(2)
    got, want = cf(x), f(x)
    assert list(got[0].values()) == list(want[0].values())
    assert_same(got[1], want[1])


def test_counter_with_two_positional_arguments_raises_as_eager():
    def f(x):
        return x, collections.Counter("a", "b")

    cf = compile(f, backend="eager")
    with pytest.raises(TypeError):
        f(torch.ones(1))
    with pytest.raises(TypeError):
        cf(torch.ones(1))


def test_a_c_classmethod_read_from_a_module_is_not_a_recompile():
    def f(x):
        return x, list(itertools.chain.from_iterable([[1, 2], [3]])), dict.fromkeys("ab", 0)

    cf = _same_each_call(f, (torch.randn(2),), calls=4)
    assert len(cf.entries) == 1 and cf.recompiles == 0


# ============================================================ itertools.groupby


def test_groupby_is_one_graph_and_cuts_groups_short_as_python():
    def f(x):
        a = [(k, list(g)) for k, g in itertools.groupby("aabbbc")]
        b = [(k, len(list(g))) for k, g in itertools.groupby([1, 3, 2, 4, 5], key=lambda v: v % 2)]
        rows = list(itertools.groupby("aab"))
        c = [(k, list(g)) for k, g in rows]  # advancing past a group empties it, in Python too
        scaled = [k * x for k, _ in itertools.groupby([1, 1, 2])]
        by_rank = {k: len(list(g)) for k, g in itertools.groupby([x, x[0], x], key=lambda t: t.dim())}
        return a, b, c, scaled, by_rank

    cf = _same_each_call(f, (torch.randn(3),))
    assert cf.graph_count() == 1 and len(cf.entries) == 1
    assert all(r.error is None for r in cf.results)


def test_groupby_next_and_a_key_that_is_a_tensor():
    def pulled(x):
        it = itertools.groupby([1, 1, 2, 3, 3])
        k1, g1 = next(it)
        first = next(g1)
        k2, _ = next(it)
        return x * k1 + first, k2, list(g1)

    cf = _same_each_call(pulled, (torch.randn(2),))
    assert cf.graph_count() == 1

    def tensor_keys(x):
        return [len(list(g)) for _, g in itertools.groupby([x, x], key=lambda t: t + 1)]

    cf = compile(tensor_keys, backend="eager")
    x = torch.randn(2)
    with pytest.raises(RuntimeError):  # a tensor key's == is ambiguous in eager
        tensor_keys(x)
    with pytest.raises(RuntimeError):
        cf(x)
