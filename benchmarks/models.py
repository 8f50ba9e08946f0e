"""Real ``transformers`` and ``torchvision`` models: eager vs torch.compile vs torchfuse side by side.

    python benchmarks/models.py                                   # every model, both modes (GPU)
    python benchmarks/models.py --only gpt2,llama --mode inference
    python benchmarks/models.py --small --device cpu --only gpt2,bert --backend aot_eager   # CPU smoke run

The models (``MODELS``): GPT-2, BERT, RoBERTa, Llama, Mistral, T5, BART, OPT, GPT-NeoX, Phi and
ViT from ``transformers``, and the torchvision rows of ``vision_models.py`` (ResNet-18/50,
MobileNetV3-small, ConvNeXt-tiny, ViT-B/16, Swin-T at batch 32 × 3 × 224 × 224, the same
steps and checks), built from configs with random weights (seed 0; never ``from_pretrained``, nothing is
downloaded), every dropout probability 0 (so compiled results can be checked against eager),
``use_cache=False`` (one scoring/prefill forward) and ``attn_implementation="sdpa"`` (``"eager"``
only for a model that refuses it; each row records the one used). Full size: a few layers at real
width (each spec's ``summary``), text batch 8 × 512 tokens (seq2seq: 512 encoder and 512 decoder
tokens), ViT batch 32 × 3 × 224 × 224; ``--small``: 2 layers, width 64, batch 2 × 16, so a CPU run
takes seconds. Token ids come from ``[4, vocab)``, clear of special tokens; no attention mask.

Two modes per model, fp32 weights in both: ``inference`` is ``with torch.no_grad(),
torch.autocast(device, torch.bfloat16): model(**inputs).logits``; a ``training`` step is
``model(**inputs, labels=labels)`` under the same autocast, then ``torch.autograd.grad(loss,
parameters)`` (not ``.backward()``: repeated timing calls then add no gradient accumulation).

Three compilers on the same model object and the same inputs: eager; ``torch.compile(model)``
(default mode unless ``--compile-mode``, after ``torch._dynamo.reset()``);
``torchfuse.capture.compile(model, backend=--backend)`` (after ``torchfuse.capture.reset()``).
For each (model, mode, compiler) a cell records:

- ``ms``: median step time, ``Device.bench_ms`` of ``run.py`` (``triton.testing.do_bench`` on
  CUDA, a ``perf_counter`` median on the CPU); ``speedup`` = eager ms / ms;
- ``compile_s``: wall time of the first call (capture + compile + run). The compile caches point
  at fresh directories at the start of the run and each compiler first compiles a trivial
  function, as in ``run.py``; later models may reuse kernels an earlier one cached;
  ``tuned_after_s`` (torchfuse): from the same start until the tuning it deferred past the
  first call was done (``Device.finish_tuning``), before ``ms`` and ``peak_mb`` are measured;
- ``peak_mb``: on CUDA, the peak memory of one step above what was allocated before it;
- the error against eager: ``err_logits`` = max |a - e| / max |e| over the logits; training adds
  ``err_loss`` = |a - e| / |e| and ``err_grads`` = ||a - e||₂ / ||e||₂ over every parameter
  gradient flattened into one vector (``err_grad_worst``: the largest such ratio of one
  parameter, among those whose gradient is not rounding noise, named in
  ``err_grad_worst_param``). ``check`` is ``run.py``'s ``check_against`` (``assert_close`` at
  rtol = atol = 5e-2, atol relative to the tensor's largest magnitude) on the logits and loss,
  and on each gradient with atol relative to the largest gradient element of the model. A
  compiled step that fails it is judged once more against the same step in float32 (autocast
  off, run once per row when needed; ``check_vs_eager`` keeps the first verdict): it passes when
  its logits, loss and every sized gradient are no further from float32 than ``REF_MULTIPLIER``
  (2) times eager's own bf16 step plus 1e-3 (`judge_by_reference`; the table's check then reads
  ``ok (fp32 ref)``). Two correct bf16 implementations that round in different places can be
  further apart than any fixed tolerance: a deep random ResNet's bf16 gradients are 0.3-1 from
  float32's in relative L2 in eager itself;
- torchfuse: ``graphs_compiled`` (the graphs its compiled module captured) and, from
  ``explain(model)(**inputs)``, ``graph_count``, ``graph_break_count`` and ``break_reasons``.
  Zero graphs means torchfuse ran the model eagerly: ``eager_fallback`` is set and the table says so;
- torch.compile: ``graphs`` and ``graph_breaks`` Dynamo counted during its first call.

A failure is recorded as an error string in its cell and the run goes on; a variant's compile and
first call run under ``--variant-timeout-s``; no row is started after ``--budget-s``. The summary
has the geometric-mean speedup over eager of torch.compile and of torchfuse, inference and
training apart, over the rows whose result matches eager (``summarize``). Results go to
``<out>/models_<tag>.json`` (rewritten after every row), ``.md`` and ``.png`` (when matplotlib is
installed). See ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run.py and report.py beside this file, however it is started
    sys.path.insert(0, str(HERE))

from models_isolate import run_row_isolated  # noqa: E402
from models_report import MODES, markdown, progress_line, summarize, write_all  # noqa: E402
from run import (  # noqa: E402
    Compilers,
    Device,
    _set_cache_dirs,
    add_speedups,
    check_against,
    deadline,
    detach_all,
    environment,
    short_error,
)

SCHEMA = "torchfuse-models/1"
VISION_NAMES = ("resnet18", "resnet50", "mobilenet_v3_small", "convnext_tiny", "vit_b_16", "swin_t")
TOL = {"rtol": 5e-2, "atol": 5e-2}  # run.py's tolerance for its whole-model rows
MAX_BREAKS = 8  # break reasons kept per cell
SMALL_VOCAB = 1024


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model: its transformers classes, the full and the ``--small`` config, its inputs.

    ``inputs`` is ``"text"`` (``input_ids``; labels = the same ids), ``"seq2seq"`` (``input_ids``
    and ``decoder_input_ids``, the labels shifted right into them) or ``"image"``
    (``pixel_values``; labels = class indices).
    """

    name: str
    model_class: str
    config_class: str
    summary: str
    full: dict[str, Any]
    small: dict[str, Any]
    inputs: str = "text"


