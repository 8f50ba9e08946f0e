"""A codegen backend from someone else's package replaces inductor, selected by name.

``examples/extern_backend`` is installed into a temporary directory the way a user would
install it (a real wheel, so its ``torchfuse.backends`` entry point exists), and fresh Python
processes with that directory on ``sys.path`` compile functions with
``torchfuse.capture.compile(fn, backend="extern")`` and run the example's own tests.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "extern_backend"

# Runs in a subprocess; every check compares with eager PyTorch or names what it expected.
SCRIPT = r'''
import sys
import torch
import torchfuse.capture
import torchfuse_example_extern as ext

target = sys.argv[1]
assert ext.__file__.startswith(target), f"imported {ext.__file__}, not the installed copy in {target}"
assert "extern" in torchfuse.capture.list_backends(), torchfuse.capture.list_backends()
assert torchfuse.capture.lookup_backend("extern") is ext.extern

# Count the graphs that go through the example's codegen, to know it really ran.
made = []
real_codegen = ext.codegen
ext.codegen = lambda graph, **kw: made.append(graph.name) or real_codegen(graph, **kw)


def f(x, w, b):
    h = torch.relu(x @ w + b)
    with torch.no_grad():
        scaled = h * 2
    return h.sum(dim=1), scaled, x


gen = torch.Generator().manual_seed(0)
x, w, b = (torch.randn(*s, generator=gen) for s in [(4, 8), (8, 3), (3,)])
compiled = torchfuse.capture.compile(f, backend="extern")
for args in [(x, w, b), (x + 1, w, b - 1)]:  # the second call reuses the compiled entry
    got, want = compiled(*args), f(*args)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    assert got[2] is args[0]  # an output that is an input comes back as the same tensor
assert len(made) == 1, made

# Gradients: the backend hands the graph to torchfuse.autograd.aot.
xg = x.clone().requires_grad_(True)
compiled(xg, w, b)[0].sum().backward()
xe = x.clone().requires_grad_(True)
f(xe, w, b)[0].sum().backward()
torch.testing.assert_close(xg.grad, xe.grad)
assert len(made) > 1, made  # forward (and backward) graphs of the recompile went through it
print("OK")
'''


def _pip_install(target: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check",
           "--target", str(target)]
    # Without isolation pip builds with the hatchling of this environment (no network); where
    # hatchling is missing, let pip fetch it into an isolated build environment.
    if importlib.util.find_spec("hatchling") is not None:
        cmd.append("--no-build-isolation")
    return subprocess.run([*cmd, str(EXAMPLE)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed example package (and its dist-info)."""
    target = tmp_path_factory.mktemp("extern_site")
    result = _pip_install(target)
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    assert (target / "torchfuse_example_extern" / "__init__.py").is_file()
    return target


def _run(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(site), env.get("PYTHONPATH", "")] if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_installed_backend_is_selected_by_name(site: Path, tmp_path: Path):
    result = _run(["-c", SCRIPT, str(site)], site, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "OK"


def test_example_package_own_tests_pass_when_installed(site: Path):
    result = _run(["-m", "pytest", str(EXAMPLE / "tests"), "-q", "-p", "no:cacheprovider"], site, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_docs_excerpts_are_the_real_code():
    """Every code block of docs/backends.md titled with a file's path is a verbatim excerpt of it."""
    text = (ROOT / "docs" / "backends.md").read_text()
    excerpts = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```$', text, flags=re.S | re.M)
    assert len(excerpts) >= 3
    for path, body in excerpts:
        assert body.strip() in (ROOT / path).read_text(), f"docs/backends.md quotes {path} inaccurately"
