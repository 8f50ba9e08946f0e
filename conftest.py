"""Shared pytest setup for every package's tests and the root tests.

Triton kernels run on the CPU through the interpreter in CI, so ``TRITON_INTERPRET=1`` is set
before anything imports triton (unless a CUDA device is present and the variable is unset).
"""

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