_BERTISH = dict(num_hidden_layers=6, hidden_size=768, num_attention_heads=12, intermediate_size=3072)
_LLAMA = dict(num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
# --small: 2 layers, width 64, a 1024-token vocabulary
_TINY_CORE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
_TINY = dict(_TINY_CORE, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
_TINY_LLAMA = dict(_TINY, num_attention_heads=4, num_key_value_heads=2)
_TINY_ENC_DEC = dict(vocab_size=SMALL_VOCAB, d_model=64)

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("gpt2", "GPT2LMHeadModel", "GPT2Config", "GPT-2, 6 layers, 768 wide, 12 heads",
              dict(n_layer=6, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
              dict(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=SMALL_VOCAB)),
    ModelSpec("bert", "BertForMaskedLM", "BertConfig", "BERT-base width, 6 layers",
              dict(_BERTISH, vocab_size=30522, max_position_embeddings=512), _TINY),
    # RoBERTa's positions start after its padding index (1): 512 tokens need 514 positions.
    ModelSpec("roberta", "RobertaForMaskedLM", "RobertaConfig", "RoBERTa-base width, 6 layers",
              dict(_BERTISH, vocab_size=50265, max_position_embeddings=514),
              dict(_TINY, max_position_embeddings=66)),
    ModelSpec("llama", "LlamaForCausalLM", "LlamaConfig", "Llama, 6 layers, 1024 wide, GQA 16/4 heads",
              dict(_LLAMA, num_hidden_layers=6, hidden_size=1024, intermediate_size=2816,
                   max_position_embeddings=2048), _TINY_LLAMA),
    ModelSpec("mistral", "MistralForCausalLM", "MistralConfig",
              "Mistral, 4 layers, 2048 wide, GQA 16/4 heads, sliding window 4096",
              dict(_LLAMA, num_hidden_layers=4, hidden_size=2048, intermediate_size=7168,
                   max_position_embeddings=4096, sliding_window=4096),
              dict(_TINY_LLAMA, sliding_window=64)),
    ModelSpec("t5", "T5ForConditionalGeneration", "T5Config", "T5-small width, 4 + 4 layers",
              dict(num_layers=4, num_decoder_layers=4, d_model=512, d_kv=64, d_ff=2048, num_heads=8,
                   vocab_size=32128, decoder_start_token_id=0),
              dict(_TINY_ENC_DEC, num_layers=2, num_decoder_layers=2, d_kv=32, d_ff=128, num_heads=2,
                   decoder_start_token_id=0), "seq2seq"),
    ModelSpec("bart", "BartForConditionalGeneration", "BartConfig", "BART-base width, 4 + 4 layers",
              dict(encoder_layers=4, decoder_layers=4, d_model=768, encoder_attention_heads=12,
                   decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                   vocab_size=50265, max_position_embeddings=1024),
              dict(_TINY_ENC_DEC, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                   max_position_embeddings=64), "seq2seq"),
    ModelSpec("opt", "OPTForCausalLM", "OPTConfig", "OPT-125m width, 6 layers",
              dict(num_hidden_layers=6, hidden_size=768, num_attention_heads=12, ffn_dim=3072,
                   word_embed_proj_dim=768, vocab_size=50272, max_position_embeddings=2048),
              dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, ffn_dim=128,
                   word_embed_proj_dim=64, vocab_size=SMALL_VOCAB, max_position_embeddings=64)),
    ModelSpec("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", "Pythia-160m width, 6 layers",
              dict(_BERTISH, vocab_size=50304, max_position_embeddings=2048), _TINY),
    ModelSpec("phi", "PhiForCausalLM", "PhiConfig", "Phi-1.5 width, 4 layers, 2048 wide",
              dict(num_hidden_layers=4, hidden_size=2048, num_attention_heads=32, intermediate_size=8192,
                   vocab_size=51200, max_position_embeddings=2048), _TINY),
    ModelSpec("vit", "ViTForImageClassification", "ViTConfig", "ViT-B/16 width, 6 layers, 1000 classes",
              dict(_BERTISH, image_size=224, patch_size=16, num_labels=1000),
              dict(_TINY_CORE, image_size=32, patch_size=8, num_labels=10), "image"),
    *(ModelSpec(n, n, "", f"torchvision {n}, 1000 classes", {}, {}, "torchvision") for n in VISION_NAMES),
)
BY_NAME = {m.name: m for m in MODELS}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help=f"comma-separated models (default: all of {','.join(BY_NAME)})")
    p.add_argument("--skip", default="", help="comma-separated models to leave out")
    p.add_argument("--mode", default="both", choices=(*MODES, "both", "training-first"),
                   help="which steps to time; training-first: both, the training rows first (the "
                        "slower ones, when a time budget may cut the run short)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--small", action="store_true", help="tiny configs and batches (CPU smoke runs)")
    p.add_argument("--backend", default="inductor", help="torchfuse backend (e.g. aot_eager, eager)")
    p.add_argument("--tf-mode", default=None, help="torchfuse compile mode (e.g. reduce-overhead)")
    p.add_argument("--options", default="", help="torchfuse compile options as JSON")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: default mode)")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile column")
    p.add_argument("--skip-torchfuse", action="store_true", help="no torchfuse column")
    p.add_argument("--no-explain", action="store_true", help="do not run torchfuse's explain")
    p.add_argument("--tag", default=None, help="result files models_<tag>.* (default: <device>_<date>)")
    p.add_argument("--out", default=str(HERE / "results"), help="directory for the result files")
    p.add_argument("--cache-dir", default=None, help="root of the compile caches (default: fresh temp)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new row after this many seconds (rows left are marked skipped)")
    p.add_argument("--variant-timeout-s", type=float, default=300.0,
                   help="give up on one variant's compile + first call (and on explain) after this long")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warmup")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    p.add_argument("--isolate", action="store_true",
                   help="time each compiler of a row in a fresh process of its own, with eager "
                        "beside it there (models_isolate.py)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- building


