"""Archives: a Graph or Program, its tensors, and a manifest, in a directory or a ``.zip``.

Layout::

    manifest.json      format name and version, producer, opsets, document kind, content hash
    document.json      the Graph or Program, canonical JSON (sorted keys, no whitespace)
    tensors.safetensors  weights and constants by name (only when there are any)

Loading never unpickles: JSON is decoded into typed records by msgspec, tensors are read by
safetensors. A document whose major version is newer than this reader's raises
:class:`~torchfuse.graph.versioning.FormatVersionError`; an older major is brought up to date
by the upgraders of :mod:`torchfuse.graph.compat` on its raw JSON before typed decoding. A
damaged archive (truncated zip, missing or malformed file, content hash mismatch) raises
:class:`ArchiveError`.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.compat import FORMAT_NAME, FORMAT_VERSION, check_version, upgrade

_DOC_TYPES: dict[str, type] = {"graph": S.Graph, "program": S.Program}
# A fixed timestamp makes zip archives byte-identical for identical contents.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_ARCHIVE_FILES = ("manifest.json", "document.json", "tensors.safetensors")


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
    if kind not in _DOC_TYPES:
        raise ArchiveError(f"unknown document kind {kind!r} (expected one of {sorted(_DOC_TYPES)})")
    try:
        return msgspec.json.decode(data, type=_DOC_TYPES[kind])
    except msgspec.ValidationError as e:
        raise ArchiveError(f"invalid {kind} document: {e}") from e
    except msgspec.DecodeError as e:
        raise ArchiveError(f"{kind} document is not valid JSON: {e}") from e


def _content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        if name in ("document.json", "tensors.safetensors"):
            digest.update(name.encode() + b"\0" + files[name])
    return "sha256:" + digest.hexdigest()


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

        cpu: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for k, v in sorted(tensors.items()):
            v = v.detach().to("cpu").contiguous()
            # safetensors refuses tensors that share memory (tied weights): store copies
            ptr = v.untyped_storage().data_ptr()
            cpu[k] = v.clone() if ptr in seen and v.numel() else v
            seen.add(ptr)
        files["tensors.safetensors"] = st_save(cpu)
        names = tuple(cpu)
    prod, prod_version = producer or _producer()
    manifest = Manifest(kind=kind, producer=prod, producer_version=prod_version,
                        opsets=dict(doc.opsets), content_hash=_content_hash(files),
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
        path.write_bytes(_zip_bytes(files))
    else:
        path.mkdir(parents=True, exist_ok=True)
        for stale in _ARCHIVE_FILES:  # e.g. tensors of an earlier save into the same directory
            if stale not in files and (path / stale).is_file():
                (path / stale).unlink()
        for name, data in files.items():
            (path / name).write_bytes(data)
    return path


def _zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name])
    return buf.getvalue()


def _read_files(path: Path) -> dict[str, bytes]:
    if not path.exists():
        raise ArchiveError(f"no archive at {path}")
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    try:
        with zipfile.ZipFile(path) as zf:
            return {n: zf.read(n) for n in zf.namelist()}
    except zipfile.BadZipFile as e:
        raise ArchiveError(f"{path} is neither a directory nor a readable zip archive: {e}") from e
    except (EOFError, OSError, zlib.error) as e:  # truncated or corrupted member data
        raise ArchiveError(f"{path}: zip archive is damaged: {e}") from e


def _decode_document(data: bytes, kind: str, version: tuple[int, int], path: Path) -> S.Graph | S.Program:
    if version[0] >= FORMAT_VERSION[0]:
        return from_json(data, kind)
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise ArchiveError(f"{path}: document.json is not valid JSON: {e}") from e
    raw = upgrade(raw, version, kind)
    try:
        return msgspec.convert(raw, type=_DOC_TYPES[kind])
    except msgspec.ValidationError as e:
        raise ArchiveError(f"{path}: upgraded {kind} document is invalid: {e}") from e


def load_archive(path: str | Path) -> Archive:
    """Read an archive: its document, tensors and manifest."""
    path = Path(path)
    files = _read_files(path)
    if "manifest.json" not in files or "document.json" not in files:
        raise ArchiveError(f"{path} is not a torchfuse archive (manifest.json or document.json missing)")
    try:
        raw_manifest = msgspec.json.decode(files["manifest.json"])
    except msgspec.DecodeError as e:
        raise ArchiveError(f"{path}: manifest.json is damaged: {e}") from e
    if not isinstance(raw_manifest, dict):
        raise ArchiveError(f"{path}: manifest.json is not a JSON object")
    version = check_version(raw_manifest.get("format"), raw_manifest.get("version"), source=str(path))
    try:
        manifest = msgspec.convert(raw_manifest, type=Manifest)
    except msgspec.ValidationError as e:
        raise ArchiveError(f"{path}: manifest.json is invalid: {e}") from e
    if manifest.kind not in _DOC_TYPES:
        raise ArchiveError(f"{path}: unknown document kind {manifest.kind!r}")
    if manifest.content_hash and manifest.content_hash != _content_hash(files):
        raise ArchiveError(f"{path}: content hash mismatch (the archive was modified or is damaged)")
    doc = _decode_document(files["document.json"], manifest.kind, version, path)
    tensors: dict[str, torch.Tensor] = {}
    if "tensors.safetensors" in files:
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        try:
            tensors = st_load(files["tensors.safetensors"])
        except SafetensorError as e:
            raise ArchiveError(f"{path}: tensors.safetensors is damaged: {e}") from e
    return Archive(document=doc, tensors=tensors, manifest=manifest)


def load(path: str | Path) -> S.Graph | S.Program:
    """Read the document of an archive (see :func:`load_archive` for its tensors)."""
    return load_archive(path).document


def save_bytes(doc: S.Graph | S.Program, tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """The ``.zip`` archive of ``doc`` as bytes (the same bytes :func:`save` writes)."""
    return _zip_bytes(_files(doc, tensors, None))
