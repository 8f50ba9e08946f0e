"""Tiny ``transformers`` models for the models suite: random weights, no downloads.

Each entry builds a model from a small config of a real architecture, and example inputs
(token ids, an attention mask with padding, decoder ids for encoder-decoders, pixels for
vision models). ``labels`` make the models compute their own loss, so a training step is
``model(**inputs).loss.backward()``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch

VOCAB = 100
BATCH, TOKENS = 2, 12


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[Any], torch.nn.Module]
    """``build(transformers)`` -> the model (random weights)."""
    inputs: Callable[[bool], dict[str, Any]]
    """``inputs(training)`` -> keyword arguments of one call (labels when training)."""


def _ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (BATCH, TOKENS), generator=g)


def _padding_mask() -> torch.Tensor:
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    mask[1, :3] = 0  # left padding on the second row
    return mask


def _causal_lm(training: bool) -> dict[str, Any]:
    ids = _ids()
    out: dict[str, Any] = {"input_ids": ids, "attention_mask": _padding_mask()}
    if training:
        out["labels"] = ids
    return out


def _masked_lm(training: bool) -> dict[str, Any]:
    ids = _ids()
    out: dict[str, Any] = {"input_ids": ids, "attention_mask": _padding_mask()}
    if training:
        out["labels"] = _ids(1)
    return out


def _seq2seq(training: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    if training:
        out["labels"] = _ids(1)[:, :8].contiguous()
    else:
        out["decoder_input_ids"] = _ids(2)[:, :8].contiguous()
    return out


def _pixels(training: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g)}
    if training:
        out["labels"] = torch.tensor([1, 3])
    return out


def _speech(training: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"input_features": torch.randn(BATCH, 16, 32, generator=g)}
    if training:
        out["labels"] = _ids(1)[:, :8].contiguous()
    else:
        out["decoder_input_ids"] = _ids(2)[:, :8].contiguous()
    return out


_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": VOCAB}


def _config(cls: Any, **kw: Any) -> Any:
    cfg = cls(**kw)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                 "activation_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout_rate",
                 "hidden_dropout", "classifier_dropout"):
        if getattr(cfg, name, None):
            setattr(cfg, name, 0.0)
    cfg.pad_token_id = 0
    cfg.bos_token_id, cfg.eos_token_id = 1, 2
    if cfg.is_encoder_decoder:
        cfg.decoder_start_token_id = 1
    return cfg


def _gpt2(t: Any) -> torch.nn.Module:
    return t.GPT2LMHeadModel(_config(t.GPT2Config, n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=64))


def _bert(t: Any) -> torch.nn.Module:
    return t.BertForMaskedLM(_config(t.BertConfig, **_SMALL))


def _roberta(t: Any) -> torch.nn.Module:
    return t.RobertaForMaskedLM(_config(t.RobertaConfig, **_SMALL))


def _llama(t: Any) -> torch.nn.Module:
    return t.LlamaForCausalLM(_config(t.LlamaConfig, num_key_value_heads=2, **_SMALL))


def _mistral(t: Any) -> torch.nn.Module:
    return t.MistralForCausalLM(_config(t.MistralConfig, num_key_value_heads=2, **_SMALL))


def _opt(t: Any) -> torch.nn.Module:
    return t.OPTForCausalLM(_config(t.OPTConfig, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                    num_attention_heads=4, vocab_size=VOCAB, word_embed_proj_dim=64))


def _t5(t: Any) -> torch.nn.Module:
    return t.T5ForConditionalGeneration(_config(t.T5Config, d_model=64, d_ff=128, d_kv=16, num_layers=2,
                                                num_heads=4, vocab_size=VOCAB))


def _bart(t: Any) -> torch.nn.Module:
    return t.BartForConditionalGeneration(_config(
        t.BartConfig, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=VOCAB,
        max_position_embeddings=64))


def _whisper(t: Any) -> torch.nn.Module:
    return t.WhisperForConditionalGeneration(_config(
        t.WhisperConfig, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=16, max_target_positions=32, vocab_size=VOCAB))


def _vit(t: Any) -> torch.nn.Module:
    return t.ViTForImageClassification(_config(
        t.ViTConfig, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=32, patch_size=8, num_labels=5))


CASES: tuple[ModelCase, ...] = (
    ModelCase("gpt2", _gpt2, _causal_lm),
    ModelCase("bert", _bert, _masked_lm),
    ModelCase("roberta", _roberta, _masked_lm),
    ModelCase("llama", _llama, _causal_lm),
    ModelCase("mistral", _mistral, _causal_lm),
    ModelCase("opt", _opt, _causal_lm),
    ModelCase("t5", _t5, _seq2seq),
    ModelCase("bart", _bart, _seq2seq),
    ModelCase("whisper", _whisper, _speech),
    ModelCase("vit", _vit, _pixels),
)


def build(case: ModelCase, transformers: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = case.build(transformers)
        if hasattr(model.config, "_attn_implementation"):
            model.config._attn_implementation = "sdpa"
    return model