def make_config(cls: type, kwargs: dict[str, Any], attn: str, notes: list[str]) -> Any:
    """``cls(**kwargs)``, guarded against the differences between transformers versions.

    A keyword the constructor rejects is set as an attribute afterwards; a value that does not
    read back (renamed or ignored by this version) is set again, and both are noted. Then every
    dropout probability is zeroed, the KV cache is turned off and special token ids outside a
    small vocabulary are clamped into it.
    """
    try:
        cfg = cls(**kwargs, attn_implementation=attn)
    except TypeError as e:
        import inspect

        accepted = set(inspect.signature(cls.__init__).parameters)
        notes.append(f"{cls.__name__}: {short_error(e)}; unknown keywords set as attributes")
        cfg = cls(**{k: v for k, v in kwargs.items() if k in accepted})
    missing = object()
    for key, value in kwargs.items():
        if getattr(cfg, key, missing) != value:
            setattr(cfg, key, value)
            notes.append(f"{cls.__name__}.{key} set after construction")
    if getattr(cfg, "_attn_implementation", None) != attn:
        cfg._attn_implementation = attn
    for key, value in cfg.to_dict().items():
        drop = "dropout" in key or "pdrop" in key or key.endswith("layerdrop")
        if drop and isinstance(value, int | float) and not isinstance(value, bool) and value:
            setattr(cfg, key, 0.0)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    vocab = getattr(cfg, "vocab_size", None)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = getattr(cfg, key, None)
        if vocab and isinstance(value, int) and value >= vocab:
            setattr(cfg, key, vocab - 1)
    return cfg


