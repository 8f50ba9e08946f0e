"""Compiled modules behave as modules: hooks run as in eager, and the wrapper is a module."""

from __future__ import annotations

import torch
from semantics_helpers import compiled
from torch import nn


def _linear():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_forward_pre_hook(backend):
    lin = _linear()
    cm = compiled(lin, backend)
    x = torch.randn(4, 3)
    handle = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    torch.testing.assert_close(cm(x), lin(x))
    torch.testing.assert_close(cm(x), lin.bias.expand(4, 2))
    handle.remove()
    torch.testing.assert_close(cm(x), lin(x))


def test_forward_hook_and_kwargs_hook(backend):
    lin = _linear()
    cm = compiled(lin, backend)
    x = torch.randn(4, 3)
    h1 = lin.register_forward_hook(lambda m, args, out: out * 10)
    h2 = lin.register_forward_hook(lambda m, args, kwargs, out: out + 1, with_kwargs=True)
    torch.testing.assert_close(cm(x), lin(x))
    h1.remove()
    h2.remove()


def test_global_forward_hook(backend):
    lin = _linear()
    cm = compiled(lin, backend)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m)))
    try:
        cm(torch.randn(2, 3))
    finally:
        handle.remove()
    # the original's hook ran; the wrapper, a module too, is called as one (as torch.compile's)
    assert nn.Linear in seen


def test_backward_hook(backend):
    lin = _linear()
    cm = compiled(lin, backend)
    grads, ref = [], []
    handle = lin.register_full_backward_hook(lambda m, gi, go: grads.append(go[0].clone()))
    x = torch.randn(4, 3, requires_grad=True)
    cm(x).sum().backward()
    handle.remove()
    handle = lin.register_full_backward_hook(lambda m, gi, go: ref.append(go[0].clone()))
    lin(x).sum().backward()
    handle.remove()
    assert len(grads) == 1 and torch.equal(grads[0], ref[0])


def test_wrapper_is_a_module_in_traversals(backend):
    lin = _linear()
    cm = compiled(lin, backend)
    seq = nn.Sequential(cm)
    assert any(m is cm for m in seq.modules())
    names = dict(seq.named_modules())
    assert names["0"] is cm and names["0._orig_mod"] is lin
    assert list(seq.state_dict()) == ["0.weight", "0.bias"]
    assert seq.get_parameter("0.weight") is lin.weight
    assert cm.weight is lin.weight and cm.in_features == 3
    assert [p is q for p, q in zip(cm.parameters(), lin.parameters(), strict=True)]
