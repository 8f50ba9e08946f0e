"""What the documentation promises (issue #21).

- The README's and the home page's Python examples run as written, on a machine without a
  GPU, in a fresh process whose environment does not set ``TRITON_INTERPRET``.
- Every public name (each package's ``__all__``) has a docstring, and the examples in the
  public docstrings pass as doctests.
- The built site shows no raw Sphinx role (``:func:`` …) and no doctest rendered as a quote;
  ``mkdocs build --strict`` fails on an unresolved cross-reference.
"""

from __future__ import annotations

import doctest
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graph", "capture", "autograd", "inductor", "runtime")
RUNNABLE_PAGES = ("README.md", "docs/index.md", "docs/install.md")
RAW_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj|const|ref|py:\w+):`?")


def python_blocks(path: Path) -> list[str]:
    """The ```` ```python ```` blocks of a Markdown file, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_the_page_examples_run_as_written(page, tmp_path):
    blocks = python_blocks(ROOT / page)
    assert blocks or page == "docs/install.md", f"{page} has no Python example"
    # One process per page: a later block may use what an earlier one defined, as a reader would.
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TORCHFUSE_BACKEND")}
    env["TORCHFUSE_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{page}:\n{proc.stderr[-3000:]}"


def public_names(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(f"torchfuse.{package}")
    return [(name, getattr(module, name)) for name in module.__all__ if name != "__version__"]


def griffe_package(package: str):
    griffe = pytest.importorskip("griffe")
    paths = [str(ROOT / "packages" / p / "src") for p in PACKAGES]
    return griffe.load(f"torchfuse.{package}", search_paths=paths, resolve_aliases=True,
                       resolve_external=False)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_a_docstring(package):
    # griffe reads docstrings of data too (a constant's string after its assignment)
    tree = griffe_package(package)
    missing = []
    for name, _ in public_names(package):
        member = tree[name]
        doc = member.docstring.value.strip() if member.docstring else ""
        if not doc:
            missing.append(name)
    assert not missing, f"torchfuse.{package}: public names without a docstring: {missing}"


def _public_objects():
    for package in PACKAGES:
        for name, obj in public_names(package):
            if callable(obj) and getattr(obj, "__module__", "").startswith("torchfuse."):
                yield f"torchfuse.{package}.{name}", obj


@pytest.mark.slow
def test_public_docstring_examples_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    finder = doctest.DocTestFinder(recurse=True, exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for qualname, obj in _public_objects():
        # as doctest.testmod does: the examples see their module's globals
        module_globals = vars(sys.modules[obj.__module__])
        for test in finder.find(obj, qualname, globs=dict(module_globals)):
            if not test.examples:
                continue
            ran += 1
            runner.run(test)
    results = runner.summarize(verbose=False)
    assert ran >= 10, "the public API should show runnable examples"
    assert results.failed == 0, f"{results.failed} public docstring example(s) failed (see the output)"


@pytest.mark.slow
def test_built_site_has_no_raw_roles_or_quoted_doctests(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    problems = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(errors="replace")
        body = re.sub(r"<(script|style)\b.*?</\1>", "", text, flags=re.S)
        for m in RAW_ROLE.finditer(re.sub(r"<[^>]+>", "", body)):
            problems.append(f"{page.relative_to(site)}: raw role {m.group(0)!r}")
        if re.search(r"<blockquote>\s*(<blockquote>\s*)*<p>&gt;&gt;&gt;", body):
            problems.append(f"{page.relative_to(site)}: a doctest rendered as a quote")
        # an unresolved mkdocstrings cross-reference is left as its Markdown text
        for m in re.finditer(r"\]\[torchfuse\.[\w.]+\]", body):
            problems.append(f"{page.relative_to(site)}: unresolved cross-reference {m.group(0)}")
    assert not problems, "\n".join(problems[:50]) + f"\n({len(problems)} in all)"
