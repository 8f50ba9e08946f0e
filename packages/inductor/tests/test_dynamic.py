"""Symbolic sizes: one Program per symbolic graph, right at every size, compared with eager.

Graphs are built with ``trace(..., dynamic={input: [dims]})``; each is compiled ONCE and run
(through the runtime, on the CPU with Triton's interpreter) at several sizes.
"""

from __future__ import annotations

import itertools
import math

import msgspec
import pytest
import sympy
import torch
import torch.nn.functional as F
from inductor_helpers import assert_matches, run_output_code
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.graph.expr import evaluate
from torchfuse.inductor import cache, compile_graph, compiler, ir
from torchfuse.inductor import compile as compile_module
from torchfuse.inductor.lowering import expr_of
from torchfuse.inductor.scheduler import RI, XI
from torchfuse.inductor.sizes import size_info

pytestmark = [pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels"),
              pytest.mark.usefixtures("cpu_backend")]  # both CPU code generators

SIZES = (3, 7, 12, 33)
R = torch.randn


def with_range(graph: S.Graph, name: str, *, min: int = 2, max: int | None = None) -> S.Graph:
    syms = tuple(msgspec.structs.replace(s, min=min, max=max) if s.name == name else s for s in graph.symbols)
    return msgspec.structs.replace(graph, symbols=syms)


def compile_dynamic(fn, make, dynamic, *, trace_size=5, options=None, edit=None):
    """Trace ``fn`` at ``trace_size`` with the dims in ``dynamic`` symbolic, compile once."""
    graph, constants = trace(fn, *make(trace_size), dynamic=dynamic)
    assert not constants and graph.symbols
    if edit is not None:
        graph = edit(graph)
    return graph, compiler(graph, make(trace_size), options={"cache": False, **(options or {})})


def run_sizes(fn, make, dynamic, *, sizes=SIZES, tol=None, **kw):
    """Compile once, run at every size, compare with eager; returns the Program."""
    _, compiled = compile_dynamic(fn, make, dynamic, **kw)
    program = compiled.program
    for n in sizes:
        inputs = make(n)
        assert_matches(compiled(*inputs), fn(*inputs), **(tol or {}))
    return program


def size_params(program: S.Program) -> list[list[str]]:
    """The scalar (size) parameters of each kernel (INDEX32, the index-width switch, aside)."""
    return [[p.name for p in k.signature if p.kind != "ptr" and p.name != "INDEX32"] for k in program.kernels]


def kinds(program: S.Program) -> list[str]:
    return [k.name.split("_")[1] for k in program.kernels]


