"""Archives: a Graph or Program, its tensors, and a manifest, in a directory or a ``.zip``.

Layout::

    manifest.json      format name and version, producer, opsets, document kind, content hash
    document.json      the Graph or Program, canonical JSON (sorted keys, no whitespace)
    tensors.safetensors  weights and constants by name (only when there are any)

Loading never unpickles: JSON is decoded into typed records by msgspec, tensors are read by
safetensors. A document whose major version is newer than this reader's raises
:class:`~torchfuse.graph.versioning.FormatVersionError`.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.versioning import FORMAT_NAME, FORMAT_VERSION, check_version

_DOC_TYPES: dict[str, type] = {"graph": S.Graph, "program": S.Program}
# A fixed timestamp makes zip archives byte-identical for identical contents.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


class ArchiveError(ValueError):
    """A path that is not a torchfuse archive, or one that is damaged."""


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: str = FORMAT_NAME
    version: tuple[int, int] = FORMAT_VERSION
    kind: str = "graph"
    producer: str = "torchfuse-graph"
    producer_version: str = ""
    opsets: dict[str, int] = {}
    content_hash: str = ""
    tensors: tuple[str, ...] = ()


@dataclass
class Archive:
    """What :func:`load_archive` returns: the document, its tensors and the manifest."""

    document: S.Graph | S.Program
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    manifest: Manifest | None = None


def _canonical(obj: object) -> bytes:
    # msgspec.json.encode with order="sorted" gives sorted keys; re-encoding is deterministic.
    return msgspec.json.encode(obj, order="sorted")


def to_json(doc: S.Graph | S.Program) -> bytes:
    """Canonical JSON bytes of a document (sorted keys, compact)."""
    return _canonical(doc)


def from_json(data: bytes | str, kind: str = "graph") -> S.Graph | S.Program:
    """Decode canonical JSON into a typed document, validating every field."""
    try:
        return msgspec.json.decode(data, type=_DOC_TYPES[kind])
    except msgspec.ValidationError as e:
        raise ArchiveError(f"invalid {kind} document: {e}") from e


def _producer() -> tuple[str, str]:
    from torchfuse.graph.__about__ import __version__

    return "torchfuse-graph", __version__


def _files(doc: S.Graph | S.Program, tensors: dict[str, torch.Tensor] | None,
           producer: tuple[str, str] | None) -> dict[str, bytes]:
    kind = "program" if isinstance(doc, S.Program) else "graph"
    body = to_json(doc)
    files = {"document.json": body}
    names: tuple[str, ...] = ()
    if tensors:
        from safetensors.torch import save as st_save

        cpu = {k: v.detach().to("cpu").contiguous() for k, v in sorted(tensors.items())}
        files["tensors.safetensors"] = st_save(cpu)
        names = tuple(cpu)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    prod, prod_version = producer or _producer()
    manifest = Manifest(kind=kind, producer=prod, producer_version=prod_version,
                        opsets=dict(doc.opsets), content_hash="sha256:" + digest.hexdigest(),
                        tensors=names)
    files["manifest.json"] = _canonical(manifest)
    return files


def save(doc: S.Graph | S.Program, path: str | Path, *, tensors: dict[str, torch.Tensor] | None = None,
         producer: tuple[str, str] | None = None) -> Path:
    """Write ``doc`` (and ``tensors``) as an archive: a ``.zip`` file if ``path`` ends in
    ``.zip``, else a directory. Returns the path written."""
    path = Path(path)
    files = _files(doc, tensors, producer)
    if path.suffix == ".zip":
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name in sorted(files):
                info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, files[name])
    else:
        path.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (path / name).write_bytes(data)
    return path


def _read_files(path: Path) -> dict[str, bytes]:
    if not path.exists():
        raise ArchiveError(f"no archive at {path}")
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    try:
        with zipfile.ZipFile(path) as zf:
            return {n: zf.read(n) for n in zf.namelist()}
    except zipfile.BadZipFile as e:
        raise ArchiveError(f"{path} is neither a directory nor a zip archive: {e}") from e


def load_archive(path: str | Path) -> Archive:
    """Read an archive: its document, tensors and manifest."""
    path = Path(path)
    files = _read_files(path)
    if "manifest.json" not in files or "document.json" not in files:
        raise ArchiveError(f"{path} is not a torchfuse archive (manifest.json or document.json missing)")
    try:
        raw_manifest = msgspec.json.decode(files["manifest.json"])
        check_version(raw_manifest.get("format"), raw_manifest.get("version"), source=str(path))
        manifest = msgspec.json.decode(files["manifest.json"], type=Manifest)
    except msgspec.DecodeError as e:
        raise ArchiveError(f"{path}: manifest.json is damaged: {e}") from e
    doc = from_json(files["document.json"], manifest.kind)
    tensors: dict[str, torch.Tensor] = {}
    if "tensors.safetensors" in files:
        from safetensors.torch import load as st_load

        tensors = st_load(files["tensors.safetensors"])
    return Archive(document=doc, tensors=tensors, manifest=manifest)


def load(path: str | Path) -> S.Graph | S.Program:
    """Read the document of an archive (see :func:`load_archive` for its tensors)."""
    return load_archive(path).document


def save_bytes(doc: S.Graph | S.Program, tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """The ``.zip`` archive of ``doc`` as bytes."""
    buf = io.BytesIO()
    files = _files(doc, tensors, None)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zf.writestr(zipfile.ZipInfo(name, date_time=_ZIP_DATE), files[name])
    return buf.getvalue()
