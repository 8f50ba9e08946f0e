"""On-disk caches of compile results, so that a second process skips the compiler.

Two stores live under the runtime's cache directory (``TORCHFUSE_CACHE_DIR``, read by
[`torchfuse.runtime.config`][torchfuse.runtime.config] alone)::

    programs/<key>.zip   the Program compiled from a Graph (a format archive)
    aot/<key>.json       an autograd plan: forward and backward graphs of a partition

A key is the sha256 of what decides the result: the canonical JSON of the input graph, the
compile mode and every option, and the *producer fingerprint* -- torch and Triton versions,
the device's compute capability, the versions of the torchfuse packages that compile, and a
hash of their source files (so that a changed compiler never reads a stale entry, even when
its version number did not move). Entries are written to a temporary file and renamed, so a
reader never sees half an entry; an entry that does not decode is logged, deleted and
recompiled. ``TORCHFUSE_COMPILE_CACHE=0`` (or the ``cache`` option) turns both stores off.

>>> from torchfuse.inductor import cache
>>> cache.stats.program_hits                                  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass, fields
from pathlib import Path

import msgspec
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.archive import ArchiveError, load, save_bytes, to_json
from torchfuse.graph.caches import source_hash, write_atomic
from torchfuse.inductor.config import InductorConfig

log = logging.getLogger("torchfuse.inductor.cache")

_FINGERPRINT_PACKAGES = ("torchfuse.graph", "torchfuse.autograd", "torchfuse.inductor")
# Options that change what is logged or written for debugging, never the Program.
_NOT_IN_KEY = frozenset({"logs", "debug", "debug_dir", "update_snapshots", "cache"})


@dataclass
class CacheStats:
    """Counters of both stores since the process started (tests and benchmarks read them)."""

    program_hits: int = 0
    program_misses: int = 0
    program_stores: int = 0
    aot_hits: int = 0
    aot_misses: int = 0
    aot_stores: int = 0
    corrupt: int = 0
    """Entries found unreadable (deleted, then recompiled)."""

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


stats = CacheStats()


def cache_root() -> Path:
    """The runtime's cache directory, read at each use (tests point it elsewhere)."""
    from torchfuse.runtime import config as rconfig

    return rconfig.config.cache_dir


@functools.cache
def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import triton

    parts = [f"torch={torch.__version__}", f"triton={triton.__version__}"]
    for package in _FINGERPRINT_PACKAGES:
        dist = "torchfuse-" + package.rsplit(".", 1)[1]
        try:
            parts.append(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist}=?")
        parts.append(source_hash(package))
    return "|".join(parts)


def _capability(device: str) -> str:
    if not device.startswith("cuda"):
        return device.split(":")[0]
    import torch

    if not torch.cuda.is_available():
        return "cuda-none"
    major, minor = torch.cuda.get_device_capability()
    return f"cuda-sm{major}{minor}"


def fingerprint(device: str = "cpu") -> str:
    """What, besides the input, decides a compile result on ``device`` (see the module doc)."""
    return _versions() + "|" + _capability(device)


def graph_device(graph: S.Graph) -> str:
    """The device a graph computes on: the first non-CPU device of its values, else ``cpu``."""
    for meta in graph.values.values():
        if not meta.device.startswith("cpu"):
            return meta.device
    return "cpu"


