"""Archives: a Graph or Program, its tensors, and a manifest, in a directory or a ``.zip``.

Layout::

    manifest.json      format name and version, producer, opsets, document kind, content hash
    document.json      the Graph or Program, canonical JSON (sorted keys, no whitespace)
    tensors.safetensors  weights and constants by name (only when there are any)

An archive is data from a stranger (see "Trust model" in ``docs/format.md``). Loading never
unpickles and never runs code: JSON is decoded into typed records by msgspec, tensors are read
by safetensors. Only the three members above are read, each capped in size
(`ArchiveLimits`; a zip member by its declared size, its compression ratio and the
bytes actually inflated); in a directory, a member that is a symlink or not a regular file is
refused. The content hash is required (``check_hash=False`` loads an archive without one, or
with a wrong one). Stored weights of a Graph are checked against the value table of the input
that takes them. A document whose major version is newer than this reader's raises
[`FormatVersionError`][torchfuse.graph.versioning.FormatVersionError]; an older major is brought up to date
by the upgraders of [`torchfuse.graph.compat`][torchfuse.graph.compat] on its raw JSON before typed decoding.
Everything else wrong with an archive raises `ArchiveError`.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
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
    """A path that is not a torchfuse archive, or one that is damaged, over a size limit,
    incomplete, or whose stored tensors do not fit its Graph."""


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """Caps on what loading an archive reads (bytes after inflating). Pass one to
    `load_archive`, or replace `DEFAULT_LIMITS` for the whole process."""

    manifest_bytes: int = 1 << 20
    """``manifest.json``: 1 MiB."""
    document_bytes: int = 1 << 28
    """``document.json``: 256 MiB."""
    tensors_bytes: int = 1 << 35
    """``tensors.safetensors``: 32 GiB."""
    total_bytes: int = 1 << 35
    """All members together (and the size of a ``.zip`` file itself): 32 GiB."""
    zip_ratio: int = 100
    """A zip member larger than `zip_ratio_floor` may inflate to at most this many times
    its compressed size (weights compress about 1.1:1; a zip bomb 1000:1). Archives with large
    all-zero tensors can be saved as a directory instead, or loaded with a higher ratio."""
    zip_ratio_floor: int = 1 << 26
    """Members up to 64 MiB inflated are not ratio-checked."""
    list_depth: int = 32
    """The deepest nesting of list arguments in a document."""


DEFAULT_LIMITS = ArchiveLimits()
"""The limits `load_archive` applies when given none."""


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
    """What `load_archive` returns: the document, its tensors and the manifest."""

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
    """Write a Graph or Program (and its tensors) as an archive.

    Args:
        doc: The document: a [`Graph`][torchfuse.graph.Graph] or a
            [`Program`][torchfuse.graph.Program].
        path: A file name ending in ``.zip`` for a single-file archive, else a directory
            (files of an earlier archive in it that this one does not have are removed).
        tensors: Weights and constants, by name, written as safetensors.
        producer: ``(package, version)`` recorded in the manifest.

    Returns:
        The path written.

    Examples:
        >>> import tempfile, torch
        >>> from torchfuse.graph import load_archive, save, trace
        >>> graph, _ = trace(lambda x: x.relu(), torch.randn(2))
        >>> path = save(graph, tempfile.mkdtemp() + "/relu.zip")
        >>> [n.op for n in load_archive(path).document.nodes]
        ['aten.relu.default']
    """
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


def _member_cap(name: str, limits: ArchiveLimits) -> int:
    return {"manifest.json": limits.manifest_bytes, "document.json": limits.document_bytes,
            "tensors.safetensors": limits.tensors_bytes}[name]


class _Reader:
    """Reads named members of a directory or zip archive, each capped, the total capped."""

    def __init__(self, path: Path, limits: ArchiveLimits) -> None:
        self.path = path
        self.limits = limits
        self.total = 0
        self.zip: zipfile.ZipFile | None = None
        if not path.exists():
            raise ArchiveError(f"no archive at {path}")
        if path.is_dir():
            return
        if not path.is_file():
            raise ArchiveError(f"{path} is neither a directory nor a regular file")
        if path.stat().st_size > limits.total_bytes:
            raise ArchiveError(f"{path} is {path.stat().st_size} bytes, over the limit of "
                               f"{limits.total_bytes} (ArchiveLimits.total_bytes)")
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile as e:
            raise ArchiveError(f"{path} is neither a directory nor a readable zip archive: {e}") from e
        except (EOFError, OSError, ValueError) as e:
            raise ArchiveError(f"{path}: zip archive is damaged: {e}") from e

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()

    def has(self, name: str) -> bool:
        if self.zip is None:
            return os.path.lexists(self.path / name)
        return name in self.zip.NameToInfo

    def read(self, name: str) -> bytes:
        cap = min(_member_cap(name, self.limits), self.limits.total_bytes - self.total)
        data = self._read_zip(name, cap) if self.zip is not None else self._read_file(name, cap)
        self.total += len(data)
        return data

    def _over(self, name: str, size: int | str) -> ArchiveError:
        return ArchiveError(f"{self.path}: {name} is {size} bytes, over the limit of "
                            f"{_member_cap(name, self.limits)} (or the archive's total of "
                            f"{self.limits.total_bytes}); see ArchiveLimits")

    def _read_file(self, name: str, cap: int) -> bytes:
        member = self.path / name
        try:  # no symlinks (O_NOFOLLOW); a FIFO must not block the open (O_NONBLOCK)
            fd = os.open(member, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError as e:
            what = ("is a symlink, which archives may not contain" if member.is_symlink()
                    else f"cannot be read: {e}")
            raise ArchiveError(f"{self.path}: {name} {what}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ArchiveError(f"{self.path}: {name} is not a regular file")
            if st.st_size > cap:
                raise self._over(name, st.st_size)
            data = f.read(st.st_size + 1)  # no more than it said (a file growing meanwhile)
        if len(data) > cap:
            raise self._over(name, f"more than {cap}")
        return data

    def _read_zip(self, name: str, cap: int) -> bytes:
        assert self.zip is not None
        infos = [i for i in self.zip.infolist() if i.filename == name]
        if len(infos) != 1:
            raise ArchiveError(f"{self.path}: the zip archive holds {len(infos)} members named {name}")
        info = infos[0]
        if info.file_size > cap:
            raise self._over(name, info.file_size)
        limits = self.limits
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > limits.zip_ratio_floor and ratio > limits.zip_ratio:
            raise ArchiveError(
                f"{self.path}: {name} inflates {info.compress_size} bytes to {info.file_size}, more than "
                f"{limits.zip_ratio} times (ArchiveLimits.zip_ratio); a zip bomb, or all-zero data that "
                "is better saved as a directory")
        try:
            with self.zip.open(info) as f:  # zipfile stops at the declared size and checks the CRC
                chunks, size = [], 0
                while chunk := f.read(1 << 20):
                    size += len(chunk)
                    if size > cap:
                        raise self._over(name, f"more than {cap}")
                    chunks.append(chunk)
        except zipfile.BadZipFile as e:
            raise ArchiveError(f"{self.path}: zip member {name} is damaged: {e}") from e
        except (EOFError, OSError, zlib.error, RuntimeError, NotImplementedError, ValueError) as e:
            raise ArchiveError(f"{self.path}: zip member {name} cannot be read: {e}") from e
        return b"".join(chunks)


def _decode_document(data: bytes, kind: str, version: tuple[int, int], path: Path) -> S.Graph | S.Program:
    if version[0] >= FORMAT_VERSION[0]:
        try:
            return from_json(data, kind)
        except RecursionError:
            raise ArchiveError(f"{path}: document.json nests too deeply") from None
    try:
        raw = msgspec.json.decode(data)
    except RecursionError:
        raise ArchiveError(f"{path}: document.json nests too deeply") from None
    except msgspec.DecodeError as e:
        raise ArchiveError(f"{path}: document.json is not valid JSON: {e}") from e
    raw = upgrade(raw, version, kind)
    try:
        return msgspec.convert(raw, type=_DOC_TYPES[kind])
    except msgspec.ValidationError as e:
        raise ArchiveError(f"{path}: upgraded {kind} document is invalid: {e}") from e


def load_archive(path: str | Path, *, kind: str | None = None, check_hash: bool = True,
                 limits: ArchiveLimits | None = None) -> Archive:
    """Read an archive: its document, tensors and manifest.

    Reading never unpickles and never runs code from the archive. A Graph's stored weights
    are checked against its value table (`check_weights`).

    Args:
        path: The archive's directory or ``.zip`` file.
        kind: ``"graph"`` or ``"program"``: an archive holding the other kind is an
            `ArchiveError`. ``None`` accepts either.
        check_hash: Check the content hash, which must then be in the manifest and match.
            ``False`` skips the check.
        limits: Caps on what is read (default `DEFAULT_LIMITS`).

    Returns:
        An [`Archive`][torchfuse.graph.Archive] with the document (a Graph or a Program), its
        tensors and its manifest.

    Raises:
        ArchiveError: No archive there, a damaged or oversized file, the wrong kind, or a
            missing or mismatching content hash.
        FormatVersionError: A newer major format version than this package reads; the
            message names both versions.
    """
    path = Path(path)
    reader = _Reader(path, limits or DEFAULT_LIMITS)
    try:
        return _load(reader, path, kind, check_hash)
    finally:
        reader.close()


def _load(reader: _Reader, path: Path, kind: str | None, check_hash: bool) -> Archive:
    limits = reader.limits
    if not reader.has("manifest.json") or not reader.has("document.json"):
        raise ArchiveError(f"{path} is not a torchfuse archive (manifest.json or document.json missing)")
    try:
        raw_manifest = msgspec.json.decode(reader.read("manifest.json"))
    except (msgspec.DecodeError, RecursionError) as e:
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
    if kind is not None and manifest.kind != kind:
        raise ArchiveError(f"{path} holds a {manifest.kind}, not a {kind}")
    files = {"document.json": reader.read("document.json")}
    if manifest.tensors:
        if not reader.has("tensors.safetensors"):
            raise ArchiveError(f"{path}: the manifest names tensors but tensors.safetensors is missing")
        files["tensors.safetensors"] = reader.read("tensors.safetensors")
    if check_hash:
        if not manifest.content_hash:
            raise ArchiveError(f"{path}: manifest.json has no content_hash; load_archive(..., "
                               "check_hash=False) reads it without the integrity check")
        if manifest.content_hash != _content_hash(files):
            raise ArchiveError(f"{path}: content hash mismatch (the archive was modified or is damaged)")
    doc = _decode_document(files["document.json"], manifest.kind, version, path)
    depth = _list_depth(doc)
    if depth > limits.list_depth:
        raise ArchiveError(f"{path}: list arguments nest {depth} deep, more than {limits.list_depth} "
                           "(ArchiveLimits.list_depth)")
    tensors: dict[str, torch.Tensor] = {}
    if "tensors.safetensors" in files:
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        try:
            tensors = st_load(files["tensors.safetensors"])
        except (SafetensorError, ValueError, TypeError, RuntimeError, OverflowError) as e:
            raise ArchiveError(f"{path}: tensors.safetensors is damaged: {e}") from e
        if set(tensors) != set(manifest.tensors):
            raise ArchiveError(f"{path}: tensors.safetensors holds {sorted(tensors)}, the manifest names "
                               f"{sorted(manifest.tensors)}")
    if isinstance(doc, S.Graph):
        tensors = check_weights(doc, tensors, source=str(path))
    return Archive(document=doc, tensors=tensors, manifest=manifest)


def _list_depth(doc: S.Graph | S.Program) -> int:
    args: list[S.Argument] = []
    if isinstance(doc, S.Graph):
        for n in doc.nodes:
            args += [*n.args, *n.kwargs.values()]
        args += [o.value for o in doc.outputs]
    else:
        for st in doc.steps:
            if isinstance(st, S.LaunchStep | S.ExternStep):
                args += list(st.args)
            if isinstance(st, S.ExternStep):
                args += list(st.kwargs.values())
        args += list(doc.outputs)
    deepest, stack = 0, [(a, 0) for a in args]
    while stack:
        a, d = stack.pop()
        if isinstance(a, S.ListArg):
            deepest = max(deepest, d + 1)
            if deepest > 10_000:
                break
            stack += [(x, d + 1) for x in a.items]
    return deepest


_WEIGHT_KINDS = ("parameter", "buffer", "constant")


def _stored(graph: S.Graph, tensors: dict[str, torch.Tensor], inp: S.GraphInput) -> str | None:
    if inp.name in tensors:
        return inp.name
    return inp.target if inp.target is not None and inp.target in tensors else None


def check_weights(graph: S.Graph, tensors: dict[str, torch.Tensor], *, source: str = "archive"
                  ) -> dict[str, torch.Tensor]:
    """``tensors`` with each weight checked against the Graph input that takes it.

    A weight is the tensor stored under a ``parameter``/``buffer``/``constant`` input's name
    (or else its ``target``). Its dtype and sizes must be the input's (symbols at their
    hints); a weight whose planned strides are another dense layout is given that layout (a
    safetensors file stores every tensor contiguous). Raises `ArchiveError` naming the
    input. Weights that are missing are `bind_weights`' business."""
    from torchfuse.graph.expr import ExprError, evaluate
    from torchfuse.graph.ops import dtype_name

    hints = {s.name: s.hint for s in graph.symbols if s.hint is not None}
    out = dict(tensors)
    for inp in graph.inputs:
        key = _stored(graph, tensors, inp)
        meta = graph.values.get(inp.name)
        if inp.kind not in _WEIGHT_KINDS or key is None or meta is None:
            continue
        t = tensors[key]
        try:
            sizes = tuple(evaluate(e, hints) for e in meta.sizes)
            strides = tuple(evaluate(e, hints) for e in meta.strides)
        except ExprError:
            continue  # a size without a hint: checked when the graph runs
        what = f"{source}: stored tensor {key!r} for {inp.kind} input {inp.name!r}"
        if dtype_name(t.dtype) != meta.dtype:
            raise ArchiveError(f"{what} has dtype {dtype_name(t.dtype)}, the graph declares {meta.dtype}")
        if tuple(t.shape) != sizes:
            raise ArchiveError(f"{what} has shape {list(t.shape)}, the graph declares {list(sizes)}")
        if strides != tuple(t.stride()) and _dense(sizes, strides):
            laid = torch.empty_strided(sizes, strides, dtype=t.dtype)
            laid.copy_(t)
            out[key] = laid
    return out