def build_model(spec: ModelSpec, scale: str, device: Any) -> tuple[Any, dict[str, Any]]:
    """The model on ``device`` (fp32, seed 0) and what to record about it."""
    import torch

    if spec.inputs == "torchvision":
        import vision_models

        return vision_models.build(spec.name, scale, device)
    import transformers

    cfg_cls, model_cls = getattr(transformers, spec.config_class), getattr(transformers, spec.model_class)
    kwargs = spec.full if scale == "full" else spec.small
    notes: list[str] = []
    for attn in ("sdpa", "eager"):
        cfg = make_config(cfg_cls, kwargs, attn, notes)
        torch.manual_seed(0)
        try:
            with torch.device(device):  # initialized in place: 300M parameters on the host take seconds
                model = model_cls(cfg).to(device)
            break
        except ValueError as e:  # "does not support an attention implementation through sdpa"
            text = str(e).lower()
            if attn != "sdpa" or ("attn" not in text and "sdpa" not in text):
                raise
            notes.append(f"sdpa refused ({short_error(e, 120)}); eager attention")
    leftover = 0
    for m in model.modules():  # a dropout the config names missed
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p:
            m.p, leftover = 0.0, leftover + 1
    notes += [f"{leftover} dropout modules still had p > 0 after the config: set to 0"] if leftover else []
    info = {"attn_implementation": getattr(model.config, "_attn_implementation", None),
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "config_notes": notes}
    return model, info


def make_inputs(spec: ModelSpec, cfg: Any, scale: str, device: Any, training: bool) -> dict[str, Any]:
    """The keyword arguments of one call (labels included for training), seeded."""
    import torch

    g = torch.Generator(device).manual_seed(0)
    if spec.inputs in ("image", "torchvision"):
        batch, size = 32 if scale == "full" else 2, cfg.image_size
        pixels = torch.randn(batch, getattr(cfg, "num_channels", 3), size, size, generator=g, device=device)
        labels = torch.randint(0, cfg.num_labels, (batch,), generator=g, device=device)
        inputs: dict[str, Any] = {"pixel_values": pixels}
    else:
        batch, tokens = (8, 512) if scale == "full" else (2, 16)

        def ids() -> Any:
            return torch.randint(4, cfg.vocab_size, (batch, tokens), generator=g, device=device)

        inputs = {"input_ids": ids()}
        labels = inputs["input_ids"]
        if spec.inputs == "seq2seq":
            labels = ids()
            start = torch.full((batch, 1), cfg.decoder_start_token_id, dtype=labels.dtype, device=device)
            inputs["decoder_input_ids"] = torch.cat([start, labels[:, :-1]], dim=1)
    return {**inputs, "labels": labels} if training else inputs


# ----------------------------------------------------------------------------- one step


