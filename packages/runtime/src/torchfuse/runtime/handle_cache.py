"""Launch handles kept between processes: a warm start launches without Triton's JIT.

A GPU call function's fast path (``call_fast``, `torchfuse.runtime.codegen`) launches each
kernel through handles recorded on a first call (`torchfuse.runtime.launchers.handles`: the
compiled binary's launcher, function and metadata), one set per *handle key* (the symbol
values and whether every input is aligned). To record them, a warm start used to make each
kernel's ``JITFunction`` (which tokenizes its source) and warm it up (Triton works its cache key
out again, walking the kernel's AST, then reads the binary from its disk cache): on the H100
host 231 + 160 ms of OPT training's warm first call of 830 ms (2026-12-07), the
``runtime.load`` and ``runtime.precompile`` stages.

``<cache>/calls/<call key>.handles.json`` (beside the call function it belongs to,
`torchfuse.runtime.call_cache`) keeps, per handle key recorded, each launch's binary by its
place in Triton's cache (the cache hash and the metadata file's name) and what Triton's
launcher reads of the kernel (its signature, constants and argument names). A warm start
whose call function comes from the call cache reads it (`load`), makes each
``CompiledKernel`` from Triton's cache, loads them onto the device and records their handles
before the first call, which then launches at once; the kernels' ``JITFunction``s are made
only if something asks for them (`torchfuse.runtime.kernels.LazyKernel`).

A file counts only under the device, Triton version and Triton cache-invalidating
environment it was written under (`context`); a binary missing from Triton's cache (emptied
since), or a kernel Triton's launcher could not describe, makes the whole file unused: the
warm start then warms up as before. Nothing is kept while Triton would compile anyway
(``always_compile``, a stages hook, IR overrides), nor with ``TORCHFUSE_HANDLE_CACHE=0``. The
folder is inside the cache directory's trust boundary, as ``calls/`` is.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchfuse.graph.caches import write_atomic
from torchfuse.runtime.config import logger

VERSION = 1
"""Bumped when this file's format changes."""

MAX_KEYS = 64
"""Handle keys kept per call function (with dynamic shapes, one per size seen)."""

_SCALARS = (bool, int, float, str, type(None))


def _usable() -> bool:
    """Whether handles are kept and read (`Config.handle_cache`) and Triton would load a
    cached binary as it is (not compile it again)."""
    import torchfuse.runtime.config as rconfig

    if not rconfig.config.handle_cache:
        return False
    try:
        from triton import knobs

        return not (knobs.compilation.always_compile or knobs.runtime.add_stages_inspection_hook is not None
                    or knobs.compilation.override)
    except Exception:  # another Triton: keep nothing
        return False


def context() -> dict[str, Any]:
    """What a file is valid under: the device kind and Triton's version (`device_key`) and the
    environment variables Triton's cache keys read."""
    from torchfuse.runtime.kernels import device_key
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return {"version": VERSION, "device": device_key("cuda"), "env": dict(get_cache_invalidating_env_vars())}


def describe(compiled: Any) -> dict[str, Any] | None:
    """One launch's binary as the file keeps it, or None when it cannot be described."""
    src = getattr(compiled, "src", None)
    group = getattr(compiled, "metadata_group", None) or {}
    names = [name for name in group if str(name).endswith(".json")]
    arg_names = getattr(getattr(src, "fn", None), "arg_names", None)
    signature = dict(getattr(src, "signature", None) or {})
    constants = dict(getattr(src, "constants", None) or {})
    if (len(names) != 1 or not isinstance(getattr(compiled, "hash", None), str) or arg_names is None
            or not all(isinstance(v, str) for v in signature.values())
            or not all(isinstance(v, _SCALARS) for v in constants.values())
            or not all(isinstance(k, tuple) and all(isinstance(i, int) for i in k) for k in constants)):
        return None
    return {"hash": compiled.hash, "group": names[0], "name": getattr(src, "name", ""),
            "signature": signature, "constants": [[list(k), v] for k, v in constants.items()],
            "arg_names": list(arg_names)}


class _Fn:
    """What Triton's launcher reads of a kernel's function: its argument names."""

    def __init__(self, arg_names: Sequence[str]) -> None:
        self.arg_names = list(arg_names)


class _Source:
    """What Triton's launcher reads of a compiled kernel's source (``CudaLauncher``: the
    signature, the constants and the function's argument names)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.name = str(doc["name"])
        self.signature = {str(k): str(v) for k, v in doc["signature"].items()}
        self.constants = {tuple(int(i) for i in k): v for k, v in doc["constants"]}
        self.fn = _Fn(doc["arg_names"])


_HASH = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}\.json")

_TEXT_IR = (".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".source")
"""Files of a binary's cache group not read for a launch (``CompiledKernel`` reads them all)."""


