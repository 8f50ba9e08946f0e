"""Real ``torchvision`` models, captured whole and compared with eager.

Every model of :mod:`vision_zoo` (torchvision classes, random weights, 2 images of 32 x 32)
is compiled as a user would compile it, ``compile(model)``, through ``aot_eager`` (all of
them) and the default ``inductor`` backend (Triton kernels in the interpreter on the CPU;
the four models the issue names, to keep the suite's time small):

- **captured whole**: one graph and no eager fallback (its warning fails the test); no break
  (``explain``, once per model);
- **inference** (``eval()``, batch norm on running statistics): the logits equal eager's;
- **training** (``train()``, batch norm on batch statistics, running statistics updated): a
  cross-entropy step; the loss, every parameter's gradient and every batch norm's running
  statistics equal eager's.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torchfuse.capture import compile, explain
from torchfuse.capture.backends import list_backends
from torchfuse.capture.compiler import EagerFallbackWarning
from vision_zoo import CASES, CLASSES, VisionCase, build, images

torchvision = pytest.importorskip("torchvision")

INDUCTOR_MODELS = {"resnet18", "mobilenet_v3_small", "convnext", "vit"}


def _params():
    out = []
    for case in CASES:
        for backend in ("aot_eager", "inductor"):
            marks = []
            if backend not in list_backends():
                marks.append(pytest.mark.skip(reason=f"backend {backend} not installed"))
            elif backend == "inductor" and case.name not in INDUCTOR_MODELS:
                continue
            out.append(pytest.param(case, backend, id=f"{case.name}-{backend}", marks=marks))
    return out


PARAMS = _params()


def _whole(model: torch.nn.Module, x: torch.Tensor) -> None:
    e = explain(copy.deepcopy(model))(x)
    why = "\n".join(map(str, e.break_reasons))
    assert e.graph_count == 1 and e.graph_break_count == 0, why


def _compiled_call(model: torch.nn.Module, backend: str, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)  # a silent fallback fails here
        c = compile(model, backend=backend)
        out = c(x)
    assert c.graph_count() == 1
    return out


@pytest.mark.parametrize(("case", "backend"), PARAMS)
def test_inference_matches_eager(case: VisionCase, backend: str):
    model = build(case, torchvision.models).eval()
    x = images(case)
    if backend == "aot_eager":  # once per model: a second capture of the whole model
        _whole(model, x)
    with torch.no_grad():
        got = _compiled_call(model, backend, x)
        want = model(x)
    assert got.shape == want.shape == (2, CLASSES)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("case", "backend"), PARAMS)
def test_training_step_matches_eager(case: VisionCase, backend: str):
    model = build(case, torchvision.models).train()
    reference = copy.deepcopy(model)
    x, labels = images(case), torch.tensor([1, 3])
    loss = F.cross_entropy(_compiled_call(model, backend, x), labels)
    loss.backward()
    want = F.cross_entropy(reference(x), labels)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    grads = 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5,
                                       msg=lambda s, n=name: f"{n}: {s}")
            grads += 1
    assert grads > 0
    for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=lambda s, n=name: f"{n}: {s}")
