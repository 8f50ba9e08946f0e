"""The Triton matmul template: which graph matmuls it takes, and the kernel it writes for one.

`match_matmul` accepts ``aten.mm``, ``aten.addmm`` (``beta = alpha = 1``) and
``aten.bmm`` whose operands have static sizes, strides and offsets and a float16, bfloat16 or
float32 dtype; strides are free (``x @ w.t()`` reads ``w`` transposed in place).
`kernel_source` writes one ``@triton.jit`` function per matmul and epilogue:

* a tiled product over ``BLOCK_M x BLOCK_N`` output tiles with a float32 accumulator and
  ``tl.dot``, ``BLOCK_K`` at a time;
* program ids taken in groups of ``GROUP_M`` row tiles, so that consecutive programs reuse
  the same columns of ``b`` while they sit in L2;
* edges handled without masks in the K loop when the sizes allow it: ``EVEN_M``/``EVEN_N``/
  ``EVEN_K`` are constexprs decided per config; rows and columns past the edge read wrapped
  (valid) memory and are never stored;
* the epilogue (`.epilogue`, a loop-IR value) applied to the tile in float32, rendered
  by the same table as every kernel (`torchfuse.inductor.triton_ops`), extra inputs
  loaded with their own strides at the tile's indices, one cast to the output dtype, one
  masked store.

Strides are constexprs: shapes are static here, and Triton then knows which loads are
contiguous. `kernel_spec` packs source, arguments and grid for one launch config into
the user-kernel description of [`torchfuse.graph.user_kernels`][torchfuse.graph.user_kernels].
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torchfuse.graph import schema as S
from torchfuse.inductor import ir
from torchfuse.inductor.templates.epilogue import (
    TILE_DTYPES,
    Domain,
    Epilogue,
    Strides3,
    static_meta,
)
from torchfuse.inductor.triton_ops import TL_DTYPE, cast_text, const_text, helper_source, helpers_in, render


class MMKind(enum.Enum):
    """The matmul ops the template implements."""

    MM = enum.auto()
    ADDMM = enum.auto()
    BMM = enum.auto()


MATMULS: Mapping[str, MMKind] = {
    "aten.mm.default": MMKind.MM,
    "aten.addmm.default": MMKind.ADDMM,
    "aten.bmm.default": MMKind.BMM,
}
"""Graph op names the template replaces."""
BATCHED = frozenset({MMKind.BMM})
"""Matmuls over a leading batch dim (a second grid axis)."""
BIASED = frozenset({MMKind.ADDMM})
"""Matmuls whose first argument is added to the product."""

MAX_BATCH = 65535
"""Largest batch the grid's second axis takes on CUDA."""

_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


@dataclass(frozen=True, slots=True)
class MMConfig:
    """One launch configuration of the template."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def label(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"


DEFAULT_CONFIGS: tuple[MMConfig, ...] = (
    MMConfig(128, 128, 32, 8, 4, 3),
    MMConfig(128, 64, 32, 8, 4, 4),
    MMConfig(64, 128, 32, 8, 4, 4),
    MMConfig(128, 256, 64, 8, 8, 3),
    MMConfig(64, 64, 32, 8, 4, 4),
    MMConfig(256, 128, 64, 8, 8, 3),
    MMConfig(128, 128, 64, 8, 8, 3),
)
"""The candidates benchmarked per shape; the first is the one ``policy="always"`` takes."""


@dataclass(frozen=True, slots=True)
class MatmulOperands:
    """What `match_matmul` reads off a matmul node (the epilogue comes later)."""

    kind: MMKind
    a: str
    b: str
    bias: str | None
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    a_strides: Strides3
    """``a``'s strides over (batch, row, k)."""
    b_strides: Strides3
    """``b``'s strides over (batch, k, col)."""
    device: str

    @property
    def domain(self) -> Domain:
        return Domain(self.batch, self.m, self.n, self.kind in BATCHED)


@dataclass(frozen=True, slots=True)
class Matmul(MatmulOperands):
    """A matched matmul node and the epilogue it absorbs."""

    index: int
    """Position of the matmul node in ``graph.nodes``."""
    epilogue: Epilogue

    def describe(self) -> str:
        """``mm 33x40x17 f32 +add+relu`` (M x N x K), for log lines."""
        b = f"{self.batch}x" if self.kind in BATCHED else ""
        return " ".join(x for x in (self.kind.name.lower(), f"{b}{self.m}x{self.n}x{self.k}",
                                    _SHORT[self.dtype], self.epilogue.summary()) if x)

    def tensors(self) -> list[str]:
        """Graph values passed to the kernel, in order; the output buffer comes after them."""
        return [self.a, self.b, *(e.name for e in self.epilogue.extras)]