def softmax_prims(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm_prims(x, w, b):
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    d = x - mean
    var = (d * d).sum(-1, keepdim=True) / x.shape[-1]
    return d * torch.rsqrt(var + 1e-5) * w + b


# ----------------------------------------------------------------------------- pointwise


def test_pointwise_broadcast_over_a_symbolic_batch():
    prog = run_sizes(lambda x, b, c: torch.relu(x * 2.0 + b) - c, lambda n: (R(n, 6), R(6), R(n, 1)),
                     {0: [0], 2: [0]})
    assert kinds(prog) == ["poi"]
    (k,) = prog.kernels
    assert "xnumel" in size_params(prog)[0]
    if k.language == "triton":  # the grid is an expression over the symbol, evaluated per call
        assert "s0" in str(k.grid[0])


def test_pointwise_with_both_dims_symbolic_and_a_transposed_read():
    prog = run_sizes(lambda x: x.t() * 2.0 + 1.0, lambda n: (R(n + 2, n),), {0: [0, 1]})
    # the output keeps the input's (transposed) layout: one flat loop in memory order
    assert size_params(prog) == [["xnumel"]]
    prog = run_sizes(lambda x: x.t().contiguous() * 2.0 + 1.0, lambda n: (R(n + 2, n),), {0: [0, 1]})
    # a contiguous result of a transposed read: the read's stride is a symbol, an argument
    assert any(p.startswith("s") for p in size_params(prog)[0])


def test_strided_input_view():
    run_sizes(lambda x: x * 3.0, lambda n: (R(n, 8).t(),), {0: [1]})


def test_reshape_merges_symbolic_dims():
    prog = run_sizes(lambda x: (x + 1.0).view(x.shape[0] * x.shape[1], -1) * 2.0,
                     lambda n: (R(n, n + 1, 4),), {0: [0, 1]})
    out = prog.buffers[[b.name for b in prog.buffers].index(prog.outputs[0].name)]
    assert out.sizes == ("s0*s1", 4)


def test_symbolic_size_used_as_a_scalar():
    run_sizes(lambda x: x * x.shape[0], lambda n: (R(n, 3),), {0: [0]})


VIEWS_AND_FACTORIES = {
    "arange": (lambda x: x + torch.arange(x.shape[0], 2 * x.shape[0]), lambda n: (torch.randint(0, 5, (n,)),)),
    "where_arange": (lambda x: torch.where(torch.arange(x.shape[0]) < x.shape[0] // 2, x, 0.0),
                     lambda n: (R(n),)),
    "narrow": (lambda x: x.narrow(1, 1, x.shape[1] - 2) * 2.0, lambda n: (R(3, n),)),
    "pad": (lambda x: F.pad(x, (1, 2)) + 1.0, lambda n: (R(3, n),)),
    "flip": (lambda x: x.flip(-1) + 1.0, lambda n: (R(3, n),)),
    "cat": (lambda x: torch.cat([x, x * 2.0], 1) + 1.0, lambda n: (R(3, n),)),
    "full": (lambda x: x + torch.full((x.shape[0],), 2.0), lambda n: (R(n),)),
    "gather": (lambda x: x.gather(1, torch.zeros(3, 2, dtype=torch.long)), lambda n: (R(3, n),)),
}


@pytest.mark.parametrize("name", sorted(VIEWS_AND_FACTORIES))
def test_views_and_factories_over_symbolic_sizes(name):
    fn, make = VIEWS_AND_FACTORIES[name]
    dims = [d for d, n in enumerate(make(5)[0].shape) if n == 5]
    run_sizes(fn, make, {0: dims})


# ----------------------------------------------------------------------------- reductions


def test_product_sum_plus_one_with_a_guard_relating_two_symbols():
    fn = lambda x, y: (x * y).sum(-1) + 1
    graph, compiled = compile_dynamic(fn, lambda n: (R(n, 5), R(n, 5)), {0: [0], 1: [0]})
    assert [g.expr for g in graph.guards if isinstance(g, S.SymbolGuard)] == ["s0 == s1"]
    for n in SIZES:
        x, y = R(n, 5), R(n, 5)
        assert_matches(compiled(x, y), fn(x, y))
    assert kinds(compiled.program) == ["per"]
    from torchfuse.runtime.errors import InputError

    with pytest.raises(InputError, match=r"input 1 \('arg1'\): expected shape \(s0, 5\)"):
        compiled(R(4, 5), R(6, 5))  # breaks the guard the Program was compiled under


@pytest.mark.parametrize("shape, dim, dynamic", [
    (lambda n: (4, n), -1, {0: [1]}),       # over a symbolic dim
    (lambda n: (n, 9), -1, {0: [0]}),       # over a static dim, symbolic batch
    (lambda n: (n, 5), 0, {0: [0]}),        # over the symbolic leading dim
    (lambda n: (2, n, 5), 1, {0: [1]}),     # over a symbolic middle dim
    (lambda n: (n, 9), None, {0: [0]}),     # everything
])
@pytest.mark.parametrize("op", ["sum", "amax", "argmax"])
def test_reductions(shape, dim, dynamic, op):
    fn = (lambda x: getattr(x, op)()) if dim is None else (lambda x: getattr(x, op)(dim))
    run_sizes(fn, lambda n: (R(*shape(n)),), dynamic, tol={"atol": 1e-5, "rtol": 1e-5})


def test_mean_and_var_over_a_symbolic_row():
    run_sizes(lambda x: (x.mean(-1), x.var(-1)), lambda n: (R(3, n),), {0: [1]},
              tol={"atol": 1e-5, "rtol": 1e-5})


# ----------------------------------------------------------------------------- softmax, norms


def test_softmax_with_symbolic_rows_is_persistent():
    prog = run_sizes(softmax_prims, lambda n: (R(n, 16),), {0: [0]})
    assert kinds(prog) == ["per"]


@pytest.mark.usefixtures("triton_codegen_only")
def test_softmax_with_an_unbounded_symbolic_row_is_looped_online():
    prog = run_sizes(softmax_prims, lambda n: (R(4, n),), {0: [1]})
    assert kinds(prog) == ["red"]
    assert "m_new" in prog.kernels[0].source  # the one-pass (online) max + sum of exp


@pytest.mark.usefixtures("triton_codegen_only")
def test_an_unbounded_row_keeps_a_persistent_path_for_rows_as_long_as_the_hint():
    # traced with rows of 5: rows up to 8 stay in registers, longer ones take the loop
    prog = run_sizes(softmax_prims, lambda n: (R(4, n),), {0: [1]}, sizes=(2, 7, 8, 9, 40))
    (k,) = prog.kernels
    assert k.constexprs["RBLOCK"] == 16 and "if rnumel <= RBLOCK:" in k.source
    prog = run_sizes(lambda x: (x.argmax(-1), x.sum(-1)), lambda n: (R(3, n),), {0: [1]}, sizes=(3, 17, 40),
                     tol={"atol": 1e-5, "rtol": 1e-5})
    assert all("if rnumel <= RBLOCK:" in k.source for k in prog.kernels)


@pytest.mark.usefixtures("triton_codegen_only")
def test_softmax_with_a_bounded_symbolic_row_is_persistent_and_covers_the_bound():
    prog = run_sizes(softmax_prims, lambda n: (R(4, n),), {0: [1]},
                     edit=lambda g: with_range(g, "s0", max=40))
    assert kinds(prog) == ["per"]
    assert prog.kernels[0].constexprs["RBLOCK"] == 64  # next power of two of the bound, not the hint


def test_a_bound_past_the_persistent_limit_stays_looped():
    prog = run_sizes(softmax_prims, lambda n: (R(4, n),), {0: [1]}, sizes=(3, 33),
                     edit=lambda g: with_range(g, "s0", max=1 << 20))
    assert kinds(prog) == ["red"]


def test_softmax_both_dims_symbolic():
    run_sizes(softmax_prims, lambda n: (R(n, n + 3),), {0: [0, 1]})


@pytest.mark.parametrize("dynamic, make", [
    ({0: [0]}, lambda n: (R(n, 16), R(16), R(16))),
    ({0: [1], 1: [0], 2: [0]}, lambda n: (R(3, n), R(n), R(n))),
])
def test_layer_norm_in_primitive_ops(dynamic, make):
    prog = run_sizes(layer_norm_prims, make, dynamic, tol={"atol": 1e-5, "rtol": 1e-5})
    assert len(prog.kernels) == 1  # statistics and the normalized output in one kernel


def test_decomposed_ops_keep_their_sizes_symbolic():
    """softmax, layer_norm and mean go through autograd's decompose and stay one Program."""
    run_sizes(lambda x: torch.softmax(x, -1), lambda n: (R(n, n + 3),), {0: [0, 1]})
    prog = run_sizes(lambda x, w, b: F.layer_norm(x, (16,), w, b), lambda n: (R(n, 16), R(16), R(16)),
                     {0: [0]}, tol={"atol": 1e-5, "rtol": 1e-5})
    assert "decompose" not in prog.meta["fallbacks"], prog.meta["fallbacks"]
    assert kinds(prog) == ["per"]


# ----------------------------------------------------------------------------- externs


def test_matmul_with_symbolic_m_and_a_fused_epilogue():
    prog = run_sizes(lambda x, w, b: torch.relu(x @ w + b), lambda n: (R(n, 8), R(8, 5), R(5)), {0: [0]},
                     tol={"atol": 1e-5, "rtol": 1e-5})
    assert any(isinstance(s, S.ExternStep) for s in prog.steps)
    assert kinds(prog) == ["poi"]


def test_batched_matmul_with_two_symbols():
    run_sizes(lambda a, b: torch.bmm(a, b).relu(), lambda n: (R(2, n, 4), R(2, 4, n + 1)), {0: [1], 1: [2]},
              tol={"atol": 1e-5, "rtol": 1e-5})


# ----------------------------------------------------------------------------- split reductions

SPLIT = {"split_min_rnumel": 32, "split_target": 4}
OUTER = {"outer_split_programs": 8, "outer_split_min_chunk": 2}


@pytest.mark.usefixtures("triton_codegen_only")
@pytest.mark.parametrize("fn, make", [
    (lambda x: x.sum(), lambda n: R(n, 9)),
    (lambda x: x.amax(), lambda n: R(n, 9)),
    (lambda x: x.amin(), lambda n: R(n, 9)),
    (lambda x: (x > 1.5).any(), lambda n: R(n, 9)),
    (lambda x: (x > -1.5).all(), lambda n: R(n, 9)),
    (lambda x: x.sum(), lambda n: torch.randint(-5, 5, (n, 9))),
    (lambda x: (x * 0.1 + 1.0).prod(), lambda n: R(n, 9)),
], ids=["sum", "amax", "amin", "any", "all", "int_sum", "prod"])
def test_split_reduction_over_a_symbolic_row_masks_the_tail(fn, make):
    # 9*s0 has no divisor near the target for every s0: chunks of ceil(9*s0 / 4), tail masked
    prog = run_sizes(fn, lambda n: (make(n),), {0: [0]}, sizes=(2, 3, 7, 12), options=SPLIT,
                     tol={"atol": 1e-4, "rtol": 1e-4})
    assert len(prog.kernels) == 2
    assert "<" in prog.kernels[0].source.split("for roffset")[1]  # the masked tail


def test_split_reduction_exact_when_a_factor_divides():
    prog = run_sizes(lambda x: x.sum(), lambda n: (R(n, 16),), {0: [0]}, options=SPLIT,
                     tol={"atol": 1e-5, "rtol": 1e-5})
    assert len(prog.kernels) == 2
    first = next(s for s in prog.steps if isinstance(s, S.LaunchStep))
    assert S.SymRef(expr="s0") in first.args  # 16*s0 in 16 chunks of s0: no mask needed


@pytest.mark.parametrize("fn", [lambda x: x.sum(0), lambda x: x.amax(0)], ids=["sum", "amax"])
def test_outer_split_over_symbolic_rows(fn):
    prog = run_sizes(fn, lambda n: (R(n, 5),), {0: [0]}, sizes=(2, 3, 7, 33), options=OUTER,
                     tol={"atol": 1e-5, "rtol": 1e-5})
    assert len(prog.kernels) == 2


# ----------------------------------------------------------------------------- one Program


@pytest.mark.usefixtures("triton_codegen_only")
def test_one_program_for_every_size_and_size_arguments(monkeypatch):
    calls = []
    real = compile_module.compile_graph_stages
    monkeypatch.setattr(compile_module, "compile_graph_stages",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    fn = lambda x: softmax_prims(x) * 2.0
    graph, _ = trace(fn, R(5, 7), dynamic={0: [0, 1]})
    cache.stats.reset()
    compiled = compiler(graph, [R(5, 7)])
    for n in SIZES:
        x = R(n, n + 1)
        assert_matches(compiled(x), fn(x))
    again = compiler(graph, [R(5, 7)])  # a second compile of the same graph is a cache hit
    x = R(4, 9)
    assert_matches(again(x), fn(x))
    assert len(calls) == 1 and cache.stats.program_hits == 1
    (k,) = compiled.program.kernels
    names = {p.name: p.kind for p in k.signature}
    assert names["xnumel"] == names["rnumel"] == "i64" and names["s1"] == "i64"
    assert ".to(tl.int64)" in k.source  # unbounded symbols: 64-bit index math


PARITY = {
    "seed": (lambda x, y: F.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean(),
             lambda n: (R(n, 64), R(n, 64)), {0: [0], 1: [0]}),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), lambda n: (R(n, 64), R(64), R(64)), {0: [0]}),
    "add_layer_norm": (lambda x, r, w, b: (lambda h: (h, F.layer_norm(h, (64,), w, b)))(x + r),
                       lambda n: (R(n, 64), R(n, 64), R(64), R(64)), {0: [0], 1: [0]}),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda n: (R(n, 100), torch.randint(0, 100, (n,))),
                      {0: [0], 1: [0]}),
    "rope": (lambda x, c, s: x * c + torch.cat([-x[..., 8:], x[..., :8]], -1) * s,
             lambda n: (R(2, 4, n, 16), R(n, 16), R(n, 16)), {0: [2], 1: [0], 2: [0]}),
    "attention": (lambda q, k, v: softmax_prims(q @ k.transpose(-1, -2) / 4.0 + torch.triu(
        torch.full((q.shape[-2], q.shape[-2]), float("-inf")), 1)) @ v,
        lambda n: (R(2, 2, n, 16), R(2, 2, n, 16), R(2, 2, n, 16)), {0: [2], 1: [2], 2: [2]}),
}


