"""Python numbers as arguments (issue 20): an int that changes between calls becomes a size
symbol instead of a constant recompiled per value; defaults patched after compiling are the
ones a call binds; random numbers are drawn on every call. Each test compares with eager and
counts entries and graphs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import compile
from torchfuse.graph.printer import describe_guard


def _calls(cf, fn, args_list):
    for args in args_list:
        assert_same(cf(*args), fn(*args))


def _guards(cf, entry: int = -1) -> str:
    return cf.entries[entry].result.checks.source


def test_an_int_that_changes_becomes_a_symbol():
    def f(x, n):
        return x * n + n

    cf = compile(f, backend="eager")
    x = torch.randn(3, 4)
    _calls(cf, f, [(x, 7), (x, 8), (x, 9), (x, 1000)])
    assert len(cf.entries) == 2  # the constant 7, then one entry for every int >= 2
    assert cf.recompiles == 1
    assert cf.graph_count() == 2
    assert "2 <= (s0 := L[1])" in _guards(cf)
    assert cf.entries[-1].result.scalar_symbols == {"L[1]": "s0"}


def test_an_int_used_as_a_size_stays_symbolic():
    def f(x, n):
        return x.reshape(-1)[: n * 2].softmax(-1), torch.ones(n).sum() + n // 3, n % 5

    cf = compile(f, backend="eager")
    x = torch.randn(5, 6)
    _calls(cf, f, [(x, 3), (x, 4), (x, 5), (x, 11)])
    assert len(cf.entries) == 2


def test_a_branch_on_the_int_is_a_guard_on_the_symbol():
    def f(x, n):
        if n > 5:
            return x * 2
        return x - n

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    _calls(cf, f, [(x, 3), (x, 6), (x, 7), (x, 9)])
    assert len(cf.entries) == 2  # 3 (constant), then s0 > 5 serves 6, 7 and 9
    assert "s0 > 5" in _guards(cf)
    _calls(cf, f, [(x, 4)])  # the other side of the branch: the guard fails, a new entry
    assert len(cf.entries) == 3
    _calls(cf, f, [(x, 6), (x, 3)])
    assert len(cf.entries) == 3


def test_what_needs_a_plain_int_specializes():
    def f(x, n):
        return x + sum(range(n)), str(n)

    cf = compile(f, backend="eager")
    x = torch.randn(2)
    _calls(cf, f, [(x, 3), (x, 4), (x, 5)])
    assert len(cf.entries) == 3  # range() and str() need the value: s0 == 4, s0 == 5
    assert "s0 == 5" in _guards(cf)


def test_small_negative_and_bool_ints_stay_constants():
    def f(x, n):
        return x * n

    cf = compile(f, backend="eager")
    x = torch.randn(2)
    _calls(cf, f, [(x, 0), (x, 1), (x, -3), (x, True)])
    assert len(cf.entries) == 4
    assert all(not e.result.scalar_symbols for e in cf.entries)


def test_dynamic_false_keeps_specializing_and_dynamic_true_starts_symbolic():
    def f(x, n):
        return x * n

    x = torch.randn(2)
    fixed = compile(f, backend="eager", dynamic=False)
    _calls(fixed, f, [(x, 2), (x, 3), (x, 4)])
    assert len(fixed.entries) == 3
    dyn = compile(f, backend="eager", dynamic=True)
    _calls(dyn, f, [(x, 2), (x, 3), (x, 4)])
    assert len(dyn.entries) == 1


def test_int_symbol_through_autograd_and_a_module():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, n):
            return (self.lin(x) * n).sum()

    m = Scale()
    cm = compile(m, backend="aot_eager")
    for n in (2, 3, 4):
        x = torch.randn(3, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        m.zero_grad()
        got = cm(x, n)
        got.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        want = m(x2, n)
        want.backward()
        assert_same(got, want)
        assert_same(x.grad, x2.grad)
        assert_same(grads, [p.grad for p in m.parameters()])
    assert len(cm._compiled.entries) == 2


def test_recompile_log_names_the_int_that_became_a_symbol(recompile_log):
    cf = compile(lambda x, n: x + n, backend="eager")
    x = torch.randn(2)
    cf(x, 2)
    cf(x, 3)
    seen = recompile_log
    assert any("L['n'] changed 2 -> 3; recompiling with it a symbol (s0)" in s for s in seen), seen


# ============================================================ float arguments as graph inputs


def _float_ops(x, f):
    return x * f + f, x - f, f / x, x ** f, x // f, x % f, x > f, f * x.sum()


def _float_dtypes(x, f):
    return x.int() * f, x.bool() + f, x.half() * f, x.to(torch.bfloat16) - f, x.double() / f


@pytest.mark.parametrize("fn", [_float_ops, _float_dtypes], ids=["operators", "dtypes"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_float_that_changes_becomes_a_graph_input(fn, backend):
    cf = compile(fn, backend=backend)
    x = torch.rand(3, 4) + 0.5
    _calls(cf, fn, [(x, 0.25), (x, 0.75), (x, 1.5), (x, 3.0)])
    assert len(cf.entries) == 2  # the constant 0.25, then one entry for every float
    assert "type(L[1]) is T" in _guards(cf) and "0.75" not in _guards(cf)
    graph = cf.entries[-1].result.graph
    assert [i.name for i in graph.inputs][-1] == "f_float"
    assert graph.values["f_float"].dtype == "float64" and graph.values["f_float"].sizes == ()


def test_an_in_place_op_with_a_float_argument():
    def f(x, g):
        y = x.clone()
        y += g
        y *= g
        return y

    cf = compile(f, backend="eager")
    x = torch.randn(5)
    _calls(cf, f, [(x, 0.5), (x, 2.5), (x, -1.25)])
    assert len(cf.entries) == 2


def test_other_uses_of_a_float_specialize():
    def f(x, g):
        if g > 0.5:  # a Python comparison reads the value: a constant guard
            return torch.clamp(x, min=g)
        return x * (2 if g.is_integer() else 3)

    cf = compile(f, backend="eager")
    x = torch.randn(4)
    _calls(cf, f, [(x, 0.25), (x, 0.75), (x, 1.0), (x, 1.0)])
    assert len(cf.entries) == 3  # 0.25, then 0.75 and 1.0 specialized again (no 4th)
    assert "L[1] == 1.0" in [describe_guard(g) for g in cf.entries[-1].result.graph.guards]


def test_number_methods_guard_their_answer_not_the_value():
    def f(x, n, g):
        return x * n.bit_length() + n.conjugate() + g.conjugate() + (1 if g.is_integer() else 0)

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    _calls(cf, f, [(x, 3, 0.25), (x, 4, 0.5), (x, 5, 1.75), (x, 7, 2.5)])
    assert len(cf.entries) == 2  # 4..7 have 3 bits and none of the floats is integral
    checks = _guards(cf)
    assert "s0 >= 4" in checks and "s0 < 8" in checks and "L[2].is_integer()" in checks
    _calls(cf, f, [(x, 8, 0.5)])  # 4 bits: the range guard fails
    _calls(cf, f, [(x, 9, 3.0), (x, 12, 4.0)])  # integral floats: one more entry for both
    assert len(cf.entries) == 4


def _arith(x, f, n):
    g = (f * 2 + 1 - f) * n - 0.25
    return x * g, x / (f + 1e-6), -f * x, x + float(n), x * (n / 4), x - n * f


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_python_arithmetic_on_varying_numbers_stays_in_the_graph(backend):
    cf = compile(_arith, backend=backend)
    x = torch.rand(3, 4)
    _calls(cf, _arith, [(x, 0.5 + i * 0.75, 2 + i) for i in range(5)])
    assert len(cf.entries) == 2 and cf.recompiles == 1  # the constants, then one for all
    assert "0.5" not in _guards(cf) and "1.25" not in _guards(cf)


def test_what_needs_a_computed_float_specializes_its_arguments():
    def f(x, g):
        h = g * 2
        if h > 1:  # Python reads h: g is guarded as a constant
            return x * h
        return x - 1 / g  # a varying divisor could be 0: folded in Python

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    _calls(cf, f, [(x, 0.25), (x, 0.75), (x, 1.5), (x, 0.75)])
    assert len(cf.entries) == 3
    assert "L[1] == 1.5" in [describe_guard(g) for g in cf.entries[-1].result.graph.guards]
    half = compile(lambda x, s: x * (s * 3), backend="eager")  # numpy float32: its own precision
    _calls(half, half.fn, [(x, np.float32(0.1 * i)) for i in range(1, 4)])
    assert len(half.entries) == 3


def test_python_arithmetic_on_a_random_draw_is_one_graph():
    def f(x):
        lo, hi = 0.5, 2.0
        return x * (lo + (hi - lo) * random.random()), x - random.random() * 3

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    assert_same(_seeded(cf, x, [1, 2, 3]), _seeded(f, x, [1, 2, 3]))
    assert cf.graph_count() == 1 and len(cf.entries) == 1


# ============================================================ defaults patched after compiling


def test_patched_defaults_are_the_ones_bound():
    def f(x, k=2, *, j=3):
        return x * k + j

    cf = compile(f, backend="eager")
    x = torch.randn(2)
    _calls(cf, f, [(x,)])
    f.__defaults__ = (5,)
    _calls(cf, f, [(x,)])
    f.__kwdefaults__ = {"j": 10}
    _calls(cf, f, [(x,)])
    f.__kwdefaults__["j"] = -1  # the same dict, changed in place
    _calls(cf, f, [(x,)])


def test_patched_forward_defaults_recompile():
    class M(nn.Module):
        def forward(self, x, k=2):
            return x * k

    m = M()
    cm = compile(m, backend="eager")
    x = torch.randn(3)
    assert_same(cm(x), m(x))
    M.forward.__defaults__ = (5,)
    assert_same(cm(x), x * 5)
    assert len(cm._compiled.entries) == 2


# ============================================================ guards whose value has no literal


def test_closure_set_emptied_and_grown_between_calls():
    s = {1}

    def f(x):
        return x * len(s)

    cf = compile(f, backend="eager")
    x = torch.randn(2)
    _calls(cf, f, [(x,)])
    s.clear()  # the failing guard's value is ``{1}``, the new contents print as set()
    _calls(cf, f, [(x,)])
    s.update({2, 3})
    _calls(cf, f, [(x,)])
    assert len(cf.entries) == 3


def test_numpy_scalar_arguments_recompile_without_error():
    def f(s):
        return torch.ones(3) * s

    cf = compile(f, backend="eager")
    _calls(cf, f, [(np.float64(2.0),), (np.float64(3.0),), (np.float64(2.0),)])
    assert len(cf.entries) == 2


@pytest.mark.parametrize("np_float", [np.float64, np.float32, np.float16])
def test_numpy_float_arguments_take_the_float_path(np_float):
    def f(x, s):
        return x * s + s, x.int() - s, x.half() * s, x > s

    cf = compile(f, backend="eager")
    x = torch.rand(3, 4) * 4
    _calls(cf, f, [(x, np_float(v)) for v in (0.5, 1.25, 2.75, -3.5)])
    assert len(cf.entries) == 2 and cf.recompiles == 1  # the constant 0.5, then an input
    assert "type(L[1]) is T" in _guards(cf) and "1.25" not in _guards(cf)
    graph = cf.entries[-1].result.graph
    assert [i.name for i in graph.inputs][-1] == "s_float" and cf.graph_count() == 2
    _calls(cf, f, [(x, 0.75)])  # a Python float is another type: its own entries
    assert len(cf.entries) == 3


# ============================================================ random numbers


@pytest.mark.parametrize("draw", [lambda x: x + torch.rand(3, 4),
                                  lambda x: x * torch.randn_like(x),
                                  lambda x: torch.nn.functional.dropout(x, 0.5, True)],
                         ids=["rand", "randn_like", "dropout"])
def test_torch_random_ops_draw_on_every_call_and_follow_the_seed(draw):
    cf = compile(draw, backend="eager")
    x = torch.randn(3, 4)
    torch.manual_seed(1)
    a, b = cf(x), cf(x)
    torch.manual_seed(1)
    want_a, want_b = draw(x), draw(x)  # eager advances the generator the same way
    torch.manual_seed(1)
    again = cf(x)
    assert not torch.equal(a, b)
    assert_same([a, b], [want_a, want_b])
    assert_same(again, a)
    assert cf.graph_count() == 1 and len(cf.entries) == 1


def _seeded(fn, x, seeds, *gens):
    out = []
    for n in seeds:
        random.seed(n)
        for g in gens:
            g.seed(n)
        out.append(fn(x))
    return out


def test_python_random_is_never_baked_in():
    def f(x):
        return x * random.random()

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    random.seed(3)
    got = [cf(x) for _ in range(12)]
    random.seed(3)
    want = [f(x) for _ in range(12)]
    assert_same(got, want)
    assert not torch.equal(got[0], got[1])
    # one graph, one entry: the draw is a graph input that the entry draws on each call
    assert cf.graph_count() == 1 and len(cf.entries) == 1 and cf.recompiles == 0
    graph = cf.entries[0].result.graph
    assert [i.name for i in graph.inputs] == ["x", "random_0"]
    assert graph.values["random_0"].dtype == "float64" and graph.values["random_0"].sizes == ()


_RNG = random.Random(0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_python_float_draws_are_graph_inputs_in_program_order(backend):
    def f(x):
        a = x * random.uniform(0.5, 1.5) + random.random()
        b = x.half() - random.gauss(0.0, 2.0)  # gauss keeps a spare value: order matters
        return a, b, x > random.gauss(0.0, 2.0), x / _RNG.random()

    cf = compile(f, backend=backend)
    x = torch.rand(3, 4) + 0.5
    assert_same(_seeded(cf, x, [1, 2, 3, 3], _RNG), _seeded(f, x, [1, 2, 3, 3], _RNG))
    assert cf.graph_count() == 1 and len(cf.entries) == 1
    assert len([i for i in cf.entries[0].result.graph.inputs if i.name.startswith("random_")]) == 5


def test_a_draw_from_a_replaced_generator_reads_the_new_one():
    g = {"rng": random.Random(1)}

    def f(x):
        return x + g["rng"].random()

    cf = compile(f, backend="eager")
    x = torch.zeros(2)
    assert_same(cf(x), torch.full((2,), random.Random(1).random()))
    g["rng"] = random.Random(7)
    assert_same(cf(x), torch.full((2,), random.Random(7).random()))
    assert cf.graph_count() == 1


def test_a_draw_python_needs_breaks_at_the_draw():
    def f(x):
        y = x * 2
        r = random.random()
        if r > 0.5:  # Python reads the value: capture starts over with a break at the draw
            return y + r
        return y - 1

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    seeds = [4, 5, 4, 8]
    assert_same(_seeded(cf, x, seeds), _seeded(f, x, seeds))
    root = cf.entries[0].result
    assert root.error is not None and "random.random()" in root.error.reason
    assert [n.op for n in root.graph.nodes] == ["aten.mul.Tensor"]  # the graph before the draw


def test_a_draw_live_at_a_later_break_breaks_at_the_draw():
    def f(x):
        r = random.random()
        y = x * r
        print("a break", end="\r")
        return y * r

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    seeds = [1, 2, 3, 4]
    assert_same(_seeded(cf, x, seeds), _seeded(f, x, seeds))
    root = cf.entries[0].result
    assert "random.random()" in root.error.reason and root.plan is not None  # resumes, not eager
    assert all(len(r.entries) <= 2 for r in cf.resumes.values())


def test_a_draw_returned_or_used_in_python_arithmetic_is_drawn_once():
    def f(x):
        r = random.random()
        return x * r, r * 2, r

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    assert_same(_seeded(cf, x, [1, 2, 3]), _seeded(f, x, [1, 2, 3]))
    random.seed(9)
    cf(x)
    after = random.random()
    random.seed(9)
    f(x)
    assert after == random.random()  # the generator advanced exactly as in eager


# ============================================================ tensors of size values


def test_torch_tensor_of_symbolic_sizes_and_relations():
    def f(x):
        n = x.shape[0]
        return x + torch.tensor(n > 4), torch.tensor(n * 2), torch.tensor(n, dtype=torch.float32)

    cf = compile(f, backend="eager", dynamic=True)
    _calls(cf, f, [(torch.randn(6, 4),), (torch.randn(7, 4),), (torch.randn(9, 4),)])
    assert len(cf.entries) == 1 and cf.graph_count() == 1  # no break: n stays s0, n > 4 a guard
    assert "s0 > 4" in _guards(cf)
    _calls(cf, f, [(torch.randn(3, 4),)])  # the relation flips: a new entry
    assert len(cf.entries) == 2


def test_torch_tensor_of_a_list_of_size_values():
    def f(x, n):
        r = x.shape[0]
        return (torch.tensor([r == x.shape[1], r > 2]), torch.tensor([n, n * 2, 3]),
                x.sum(0) * torch.tensor((r, 1), dtype=torch.float32)[0])

    cf = compile(f, backend="eager")
    _calls(cf, f, [(torch.randn(5 + i, 2), 3 + i) for i in range(5)])
    assert len(cf.entries) == 2 and cf.graph_count() == 2  # no break: stacked, or guarded
    assert not [r for r in cf.results if r.error is not None]
    nested = compile(lambda x: torch.tensor([[x.shape[0], 1]]), backend="eager")
    _calls(nested, nested.fn, [(torch.randn(5 + i),) for i in range(3)])  # plain values: specialized
    assert len(nested.entries) == 3


def test_shape_tensors_and_max_of_sizes_stay_symbolic():
    def f(x, n):
        return (torch.tensor(x.shape), x.new_tensor([x.shape[0], n]), x * max(n, 3) + min(n, 10),
                max([x.shape[0], n]))

    cf = compile(f, backend="eager")
    _calls(cf, f, [(torch.randn(4 + i, 2), 2 + i) for i in range(5)])
    assert len(cf.entries) == 2 and cf.graph_count() == 2  # max(n, 3) guards nothing


def _scaled_rows(x, n, f):
    return x[:n] * f + f, torch.ones(n, device=x.device) * f


def test_carriers_are_made_on_the_frame_tensors_device():
    from torchfuse.capture.source import FloatCarrierSource, LocalSource, ScalarCarrierSource

    # a CPU frame makes CPU carriers; a GPU frame's carriers must be on its device: a kernel
    # there reads the float, and a Program on a GPU takes its inputs on that device
    assert "device" not in ScalarCarrierSource(LocalSource(1, "n")).expr()
    assert FloatCarrierSource(LocalSource(2, "f"), "cuda:0").expr().endswith("device='cuda:0')")
    cf = compile(_scaled_rows, backend="aot_eager")
    x = torch.rand(6, 3)
    _calls(cf, _scaled_rows, [(x, 4, 0.5), (x, 3, 1.5), (x, 2, 2.5)])
    graph = cf.entries[-1].result.graph
    assert {graph.values[i.name].device for i in graph.inputs} == {"cpu"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_int_and_float_arguments_beside_gpu_tensors(backend):
    cf = compile(_scaled_rows, backend=backend)
    x = torch.rand(6, 3, device="cuda")
    _calls(cf, _scaled_rows, [(x, 4, 0.5), (x, 3, 1.5), (x, 2, 2.5), (x, 5, -0.75)])
    assert len(cf.entries) == 2  # the constants, then one entry for every int and float
    graph = cf.entries[-1].result.graph
    assert {graph.values[i.name].device for i in graph.inputs} == {"cuda:0"}