def _is_one(a: S.Argument | None) -> bool:
    return a is None or (isinstance(a, S.Int | S.Float) and not isinstance(a.value, str) and a.value == 1)


def match_matmul(graph: S.Graph, node: S.Node, device_ok: Callable[[str], bool]) -> MatmulOperands | None:
    """The operands of ``node`` when the template can compute it, else None."""
    kind = MATMULS.get(node.op)
    if kind is None or len(node.outputs) != 1:
        return None
    args = list(node.args)
    bias = None
    if kind in BIASED:
        if len(args) != 3 or set(node.kwargs) - {"beta", "alpha"}:
            return None
        if not (_is_one(node.kwargs.get("beta")) and _is_one(node.kwargs.get("alpha"))):
            return None
        first = args.pop(0)
        if not isinstance(first, S.TensorRef):
            return None
        bias = first.name
    elif len(args) != 2 or node.kwargs:
        return None
    if not all(isinstance(a, S.TensorRef) for a in args):
        return None
    a_name, b_name = (a.name for a in args)  # type: ignore[union-attr]
    metas = [graph.values.get(n) for n in (a_name, b_name, node.outputs[0])]
    if not all(static_meta(m) for m in metas):
        return None
    a, b, out = metas
    assert a is not None and b is not None and out is not None
    if out.requires_grad or not device_ok(out.device):
        return None
    if len({a.dtype, b.dtype, out.dtype}) != 1 or out.dtype not in TILE_DTYPES:
        return None
    if len({a.device, b.device, out.device}) != 1:
        return None
    rank = 3 if kind in BATCHED else 2
    if len(a.sizes) != rank or len(b.sizes) != rank:
        return None
    sa, sb = list(a.sizes), list(b.sizes)
    ta, tb = list(a.strides), list(b.strides)
    if rank == 2:
        sa, sb, ta, tb = [1, *sa], [1, *sb], [0, *ta], [0, *tb]
    batch, m, k = sa  # type: ignore[misc]
    if sb[0] != batch or sb[1] != k or min(batch, m, k, sb[2]) < 1 or batch > MAX_BATCH:
        return None
    return MatmulOperands(kind, a_name, b_name, bias, out.dtype, batch, m, sb[2], k,  # type: ignore[arg-type]
                          tuple(ta), tuple(tb), out.device)  # type: ignore[arg-type]


def with_epilogue(ops: MatmulOperands, index: int, epilogue: Epilogue) -> Matmul:
    """The `Matmul` of ``ops`` at ``graph.nodes[index]`` with ``epilogue``."""
    return Matmul(*(getattr(ops, f.name) for f in fields(MatmulOperands)), index=index, epilogue=epilogue)


def fit_configs(configs: Sequence[MMConfig], mm: Matmul) -> tuple[MMConfig, ...]:
    """``configs`` with blocks no larger than the problem needs (at least 16, ``tl.dot``'s
    minimum), duplicates dropped, order kept."""
    def fit(block: int, size: int) -> int:
        return max(16, min(block, 1 << max(0, (size - 1).bit_length())))

    out: dict[MMConfig, None] = {}
    for c in configs:
        out[MMConfig(fit(c.block_m, mm.m), fit(c.block_n, mm.n), fit(c.block_k, mm.k),
                     c.group_m, c.num_warps, c.num_stages)] = None
    return tuple(out)


# ----------------------------------------------------------------------------- epilogue rendering


def render_epilogue(value: ir.Value) -> tuple[list[str], str]:
    """The lines computing the epilogue ``value`` (``v<i> = …``, each value once) and the
    name of its result. The accumulator and the extras are float32 tiles already
    (``acc``, ``x<i>``): a conversion of one to float32 costs nothing."""
    lines: list[str] = []
    done: dict[ir.Value, tuple[str, str]] = {}

    def emit(text: str, dtype: str) -> tuple[str, str]:
        name = f"v{len(lines)}"
        lines.append(f"{name} = {text}")
        return name, dtype

    def go(v: ir.Value) -> tuple[str, str]:
        hit = done.get(v)
        if hit is not None:
            return hit
        if isinstance(v, ir.Load):
            out = (v.buffer, "float32")
        elif isinstance(v, ir.Const):
            out = (const_text(v.value, v.dtype), v.dtype)
        elif isinstance(v, ir.Cast):
            arg, dtype = go(v.arg)
            out = (arg, dtype) if dtype == v.dtype else emit(cast_text(arg, v.dtype), v.dtype)
        elif isinstance(v, ir.Call):
            out = emit(render(v.op, [go(a)[0] for a in v.args], v.dtype), v.dtype)
        else:
            raise AssertionError(f"an epilogue computes on the tile only, not {v!r}")
        done[v] = out
        return out

    return lines, go(value)[0]