@pytest.mark.parametrize("name", sorted(PARITY))
def test_symbolic_sizes_fuse_like_static_ones(name):
    """Fusion compares sizes and indices symbolically: as many kernels as the static graph."""
    fn, make, dynamic = PARITY[name]
    static, _ = trace(fn, *make(37))
    symbolic, _ = trace(fn, *make(37), dynamic=dynamic)
    a = compile_graph(static, options={"cache": False})
    b = compile_graph(symbolic, options={"cache": False})
    assert len(b.kernels) == len(a.kernels)
    assert sum(isinstance(s, S.ExternStep) for s in b.steps) == sum(isinstance(s, S.ExternStep) for s in a.steps)


def test_simplify_index_with_symbolic_extents_is_exact():
    """Reshape/transposition index maps over symbolic sizes simplify to what they compute,
    checked exhaustively over small sizes; the ones that are plain affine become so."""
    s0, s1 = ir.size_symbol("s0"), ir.size_symbol("s1")
    FD, MD = ir.FloorDiv, ir.ModIdx
    cases = [  # (expression over XI < X and RI < R, X, R, what it simplifies to or None)
        (FD(RI + s0 * s0 * FD(XI, s0), s0) + MD(XI, s0), 4 * s0, s0, XI),
        (2 * s0 * FD(XI, 2 * s0) + s0 * MD(FD(XI, s0), 2) + MD(XI, s0), 4 * s0, 1, XI),
        (MD(RI + s1 * XI, s1) + s1 * FD(RI + s1 * XI, s1), s0, s1, RI + s1 * XI),
        (FD(RI, s0 * s1) + MD(RI, s0 * s1), s0, s0 * s1, RI),
        (MD(FD(XI, s1), s0) * s1 + MD(XI, s1), s0 * s1, 2, XI),
        (FD(XI * s1 + RI, s1 * 3), s0, s1, None),
        (MD(XI, s0 + 1), s0, 2, XI),
        (FD(XI, s0), s0 * s1, 2, None),
    ]
    for e, X, Rn, want in cases:
        simple = ir.simplify_index(e, {XI: X, RI: sympy.sympify(Rn)})
        if want is not None:
            assert simple == want, (e, simple)
        for a, b in itertools.product(range(2, 6), repeat=2):
            sizes = {s0: a, s1: b}
            for x in range(int(X.xreplace(sizes))):
                for r in range(int(sympy.sympify(Rn).xreplace(sizes))):
                    at = {**sizes, XI: x, RI: r}
                    assert int(simple.xreplace(at)) == int(e.xreplace(at)), (e, simple, at)