@contextlib.contextmanager
def step_context(device_type: str, training: bool, autocast: bool = True) -> Iterator[None]:
    """Autocast to bf16 (float32 throughout with ``autocast=False``: the reference of
    `judge_by_reference`); ``no_grad`` as well for inference."""
    import torch

    with contextlib.nullcontext() if training else torch.no_grad(), \
            torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        yield


def _field(out: Any, name: str, index: int) -> Any:
    """``out.name`` of a ModelOutput, or of whatever a compiler rebuilt it into."""
    if hasattr(out, name):
        return getattr(out, name)
    if isinstance(out, dict):
        return out[name]
    return out[index]


def make_step(fn: Callable[..., Any], inputs: dict[str, Any], training: bool, params: tuple[Any, ...],
              device_type: str, autocast: bool = True) -> Callable[[], Any]:
    """The timed unit: the logits of a forward; or loss, logits and gradients of a training step."""
    import torch

    if not training:
        def infer() -> Any:
            with step_context(device_type, False, autocast):
                return _field(fn(**inputs), "logits", 0)

        return infer

    def train() -> Any:
        with step_context(device_type, True, autocast):
            out = fn(**inputs)
        loss = _field(out, "loss", 0)
        return loss, _field(out, "logits", 1), torch.autograd.grad(loss, params, allow_unused=True)

    return train


def compare(expected: Any, actual: Any, training: bool, names: list[str]) -> dict[str, Any]:
    """The errors against eager (see the module docstring) and ``check``."""

    def max_rel(e: Any, a: Any) -> float:
        e, a = e.float(), a.float()
        return float((a - e).abs().max() / e.abs().max().clamp_min(1e-30))

    if not training:
        return {"err_logits": max_rel(expected, actual), "check": check_against(expected, actual, TOL)}
    (e_loss, e_logits, e_grads), (a_loss, a_logits, a_grads) = expected, actual
    out: dict[str, Any] = {"err_loss": abs(float(a_loss) - float(e_loss)) / max(abs(float(e_loss)), 1e-30),
                           "err_logits": max_rel(e_logits, a_logits)}
    triples = list(zip(names, e_grads, a_grads, strict=True))
    pairs = [(n, e, a) for n, e, a in triples if e is not None and a is not None]
    odd = [n for n, e, a in triples if (e is None) != (a is None)]
    norms = [(n, float((a.float() - e.float()).pow(2).sum()), float(e.float().pow(2).sum()))
             for n, e, a in pairs]
    num, den = sum(d2 for _, d2, _ in norms), sum(e2 for _, _, e2 in norms)
    out["err_grads"] = math.sqrt(num / den) if den else None
    # The worst parameter among those with a gradient of some size: one that is zero in exact
    # arithmetic (a key projection's bias: softmax ignores a constant added to every key) is
    # rounding noise in every implementation, its relative error meaningless.
    floor = 1e-6 * max((e2 for _, _, e2 in norms), default=0.0)
    sized = [(math.sqrt(d2 / e2), name) for name, d2, e2 in norms if e2 > floor]
    out["err_grad_worst"], out["err_grad_worst_param"] = max(sized, default=(None, None))
    check = check_against((e_loss, e_logits), (a_loss, a_logits), TOL)
    # Each gradient at rtol 5e-2 and atol 5e-2 × the largest gradient element of the whole model
    # (not of the one tensor: the noise-only gradients above fail any tolerance of their own size).
    largest = max((float(e.abs().max()) for _, e, _ in pairs), default=0.0)
    for name, e, a in pairs:
        if check != "ok":
            break
        own = max(float(e.abs().max()), 1e-30)
        check = check_against(e, a, {"rtol": TOL["rtol"], "atol": TOL["atol"] * largest / own})
        check = check.replace("value 0", f"gradient of {name}", 1)
    if odd:
        check = f"MISMATCH: gradient present on one side only for {', '.join(odd[:3])}"
    out["check"] = check
    return out


REF_MULTIPLIER = 2.0
"""A compiled result that differs from eager's bf16 result still passes when it is no further
from the float32 reference than ``REF_MULTIPLIER`` times eager's own bf16 result is."""


