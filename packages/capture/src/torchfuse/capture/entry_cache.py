"""Captured entries kept on disk: a fresh process reuses the graph its guards allow.

A warm start (every Program, aot plan and kernel binary already in the cache directory)
still captured each compiled function anew: OPT-125m's training step spent 123 ms of a
0.99 s warm first call in capture on the H100 host. This module keeps what capture made
for a compiled function's entries, ``<cache dir>/captures/<key>.msgpack``, and rebuilds an
entry from it in a later process when the entry's guards hold for the call, without
interpreting any bytecode. The backend is then called with the kept graph as usual (and
hits its own caches).

**The key** names the compiled function's code: a digest of its bytecode, constants and
names (nested code included), its module, qualified name and file, the Python, torch and
torchfuse-capture/-graph sources (`torchfuse.graph.caches.source_hash`) and the capture
settings. Several entries of one function (another shape, ``eval()``) share the file,
newest first, at most `MAX_RECORDS`.

**What is kept** of an entry: the graph (the format's JSON), the graph inputs by source,
the output structure, the side effects to replay, and the guards as *data*: each guard the
capture asked for (`torchfuse.capture.guards.GuardSet.log`), its sources as rows of one
`torchfuse.capture.portable.SourceTable` and its values described by value or by name
(`torchfuse.capture.portable`). A later process asks for those guards again on a new guard
set, so its conditions are written by the same code from checked data; nothing in the file
is evaluated, imported or unpickled. An object guarded by identity that has no name (the
module a compiled ``forward`` is called on, a decorator's inner function) is bound to what
the guard's own source reads in the loading call, when of the same make (same class, same
code; for a plain Python object, such as the ``torch.no_grad()`` a decorated method closes
over, same class and equal ``__dict__``); and before a rebuilt entry is taken, every
guarded tensor (parameters and buffers included, which one process checks through module
identity) must have the metadata capture saw, and none may carry a ``mark_dynamic`` request.

An entry is not kept when any of this cannot be written: guards over size symbols
(dynamic shapes), graph breaks, random draws, DDP pieces, constant tensors, a value of no
portable description (an object compared by identity that is no module, class, function
or plain object whose state is all data), or a code object capture inlined that lives in no
file (frozen standard-library modules excepted: the Python version is in the key). Each
inlined code object's file is kept with its size and modification time (as Python's own
bytecode cache checks a source), so an edit to the model's code, or to a library it calls,
makes the record stale.

A record that does not decode, names another layout, or whose descriptions do not resolve
is skipped (debug log ``TORCHFUSE_LOGS=+recompiles``); its function is captured as if
nothing were kept. ``TORCHFUSE_CAPTURE_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import keyword
import logging
import os
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import torch
from torchfuse.capture import config as C
from torchfuse.capture import source as SRC
from torchfuse.capture.context import InputSlot
from torchfuse.capture.guards import GuardSet, TensorMeta, watch
from torchfuse.capture.portable import (
    MAX_DEPTH,
    Describer,
    NotPortable,
    SourceTable,
    check_read,
    checked_expr,
    code_digest,
    describe_read,
    pair,
    read_sources,
    source_at,
)
from torchfuse.graph.archive import ArchiveError, from_json, to_json
from torchfuse.graph.caches import cache_root, source_hash, write_atomic
from torchfuse.graph.ops import dtype_name

if TYPE_CHECKING:
    from torchfuse.capture.convert import CaptureResult

log = logging.getLogger("torchfuse.recompiles")

LAYOUT = 2
"""The layout of a record; part of the key."""

MAX_RECORDS = 8
"""Entries kept per compiled function (the newest)."""

MAX_FILE_BYTES = 64 << 20
"""A larger file is not read."""


class Record(msgspec.Struct, frozen=True):
    """One kept entry."""

    graph: bytes
    sources: list[Any]
    """The rows of a `torchfuse.capture.portable.SourceTable`: guards and inputs name these."""
    guards: list[Any]
    inputs: list[Any]
    out_spec: Any
    side_effects: list[Any]
    uses_modules: bool
    grad_entry: bool
    files: list[tuple[str, int, int]]
    """Every file capture interpreted code of: path, size, modification time (ns)."""


class Kept(msgspec.Struct, frozen=True):
    layout: int
    records: list[Record]


# ----------------------------------------------------------------------------- guards

class TensorRecord(NamedTuple):
    """The one layout of a tensor guard's record, ``["tensor", *fields]``: its source's row,
    then the class, dtype and device as `Describer` writes them, sizes, strides and
    ``requires_grad``. `write_guards` writes it, `replay_guards` and `_inputs_differ` read it."""

    source: int
    cls: Any
    dtype: Any
    device: Any
    shape: list[int]
    strides: list[int]
    requires_grad: bool

    def record(self) -> list[Any]:
        return ["tensor", *self]

    @staticmethod
    def read(r: Any) -> TensorRecord | None:
        """The fields of ``r`` when it has the layout (nothing resolved yet), else None."""
        if not (isinstance(r, list) and len(r) == 1 + len(TensorRecord._fields) and r[0] == "tensor"):
            return None
        t = TensorRecord(*r[1:])
        if type(t.source) is not int or not isinstance(t.shape, list) or not isinstance(t.strides, list):
            return None
        return t


def write_guards(log_: list[tuple[Any, ...]], d: Describer, table: SourceTable) -> list[Any]:
    out: list[Any] = []
    for call in log_:
        kind, args = call[0], call[1:]
        if kind == "dynamic":
            raise NotPortable("guards over size symbols (dynamic shapes)")
        if kind == "tensor":
            src, m = args
            out.append(TensorRecord(table.add(src), d.describe(m.cls), d.describe(m.dtype),
                                    d.describe(m.device), list(m.shape), list(m.strides),
                                    m.requires_grad).record())
        elif kind in ("constant", "keys"):
            out.append([kind, table.add(args[0]), d.describe(args[1])])
        elif kind in ("type_", "identity"):
            src, obj = args
            try:
                desc = d.describe(obj)
            except NotPortable:  # no name: the object its source reads, if of the same make
                desc = describe_read(d, obj)
                if desc is None:
                    raise
            out.append([kind, table.add(src), desc])
        elif kind == "alias":
            out.append([kind, table.add(args[0]), table.add(args[1])])
        elif kind in ("distinct", "storage"):
            extra = [list(args[1])] if kind == "storage" else []
            out.append([kind, [table.add(s) for s in args[0]], *extra])
        elif kind == "length":
            out.append([kind, table.add(args[0]), int(args[1])])
        elif kind == "defaults":
            fn = args[0]
            if fn is not d.fn:
                raise NotPortable("the defaults of another function")
            out.append([kind, d.describe(fn.__defaults__), d.describe(fn.__kwdefaults__)])
        elif kind in ("grad_mode", "autocast", "default_dtype"):
            out.append([kind, d.describe(args[0])])
        else:
            raise NotPortable(f"a guard {kind!r}")
    return out


def _ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(type(i) is int for i in v):
        raise NotPortable("a bad list of ints")
    return tuple(v)


def replay_guards(records: Any, d: Describer, sources: list[SRC.Source], read: Callable[[SRC.Source], Any],
                  loc: Any) -> GuardSet:
    """A guard set made by asking for the recorded guards again. ``read(source)`` is the
    value a source reads in the loading call (an object kept as ``["read", …]`` is that one)."""
    gs = GuardSet(lambda: loc)

    def at(i: Any) -> SRC.Source:
        return source_at(sources, i)

    if not isinstance(records, list):
        raise NotPortable("guards are not a list")
    for r in records:
        if not isinstance(r, list) or not r or not isinstance(r[0], str):
            raise NotPortable("not a guard record")
        kind, a = r[0], r[1:]
        n = {"tensor": len(TensorRecord._fields),
             "constant": 2, "keys": 2, "type_": 2, "identity": 2, "alias": 2,
             "distinct": 1, "storage": 2, "length": 2, "defaults": 2, "grad_mode": 1,
             "autocast": 1, "default_dtype": 1}.get(kind)
        if n is None or len(a) != n:
            raise NotPortable(f"a bad guard record {kind!r}")
        if kind == "tensor":
            t = TensorRecord(*a)
            src = at(t.source)
            cls, dtype, dev = d.resolve(t.cls), d.resolve(t.dtype), d.resolve(t.device)
            if not (isinstance(cls, type) and issubclass(cls, torch.Tensor) and isinstance(dtype, torch.dtype)
                    and isinstance(dev, torch.device) and type(t.requires_grad) is bool):
                raise NotPortable("a bad tensor guard")
            m = TensorMeta(cls, dtype, dev, _ints(t.shape), _ints(t.strides), t.requires_grad)
            if len(m.shape) != len(m.strides):
                raise NotPortable("a tensor guard's sizes and strides differ in length")
            gs.tensor(src, m)
        elif kind == "constant":
            gs.constant(at(a[0]), d.resolve(a[1]))
        elif kind == "keys":
            keys = d.resolve(a[1])
            if type(keys) is not tuple:
                raise NotPortable("keys are not a tuple")
            gs.keys(at(a[0]), keys)
        elif kind in ("type_", "identity"):
            src = at(a[0])
            if isinstance(a[1], list) and a[1][:1] == ["read"]:
                try:
                    value = read(src)
                except Exception:  # the source does not read in this call: no match
                    raise NotPortable(f"{src.expr()} does not read") from None
                obj = check_read(d, a[1], type(value) if kind == "type_" else value)
            else:
                obj = d.resolve(a[1])
            if kind == "identity":
                gs.identity(src, obj)
            elif isinstance(obj, type):
                gs.type_(src, obj)
            else:
                raise NotPortable("a type guard of no type")
        elif kind == "alias":
            gs.alias(at(a[0]), at(a[1]))
        elif kind in ("distinct", "storage"):
            if not isinstance(a[0], list):
                raise NotPortable("a bad source list")
            group = [at(s) for s in a[0]]
            if kind == "distinct":
                gs.distinct(group)
            else:
                gs.storage(group, _ints(a[1]))
        elif kind == "length":
            if type(a[1]) is not int:
                raise NotPortable("a bad length")
            gs.length(at(a[0]), a[1])
        elif kind == "defaults":
            fn = d.fn
            if d.describe(fn.__defaults__) != a[0] or d.describe(fn.__kwdefaults__) != a[1]:
                raise NotPortable("the function's defaults changed")
            gs.defaults(fn)
        elif kind == "grad_mode":
            v = d.resolve(a[0])
            if type(v) is not bool:
                raise NotPortable("a bad grad mode")
            gs.grad_mode(v)
        elif kind == "default_dtype":
            v = d.resolve(a[0])
            if not isinstance(v, torch.dtype):
                raise NotPortable("a bad default dtype")
            gs.default_dtype(v)
        else:
            v = d.resolve(a[0])
            if type(v) is not tuple or not all(b is False or isinstance(b, torch.dtype) for b in v):
                raise NotPortable("a bad autocast state")
            gs.autocast(v)
    return gs


def holds(log_: list[tuple[Any, ...]], read: Callable[[SRC.Source], Any]) -> list[torch.nn.Module] | None:
    """Whether the guards of ``log_`` (a rebuilt `GuardSet.log`) hold for the values ``read``
    gives, checked in Python, one by one, as their conditions would (``None`` when one does
    not), and the modules they name by identity. For the module guards of a rebuilt entry:
    compiling their check function for one use cost more than the checks (ResNet-18: 20 of
    31 ms of a load), and within one process they are checked again only when modules
    change (`CheckFunctions.module`, compiled then). Every tensor is checked by metadata,
    module state included (which one process checks through module identity), and must not
    carry a ``mark_dynamic`` request; the guards that live in the fast check (grad mode,
    autocast, defaults, aliasing of inputs) are left to it."""
    modules: list[torch.nn.Module] = []
    try:
        for call in log_:
            kind, src = call[0], call[1] if len(call) > 1 else None
            if kind == "tensor":
                t = read(src)
                ok = call[2].matches(t) and not getattr(t, "_torchfuse_dynamic", None)
            elif kind == "constant":
                v = read(src)
                ok = type(v) is type(call[2]) and v == call[2]
            elif kind == "keys":
                ok = tuple(read(src).keys()) == call[2]
            elif kind == "type_":
                ok = type(read(src)) is call[2]
            elif kind == "identity":
                ok = read(src) is call[2]
                if ok and isinstance(call[2], torch.nn.Module):
                    modules.append(call[2])
            elif kind == "alias":
                ok = read(src) is read(call[2])
            elif kind == "length":
                ok = len(read(src)) == call[2]
            else:  # distinct, storage, defaults, grad mode, autocast, default dtype: fast check
                ok = True
            if not ok:
                return None
    except Exception:  # a source that does not read in this call: no match
        return None
    return modules


def _read(source: SRC.Source, L: Any, G: Any, C_: Any, memo: dict[SRC.Source, Any] | None = None) -> Any:
    """The value ``source`` names, read in Python (no generated code). With ``memo`` (one
    load's), each source is read once: a model's guards share their bases (OPT's 1951 reads
    were 13187 with each base read again)."""
    if memo is not None:
        got = memo.get(source, memo)
        if got is memo:
            got = memo[source] = _read_once(source, L, G, C_, memo)
        return got
    return _read_once(source, L, G, C_, None)


def _read_once(source: SRC.Source, L: Any, G: Any, C_: Any, memo: dict[SRC.Source, Any] | None) -> Any:
    t = type(source)
    if t is SRC.LocalSource:
        return L[source.index]
    if t is SRC.GlobalSource:
        return G[source.name]
    if t is SRC.ClosureSource:
        return C_[source.index].cell_contents
    if t is SRC.ModuleGlobalSource:
        return sys.modules[source.module].__dict__[source.name]
    base = _read(source.base, L, G, C_, memo)  # type: ignore[attr-defined]
    if t is SRC.ModuleStateSource:
        return getattr(base, source.table)[source.key]
    if t in (SRC.AttrSource, SRC.ModuleAttrSource):
        return getattr(base, source.name)
    if t is SRC.ClassAttrSource:
        return getattr(type(base), source.name)
    if t is SRC.ItemSource:
        return base[source.key]
    if t is SRC.DictItemSource:
        return dict.__getitem__(base, source.key)
    if t is SRC.DictValueSource:
        return tuple(dict.values(base))[source.key]
    if t is SRC.MethodCallSource:  # is_integer only (`portable.check_source`)
        return getattr(base, source.name)()
    raise NotPortable(f"a tensor read through {t.__name__}")


# ----------------------------------------------------------------------------- outputs and inputs

def write_spec(s: Any, d: Describer, depth: int = 0) -> list[Any]:
    if depth > MAX_DEPTH:
        raise NotPortable("an output nested too deep")
    tag = s[0]
    if tag == "t":
        return ["t", s[1]]
    if tag == "tv" and s[2] is None:
        return ["tv", s[1], bool(s[3]), None if s[4] is None else d.describe(s[4])]
    if tag == "c":
        return ["c", d.describe(s[1])]
    if tag == "s":
        return ["s", checked_expr(s[1])]
    if tag == "seq":
        return ["seq", d.describe(s[1]), [write_spec(i, d, depth + 1) for i in s[2]]]
    if tag == "dict":
        return ["dict", d.describe(s[1]), d.describe(s[2]), [write_spec(i, d, depth + 1) for i in s[3]]]
    if tag == "obj":
        return ["obj", d.describe(s[1]), [[k, write_spec(v, d, depth + 1)] for k, v in s[2].items()]]
    raise NotPortable(f"an output of kind {tag!r}")


def read_spec(r: Any, d: Describer, n_out: int, depth: int = 0) -> tuple:
    if depth > MAX_DEPTH or not isinstance(r, list) or not r:
        raise NotPortable("not an output record")
    tag = r[0]
    if tag in ("t", "tv"):
        if type(r[1]) is not int or not 0 <= r[1] < n_out:
            raise NotPortable("an output index out of range")
        if tag == "t" and len(r) == 2:
            return ("t", r[1])
        if tag == "tv" and len(r) == 4 and type(r[2]) is bool:
            cls = None if r[3] is None else d.resolve(r[3])
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
                raise NotPortable("a bad tensor class")
            return ("tv", r[1], None, r[2], cls)
    elif tag == "c" and len(r) == 2:
        return ("c", d.resolve(r[1]))
    elif tag == "s" and len(r) == 2:
        return ("s", checked_expr(r[1]))
    elif tag == "seq" and len(r) == 3 and isinstance(r[2], list):
        cls = d.resolve(r[1])
        if isinstance(cls, type) and issubclass(cls, tuple | list):
            return ("seq", cls, [read_spec(i, d, n_out, depth + 1) for i in r[2]])
    elif tag == "dict" and len(r) == 4 and isinstance(r[3], list):
        cls, keys = d.resolve(r[1]), d.resolve(r[2])
        if isinstance(cls, type) and issubclass(cls, dict) and type(keys) in (tuple, list) \
                and len(keys) == len(r[3]):
            return ("dict", cls, keys, [read_spec(i, d, n_out, depth + 1) for i in r[3]])
    elif tag == "obj" and len(r) == 3 and isinstance(r[2], list):
        cls = d.resolve(r[1])
        items = [pair(p) for p in r[2]]
        if isinstance(cls, type) and all(isinstance(k, str) and k.isidentifier() for k, _ in items):
            return ("obj", cls, {k: read_spec(v, d, n_out, depth + 1) for k, v in items})
    raise NotPortable(f"a bad output record {tag!r}")


def write_effects(ops: list[tuple], d: Describer) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        if op[0] == "setattr":
            out.append(["setattr", checked_expr(op[1]), _name(op[2]), write_spec(op[3], d), bool(op[4])])
        elif op[0] == "setglobal":
            out.append(["setglobal", _name(op[1]), write_spec(op[2], d)])
        elif op[0] == "contents":
            out.append(["contents", checked_expr(op[1]), write_spec(op[2], d)])
        else:
            raise NotPortable(f"a side effect {op[0]!r}")
    return out


def read_effects(r: Any, d: Describer, n_out: int) -> list[tuple]:
    if not isinstance(r, list):
        raise NotPortable("side effects are not a list")
    out: list[tuple] = []
    for op in r:
        if not isinstance(op, list) or not op:
            raise NotPortable("a bad side effect")
        if op[0] == "setattr" and len(op) == 5 and type(op[4]) is bool:
            out.append(("setattr", checked_expr(op[1]), _name(op[2]), read_spec(op[3], d, n_out), op[4]))
        elif op[0] == "setglobal" and len(op) == 3:
            out.append(("setglobal", _name(op[1]), read_spec(op[2], d, n_out)))
        elif op[0] == "contents" and len(op) == 3:
            out.append(("contents", checked_expr(op[1]), read_spec(op[2], d, n_out)))
        else:
            raise NotPortable("a bad side effect")
    return out


def _name(v: Any) -> str:
    if not isinstance(v, str) or not v.isidentifier() or keyword.iskeyword(v):
        raise NotPortable(f"a bad name {v!r}")
    return v


def write_inputs(slots: list[InputSlot], table: SourceTable) -> list[Any]:
    out = []
    for s in slots:
        if s.source is None or s.constant is not None:
            raise NotPortable("a constant tensor input")
        out.append([s.name, s.kind, table.add(s.source)])
    return out


def read_inputs(r: Any, sources: list[SRC.Source]) -> list[InputSlot]:
    if not isinstance(r, list):
        raise NotPortable("inputs are not a list")
    out = []
    for s in r:
        if not isinstance(s, list) or len(s) != 3 or not isinstance(s[0], str) or not isinstance(s[1], str):
            raise NotPortable("a bad input record")
        out.append(InputSlot(s[0], s[1], source_at(sources, s[2])))
    return out


# ----------------------------------------------------------------------------- the files

def _key(fn: types.FunctionType, dynamic: Any) -> str:
    h = hashlib.sha256()
    code = fn.__code__
    for part in (LAYOUT, sys.version, torch.__version__, source_hash("torchfuse.capture"),
                 source_hash("torchfuse.graph"), fn.__module__, fn.__qualname__, code.co_filename,
                 code.co_firstlineno, code_digest(code), repr(dynamic), repr(C.config)):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:40]


def path_for(fn: types.FunctionType, dynamic: Any) -> Path:
    """The file keeping ``fn``'s entries."""
    return cache_root() / "captures" / f"{_key(fn, dynamic)}.msgpack"


def _stamps(codes: frozenset[types.CodeType]) -> list[tuple[str, int, int]]:
    # a frozen standard-library module is part of the Python the key names
    files = sorted({c.co_filename for c in codes if not c.co_filename.startswith("<frozen ")})
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            raise NotPortable(f"code from {f!r}, which is no file") from None
        out.append((f, st.st_size, st.st_mtime_ns))
    return out


def _fresh(files: list[tuple[str, int, int]]) -> bool:
    for f, size, mtime in files:
        try:
            st = os.stat(f)
        except OSError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime:
            return False
    return True


def _read_file(path: Path) -> list[Record]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            log.debug("capture cache: %s is larger than %d bytes; not read", path, MAX_FILE_BYTES)
            return []
        kept = msgspec.msgpack.decode(path.read_bytes(), type=Kept)
    except FileNotFoundError:
        return []
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        log.debug("capture cache: %s not read: %s", path, e)
        return []
    return kept.records if kept.layout == LAYOUT else []


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def keep(fn: types.FunctionType, dynamic: Any, result: CaptureResult, L: tuple[Any, ...],
         C_: Any) -> str | None:
    """Write ``result`` (a whole function captured without break) beside the entries kept for
    ``fn``; the reason when it cannot be kept (``None`` when it was)."""
    try:
        record = _record(fn, result, L, C_)
    except NotPortable as e:
        return str(e)
    except Exception as e:  # a cache must never cost the call that compiled: say why, go on
        log.debug("capture cache: entry of %s not kept", fn.__qualname__, exc_info=True)
        return f"{type(e).__name__}: {e}"
    path = path_for(fn, dynamic)
    records = [record, *(r for r in _read_file(path) if r.guards != record.guards)][:MAX_RECORDS]
    try:
        write_atomic(path, msgspec.msgpack.encode(Kept(LAYOUT, records)))
    except OSError as e:
        return f"not written: {e}"
    return None


def _record(fn: types.FunctionType, r: CaptureResult, L: tuple[Any, ...], C_: Any) -> Record:
    if r.graph is None or r.error is not None or r.plan is not None or r.part:
        raise NotPortable("a graph break")
    for what, present in (("random draws", r.random_generators),
                          ("a DDP split", r.ddp_plan), ("dynamic sizes", r.dynamic_dims or r.scalar_symbols)):
        if present:
            raise NotPortable(what)
    d = Describer(fn)
    table = SourceTable()
    guards = write_guards(r.checks.log, d, table)
    inputs = write_inputs(r.inputs, table)
    record = Record(graph=to_json(r.graph), sources=table.rows, guards=guards, inputs=inputs,
                    out_spec=write_spec(r.out_spec, d), side_effects=write_effects(r.side_effects, d),
                    uses_modules=r.uses_modules,
                    grad_entry=r.grad_entry, files=_stamps(r.codes))
    # read it back as a later process would: the same conditions over the same objects
    rt = msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=Record)
    sources = read_sources(rt.sources)
    G = fn.__globals__
    gs = replay_guards(rt.guards, d, sources, lambda s: _read(s, L, G, C_), None)
    ns, old = gs.namespace, r.checks.namespace
    conds = [e.condition for e in gs.entries if not e.module_group] + \
        [e.condition for e in gs.entries if e.module_group]
    if conds != [e.condition for e in r.checks.entries] or ns.keys() != old.keys() or \
            not all(_same(ns[k], old[k]) for k in ns):
        raise NotPortable("its guards do not read back the same")
    n_out = len(r.graph.outputs)
    if read_spec(rt.out_spec, d, n_out) != r.out_spec or read_inputs(rt.inputs, sources) != r.inputs or \
            read_effects(rt.side_effects, d, n_out) != r.side_effects:
        raise NotPortable("its outputs or inputs do not read back the same")
    return record


