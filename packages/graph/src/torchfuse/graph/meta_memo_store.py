"""The meta-kernel memo on disk: a fresh process answers the ops an earlier one met.

`torchfuse.graph.meta_memo` remembers, in process memory, what each op's meta kernel answered
for arguments of some metadata. A new process (a warm start that finds every compiled Program
on disk) still ran every meta kernel while capturing: 201 of Swin-T training's, 0.50 s of
capture in a fresh process on the CPU, 0.42 s with them answered from this file (median of
three processes each; the file's 716 records took 2.5 ms to read). `MemoStore` keeps the answers
in one file, ``<cache dir>/meta_memo/v<format>-torch<version>-graph<version>.msgpack`` (the
cache dir: ``TORCHFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchfuse`` or
``~/.cache/torchfuse``, as the runtime's caches).

What is kept, and why it stays right:

* Only ATen ops (``aten.*``): their meta kernels come with torch, whose version names the file,
  so another torch never reads these answers. A custom op's meta kernel is the user's code,
  which may change between two runs under the same name.
* The header holds a digest of torchfuse-graph's source: the layout fix-ups and device rules of
  the recorder (`torchfuse.graph.tracing`) are part of every answer, and a development checkout
  changes them without changing its version. A file of other sources is not read, and is
  replaced at the next save (a debug log line, not a warning: an upgrade does this).
* Keys are the memo's own (`torchfuse.graph.meta_memo.MetaMemo.key`), spelled in data: the op
  by its name (``aten.add.Tensor``), dtypes, devices, layouts and memory formats by name, each
  Python scalar with its type's name (``int`` 1 and ``float`` 1.0 promote differently), floats
  as hex. A key with anything else (an int beyond 64 bits, a type the memo describes but this
  file cannot name) is not kept. A lookup spells the asking call's key the same way and
  compares: nothing in the file is turned back into an op, so a file never names what runs.

The file is data from the user's own cache directory, and is read as such: decoded by msgspec
into the typed records below (no pickle, nothing evaluated), refused above `MAX_FILE_BYTES`,
at most the memo's capacity of records taken, each answer checked (a known dtype, as many
strides as sizes, no negative or overflowing size, a device torch parses, the container right
for the number of outputs) before it becomes fake tensors. A file that does not decode, or
names another version inside, is ignored with one warning naming it, and replaced at the next
save. Records are decoded once per process (a few microseconds each); a record becomes an
`Answer` only when a call asks for it.

This module knows nothing of `torchfuse.graph.meta_memo` (which imports it): it takes and gives
keys as the memo builds them and answers as the parts of its ``Entry``.

Saving merges what the file holds at that moment (another process may have written it since)
with what this process learned, keeps the newest ``capacity`` records, and replaces the file
atomically (a temporary file and ``os.replace``). A cache directory that cannot be written
costs the next process its warm answers, never this one its program: logged at debug level.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.__about__ import __version__
from torchfuse.graph.caches import cache_root, source_hash, write_atomic
from torchfuse.graph.layouts import storage_extent
from torchfuse.graph.ops import op_name, to_dtype, to_layout, to_memory_format

log = logging.getLogger(__name__)

RECORD_LAYOUT = 1
"""The layout of the records below; part of the file's name."""

MAX_FILE_BYTES = 64 << 20
"""A larger file is not read (the memo's 65536 records take a few MiB)."""

_MAX_DIMS = 64
_MAX_EXTENT = 1 << 62
_MAX_ITEMS = 1 << 16
_MAX_DEPTH = 8
"""Nesting of list arguments kept (ATen's deepest is a list of lists)."""

# ----------------------------------------------------------------------------- records

_Ints = Annotated[tuple[int, ...], msgspec.Meta(max_length=_MAX_DIMS)]


class _Tensor(msgspec.Struct, frozen=True, array_like=True, tag="t"):
    """A tensor argument: a fake's metadata, or a real tensor's (``real``, see `_arg_key`)."""

    real: bool
    dtype: str
    sizes: _Ints
    strides: _Ints
    offset: int
    device: str


class _Seq(msgspec.Struct, frozen=True, array_like=True, tag="s"):
    """A list or tuple argument."""

    is_list: bool
    items: Annotated[tuple[_Arg, ...], msgspec.Meta(max_length=_MAX_ITEMS)]


class _Scalar(msgspec.Struct, frozen=True, array_like=True, tag="v"):
    """Any other argument: the name of its Python type and its value, spelled as data."""

    kind: Literal["bool", "int", "float", "str", "none", "dtype", "device", "layout", "memory_format"]
    value: bool | int | str | None


_Arg = _Tensor | _Seq | _Scalar


