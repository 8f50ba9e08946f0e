"""The benchmark workloads: every row of the table in ``BENCHMARKS.md`` as a record.

A :class:`Workload` names a function and an input factory. ``make_case(device, dtype, scale)``
returns a :class:`Case`: the callable to compile, its inputs, and (for training rows) the
tensors to differentiate with respect to. ``scale`` is ``"full"`` (the shapes of the published
table) or ``"small"`` (tiny shapes, so a CPU smoke run finishes in seconds).

Training rows time forward and backward together: ``loss(fn(*inputs))`` followed by
``torch.autograd.grad(loss, grad_wrt)``. ``autograd.grad`` rather than ``.backward()`` so that
repeated timing calls do not add a gradient-accumulation kernel to every step.
"""

from __future__ import annotations

import enum
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

Scale = Literal["full", "small"]


class Bound(enum.Enum):
    """What limits a workload's speed, which decides how its throughput is reported."""

    MEMORY = "memory-bound"  # GB/s against the device-to-device copy bandwidth
    MATMUL = "matmul-bound"  # TFLOP/s
    LAUNCH = "launch-bound"  # only the time matters
    MODEL = "model"  # a whole network: only the time matters


@dataclass(frozen=True, slots=True)
class Reference:
    """The torch.compile numbers from ``BENCHMARKS.md`` (H200, torch 2.11, triton 3.6)."""

    eager_ms: float
    compiled_ms: float
    compile_s: float
    gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Case:
    """One ready-to-run instance of a workload.

    ``fn(*inputs)`` is what gets compiled. For training rows ``grad_wrt`` lists the tensors the
    gradients are taken with respect to (inputs and/or parameters).
    """

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    grad_wrt: tuple[torch.Tensor, ...] = ()


InputFactory = Callable[[torch.device, torch.dtype, Scale], tuple[Any, ...]]


def sum_loss(out: Any) -> torch.Tensor:
    """The default training loss: the float sum of every tensor output."""
    outs = out if isinstance(out, tuple | list) else (out,)
    return sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor))


@dataclass(frozen=True, slots=True)
class Workload:
    """One row of the benchmark table.

    ``fn`` is the function compiled for plain workloads; model workloads leave it ``None`` and
    give ``build`` instead, which makes the callable (a closure over a module) together with
    its inputs (their ``make_inputs`` is unused). ``flops`` (matmul-bound rows) maps the inputs
    to the useful floating-point work of one step (training rows count forward + backward as 3x
    forward).
    """

    name: str
    description: str
    shapes: str
    dtype: torch.dtype
    bound: Bound
    training: bool
    make_inputs: InputFactory
    fn: Callable[..., Any] | None = None
    build: Callable[[torch.device, torch.dtype, Scale], Case] | None = None
    grad_argnums: tuple[int, ...] = ()
    loss: Callable[[Any], torch.Tensor] = sum_loss
    flops: Callable[[Sequence[Any]], float] | None = None
    reference: Reference | None = None
    requires: tuple[str, ...] = ()
    # assert_close tolerances for outputs (and gradients) against eager.
    rtol: float | None = None
    atol: float | None = None

    def available(self) -> bool:
        """Whether every module this workload needs is importable."""
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def make_case(self, device: torch.device | str, dtype: torch.dtype | None = None,
                  scale: Scale = "full") -> Case:
        """Build the callable and fresh inputs (requiring grad for training rows)."""
        device = torch.device(device)
        dtype = dtype or self.dtype
        if self.build is not None:
            return self.build(device, dtype, scale)
        assert self.fn is not None, f"workload {self.name} has neither fn nor build"
        inputs = self.make_inputs(device, dtype, scale)
        grad_wrt: tuple[torch.Tensor, ...] = ()
        if self.training:
            inputs = tuple(t.requires_grad_(True) if i in self.grad_argnums else t
                           for i, t in enumerate(inputs))
            grad_wrt = tuple(inputs[i] for i in self.grad_argnums)
        return Case(self.fn, inputs, grad_wrt)

    def tolerances(self) -> dict[str, float]:
        """``rtol``/``atol`` for comparing with eager: explicit, else by dtype."""
        if self.rtol is not None and self.atol is not None:
            return {"rtol": self.rtol, "atol": self.atol}
        if self.dtype in (torch.bfloat16, torch.float16):
            return {"rtol": 2e-2, "atol": 2e-2}
        return {"rtol": 1e-3, "atol": 1e-3}


# ----------------------------------------------------------------------------- functions


def seed_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x + y
    b = a * 2.0
    c = torch.relu(b)
    e = F.silu(c)
    d = e.sum(dim=1)
    return d.mean()


def gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b, approximate="tanh")


def softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return normed.to(x.dtype) * w


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                   b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, eps=1e-5)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def swiglu_mlp(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ wg) * (x @ wu)) @ wd


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def transpose_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # the output takes x.t()'s strides (eager's rule for mixed layouts), so y is read across
    # its rows: one side of every pointwise kernel here is transposed
    return x.t() + y * 2


def small_ops(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    for _ in range(10):
        x, y = torch.sin(x) * y + 0.5, torch.cos(y) - x * 0.1
    return x, y


# ----------------------------------------------------------------------------- inputs


def _randn(*sizes: int, device: torch.device, dtype: torch.dtype, gen: torch.Generator,
           std: float = 1.0) -> torch.Tensor:
    # Drawn on the device itself (the full-size inputs are up to 1 GB; a CPU generator would
    # take seconds) from a seeded generator, so every variant sees the same values.
    return (torch.randn(*sizes, generator=gen, device=device) * std).to(dtype)


def _gen(device: torch.device, seed: int = 0) -> torch.Generator:
    return torch.Generator(device).manual_seed(seed)


def _pick(scale: Scale, full: Any, small: Any) -> Any:
    return full if scale == "full" else small


def seed_inputs(n_full: int) -> InputFactory:
    def make(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
        n = _pick(scale, n_full, 32)
        g = _gen(device)
        return (_randn(n, n, device=device, dtype=dtype, gen=g),
                _randn(n, n, device=device, dtype=dtype, gen=g))

    return make


def _rows_cols(scale: Scale) -> tuple[int, int]:
    return _pick(scale, (16384, 4096), (16, 64))


def gelu_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, n = _rows_cols(scale)
    g = _gen(device)
    return _randn(m, n, device=device, dtype=dtype, gen=g), _randn(n, device=device, dtype=dtype, gen=g)


def rows_input(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, n = _rows_cols(scale)
    return (_randn(m, n, device=device, dtype=dtype, gen=_gen(device)),)


def norm_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, n = _rows_cols(scale)
    g = _gen(device)
    x = _randn(m, n, device=device, dtype=dtype, gen=g)
    w = (1.0 + _randn(n, device=device, dtype=torch.float32, gen=g, std=0.1)).to(dtype)
    b = _randn(n, device=device, dtype=dtype, gen=g, std=0.1)
    return x, w, b


def rmsnorm_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    x, w, _ = norm_inputs(device, dtype, scale)
    return x, w


def add_norm_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    x, w, b = norm_inputs(device, dtype, scale)
    r = _randn(*x.shape, device=device, dtype=dtype, gen=_gen(device, seed=1))
    return x, r, w, b


def ce_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, v = _pick(scale, (8192, 32000), (16, 100))
    g = _gen(device)
    logits = _randn(m, v, device=device, dtype=dtype, gen=g)
    target = torch.randint(0, v, (m,), generator=g, device=device)
    return logits, target


def rope_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    b, h, s, d = _pick(scale, (8, 32, 2048, 128), (2, 2, 8, 16))
    g = _gen(device)
    x = _randn(b, h, s, d, device=device, dtype=dtype, gen=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return x, angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def swiglu_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, d, f = _pick(scale, (4096, 4096, 11008), (16, 32, 48))
    g = _gen(device)
    # Scaled so activations stay O(1) and bf16 comparisons are meaningful.
    return (_randn(m, d, device=device, dtype=dtype, gen=g),
            _randn(d, f, device=device, dtype=dtype, gen=g, std=d ** -0.5),
            _randn(d, f, device=device, dtype=dtype, gen=g, std=d ** -0.5),
            _randn(f, d, device=device, dtype=dtype, gen=g, std=f ** -0.5))


def attention_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    b, h, s, d = _pick(scale, (4, 16, 1024, 64), (1, 2, 16, 8))
    g = _gen(device)
    return tuple(_randn(b, h, s, d, device=device, dtype=dtype, gen=g) for _ in range(3))


def transpose_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    m, n = _pick(scale, (8192, 8192), (48, 80))  # small: not square, so a mixed-up axis fails
    g = _gen(device)
    return _randn(m, n, device=device, dtype=dtype, gen=g), _randn(n, m, device=device, dtype=dtype, gen=g)


def small_ops_inputs(device: torch.device, dtype: torch.dtype, scale: Scale) -> tuple[torch.Tensor, ...]:
    n = _pick(scale, 64, 8)
    g = _gen(device)
    return _randn(n, n, device=device, dtype=dtype, gen=g), _randn(n, n, device=device, dtype=dtype, gen=g)


def swiglu_flops(inputs: Sequence[Any]) -> float:
    x, wg, _, wd = inputs[:4]
    m, d = x.shape
    f = wg.shape[1]
    return 2.0 * m * d * f * 2 + 2.0 * m * f * wd.shape[1]


def attention_flops(inputs: Sequence[Any]) -> float:
    q = inputs[0]
    b, h, s, d = q.shape
    return 2.0 * b * h * s * s * d * 2  # q @ kᵀ and p @ v (the causal half is not skipped)


def _training_flops(forward: Callable[[Sequence[Any]], float]) -> Callable[[Sequence[Any]], float]:
    return lambda inputs: 3.0 * forward(inputs)


# ----------------------------------------------------------------------------- GPT-2


def _gpt2_model(device: torch.device, scale: Scale) -> torch.nn.Module:
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # vision_models.py beside this file, however this one was imported
        sys.path.insert(0, here)
    from vision_models import ensure_importable

    ensure_importable()  # PyPI's torchvision next to a CPU torch, before transformers imports it
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, heads = _pick(scale, (4, 768, 12), (1, 64, 2))
    # Dropout off: training outputs then depend only on the inputs, so torchfuse and
    # torch.compile can be checked against eager.
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).to(device)


def _gpt2_ids(device: torch.device, scale: Scale, vocab: int) -> torch.Tensor:
    batch, tokens = _pick(scale, (8, 512), (2, 16))
    return torch.randint(0, vocab, (batch, tokens), generator=_gen(device), device=device)


def gpt2_inference(device: torch.device, dtype: torch.dtype, scale: Scale) -> Case:
    model = _gpt2_model(device, scale).eval()
    ids = _gpt2_ids(device, scale, model.config.vocab_size)

    def gpt2_forward(input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            return model(input_ids).logits

    return Case(gpt2_forward, (ids,))


def gpt2_training(device: torch.device, dtype: torch.dtype, scale: Scale) -> Case:
    model = _gpt2_model(device, scale).train()
    ids = _gpt2_ids(device, scale, model.config.vocab_size)

    def gpt2_loss(input_ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype):
            return model(input_ids, labels=input_ids).loss

    params = tuple(p for p in model.parameters() if p.requires_grad)
    return Case(gpt2_loss, (ids,), params)


def _identity_loss(out: Any) -> torch.Tensor:
    return out.float()


# ----------------------------------------------------------------------------- the table

_NORM = "16384×4096 bf16"
BF16 = torch.bfloat16
FP32 = torch.float32

WORKLOADS: tuple[Workload, ...] = (
    Workload("seed_fn_1k", "relu((x+y)*2) → silu → sum(dim=1) → mean", "1000×1000 fp32 ×2", FP32,
             Bound.MEMORY, False, seed_inputs(1000), seed_fn, reference=Reference(0.053, 0.066, 3.6, 122)),
    Workload("seed_fn_8k", "relu((x+y)*2) → silu → sum(dim=1) → mean", "8192×8192 fp32 ×2", FP32,
             Bound.MEMORY, False, seed_inputs(8192), seed_fn, reference=Reference(0.685, 0.139, 0.8, 3876),
             rtol=1e-3, atol=1e-3),
    Workload("gelu_bias", "gelu(x + b, tanh)", "x 16384×4096, b 4096, bf16", BF16, Bound.MEMORY, False,
             gelu_inputs, gelu_bias, reference=Reference(0.240, 0.091, 0.5, 2936)),
    Workload("softmax", "softmax over last dim", _NORM, BF16, Bound.MEMORY, False, rows_input,
             softmax_last, reference=Reference(0.212, 0.159, 0.9, 1692)),
    Workload("layer_norm", "layer_norm (weight, bias)", _NORM, BF16, Bound.MEMORY, False, norm_inputs,
             layer_norm, reference=Reference(0.106, 0.096, 0.8, 2800)),
    Workload("rmsnorm", "x.float() * rsqrt(mean(x²)+eps) → bf16 → * w", _NORM, BF16, Bound.MEMORY, False,
             rmsnorm_inputs, rmsnorm, reference=Reference(0.852, 0.077, 0.7, 3477)),
    Workload("add_layer_norm", "add + layer_norm, returns both", _NORM, BF16, Bound.MEMORY, False,
             add_norm_inputs, add_layer_norm, reference=Reference(0.202, 0.141, 1.7, 3800)),
    Workload("cross_entropy", "cross_entropy(logits.float(), target)", "8192×32000 bf16", BF16,
             Bound.MEMORY, False, ce_inputs, cross_entropy, reference=Reference(1.578, 0.375, 1.2, 1397),
             rtol=1e-3, atol=1e-3),
    Workload("rope", "x*cos + rotate_half(x)*sin", "8×32×2048×128 bf16", BF16, Bound.MEMORY, False,
             rope_inputs, rope, reference=Reference(0.771, 0.068, 0.8, 3965)),
    Workload("transpose_add", "x.t() + y * 2", "8192×8192 fp32 ×2", FP32, Bound.MEMORY, False,
             transpose_inputs, transpose_add),
    Workload("swiglu_mlp", "(silu(x@wg) * (x@wu)) @ wd", "4096×4096 @ 4096×11008, bf16", BF16,
             Bound.MATMUL, False, swiglu_inputs, swiglu_mlp, flops=swiglu_flops,
             reference=Reference(1.731, 1.690, 0.9)),
    Workload("attention_naive", "causal softmax(q@kᵀ/√d) @ v", "4×16×1024×64 bf16", BF16, Bound.MATMUL,
             False, attention_inputs, attention_naive, flops=attention_flops,
             reference=Reference(0.849, 0.176, 1.1)),
    Workload("small_ops", "10 × (sin(x)*y+0.5, cos(y)-x*0.1)", "64×64 fp32", FP32, Bound.LAUNCH, False,
             small_ops_inputs, small_ops, reference=Reference(0.473, 0.031, 3.2)),
    Workload("layer_norm_train", "layer_norm fwd+bwd", _NORM, BF16, Bound.MEMORY, True, norm_inputs,
             layer_norm, grad_argnums=(0, 1, 2), reference=Reference(0.791, 1.139, 1.9),
             rtol=5e-2, atol=5e-2),
    Workload("rmsnorm_train", "rmsnorm fwd+bwd", _NORM, BF16, Bound.MEMORY, True, rmsnorm_inputs, rmsnorm,
             grad_argnums=(0, 1), reference=Reference(3.153, 0.912, 1.7), rtol=5e-2, atol=5e-2),
    Workload("cross_entropy_train", "cross_entropy fwd+bwd", "8192×32000 bf16", BF16, Bound.MEMORY, True,
             ce_inputs, cross_entropy, grad_argnums=(0,), loss=_identity_loss,
             reference=Reference(3.619, 1.069, 1.8)),
    Workload("swiglu_mlp_train", "swiglu_mlp fwd+bwd", "4096×4096 @ 4096×11008, bf16", BF16, Bound.MATMUL,
             True, swiglu_inputs, swiglu_mlp, grad_argnums=(0, 1, 2, 3),
             flops=_training_flops(swiglu_flops), reference=Reference(5.344, 5.206, 1.5),
             rtol=5e-2, atol=5e-2),
    Workload("attention_naive_train", "attention_naive fwd+bwd", "4×16×1024×64 bf16", BF16, Bound.MATMUL,
             True, attention_inputs, attention_naive, grad_argnums=(0, 1, 2),
             flops=_training_flops(attention_flops), reference=Reference(2.068, 1.492, 1.6),
             rtol=5e-2, atol=5e-2),
    Workload("seed_fn_8k_train", "seed_fn fwd+bwd", "8192×8192 fp32 ×2", FP32, Bound.MEMORY, True,
             seed_inputs(8192), seed_fn, grad_argnums=(0, 1), reference=Reference(1.608, 0.720, 1.0)),
    Workload("gpt2", "GPT-2 (4 layers, 768 wide, random init) inference, bf16 autocast",
             "batch 8 × 512 tokens", BF16, Bound.MODEL, False, lambda *_: (), build=gpt2_inference,
             reference=Reference(5.576, 1.445, 7.8), requires=("transformers",), rtol=5e-2, atol=5e-2),
    Workload("gpt2_train", "GPT-2 training step (loss + backward), bf16 autocast", "batch 8 × 512 tokens",
             BF16, Bound.MODEL, True, lambda *_: (), build=gpt2_training, loss=_identity_loss,
             reference=Reference(17.610, 8.972, 18.6), requires=("transformers",), rtol=5e-2, atol=5e-2),
)

BY_NAME: dict[str, Workload] = {w.name: w for w in WORKLOADS}

UNMEASURED: frozenset[str] = frozenset({"transpose_add"})
"""Rows added after the published reference table (``docs/performance.md``, "Targets") was
measured: they have no `Reference` until the next GPU run fills it in."""


def select(names: Sequence[str] | None = None) -> list[Workload]:
    """The workloads named (in table order), or all of them; unknown names raise ``KeyError``."""
    if not names:
        return list(WORKLOADS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise KeyError(f"unknown workload(s) {unknown}; known: {sorted(BY_NAME)}")
    wanted = set(names)
    return [w for w in WORKLOADS if w.name in wanted]


def tensor_bytes(*values: Any) -> int:
    """Bytes of every tensor in ``values`` (nested tuples/lists/dicts walked)."""
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, tuple | list):
            total += tensor_bytes(*v)
        elif isinstance(v, dict):
            total += tensor_bytes(*v.values())
    return total
