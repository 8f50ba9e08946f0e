"""The format's version, the schema gate, and upgraders for older majors.

``FORMAT_VERSION = (major, minor)``. A reader accepts any minor of its own major (unknown
fields are ignored by the decoder) and rejects a newer major. Versions are compared as
tuples with ``<``/``>``, never with ``==``: a reader at 1.3 must accept 1.0 … 1.9.

**Schema gate.** The JSON Schema of [`Graph`][torchfuse.graph.schema.Graph] and
[`Program`][torchfuse.graph.schema.Program] is generated into the committed file
``format_schema.json``; ``format_schema.sha256.json`` next to it records the version it was
written for and the sha256 of the canonical schema. When the records change, the test suite
compares the committed schema with the generated one and says which bump is needed
(`required_bump`). Regenerate with::

    python -m torchfuse.graph.versioning --write

which refuses to write while ``FORMAT_VERSION`` lacks the bump the change needs.

**Upgraders.** A document of an older major is upgraded on its raw JSON dict, one major at
a time, before typed decoding: ``UPGRADERS[n]`` turns a major-``n`` document into a
major-``n + 1`` one. See ``docs/format.md`` for how to write one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec
from torchfuse.graph.compat import (
    FORMAT_NAME,
    FORMAT_VERSION,
    UPGRADERS,
    FormatVersionError,
    RawDocument,
    Upgrader,
    check_version,
    upgrade,
)

SCHEMA_PATH = Path(__file__).with_name("format_schema.json")
CHECKSUM_PATH = Path(__file__).with_name("format_schema.sha256.json")

Bump = Literal["none", "minor", "major"]

__all__ = [
    "CHECKSUM_PATH", "FORMAT_NAME", "FORMAT_VERSION", "SCHEMA_PATH", "UPGRADERS", "Bump",
    "FormatVersionError", "RawDocument", "SchemaGateError", "Upgrader", "check_schema",
    "check_version", "committed_schema", "generate_schema", "required_bump", "schema_changes",
    "upgrade", "write_schema",
]


# ----------------------------------------------------------------------------- schema gate


def generate_schema() -> dict[str, Any]:
    """The JSON Schema of Graph and Program, as msgspec generates it."""
    from torchfuse.graph import schema as S

    (graph_ref, program_ref), components = msgspec.json.schema_components((S.Graph, S.Program))
    return {"documents": {"graph": graph_ref, "program": program_ref}, "$defs": components}


def canonical_bytes(schema: dict[str, Any]) -> bytes:
    """Sorted-key, compact JSON: what the checksum is taken over."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()


def schema_sha256(schema: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(schema)).hexdigest()


_DOC_KEYS = ("description", "title", "examples")


def _strip_docs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_docs(v) for k, v in node.items() if k not in _DOC_KEYS}
    if isinstance(node, list):
        return [_strip_docs(v) for v in node]
    return node


def _key(node: Any) -> str:
    return json.dumps(node, sort_keys=True)


def _compare(old: Any, new: Any, path: str) -> Iterator[tuple[Bump, str]]:
    """Differences between two (doc-stripped) schema nodes, each with the bump it needs."""
    if _key(old) == _key(new):
        return
    if not (isinstance(old, dict) and isinstance(new, dict)):
        yield "major", f"{path}: changed from {_key(old)} to {_key(new)}"
        return
    if old.get("default", ...) != new.get("default", ...):
        yield "major", f"{path}: default changed from {old.get('default')!r} to {new.get('default')!r}"
    for union in ("anyOf", "oneOf", "enum"):
        if union in old or union in new:
            olds = {_key(m) for m in old.get(union, [old])}
            news = {_key(m) for m in new.get(union, [new])}
            if olds - news:
                yield "major", f"{path}: {union} members removed: {sorted(olds - news)}"
            elif news - olds:
                yield "minor", f"{path}: new {union} members: {sorted(news - olds)}"
            old_map = old.get("discriminator", {}).get("mapping", {})
            new_map = new.get("discriminator", {}).get("mapping", {})
            for tag in old_map.keys() & new_map.keys():
                if old_map[tag] != new_map[tag]:
                    yield "major", f"{path}: tag {tag!r} now means {new_map[tag]}"
            return
    if old.get("type") != new.get("type"):
        yield "major", f"{path}: type changed from {old.get('type')!r} to {new.get('type')!r}"
        return
    if "properties" in old or "properties" in new:
        oprops, nprops = old.get("properties", {}), new.get("properties", {})
        oreq, nreq = set(old.get("required", [])), set(new.get("required", []))
        for name in oprops.keys() - nprops.keys():
            yield "major", f"{path}.{name}: field removed"
        for name in nprops.keys() - oprops.keys():
            if name in nreq:
                yield "major", f"{path}.{name}: new required field (give it a default)"
            else:
                yield "minor", f"{path}.{name}: new field with a default"
        for name in oprops.keys() & nprops.keys():
            yield from _compare(oprops[name], nprops[name], f"{path}.{name}")
            if name in nreq and name not in oreq:
                yield "major", f"{path}.{name}: became required"
            elif name in oreq and name not in nreq:
                yield "minor", f"{path}.{name}: became optional"
    rest = ("properties", "required", "default", "type")
    for key in (old.keys() | new.keys()) - set(rest):
        if key in ("items", "additionalProperties"):
            yield from _compare(old.get(key), new.get(key), f"{path}[{key}]")
        elif key == "prefixItems":
            oi, ni = old.get(key, []), new.get(key, [])
            if len(oi) != len(ni):
                yield "major", f"{path}: tuple length changed from {len(oi)} to {len(ni)}"
            for i, (a, b) in enumerate(zip(oi, ni, strict=False)):
                yield from _compare(a, b, f"{path}[{i}]")
        elif _key(old.get(key)) != _key(new.get(key)):
            yield "major", f"{path}: {key} changed from {old.get(key)!r} to {new.get(key)!r}"