class _Out(msgspec.Struct, frozen=True, array_like=True):
    """One output of a call (storage offset 0: the memo keeps no other)."""

    dtype: str
    sizes: _Ints
    strides: _Ints
    device: str
    requires_grad: bool


class _Record(msgspec.Struct, frozen=True, array_like=True):
    op: str
    args: Annotated[tuple[_Arg, ...], msgspec.Meta(max_length=_MAX_ITEMS)]
    kwargs: Annotated[tuple[tuple[str, _Arg], ...], msgspec.Meta(max_length=_MAX_ITEMS)]
    outs: Annotated[tuple[_Out, ...], msgspec.Meta(min_length=1, max_length=_MAX_ITEMS)]
    container: Literal["", "tuple", "list"]
    """``""``: the call returned one tensor."""


class _Header(msgspec.Struct, frozen=True):
    format: int
    torch: str
    graph: str
    code: str
    """A digest of torchfuse-graph's source (`source_digest`)."""


_RecordKey = tuple[str, tuple[_Arg, ...], tuple[tuple[str, _Arg], ...]]

Key = tuple[Any, ...]
"""A key of the memo: ``(op, args, kwargs)`` as `torchfuse.graph.meta_memo.MetaMemo.key` builds it."""
Answer = tuple[tuple[S.TensorMeta, ...], tuple[torch.device, ...], type | None]
"""What a call returned: the metadata and device of each output tensor, and its container
(``tuple`` or ``list``; None for one tensor): an ``Entry``'s parts."""

_FILE = msgspec.msgpack.Decoder(tuple[_Header, msgspec.Raw])
_RECORDS = msgspec.msgpack.Decoder(list[_Record])
_ENCODER = msgspec.msgpack.Encoder()

# ----------------------------------------------------------------------------- keys as data

_KINDS: dict[type, str] = {
    bool: "bool", int: "int", float: "float", str: "str", type(None): "none", torch.dtype: "dtype",
    torch.device: "device", torch.layout: "layout", torch.memory_format: "memory_format"}
_TYPES: dict[str, type] = {name: kind for kind, name in _KINDS.items()}
_INT64 = range(-(1 << 63), 1 << 63)
_names: dict[Any, str] = {}  # dtype, device, layout and memory format -> its name
_devices: dict[str, torch.device] = {}
_op_names: dict[torch._ops.OpOverload, str | None] = {}


class _NotKept(Exception):
    """A key or an answer this file cannot spell exactly."""


def _name(x: Any) -> str:
    name = _names.get(x)
    if name is None:
        name = _names[x] = str(x).removeprefix("torch.")
    return name


def _device(text: str) -> torch.device:
    device = _devices.get(text)
    if device is None:
        try:
            device = torch.device(text)
        except (RuntimeError, ValueError, TypeError) as e:
            raise _NotKept(f"device {text!r}") from e
        if str(device) != text:  # only the spelling `_name` writes
            raise _NotKept(f"device {text!r}")
        _devices[text] = device
    return device


def _ints(xs: Any) -> tuple[int, ...]:
    if type(xs) is not tuple or len(xs) > _MAX_DIMS or not all(type(x) is int and x in _INT64 for x in xs):
        raise _NotKept
    return xs


def _int(x: Any) -> int:
    if type(x) is not int or x not in _INT64:
        raise _NotKept
    return x


def _arg(k: Any, depth: int) -> _Arg:
    """The record of one argument's key (`torchfuse.graph.meta_memo._arg_key`)."""
    if type(k) is not tuple or not k:
        raise _NotKept
    head = k[0]
    if isinstance(head, torch.dtype) and len(k) == 5:  # a fake tensor
        _, sizes, strides, offset, device = k
        return _Tensor(False, _name(head), _ints(sizes), _ints(strides), _int(offset), _name(device))
    if type(head) is str and head == "real" and len(k) == 6:
        _, dtype, sizes, strides, offset, device = k
        return _Tensor(True, _name(dtype), _ints(sizes), _ints(strides), _int(offset), _name(device))
    if head is list or head is tuple:
        if depth >= _MAX_DEPTH or len(k) - 1 > _MAX_ITEMS:  # what the decoder takes
            raise _NotKept
        return _Seq(head is list, tuple(_arg(x, depth + 1) for x in k[1:]))
    kind = _KINDS.get(head) if isinstance(head, type) else None
    if kind is None or len(k) != 2:
        raise _NotKept
    value = k[1]
    if kind == "int":
        value = _int(value)
    elif kind not in ("bool", "str", "none", "float"):  # a float's key holds its hex spelling
        value = _name(value)
    return _Scalar(kind, value)