@pytest.mark.parametrize("seed", range(12))
def test_simplify_index_of_random_permuted_reshapes_is_exact(seed):
    """Random views (a permutation of a reshape) of a tensor with symbolic dims, read in a
    kernel domain ``(xnumel, rnumel)``: the simplified index equals the original everywhere."""
    import random

    rng = random.Random(seed)
    s0, s1 = ir.size_symbol("s0"), ir.size_symbol("s1")
    dims = rng.sample([2, s0, 3, s1], 4)
    perm = rng.sample(range(4), 4)
    strides = ir.contiguous_strides(dims)
    view = [dims[p] for p in perm]
    split = rng.randint(1, 3)
    X, Rn = ir.product(view[:split]), ir.product(view[split:])
    coords = ir.unflatten(XI, view[:split]) + ir.unflatten(RI, view[split:])
    # read the base through the view, flattened and unflattened again (a reshape round trip)
    flat = sum((c * st for c, st in zip(coords, ir.contiguous_strides(view), strict=True)), sympy.S.Zero)
    again = ir.unflatten(flat, view)
    e = sum((again[i] * strides[perm[i]] for i in range(4)), sympy.S.Zero)
    simple = ir.simplify_index(e, {XI: X, RI: Rn})
    for a, b in itertools.product(range(2, 5), repeat=2):
        sizes = {s0: a, s1: b}
        for x in range(int(X.xreplace(sizes))):
            for r in range(int(Rn.xreplace(sizes))):
                at = {**sizes, XI: x, RI: r}
                assert int(simple.xreplace(at)) == int(e.xreplace(at)), (e, simple, at)
    # the round trip through a flat index is undone: the same index as reading the view directly
    direct = sum((coords[i] * strides[perm[i]] for i in range(4)), sympy.S.Zero)
    assert simple == ir.simplify_index(direct, {XI: X, RI: Rn})