def _offset(strides: Strides3, prefix: str, batched: bool) -> tuple[str, str | None]:
    """Address offset and mask of a tensor read at the tile's indices (broadcast dims left out)."""
    sb, sm, sn = strides
    terms = []
    if batched and sb:
        terms.append(f"pid_b * {prefix}_SB")
    if sm:
        terms.append(f"rm[:, None] * {prefix}_SM")
    if sn:
        terms.append(f"rn[None, :] * {prefix}_SN")
    mask = "mask" if sm and sn else "mask_m[:, None]" if sm else "mask_n[None, :]" if sn else None
    return " + ".join(terms) or "0", mask


# ----------------------------------------------------------------------------- the kernel


def _max_offset(sizes: Sequence[int], strides: Sequence[int], pad: int) -> int:
    return sum((s - 1 + pad) * abs(st) for s, st in zip(sizes, strides, strict=True))


def needs_int64(mm: Matmul) -> bool:
    """Whether some address offset may pass int32 (the pad covers a tile past each edge)."""
    pad = 256
    offsets = [
        _max_offset((mm.batch, mm.m, mm.k), mm.a_strides, pad),
        _max_offset((mm.batch, mm.k, mm.n), mm.b_strides, pad),
        _max_offset((mm.batch, mm.m, mm.n), mm.epilogue.out_strides, pad),
        *(_max_offset((mm.batch, mm.m, mm.n), e.strides, pad) for e in mm.epilogue.extras),
    ]
    return max(offsets) >= 2**31


def kernel_name(mm: Matmul) -> str:
    """``triton_tem_fused_mm_add_relu``: the matmul and (at most six of) its epilogue's
    computing ops (views and conversions left out)."""
    return "_".join(["triton_tem_fused", mm.kind.name.lower(), *mm.epilogue.ops[:6]])


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else False


def kernel_source(mm: Matmul, *, fp32_precision: str = "ieee", upcast_dot: bool = False) -> str:
    """The Triton module of ``mm`` and its epilogue (one source for every config).

    ``fp32_precision`` is ``tl.dot``'s ``input_precision`` for float32 operands: ``"ieee"``
    matches eager's default (no TF32), ``"tf32"`` when ``torch.backends.cuda.matmul.allow_tf32``.
    ``upcast_dot`` widens the tiles to float32 before ``tl.dot`` (exact for half operands:
    their products fit float32): Triton's interpreter gets ``tl.dot`` on bfloat16 wrong.
    """
    epi = mm.epilogue
    batched = mm.kind in BATCHED
    wide = needs_int64(mm)
    xs = [f"x{i}_ptr" for i in range(len(epi.extras))]
    params = ["a_ptr", "b_ptr", *xs, "out_ptr", "M", "N", "K"]
    consts = ["A_SB", "A_SM", "A_SK", "B_SB", "B_SK", "B_SN"]
    for i in range(len(epi.extras)):
        consts += [f"X{i}_SB", f"X{i}_SM", f"X{i}_SN"]
    consts += ["O_SB", "O_SM", "O_SN", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"]
    consts += ["EVEN_M", "EVEN_N", "EVEN_K"]
    signature = ",\n    ".join([", ".join(params), *(f"{c}: tl.constexpr" for c in consts)])
    if upcast_dot:
        dot = "tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision='ieee')"
    elif mm.dtype == "float32":
        dot = f"tl.dot(a, b, input_precision={fp32_precision!r})"
    else:
        dot = "tl.dot(a, b)"
    i64 = ".to(tl.int64)" if wide else ""
    lines = [
        "pid = tl.program_id(0)",
        *([f"pid_b = tl.program_id(1){i64}"] if batched else []),
        "grid_m = tl.cdiv(M, BLOCK_M)",
        "grid_n = tl.cdiv(N, BLOCK_N)",
        "# GROUP_M row tiles side by side: programs running together share columns of b in L2",
        "per_group = GROUP_M * grid_n",
        "first_m = (pid // per_group) * GROUP_M",
        "group_m = tl.minimum(grid_m - first_m, GROUP_M)",
        "pid_m = first_m + (pid % per_group) % group_m",
        "pid_n = (pid % per_group) // group_m",
        f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){i64}",
        f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){i64}",
        f"rk = tl.arange(0, BLOCK_K){i64}",
        "# rows and columns past the edge read wrapped (valid) memory and are never stored",
        "if EVEN_M:",
        "    am = rm",
        "else:",
        "    am = rm % M",
        "if EVEN_N:",
        "    bn = rn",
        "else:",
        "    bn = rn % N",
        f"a_ptrs = a_ptr + {'pid_b * A_SB + ' if batched else ''}am[:, None] * A_SM + rk[None, :] * A_SK",
        f"b_ptrs = b_ptr + {'pid_b * B_SB + ' if batched else ''}rk[:, None] * B_SK + bn[None, :] * B_SN",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for k in range(0, tl.cdiv(K, BLOCK_K)):",
        "    if EVEN_K:",
        "        a = tl.load(a_ptrs)",
        "        b = tl.load(b_ptrs)",
        "    else:",
        "        k_left = K - k * BLOCK_K",
        "        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)",
        "        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)",
        f"    acc += {dot}",
        "    a_ptrs += BLOCK_K * A_SK",
        "    b_ptrs += BLOCK_K * B_SK",
        "mask_m = rm < M",
        "mask_n = rn < N",
        "mask = mask_m[:, None] & mask_n[None, :]",
    ]
    for i in range(len(epi.extras)):
        offset, m = _offset(epi.extras[i].strides, f"X{i}", batched)
        masked = f", mask={m}, other=0.0" if m else ""
        lines.append(f"x{i} = tl.load(x{i}_ptr + {offset}{masked}).to(tl.float32)")
    steps, result = render_epilogue(epi.value)
    lines += steps
    offset, _ = _offset(epi.out_strides, "O", batched)
    lines.append(f"tl.store(out_ptr + {offset}, {result}.to({TL_DTYPE[epi.out_meta.dtype]}), mask=mask)")
    body = "\n".join(f"    {line}" for line in lines)
    helpers = "\n".join(helper_source(set().union(*map(helpers_in, steps))))
    return (f"import triton\nimport triton.language as tl\n{helpers}\n\n\n@triton.jit\n"
            f"def {kernel_name(mm)}(\n    {signature},\n):\n{body}\n")


