"""Python ``random`` integer draws in a compiled function (issue 20): ``randint``,
``randrange``, ``getrandbits`` and ``choice`` of a constant sequence are graph inputs drawn on
every call in program order, so ``random.seed`` reproduces eager; where Python needs the int,
capture breaks at the draw. Each test compares with eager and counts graphs and entries."""

from __future__ import annotations

import random

import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile


def _seeded(fn, args, seeds, *gens):
    out = []
    for n in seeds:
        random.seed(n)
        for g in gens:
            g.seed(n)
        out.append((fn(*args), random.random(), *(g.random() for g in gens)))
    return out  # with the next draw of each generator: it advanced as eager's did


_RNG = random.Random(0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_int_draws_are_graph_inputs_in_program_order(backend):
    def f(x):
        a = x * random.randint(1, 5) + random.randrange(10)
        b = x - random.choice([1, 2, 3])
        return a, b, x > random.randrange(0, 10, 3), x // _RNG.randint(1, 3), x + random.getrandbits(4)

    cf = compile(f, backend=backend)
    x = torch.randn(3, 4) * 5
    seeds = [1, 2, 3, 3, 8]
    assert_same(_seeded(cf, (x,), seeds, _RNG), _seeded(f, (x,), seeds, _RNG))
    assert cf.graph_count() == 1 and len(cf.entries) == 1 and cf.recompiles == 0
    graph = cf.entries[0].result.graph
    draws = [i.name for i in graph.inputs if i.name.startswith("random_")]
    assert len(draws) == 6
    assert {graph.values[n].dtype for n in draws} == {"int64"} and graph.values[draws[0]].sizes == ()


def test_int_draws_keep_the_dtype_a_python_int_gives():
    def f(i32, b, z8, z, h):
        n = random.randint(1, 4)
        return i32 * n, b + n, z8 * n, z - n, h / n, n % z8, i32 // n

    cf = compile(f, backend="eager")
    args = (torch.arange(6, dtype=torch.int32), torch.tensor([True, False]), torch.tensor(3, dtype=torch.int8),
            torch.tensor(2.5), torch.arange(4, dtype=torch.int16))
    assert_same(_seeded(cf, args, [1, 2, 5]), _seeded(f, args, [1, 2, 5]))
    assert cf.graph_count() == 1 and len(cf.entries) == 1


def test_choice_of_floats_is_a_float_draw():
    def f(x):
        return x * random.choice((0.5, 1.5, 2.5))

    cf = compile(f, backend="eager")
    x = torch.ones(3)
    assert_same(_seeded(cf, (x,), [1, 2, 3, 4]), _seeded(f, (x,), [1, 2, 3, 4]))
    graph = cf.entries[0].result.graph
    assert graph.values["random_0"].dtype == "float64" and cf.graph_count() == 1


def test_an_int_draw_python_needs_breaks_at_the_draw():
    def f(x):
        y = x * 2
        for _ in range(random.randint(1, 3)):  # Python needs the int: a break at the draw
            y = y + 1
        return y, random.randint(0, 9)

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    seeds = [4, 5, 4, 8, 9]
    assert_same(_seeded(cf, (x,), seeds), _seeded(f, (x,), seeds))
    root = cf.entries[0].result
    assert root.error is not None and "random.randint()" in root.error.reason
    assert [n.op for n in root.graph.nodes] == ["aten.mul.Tensor"]  # the graph before the draw


def test_a_bad_or_unmodelled_draw_is_what_eager_does():
    def bad(x):
        return x * random.randint(5, 1)  # ValueError in eager

    def strings(x):
        return x * len(random.choice(["a", "bb"]))

    for fn in (bad, strings):
        cf = compile(fn, backend="eager")
        x = torch.ones(2)
        random.seed(1)
        try:
            want = fn(x)
        except ValueError as e:
            want = e
        random.seed(1)
        if isinstance(want, Exception):
            with pytest.raises(ValueError):
                cf(x)
        else:
            assert_same(cf(x), want)


def test_a_subclass_overriding_the_primitive_is_not_drawn_in_gathering():
    calls = []

    class Counting(random.Random):
        def getrandbits(self, k):
            calls.append(k)
            return super().getrandbits(k)

    rng = Counting(0)

    def f(x):
        return x * rng.randint(1, 5)

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    rng.seed(3)
    got = cf(x)
    rng.seed(3)
    calls.clear()
    assert_same(got, f(x))
    assert cf.entries[0].result.graph is None or not any(
        i.name.startswith("random_") for i in cf.entries[0].result.graph.inputs)