@pytest.mark.usefixtures("triton_codegen_only")
def test_symbolic_pointwise_block_follows_the_hint():
    """Block sizes are a performance choice: from the hint (a small hint takes the small
    block; a bound, when there is one, caps it)."""
    graph, _ = trace(lambda x: x * 2.0, R(3, 4), dynamic={0: [0]})
    (k,) = compile_graph(graph, options={"cache": False}).kernels
    assert k.configs[0].meta["XBLOCK"] == 128  # hinted at 12 elements
    big, _ = trace(lambda x: x * 2.0, R(1024, 128), dynamic={0: [0]})
    (k,) = compile_graph(big, options={"cache": False}).kernels
    assert k.configs[0].meta["XBLOCK"] == 1024  # hinted at 131072 elements
    (k,) = compile_graph(with_range(graph, "s0", max=8), options={"cache": False}).kernels
    assert k.configs[0].meta["XBLOCK"] == 32  # at most 32 elements, ever


@pytest.mark.usefixtures("triton_codegen_only")
def test_bounded_symbols_keep_32_bit_indices():
    edit = lambda g: with_range(with_range(g, "s0", max=4096), "s1", max=4096)
    prog = run_sizes(softmax_prims, lambda n: (R(n, n + 1),), {0: [0, 1]}, edit=edit)
    (k,) = prog.kernels
    assert {p.kind for p in k.signature if p.kind != "ptr"} == {"i32"}
    assert ".to(tl.int64)" not in k.source


