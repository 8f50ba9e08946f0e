"""The C++/OpenMP code generator (``cpu_backend="cpp"``): what its kernels look like, and that
they compute what eager computes for every dtype, empty tensors, symbolic sizes, split rows and
the printed ``output_code.py``. The op-lowering, fusion and vocabulary tests run on this path
too (their ``cpu_backend`` fixture)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import BF16_TOL, assert_matches, compile_fn, run_output_code, run_runtime
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph

CPP = {"cpu_backend": "cpp"}


@pytest.fixture(autouse=True)
def _compiler():
    from torchfuse.runtime.cpp import CompilerNotFoundError, find_compiler

    try:
        find_compiler()
    except CompilerNotFoundError as e:
        pytest.skip(str(e))


def test_kernels_are_cpp_with_parallel_outer_and_simd_inner_loops():
    x = torch.randn(32, 64)
    program = compile_fn(lambda x: (torch.relu(x) * 2, x.softmax(-1), x.sum(1)), x, options=CPP)
    assert {k.language for k in program.kernels} == {"cpp"}
    assert all(k.name.startswith("cpp_") for k in program.kernels)
    src = "\n".join(k.source for k in program.kernels)
    assert "#pragma omp parallel for" in src and "#pragma omp simd" in src
    assert 'extern "C" void cpp_' in src


def test_cpp_is_the_cpu_default_and_triton_interpret_asks_for_triton():
    """``cpu_backend="auto"`` (the default): C++, or Triton when ``TRITON_INTERPRET=1``; an
    explicit setting wins either way. Every compile says which one wrote its kernels."""
    from torchfuse.inductor.config import cpu_kernels, from_environment

    assert from_environment({}).cpu_backend == "auto"
    assert cpu_kernels(from_environment({}))[0] == "cpp"
    assert cpu_kernels(from_environment({"TRITON_INTERPRET": "1"}))[0] == "triton"
    assert cpu_kernels(from_environment({"TRITON_INTERPRET": "0"}))[0] == "cpp"
    assert cpu_kernels(from_environment({"TRITON_INTERPRET": "1", "TORCHFUSE_CPU_BACKEND": "cpp"}))[0] == "cpp"
    assert cpu_kernels(from_environment({"TORCHFUSE_CPU_BACKEND": "triton"}))[0] == "triton"
    x = torch.randn(4, 8)
    for interpret, language in [(False, "cpp"), (True, "triton")]:
        program = compile_fn(lambda x: x + 1, x, options={"cpu_backend": "auto", "triton_interpret": interpret})
        assert {k.language for k in program.kernels} == {language}
        assert program.meta["kernels"].startswith(f"{language} (cpu_backend='auto'")
        assert program.meta["fusion.txt"].startswith(f"kernels: {language} (")
        assert_matches(run_runtime(program, [x]), x + 1)
    with pytest.raises(ValueError, match="cpu_backend"):
        compile_fn(lambda x: x + 1, torch.randn(4), options={"cpu_backend": "cuda"})


def test_no_compiler_is_an_error_that_says_how_to_install_one(monkeypatch):
    """Without a C++ compiler the default backend fails loudly, naming the fix and the
    explicit Triton path; it never falls back to Triton by itself."""
    import dataclasses

    import torchfuse.runtime.config as rconfig
    from torchfuse.runtime.cpp import CompilerNotFoundError, compiler_flags, find_compiler

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cxx="no-such-c++-compiler"))
    find_compiler.cache_clear()
    compiler_flags.cache_clear()
    try:
        x = torch.randn(4, 8)
        program = compile_fn(lambda x: x * 3 - 1, x, options={"cpu_backend": "auto", "triton_interpret": False})
        assert {k.language for k in program.kernels} == {"cpp"}
        with pytest.raises(CompilerNotFoundError, match="apt-get install g\\+\\+") as e:
            run_runtime(program, [x])
        assert "CXX='no-such-c++-compiler' was not found" in str(e.value)
        assert "cpu_backend='triton'" in str(e.value) and "TRITON_INTERPRET=1" in str(e.value)
    finally:
        find_compiler.cache_clear()
        compiler_flags.cache_clear()


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


def _sample(dtype: torch.dtype, shape=(5, 37)) -> torch.Tensor:
    torch.manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(0, 50, shape).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pointwise_and_reductions_in_every_dtype(dtype):
    x = _sample(dtype)
    if dtype == torch.bool:
        fn = lambda x: (x & ~x[:1], x.any(1), x.all(0), x.sum(1))
    elif dtype.is_floating_point:
        fn = lambda x: (x * 2 + 1, torch.abs(x).sqrt(), x.sum(1), x.amax(0), x.argmin(1), x.softmax(-1))
    else:
        fn = lambda x: (x * 3 - 1, x // 7, x % 5, x.sum(1), x.amax(0), x.argmax(1))
    program = compile_fn(fn, x, options=CPP)
    tol = BF16_TOL if dtype in (torch.float16, torch.bfloat16) else {"atol": 1e-5, "rtol": 1e-5}
    assert_matches(run_runtime(program, [x]), fn(x), **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_rows_fold_into_lanes_in_every_dtype(dtype):
    """Rows of 64 + 64 + 72 elements: partials in `LANES` lanes (two whole blocks, then a
    tail of 72 - 64), combined by a fixed tree; NaN rows, passes that also store, softmax's
    ``exp`` kept in a row scratch array for its last pass."""
    x = _sample(dtype, (6, 200))
    if dtype.is_floating_point:
        x[2, 150] = float("nan")
        fn = lambda x: (x.sum(1), x.amax(1), x.amin(1), x.softmax(-1), torch.relu(x) * 2, torch.relu(x).sum(1))
    elif dtype == torch.bool:
        fn = lambda x: (x.any(1), x.all(1), x.sum(1))
    else:
        fn = lambda x: (x.sum(1), x.amax(1), x.amin(1), x * 2, (x * 2).sum(1))
    program = compile_fn(fn, x, options=CPP)
    src = "\n".join(k.source for k in program.kernels)
    assert "_p[64]" in src and "for (int w = 32; w >= 1; w /= 2)" in src
    if dtype.is_floating_point:
        assert "row0[rindex] = " in src  # the softmax's exp, computed once
    tol = BF16_TOL if dtype in (torch.float16, torch.bfloat16) else {"atol": 1e-5, "rtol": 1e-5}
    out = run_runtime(program, [x])
    assert_matches(out, fn(x), **tol, equal_nan=True)
    for a, b in zip(out, run_runtime(program, [x]), strict=True):  # the same bits every call
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_lanes_with_a_symbolic_row_length():
    """A row length known only at run time: whole blocks and a tail of any length (0 included)."""
    fn = lambda x: (x.softmax(-1), x.sum(1), x.amax(1))
    graph, _ = trace(fn, torch.randn(4, 300), dynamic={0: [1]})
    program = compile_graph(graph, options={**CPP, "cache": False})
    assert "_p[64]" in program.kernels[0].source and "row0" not in program.kernels[0].source
    for cols in (2, 64, 128, 300, 1000):
        x = torch.randn(4, cols)
        assert_matches(run_runtime(program, [x]), fn(x), atol=1e-5, rtol=1e-5)


def test_broadcast_index_math_is_32_bit_where_it_fits():
    """A bias over rows (``x % 1024``): 32-bit index math, which g++ vectorizes; 64-bit where
    an extent may not fit."""
    x, b = torch.randn(16, 1024), torch.randn(1024)
    fn = lambda x, b: F.gelu(x + b, approximate="tanh")
    program = compile_fn(fn, x, b, options=CPP)
    assert "for (int32_t xindex" in program.kernels[0].source
    assert_matches(run_runtime(program, [x, b]), fn(x, b), atol=1e-5, rtol=1e-5)
    graph, _ = trace(fn, x, b, dynamic={0: [0]})
    program = compile_graph(graph, options={**CPP, "cache": False})
    assert "for (int64_t xindex" in program.kernels[0].source  # an unbounded row count


@pytest.mark.parametrize("shape", [(0, 8), (8, 0), (0,)], ids=str)
def test_empty_tensors(shape):
    x = torch.randn(shape)
    fn = lambda x: (x.exp() + 1, x.sum(-1))
    assert_matches(run_runtime(compile_fn(fn, x, options=CPP), [x]), fn(x))


def test_symbolic_sizes_serve_several_sizes():
    fn = lambda x, w: (F.layer_norm(x, (x.shape[-1],), w), (x * w).sum(0))
    graph, _ = trace(fn, torch.randn(6, 16), torch.randn(16), dynamic={0: [0]})
    program = compile_graph(graph, options={**CPP, "cache": False})
    for rows in (2, 6, 50):
        x, w = torch.randn(rows, 16), torch.randn(16)
        assert_matches(run_runtime(program, [x, w]), fn(x, w), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", ["sum", "amax", "amin", "any"])
def test_few_long_rows_are_split_into_deterministic_partials(op):
    x = torch.randn(3, 70000)
    if op == "any":
        x = x > 3.5
    fn = lambda x: getattr(x, op)(1)
    # no split into two kernels: the one kernel splits its rows itself
    program = compile_fn(fn, x, options={**CPP, "split_min_rnumel": 1 << 30})
    assert "nchunks" in program.kernels[0].source
    out = run_runtime(program, [x])
    assert_matches(out, fn(x), atol=1e-3, rtol=1e-5)
    assert torch.equal(out[0], run_runtime(program, [x])[0])  # the same bits every call


def test_looped_softmax_and_indirect_loads():
    x, idx = torch.randn(4, 3000), torch.tensor([3, 0, 2, 2, 1])
    fn = lambda x, i: (x.log_softmax(-1), x[i] * 2, F.embedding(i, x).sum(1))
    program = compile_fn(fn, x, idx, options={**CPP, "persistent_rnumel_max": 64})
    assert_matches(run_runtime(program, [x, idx]), fn(x, idx), atol=1e-4, rtol=1e-4)


def test_output_code_builds_and_runs_the_same_kernels():
    x = torch.randn(8, 33)
    fn = lambda x: (torch.tanh(x).sum(1), x.to(torch.bfloat16) * 2)
    program = compile_fn(fn, x, options=CPP)
    assert "_CPP_SOURCE" in program.meta["output_code.py"]
    assert_matches(run_output_code(program, [x]), fn(x), **BF16_TOL)