def judge_by_reference(reference: Any, expected: Any, actual: Any, training: bool,
                       names: list[str]) -> str:
    """Whether ``actual`` (a compiled bf16 step that failed the check against eager's bf16
    step ``expected``) is as accurate as eager, measured against ``reference``, the same step
    in float32 without autocast. Under bf16 two correct implementations that round in other
    places can differ from each other by more than any tolerance (a deep random ResNet's
    gradients: eager's own bf16 gradients are 0.3-1 away from float32's in relative L2), so the
    question becomes: is the compiled step's error no larger than eager's? Every quantity is
    judged on its own: the logits (max error / max |reference|), the loss, and each parameter's
    gradient of some size (relative L2; gradients below 1e-6 of the largest squared norm are
    rounding noise everywhere, as in `compare`). Returns ``"ok (…)"`` or ``"MISMATCH: …"``."""

    def err(r: Any, x: Any, how: str) -> float:
        r, x = r.double(), x.double()
        if how == "max":
            return float((x - r).abs().max() / r.abs().max().clamp_min(1e-30))
        return float((x - r).norm() / r.norm().clamp_min(1e-30))

    if not training:
        checks = [("logits", reference, expected, actual, "max")]
    else:
        (r_loss, r_logits, r_grads), (e_loss, e_logits, e_grads), (a_loss, a_logits, a_grads) = (
            reference, expected, actual)
        checks = [("loss", r_loss.reshape(1), e_loss.reshape(1), a_loss.reshape(1), "l2"),
                  ("logits", r_logits, e_logits, a_logits, "max")]
        sizes = [float(r.double().pow(2).sum()) if r is not None else 0.0 for r in r_grads]
        floor = 1e-6 * max(sizes, default=0.0)
        for name, r, e, a, size in zip(names, r_grads, e_grads, a_grads, sizes, strict=True):
            if r is None or e is None or a is None or size <= floor:
                continue
            checks.append((f"gradient of {name}", r, e, a, "l2"))
    worst = (0.0, "")
    for label, r, e, a, how in checks:
        e_err, a_err = err(r, e, how), err(r, a, how)
        bound = REF_MULTIPLIER * e_err + 1e-3
        if a_err > bound:
            return (f"MISMATCH: {label} is {a_err:.2e} from the float32 reference, eager's bf16 "
                    f"{e_err:.2e} (allowed {REF_MULTIPLIER:g}x + 1e-3)")
        worst = max(worst, (a_err / bound, f"{label} {a_err:.2e} vs eager's {e_err:.2e}"))
    return f"ok (vs float32: worst {worst[1]})"


# ----------------------------------------------------------------------------- compilers


class ModelCompilers(Compilers):
    """run.py's compilers, with torchfuse's backend chosen by ``--backend``."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(argparse.Namespace(
            skip_compile=args.skip_compile, skip_torchfuse=args.skip_torchfuse,
            compile_mode=args.compile_mode, mode=args.tf_mode, dynamic=None, options=args.options))
        self.backend = args.backend

    def make(self, variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if variant != "torchfuse":
            return super().make(variant, fn)
        if self._tf is None:
            raise RuntimeError(f"torchfuse.capture does not import: {self.torchfuse_import_error}")
        import torch

        if not self.args.skip_compile:
            torch._dynamo.reset()  # nothing of torch.compile's state left around torchfuse's run
        self._tf.reset()
        kwargs: dict[str, Any] = {"backend": self.backend}
        if self.args.mode:
            kwargs["mode"] = self.args.mode
        if self.args.options:
            kwargs["options"] = json.loads(self.args.options)
        return self._tf.compile(fn, **kwargs)


def _dynamo_counts() -> tuple[int, int] | None:
    """(graphs, graph breaks) Dynamo has counted so far; None when its counters moved away."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
    except Exception:
        return None


def explain_cell(model: Any, inputs: dict[str, Any], training: bool, dev: Device,
                 timeout_s: float) -> dict[str, Any]:
    """torchfuse's ``explain(model)(**inputs)``: graphs, breaks and their reasons."""
    from torchfuse.capture import explain

    out: dict[str, Any] = {}
    try:
        with deadline(timeout_s):
            t0 = time.perf_counter()
            with step_context(dev.device.type, training):
                exp = explain(model)(**inputs)
            dev.sync()
        out["explain_s"] = time.perf_counter() - t0
        out["graph_count"] = exp.graph_count
        out["graph_break_count"] = exp.graph_break_count
        out["break_reasons"] = [_reason(b) for b in exp.break_reasons[:MAX_BREAKS]]
    except Exception as e:
        out["explain_error"] = short_error(e)
    return out


