"""One scalar vocabulary, rendered per target: the table covers every op, and kernels of every
kind compute what eager computes in the corners (NaN, inf, signed zero), pointwise kernels,
reductions and matmul epilogues alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import assert_matches, compile_fn, run_runtime
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph, cpp_ops, triton_ops
from torchfuse.inductor.ir import VOp

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")

TARGETS = {"triton": triton_ops, "cpp": cpp_ops}
"""Every renderer of the loop IR: a new target (C++) adds its module here."""

NAN, INF = float("nan"), float("inf")
CORNERS = [NAN, INF, -INF, 0.0, -0.0, 1e-8, -1e-8, 0.03, -0.5, 2.0, -3.0, 30.0]


def corners(rows: int = 3) -> torch.Tensor:
    """Every corner value in every row, at a different place per row."""
    base = torch.tensor(CORNERS)
    return torch.stack([base.roll(i) for i in range(rows)])


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_op_has_one_rendering(target):
    mod = TARGETS[target]
    assert set(mod.RENDER) == set(VOp)
    for op, rule in mod.RENDER.items():
        args = [f"a{i}" for i in range(3)]
        for dtype in ("float32", "int32", "bool"):
            text = rule(args, dtype)
            assert isinstance(text, str) and text, op
            assert mod.helpers_in(text) <= set(mod.HELPERS), (op, text)


def test_float_max_and_min_propagate_nan_in_one_instruction():
    # tl.maximum(..., propagate_nan=ALL) is max.NaN.f32 on NVIDIA: as cheap as the plain max
    assert triton_ops.render(VOp.MAX, ["x", "0.0"], "float32") == (
        "tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)")
    assert triton_ops.render(VOp.MIN, ["x", "y"], "int64") == "tl.minimum(x, y)"


# ----------------------------------------------------------------------------- pointwise and reductions

NAN_CASES = {
    "relu": torch.relu,
    "clamp": lambda x: torch.clamp(x, -1.0, 2.0),
    "clamp_min": lambda x: torch.clamp_min(x, 0.5),
    "clamp_max": lambda x: torch.clamp_max(x, 0.5),
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "maximum": lambda x: torch.maximum(x[:, 1:], x[:, :-1]),
    "minimum": lambda x: torch.minimum(x[:, 1:], x[:, :-1]),
    "maximum_scalar_tensor": lambda x: torch.maximum(x, torch.tensor(0.25)),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": lambda x: F.gelu(_finite_top(x)),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "leaky_relu": F.leaky_relu,
    "hardswish": F.hardswish,
    "softplus": F.softplus,
    "where": lambda x: torch.where(x > 0, x, -x),
    "sign": torch.sign,
    "isnan": torch.isnan,
    "nan_to_zero_by_where": lambda x: torch.where(torch.isnan(x), torch.zeros_like(x), x),
    "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(1),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(1),
    "argmax_flat": lambda x: x.argmax(),
    "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(1),
    "softmax": lambda x: x.softmax(1),
    "sum": lambda x: x.sum(1),
}
LOOPED = {"persistent_rnumel_max": 4, "looped_rblock": 4}


def _finite_top(x: torch.Tensor) -> torch.Tensor:
    # eager's CPU gelu gives NaN at +inf (its vectorized erf path); CUDA's and ours give inf
    return torch.where(x == INF, torch.full_like(x, 40.0), x)


def _same(out, ref) -> None:
    ref = ref if isinstance(ref, tuple | list) else (ref,)
    assert len(out) == len(ref)
    for a, b in zip(out, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if b.dtype.is_floating_point:
            # gelu's 1 + erf(x) cancels for x < 0 in every float32 formula: 1e-5 absolute
            torch.testing.assert_close(a, b, equal_nan=True, atol=1e-5, rtol=1e-4)
        else:
            assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("options", [None, LOOPED], ids=["persistent", "looped"])
@pytest.mark.parametrize("name", sorted(NAN_CASES))
@pytest.mark.usefixtures("cpu_backend")
def test_nan_and_inf_like_eager(name, options):
    fn = NAN_CASES[name]
    x = corners()
    program = compile_fn(fn, x, options=options)
    assert program.kernels and program.meta["fallbacks"] == ""
    _same(run_runtime(program, [x]), fn(x))


@pytest.mark.usefixtures("cpu_backend")
def test_tanh_is_one_formula_with_a_known_absolute_error():
    # 1 - 2/(exp(2x) + 1): right to ~1e-7 absolutely, not relatively near 0 (see triton_ops)
    x = torch.tensor([1e-8, -4e-8, -1e-6, 1e-4, 0.06, 0.07, -0.3, 9.0, -9.0, 60.0, -60.0])
    (out,) = run_runtime(compile_fn(torch.tanh, x), [x])
    torch.testing.assert_close(out, torch.tanh(x), rtol=0, atol=2.5e-7)


# ----------------------------------------------------------------------------- epilogues agree

EPILOGUES = {
    "relu": lambda x, w, b: torch.relu(x @ w + b),
    "tanh": lambda x, w, b: torch.tanh(x @ w - b),
    "sigmoid": lambda x, w, b: torch.sigmoid(x @ w) * b,
    "gelu": lambda x, w, b: F.gelu(x @ w + _finite_top(b)),
    "gelu_tanh": lambda x, w, b: F.gelu(x @ w + b, approximate="tanh"),
    "silu": lambda x, w, b: F.silu(x @ w) / b,
    "exp_neg": lambda x, w, b: torch.exp(-(x @ w)) + b,
}


def _epilogue_inputs():
    torch.manual_seed(0)
    x, w = torch.randn(6, 12), torch.randn(12, len(CORNERS))
    x[1, 3] = NAN  # a NaN row of the product
    x[2] = 0.0  # a zero row: the epilogue sees 0 + b
    b = torch.tensor(CORNERS)  # the extra input carries every corner
    return x, w, b


@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_epilogue_and_pointwise_kernel_agree_with_eager(name):
    fn = EPILOGUES[name]
    inputs = _epilogue_inputs()
    graph, _ = trace(fn, *inputs)
    templated = compile_graph(graph, mode="max-autotune", options={"mm_templates": "always", "cache": False})
    assert any("tl.dot" in k.source for k in templated.kernels)
    pointwise = compile_graph(graph, options={"cache": False})
    assert not any("tl.dot" in k.source for k in pointwise.kernels)
    ref = fn(*inputs)
    by_template = run_runtime(templated, inputs)
    by_pointwise = run_runtime(pointwise, inputs)
    assert_matches(by_template, ref, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert_matches(by_pointwise, ref, atol=1e-4, rtol=1e-4, equal_nan=True)
    for a, b in zip(by_template, by_pointwise, strict=True):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())


# ----------------------------------------------------------------------------- one decomposition table


def test_one_decomposition_table_with_explicit_overrides():
    from torchfuse.autograd.decompositions import DEFAULT_TABLE
    from torchfuse.inductor import decompositions as D

    # every rule autograd has is inductor's too, unless overridden or lowered directly, by name
    assert set(D.RULES).isdisjoint(DEFAULT_TABLE)
    assert set(D.OVERRIDES) <= set(DEFAULT_TABLE) and D.LOWERED_DIRECTLY <= set(DEFAULT_TABLE)
    for op, rule in DEFAULT_TABLE.items():
        if op in D.LOWERED_DIRECTLY:
            assert op not in D.DECOMPOSITIONS
        elif op not in D.OVERRIDES:
            assert D.DECOMPOSITIONS[op] is rule, op
    # gelu, silu, softmax and layer_norm are written once, in autograd
    for op in ("aten.gelu.default", "aten.silu.default", "aten._softmax.default",
               "aten.native_layer_norm.default"):
        assert D.DECOMPOSITIONS[op].__module__ == "torchfuse.autograd.decompositions"


@pytest.mark.usefixtures("cpu_backend")
def test_bools_add_and_multiply_as_eager():
    a, b = torch.tensor([True, True, False, False]), torch.tensor([True, False, True, False])
    fn = lambda a, b: (a + b, a * b, a + True)
    assert_matches(run_runtime(compile_fn(fn, a, b), [a, b]), fn(a, b))
