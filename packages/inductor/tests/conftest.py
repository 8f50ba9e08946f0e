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


@pytest.fixture(params=["triton", "cpp"])
def cpu_backend(request, use_cpu_backend):
    """Run a test once per CPU code generator: Triton (interpreted) and C++/OpenMP. Modules
    opt in with ``pytestmark = pytest.mark.usefixtures("cpu_backend")``; the other tests get
    the session's default (C++, see the root ``conftest.py``)."""
    if request.param == "cpp":
        from torchfuse.runtime.cpp import CompilerNotFoundError, find_compiler

        try:
            find_compiler()
        except CompilerNotFoundError as e:
            pytest.skip(str(e))
    use_cpu_backend(request.param)
    return request.param


@pytest.fixture
def triton_codegen_only(cpu_backend):
    """For a test under `cpu_backend` that pins Triton's generated code (grids, launch
    configs, block sizes, 32-bit index switches): the C++ kernels have none of these."""
    if cpu_backend != "triton":
        pytest.skip("pins the Triton kernel's code; the C++ path is checked by its values elsewhere")
