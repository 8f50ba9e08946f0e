"""Fixtures of the runtime tests: a private cache directory per test, and the hand-written Programs."""

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