def test_cache_key_includes_the_symbols():
    graph, _ = trace(softmax_prims, R(5, 7), dynamic={0: [0]})
    from torchfuse.inductor.config import config

    key = cache.program_key(graph, mode="default", cfg=config)
    assert key == cache.program_key(graph, mode="default", cfg=config)
    assert key != cache.program_key(with_range(graph, "s0", max=64), mode="default", cfg=config)
    static, _ = trace(softmax_prims, R(5, 7))
    assert key != cache.program_key(static, mode="default", cfg=config)


def test_output_code_runs_at_every_size():
    graph, _ = trace(lambda x, y: (x * y).sum(-1) + 1, R(5, 4), R(5, 4), dynamic={0: [0], 1: [0]})
    prog = compile_graph(graph, options={"cache": False})
    for n in (3, 9):
        x, y = R(n, 4), R(n, 4)
        assert_matches(run_output_code(prog, [x, y]), ((x * y).sum(-1) + 1,))


def test_buffers_of_equal_symbolic_size_are_reused():
    def fn(x):
        a = torch.exp(x).cumsum(-1)  # extern: its input and output are real buffers
        b = torch.sin(a).cumsum(-1)
        return torch.cos(b).cumsum(-1)

    prog = run_sizes(fn, lambda n: (R(n, 6),), {0: [0]}, tol={"atol": 1e-4, "rtol": 1e-4})
    assert any(isinstance(s, S.AllocStep) and s.reuse for s in prog.steps)


def _specializing(graph, table):
    values = {k: msgspec.structs.replace(v, sizes=tuple(5 if isinstance(s, str) else s for s in v.sizes))
              for k, v in graph.values.items()}
    return msgspec.structs.replace(graph, values=values)


def _guarding(graph, table):
    return msgspec.structs.replace(graph, guards=(*graph.guards, S.SymbolGuard(expr="s0 % 8 == 0")))


def _failing(graph, table):
    from torchfuse.autograd import DecompositionError

    raise DecompositionError("no symbolic rule")


