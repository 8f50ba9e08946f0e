"""Layering rules of the monorepo, checked by parsing every package's source with ``ast``.

The rules (see ``docs/architecture.md``):

- ``torchfuse`` is a namespace package: no ``torchfuse/__init__.py`` in any package.
- A package imports only the torchfuse packages it declares as dependencies in its
  ``pyproject.toml`` (capture reaches backends by entry-point name, never by import).
- graph imports no other torchfuse package; autograd, inductor and runtime never import
  capture; runtime never imports inductor or autograd.
- Dependencies between torchfuse packages are version ranges, never exact pins.
- Package sources never use the torch internals the design rules out.
- Inside a package, modules import each other without cycles, except the declared cores
  (:data:`DECLARED_CYCLES`).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graph", "capture", "autograd", "inductor", "runtime")

# Imports that the architecture forbids outright, whatever pyproject.toml says.
FORBIDDEN_EDGES = {
    "graph": {"capture", "autograd", "inductor", "runtime"},
    "autograd": {"capture"},
    "inductor": {"capture"},
    "runtime": {"capture", "inductor", "autograd"},
}

# torch internals that package code must not use (tests and benchmarks may).
FORBIDDEN_TORCH = (
    "torch._dynamo", "torch._inductor", "torch._functorch", "torch._decomp", "torch._refs",
    "torch._prims", "torch._subclasses", "torch.fx.experimental", "torch.export", "torch.compile",
)


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names, relative imports included."""
    if not node.level:
        return node.module or ""
    base = current.split(".")
    # A module's relative imports start from its package; a package's from itself.
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, node.module] if node.module else base)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def referenced_modules(source: str, current: str = "", is_package: bool = False) -> set[str]:
    """Every module imported by ``source``, plus ``torch.*`` attribute chains it uses.

    ``from torchfuse import graph`` counts as ``torchfuse.graph``.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(node, current, is_package)
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Attribute):
            chain = dotted(node)
            if chain and chain.startswith("torch."):
                found.add(chain)
    return found


def torchfuse_packages(modules: set[str]) -> set[str]:
    return {m.split(".")[1] for m in modules if m.startswith("torchfuse.") and len(m.split(".")) > 1}


def package_sources(name: str) -> list[tuple[Path, str, bool]]:
    src = ROOT / "packages" / name / "src"
    return [(p, module_name(p, src), p.name == "__init__.py") for p in sorted(src.rglob("*.py"))]


def imports_of(name: str) -> dict[str, set[str]]:
    """torchfuse packages imported by each source file of package ``name``."""
    out = {}
    for path, mod, is_pkg in package_sources(name):
        used = torchfuse_packages(referenced_modules(path.read_text(), mod, is_pkg)) - {name}
        if used:
            out[str(path.relative_to(ROOT))] = used
    return out


def declared_dependencies(name: str) -> dict[str, str]:
    """torchfuse dependencies in ``pyproject.toml``: package name -> requirement string."""
    meta = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
    deps = {}
    for req in meta["project"].get("dependencies", []):
        m = re.match(r"torchfuse-([a-z]+)", req)
        if m:
            deps[m.group(1)] = req
    return deps


# ----------------------------------------------------------------------------- the checker itself


def test_referenced_modules_sees_every_import_form():
    source = (
        "import torchfuse.graph.schema\n"
        "from torchfuse import runtime\n"
        "from torchfuse.inductor.ir import Loop\n"
        "from . import sibling\n"
        "from ..autograd import joint\n"
        "def f():\n"
        "    import torchfuse.capture as cap\n"
        "    return torch._dynamo.reset()\n"
    )
    mods = referenced_modules(source, "torchfuse.x.mod", is_package=False)
    assert torchfuse_packages(mods) == {"graph", "runtime", "inductor", "x", "autograd", "capture"}
    assert "torchfuse.x.sibling" in mods
    assert "torch._dynamo.reset" in mods


def test_relative_import_in_package_init_resolves_from_the_package():
    mods = referenced_modules("from .schema import Graph\n", "torchfuse.graph", is_package=True)
    assert "torchfuse.graph.schema" in mods


# ----------------------------------------------------------------------------- the rules


def test_every_package_has_its_sources():
    for name in PACKAGES:
        assert (ROOT / "packages" / name / "src" / "torchfuse" / name / "__about__.py").is_file(), name


def test_torchfuse_is_a_namespace_package():
    offenders = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "packages").rglob("torchfuse/__init__.py"))
    assert not offenders, f"torchfuse must stay a PEP 420 namespace package; remove {offenders}"


@pytest.mark.parametrize("name", PACKAGES)
def test_imports_stay_within_declared_dependencies(name):
    allowed = set(declared_dependencies(name))
    bad = {f: sorted(used - allowed) for f, used in imports_of(name).items() if used - allowed}
    assert not bad, (
        f"torchfuse-{name} imports packages it does not declare in pyproject.toml "
        f"(declared: {sorted(allowed)}): {bad}"
    )


@pytest.mark.parametrize("name", sorted(FORBIDDEN_EDGES))
def test_architecture_forbids_these_imports(name):
    forbidden = FORBIDDEN_EDGES[name]
    bad = {f: sorted(used & forbidden) for f, used in imports_of(name).items() if used & forbidden}
    assert not bad, f"torchfuse-{name} must never import {sorted(forbidden)}: {bad}"
    declared = set(declared_dependencies(name)) & forbidden
    assert not declared, f"torchfuse-{name} must not depend on {sorted(declared)}"


@pytest.mark.parametrize("name", PACKAGES)
def test_dependencies_between_packages_are_ranges(name):
    for dep, req in declared_dependencies(name).items():
        assert "==" not in req and "===" not in req, f"torchfuse-{name}: pin on torchfuse-{dep} ({req!r})"
        assert re.search(r"[<>~]", req), f"torchfuse-{name}: give torchfuse-{dep} a version range ({req!r})"


@pytest.mark.parametrize("name", PACKAGES)
def test_no_forbidden_torch_internals(name):
    bad = {}
    for path, mod, is_pkg in package_sources(name):
        used = referenced_modules(path.read_text(), mod, is_pkg)
        hits = sorted(m for m in used for f in FORBIDDEN_TORCH if m == f or m.startswith(f + "."))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"torch internals not allowed inside packages/: {bad}"


# ----------------------------------------------------------------------------- cycles inside a package

DECLARED_CYCLES: dict[str, tuple[frozenset[str], ...]] = {
    "capture": (
        # The interpreter core is eval/apply: Frame.run -> DISPATCH -> ops.calls.call ->
        # calls.call -> inline -> Frame.run, as in Dynamo and Thunder (one file there).
        # ``compiler`` and ``convert`` (the front door) are pulled in by ``calls`` unwrapping
        # compile-inside-compile: allowed for now, and to be cut (REVIEW.md §2).
        frozenset({"attrs", "builtins", "calls", "compiler", "convert", "frame", "methods", "operators",
                   "ops", "ops.arith", "ops.build", "ops.calls", "ops.control", "ops.load_store",
                   "triton_kernels"}),
        # dynamic.py mixes the user API with capture-time binding (REVIEW.md §2): to be split.
        frozenset({"context", "dynamic", "values", "variables"}),
    ),
}
"""The only import cycles allowed inside a package (module names relative to the package). A
cycle may shrink or go; a new one, or a module joining one, fails the test."""


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (they never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and dotted(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def module_imports(name: str) -> dict[str, set[str]]:
    """Package ``name``'s modules (relative names) and the modules of the same package each
    imports at run time, function-level imports included (the package's ``__init__``, which
    every import runs anyway, left out)."""
    sources = package_sources(name)
    prefix = f"torchfuse.{name}"
    mods = {mod for _, mod, _ in sources}
    graph: dict[str, set[str]] = {}
    for path, mod, is_pkg in sources:
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = resolve(node, mod, is_pkg)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for m in names:
                while m and m not in mods:
                    m = m.rpartition(".")[0]
                if m and m not in (mod, prefix):
                    found.add(m)
        graph[mod.removeprefix(prefix + ".")] = {m.removeprefix(prefix + ".") for m in found}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_cycles_and_only_them():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [frozenset({"a", "b", "c"})]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nimport y\n")
    skipped = _type_checking_only(tree)
    assert [n.names[0].name for n in ast.walk(tree) if isinstance(n, ast.Import) and id(n) not in skipped] == ["y"]


@pytest.mark.parametrize("name", PACKAGES)
def test_no_import_cycle_inside_a_package_except_the_declared_ones(name):
    allowed = DECLARED_CYCLES.get(name, ())
    bad = [sorted(c) for c in import_cycles(module_imports(name)) if not any(c <= a for a in allowed)]
    assert not bad, (
        f"torchfuse-{name} has import cycles that invert its layering: {bad}. Point the "
        f"dependency one way (register into a table, or inject the function, as "
        f"aot(graph, fw_compiler, bw_compiler) does), or declare a real core in DECLARED_CYCLES."
    )
