"""Shared pytest setup for every package's tests and the root tests.

Triton kernels run on the CPU through the interpreter in CI, so ``TRITON_INTERPRET=1`` is set
before anything imports triton (unless a CUDA device is present and the variable is unset), and
PyPI's torchvision wheel is made importable next to a CPU-only torch (``scripts/torchvision_compat.py``).
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _torchvision_compat() -> None:
    """PyPI's torchvision wheel next to a CPU-only torch: define the operator schemas its
    import needs before anything (``transformers`` included) imports it (see the script)."""
    path = Path(__file__).parent / "scripts" / "torchvision_compat.py"
    spec = importlib.util.spec_from_file_location("torchvision_compat", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # it holds the library object that keeps the schemas alive
    spec.loader.exec_module(module)
    module.install()


_torchvision_compat()


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
