"""pytest setup for the capture tests: a fresh compile cache per test, helpers importable."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from torchfuse.capture import reset
from torchfuse.graph import observe

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)

def _fresh_cache():
    reset()
    yield
    reset()


@pytest.fixture
def recompile_log(monkeypatch):
    """The messages of the ``recompiles`` log while the test runs (``TORCHFUSE_LOGS=recompiles``)."""
    records: list[str] = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("torchfuse.recompiles")
    h = H()
    monkeypatch.setenv("TORCHFUSE_LOGS", "recompiles")
    observe.reload_config()
    logger.addHandler(h)
    yield records
    logger.removeHandler(h)
    monkeypatch.delenv("TORCHFUSE_LOGS")
    observe.reload_config()
