"""Other ``transformers`` models (a decoder with rotary embeddings and grouped KV heads, an
encoder with a bidirectional mask) captured as one graph and compared with eager."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torchfuse.capture import compile, explain

transformers = pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    return transformers.LlamaForCausalLM(cfg)


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=100, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg)


@pytest.mark.parametrize("make", [_llama, _bert], ids=["llama", "bert"])
def test_model_one_graph_matches_eager(make):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = make().eval()
    ids = torch.randint(0, 100, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    for kwargs in ({}, {"attention_mask": mask}):
        e = explain(copy.deepcopy(m))(ids, **kwargs)
        assert e.graph_count == 1 and e.graph_break_count == 0, "\n".join(map(str, e.break_reasons))
        with torch.no_grad():
            got, want = compile(m, backend="eager")(ids, **kwargs), m(ids, **kwargs)
        assert type(got) is type(want) and list(got.keys()) == list(want.keys())
        torch.testing.assert_close(got[0], want[0])
