"""Real ``transformers`` models, captured whole and compared with eager.

Every model of :mod:`zoo` (tiny configs of real architectures, random weights) is compiled
as a user would compile it, ``compile(model)``, and called with an attention mask that pads,
through the ``aot_eager`` backend and the default ``inductor`` backend (Triton kernels run in
the interpreter on the CPU):

- **captured whole**: one graph and no break, with every ``transformers`` from the GPU
  machine's 5.17 to the latest (5.17's ``if torch.rand([]) < self.layerdrop`` in training is
  decided by the draw's range, its ``maybe_autocast`` nullcontext is interpreted). An eager
  fallback fails the test, and so does the warning that announces one;
- **inference**: the logits equal eager's, and the output is the same class with the same keys;
- **training**: the loss, and the gradient of every parameter, equal eager's.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torchfuse.capture import compile, explain
from torchfuse.capture.backends import list_backends
from torchfuse.capture.compiler import EagerFallbackWarning
from zoo import CASES, ModelCase, build

transformers = pytest.importorskip("transformers")

BACKENDS = [pytest.param(b, marks=[] if b in list_backends() else
                         [pytest.mark.skip(reason=f"backend {b} not installed")])
            for b in ("aot_eager", "inductor")]
_IDS = [c.name for c in CASES]


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def _whole(model: torch.nn.Module, kwargs: dict) -> None:
    e = explain(copy.deepcopy(model))(**kwargs)
    why = "\n".join(map(str, e.break_reasons))
    assert e.graph_count == 1 and e.graph_break_count == 0, why


def _compiled_call(model: torch.nn.Module, backend: str, kwargs: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)  # a silent fallback fails here
        c = compile(model, backend=backend)
        out = c(**kwargs)
    assert c.graph_count() >= 1
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_inference_matches_eager(case: ModelCase, backend: str):
    model = build(case, transformers).eval()
    kwargs = case.inputs(False)
    _whole(model, kwargs)
    with torch.no_grad():
        got = _compiled_call(model, backend, kwargs)
        want = model(**kwargs)
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    torch.testing.assert_close(_logits(got), _logits(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_training_step_matches_eager(case: ModelCase, backend: str):
    model = build(case, transformers).train()
    reference = copy.deepcopy(model)
    kwargs = case.inputs(True)
    _whole(model, kwargs)
    loss = _compiled_call(model, backend, kwargs).loss
    loss.backward()
    want = reference(**kwargs).loss
    want.backward()
    assert loss.requires_grad and loss.dtype == want.dtype
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    grads = 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5,
                                   msg=lambda s, n=name: f"{n}: {s}")
        grads += 1
    assert grads > 0


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_export_roundtrip_matches_eager(case: ModelCase, tmp_path):
    """``export`` of the model in inference: the library's own bookkeeping (output collectors
    set and reset in the call) is no side effect of the exported graph; the archive, loaded
    again, runs on keyword inputs and gives eager's logits."""
    from torchfuse.capture import export
    from torchfuse.capture.export import Exported

    model = build(case, transformers).eval()
    kwargs = case.inputs(False)
    with torch.no_grad():
        exported = export(model, **kwargs)
        exported.save(tmp_path / "model.zip")
        got = Exported.load(tmp_path / "model.zip").run(**kwargs)
        want = model(**kwargs)
    assert isinstance(got, dict) and next(iter(got)) == next(iter(want.keys()))
    torch.testing.assert_close(got[next(iter(got))], _logits(want), rtol=1e-5, atol=1e-5)