def record_key(key: Key) -> _RecordKey | None:
    """``key`` spelled as data, or None when it is not one the file keeps (not an ATen op,
    or an argument it cannot spell)."""
    func, args, kwargs = key
    name = _op_names.get(func, "")
    if name == "":
        name = op_name(func)
        name = _op_names[func] = name if name.startswith("aten.") else None
    if name is None or len(args) > _MAX_ITEMS or len(kwargs) > _MAX_ITEMS:
        return None
    try:
        return (name, tuple(_arg(a, 0) for a in args), tuple((k, _arg(v, 0)) for k, v in kwargs))
    except _NotKept:
        return None


def _key_of(record: _Record) -> _RecordKey:
    return (record.op, record.args, record.kwargs)


def _record(key: Key, answer: Answer) -> _Record | None:
    rk = record_key(key)
    if rk is None:
        return None
    metas, devices, kind = answer
    outs = []
    try:
        for meta, device in zip(metas, devices, strict=True):
            if meta.storage_offset != 0 or meta.device != _name(device):
                return None
            outs.append(_Out(meta.dtype, _ints(meta.sizes), _ints(meta.strides), meta.device,
                             meta.requires_grad))
    except _NotKept:
        return None
    container = "" if kind is None else kind.__name__
    if not outs or len(outs) > _MAX_ITEMS or container not in ("", "tuple", "list"):
        return None
    return _Record(*rk, tuple(outs), container)


def _answer(record: _Record) -> Answer:
    """The answer a record holds, checked as ``Entry.fakes`` will use it."""
    metas, devices = [], []
    for out in record.outs:
        try:
            dtype = to_dtype(out.dtype)
        except ValueError as e:
            raise _NotKept(f"dtype {out.dtype!r}") from e
        if _name(dtype) != out.dtype:  # only the spelling the recorder writes ("float32", not "float")
            raise _NotKept(f"dtype {out.dtype!r}")
        itemsize = dtype.itemsize
        if len(out.sizes) != len(out.strides):
            raise _NotKept("sizes and strides of different lengths")
        if any(n < 0 for n in (*out.sizes, *out.strides)):
            raise _NotKept("a negative size or stride")
        extent = storage_extent(out.sizes, out.strides)
        if extent * itemsize >= _MAX_EXTENT or any(n >= _MAX_EXTENT for n in out.sizes):
            raise _NotKept("a tensor too large to describe")
        devices.append(_device(out.device))
        metas.append(S.TensorMeta(dtype=out.dtype, sizes=out.sizes, strides=out.strides,
                                  device=out.device, requires_grad=out.requires_grad))
    if record.container == "" and len(metas) != 1:
        raise _NotKept("several outputs without a container")
    container = {"": None, "tuple": tuple, "list": list}[record.container]
    return tuple(metas), tuple(devices), container


_PARSERS: dict[str, Callable[[str], Any]] = {
    "dtype": to_dtype, "layout": to_layout, "memory_format": to_memory_format}


def _check_scalars(arg: _Arg) -> None:
    """A scalar's value is of its kind (the file could say ``int`` and hold a string)."""
    if type(arg) is _Seq:
        for a in arg.items:
            _check_scalars(a)
    elif type(arg) is _Scalar:
        want = {"bool": bool, "int": int, "none": type(None)}.get(arg.kind, str)
        if type(arg.value) is not want:
            raise _NotKept(f"a {arg.kind} argument holding {type(arg.value).__name__}")
        parse = _PARSERS.get(arg.kind)
        if parse is not None:
            try:
                parse(arg.value)  # type: ignore[arg-type]
            except ValueError as e:
                raise _NotKept(str(e)) from e
        elif arg.kind == "device":
            _device(arg.value)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the file


@functools.cache
def source_digest() -> str:
    """A digest of torchfuse-graph's Python source: the recorder's rules are part of every
    answer, and a development checkout changes them without a new version."""
    return source_hash("torchfuse.graph")[:16]


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """``<cache dir>/meta_memo`` (`torchfuse.graph.caches.cache_root`)."""
    return cache_root(environ) / "meta_memo"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", text)


_warned: set[Path] = set()


