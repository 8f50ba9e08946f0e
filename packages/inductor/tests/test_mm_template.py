"""Matmul templates with fused epilogues (``torchfuse.inductor.templates``), against eager.

Graphs are traced on CPU tensors and decomposed with inductor's table (what the pass sees
in the pipeline), rewritten with ``policy="always"``, then run two ways: by the reference
interpreter (which launches the ``torchfuse.triton_kernel`` node eagerly) and compiled by
inductor and run by the runtime. Triton runs through its CPU interpreter, so shapes are
small and ragged (33 x 17 @ 17 x 40: every edge is masked).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import BF16_TOL, assert_matches, run_runtime
from torchfuse.autograd import decompose
from torchfuse.graph import observe, trace
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import run as interpret
from torchfuse.graph.ops import resolve_op
from torchfuse.graph.torchfuse_ops import TRITON_KERNEL
from torchfuse.graph.user_kernels import loads
from torchfuse.graph.verify import verify
from torchfuse.inductor import compile_graph
from torchfuse.inductor.compile import compile_candidate
from torchfuse.inductor.decompositions import DECOMPOSITIONS
from torchfuse.inductor.rules import RULES
from torchfuse.inductor.templates import MMConfig, apply_mm_templates
from torchfuse.inductor.templates.choose import CACHE_FILE, Candidate
from torchfuse.inductor.templates.epilogue import EPILOGUE_OPS
from torchfuse.inductor.templates.matmul import MATMULS

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")

M, K, N = 33, 17, 40
TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: BF16_TOL,
}


def R(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def graph_of(fn, *inputs) -> S.Graph:
    graph, constants = trace(fn, *inputs)
    assert not constants
    return decompose(graph, DECOMPOSITIONS)


def templated(fn, *inputs, **kw) -> tuple[S.Graph, S.Graph]:
    graph = graph_of(fn, *inputs)
    return graph, apply_mm_templates(graph, device="cpu", policy=kw.pop("policy", "always"), **kw)


def ops_of(graph: S.Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def check_both_ways(fn, inputs, graph: S.Graph, tol) -> None:
    ref = fn(*inputs)
    assert_matches(interpret(graph, *inputs), ref, **tol)
    program = compile_graph(graph, inputs, options={"cache": False})
    assert any(k.source.count("tl.dot(") for k in program.kernels)
    assert_matches(run_runtime(program, inputs), ref, **tol)


# ----------------------------------------------------------------------------- the functions


def mm(x, w):
    return x @ w


def mm_t(x, w):
    return x @ w.t()


def addmm(b, x, w):
    return torch.addmm(b, x, w)


def linear_relu(x, w, b):
    return torch.relu(F.linear(x, w, b))


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def linear_gelu_tanh(x, w, b):
    return F.gelu(x @ w.t() + b, approximate="tanh")


def silu_mm(x, w):
    return F.silu(x @ w)


def residual(x, w, r):
    return torch.sigmoid(x @ w) * 2.0 + r


def tanh_sub(x, w, r):
    return torch.tanh(x @ w - r) / 3


def bias_row(x, w, b):
    return (x @ w + b.view(1, -1)).exp() - 1


def bias_col(x, w, c):
    return -(x @ w) + c


CASES = {
    # name: (fn, input shapes, nodes the epilogue absorbs besides the matmul)
    "mm": (mm, [(M, K), (K, N)]),
    "mm_t": (mm_t, [(M, K), (N, K)]),
    "addmm": (addmm, [(N,), (M, K), (K, N)]),
    "linear_relu": (linear_relu, [(M, K), (N, K), (N,)]),
    "linear_gelu": (linear_gelu, [(M, K), (N, K), (N,)]),
    "linear_gelu_tanh": (linear_gelu_tanh, [(M, K), (N, K), (N,)]),
    "silu": (silu_mm, [(M, K), (K, N)]),
    "residual": (residual, [(M, K), (K, N), (M, N)]),
    "tanh_sub": (tanh_sub, [(M, K), (K, N), (M, N)]),
    "bias_row": (bias_row, [(M, K), (K, N), (N,)]),
    "bias_col": (bias_col, [(M, K), (K, N), (M, 1)]),
}


def _assert_one_template(graph: S.Graph) -> None:
    ops = ops_of(graph)
    assert ops.count(TRITON_KERNEL) == 1
    assert not any(op in MATMULS for op in ops), ops
    verify(graph)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager_float32(name):
    fn, shapes = CASES[name]
    torch.manual_seed(0)
    inputs = [R(*s) for s in shapes]
    _, graph = templated(fn, *inputs)
    _assert_one_template(graph)
    # the whole epilogue is inside the kernel: only views and the allocation remain
    assert set(ops_of(graph)) <= {TRITON_KERNEL, "aten.empty_strided.default", "aten.t.default",
                                  "aten.view.default"}
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["mm_t", "linear_gelu", "residual"])
def test_matches_eager_half(name, dtype):
    fn, shapes = CASES[name]
    torch.manual_seed(1)
    inputs = [R(*s, dtype=dtype) for s in shapes]
    _, graph = templated(fn, *inputs)
    _assert_one_template(graph)
    check_both_ways(fn, inputs, graph, TOL[dtype])


def test_dtype_conversion_in_epilogue():
    def fn(x, w):
        return torch.relu(x @ w).float() * 0.5

    inputs = [R(M, K, dtype=torch.float16), R(K, N, dtype=torch.float16)]
    _, graph = templated(fn, *inputs)
    _assert_one_template(graph)
    (out,) = graph.outputs
    assert graph.values[out.value.name].dtype == "float32"
    check_both_ways(fn, inputs, graph, TOL[torch.float16])


def test_linear_on_3d_input_fuses_through_the_view():
    # F.linear on [b, t, c] is view -> mm -> add -> view; gelu comes after the second view
    def fn(x, w, b, r):
        return F.gelu(F.linear(x, w, b)) + r[..., :N]

    inputs = [R(3, 11, K), R(N, K), R(N), R(3, 11, N + 8)]
    _, graph = templated(fn, *inputs)
    _assert_one_template(graph)
    assert "aten.erf.default" not in ops_of(graph)
    call = next(n for n in graph.nodes if n.op == TRITON_KERNEL)
    assert len(call.args[1].items) == 5  # x, w.t(), b, r (read in place, rows N + 8 apart), out
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


def test_extra_whose_rows_do_not_collapse_is_not_fused():
    # after the view the rows are (b, t); a [t, n] tensor repeats over b: no single row stride
    def fn(x, w, p):
        return torch.relu(x @ w).view(3, 11, N) + p

    inputs = [R(33, K), R(K, N), R(11, N)]
    _, graph = templated(fn, *inputs)
    assert ops_of(graph).count(TRITON_KERNEL) == 1
    assert "aten.relu.default" not in ops_of(graph) and "aten.add.Tensor" in ops_of(graph)
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


def test_bmm_with_epilogue():
    def fn(a, b, r, s):
        return (torch.relu(torch.bmm(a, b)) + r) * s

    inputs = [R(3, M, K), R(3, K, N), R(N), R(3, M, N)]
    _, graph = templated(fn, *inputs)
    _assert_one_template(graph)
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


def test_two_matmuls_one_feeding_the_other():
    def fn(x, w1, w2, b):
        h = torch.relu(x @ w1 + b)
        return (h @ w2) * 2 + x @ w1

    inputs = [R(M, K), R(K, N), R(N, N), R(N)]
    _, graph = templated(fn, *inputs)
    assert ops_of(graph).count(TRITON_KERNEL) == 3
    assert not any(op in MATMULS for op in ops_of(graph))
    verify(graph)
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


def test_transposed_operand_is_read_in_place():
    inputs = [R(M, K), R(N, K)]
    _, graph = templated(mm_t, *inputs)
    call = next(n for n in graph.nodes if n.op == TRITON_KERNEL)
    b = call.args[1].items[1].name
    assert graph.values[b].strides == (1, K)  # w.t(): no copy to a contiguous layout
    spec = loads(call.args[0].value)
    consts = {a["name"]: a["constexpr"] for a in spec["args"] if "constexpr" in a}
    assert (consts["B_SK"], consts["B_SN"]) == (1, K)


# ----------------------------------------------------------------------------- where epilogues stop


def test_intermediate_read_elsewhere_stops_the_epilogue():
    def fn(x, w, b):
        y = x @ w + b
        return torch.relu(y), y

    inputs = [R(M, K), R(K, N), R(N)]
    _, graph = templated(fn, *inputs)
    call = next(n for n in graph.nodes if n.op == TRITON_KERNEL)
    relu = next(n for n in graph.nodes if n.op == "aten.relu.default")
    assert call.outputs[0] == relu.args[0].name  # the kernel stores y; relu stays outside
    assert_matches(interpret(graph, *inputs), fn(*inputs), **TOL[torch.float32])


def test_matmul_read_twice_keeps_its_consumers_outside():
    def fn(x, w):
        h = x @ w
        return torch.relu(h), h * 2

    inputs = [R(M, K), R(K, N)]
    _, graph = templated(fn, *inputs)
    assert ops_of(graph).count(TRITON_KERNEL) == 1
    assert {"aten.relu.default", "aten.mul.Tensor"} <= set(ops_of(graph))
    assert_matches(interpret(graph, *inputs), fn(*inputs), **TOL[torch.float32])


def test_reduction_ends_the_epilogue():
    def fn(x, w):
        return torch.relu(x @ w).sum(dim=1)

    inputs = [R(M, K), R(K, N)]
    _, graph = templated(fn, *inputs)
    assert ops_of(graph).count(TRITON_KERNEL) == 1
    assert "aten.relu.default" not in ops_of(graph)
    assert "aten.sum.dim_IntList" in ops_of(graph)
    check_both_ways(fn, inputs, graph, TOL[torch.float32])


def test_write_between_matmul_and_epilogue_stops_it():
    def fn(x, w, r):
        y = x @ w
        r.mul_(2)
        return y + r

    inputs = [R(M, K), R(K, N), R(M, N)]
    _, graph = templated(fn, *[t.clone() for t in inputs])
    assert ops_of(graph).count(TRITON_KERNEL) == 1
    assert "aten.add.Tensor" in ops_of(graph)  # reads r after the write: not fused
    ref_inputs = [t.clone() for t in inputs]
    got = interpret(graph, *[t.clone() for t in inputs])
    assert_matches(got, fn(*ref_inputs), **TOL[torch.float32])


# ----------------------------------------------------------------------------- left alone


def test_symbolic_graph_is_left_alone():
    graph, _ = trace(linear_relu, R(M, K), R(N, K), R(N), dynamic={0: [0]})
    graph = decompose(graph, DECOMPOSITIONS)
    assert graph.symbols
    assert apply_mm_templates(graph, device="cpu", policy="always") == graph


def test_policy_never_and_auto_without_a_gpu_change_nothing():
    graph = graph_of(linear_relu, R(M, K), R(N, K), R(N))
    assert apply_mm_templates(graph, device="cpu", policy="never") is graph
    assert apply_mm_templates(graph, device="cpu", policy="auto") is graph
    with pytest.raises(ValueError, match="policy"):
        apply_mm_templates(graph, device="cpu", policy="sometimes")


def test_integer_and_double_matmuls_are_left_alone():
    for dtype in (torch.float64, torch.int64):
        inputs = [torch.ones(M, K, dtype=dtype), torch.ones(K, N, dtype=dtype)]
        graph, out = templated(mm, *inputs)
        assert out == graph


def test_every_epilogue_op_has_a_lowering_rule_and_exists():
    # an epilogue is lowered by the ordinary rules: there is no epilogue vocabulary of its own
    assert EPILOGUE_OPS <= set(RULES)
    for name in (*EPILOGUE_OPS, *MATMULS):
        resolve_op(name)


def test_configs_fit_the_problem():
    graph = graph_of(mm, R(5, 3), R(3, 200))
    spec = loads(next(n for n in apply_mm_templates(graph, device="cpu", policy="always").nodes
                      if n.op == TRITON_KERNEL).args[0].value)
    consts = {a["name"]: a["constexpr"] for a in spec["args"] if "constexpr" in a}
    assert (consts["BLOCK_M"], consts["BLOCK_N"], consts["BLOCK_K"]) == (16, 128, 16)
    assert spec["grid"] == [2]


# ----------------------------------------------------------------------------- choosing


class FakeBench:
    """Times candidates without running them: extern at ``extern_ms``, the first template
    config at ``template_ms``, the later ones slower."""

    def __init__(self, template_ms: float, extern_ms: float) -> None:
        self.template_ms = template_ms
        self.extern_ms = extern_ms
        self.calls: list[str] = []

    def __call__(self, c: Candidate) -> float:
        self.calls.append(c.label())
        if c.config is None:
            return self.extern_ms
        return self.template_ms * len(self.calls[1:])  # the first config is the fastest


def test_decisions_are_measured_once_and_cached(tmp_path):
    graph = graph_of(linear_relu, R(M, K), R(N, K), R(N))
    bench = FakeBench(template_ms=0.5, extern_ms=1.0)
    first = apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench)
    assert ops_of(first).count(TRITON_KERNEL) == 1
    assert bench.calls[0] == "extern" and len(bench.calls) > 1
    stored = json.loads((tmp_path / CACHE_FILE).read_text())
    assert len(stored["choices"]) == 1
    (entry,) = stored["choices"].values()
    assert entry["extern_ms"] == 1.0 and entry["template_ms"] == 0.5

    bench.calls.clear()
    again = apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench)
    assert bench.calls == []
    assert again == first

    other = graph_of(linear_relu, R(M + 8, K), R(N, K), R(N))
    apply_mm_templates(other, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench)
    assert bench.calls and bench.calls[0] == "extern"
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())["choices"]) == 2


def test_slower_template_keeps_the_matmul(tmp_path):
    graph = graph_of(linear_relu, R(M, K), R(N, K), R(N))
    bench = FakeBench(template_ms=0.99, extern_ms=1.0)  # within the 2% margin: not worth it
    out = apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench)
    assert out == graph
    # the margin is applied to stored times: a looser one flips the choice without measuring
    bench.calls.clear()
    out = apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench, margin=0.0)
    assert bench.calls == [] and ops_of(out).count(TRITON_KERNEL) == 1


def test_failing_configs_lose_and_a_failing_baseline_is_not_cached(tmp_path):
    graph = graph_of(mm, R(M, K), R(K, N))

    def bench(c: Candidate) -> float:
        raise RuntimeError("out of resources")

    assert apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench) == graph
    assert not (tmp_path / CACHE_FILE).exists()


def test_candidates_really_run(tmp_path):
    # a timer that runs each candidate once and checks it computes what eager does
    x, w, b = R(8, 12), R(20, 12), R(20)
    graph = graph_of(linear_relu, x, w, b)
    ran: list[str] = []

    def bench(c: Candidate) -> float:
        (out,) = c.run()
        assert out.shape == (8, 20) and torch.isfinite(out).all()
        ran.append(c.label())
        return 1.0 if c.config is None else 0.5

    configs = (MMConfig(32, 32, 32), MMConfig(16, 16, 16, num_warps=2))
    out = apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=bench,
                             configs=configs, compile_candidate=compile_candidate)
    assert ran == ["extern", "template 16x32x16 w4 s3", "template 16x16x16 w2 s3"]
    assert_matches(interpret(out, x, w, b), linear_relu(x, w, b), **TOL[torch.float32])


def test_decision_is_logged(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHFUSE_LOGS", "schedule")
    observe.reload_config()
    try:
        graph = graph_of(linear_relu, R(M, K), R(N, K), R(N))
        apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=FakeBench(0.5, 1.0))
        apply_mm_templates(graph, device="cpu", policy="auto", cache_dir=tmp_path, bench=FakeBench(0.5, 1.0))
    finally:
        monkeypatch.delenv("TORCHFUSE_LOGS")
        observe.reload_config()
    err = capsys.readouterr().err
    assert f"mm {M}x{N}x{K} f32 +add+relu: template 0.500 ms (64x64x32 w4 s3) vs cuBLAS 1.000 ms -> template" in err
    assert "(cached)" in err


# ----------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_auto_on_cuda_matches_eager(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(512, 384, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 384, device="cuda", dtype=torch.float16)
    b = torch.randn(256, device="cuda", dtype=torch.float16)
    graph = graph_of(linear_gelu, x, w, b)
    out = apply_mm_templates(graph, device="cuda", policy="auto", cache_dir=tmp_path)
    assert (tmp_path / CACHE_FILE).exists()
    program = compile_graph(out, [x, w, b], options={"cache": False})
    from torchfuse.runtime import load

    assert_matches(list(load(program)(x, w, b)), linear_gelu(x, w, b), **TOL[torch.float16])
    forced = apply_mm_templates(graph, device="cuda", policy="always")
    assert_matches(interpret(forced, x, w, b), linear_gelu(x, w, b), **TOL[torch.float16])


def test_max_autotune_mode_runs_the_template_pass():
    """compile_graph(mode="max-autotune") puts the template in; default mode does not."""
    a, w, b = torch.randn(33, 17), torch.randn(40, 17), torch.randn(40)
    graph, _ = trace(lambda a, w, b: F.relu(F.linear(a, w, b)), a, w, b)
    tuned = compile_graph(graph, mode="max-autotune", options={"mm_templates": "always"})
    plain = compile_graph(graph, options={"mm_templates": "always"})
    assert any("tl.dot" in k.source for k in tuned.kernels)
    assert not any("tl.dot" in k.source for k in plain.kernels)
    assert any(isinstance(s, S.ExternStep) and "mm" in s.op for s in plain.steps)
    want = F.relu(F.linear(a, w, b))
    (got,) = run_runtime(tuned, (a, w, b))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
