"""Where torchfuse's on-disk caches live, and what tells a cache entry it is stale.

The format package holds the two rules so that every package reads them the same way: the
runtime's caches (kernels, Programs, autotune winners), inductor's Program and plan caches
and the meta-kernel memo (`torchfuse.graph.meta_memo_store`) all live under `cache_root`,
and inductor's compiler fingerprint and the memo file's header both hash package sources
with `source_hash` (a development checkout changes its code without a new version). Every
cache file is written with `write_atomic`, so a concurrent reader never sees half a file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
from collections.abc import Mapping
from pathlib import Path


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` (its folders made) through a temporary file beside it and
    ``os.replace``, so that a process reading it at the same time sees the old content or the
    new, never half of it. An ``OSError`` is raised as is, the temporary file removed; what it
    costs (a cache entry, a warning) is the caller's decision."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``TORCHFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchfuse``, else ``~/.cache/torchfuse``
    (``environ`` defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    root = env.get("TORCHFUSE_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchfuse"


@functools.cache
def source_hash(package: str) -> str:
    """sha256 of the Python source of ``package`` (every ``.py`` file under it, by relative
    path, in order; a file that cannot be read is left out), once per process."""
    spec = importlib.util.find_spec(package)
    digest = hashlib.sha256(package.encode())
    for root in sorted(spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
            except OSError:
                continue
    return digest.hexdigest()


__all__ = ["cache_root", "source_hash", "write_atomic"]
