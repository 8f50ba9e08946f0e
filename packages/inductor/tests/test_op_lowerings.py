"""Every lowering against eager PyTorch, from a table of op records (fp32 and bf16)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from inductor_helpers import BF16_TOL, assert_matches, compile_fn, run_runtime
from torchfuse.graph import schema as S

pytestmark = pytest.mark.usefixtures("cpu_backend")
"""Every test here runs on both CPU code generators (Triton interpreted, C++/OpenMP)."""


@dataclass(frozen=True)
class OpCase:
    name: str
    fn: Callable
    inputs: Callable[[], tuple]
    tol: dict = field(default_factory=lambda: {"atol": 1e-5, "rtol": 1.3e-6})
    extern_ok: bool = False
    """True when the op is meant to be an ATen call (matmuls) rather than a kernel."""
    options: dict | None = None


def f32(*shape):
    return lambda: torch.randn(*shape)


def two(*shape, dtype=torch.float32):
    return lambda: (torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype))


def pos(*shape):
    return lambda: (torch.rand(*shape) + 0.1,)


def ints(*shape, hi=7):
    return lambda: (torch.randint(-hi, hi, shape), torch.randint(1, hi, shape))


LOOPED = {"persistent_rnumel_max": 8, "looped_rblock": 8}
SPLIT = {"split_min_rnumel": 64, "split_target": 8}
OUTER_SPLIT = {"outer_split_programs": 8, "outer_split_min_chunk": 4}

CASES = [
    # unary
    *[
        OpCase(n, fn, lambda: (torch.randn(3, 5),))
        for n, fn in [
            ("neg", torch.neg),
            ("abs", torch.abs),
            ("exp", torch.exp),
            ("sin", torch.sin),
            ("cos", torch.cos),
            ("tanh", torch.tanh),
            ("sigmoid", torch.sigmoid),
            ("erf", torch.erf),
            ("relu", torch.relu),
            ("floor", torch.floor),
            ("ceil", torch.ceil),
            ("round", torch.round),
            ("trunc", torch.trunc),
            ("sign", torch.sign),
            ("expm1", torch.expm1),
            ("exp2", torch.exp2),
            ("reciprocal", torch.reciprocal),
            ("silu", F.silu),
            ("gelu", F.gelu),
            ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
            ("hardswish", F.hardswish),
            ("leaky_relu", F.leaky_relu),
            ("softplus", F.softplus),
            ("isnan", torch.isnan),
            ("tan", lambda x: torch.tan(x * 0.5)),
        ]
    ],
    *[
        OpCase(n, fn, pos(3, 5))
        for n, fn in [
            ("log", torch.log),
            ("log2", torch.log2),
            ("log1p", torch.log1p),
            ("sqrt", torch.sqrt),
            ("rsqrt", torch.rsqrt),
            ("pow_float", lambda x: x**1.7),
            ("pow_tensor", lambda x: x ** (x + 0.5)),
        ]
    ],
    # binary, broadcasting, scalars, promotion
    OpCase("add", lambda x, y: x + y, two(3, 5)),
    OpCase("add_alpha", lambda x, y: torch.add(x, y, alpha=2.5), two(3, 5)),
    OpCase("sub_bcast", lambda x, y: x - y[0], two(3, 5)),
    OpCase("mul_scalar", lambda x: x * 3 - 1.5, lambda: (torch.randn(4, 3),)),
    OpCase("div", lambda x, y: x / (y.abs() + 1), two(3, 5)),
    OpCase("rsub", lambda x: 2.0 - x, lambda: (torch.randn(6),)),
    OpCase("maximum", torch.maximum, two(2, 3, 4)),
    OpCase("minimum", torch.minimum, two(2, 3, 4)),
    OpCase("pow2", lambda x: x.pow(2) + x.pow(3), lambda: (torch.randn(5),)),
    OpCase("bcast_outer", lambda x, y: x[:, None] * y[None, :], lambda: (torch.randn(4), torch.randn(6))),
    OpCase("int_add", lambda a, b: a + b * 3, ints(4, 5)),
    OpCase("int_floordiv", lambda a, b: a // b, ints(4, 5)),
    OpCase("int_remainder", lambda a, b: a % b, ints(4, 5)),
    OpCase("int_truediv", lambda a, b: a / b, ints(4, 5)),
    OpCase("div_floor", lambda x, y: torch.div(x, y.abs() + 0.5, rounding_mode="floor"), two(3, 4)),
    OpCase("div_trunc", lambda x, y: torch.div(x, y.abs() + 0.5, rounding_mode="trunc"), two(3, 4)),
    OpCase("float_remainder", lambda x, y: torch.remainder(x, y.abs() + 0.5), two(3, 4)),
    OpCase("int_float_promote", lambda a, x: a * x, lambda: (torch.randint(0, 5, (3, 4)), torch.randn(3, 4))),
    OpCase("zero_dim", lambda x, s: x * s + s, lambda: (torch.randn(3, 4), torch.tensor(2.5))),
    # comparisons, logical, where, clamp, casts
    *[
        OpCase(n, fn, two(3, 5))
        for n, fn in [
            ("eq", torch.eq),
            ("ne", torch.ne),
            ("lt", torch.lt),
            ("le", torch.le),
            ("gt", torch.gt),
            ("ge", torch.ge),
            ("logical_and", lambda x, y: torch.logical_and(x > 0, y > 0)),
            ("logical_or", lambda x, y: (x > 0) | (y > 0)),
            ("logical_not", lambda x, y: ~(x > y)),
            ("where", lambda x, y: torch.where(x > y, x, y * 2)),
            ("where_scalar", lambda x, y: torch.where(x > 0, x, 0.0)),
            ("masked_fill", lambda x, y: x.masked_fill(y > 0, -1.0)),
            ("clamp", lambda x, y: x.clamp(-0.5, 0.5)),
            ("clamp_min", lambda x, y: x.clamp_min(0.1)),
            ("clamp_tensor", lambda x, y: torch.clamp(x, min=y)),
            ("cast_int", lambda x, y: (x * 10).to(torch.int32)),
            ("cast_f64", lambda x, y: x.double() + y.double()),
            ("lerp", lambda x, y: torch.lerp(x, y, 0.3)),
            ("addcmul", lambda x, y: torch.addcmul(x, x, y, value=0.5)),
        ]
    ],
    # factories
    OpCase("full_like", lambda x: x + torch.full_like(x, 3.0) + torch.ones_like(x), f32(3, 4)),
    OpCase("arange", lambda x: x + torch.arange(4, dtype=torch.float32), lambda: (torch.randn(3, 4),)),
    OpCase("arange_int", lambda x: x * torch.arange(1, 9, 2), lambda: (torch.randint(0, 4, (2, 4)),)),
    # reductions
    *[
        OpCase(n, fn, lambda: (torch.randn(4, 6),))
        for n, fn in [
            ("sum_dim", lambda x: x.sum(1)),
            ("sum_dim0", lambda x: x.sum(0)),
            ("sum_all", lambda x: x.sum()),
            ("sum_keepdim", lambda x: x.sum(-1, keepdim=True)),
            ("mean", lambda x: x.mean(0)),
            ("mean_all", lambda x: x.mean()),
            ("amax", lambda x: x.amax(1)),
            ("amin", lambda x: x.amin(0)),
            ("max_dim", lambda x: x.max(1)),
            ("min_dim", lambda x: x.min(0, keepdim=True)),
            ("argmax", lambda x: x.argmax(1)),
            ("argmin", lambda x: x.argmin(0)),
            ("argmax_all", lambda x: x.argmax()),
            ("prod", lambda x: (x * 0.5 + 1).prod(1)),
            ("any", lambda x: (x > 1).any(1)),
            ("all", lambda x: (x > -1).all(0)),
            ("var", lambda x: x.var(1)),
            ("std", lambda x: x.std(0, correction=0)),
            ("var_mean", lambda x: torch.var_mean(x, 1)),
            ("logsumexp", lambda x: x.logsumexp(1)),
            ("sum_int", lambda x: (x > 0).sum(1)),
            ("softmax", lambda x: x.softmax(-1)),
            ("log_softmax", lambda x: x.log_softmax(0)),
            ("layer_norm", lambda x: F.layer_norm(x, (6,))),
            ("rms_norm", lambda x: F.rms_norm(x, (6,), eps=1e-6)),
        ]
    ],
    OpCase("sum_3d_mid", lambda x: x.sum(1), f32(2, 3, 4)),
    OpCase("sum_3d_two", lambda x: x.sum((0, 2)), f32(2, 3, 4)),
    OpCase("looped_sum", lambda x: x.sum(1), f32(3, 20), options=LOOPED),
    OpCase("looped_argmax", lambda x: (x.argmax(1), x.argmin(1)), f32(3, 20), options=LOOPED),
    OpCase(
        "looped_prod_any", lambda x: ((x * 0.1 + 1).prod(1), (x > 1.5).any(1)), f32(3, 20), options=LOOPED
    ),
    OpCase("looped_softmax", lambda x: x.softmax(-1), f32(3, 20), options=LOOPED),
    OpCase("looped_layer_norm", lambda x: F.layer_norm(x, (20,)), f32(3, 20), options=LOOPED),
    OpCase(
        "looped_softmax_neg_inf",
        lambda x: x.masked_fill(x > 0.8, float("-inf")).softmax(-1),
        f32(3, 20),
        options=LOOPED,
    ),
    OpCase(
        "looped_logsumexp_neg_inf",
        lambda x: x.masked_fill(x < -0.3, float("-inf")).logsumexp(1),
        f32(4, 20),
        options=LOOPED,
    ),
    OpCase("outer_split_sum", lambda x: x.sum(0), f32(64, 16), options=OUTER_SPLIT),
    OpCase("outer_split_sum_3d", lambda x: (x * 2).sum((0, 1)), f32(4, 16, 8), options=OUTER_SPLIT),
    OpCase(
        "outer_split_weight_grads",
        lambda g, x: ((g * (x - x.mean(1, keepdim=True))).sum(0), g.sum(0), g * x),
        two(64, 8),
        {"atol": 1e-4, "rtol": 1e-5},
        options=OUTER_SPLIT,
    ),
    OpCase("cat_three_parts", lambda x: torch.cat([x[:, 2:] * 2, -x, x[:, :2]], 1) + 1, f32(3, 5)),
    OpCase(
        "rotate_half",
        lambda x, c, s: x * c + torch.cat((-x[..., 4:], x[..., :4]), -1) * s,
        lambda: (torch.randn(2, 3, 5, 8), torch.randn(5, 8), torch.randn(5, 8)),
    ),
    OpCase("split_sum", lambda x: x.sum(), f32(16, 16), options=SPLIT),
    OpCase("split_amax_rows", lambda x: x.amax(1), f32(2, 128), options=SPLIT),
    OpCase(
        "cross_entropy",
        lambda x, t: F.cross_entropy(x, t),
        lambda: (torch.randn(4, 7), torch.randint(0, 7, (4,))),
    ),
    OpCase(
        "cross_entropy_looped",
        lambda x, t: F.cross_entropy(x, t, reduction="sum"),
        lambda: (torch.randn(4, 21), torch.randint(0, 21, (4,))),
        options=LOOPED,
    ),
    OpCase(
        "nll_ignore",
        lambda x, t: F.nll_loss(x.log_softmax(1), t, ignore_index=1),
        lambda: (torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])),
    ),
    OpCase(
        "layer_norm_affine",
        lambda x, w, b: F.layer_norm(x, (6,), w, b),
        lambda: (torch.randn(4, 6), torch.randn(6), torch.randn(6)),
    ),
    # views: never copies
    *[
        OpCase(n, fn, lambda: (torch.randn(4, 6),))
        for n, fn in [
            ("t_add", lambda x: x.t() + 1),
            ("permute", lambda x: x.view(2, 2, 6).permute(2, 0, 1) * 2),
            ("slice", lambda x: x[1:3, ::2] + 1),
            ("select", lambda x: x[2] * x[:, 1].sum()),
            ("expand", lambda x: x[:, :1].expand(4, 6) + x),
            ("unsqueeze", lambda x: x.unsqueeze(0).squeeze(0).unsqueeze(2) + 1),
            ("reshape_lazy", lambda x: (x + 1).reshape(3, 8) * 2),
            ("reshape_t", lambda x: (x.t() + 1).reshape(24)),
            ("view_output", lambda x: x.view(6, 4)),
            ("t_output", lambda x: x.t()),
            ("split", lambda x: tuple(t * 2 for t in x.split(2, 1))),
            ("chunk", lambda x: x.chunk(2)[1] + x.chunk(2)[0]),
            ("unbind", lambda x: x.unbind(0)[3] - x.unbind(0)[0]),
            ("cat", lambda x: torch.cat([x, x * 2, x[:, :1]], 1)),
            ("cat0", lambda x: torch.cat([x[:1], x + 1], 0) - 1),
            ("stack", lambda x: torch.stack([x, x.exp()], 1)),
            ("pad", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5)),
            ("clone", lambda x: x.clone()),
            ("lazy_t_output", lambda x: (x + 1).t()),
            # writes into slices (what ``t[a:b] = v`` functionalizes to), roll, fill
            ("slice_scatter", lambda x: torch.slice_scatter(x, x[:, 1:4] * 2, 1, 1, 4) + 1),
            ("slice_scatter_neg", lambda x: torch.slice_scatter(x, x[:, -3:-1].exp(), 1, -3, -1)),
            ("slice_scatter_step", lambda x: torch.slice_scatter(x, x[::2] * 3, 0, 0, None, 2)),
            ("slice_scatter_nested", lambda x: torch.slice_scatter(
                x, torch.slice_scatter(x[1:3], torch.fill(x[1:3, 2:5], 7.0), 1, 2, 5), 0, 1, 3)),
            ("roll", lambda x: torch.roll(x + 1, (1, -2), (0, 1)) * 2),
            ("roll_one_dim_twice", lambda x: torch.roll(x, (3, 5), (1, 1))),
            ("roll_output", lambda x: torch.roll(x, -9, 0)),
            ("select_scatter", lambda x: torch.select_scatter(x, x[:, 2] * 5, 1, 2) - 1),
            ("select_scatter_neg", lambda x: torch.select_scatter(x, x[0].exp(), 0, -1)),
            # the gradients of slices and selects: zeros with the gradient in place
            ("slice_backward", lambda x: torch.ops.aten.slice_backward(x[:, :3] * 2, [4, 6], 1, 1, 4, 1) + 1),
            ("slice_backward_step", lambda x: torch.ops.aten.slice_backward(x[:2], [4, 6], 0, 1, 2**63 - 1, 2)),
            ("select_backward", lambda x: torch.ops.aten.select_backward(x[:, 0].exp(), [4, 6], 1, -2)),
            ("fill", lambda x: torch.fill(x, 2.5) + x),
            ("fill_tensor", lambda x: torch.fill(x, x[1, 2]) - x),
        ]
    ],
    # indexing
    OpCase("gather", lambda x, i: x.gather(1, i), lambda: (torch.randn(4, 6), torch.randint(0, 6, (4, 3)))),
    OpCase(
        "index_select",
        lambda x, i: x.index_select(1, i) + 1,
        lambda: (torch.randn(4, 6), torch.randint(0, 6, (5,))),
    ),
    OpCase(
        "embedding",
        lambda w, i: F.embedding(i, w) * 2,
        lambda: (torch.randn(10, 4), torch.randint(0, 10, (2, 3))),
    ),
    OpCase("index_tensor", lambda x, i: x[i], lambda: (torch.randn(6, 4), torch.randint(-6, 6, (3,)))),
    OpCase(
        "index_2d",
        lambda x, i, j: x[i, j],
        lambda: (torch.randn(6, 4), torch.randint(0, 6, (5,)), torch.randint(0, 4, (5,))),
    ),
    OpCase("index_mid", lambda x, i: x[:, i], lambda: (torch.randn(3, 6, 2), torch.randint(0, 6, (2, 2)))),
    # matmuls: cuBLAS through an extern call, epilogues fused
    OpCase("mm", lambda a, b: a @ b, lambda: (torch.randn(3, 4), torch.randn(4, 5)), extern_ok=True),
    OpCase(
        "linear",
        lambda x, w, b: F.linear(x, w, b).relu(),
        lambda: (torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)),
        extern_ok=True,
    ),
    OpCase(
        "bmm",
        lambda a, b: torch.bmm(a, b) * 2,
        lambda: (torch.randn(2, 3, 4), torch.randn(2, 4, 5)),
        extern_ok=True,
    ),
    OpCase(
        "addmm",
        lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
        lambda: (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5)),
        extern_ok=True,
    ),
]

BF16_CASES = [
    OpCase("bf16_add_mul", lambda x, y: (x + y) * 2, two(3, 8, dtype=torch.bfloat16), BF16_TOL),
    OpCase(
        "bf16_gelu_bias",
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        lambda: (torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16)),
        BF16_TOL,
    ),
    OpCase(
        "bf16_softmax", lambda x: x.softmax(-1), lambda: (torch.randn(4, 16, dtype=torch.bfloat16),), BF16_TOL
    ),
    OpCase(
        "bf16_layer_norm",
        lambda x, w, b: F.layer_norm(x, (16,), w, b),
        lambda: (
            torch.randn(4, 16, dtype=torch.bfloat16),
            torch.randn(16, dtype=torch.bfloat16),
            torch.randn(16, dtype=torch.bfloat16),
        ),
        BF16_TOL,
    ),
    OpCase(
        "bf16_sum_to_f32",
        lambda x: x.float().sum(1),
        lambda: (torch.randn(4, 16, dtype=torch.bfloat16),),
        BF16_TOL,
    ),
    OpCase("bf16_mean", lambda x: x.mean(1), lambda: (torch.randn(4, 16, dtype=torch.bfloat16),), BF16_TOL),
    OpCase(
        "bf16_cross_entropy",
        lambda x, t: F.cross_entropy(x.float(), t),
        lambda: (torch.randn(4, 16, dtype=torch.bfloat16), torch.randint(0, 16, (4,))),
        BF16_TOL,
    ),
    OpCase(
        "f16_silu",
        lambda x: F.silu(x) * x,
        lambda: (torch.randn(4, 8, dtype=torch.float16),),
        {"atol": 2e-3, "rtol": 2e-3},
    ),
]


def _inputs(case: OpCase) -> tuple:
    torch.manual_seed(0)
    made = case.inputs()
    return made if isinstance(made, tuple) else (made,)


@pytest.mark.parametrize("case", CASES + BF16_CASES, ids=lambda c: c.name)
def test_lowering_matches_eager(case: OpCase):
    inputs = _inputs(case)
    program = compile_fn(case.fn, *inputs, options=case.options)
    out = run_runtime(program, inputs)
    assert_matches(out, case.fn(*inputs), **case.tol)
    externs = [s.op for s in program.steps if isinstance(s, S.ExternStep)]
    if case.extern_ok:
        assert externs and all(op.split(".")[1] in ("mm", "bmm") for op in externs)
    else:
        assert not externs, f"unexpected fallback: {program.meta['fallbacks']}"
    assert program.meta["fallbacks"] == ""


def test_views_do_not_copy():
    x = torch.randn(4, 6)
    program = compile_fn(lambda x: x.t()[1:3], x)
    assert not program.kernels
    assert any(isinstance(s, S.ViewStep) for s in program.steps)
    out = run_runtime(program, [x])
    assert out[0].data_ptr() != 0 and out[0].stride() == x.t()[1:3].stride()


def test_unknown_op_becomes_extern_and_is_reported():
    x = torch.randn(4, 6)
    fn = lambda x: torch.cumsum(x, 1) + 1
    program = compile_fn(fn, x)
    assert "cumsum" in program.meta["fallbacks"]
    assert any(isinstance(s, S.ExternStep) and "cumsum" in s.op for s in program.steps)
    assert_matches(run_runtime(program, [x]), fn(x))


def test_scatter_one_index_per_row():
    x, i, s = torch.randn(4, 6), torch.randint(0, 6, (4, 1)), torch.randn(4, 1)
    for fn in (lambda x, i, s: x.scatter(1, i, s) * 2, lambda x, i, s: x.scatter(1, i, -1.0)):
        program = compile_fn(fn, x, i, s)
        assert program.meta["fallbacks"] == ""
        assert_matches(run_runtime(program, [x, i, s]), fn(x, i, s))


@pytest.mark.parametrize("options", [None, LOOPED], ids=["persistent", "looped"])
def test_max_min_propagate_nan_like_eager(options):
    x = torch.randn(4, 20)
    x[1, 3] = float("nan")
    fn = lambda x: (x.amax(1), x.amin(1), x.softmax(1))
    program = compile_fn(fn, x, options=options)
    for a, b in zip(run_runtime(program, [x]), fn(x), strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("rblock", [8, 16])
def test_looped_online_logsumexp_edge_rows(rblock):
    """The chunked online logsumexp: a row of -inf only, a row whose first chunks are -inf,
    a row with a NaN, a row with +inf, a ragged last chunk (20 is no multiple of 8 or 16)."""
    x = torch.randn(6, 20) * 30
    x[0] = float("-inf")
    x[1, :17] = float("-inf")
    x[2, 11] = float("nan")
    x[3, 4] = float("inf")
    fn = lambda x: (x.logsumexp(1), x.softmax(1), x.log_softmax(1), x.amax(1))
    opts = {"persistent_rnumel_max": 8, "looped_rblock": rblock}
    program = compile_fn(fn, x, options=opts)
    assert any("red" in k.name for k in program.kernels)
    for a, b in zip(run_runtime(program, [x]), fn(x), strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