def _reason(b: Any) -> dict[str, Any]:
    where = None
    if getattr(b, "filename", None):  # site-packages/transformers/... → transformers/...
        where = f"{b.filename.rpartition('site-packages/')[2]}:{b.lineno}"
        where += f" in {b.function}" if getattr(b, "function", None) else ""
    return {"reason": str(getattr(b, "reason", b))[:300], "where": where,
            "text": getattr(b, "text", None), "fallback": getattr(b, "fallback", None)}


# ----------------------------------------------------------------------------- one row


def run_row(spec: ModelSpec, training: bool, dev: Device, compilers: ModelCompilers,
            args: argparse.Namespace) -> dict[str, Any]:
    """One (model, mode): every compiler on the same model and inputs."""
    scale = "small" if args.small else "full"
    row: dict[str, Any] = {"name": spec.name, "mode": MODES[training], "training": training,
                           "model_class": spec.model_class, "scale": scale, "results": {},
                           "summary": spec.summary if scale == "full" else "tiny config (--small)"}
    try:
        model, info = build_model(spec, scale, dev.device)
        model.train(training)
        inputs = make_inputs(spec, model.config, scale, dev.device, training)
    except Exception as e:
        row["error"] = "build: " + short_error(e)
        return row
    row.update(info, shapes=", ".join(f"{k} {'×'.join(map(str, v.shape))}" for k, v in inputs.items()))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], tuple(p for _, p in named)
    expected: Any = None
    reference: Any = None  # the float32 step (`judge_by_reference`), made when first needed
    for variant in compilers.variants():
        cell: dict[str, Any] = {"ms": None, "error": None}
        row["results"][variant] = cell
        compiled = step = first = None
        try:
            with deadline(args.variant_timeout_s):
                compiled = compilers.make(variant, model)
                step = make_step(compiled, inputs, training, params, dev.device.type)
                before = _dynamo_counts() if variant == "torch_compile" else None
                first, first_s = dev.timed_call(step)
            cell["first_call_s"] = first_s
            if before is not None and (after := _dynamo_counts()) is not None:
                cell["graphs"], cell["graph_breaks"] = after[0] - before[0], after[1] - before[1]
            if variant == "torchfuse" and hasattr(compiled, "graph_count"):
                cell["graphs_compiled"] = compiled.graph_count()
            if variant == "eager":
                expected = detach_all(first)
            else:
                cell["compile_s"] = first_s
                try:
                    cell.update({"check": "no eager reference"} if expected is None
                                else compare(expected, detach_all(first), training, names))
                    if cell["check"].startswith("MISMATCH") and expected is not None:
                        if reference is None:  # once per row, only when needed
                            reference = detach_all(make_step(model, inputs, training, params,
                                                             dev.device.type, autocast=False)())
                        cell["check_vs_eager"] = cell["check"]
                        cell["check"] = judge_by_reference(reference, expected, detach_all(first),
                                                           training, names)
                except Exception as e:  # e.g. a value that is not a real tensor
                    cell["check"] = "MISMATCH: comparing with eager: " + short_error(e)
            first = None
            if variant == "torchfuse":
                cell["tuned_after_s"] = first_s + dev.finish_tuning(step)
            cell["peak_mb"] = dev.peak_extra_mb(step)
            cell["ms"] = dev.bench_ms(step)
            if variant == "torchfuse" and hasattr(compiled, "graph_count"):
                # more graphs now than after the first call: it recompiled while being timed
                cell["graphs_after_timing"] = compiled.graph_count()
        except Exception as e:
            cell["error"] = short_error(e)
        finally:
            compiled = step = first = None
            gc.collect()
        if variant == "torchfuse" and not args.no_explain and dev.healthy() is None:
            cell.update(explain_cell(model, inputs, training, dev, args.variant_timeout_s))
        if variant == "torchfuse":
            counts = [cell[k] for k in ("graphs_compiled", "graph_count") if cell.get(k) is not None]
            cell["eager_fallback"] = bool(counts) and min(counts) == 0
        broken = dev.healthy()
        if broken:
            row["device_lost"] = f"after {variant}: {broken}"
            break
    add_speedups(row)
    del model, inputs, params, named, expected, reference
    gc.collect()
    if dev.is_cuda:
        dev.torch.cuda.empty_cache()
    return row


