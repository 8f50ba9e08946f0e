"""The metadata an op's meta kernel computed, remembered by what it was computed from.

Every pass of ``torchfuse.autograd`` re-runs a graph on fake tensors, and capture runs the
user's code on them; every op either meets runs its meta kernel: half of a pass's time on a
transformer, most of it in torch's Python reference kernels (``aten.mul.Tensor``'s
broadcasting and type promotion: 0.1-0.25 ms a call). A model repeats its layers, and the
passes re-run the same graph one after the other (functionalize, the joint graph's forward,
decompose, inductor's decompose), so most calls ask again what an earlier one answered: the
same op, with arguments of the same metadata. Capture meets each layer's ops once per
layer, in every process, a warm one included (capture is not cached across processes).

A meta kernel's answer depends only on the op and its arguments: the dtype, sizes, strides,
offset and device of each tensor, and the value and Python type of everything else
(``mul(x, 2)`` and ``mul(x, 2.0)`` promote an integer ``x`` differently). `key` builds that
from a call; `MetaMemo` maps it to the metadata of the outputs, and the
[`PassRecorder`][torchfuse.autograd.common.PassRecorder] records a call found there as it would
have recorded its meta kernel's answer (the same node, the same names) with fresh fakes of
that metadata; so does the base [`Recorder`][torchfuse.graph.tracing.Recorder] when given a
memo (``Recorder.meta_memo``: capture's recorder is, `torchfuse.capture.config`).

Only calls whose outputs are new tensors are remembered: an op whose schema lets an output
alias an argument (views, in-place and ``out=`` ops) must return a tensor sharing the
argument's storage, which a fake made from metadata does not. Nor calls on symbolic sizes
(``SymInt``s: the size environment decides relations as they are asked), or of ops the
recorder treats specially (metadata queries, ``prim`` ops, ``lift_fresh``). Real tensors
(a module's parameters and buffers, which capture records as graph inputs) are described by
the same metadata as a fake, under a key of their own kind, when the caller says its recorder
treats them as inputs (``key(..., real_tensors=True)``: capture's does; the passes'
`PassRecorder` turns a real tensor into a node of its own, so it never asks with one). Without
them every layer norm, linear layer and autocast weight cast of a model missed: Swin-T's 29
``native_layer_norm`` calls ran torch's Python reference kernel, about 5 ms each.
``TORCHFUSE_META_MEMO=0`` turns the memo off (`torchfuse.autograd.config` and
`torchfuse.capture.config` both read it).

The answers also outlive the process: `MetaMemo.use_disk` gives the memo a file under the
cache directory (`torchfuse.graph.meta_memo_store`, keyed by the torch version), read at the
first `MetaMemo.get` and merged with what the process learned at its exit (`MetaMemo.save`).
A warm start then runs no meta kernel for the ops an earlier process met: on the CPU, a fresh
process's capture of Swin-T training took 0.50 s with every meta kernel run and 0.42 s answered
from the file (its autograd passes 1.45 -> 1.32 s; GPT-2 training's passes 0.31 -> 0.29 s).
``TORCHFUSE_META_MEMO_DISK=0`` keeps the memo in memory only (read by the same two config
modules).
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.meta_memo_store import Key, MemoStore, default_directory
from torchfuse.graph.ops import op_name, to_dtype
from torchfuse.graph.tracing import FakeTensor, outside_dispatch

log = logging.getLogger(__name__)

_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
            torch.memory_format)


DEFAULT_DTYPE_KEY = "(default dtype)"
"""The pseudo-keyword under which a key holds ``torch.get_default_dtype()`` (not a name an
op's schema can have)."""


class _Uncacheable(Exception):
    """An argument the key cannot describe exactly (a real tensor, a ``SymInt``...)."""


_REAL_TENSORS = (torch.Tensor, torch.nn.Parameter)
"""Real tensor types described by their metadata (exact types: a subclass may dispatch on its own)."""


def _arg_key(a: Any, real: bool = False) -> Any:
    if isinstance(a, FakeTensor):
        # not the fake's requires_grad: autograd runs above the dispatcher, meta kernels never see it
        key = (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.fake_device)
        if not all(type(n) is int for n in (*key[1], *key[2], key[3])):
            raise _Uncacheable  # a symbolic size: the size environment decides, not the memo
        return key
    kind = type(a)
    if kind in _REAL_TENSORS:
        # a sparse or conjugated/negated tensor is more than its sizes and strides
        if not real or a.layout is not torch.strided or a.is_conj() or a.is_neg():
            raise _Uncacheable
        return ("real", a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.device)
    if kind is list or kind is tuple:
        return (kind, *(_arg_key(x, real) for x in a))
    if kind is float:
        return (float, a.hex())  # exact: 0.0 == -0.0
    if isinstance(a, _SCALARS):
        return (kind, a)  # the type as well: True == 1 == 1.0, but they promote differently
    raise _Uncacheable


def _cacheable(func: torch._ops.OpOverload, special: Callable[[str], bool]) -> bool:
    schema = func._schema
    if special(op_name(func)):
        return False
    return all(a.alias_info is None for a in (*schema.arguments, *schema.returns))


class Entry:
    """The outputs of one call: their format metadata, device and kind of container."""

    __slots__ = ("container", "devices", "metas")

    def __init__(self, metas: tuple[S.TensorMeta, ...], devices: tuple[torch.device, ...],
                 container: type | None) -> None:
        self.metas = metas
        self.devices = devices
        self.container = container
        """``tuple`` or ``list`` for a call returning several tensors; None for one tensor."""

    def fakes(self) -> list[FakeTensor]:
        """New fake tensors with the remembered metadata (sizes and strides are plain ints)."""
        out = []
        with outside_dispatch():
            for m, device in zip(self.metas, self.devices, strict=True):
                elem = torch.empty_strided(m.sizes, m.strides, dtype=to_dtype(m.dtype), device="meta")
                out.append(FakeTensor(elem, device))
        return out


class MetaMemo:
    """A bounded map from `key` to `Entry` (cleared when full: a process compiling many
    models keeps only the recent ones), backed by a file when given a ``store``
    (`torchfuse.graph.meta_memo_store.MemoStore`): a call not answered from memory is looked
    up there, and the entries put since the last `save` are written by it."""

    def __init__(self, capacity: int = 1 << 16, store: MemoStore | None = None) -> None:
        self.capacity = capacity
        self._entries: dict[Key, Entry] = {}
        self._cacheable: dict[torch._ops.OpOverload, bool] = {}
        self._unsaved: dict[Key, Entry] = {}
        self._cleared = False
        self.store: MemoStore | None = None
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0
        """Of `hits`, those answered from the store's file."""
        if store is not None:
            self._attach(store)

    def key(self, func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any],
            special: Callable[[str], bool], *, real_tensors: bool = False) -> Key | None:
        """What ``func(*args, **kwargs)``'s output metadata depends on, or None when the call
        is not one the memo may answer. ``real_tensors``: real tensors among the arguments are
        described by their metadata (for a recorder that records them as inputs, as it
        records fakes); otherwise such a call is not answered."""
        ok = self._cacheable.get(func)
        if ok is None:
            ok = self._cacheable[func] = _cacheable(func, special)
        if not ok:
            return None
        try:
            # the default dtype as a keyword of its own: a factory op without ``dtype=``
            # (``ones``, ``arange`` of floats) answers with it, and another process, or a later
            # ``torch.set_default_dtype``, may have another
            return (func, tuple(_arg_key(a, real_tensors) for a in args),
                    (*((k, _arg_key(v, real_tensors)) for k, v in kwargs.items()),
                     (DEFAULT_DTYPE_KEY, (torch.dtype, torch.get_default_dtype()))))
        except _Uncacheable:
            return None

    def get(self, key: Key) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None and self.store is not None:
            answer = self.store.get(key)  # the file is decoded at the first call
            if answer is not None:
                entry = Entry(*answer)
                self.disk_hits += 1
                self._insert(key, entry)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put(self, key: Key, out: Any, metas: Sequence[S.TensorMeta | None]) -> None:
        """Remember ``out`` (what the call returned; ``metas``: as recorded) when it is new
        tensors with plain sizes, in a tuple or list or alone."""
        flat = list(out) if isinstance(out, tuple | list) else [out]
        if not flat or not all(type(o) is FakeTensor for o in flat) or any(m is None for m in metas):
            return
        if any(not isinstance(x, int) for m in metas for x in (*m.sizes, *m.strides)) or \
                any(m.storage_offset != 0 for m in metas):
            return
        container = type(out) if isinstance(out, tuple | list) else None
        entry = Entry(tuple(metas), tuple(o.fake_device for o in flat), container)  # type: ignore[arg-type]
        self._insert(key, entry)
        if self.store is not None:
            if len(self._unsaved) >= self.capacity:
                self._unsaved.clear()
            self._unsaved[key] = entry

    def _insert(self, key: Key, entry: Entry) -> None:
        if len(self._entries) >= self.capacity:
            self._entries.clear()
        self._entries[key] = entry

    def clear(self) -> None:
        """Forget every entry, the file's too: this memo answers nothing from its file from now
        on (tests count meta kernels from a known start); what it learns is still saved."""
        self._entries.clear()
        self._unsaved.clear()
        self._cleared = True
        if self.store is not None:
            self.store.forget()
        self.hits = self.misses = self.disk_hits = 0

    # -- on disk
    def _attach(self, store: MemoStore) -> None:
        store.capacity = self.capacity
        if self._cleared:
            store.forget()
        self.store = store

    def use_disk(self, on: bool = True) -> MetaMemo:
        """This memo, kept on disk when ``on`` (the capture and pass recorders' switch,
        ``TORCHFUSE_META_MEMO_DISK``): the first call gives it the file of the cache directory
        (`torchfuse.graph.meta_memo_store.default_directory`) and saves it at the process's
        exit. Later calls change nothing, ``on=False`` included (another recorder asked)."""
        if on and self.store is None:
            try:
                directory = default_directory()
            except RuntimeError as e:  # no home directory to put a cache in
                log.debug("meta memo: no cache directory (%s); kept in memory only", e)
                return self
            self._attach(MemoStore(directory))
            atexit.register(self._save_at_exit)
        return self

    def save(self) -> int:
        """Write the entries put since the last save into the store's file, merged with what
        the file holds now; the number of records the file holds afterwards (0: nothing new,
        no store, or the directory could not be written, which is logged at debug level)."""
        if self.store is None or not self._unsaved:
            return 0
        answers = [(k, (e.metas, e.devices, e.container)) for k, e in self._unsaved.items()]
        self._unsaved.clear()
        return self.store.save(answers)

    def _save_at_exit(self) -> None:
        try:
            self.save()
        except Exception as e:  # a cache costs the next process its warm start, never this one's exit
            log.debug("meta memo: not saved: %r", e)


MEMO = MetaMemo()
"""The process's memo, shared by every pass (they re-run the same ops one after the other)
and by capture."""
