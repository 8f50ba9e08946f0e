"""Symbolic sizes through autograd: functionalize, the joint graph, decompositions and the
partition keep the graph's size symbols, so one plan serves every size; relations that only a
pass depends on become guards that the glue checks per call."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import (
    DEFAULT_TABLE,
    AutogradError,
    aot,
    aot_eager,
    decompose,
    functionalize,
    interpreter_compiler,
    joint_graph,
    partition,
)
from torchfuse.autograd import config as aconfig
from torchfuse.graph import run, trace
from torchfuse.graph import schema as S
from torchfuse.graph.expr import free_symbols
from torchfuse.graph.interpreter import bind_symbols
from torchfuse.graph.verify import verify

SIZES = (3, 7, 12)


@dataclasses.dataclass(frozen=True)
class Case:
    """``fn`` traced on ``make(hint)`` with ``dynamic`` dims symbolic; ``make(n)`` gives inputs
    whose symbolic dims are ``n``. ``grad`` flags the inputs that require grad."""

    name: str
    fn: Callable[..., torch.Tensor]
    make: Callable[[int], tuple[torch.Tensor, ...]]
    dynamic: dict[int, list[int]]
    grad: tuple[bool, ...]


def _mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _mlp_inputs(n):
    return torch.randn(n, 6), torch.randn(8, 6), torch.randn(8), torch.randn(4, 8), torch.randn(4)


CASES = [
    Case("mul_sum", lambda x, y: (x * y).sum(-1) + 1,
         lambda n: (torch.randn(n, 5), torch.randn(n, 5)), {0: [0], 1: [0]}, (True, True)),
    Case("mlp", _mlp, _mlp_inputs, {0: [0]}, (True,) * 5),
    Case("softmax", lambda x: torch.softmax(x * 2, -1),
         lambda n: (torch.randn(n, 6),), {0: [0]}, (True,)),
    Case("softmax_symbolic_dim", lambda x: torch.softmax(x, -1),
         lambda n: (torch.randn(4, n),), {0: [1]}, (True,)),
    Case("layer_norm", lambda x, w, b: F.layer_norm(x, (6,), w, b),
         lambda n: (torch.randn(n, 6), torch.randn(6), torch.randn(6)), {0: [0]}, (True,) * 3),
    Case("cross_entropy", lambda x, t: F.cross_entropy(x, t),
         lambda n: (torch.randn(n, 5), torch.randint(0, 5, (n,))), {0: [0], 1: [0]}, (True, False)),
    Case("reshape", lambda x: x.view(x.shape[0] * x.shape[1], -1).sin() * 2,
         lambda n: (torch.randn(n, n + 1, 4),), {0: [0, 1]}, (True,)),
    Case("matmul", lambda a, b: (a @ b).tanh(),
         lambda n: (torch.randn(n, n + 2), torch.randn(n + 2, 3)), {0: [0, 1], 1: [0]}, (True, True)),
    # var's derivative scales by the float 2/(n - 1): differentiated through its rule instead
    Case("var_std", lambda x: x.var(0) + x.std(-1, keepdim=True) + torch.std_mean(x, 0)[0],
         lambda n: (torch.randn(n, 3),), {0: [0]}, (True,)),
]


def _eager(fn, inputs, grad):
    leaves = [t.clone().requires_grad_(g) for t, g in zip(inputs, grad, strict=True)]
    out = fn(*leaves)
    wanted = [t for t in leaves if t.requires_grad]
    return out.detach(), torch.autograd.grad((out * out).sum(), wanted)


def _compiled(f, inputs, grad):
    leaves = [t.clone().requires_grad_(g) for t, g in zip(inputs, grad, strict=True)]
    (out,) = f(*leaves)
    wanted = [t for t in leaves if t.requires_grad]
    return out.detach(), torch.autograd.grad((out * out).sum(), wanted)


def _symbolic_graph(case: Case):
    torch.manual_seed(0)
    graph, consts = trace(case.fn, *case.make(5), dynamic=case.dynamic)
    assert not consts
    assert graph.symbols, "the test needs a graph with size symbols"
    return graph


def _expr_sizes(graph: S.Graph) -> set[str]:
    return set().union(*(free_symbols(s) for m in graph.values.values() for s in m.sizes
                         if isinstance(s, str)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_plan_serves_every_size(case: Case):
    graph = _symbolic_graph(case)
    f = aot_eager(graph, list(case.make(5)))
    for n in SIZES:
        torch.manual_seed(n)
        inputs = case.make(n)
        got_out, got_grads = _compiled(f, inputs, case.grad)
        want_out, want_grads = _eager(case.fn, inputs, case.grad)
        torch.testing.assert_close(got_out, want_out)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert f.num_plans == 1
    assert [s.name for s in f.stages].count("joint_graph") == 1
    with torch.no_grad():
        for n in SIZES:
            inputs = case.make(n)
            torch.testing.assert_close(f(*inputs)[0], case.fn(*inputs))
    assert f.num_plans == 2, "plus one inference plan, for every size too"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_partition_halves_are_symbolic_and_bind_from_their_own_inputs(case: Case):
    graph = _symbolic_graph(case)
    joint = decompose(joint_graph(functionalize(graph), case.grad))
    assert joint.symbols == graph.symbols
    assert _expr_sizes(joint), "the joint graph keeps expression sizes"
    part = partition(joint)
    for half in (part.forward, part.backward):
        verify(half)
        assert _expr_sizes(half) <= {s.name for s in half.symbols}
    # every backward symbol is the exact size of one of its inputs at the dim its source names
    for sym in part.backward.symbols:
        k, d = sym.source.removeprefix("input:").removesuffix(")").split(".size(")
        assert part.backward.values[part.backward.inputs[int(k)].name].sizes[int(d)] == sym.name
    # forward then backward by the reference interpreter at a size other than the hint
    inputs = case.make(9)
    outs = run(part.forward, *inputs)
    n_out = len(graph.outputs)
    tangents = [torch.ones_like(outs[0])]
    grads = run(part.backward, *outs[n_out:], *tangents)
    leaves = [t.clone().requires_grad_(g) for t, g in zip(inputs, case.grad, strict=True)]
    out = case.fn(*leaves)
    want = torch.autograd.grad(out.sum(), [t for t in leaves if t.requires_grad])
    torch.testing.assert_close(outs[0], out.detach())
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_backward_that_needs_a_size_no_saved_value_has_saves_the_primal():
    # the backward of (x * 2).sum() is expand(tangent, [s0, 3]) * 2: nothing to save but s0
    graph, _ = trace(lambda x: (x * 2).sum(), torch.randn(5, 3), dynamic={0: [0]})
    part = partition(joint_graph(graph, [True]))
    assert [name for name, _ in part.saved] == ["arg0"]
    assert [s.source for s in part.backward.symbols] == ["input:0.size(0)"]
    f = aot(graph, interpreter_compiler)
    for n in SIZES:
        x = torch.randn(n, 3, requires_grad=True)
        f(x)[0].backward()
        torch.testing.assert_close(x.grad, torch.full((n, 3), 2.0))
    assert f.num_plans == 1


def test_backward_symbols_prefer_saved_values_and_tangents():
    graph, _ = trace(lambda x: x.sin(), torch.randn(5, 3), dynamic={0: [0]})
    part = partition(joint_graph(graph, [True]))
    bw = part.backward
    assert [s.name for s in bw.symbols] == ["s0"]
    env = bind_symbols(bw.symbols, [torch.randn(8, 3)] * len(bw.inputs))
    assert env == {"s0": 8}


DECOMPOSED_CASES = {
    "gelu_softmax": (lambda x: torch.softmax(F.gelu(x), -1), lambda n: (torch.randn(n, 6),), {0: [0]}),
    "layer_norm": (lambda x, w: F.layer_norm(F.silu(x), (6,), w), lambda n: (torch.randn(n, 6), torch.randn(6)),
                   {0: [0]}),
    "var_mean": (lambda x: torch.var_mean(x, 0), lambda n: (torch.randn(n, 4),), {0: [0]}),
    "mean_symbolic_dim": (lambda x: x.mean(-1) + x.var(-1), lambda n: (torch.randn(3, n),), {0: [1]}),
    "log_softmax_nll": (lambda x, t: F.nll_loss(F.log_softmax(x, -1), t),
                        lambda n: (torch.randn(n, 5), torch.randint(0, 5, (n,))), {0: [0], 1: [0]}),
    "addmm": (lambda x, w, b: F.linear(x, w, b), lambda n: (torch.randn(n, 4), torch.randn(3, 4), torch.randn(3)),
              {0: [0]}),
}


def _inductor_table():
    decompositions = pytest.importorskip("torchfuse.inductor.decompositions")
    return decompositions.DECOMPOSITIONS


@pytest.mark.parametrize("table_name", ["autograd", "inductor"])
@pytest.mark.parametrize("name", list(DECOMPOSED_CASES))
def test_decompose_keeps_symbols(name: str, table_name: str):
    fn, make, dynamic = DECOMPOSED_CASES[name]
    table = DEFAULT_TABLE if table_name == "autograd" else _inductor_table()
    graph, _ = trace(fn, *make(5), dynamic=dynamic)
    out = decompose(graph, table)
    verify(out)
    assert out.symbols == graph.symbols and out.guards == graph.guards
    assert not any(n.op in table for n in out.nodes)
    assert _expr_sizes(out), "decomposed values keep expression sizes"
    for n in SIZES:
        inputs = make(n)
        got, want = run(out, *inputs), fn(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_decompose_joint_graph_with_the_inductor_table():
    table = _inductor_table()
    case = next(c for c in CASES if c.name == "layer_norm")
    graph = _symbolic_graph(case)
    f = aot(graph, interpreter_compiler, decompositions=table)
    for n in SIZES:
        inputs = case.make(n)
        got_out, got_grads = _compiled(f, inputs, case.grad)
        want_out, want_grads = _eager(case.fn, inputs, case.grad)
        torch.testing.assert_close(got_out, want_out)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert f.num_plans == 1


def test_mse_loss_backward_divides_by_the_symbolic_numel():
    fn = lambda x, y: F.mse_loss(x.tanh(), y)
    graph, _ = trace(fn, torch.randn(5, 3), torch.randn(5, 3), dynamic={0: [0], 1: [0]})
    f = aot_eager(graph, [])
    for n in SIZES:
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        got = _compiled(f, (x, y), (True, False))
        want = _eager(fn, (x, y), (True, False))
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1][0], want[1][0])
    assert f.num_plans == 1
    assert not [g for g in f.plan((True, False), True).forward_graph.guards
                if isinstance(g, S.SymbolGuard) and g.expr not in {x.expr for x in graph.guards}]


def test_a_float_made_from_sizes_pins_them():
    # 2 / numel as a Python float cannot be written in the format: its symbols specialize
    graph, _ = trace(lambda x: x * (2 / x.numel()), torch.randn(5, 3), dynamic={0: [0]})
    assert [g.expr for g in graph.guards] == ["s0 == 5"]
    x = torch.randn(5, 3)
    torch.testing.assert_close(run(graph, x)[0], x * (2 / 15))


def test_symbolic_mutated_input_and_unused_output():
    def fn(x, buf):
        buf.add_(x)
        return x.sin(), x.cos()

    graph, _ = trace(fn, torch.randn(5, 2), torch.zeros(5, 2), dynamic={0: [0], 1: [0]})
    f = aot(graph, interpreter_compiler)
    for n in SIZES:
        x, buf = torch.randn(n, 2, requires_grad=True), torch.zeros(n, 2)
        sin, _ = f(x, buf)  # the cos output gets no gradient: a zero tangent of this call's size
        sin.sum().backward()
        torch.testing.assert_close(buf, x.detach())
        torch.testing.assert_close(x.grad, x.detach().cos())
    assert f.num_plans == 1


# -- guards that only a pass adds


def _branchy_relu(x):
    # a rule that depends on a size relation the captured code never looked at
    if x.shape[0] >= 8:
        return torch.clamp_min(x, 0)
    return torch.where(x > 0, x, torch.zeros_like(x))


def _specializing_relu(x):
    return torch.clamp_min(x.reshape(int(x.shape[0]), -1), 0).reshape(x.shape)


def _relu_graph():
    graph, _ = trace(lambda x: torch.relu(x) * 3, torch.randn(5, 4), dynamic={0: [0]})
    assert not graph.guards
    return graph


def test_decomposition_guard_is_recorded_in_the_graph():
    out = decompose(_relu_graph(), {"aten.relu.default": _branchy_relu})
    assert [(g.expr, type(g)) for g in out.guards] == [("s0 < 8", S.SymbolGuard)]
    assert "aten.where.self" in {n.op for n in out.nodes}


def test_pass_guard_failure_builds_a_plan_for_those_sizes(monkeypatch, capsys):
    monkeypatch.setattr("torchfuse.autograd.glue.config",
                        dataclasses.replace(aconfig.config, log_aot=True))
    f = aot(_relu_graph(), interpreter_compiler, decompositions={"aten.relu.default": _branchy_relu})
    for n in (3, 7, 12, 20, 5):
        x = torch.randn(n, 4, requires_grad=True)
        out = f(x)[0]
        torch.testing.assert_close(out, torch.relu(x.detach()) * 3)
        out.sum().backward()
        torch.testing.assert_close(x.grad, (x.detach() > 0).float() * 3)
    assert f.num_plans == 2, "one plan for s0 < 8, one for s0 >= 8"
    guards = [p.guards for p in f._plans[(True, (True,))]]
    assert [[g.expr for g in gs] for gs in guards] == [["s0 < 8"], ["s0 >= 8"]]
    log = capsys.readouterr().err
    assert "[torchfuse.aot] aot: guard s0 < 8 of the compiled plan fails for sizes s0=12" in log


def test_backward_formula_guard_is_checked_per_call():
    # prod's derivative formula branches on whether the reduced dim has exactly 2 elements
    fn = lambda x: x.prod(0)
    graph, _ = trace(fn, torch.randn(5, 4), dynamic={0: [0]})
    assert not graph.guards
    f = aot(graph, interpreter_compiler)
    for n in (3, 7, 2, 12, 2):
        x = torch.randn(n, 4, requires_grad=True)
        got_out, got_grads = _compiled(f, (x,), (True,))
        want_out, want_grads = _eager(fn, (x,), (True,))
        torch.testing.assert_close(got_out, want_out)
        torch.testing.assert_close(got_grads[0], want_grads[0])
    plans = f._plans[(True, (True,))]
    assert [[g.expr for g in p.guards] for p in plans] == [["s0 - 1 != 1"], ["s0 - 1 == 1"]]
    assert all(g.expr in {x.expr for x in p.forward_graph.guards} for p in plans for g in p.guards)


def test_pass_specialization_falls_back_to_a_plan_per_size():
    f = aot(_relu_graph(), interpreter_compiler, decompositions={"aten.relu.default": _specializing_relu})
    with torch.no_grad():
        for n in (3, 7, 3, 7, 9):
            x = torch.randn(n, 4)
            torch.testing.assert_close(f(x)[0], torch.relu(x) * 3)
    # the first plan comes from the capture's hint (5): it is built, found wrong for 3, kept
    assert f.num_plans == 4
    exprs = sorted(g.expr for plans in f._plans.values() for p in plans for g in p.guards)
    assert exprs == ["s0 == 3", "s0 == 5", "s0 == 7", "s0 == 9"]
    with torch.no_grad(), pytest.raises(AutogradError, match=r"s0=1 .* outside the symbol's range"):
        f(torch.randn(1, 4))


def test_symbolic_plan_cache_key_and_reuse():
    from test_cache_aot import MemoryCache

    case = next(c for c in CASES if c.name == "mlp")
    graph = _symbolic_graph(case)
    store = MemoryCache()
    first = aot(graph, interpreter_compiler, cache=store)
    _compiled(first, case.make(3), case.grad)
    second = aot(graph, interpreter_compiler, cache=store)
    for n in SIZES:
        inputs = case.make(n)
        got = _compiled(second, inputs, case.grad)
        want = _eager(case.fn, inputs, case.grad)
        torch.testing.assert_close(got[0], want[0])
        for g, w in zip(got[1], want[1], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert store.hits == 1 and second.num_plans == 1
    assert "joint_graph" not in [s.name for s in second.stages]
