"""Fusion decisions, pinned by kernel counts and by what is (not) written to memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import BF16_TOL, assert_matches, compile_fn, kernel_kinds, run_runtime, triton_source
from torchfuse.graph import schema as S

pytestmark = pytest.mark.usefixtures("cpu_backend")
"""Every test here runs on both CPU code generators (Triton interpreted, C++/OpenMP)."""


def seed_fn(x, y):
    return F.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean()


def rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w


def add_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b)


def allocated(program: S.Program) -> set[str]:
    return {s.buffer for s in program.steps if isinstance(s, S.AllocStep)}


def test_seed_function_is_one_reduction_kernel_plus_the_mean():
    x, y = torch.randn(6, 16), torch.randn(6, 16)
    program = compile_fn(seed_fn, x, y)
    assert len(program.kernels) == 2
    first = program.kernels[0].name
    assert first.split("_", 1)[1].startswith("per_fused_") and all(op in first for op in ("add", "mul", "relu", "sum"))
    # only the row sums and the result reach memory
    assert len(allocated(program)) == 2
    assert_matches(run_runtime(program, [x, y]), seed_fn(x, y), atol=1e-4, rtol=1e-5)


def test_softmax_is_one_kernel():
    x = torch.randn(4, 32)
    program = compile_fn(lambda x: x.softmax(-1), x)
    assert kernel_kinds(program) == ["per"]
    assert_matches(run_runtime(program, [x]), x.softmax(-1))


def test_layer_norm_is_one_kernel():
    x, w, b = torch.randn(4, 32), torch.randn(32), torch.randn(32)
    fn = lambda x, w, b: F.layer_norm(x, (32,), w, b)
    program = compile_fn(fn, x, w, b)
    assert kernel_kinds(program) == ["per"]
    assert_matches(run_runtime(program, [x, w, b]), fn(x, w, b), atol=1e-5, rtol=1e-5)


def test_written_out_rmsnorm_is_one_kernel():
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    program = compile_fn(rmsnorm, x, w)
    assert kernel_kinds(program) == ["per"]
    assert_matches(run_runtime(program, [x, w]), rmsnorm(x, w), **BF16_TOL)


def test_add_layer_norm_returning_both_is_one_kernel():
    args = (torch.randn(4, 32), torch.randn(4, 32), torch.randn(32), torch.randn(32))
    program = compile_fn(add_layer_norm, *args)
    assert kernel_kinds(program) == ["per"]
    assert len(allocated(program)) == 2
    assert_matches(run_runtime(program, args), add_layer_norm(*args), atol=1e-5, rtol=1e-5)


def test_long_rows_use_one_looped_kernel():
    x = torch.randn(3, 40)
    opts = {"persistent_rnumel_max": 16, "looped_rblock": 16}
    program = compile_fn(lambda x: x.softmax(-1), x, options=opts)
    assert kernel_kinds(program) == ["red"]
    if triton_source(program):
        assert "for roffset in range(0, rnumel, RBLOCK)" in program.kernels[0].source
    assert_matches(run_runtime(program, [x]), x.softmax(-1))


def test_cross_entropy_rows_in_one_kernel():
    x, t = torch.randn(4, 40), torch.randint(0, 40, (4,))
    fn = lambda x, t: F.cross_entropy(x, t)
    for opts in (None, {"persistent_rnumel_max": 16, "looped_rblock": 16}):
        program = compile_fn(fn, x, t, options=opts)
        # per-row logsumexp and target logit in one kernel, the batch mean in a second
        assert len(program.kernels) == 2
        assert_matches(run_runtime(program, [x, t]), fn(x, t), atol=1e-5, rtol=1e-5)


def test_split_reduction_when_few_outputs():
    x = torch.randn(32, 32)
    program = compile_fn(lambda x: x.sum(), x, options={"split_min_rnumel": 256, "split_target": 16})
    assert len(program.kernels) == 2
    assert_matches(run_runtime(program, [x]), x.sum(), atol=1e-4, rtol=1e-5)


def test_horizontal_fusion_of_reductions_sharing_input():
    x = torch.randn(5, 16)
    fn = lambda x: (x.sum(1), x.amax(1), (x * 2).exp())
    program = compile_fn(fn, x)
    assert len(program.kernels) == 1
    assert_matches(run_runtime(program, [x]), fn(x), atol=1e-5, rtol=1e-5)


def test_reduction_epilogue_fuses():
    x = torch.randn(5, 16)
    fn = lambda x: (x.sum(1) * 2 + 1).sigmoid()
    program = compile_fn(fn, x)
    assert len(program.kernels) == 1
    assert_matches(run_runtime(program, [x]), fn(x))


def test_mismatched_index_is_not_fused_but_correct():
    x = torch.randn(8, 8)
    fn = lambda x: (x.exp() + 1) @ x + (x.exp() + 1).t().sum(0)
    program = compile_fn(fn, x)
    assert_matches(run_runtime(program, [x]), fn(x), atol=1e-4, rtol=1e-5)


def test_no_cycle_through_an_extern():
    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def fn(x, w):
        a = x.relu()
        b = a @ w  # extern between two pointwise users of x
        return a * 2 + b, b.sum(1)

    program = compile_fn(fn, x, w)
    assert_matches(run_runtime(program, [x, w]), fn(x, w), atol=1e-5, rtol=1e-5)


def test_buffer_reuse_after_free():
    x, w = torch.randn(8, 8), torch.randn(8, 8)

    def fn(x, w):
        a = (x @ w).relu()
        b = (a @ w).sigmoid()
        return (b @ w).tanh()

    program = compile_fn(fn, x, w)
    reused = [s for s in program.steps if isinstance(s, S.AllocStep) and s.reuse]
    frees = [s for s in program.steps if isinstance(s, S.FreeStep)]
    assert reused and frees
    assert_matches(run_runtime(program, [x, w]), fn(x, w), atol=1e-5, rtol=1e-5)


def test_dead_outputs_of_decompositions_are_not_computed():
    x = torch.randn(4, 8)
    program = compile_fn(lambda x: F.layer_norm(x, (8,)), x)
    assert len(allocated(program)) == 1


def test_benchmark_shaped_workloads_fuse():
    """Small versions of the benchmark table: rope, small_ops, swiglu, causal attention."""
    torch.manual_seed(0)

    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def small_ops(x, y):
        for _ in range(10):
            x, y = torch.sin(x) * y + 0.5, torch.cos(y) - x * 0.1
        return x, y

    def swiglu(x, wg, wu, wd):
        return (F.silu(x @ wg) * (x @ wu)) @ wd

    def attention(q, k, v):
        s = q @ k.transpose(-1, -2) / 2.0
        mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ v

    cases = [
        (rope, (torch.randn(2, 3, 8, 4), torch.randn(8, 4), torch.randn(8, 4)), 1),
        (small_ops, (torch.randn(8, 8), torch.randn(8, 8)), 1),
        (swiglu, (torch.randn(4, 8), torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 8)), 1),
        (attention, (torch.randn(2, 8, 4), torch.randn(2, 8, 4), torch.randn(2, 8, 4)), 1),
    ]
    for fn, args, n_kernels in cases:
        program = compile_fn(fn, *args)
        assert len(program.kernels) == n_kernels, (fn.__name__, [k.name for k in program.kernels])
        assert program.meta["fallbacks"] == ""
        assert_matches(run_runtime(program, args), fn(*args), atol=1e-5, rtol=1e-5)


def test_reduction_over_leading_dim_uses_wide_tiles():
    x, g = torch.randn(40, 24), torch.randn(40, 24)
    fn = lambda x, g: ((x * g).sum(0), g.sum(0))  # the shape of a weight/bias gradient
    program = compile_fn(fn, x, g)
    assert kernel_kinds(program) == ["red"]
    if triton_source(program):  # Triton's tiles; C++ kernels have no launch configs
        assert program.kernels[0].configs[0].meta["XBLOCK"] > 1
    assert_matches(run_runtime(program, [x, g]), fn(x, g), atol=1e-5, rtol=1e-5)


def test_leading_dim_reduction_is_split_into_row_chunks():
    # a weight gradient: 512 rows of 8 columns would be one program walking all rows
    g, x = torch.randn(512, 8), torch.randn(512, 8)
    fn = lambda g, x: ((g * x).sum(0), g.sum(0))
    opts = {"outer_split_programs": 16, "outer_split_min_chunk": 8}
    program = compile_fn(fn, g, x, options=opts)
    # stage 1: partials of both sums (one kernel, over 16 chunks x 8 columns); stage 2: both
    # second stages in one kernel
    assert kernel_kinds(program) == ["red", "red"]
    partials = [b for b in program.buffers if tuple(b.sizes) == (16, 8)]
    assert len(partials) == 2
    assert_matches(run_runtime(program, [g, x]), fn(g, x), atol=1e-4, rtol=1e-5)


def test_per_channel_reduction_of_channels_last_data_is_split_into_row_chunks():
    # batch norm statistics over NHWC data: the channels are contiguous, N, H, W lie outside
    # them in memory, so it is a leading-dim reduction of the memory (it was one program per
    # 64-channel tile walking every pixel); NCHW data keeps the per-row kernel
    x = torch.randn(4, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    fn = lambda x: (x * 2).sum((0, 2, 3))
    opts = {"outer_split_programs": 16, "outer_split_min_chunk": 8}
    program = compile_fn(fn, x, options=opts)
    assert kernel_kinds(program) == ["red", "red"]
    assert [tuple(b.sizes) for b in program.buffers if tuple(b.sizes) == (16, 8)]
    assert_matches(run_runtime(program, [x]), fn(x), atol=1e-4, rtol=1e-5)
    dense = x.contiguous()
    program = compile_fn(fn, dense, options=opts)
    assert len(kernel_kinds(program)) == 1
    assert_matches(run_runtime(program, [dense]), fn(dense), atol=1e-4, rtol=1e-5)


def test_wide_leading_dim_reduction_takes_the_chunks_it_can():
    # a wide bias gradient: the program target asks for 8 chunks, the minimum chunk allows 4;
    # it is split in 4 (it used to stay one kernel of 8 column tiles walking all 32 rows)
    g = torch.randn(32, 512)
    opts = {"outer_split_programs": 64, "outer_split_min_chunk": 8}
    program = compile_fn(lambda g: g.sum(0), g, options=opts)
    assert kernel_kinds(program) == ["red", "red"]
    assert [tuple(b.sizes) for b in program.buffers if tuple(b.sizes) == (4, 512)]
    assert_matches(run_runtime(program, [g]), g.sum(0), atol=1e-4, rtol=1e-5)


def test_short_strided_rows_take_a_short_chunk_and_wide_tiles():
    # a bias broadcast over a batch of 6: 6 strided rows per column, summed; the chunk is the
    # row (8 lanes), the tile widens along the contiguous columns
    x = torch.randn(6, 4, 16, 16)
    program = compile_fn(lambda x: (x * 2).sum(0, keepdim=True), x)
    (kernel,) = program.kernels
    if triton_source(program):  # Triton's tiles; C++ kernels have no launch configs
        assert {c.meta["RBLOCK"] for c in kernel.configs} == {8}
        assert min(c.meta["XBLOCK"] for c in kernel.configs) >= 256
    assert_matches(run_runtime(program, [x]), (x * 2).sum(0, keepdim=True), atol=1e-5, rtol=1e-5)


def test_row_kernels_met_apart_are_merged():
    # sum(g * w) starts a kernel before the statistics of x are met (nothing shared yet);
    # the dx-like epilogue needs both: one kernel in the end, g read once
    g, w, x = torch.randn(4, 32), torch.randn(32), torch.randn(4, 32)
    fn = lambda g, w, x: (g * w).sum(1, keepdim=True) * x + x.sum(1, keepdim=True) * g
    program = compile_fn(fn, g, w, x)
    assert kernel_kinds(program) == ["per"]
    assert_matches(run_runtime(program, [g, w, x]), fn(g, w, x), atol=1e-5, rtol=1e-5)


def test_value_passed_to_two_matmuls_is_one_buffer():
    x, y, w = torch.randn(8, 4), torch.randn(8, 4), torch.randn(4, 3)

    def fn(x, y, w):
        h = torch.sin(x) * y
        return h @ w, x.t() @ h  # h is an argument of both matmuls

    program = compile_fn(fn, x, y, w)
    assert kernel_kinds(program) == ["poi"]
    src = program.kernels[0].source
    # one store: in C++, one output pointer (its parameter and its one store)
    assert src.count("tl.store(") == 1 if triton_source(program) else src.count("out_ptr") == 2
    assert_matches(run_runtime(program, [x, y, w]), fn(x, y, w), atol=1e-5, rtol=1e-5)


def test_value_passed_to_a_matmul_as_is_and_transposed_is_one_buffer():
    # GPT-2's dlogits: ``d @ w`` and ``d.t() @ h``; the transposed use comes first, and still
    # reads the one buffer (a view of it) instead of a second copy laid out like the view
    d, w, h = torch.randn(8, 6), torch.randn(6, 3), torch.randn(8, 5)

    def fn(d, w, h):
        g = torch.sin(d) * 2.0
        return g.t() @ h, g @ w

    program = compile_fn(fn, d, w, h)
    assert kernel_kinds(program) == ["poi"]
    src = program.kernels[0].source
    if triton_source(program):
        assert src.count("tl.store(") == 1 and "tl.load(in_ptr0 + (xindex)" in src
    else:  # one output pointer: its parameter and its one store
        assert src.count("out_ptr") == 2 and "in_ptr0[xindex]" in src
    assert_matches(run_runtime(program, [d, w, h]), fn(d, w, h), atol=1e-5, rtol=1e-5)


def test_transposed_matmul_argument_is_written_in_memory_order():
    # h.t() handed to a matmul is stored with strides (1, 8): the kernel walks it in memory
    # order, so the loads of x and the store are both contiguous in xindex
    x, g = torch.randn(8, 6), torch.randn(8, 5)
    fn = lambda x, g: torch.relu(x).t() @ g
    program = compile_fn(fn, x, g)
    src = program.kernels[0].source
    if triton_source(program):
        assert "tl.load(in_ptr0 + (xindex)" in src and "tl.store(out_ptr0 + (xindex)" in src
    else:
        assert "in_ptr0[xindex]" in src and "out_ptr0[xindex] =" in src
    assert_matches(run_runtime(program, [x, g]), fn(x, g), atol=1e-5, rtol=1e-5)


def test_cheap_value_from_narrow_inputs_is_recomputed_not_stored():
    # xhat (~10 ops from x and per-row stats) read by a row reduction and a column reduction:
    # a buffer of it costs as many bytes per element as x, written and read again, while
    # recomputing it reads x only
    x, g = torch.randn(16, 32), torch.randn(16, 32)

    def fn(x, g):
        mu = x.mean(1, keepdim=True)
        xhat = (x - mu) * torch.rsqrt((x - mu).pow(2).mean(1, keepdim=True) + 1e-5)
        xhat = torch.sigmoid(xhat * 1.5 + 0.25) * 2.0 - 1.0
        return (g * xhat).sum(1), (g * xhat).sum(0)

    program = compile_fn(fn, x, g)
    big = [b.name for b in program.buffers if tuple(b.sizes) == (16, 32) and b.name in allocated(program)]
    assert not big, big
    assert_matches(run_runtime(program, [x, g]), fn(x, g), atol=1e-5, rtol=1e-5)


def test_groups_with_the_same_code_share_one_kernel():
    # two layers' worth of the same work on different sizes: one Triton function, two launches
    # (Triton compiles by source: two names would be two compiles on a cold start); sizes
    # whose launch configs agree (a block is capped by a small tensor's size)
    x, y = torch.randn(64, 4), torch.randn(128, 4)

    def fn(x, y):
        return torch.sin(x) * 2.0 + 1.0, torch.sin(y) * 2.0 + 1.0

    # two independent small kernels would be one combo launch (test_combo_kernels.py)
    program = compile_fn(fn, x, y, options={"combo_kernels": False})
    launches = [s for s in program.steps if isinstance(s, S.LaunchStep)]
    assert len(program.kernels) == 1 and len(launches) == 2
    assert {s.kernel for s in launches} == {program.kernels[0].name}
    assert program.kernels[0].meta["launches"] == "2"
    # the grids name each launch's size: the second launch carries its own
    if triton_source(program):  # a C++ kernel's sizes are arguments only: it has no grid
        assert launches[0].grid == () and launches[1].grid and "512" in str(launches[1].grid[0])
    assert_matches(run_runtime(program, [x, y]), fn(x, y), atol=1e-5, rtol=1e-5)
    assert_matches(run_runtime(program, [x, y]), fn(x, y), atol=1e-5, rtol=1e-5)


def test_shared_kernel_with_symbolic_sizes_takes_each_launch_grid():
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph

    def fn(x, y):
        return torch.sin(x) * 2.0 + 1.0, torch.sin(y) * 2.0 + 1.0

    graph, _ = trace(fn, torch.randn(64, 4), torch.randn(100, 4), dynamic={0: [0], 1: [0]})
    program = compile_graph(graph, options={"cache": False})
    launches = [s for s in program.steps if isinstance(s, S.LaunchStep)]
    assert len(program.kernels) == 1 and len(launches) == 2
    if triton_source(program):  # the second launch's own grid, over the other symbol
        assert "s1" in str(launches[1].grid)
    for a, b in ((torch.randn(7, 4), torch.randn(300, 4)), (torch.randn(300, 4), torch.randn(2, 4))):
        assert_matches(run_runtime(program, [a, b]), fn(a, b), atol=1e-5, rtol=1e-5)


def _dlogits(x, lse, t, g):
    # GPT-2's dlogits in miniature: softmax - onehot, scaled, cast, padded for the matmul
    p = torch.exp(x.float() - lse)
    onehot = torch.zeros_like(p).scatter_(1, t[:, None], 1.0)
    return F.pad(((p - onehot) * g).to(torch.bfloat16), (0, 7))


def _dlogits_inputs(cols):
    x = torch.randn(6, cols).to(torch.bfloat16)
    return x, torch.logsumexp(x.float(), 1, keepdim=True), torch.randint(0, cols, (6,)), torch.tensor(0.5)


def test_pointwise_rows_off_by_default_divides_a_flat_index():
    inputs = _dlogits_inputs(1001)
    program = compile_fn(_dlogits, *inputs)
    assert kernel_kinds(program) == ["poi"]
    assert ("// 1008" if triton_source(program) else "/ 1008") in program.kernels[0].source


@pytest.mark.parametrize("cols", [1001, 20001])  # a persistent row, and a looped one
def test_pointwise_rows_writes_row_by_chunk_kernels_without_divisions(cols):
    inputs = _dlogits_inputs(cols)
    program = compile_fn(_dlogits, *inputs, options={"pointwise_rows": 1000})
    assert kernel_kinds(program) == (["per"] if cols < 16384 else ["red"])
    src = program.kernels[0].source
    div = "//" if triton_source(program) else "/"
    assert f"{div} {cols + 7}" not in src and f"% {cols + 7}" not in src and f"{div} {cols}" not in src
    assert_matches(run_runtime(program, list(inputs)), [_dlogits(*inputs)], atol=2e-2, rtol=2e-2)
    assert_matches(run_runtime(program, list(inputs)), [_dlogits(*inputs)], atol=2e-2, rtol=2e-2)