def _inputs_differ(records: Any, sources: list[SRC.Source], read: Callable[[SRC.Source], Any]) -> bool:
    """Whether a tensor the call passes (a guard's source outside module state) surely fails
    its recorded tensor guard: not a tensor, or another dtype or size. Checked before the
    record's guards are asked for again, which costs ~20 ms per record on a small T5: a
    function kept at several shapes tried each one's on every miss. Anything unsure (a
    source that does not read, a record of another form) is left to the full check."""
    if not isinstance(records, list):
        return False
    for r in records:
        t = TensorRecord.read(r)
        if t is None:
            continue
        try:
            src = source_at(sources, t.source)
            if src.is_module_state:
                continue
            value = read(src)
        except Exception:  # not readable in this call: the full check says so
            continue
        if not isinstance(value, torch.Tensor):
            return True
        if list(value.shape) != t.shape or t.dtype != ["dtype", dtype_name(value.dtype)]:
            return True
    return False


def load(fn: types.FunctionType, dynamic: Any, name: str, L: tuple[Any, ...], C_: Any,
         make: Callable[..., CaptureResult]) -> CaptureResult | None:
    """The first kept entry of ``fn`` whose guards hold for this call, as a capture result
    made by ``make`` (`torchfuse.capture.convert.CaptureResult`, which capture's core imports
    this module for: passed in, not imported back); ``None``: none kept, or none holds."""
    t0 = time.perf_counter()
    path = path_for(fn, dynamic)
    records = _read_file(path)
    for i, rec in enumerate(records):
        try:
            fields = _rebuild(fn, rec, name, L, C_)
        except (NotPortable, ArchiveError) as e:
            log.debug("capture cache: entry %d of %s skipped: %s", i, path, e)
            continue
        except Exception as e:  # a file no process of ours wrote (a float that is no hex, an
            # unhashable key): skipped like any record that does not read
            log.debug("capture cache: entry %d of %s skipped: %s: %s", i, path, type(e).__name__, e)
            continue
        if fields is not None:
            return make(**fields, seconds=time.perf_counter() - t0)
    return None


