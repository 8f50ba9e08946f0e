"""Finding backends by name: entry points are scanned once per name and process."""

from __future__ import annotations

import pytest
from torchfuse.capture import backends
from torchfuse.capture.errors import BackendNotFound


def test_a_found_backend_is_not_looked_up_again(monkeypatch):
    monkeypatch.setattr(backends, "_FOUND", {})
    first = backends.lookup_backend("eager")
    assert first is backends.eager

    def no_scan(**kwargs):
        raise AssertionError("entry points scanned again")

    monkeypatch.setattr(backends, "entry_points", no_scan)
    assert backends.lookup_backend("eager") is first


def test_a_missing_backend_is_looked_up_each_time(monkeypatch):
    monkeypatch.setattr(backends, "_FOUND", {})
    scans = []
    real = backends.entry_points

    def counting(**kwargs):
        scans.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(backends, "entry_points", counting)
    for _ in range(2):
        with pytest.raises(BackendNotFound, match="no torchfuse backend named 'nope'"):
            backends.lookup_backend("nope")
    assert len(scans) >= 2  # not cached: installing it later must work


def test_mode_and_options_reach_a_backend_that_takes_them():
    import torch
    import torchfuse.capture as tfc
    from torchfuse.graph.interpreter import Interpreter

    seen = []

    def backend(graph, examples, *, mode="default", options=None):
        seen.append((mode, options))
        return Interpreter(graph).run

    f = tfc.compile(lambda x: x * 2, backend=backend, mode="max-autotune", options={"k": 1})
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    assert seen == [("max-autotune", {"k": 1})]


def test_a_backend_without_mode_gets_none_and_a_warning():
    import torch
    import torchfuse.capture as tfc
    from torchfuse.graph.interpreter import Interpreter

    def backend(graph, examples):
        return Interpreter(graph).run

    f = tfc.compile(lambda x: x + 1, backend=backend, mode="reduce-overhead")
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="takes no mode; ignoring mode='reduce-overhead'"):
        torch.testing.assert_close(f(x), x + 1)
