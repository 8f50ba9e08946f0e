"""HuggingFace ``transformers`` GPT-2 captured as one graph and compared with eager.

Skipped when ``transformers`` is not installed (CI does not have it); the interpreter
features it needs are covered on their own in ``test_models_features.py``. The model is a
small random-init GPT-2 so that the tests run on a CPU; the benchmark's cases (bf16 autocast
inference, training step with loss + backward) are the ones checked.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torchfuse.capture import compile, explain
from torchfuse.capture.backends import list_backends

transformers = pytest.importorskip("transformers")


def _backend(name: str) -> Any:
    marks = [] if name in list_backends() else [pytest.mark.skip(reason=f"backend {name} not installed")]
    return pytest.param(name, marks=marks)


def _model(n_layer: int = 2, **overrides: object) -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=0, **overrides)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GPT2LMHeadModel(cfg)


def _ids(batch: int = 2, tokens: int = 16) -> torch.Tensor:
    return torch.randint(0, 100, (batch, tokens))


def _one_graph(fn, *args, **kwargs) -> None:
    e = explain(fn)(*args, **kwargs)
    assert e.graph_count == 1 and e.graph_break_count == 0, "\n".join(map(str, e.break_reasons))


def test_module_default_call_one_graph_and_output_rebuilt():
    m = _model().eval()
    ids = _ids()
    _one_graph(m, ids)
    c = compile(m, backend="eager")
    with torch.no_grad():
        out, ref = c(ids), m(ids)
    # the model output (an OrderedDict dataclass) and the DynamicCache come back rebuilt
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out[0], ref[0])
    assert type(out.past_key_values) is type(ref.past_key_values)
    for got, want in zip(out.past_key_values.layers, ref.past_key_values.layers, strict=True):
        assert type(got) is type(want)
        torch.testing.assert_close(got.keys, want.keys)
        torch.testing.assert_close(got.values, want.values)
    ids2 = _ids()  # same shapes: the guards hold, the graph is reused
    with torch.no_grad():
        torch.testing.assert_close(c(ids2).logits, m(ids2).logits)
        ids3 = _ids(3, 9)  # other shapes: captured again
        torch.testing.assert_close(c(ids3).logits, m(ids3).logits)


@pytest.mark.parametrize("kwargs", [{"use_cache": False}, {"use_cache": False, "return_dict": False},
                                    {"attention_mask": "padded"}])
def test_call_variants(kwargs):
    m = _model().eval()
    ids = _ids()
    if kwargs.get("attention_mask") == "padded":
        mask = torch.ones_like(ids)
        mask[0, :4] = 0
        kwargs = {"attention_mask": mask}
    _one_graph(m, ids, **kwargs)
    with torch.no_grad():
        got, want = compile(m, backend="eager")(ids, **kwargs), m(ids, **kwargs)
    got_logits = got[0] if isinstance(got, tuple) else got.logits
    want_logits = want[0] if isinstance(want, tuple) else want.logits
    assert type(got) is type(want)
    torch.testing.assert_close(got_logits, want_logits)


def test_output_hidden_states_through_forward_hooks():
    m = _model().eval()
    ids = _ids()
    with torch.no_grad():
        m(ids, output_hidden_states=True)  # the library installs its forward hooks (eagerly)
    _one_graph(m, ids, output_hidden_states=True)
    c = compile(m, backend="eager")
    with torch.no_grad():
        got, want = c(ids, output_hidden_states=True), m(ids, output_hidden_states=True)
        assert len(got.hidden_states) == len(want.hidden_states) == 3
        for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
            torch.testing.assert_close(a, b)
        assert c(ids).hidden_states is None  # hooks inactive without the flag


@pytest.mark.parametrize("backend", ["eager", _backend("aot_eager")])
def test_benchmark_inference_bf16_autocast(backend):
    m = _model().eval()
    ids = _ids()

    def gpt2_forward(input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return m(input_ids).logits

    _one_graph(gpt2_forward, ids)
    got, want = compile(gpt2_forward, backend=backend)(ids), gpt2_forward(ids)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(("backend", "dtype"), [
    ("eager", torch.bfloat16),
    pytest.param("aot_eager", torch.float32, marks=_backend("aot_eager").marks),
    pytest.param("aot_eager", torch.bfloat16, marks=_backend("aot_eager").marks)])
def test_benchmark_training_step(backend, dtype):
    m = _model().train()
    ref_model = copy.deepcopy(m)
    ids = _ids()

    def loss_of(model: torch.nn.Module):
        def gpt2_loss(input_ids: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not torch.float32):
                return model(input_ids, labels=input_ids).loss
        return gpt2_loss

    _one_graph(loss_of(copy.deepcopy(m)), ids)
    loss = compile(loss_of(m), backend=backend)(ids)
    loss.backward()
    ref = loss_of(ref_model)(ids)
    ref.backward()
    # bf16 autocast: a joint graph may round differently from eager's autograd
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype is torch.float32 else {"rtol": 2e-2, "atol": 2e-3}
    torch.testing.assert_close(loss, ref, **tol)
    for (name, p), q in zip(m.named_parameters(), ref_model.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda s, n=name: f"{n}: {s}")


@pytest.mark.parametrize("backend", [_backend("aot_eager")])
def test_eager_attention_implementation(backend):
    m = _model(attn_implementation="eager").train()
    ref_model = copy.deepcopy(m)
    ids = _ids()

    def loss_of(model: torch.nn.Module):
        return lambda input_ids: model(input_ids, labels=input_ids).loss

    _one_graph(loss_of(copy.deepcopy(m)), ids)
    loss = compile(loss_of(m), backend=backend)(ids)
    loss.backward()
    ref = loss_of(ref_model)(ids)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for p, q in zip(m.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