class MemoStore:
    """One memo file: read once (`get` decodes it at its first call), merged and replaced by
    `save`. ``torch_version`` and ``graph_version`` name the file (tests give others)."""

    def __init__(self, directory: Path, *, torch_version: str | None = None,
                 graph_version: str | None = None) -> None:
        self.torch_version = str(torch.__version__ if torch_version is None else torch_version)
        self.graph_version = str(__version__ if graph_version is None else graph_version)
        name = f"v{RECORD_LAYOUT}-torch{_safe(self.torch_version)}-graph{_safe(self.graph_version)}.msgpack"
        self.path = Path(directory) / name
        self._records: dict[_RecordKey, _Record] | None = None
        self._bad: set[_RecordKey] = set()
        """Records refused when asked for: left out of the next save."""
        self.capacity = 1 << 16
        """Records taken from the file (the memo sets its own capacity)."""

    def header(self) -> _Header:
        """What a file this store reads must say of itself."""
        return _Header(RECORD_LAYOUT, self.torch_version, self.graph_version, source_digest())

    def _problem(self, message: str) -> None:
        """Warn that the file, or a record of it, is not used (once a process)."""
        if self.path not in _warned:
            _warned.add(self.path)
            warnings.warn(f"torchfuse: the meta-kernel memo file {self.path} {message}", RuntimeWarning,
                          stacklevel=3)

    def read(self, *, warn: bool = True) -> list[_Record]:
        """The file's records (none when it is missing or refused; ``warn``: say why, once)."""
        def report(reason: str) -> None:
            if warn:
                self._problem(f"is not read ({reason}); the next save replaces it")
            else:
                log.debug("meta memo %s is not read: %s", self.path, reason)

        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as e:
            log.debug("meta memo: cannot read %s: %s", self.path, e)
            return []
        if len(data) > MAX_FILE_BYTES:
            report(f"larger than {MAX_FILE_BYTES >> 20} MiB")
            return []
        try:
            header, raw = _FILE.decode(data)
        except (msgspec.DecodeError, RecursionError) as e:  # ValidationError is a DecodeError
            report(f"not a memo file ({e})")
            return []
        if header.code != source_digest() and (header.format, header.torch, header.graph) == \
                (RECORD_LAYOUT, self.torch_version, self.graph_version):
            log.debug("meta memo %s: written by another torchfuse-graph source; not read", self.path)
            return []
        if (header.format, header.torch, header.graph) != (RECORD_LAYOUT, self.torch_version,
                                                           self.graph_version):
            report(f"written for format {header.format}, torch {header.torch!r}, torchfuse-graph "
                   f"{header.graph!r}")
            return []
        try:
            records = _RECORDS.decode(raw)
        except (msgspec.DecodeError, RecursionError) as e:
            report(f"malformed records ({e})")
            return []
        return records[-self.capacity:]

    @staticmethod
    def _by_key(records: list[_Record], report: Callable[[str], None]) -> dict[_RecordKey, _Record]:
        try:
            return {_key_of(r): r for r in records}
        except RecursionError:  # arguments nested past what hashing recurses through
            report("arguments nested too deep")
            return {}

    def get(self, key: Key) -> Answer | None:
        """The answer the file holds for ``key``: what the call's meta kernel answered in the
        process that saved it."""
        records = self._records
        if records is None:
            records = self._records = self._by_key(
                self.read(), lambda reason: self._problem(f"is not read ({reason})"))
        if not records:
            return None
        rk = record_key(key)
        record = records.get(rk) if rk is not None else None  # type: ignore[arg-type]
        if record is None:
            return None
        try:
            for arg in (*record.args, *(v for _, v in record.kwargs)):
                _check_scalars(arg)  # equal to the asking key's, but True == 1
            return _answer(record)
        except _NotKept as e:
            del records[rk]  # type: ignore[arg-type]
            self._bad.add(rk)  # type: ignore[arg-type]
            self._problem(f"holds a malformed record of {record.op} ({e}): not used, and dropped "
                          "at the next save")
            return None

    def forget(self) -> None:
        """Answer nothing from the file from now on (it is still written by `save`)."""
        self._records = {}

    def save(self, answers: Iterable[tuple[Key, Answer]]) -> int:
        """Merge ``answers`` into the file as it is now; the number of records written (0 when
        none of them can be kept or the file cannot be written)."""
        new = {}
        for key, answer in answers:
            record = _record(key, answer)
            if record is not None:
                new[_key_of(record)] = record
        if not new:
            return 0
        merged = self._by_key(self.read(warn=False), lambda m: None)
        for k in self._bad:
            merged.pop(k, None)
        for k, r in new.items():
            merged.pop(k, None)
            merged[k] = r  # the newest last: a full file drops the oldest
        records = list(merged.values())[-self.capacity:]
        header = self.header()
        data = _ENCODER.encode((header, records))
        while len(data) > MAX_FILE_BYTES and records:
            records = records[len(records) // 2:]
            data = _ENCODER.encode((header, records))
        try:
            write_atomic(self.path, data)  # a concurrent reader sees the old file or the new one
        except OSError as e:
            log.debug("meta memo: cannot write %s: %s", self.path, e)
            return 0
        return len(records)
