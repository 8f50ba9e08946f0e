"""pytest setup for the models suite: the model zoo importable, a fresh compile cache per test."""

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