def _dense(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether ``strides`` lay ``sizes`` out without gaps or overlap (some permutation)."""
    if len(sizes) != len(strides) or any(s < 0 for s in strides):
        return False
    expected = 1
    for size, stride in sorted(zip(sizes, strides, strict=True), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def bind_weights(graph: S.Graph, tensors: dict[str, torch.Tensor], *, source: str = "archive"
                 ) -> dict[str, torch.Tensor]:
    """The weights of every ``parameter``/``buffer``/``constant`` input of ``graph``, by input
    name, checked (`check_weights`); a missing one is an `ArchiveError` naming it."""
    checked = check_weights(graph, tensors, source=source)
    out: dict[str, torch.Tensor] = {}
    for inp in graph.inputs:
        if inp.kind not in _WEIGHT_KINDS:
            continue
        key = _stored(graph, checked, inp)
        if key is None:
            target = f" (target {inp.target!r})" if inp.target else ""
            raise ArchiveError(f"{source}: no stored tensor for {inp.kind} input {inp.name!r}{target}")
        out[inp.name] = checked[key]
    return out


def load(path: str | Path, *, kind: str | None = None, check_hash: bool = True,
         limits: ArchiveLimits | None = None) -> S.Graph | S.Program:
    """Read the document of an archive, without its tensors.

    Args:
        path: The archive's directory or ``.zip`` file.
        kind: ``"graph"`` or ``"program"``: an archive holding the other kind is an error.
        check_hash: False skips the content hash check.
        limits: Caps on what is read (default ``DEFAULT_LIMITS``).

    Returns:
        The Graph or Program it holds (see [`load_archive`][torchfuse.graph.load_archive] for
        its tensors and manifest too).

    Raises:
        ArchiveError: As [`load_archive`][torchfuse.graph.load_archive].
        FormatVersionError: As [`load_archive`][torchfuse.graph.load_archive].
    """
    return load_archive(path, kind=kind, check_hash=check_hash, limits=limits).document


def save_bytes(doc: S.Graph | S.Program, tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """The ``.zip`` archive of ``doc`` as bytes (the same bytes `save` writes)."""
    return _zip_bytes(_files(doc, tensors, None))
