"""Dynamic shapes in capture: automatic dynamic, ``dynamic=True/False``, ``mark_dynamic``,
shape arithmetic in Python, guards on sizes, size 0/1 specialization, graph breaks, logs.

Every compiled call is compared with eager; the ``eager`` backend (the reference
interpreter) runs symbolic graphs at any size, and a counting backend counts compiles."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import (
    CaptureError,
    DynamicShapeError,
    compile,
    config,
    explain,
    export,
    mark_dynamic,
)
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import Interpreter
from torchfuse.graph.printer import describe_guard, guard_to_python, to_python
from torchfuse.graph.symbolic import SpecializationError
from torchfuse.graph.verify import verify


class Counting:
    """A backend that counts compiles, keeps the graphs, and runs them with the interpreter."""

    def __init__(self) -> None:
        self.graphs: list[S.Graph] = []

    def __call__(self, graph: S.Graph, examples):
        verify(graph)
        self.graphs.append(graph)
        return Interpreter(graph).run

    @property
    def count(self) -> int:
        return len(self.graphs)


def _symbol_guards(graph: S.Graph) -> list[str]:
    return [g.expr for g in graph.guards if isinstance(g, S.SymbolGuard)]


def _sym_args(graph: S.Graph) -> list[str]:
    out: list[str] = []

    def walk(a):
        if isinstance(a, S.SymRef):
            out.append(a.expr)
        elif isinstance(a, S.ListArg):
            for i in a.items:
                walk(i)

    for n in graph.nodes:
        for a in [*n.args, *n.kwargs.values()]:
            walk(a)
    return out


# ----------------------------------------------------------------------------- the issue


def mul_sum(x, y):
    return (x * y).sum(-1) + 1


def test_automatic_dynamic_compiles_at_most_twice():
    backend = Counting()
    cf = compile(mul_sum, backend=backend)
    for b in range(2, 14):
        x, y = torch.randn(b, 16), torch.randn(b, 16)
        assert_same(cf(x, y), mul_sum(x, y))
    assert backend.count == 2
    first, second = backend.graphs
    assert first.symbols == ()
    assert [s.source for s in second.symbols] == ["input:0.size(0)", "input:1.size(0)"]
    # x * y needs equal batch sizes: one guard, and the values use one symbol
    assert _symbol_guards(second) == ["s0 == s1"]
    out_meta = second.values[second.outputs[0].value.name]
    assert out_meta.sizes == ("s0",)


def test_dynamic_true_compiles_once():
    backend = Counting()
    cf = compile(mul_sum, backend=backend, dynamic=True)
    for b in range(2, 14):
        x, y = torch.randn(b, 16), torch.randn(b, 16)
        assert_same(cf(x, y), mul_sum(x, y))
    assert backend.count == 1
    assert len(cf.entries) == 1 and cf.recompiles == 0
    # the feature dim is symbolic too, and free: nothing in mul_sum pins it
    assert len(backend.graphs[0].symbols) == 4


def test_dynamic_false_compiles_per_size_then_runs_eagerly():
    backend = Counting()
    cf = compile(mul_sum, backend=backend, dynamic=False)
    with config.patch(recompile_limit=4), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for b in range(2, 14):
            x, y = torch.randn(b, 16), torch.randn(b, 16)
            assert_same(cf(x, y), mul_sum(x, y))
    assert backend.count == 4
    assert all(g.symbols == () for g in backend.graphs)
    hits = [m for m in w if "recompile limit" in str(m.message)]
    assert len(hits) == 1 and "L[0]" in str(hits[0].message)


# ----------------------------------------------------------------------------- a transformer block


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, sdpa: bool = True) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads = heads
        self.sdpa = sdpa

    def attention(self, x):
        b, t, c = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
        k = self.k(x).view(b, t, h, c // h).transpose(1, 2)
        v = self.v(x).view(b, t, h, c // h).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            mask = torch.ones(t, t, device=x.device).tril()
            att = att.masked_fill(mask == 0, float("-inf")).softmax(-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa_causal", "masked_softmax"])
def test_transformer_block_over_sequence_lengths(sdpa):
    torch.manual_seed(0)
    m = Block(sdpa=sdpa)
    backend = Counting()
    cm = compile(m, backend=backend)
    for t in range(5, 13):
        x = torch.randn(2, t, 32)
        out, ref = cm(x), m(x)
        torch.testing.assert_close(out, ref)
        assert out.requires_grad
    assert backend.count == 2
    sym = backend.graphs[1]
    assert [s.source for s in sym.symbols] == ["input:0.size(1)"]
    # parameters stay static
    params = {i.name for i in sym.inputs if i.kind == "parameter"}
    assert params and all(isinstance(n, int) for p in params for n in sym.values[p].sizes)
    # gradients through the symbolic entry match eager
    x = torch.randn(2, 9, 32)
    cm(x).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(got, m.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    assert backend.count == 2


def test_transformer_block_dynamic_true_pins_the_feature_dim():
    torch.manual_seed(0)
    m = Block()
    backend = Counting()
    cm = compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for b, t in [(2, 5), (3, 7), (4, 12)]:
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(cm(x), m(x))
    assert backend.count == 1
    # LayerNorm(32) and the Linear weights need the last dim to be 32: a guard, not a recompile
    assert "s2 == 32" in _symbol_guards(backend.graphs[0])
    x = torch.randn(2, 5, 16)
    with pytest.raises(RuntimeError):
        m(x)  # eager rejects it too; the guard kept the compiled entry from running it
    with pytest.raises(RuntimeError):
        cm(x)


# ----------------------------------------------------------------------------- Python on sizes


def shape_arithmetic(x):
    b, n, d = x.shape
    flat = x.view(b * n, -1)
    z = torch.zeros(x.shape[0] * 2, d // 2)
    half = x.size(-1) // 2
    return flat.sum(0), z + 1, x[..., :half] * 2, x.reshape(-1, n * d).mean(-1)


def test_shape_arithmetic_stays_symbolic():
    backend = Counting()
    cf = compile(shape_arithmetic, backend=backend, dynamic=True)
    for shape in [(2, 3, 8), (3, 5, 8), (4, 2, 6), (5, 7, 10)]:
        x = torch.randn(*shape)
        assert_same(cf(x), shape_arithmetic(x))
    assert backend.count == 1
    args = _sym_args(backend.graphs[0])
    assert "s0*s1" in args and "2*s0" in args  # view(b * n, -1), zeros(x.shape[0] * 2)
    # no guard pins a size to a number (slicing adds range facts such as "s2//2 != 1")
    assert not any("==" in g and g.split("==")[1].strip().isdigit()
                   for g in _symbol_guards(backend.graphs[0]))


SIZE_CASES = {
    "full": lambda x: torch.full((2,), x.shape[0]) * 1.0,
    "arange": lambda x: torch.arange(x.shape[0]) + x[:, 0],
    "slice": lambda x: x[: x.shape[0] // 2],
    "split": lambda x: x.split(x.shape[0] // 2),
    "chunk": lambda x: x.chunk(2),
    "pad": lambda x: F.pad(x, (0, x.shape[1])),
    "unflatten": lambda x: x.unflatten(0, (2, -1)),
    "ones_like": lambda x: torch.ones_like(x) * x.shape[1],
    "list_comprehension": lambda x: torch.cat([x[i:i + 1] for i in range(2)]),
    "interpolate": lambda x: F.interpolate(x[None], scale_factor=2.0),
    "mean_by_size": lambda x: x.sum(0) / x.shape[0],
    "as_strided": lambda x: x.as_strided((x.shape[0], 2), (x.stride(0), 1)),
    "is_contiguous": lambda x: x.t().contiguous() if x.is_contiguous() else x,
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "softmax_last": lambda x: x.softmax(dim=x.dim() - 1),
    "builtin_max": lambda x: x[: max(x.shape[0] - 2, 2)],
    "builtin_min": lambda x: x[: min(x.shape[0], 3)],
    "sum_of_shape": lambda x: x * sum(x.shape),
    "dict_of_sizes": lambda x: {"n": x.shape[0], "m": x.shape[1] * 2},
    "type_of_size": lambda x: x * 2 if type(x.shape[0]) is int else x,
}


@pytest.mark.parametrize("name", list(SIZE_CASES))
def test_python_on_sizes_one_entry(name):
    fn = SIZE_CASES[name]
    cf = compile(fn, backend="eager", dynamic=True)
    for b in (4, 6, 8):
        x = torch.randn(b, 3)
        assert_same(cf(x), fn(x))
    assert len(cf.entries) == 1 and not [r.error for r in cf.results if r.error]


def size_queries(x, y):
    n = x.numel()
    rows = len(x)
    dims = x.dim()
    size = x.size()
    assert isinstance(rows, int) and isinstance(x.shape[1], int)
    a = x.new_zeros(rows, 2) + n
    e = y.expand(x.size(0), -1, -1).sum(0)
    r = x.reshape(size[1], size[0])
    return a, e, r * dims, x.shape, x.size(1) + 1, (rows, x.shape[1] * 3)


def test_size_queries_and_returned_sizes():
    backend = Counting()
    cf = compile(size_queries, backend=backend, dynamic=True)
    for r, c in [(2, 3), (4, 5), (7, 2)]:
        x, y = torch.randn(r, c), torch.randn(1, 3, c)
        got = cf(x, y)
        assert_same(got, size_queries(x, y))
        assert type(got[3]) is torch.Size
    assert backend.count == 1


def branchy(x):
    if x.shape[0] > 4:
        return x * 2
    return x - 1


def test_shape_branch_is_guarded(recompile_log):
    backend = Counting()
    cf = compile(branchy, backend=backend, dynamic=True)
    for b in (5, 6, 9):
        x = torch.randn(b, 3)
        assert_same(cf(x), branchy(x))
    assert backend.count == 1
    assert _symbol_guards(backend.graphs[0]) == ["s0 > 4"]
    g = next(g for g in backend.graphs[0].guards if isinstance(g, S.SymbolGuard))
    assert g.loc is not None and g.loc.text == "if x.shape[0] > 4:"
    for b in (3, 2):  # the other side of the branch: a new entry, then reused
        x = torch.randn(b, 3)
        assert_same(cf(x), branchy(x))
    assert backend.count == 2
    assert _symbol_guards(backend.graphs[1]) == ["s0 <= 4"]
    assert any("s0 > 4" in r and "if x.shape[0] > 4:" in r for r in recompile_log), recompile_log


def test_size_one_is_specialized_and_correct():
    backend = Counting()
    cf = compile(branchy, backend=backend)
    for b in (5, 6):
        x = torch.randn(b, 3)
        assert_same(cf(x), branchy(x))
    assert backend.count == 2 and backend.graphs[1].symbols
    x1 = torch.randn(1, 3)
    assert_same(cf(x1), branchy(x1))  # not the symbolic entry: sizes 0/1 are never symbols
    assert backend.count == 3 and backend.graphs[2].symbols == ()
    x0 = torch.randn(0, 3)
    assert_same(cf(x0), branchy(x0))
    assert backend.count == 4
    for b in (7, 8, 1):  # the symbolic and the size-1 entries both serve again
        x = torch.randn(b, 3)
        assert_same(cf(x), branchy(x))
    assert backend.count == 4


def test_int_of_a_size_specializes_without_mark_dynamic():
    def f(x):
        return torch.ones(int(x.shape[0])) * x.sum()

    backend = Counting()
    cf = compile(f, backend=backend, dynamic=True)
    x = torch.randn(5, 2)
    assert_same(cf(x), f(x))
    assert _symbol_guards(backend.graphs[0]) == ["s0 == 5"]
    x = torch.randn(6, 2)
    assert_same(cf(x), f(x))  # the guard fails: a new entry, correct again
    assert backend.count == 2


def test_parameters_and_sizes_of_one_stay_static():
    lin = nn.Linear(8, 4)
    backend = Counting()
    cm = compile(lin, backend=backend, dynamic=True)
    for b in (3, 5):
        x = torch.randn(1, b, 8)
        torch.testing.assert_close(cm(x), lin(x))
    g = backend.graphs[0]
    assert backend.count == 1
    assert [s.source for s in g.symbols] == ["input:0.size(1)", "input:0.size(2)"]
    tensor_guards = {t.source: t for t in g.guards if isinstance(t, S.TensorGuard)}
    x_guard = tensor_guards["L[1]"]
    assert x_guard.sizes == (1, "s0", "s1")
    assert all(isinstance(n, int) for src, t in tensor_guards.items() if src != "L[1]" for n in t.sizes)


def test_dynamic_false_never_makes_symbols():
    backend = Counting()
    cf = compile(branchy, backend=backend, dynamic=False)
    for b in (5, 6, 7):
        x = torch.randn(b, 3)
        assert_same(cf(x), branchy(x))
    assert backend.count == 3 and all(g.symbols == () for g in backend.graphs)


# ----------------------------------------------------------------------------- mark_dynamic


def test_mark_dynamic_is_symbolic_from_the_first_compile():
    backend = Counting()
    cf = compile(mul_sum, backend=backend)
    for b in (4, 7, 3):
        x, y = torch.randn(b, 16), torch.randn(b, 16)
        mark_dynamic(x, 0)
        mark_dynamic(y, 0)
        assert_same(cf(x, y), mul_sum(x, y))
    assert backend.count == 1
    assert [s.name for s in backend.graphs[0].symbols] == ["s0", "s1"]


def test_mark_dynamic_range_is_guarded(recompile_log):
    def f(x):
        return x.cumsum(0)

    backend = Counting()
    cf = compile(f, backend=backend, dynamic=False)
    for b in (4, 8, 2):
        x = torch.randn(b, 3)
        mark_dynamic(x, 0, min=2, max=8)
        assert_same(cf(x), f(x))
    assert backend.count == 1
    (sym,) = backend.graphs[0].symbols
    assert (sym.min, sym.max) == (2, 8)
    x = torch.randn(9, 3)
    mark_dynamic(x, 0, min=2, max=8)
    assert_same(cf(x), f(x))  # outside the range: the guard fails, a specialized entry
    assert backend.count == 2 and backend.graphs[1].symbols == ()
    assert any("L[0].size(0) = 9 is outside the range of s0 [2, 8]" in r for r in recompile_log)
    x = torch.randn(5, 3)
    mark_dynamic(x, 0, min=2, max=8)
    assert_same(cf(x), f(x))
    assert backend.count == 2
    src = cf.entries[0].result.checks.source
    assert "2 <= (s0 := " in src and ") <= 8" in src


def _specializes_with_int(x):
    n = x.shape[0]
    return torch.ones(int(n)) + x.sum()


def _specializes_with_range(x):
    acc = x[0]
    for i in range(x.shape[0]):
        acc = acc + x[i]
    return acc


@pytest.mark.parametrize("fn,text", [
    (_specializes_with_int, "return torch.ones(int(n)) + x.sum()"),
    (_specializes_with_range, "for i in range(x.shape[0]):"),
])
def test_specializing_a_marked_dim_is_an_error_naming_the_line(fn, text):
    cf = compile(fn, backend="eager")
    x = torch.randn(5, 3)
    mark_dynamic(x, 0)
    with pytest.raises(DynamicShapeError) as info:
        cf(x)
    err = info.value
    assert isinstance(err, CaptureError) and isinstance(err, SpecializationError)
    msg = str(err)
    assert f"{__file__}:" in msg and text in msg and "s0" in msg
    assert err.loc is not None and err.loc.text == text
    with pytest.raises(DynamicShapeError):
        explain(fn)(x)  # explain says it too, rather than reporting a partial capture
    x = torch.randn(5, 3)
    assert_same(compile(fn, backend="eager")(x), fn(x))  # unmarked: fine


# ----------------------------------------------------------------------------- logs, guards, explain


def f(x):
    return x + 1


def test_recompile_log_names_the_size_that_became_dynamic(recompile_log):
    cf = compile(f, backend="eager")
    cf(torch.randn(4, 2))
    cf(torch.randn(5, 2))
    cf(torch.randn(6, 2))
    assert "f: L['x'].size(0) changed 4 -> 5; recompiling with it dynamic (s0)" in recompile_log
    assert sum("changed" in r for r in recompile_log) == 1


def test_symbolic_guards_print_and_explain():
    backend = Counting()
    cf = compile(branchy, backend=backend, dynamic=True)
    cf(torch.randn(6, 3))
    g = backend.graphs[0]
    tg = next(t for t in g.guards if isinstance(t, S.TensorGuard))
    assert tg.sizes == ("s0", "s1") and tg.strides == ("s1", 1)
    assert "size=[s0, s1], stride=[s1, 1]" in describe_guard(tg)
    sg = next(t for t in g.guards if isinstance(t, S.SymbolGuard))
    assert eval(guard_to_python(sg), {"s0": 6}) and not eval(guard_to_python(sg), {"s0": 3})
    assert "s0 = x.size(0)" in to_python(g)
    e = explain(branchy)(torch.randn(6, 3))  # explain: automatic dynamic, one call: static
    assert e.graph_count == 1 and not any(isinstance(x, S.SymbolGuard) for x in e.guards)
    x = torch.randn(6, 3)
    mark_dynamic(x, 0)
    e = explain(branchy)(x)
    assert any(isinstance(x, S.SymbolGuard) and x.expr == "s0 > 4" for x in e.guards)
    e = explain(compile(branchy, dynamic=True))(torch.randn(6, 3))  # its own setting
    assert any(isinstance(x, S.SymbolGuard) and x.expr == "s0 > 4" for x in e.guards)
    assert "s0 > 4" in str(e)


def test_export_honors_mark_dynamic():
    x = torch.randn(6, 4)
    mark_dynamic(x, 0)
    ex = export(branchy, x)
    assert [s.source for s in ex.graph.symbols] == ["input:0.size(0)"]
    for b in (5, 9):
        x = torch.randn(b, 4)
        assert_same(ex.run(x), branchy(x))


def test_equal_sizes_become_one_symbol():
    def f(x, y):
        return torch.cat([x, y], 1) + x.repeat(1, 2)

    backend = Counting()
    cf = compile(f, backend=backend, dynamic=True)
    for b in (3, 5):
        x, y = torch.randn(b, 2), torch.randn(b, 2)
        assert_same(cf(x, y), f(x, y))
    g = backend.graphs[0]
    assert backend.count == 1
    assert "s0 == s2" in _symbol_guards(g)
    assert all("s2" not in str(m.sizes) for m in g.values.values())


# ----------------------------------------------------------------------------- graph breaks


def break_between(x):
    y = x.sin() * x.shape[0]
    print("break")
    return y.cos() + x.shape[-1]


def test_graph_break_pieces_are_dynamic_too(capsys):
    backend = Counting()
    cf = compile(break_between, backend=backend)
    for b in range(3, 9):
        x = torch.randn(b, 4)
        assert_same(cf(x), break_between(x))
    assert backend.count == 4  # each piece: once static, once symbolic
    (rf,) = cf.resumes.values()
    assert len(cf.entries) == 2 and len(rf.entries) == 2
    assert backend.graphs[-1].symbols


def size_live_across_break(x):
    b, n = x.shape
    print("break")
    return x.view(b * n), b * 2, x.shape


@pytest.mark.parametrize("dynamic,entries", [(True, 1), (None, 2)])
def test_size_live_across_a_break_is_read_from_the_inputs(capsys, dynamic, entries):
    cf = compile(size_live_across_break, backend="eager", dynamic=dynamic)
    for b in (3, 4, 6, 7):
        x = torch.randn(b, 5)
        assert_same(cf(x), size_live_across_break(x))
    (rf,) = cf.resumes.values()
    # the root returns b and n to the resume function as ints; there they are the sizes of
    # its tensor argument again (a guard L[2] == s0), not constants recompiled per size
    assert len(cf.entries) == entries and len(rf.entries) == entries
    guards = rf.entries[-1].result.graph.guards
    assert any(isinstance(g, S.ConstantGuard) and g.value == "s0" for g in guards)