def schema_changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[Bump, str]]:
    """Every difference between two generated schemas with the bump each one needs.

    Documentation-only changes (docstrings become ``description``) need no bump.
    """
    old, new = _strip_docs(old), _strip_docs(new)
    out: list[tuple[Bump, str]] = []
    out.extend(_compare(old.get("documents", {}), new.get("documents", {}), "documents"))
    odefs, ndefs = old.get("$defs", {}), new.get("$defs", {})
    for name in sorted(odefs.keys() - ndefs.keys()):
        out.append(("major", f"{name}: record removed"))
    for name in sorted(ndefs.keys() - odefs.keys()):
        out.append(("minor", f"{name}: new record"))
    for name in sorted(odefs.keys() & ndefs.keys()):
        out.extend(_compare(odefs[name], ndefs[name], name))
    return out


def required_bump(old: dict[str, Any], new: dict[str, Any]) -> Bump:
    """``"major"``, ``"minor"`` or ``"none"``: the bump going from ``old`` to ``new`` needs."""
    levels = {bump for bump, _ in schema_changes(old, new)}
    return "major" if "major" in levels else "minor" if "minor" in levels else "none"


def _bumped(recorded: tuple[int, int], current: tuple[int, int], bump: Bump) -> bool:
    if bump == "major":
        return current[0] > recorded[0]
    if bump == "minor":
        return current > recorded
    return current >= recorded


def _next_version(recorded: tuple[int, int], bump: Bump) -> tuple[int, int]:
    return (recorded[0] + 1, 0) if bump == "major" else (recorded[0], recorded[1] + 1)


class SchemaGateError(AssertionError):
    """The records changed without the version bump the change needs."""


def check_schema(
    committed: dict[str, Any] | None = None,
    recorded: tuple[int, int] | None = None,
    generated: dict[str, Any] | None = None,
    current: tuple[int, int] | None = None,
) -> None:
    """Compare the committed schema with the generated one; raise `SchemaGateError`
    saying which bump (and which regeneration) is needed. Arguments default to the
    committed files, the live records and `FORMAT_VERSION`."""
    if committed is None or recorded is None:
        file_schema, file_version = committed_schema()
        committed = file_schema if committed is None else committed
        recorded = file_version if recorded is None else recorded
    generated = generate_schema() if generated is None else generated
    current = FORMAT_VERSION if current is None else current
    changes = schema_changes(committed, generated)
    bump = required_bump(committed, generated)
    if not _bumped(recorded, current, bump):
        want = _next_version(recorded, bump)
        lines = "\n".join(f"  [{b}] {msg}" for b, msg in changes)
        raise SchemaGateError(
            f"the format schema changed and needs a {bump.upper()} version bump: set "
            f"FORMAT_VERSION = {want} in torchfuse/graph/compat.py (it is {current}, the "
            f"committed schema is for {recorded}), then run "
            f"`python -m torchfuse.graph.versioning --write`. Changes:\n{lines}"
        )
    if canonical_bytes(committed) != canonical_bytes(generated) or recorded < current or current < recorded:
        raise SchemaGateError(
            f"format_schema.json is out of date (version {current}, committed for {recorded}; "
            f"needed bump: {bump}); run `python -m torchfuse.graph.versioning --write`"
        )


def committed_schema() -> tuple[dict[str, Any], tuple[int, int]]:
    """The committed schema and the version it records; checks the recorded sha256."""
    committed = json.loads(SCHEMA_PATH.read_text())
    checksum = json.loads(CHECKSUM_PATH.read_text())
    if schema_sha256(committed) != checksum["sha256"]:
        raise SchemaGateError(
            f"{SCHEMA_PATH.name} does not match the sha256 in {CHECKSUM_PATH.name} (edited by "
            "hand?); regenerate it with `python -m torchfuse.graph.versioning --write`"
        )
    major, minor = checksum["version"]
    return committed, (int(major), int(minor))


def write_schema() -> Path:
    """Regenerate ``format_schema.json`` and its checksum, refusing a change without its bump."""
    generated = generate_schema()
    if SCHEMA_PATH.exists() and CHECKSUM_PATH.exists():
        committed = json.loads(SCHEMA_PATH.read_text())
        major, minor = json.loads(CHECKSUM_PATH.read_text())["version"]
        recorded = (int(major), int(minor))
        bump = required_bump(committed, generated)
        if not _bumped(recorded, FORMAT_VERSION, bump):
            check_schema(committed, recorded, generated, FORMAT_VERSION)  # raises with details
    SCHEMA_PATH.write_text(json.dumps(generated, sort_keys=True, indent=1) + "\n")
    CHECKSUM_PATH.write_text(json.dumps(
        {"version": list(FORMAT_VERSION), "sha256": schema_sha256(generated)}, indent=1) + "\n")
    return SCHEMA_PATH


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchfuse.graph.versioning",
                                     description="Check or regenerate the committed format schema.")
    parser.add_argument("--write", action="store_true", help="regenerate format_schema.json")
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {write_schema()} for format version {FORMAT_VERSION}")
        return 0
    try:
        check_schema()
    except SchemaGateError as e:
        print(e)
        return 1
    print(f"format schema is up to date for version {FORMAT_VERSION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
