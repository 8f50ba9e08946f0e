"""Choosing the default backend: ``TORCHFUSE_BACKEND`` / ``config.default_backend``, a clear
error for an unknown name, and a name two packages register (issue #21)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torchfuse.capture as tfc
from torchfuse.capture import backends, config
from torchfuse.capture.config import from_environment
from torchfuse.capture.errors import AmbiguousBackend, BackendNotFound


def recording_backend(graph, example_inputs):
    """A backend importable as ``test_default_backend:recording_backend``."""
    from torchfuse.graph.interpreter import Interpreter

    recording_backend.graphs.append(graph.name)
    return Interpreter(graph).run


recording_backend.graphs = []


def test_the_environment_sets_the_default():
    assert from_environment({}).default_backend == "inductor"
    assert from_environment({"TORCHFUSE_BACKEND": " eager "}).default_backend == "eager"
    assert from_environment({"TORCHFUSE_BACKEND": ""}).default_backend == "inductor"


def test_compile_without_backend_uses_the_config():
    recording_backend.graphs.clear()
    with config.patch(default_backend=f"{__name__}:recording_backend"):
        f = tfc.compile(lambda x: x * 3)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x * 3)
    assert len(recording_backend.graphs) == 1
    # an explicit backend wins over the default
    with config.patch(default_backend="no-such-backend"):
        g = tfc.compile(lambda x: x - 1, backend="eager")
    torch.testing.assert_close(g(x), x - 1)


def test_an_unknown_default_fails_at_compile_and_says_where_it_came_from():
    with config.patch(default_backend="no-such-backend"):
        with pytest.raises(BackendNotFound, match=r"no torchfuse backend named 'no-such-backend' "
                                                  r"\(from config.default_backend / TORCHFUSE_BACKEND\)"
                                                  r".*available: .*eager"):
            tfc.compile(lambda x: x)


def test_an_entry_point_value_names_a_backend_directly(monkeypatch):
    monkeypatch.setattr(backends, "_FOUND", {})
    assert backends.lookup_backend(f"{__name__}:recording_backend") is recording_backend
    with pytest.raises(BackendNotFound, match="cannot import the backend 'no_such_module:f'"):
        backends.lookup_backend("no_such_module:f")
    with pytest.raises(BackendNotFound, match="is a int, not a callable"):
        backends.lookup_backend("sys:maxsize")


def test_a_name_two_packages_register_is_an_error_naming_both(monkeypatch):
    def ep(value, dist):
        return SimpleNamespace(name="fast", value=value, dist=SimpleNamespace(name=dist))

    both = [ep("pkg_a.backend:fast", "pkg-a"), ep("pkg_b.backend:fast", "pkg-b"),
            ep("pkg_b.backend:fast", "pkg-b")]  # the same one seen twice counts once
    monkeypatch.setattr(backends, "_FOUND", {})
    monkeypatch.setattr(backends, "entry_points", lambda **kw: both)
    with pytest.raises(AmbiguousBackend) as info:
        backends.lookup_backend("fast")
    message = str(info.value)
    assert "registered by 2 installed packages" in message
    assert "pkg-a (pkg_a.backend:fast)" in message and "pkg-b (pkg_b.backend:fast)" in message
    assert "backend='pkg_a.backend:fast'" in message
    assert isinstance(info.value, BackendNotFound)  # callers catching the old error still do


def test_torchfuse_backend_in_a_fresh_process(tmp_path):
    script = textwrap.dedent("""
        import torch, torchfuse.capture as tfc
        from torchfuse.capture import backends
        seen = []
        real = backends.lookup_backend
        backends.lookup_backend = lambda b, **kw: seen.append(b) or real(b, **kw)
        import torchfuse.capture.compiler as compiler
        compiler.lookup_backend = backends.lookup_backend
        f = tfc.compile(lambda x: x + 1)
        x = torch.randn(3)
        assert torch.equal(f(x), x + 1)
        print("backend", tfc.config.default_backend, seen[0])
    """)
    env = {**os.environ, "TORCHFUSE_BACKEND": "eager"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "backend eager eager"
    env["TORCHFUSE_BACKEND"] = "nope"
    bad = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode != 0
    assert "BackendNotFound: no torchfuse backend named 'nope' (from config.default_backend / " \
           "TORCHFUSE_BACKEND)" in bad.stderr
