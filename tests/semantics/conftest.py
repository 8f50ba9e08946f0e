"""pytest setup for the semantics suite: the backends every case runs on, helpers importable,
a fresh compile cache per test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torchfuse.capture import reset

sys.path.insert(0, str(Path(__file__).parent))

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(autouse=True)
def _fresh_cache():
    reset()
    yield
    reset()