@pytest.mark.parametrize("decompose, why", [
    (_specializing, "decompose: arg0 changed"),
    (_guarding, "decompose: it added size guards ['s0 % 8 == 0']"),
    (_failing, "decompose: decompose failed on symbolic sizes (DecompositionError: no symbolic rule)"),
])
def test_a_decomposition_that_loses_generality_is_not_used(monkeypatch, decompose, why):
    """A decomposition that specializes a size, adds an unchecked guard or fails is not used:
    the graph compiles as captured (right at every size) and fallbacks.txt says why."""
    monkeypatch.setattr(compile_module, "decompose", decompose)
    prog = run_sizes(lambda x: torch.softmax(x, -1), lambda n: (R(n, 6),), {0: [0]})
    assert why in prog.meta["fallbacks"] and why in prog.meta["fallbacks.txt"]


# ----------------------------------------------------------------------------- size algebra


def test_expr_of_follows_the_format_grammar():
    texts = ["s0//2", "(s0 + 1)//2", "s0 % 4", "max(s0, 3)", "min(s0, s1)", "s0*s1 - s1", "(s0*s1)//s1 + 2"]
    for text in texts:
        e = expr_of(text)
        for s0, s1 in itertools.product(range(2, 9), repeat=2):
            env = {ir.size_symbol("s0"): s0, ir.size_symbol("s1"): s1}
            assert int(e.xreplace(env)) == evaluate(text, {"s0": s0, "s1": s1}), text


def test_size_info_bounds_hold_exhaustively():
    s0, s1 = ir.size_symbol("s0"), ir.size_symbol("s1")
    info = size_info((S.Symbol(name="s0", min=2, max=9, hint=5), S.Symbol(name="s1", min=3, max=6, hint=4)))
    exprs = [s0 * s1, s0 - s1, ir.FloorDiv(s0 * s1 + 3, 4), ir.ModIdx(s0, s1), sympy.Max(s0, s1) * 2,
             (s0 - 1) * s1 + 1, ir.FloorDiv(s0, s1)]
    for e in exprs:
        lo, hi = info.interval(e)
        seen = [int(e.xreplace({s0: a, s1: b})) for a in range(2, 10) for b in range(3, 7)]
        assert lo <= min(seen) and max(seen) <= hi, e
        assert info.upper(e) == hi
        assert info.hint(e) == int(e.xreplace({s0: 5, s1: 4}))
    unbounded = size_info((S.Symbol(name="s0", min=2, hint=5),))
    assert unbounded.upper(s0 * 4) is None and not unbounded.fits_int32(s0)
    assert unbounded.interval(s0) == (2, math.inf)


def test_upper_bound_of_a_product_of_indices():
    x0, x1 = ir.loop_var("x", 0), ir.loop_var("x", 1)
    bounds = {x0: sympy.Integer(4), x1: sympy.Integer(5)}
    assert ir.upper_bound(x0 * x1, bounds) == 12
    assert ir.upper_bound(x0 * ir.size_symbol("s0"), bounds) is None


@pytest.mark.usefixtures("triton_codegen_only")
def test_unbounded_sizes_pick_32_or_64_bit_indices_per_call():
    """A kernel over unbounded symbols takes INDEX32 from the call's sizes: 1 (32-bit index
    math) while every extent fits, 0 beyond; both variants compute the same thing."""
    import msgspec
    from torchfuse.graph.expr import evaluate
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import load

    def f(x):
        return x[..., : x.shape[-1] // 2] * 2 + x[..., x.shape[-1] // 2 :]

    x = torch.randn(3, 5, 8)
    graph, _ = trace(f, x, dynamic={0: [0, 1, 2]})
    prog = compile_graph(graph)
    (step,) = [s for s in prog.steps if isinstance(s, S.LaunchStep)]
    kernel = next(k for k in prog.kernels if k.name == step.kernel)
    assert "if INDEX32:" in kernel.source
    expr = step.args[-1].expr
    assert evaluate(expr, {"s0": 3, "s1": 5, "s2": 8}) == 1
    assert evaluate(expr, {"s0": 1 << 12, "s1": 1 << 12, "s2": 1 << 8}) == 0
    for index32 in (1, 0):
        forced = msgspec.structs.replace(step, args=(*step.args[:-1], S.Int(value=index32)))
        p = msgspec.structs.replace(prog, steps=tuple(forced if s is step else s for s in prog.steps))
        for shape in [(3, 5, 8), (4, 7, 10)]:
            y = torch.randn(shape)
            torch.testing.assert_close(load(p, device="cpu")(y)[0], f(y))