def kernel_spec(mm: Matmul, source: str, config: MMConfig) -> dict[str, Any]:
    """The user-kernel description (`torchfuse.graph.user_kernels`) of one launch.

    Tensors are ``[*mm.tensors(), out]``: ``a``, ``b``, the extras, then the output buffer.
    """
    epi = mm.epilogue
    n_in = 2 + len(epi.extras)
    args: list[dict[str, Any]] = [{"name": "a_ptr", "tensor": 0}, {"name": "b_ptr", "tensor": 1}]
    args += [{"name": f"x{i}_ptr", "tensor": 2 + i} for i in range(len(epi.extras))]
    args += [{"name": "out_ptr", "tensor": n_in}]
    args += [{"name": "M", "value": mm.m}, {"name": "N", "value": mm.n}, {"name": "K", "value": mm.k}]
    consts: list[tuple[str, int | bool]] = [*zip(("A_SB", "A_SM", "A_SK"), mm.a_strides, strict=True),
                                     *zip(("B_SB", "B_SK", "B_SN"), mm.b_strides, strict=True)]
    for i, e in enumerate(epi.extras):
        consts += zip((f"X{i}_SB", f"X{i}_SM", f"X{i}_SN"), e.strides, strict=True)
    consts += zip(("O_SB", "O_SM", "O_SN"), epi.out_strides, strict=True)
    consts += [("BLOCK_M", config.block_m), ("BLOCK_N", config.block_n), ("BLOCK_K", config.block_k),
               ("GROUP_M", config.group_m), ("EVEN_M", mm.m % config.block_m == 0),
               ("EVEN_N", mm.n % config.block_n == 0), ("EVEN_K", mm.k % config.block_k == 0)]
    args += [{"name": name, "constexpr": value} for name, value in consts]
    grid = [math.ceil(mm.m / config.block_m) * math.ceil(mm.n / config.block_n)]
    if mm.kind in BATCHED:
        grid.append(mm.batch)
    return {"source": source, "entry": kernel_name(mm), "args": args, "grid": grid,
            "num_warps": config.num_warps, "num_stages": config.num_stages}


__all__ = [
    "BATCHED", "BIASED", "DEFAULT_CONFIGS", "MATMULS", "MMConfig", "MMKind", "Matmul",
    "MatmulOperands", "fit_configs", "interpreting", "kernel_name", "kernel_source", "kernel_spec",
    "match_matmul", "needs_int64", "render_epilogue", "with_epilogue",
]