def _digest(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for p in parts:
        data = p.encode() if isinstance(p, str) else p
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_ADDRESS_BYTES = re.compile(rb" at 0x[0-9a-fA-F]+")
"""An object's address as its default ``repr`` prints it: in an identity guard's description
(``C[2].cell_contents is GPT2LMHeadModel at 0x7fe7ba7fa490``), it differs in every process."""


def key_json(graph: S.Graph) -> bytes:
    """The canonical JSON a cache key covers: the graph's, with its size guards
    (`SymbolGuard`: the passes assume them) and none of its other guards. Those never change
    what is compiled (they are checked at call time, by capture), and some differ in every
    process: an identity guard's description holds the object's address (GPT-2 training, run
    ``gpu_20261202_0106``: one Program and one autograd plan recompiled in every second
    process), a constant guard on ``tuple(d.keys())`` of a dict keyed by ``id()`` holds
    addresses as integers (the ``kernels`` package's layer registry on Llama's modules: two
    Programs and two autograd plans recompiled in every warm process, December 2026)."""
    guards = tuple(g for g in graph.guards if isinstance(g, S.SymbolGuard))
    if guards == graph.guards:
        return to_json(graph)
    return to_json(msgspec.structs.replace(graph, guards=guards))


def program_key(graph: S.Graph, *, mode: str, cfg: InductorConfig) -> str:
    """The cache key of compiling ``graph`` with ``mode`` and ``cfg``."""
    options = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in _NOT_IN_KEY}
    return _digest("program", fingerprint(graph_device(graph)), mode,
                   msgspec.json.encode(options, order="sorted"), key_json(graph))


class Store:
    """One directory of cache entries, ``<root>/<name>/<key><suffix>``, written atomically."""

    def __init__(self, name: str, suffix: str, root: Path | None = None) -> None:
        self.name = name
        self.suffix = suffix
        self.root = root

    def path(self, key: str) -> Path:
        return (self.root or cache_root()) / self.name / f"{key}{self.suffix}"

    def read(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except OSError:
            return None

    def write(self, key: str, data: bytes) -> None:
        path = self.path(key)
        try:
            write_atomic(path, data)
        except OSError as e:  # a read-only or full disk costs the cache, never the compile
            log.warning("torchfuse cache: cannot write %s: %s", path, e)

    def discard(self, key: str, reason: str) -> None:
        stats.corrupt += 1
        path = self.path(key)
        log.warning("torchfuse cache: ignoring unreadable entry %s (%s); recompiling", path, reason)
        try:
            path.unlink()
        except OSError:
            pass


programs = Store("programs", ".zip")
"""Compiled Programs by `program_key`."""


def lookup_program(key: str) -> S.Program | None:
    """The Program cached under ``key``, or None (a damaged entry is deleted)."""
    path = programs.path(key)
    if not path.is_file():
        stats.program_misses += 1
        return None
    try:
        doc = load(path)
    except (ArchiveError, msgspec.MsgspecError, OSError, ValueError, KeyError) as e:
        programs.discard(key, f"{type(e).__name__}: {e}")
        stats.program_misses += 1
        return None
    if not isinstance(doc, S.Program):
        programs.discard(key, f"holds a {type(doc).__name__}, not a Program")
        stats.program_misses += 1
        return None
    stats.program_hits += 1
    return doc


def store_program(key: str, program: S.Program) -> None:
    """Write ``program`` under ``key`` (atomically; a failed write is logged, not raised)."""
    programs.write(key, save_bytes(program))
    stats.program_stores += 1


class PlanCache:
    """The store of autograd plans, as ``torchfuse.autograd.aot(..., cache=)`` wants it.

    The autograd glue hands in the bytes that identify a plan (its input graph, requires-grad
    pattern and partition settings) and gets back the bytes it stored; the key also covers the
    producer fingerprint, so entries of another compiler version are never read.
    """

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store("aot", ".json")

    def key(self, material: bytes) -> str:
        # the material is the canonical JSON of a graph (and settings): addresses out, as in
        # `key_json`
        return _digest("aot", fingerprint(), _ADDRESS_BYTES.sub(b"", material))

    def get(self, material: bytes) -> bytes | None:
        data = self.store.read(self.key(material))
        if data is None:
            stats.aot_misses += 1
        else:
            stats.aot_hits += 1
        observe.record_count("aot.cache.hits" if data is not None else "aot.cache.misses")
        return data

    def put(self, material: bytes, data: bytes) -> None:
        self.store.write(self.key(material), data)
        stats.aot_stores += 1

    def invalid(self, material: bytes, reason: str) -> None:
        """The entry read for ``material`` did not decode: count it a miss and delete it."""
        stats.aot_hits -= 1
        stats.aot_misses += 1
        self.store.discard(self.key(material), reason)
