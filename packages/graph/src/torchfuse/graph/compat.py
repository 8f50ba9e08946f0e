"""Format versions and the upgraders that read older majors.

``FORMAT_VERSION = (major, minor)``. A reader accepts any minor of its own major (unknown
fields are ignored by the decoder) and rejects a newer major. Versions are compared as
tuples with ``<``/``>``, never with ``==``: a reader at 1.3 must accept 1.0 … 1.9.

A document of an older major is upgraded on its raw JSON dict, one major at a time, before
typed decoding: ``UPGRADERS[n]`` turns a major-``n`` document into a major-``n + 1`` one.
All names here are re-exported by `torchfuse.graph.versioning`, which also holds the
schema gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

FORMAT_NAME = "torchfuse.graph"
FORMAT_VERSION: tuple[int, int] = (1, 1)
"""The (major, minor) format version this package writes; it reads any minor of its major."""

OPSETS: dict[str, int] = {"aten": 1, "torchfuse": 2}
"""The newest opset of each namespace the format defines, as this reader knows them. A
document's ``opsets`` names, per namespace, the opset its ops need; custom namespaces (a
library's own ops) are written as 1 and not versioned by the format."""

OP_SINCE: dict[str, int] = {
    "torchfuse.set_grad_enabled": 1,
    "torchfuse.triton_kernel": 1,
    "torchfuse.custom_grad": 2,
    "torchfuse.checkpoint": 2,
    "torchfuse.after": 2,
}
"""The opset that introduced each op of the format's own ``torchfuse`` namespace (an op
missing here is from opset 1). Add a row, and bump `OPSETS`, when an op joins."""


def opset_needed(op: str) -> int:
    """The opset of its namespace that ``op`` (``ns.name.overload``) needs."""
    return OP_SINCE.get(".".join(op.split(".", 2)[:2]), 1)


def opsets_for(ops: Iterable[str], base: Mapping[str, int] | None = None) -> dict[str, int]:
    """``base`` with every namespace of ``ops`` raised to the opset its ops need: the smallest
    opsets a document holding ``ops`` can declare, so an older reader can still read it when
    it holds no newer op."""
    out = dict(base or {})
    for op in ops:
        ns = op.split(".", 1)[0]
        out[ns] = max(out.get(ns, 1), opset_needed(op))
    return out


def opset_problem(op: str, opsets: Mapping[str, int]) -> str | None:
    """Why ``op`` cannot be read under a document's ``opsets``, or None: its namespace is
    missing, declared newer than this reader knows, or declared older than the op."""
    ns = op.split(".", 1)[0]
    if ns not in opsets:
        return f"op namespace {ns!r} is not in the opsets {dict(opsets)}"
    declared = opsets[ns]
    if ns in OPSETS and (not isinstance(declared, int) or declared > OPSETS[ns]):
        return (f"the document declares {ns} opset {declared!r}, and this reader (torchfuse-graph) "
                f"knows {ns} opsets up to {OPSETS[ns]}; upgrade torchfuse-graph")
    if opset_needed(op) > declared:
        return (f"op {op!r} is in {ns} opset {opset_needed(op)}, but the document declares "
                f"{ns} opset {declared}")
    return None


RawDocument = dict[str, Any]
Upgrader = Callable[[RawDocument, str], RawDocument]
"""``upgrader(raw_document, kind) -> raw_document``; ``kind`` is ``"graph"`` or ``"program"``."""

UPGRADERS: dict[int, Upgrader] = {}
"""``UPGRADERS[n]`` upgrades a raw major-``n`` document to major ``n + 1``. The single table
of upgraders: add entries here, in this module, when a major bump lands."""


class FormatVersionError(ValueError):
    """A document whose version this reader cannot read (a newer major, or an older major
    without upgraders)."""


def _missing_upgraders(major: int) -> list[int]:
    return [m for m in range(major, FORMAT_VERSION[0]) if m not in UPGRADERS]


def check_version(name: Any, version: Any, *, source: str = "document") -> tuple[int, int]:
    """Validate a document's format name and version; returns the version as a tuple.

    Older majors are accepted when `UPGRADERS` can bring them to the current major
    (call `upgrade` on the raw document before decoding it).
    """
    if name != FORMAT_NAME:
        raise FormatVersionError(f"{source}: format {name!r} is not {FORMAT_NAME!r}")
    try:
        major, minor = (int(v) for v in version)
    except (TypeError, ValueError):
        raise FormatVersionError(f"{source}: unreadable format version {version!r}") from None
    if major > FORMAT_VERSION[0]:
        raise FormatVersionError(
            f"{source} was written with format version {major}.{minor}, but this reader "
            f"(torchfuse-graph) understands major version {FORMAT_VERSION[0]} "
            f"(up to {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}); upgrade torchfuse-graph"
        )
    if major < FORMAT_VERSION[0] and _missing_upgraders(major):
        raise FormatVersionError(
            f"{source} uses format version {major}.{minor}; no upgrader from major "
            f"{_missing_upgraders(major)[0]} to {_missing_upgraders(major)[0] + 1} is registered "
            f"(this reader is {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]})"
        )
    return major, minor


def upgrade(raw: RawDocument, version: tuple[int, int], kind: str = "graph") -> RawDocument:
    """Bring a raw (JSON-decoded, untyped) document of ``version`` to the current major."""
    major = version[0]
    missing = _missing_upgraders(major)
    if missing:
        raise FormatVersionError(
            f"no upgrader from major {missing[0]} to {missing[0] + 1} is registered "
            f"(document {version[0]}.{version[1]}, reader {FORMAT_VERSION[0]}.{FORMAT_VERSION[1]})"
        )
    for m in range(major, FORMAT_VERSION[0]):
        raw = UPGRADERS[m](raw, kind)
    return raw
