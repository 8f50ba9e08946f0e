"""An instance's attributes come from its class's MRO, never from the metaclass: an object has
no ``__name__`` even though its class has one (``type.__name__``). The pattern of the
``kernels`` package that transformers 5.25 wraps every layer's forward with:
``getattr(fn, "__name__", None) or getattr(fn, "kernel_layer_name", None)`` over an
``nn.Module`` instance."""

from __future__ import annotations

import pytest
import torch
from torchfuse.capture import compile as tf_compile
from torchfuse.capture import explain


class Kernel(torch.nn.Module):
    kernel_layer_name = "rms_norm"

    def forward(self, x):
        return x * 2


class Plain:
    label = "plain"


KERNEL, PLAIN = Kernel(), Plain()


def _named(x):
    name = getattr(KERNEL, "__name__", None) or getattr(KERNEL, "kernel_layer_name", None)
    return x + len(name)


def _plain(x):
    a = getattr(PLAIN, "__name__", "none")
    b = getattr(PLAIN, "__qualname__", "none")
    return x * len(a + b), hasattr(PLAIN, "__name__"), type(PLAIN).__name__


def _class_itself(x):
    return x - len(Kernel.__name__ + type(KERNEL).__qualname__)


@pytest.mark.parametrize("fn", [_named, _plain, _class_itself], ids=["module", "object", "class"])
def test_instance_has_no_metaclass_attributes(fn):
    x = torch.randn(3)
    e = explain(fn)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    got, want = tf_compile(fn, backend="eager")(x), fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w