# ----------------------------------------------------------------------------- main


def settle_compile_workers() -> None:
    """Wait until torch.compile's compile-worker processes are up: started by the prewarm, they
    import torch in the background for seconds and, on a machine with few cores, slow down
    whatever is timed meanwhile (eager GPT-2 on a 2-core CPU: 97 ms instead of 2.5)."""
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.wait_pool_ready(timeout=120)
    except Exception:  # another torch version, or no worker pool: nothing to wait for
        pass


def select(only: str, skip: str) -> list[ModelSpec]:
    names = [n for n in only.split(",") if n] or list(BY_NAME)
    dropped = {n for n in skip.split(",") if n}
    unknown = sorted((set(names) | dropped) - set(BY_NAME))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(BY_NAME)}")
    return [m for m in MODELS if m.name in names and m.name not in dropped]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    specs = select(args.only, args.skip)
    cache_root = _set_cache_dirs(args.cache_dir)
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    # On the CPU torchfuse runs C++ kernels, as for any CPU user; TRITON_INTERPRET=1 (set
    # before this started) would put every kernel through Triton's interpreter instead, at
    # seconds a step (a 2-image ResNet-18 forward: 7.3 s against 12 ms in eager).
    import vision_models

    vision_models.ensure_importable()  # before transformers imports torchvision
    try:
        import transformers
    except ImportError as e:
        print(f"models.py needs transformers: {short_error(e)}", file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()  # config warnings about tiny vocabularies etc.

    started = time.perf_counter()
    dev = Device(args.device, args.warmup_ms, args.rep_ms)
    tag = args.tag or f"{dev.device.type}_{dt.datetime.now():%Y%m%d_%H%M}"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    compilers = ModelCompilers(args)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "tag": tag, "environment": environment(dev, None),
        "config": vars(args) | {"cache_root": cache_root, "variants": compilers.variants(),
                                "models": [m.name for m in specs]},
        "prewarm_failures": {} if args.isolate else compilers.prewarm(dev), "rows": [], "notes": [],
    }
    if "torch_compile" in compilers.variants() and not args.isolate:
        settle_compile_workers()
    if compilers.torchfuse_import_error:
        doc["notes"].append(f"torchfuse.capture does not import: {compilers.torchfuse_import_error}")
    print(f"{dev.name()}: transformers {transformers.__version__}, torch {torch.__version__}; "
          f"models {', '.join(m.name for m in specs)}; caches under {cache_root}", flush=True)
    modes = {"both": MODES, "training-first": MODES[::-1]}.get(args.mode, (args.mode,))
    for mode in modes:
        for spec in specs:
            skipped = None
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                skipped = f"time budget {args.budget_s:.0f} s spent"
            elif any(r.get("device_lost") for r in doc["rows"]):
                skipped = "device lost in an earlier row"
            if skipped:
                doc["rows"].append({"name": spec.name, "mode": mode, "skipped": skipped})
                continue
            t0 = time.perf_counter()
            if args.isolate:
                compiled = [v for v in compilers.variants() if v != "eager"]
                row = run_row_isolated(spec.name, mode, compiled, args, cache_root)
            else:
                row = run_row(spec, mode == "training", dev, compilers, args)
            doc["rows"].append(row)
            print(progress_line(row, time.perf_counter() - t0), flush=True)
            doc["summary"] = summarize(doc["rows"])
            write_all(doc, out_dir, plot_png=False)  # partial results survive a timeout
    doc["summary"] = summarize(doc["rows"])
    doc["elapsed_s"] = time.perf_counter() - started
    paths = write_all(doc, out_dir, plot_png=not args.no_plot)
    print(markdown(doc))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