def _compiled(doc: dict[str, Any]) -> Any | None:
    """The ``CompiledKernel`` a description names, from Triton's cache; None when gone."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.cache import get_cache_manager

    if not _HASH.fullmatch(str(doc["hash"])) or not _NAME.fullmatch(str(doc["group"])):
        return None  # not what `describe` writes: no path is made of it
    group = get_cache_manager(doc["hash"]).get_group(doc["group"])
    if not group or doc["group"] not in group:
        return None
    group = {name: path for name, path in group.items() if not str(path).endswith(_TEXT_IR)}
    return CompiledKernel(_Source(doc), group, doc["hash"])


class Recorder:
    """Keeps the handle keys of one call function (``<folder>/<call key>.handles.json``)."""

    def __init__(self, folder: Path, call_key: str) -> None:
        self.path = folder / f"{call_key}.handles.json"
        self._seen: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self._off = not _usable()

    def remember(self, key: tuple[Any, ...], compiled: Sequence[Any]) -> None:
        """Keep ``compiled`` (one binary per launch, in order) for handle ``key``; once per key."""
        if self._off or key in self._seen:
            return
        self._seen.add(key)
        docs = [describe(c) for c in compiled]
        if not all(isinstance(k, _SCALARS) for k in key) or any(d is None for d in docs):
            logger.debug("handle cache: %s has a launch it cannot describe; not kept", self.path.name)
            return
        with self._lock:
            try:
                now = context()
                kept = _read(self.path, now) or {}
                if len(kept) >= MAX_KEYS or json.dumps(list(key)) in kept:
                    return
                kept[json.dumps(list(key))] = docs
                write_atomic(self.path, json.dumps({"context": now, "keys": kept}))
            except Exception as e:  # a read-only cache, an odd Triton: the next start warms up
                logger.debug("handle cache: cannot keep %s (%s: %s)", self.path.name, type(e).__name__, e)


def _read(path: Path, now: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The keys kept in ``path`` under context ``now`` (`context()` when not given, asked
    only once the file is there: most first calls find none)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if raw.get("context") != (context() if now is None else now):
        return None  # another device, Triton or environment: its binaries are not this one's
    return dict(raw["keys"])


def load(folder: Path, call_key: str) -> dict[tuple[Any, ...], list[Any]] | None:
    """Per handle key kept for this call function, its ``CompiledKernel``s, read from Triton's
    cache and not yet loaded onto the device; None when nothing usable is kept."""
    path = folder / f"{call_key}.handles.json"
    if not _usable():
        return None
    try:
        kept = _read(path)
        if not kept:
            return None
        out: dict[tuple[Any, ...], list[Any]] = {}
        made: dict[tuple[str, str], Any] = {}  # one binary launched twice is one kernel
        for key, docs in kept.items():
            kernels = []
            for doc in docs:
                ident = (doc["hash"], doc["group"])
                if ident not in made:
                    made[ident] = _compiled(doc)
                if made[ident] is None:
                    logger.debug("handle cache: %s names a binary Triton's cache no longer holds", path.name)
                    return None
                kernels.append(made[ident])
            out[tuple(json.loads(key))] = kernels
        return out
    except Exception as e:  # unreadable or from another Triton: warm up as before
        logger.debug("handle cache: %s is unusable (%s: %s)", path.name, type(e).__name__, e)
        return None


def preload(folder: Path, call_key: str, record: Any) -> None:
    """Record, through the call function's ``record`` (``_record``), the handles kept for it:
    its kernels read from Triton's cache and loaded onto the device (`kernels.bind_launchers`),
    before its first call. Nothing when any of them does not load."""
    import torchfuse.runtime.config as rconfig
    from torchfuse.runtime.kernels import bind_launchers

    kept = load(folder, call_key)
    if not kept:
        return
    bind_launchers([c for cs in kept.values() for c in cs], rconfig.config.compile_threads)
    if any(getattr(c, "function", None) is None for cs in kept.values() for c in cs):
        logger.debug("handle cache: a binary of %s did not load; warming up instead", call_key)
        return
    for key, compiled in kept.items():
        record(key, tuple(compiled), keep=False)


def launches_aligned(program: Any) -> bool:
    """Whether every tensor a kernel launch of ``program`` takes is 16-byte aligned on every
    call whose inputs are: an input (whose alignment the handle key holds), or a tensor over
    storage the Program's own steps made (a buffer it allocates, an extern op's new tensor,
    or a view of either: a `ViewStep`, an extern op that returns a view of its argument such
    as ``as_strided`` or ``permute``) at a constant offset that is a multiple of 16 bytes.
    Then a warm-up, which takes every pointer as 16-byte aligned, makes the binary each launch
    takes. A view of an input (its storage's start is not in the key), an offset that depends
    on a symbol, or one of an odd byte count may not be aligned, and a binary made for aligned
    pointers must not be launched on it."""
    from torchfuse.graph import schema as S
    from torchfuse.graph.ops import to_dtype
    from torchfuse.runtime.checks import buffer_table

    buffers = buffer_table(program)
    own: set[str] = {step.buffer for step in program.steps if isinstance(step, S.AllocStep)}
    """Tensors over storage the Program made: its start is aligned (allocators align)."""
    offsets: dict[str, Any] = {name: buf.storage_offset for name, buf in buffers.items()}
    dtypes: dict[str, str] = {name: buf.dtype for name, buf in buffers.items()}
    for step in program.steps:
        if isinstance(step, S.ExternStep):
            base = _aliased_argument(step)
            if base is None or base in own:  # new tensors, or views of a tensor over our storage
                own.update(step.outputs)
        elif isinstance(step, S.ViewStep):
            offsets[step.output] = step.storage_offset
            if step.base in dtypes:
                dtypes.setdefault(step.output, dtypes[step.base])
            if step.base in own:
                own.add(step.output)
    for step in program.steps:
        if not isinstance(step, S.LaunchStep):
            continue
        for arg in step.args:
            if not isinstance(arg, S.TensorRef) or arg.name in program.inputs:
                continue
            offset, dtype = _constant(offsets.get(arg.name)), dtypes.get(arg.name)
            if arg.name not in own or offset is None or dtype is None:
                return False
            try:
                if offset * to_dtype(dtype).itemsize % 16:
                    return False
            except Exception:  # a dtype this torch does not know: not taken as aligned
                return False
    return True


def _constant(expr: Any) -> int | None:
    """An offset expression's value when it names no size symbol; None otherwise."""
    from torchfuse.graph.expr import evaluate, free_symbols

    if expr is None or isinstance(expr, bool):
        return None
    try:
        return None if free_symbols(expr) else evaluate(expr)
    except Exception:  # not an expression of the format: not taken as constant
        return None


def _aliased_argument(step: Any) -> str | None:
    """For an extern op whose returns alias an argument (a view of it: ``as_strided``,
    ``permute``, a split), the name of the tensor they alias; None when every return is a new
    tensor; ``""`` when the aliased tensor cannot be named."""
    from torchfuse.graph import schema as S
    from torchfuse.graph.ops import resolve_op

    try:
        schema = resolve_op(step.op)._schema
    except Exception:  # unknown here: not taken as aligned
        return ""
    aliasing = [r.alias_info for r in schema.returns if r.alias_info is not None]
    if not aliasing:
        return None
    # a list's alias set is its elements' (``Tensor(a)[]``), which the schema object does not
    # show: such a return aliases the argument that has any alias set
    sets = set().union(*(info.before_set for info in aliasing))
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or (sets and not sets & set(a.alias_info.before_set)):
            continue
        value = step.args[i] if i < len(step.args) else step.kwargs.get(a.name)
        return value.name if isinstance(value, S.TensorRef) else ""
    return ""


def keep_tuned(fn: Any, jobs: Sequence[Any], key: tuple[Any, ...] | None) -> None:
    """Record (and keep) the handles of a call function installed after a tuning run, which
    gave that call's result, so the function itself has not run: otherwise a process that
    stops after its tuning call leaves nothing for the tuned function. ``jobs`` are its
    launches' warm-ups in launch order (`CompiledProgram._warmup_jobs`), each now a hit in
    its kernel's memory returning the binary a launch with ``key`` (`codegen.handle_key`)
    takes (when `launches_aligned`: the caller asks); a misaligned input (``key[-1]`` false)
    keeps nothing, as `_record` would."""
    import torchfuse.runtime.config as rconfig
    from torchfuse.runtime.kernels import bind_launchers

    record, handles = fn.__globals__.get("_record"), fn.__globals__.get("_handles")
    if record is None or handles is None or key is None or key in handles:
        return
    try:
        compiled = [job.fn.warmup(*job.args, grid=(1,), **dict(job.kwargs)) for job in jobs]
        bind_launchers(compiled, rconfig.config.compile_threads)
        record(key, tuple(compiled))
    except Exception as e:  # its first call records them instead
        logger.debug("handle cache: tuned handles not recorded (%s: %s)", type(e).__name__, e)