def _rebuild(fn: types.FunctionType, rec: Record, name: str, L: tuple[Any, ...],
             C_: Any) -> dict[str, Any] | None:
    if not _fresh(rec.files):
        raise NotPortable("a file its code came from changed")
    d = Describer(fn)
    G = fn.__globals__
    sources = read_sources(rec.sources)
    memo: dict[SRC.Source, Any] = {}
    if _inputs_differ(rec.guards, sources, lambda s: _read(s, L, G, C_, memo)):
        return None
    gs = replay_guards(rec.guards, d, sources, lambda s: _read(s, L, G, C_, memo), None)
    checks = gs.build()
    if not checks.fast(L, G, C_):
        return None
    modules = holds(gs.log, lambda s: _read(s, L, G, C_, memo))
    if modules is None:
        return None
    graph = from_json(rec.graph, "graph")
    inputs = read_inputs(rec.inputs, sources)
    out_spec = read_spec(rec.out_spec, d, len(graph.outputs))
    effects = read_effects(rec.side_effects, d, len(graph.outputs))
    for module in modules:  # writes to what the entry reads move the module version
        for m in module.modules():
            watch(m)
    return dict(name=name, graph=graph, inputs=inputs, out_spec=out_spec, side_effects=effects,
                checks=checks, error=None, uses_modules=rec.uses_modules,
                grad_entry=rec.grad_entry, from_disk=True)


__all__ = ["LAYOUT", "MAX_RECORDS", "NotPortable", "code_digest", "keep", "load", "path_for"]
