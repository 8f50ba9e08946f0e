"""Fixtures of the inductor tests: a private runtime cache per test, helpers on sys.path."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _runtime_cache(tmp_path_factory, monkeypatch):
    try:
        import torchfuse.runtime.config as rconfig
    except ImportError:  # the runtime is optional for most inductor tests
        return
    # Not under tmp_path: tests list what they write there (debug directories).
    path = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(path))
    if hasattr(rconfig.config, "cache_dir"):
        monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cache_dir=path))
