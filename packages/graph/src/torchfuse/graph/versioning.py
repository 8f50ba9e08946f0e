"""The format's version and the rule for reading other versions.

``FORMAT_VERSION = (major, minor)``. A reader accepts any minor of its own major (unknown
fields are ignored by the decoder) and rejects a newer major. Versions are compared as
tuples with ``<``/``>``, never with ``==``: a reader at 1.3 must accept 1.0 … 1.9.
"""

from __future__ import annotations

from typing import Any

FORMAT_NAME = "torchfuse.graph"
FORMAT_VERSION: tuple[int, int] = (1, 0)


class FormatVersionError(ValueError):
    """A document written by a newer (incompatible) major version of the format."""


def check_version(name: Any, version: Any, *, source: str = "document") -> tuple[int, int]:
    """Validate a document's format name and version; returns the version as a tuple."""
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
    if major < FORMAT_VERSION[0]:
        raise FormatVersionError(
            f"{source} uses format version {major}.{minor}; no upgrader from major {major} "
            f"to {FORMAT_VERSION[0]} is registered"
        )
    return major, minor
