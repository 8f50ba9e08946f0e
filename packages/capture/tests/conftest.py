"""pytest setup for the capture tests: a fresh compile cache per test, helpers importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torchfuse.capture import reset

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)

def _fresh_cache():
    reset()
    yield
    reset()
