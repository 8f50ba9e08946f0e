"""Fixtures of the runtime tests: a private cache directory per test, the hand-written Programs,
and a stand-in autotuning benchmark."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test gets its own TORCHFUSE_CACHE_DIR (also for the subprocesses it starts)."""
    import torchfuse.runtime.config as rconfig

    path = tmp_path / "cache"
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(path))
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cache_dir=path))
    return path


@pytest.fixture
def bench(monkeypatch):
    """A benchmark that prefers XBLOCK=128 and really launches each candidate once; the list of
    the XBLOCKs it measured, in order."""
    import torchfuse.runtime.autotune as autotune

    seen = []

    def fake(kernel, cfg, launch):
        launch()
        seen.append(cfg.meta["XBLOCK"])
        return 1.0 if cfg.meta["XBLOCK"] == 128 else 5.0

    monkeypatch.setattr(autotune, "benchmark", fake)
    return seen
