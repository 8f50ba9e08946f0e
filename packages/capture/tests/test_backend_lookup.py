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
