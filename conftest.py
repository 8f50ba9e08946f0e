"""Shared pytest setup for every package's tests and the root tests.

Which kernels a CPU graph gets in the tests:

* C++/OpenMP by default: ``TORCHFUSE_CPU_BACKEND=cpp`` is set for the session (the tests of
  CPU behaviour run what CPU users run). Set ``TORCHFUSE_CPU_BACKEND=triton`` yourself to run
  the whole suite on the Triton path instead.
* Triton, run by its interpreter, for a test marked ``@pytest.mark.triton_cpu``: the tests of
  the Triton code generator itself (snapshots, launch configs, user ``@triton.jit`` kernels).
  ``TRITON_INTERPRET=1`` is set before anything imports triton (unless a CUDA device is present
  and the variable is unset), so the interpreter is there for them, and for the user Triton
  kernels a C++ Program may launch.

PyPI's torchvision wheel is made importable next to a CPU-only torch
(``scripts/torchvision_compat.py``).
"""

import dataclasses
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
# before torchfuse.inductor.config reads the environment (at its import)
os.environ.setdefault("TORCHFUSE_CPU_BACKEND", "cpp")
# the suite's captures must not depend on what an earlier run left in the user's cache, nor
# write there at exit; the store's own tests turn it on with a directory of their own
os.environ.setdefault("TORCHFUSE_META_MEMO_DISK", "0")
# likewise the kept captured entries (torchfuse.capture.entry_cache): its tests, and the
# second-process tests, turn it on over a directory of their own
os.environ.setdefault("TORCHFUSE_CAPTURE_CACHE", "0")


def _use_cpu_backend(monkeypatch, name: str) -> None:
    import torchfuse.inductor.backend as backend
    import torchfuse.inductor.compile as compile_mod

    cfg = dataclasses.replace(compile_mod.default_config, cpu_backend=name)
    monkeypatch.setattr(compile_mod, "default_config", cfg)
    monkeypatch.setattr(backend, "default_config", cfg)
    monkeypatch.setenv("TORCHFUSE_CPU_BACKEND", name)


@pytest.fixture
def use_cpu_backend(monkeypatch):
    """``use_cpu_backend("cpp" | "triton")``: compile this test's CPU graphs with that code
    generator, in this process and in the subprocesses it starts."""
    return lambda name: _use_cpu_backend(monkeypatch, name)


@pytest.fixture
def counted_lowering(monkeypatch):
    """The runs of inductor's lowering pass, one list item each (what a cache hit must skip)."""
    from torchfuse.inductor import cache
    from torchfuse.inductor import compile as compile_module

    calls = []
    real = compile_module.lower

    def lower(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_module, "lower", lower)
    cache.stats.reset()
    return calls


@pytest.fixture(autouse=True)
def _triton_cpu(request, monkeypatch):
    """``@pytest.mark.triton_cpu``: this test's CPU graphs get Triton kernels (interpreted)."""
    if request.node.get_closest_marker("triton_cpu") is not None:
        _use_cpu_backend(monkeypatch, "triton")


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
