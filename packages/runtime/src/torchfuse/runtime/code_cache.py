"""Python code objects of the runtime's generated sources, kept in the cache between processes.

A warm start imports every kernel's source file and ``exec``-s each Program's generated call
function: both are Python sources that CPython compiles to bytecode first. That compile was a
large part of a cache-hit start on the H100 (``builtins.compile``: 62 ms of ResNet-18's
0.35 s first call, 86 sources). Python's own ``__pycache__`` would keep the kernels' bytecode,
but not where ``PYTHONDONTWRITEBYTECODE`` is set, and never for a function made with
``compile`` and ``exec``.

`compile_cached` keeps the marshalled code object under ``<cache>/code/``, named by the hash of
the source, its file name and the interpreter's bytecode magic number, so another Python, an
edited source or a renamed Program each get their own entry. Like ``__pycache__``, the cache
directory is trusted: a code object read from it runs without a check, as the sources beside it
are imported (see the format page's trust model). What a Program archive brings is never read
from here: its sources are checked, and only then compiled or looked up by their hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
from pathlib import Path
from types import CodeType

from torchfuse.graph.caches import write_atomic
from torchfuse.runtime.config import logger

stats = {"hits": 0, "misses": 0}
"""Code objects read from the cache, and sources compiled (this process)."""


def code_path(source: str, filename: str, folder: Path) -> Path:
    """Where the code object of ``source`` compiled as ``filename`` is kept."""
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    h.update(filename.encode())
    h.update(b"\0")
    h.update(source.encode())
    return folder / f"{h.hexdigest()[:40]}.code"


def compile_cached(source: str, filename: str, folder: Path) -> CodeType:
    """``compile(source, filename, "exec")``, read from ``folder`` when an earlier process
    compiled the same source under the same name, and written there otherwise.

    A file that cannot be read back as a code object (cut short, another format) is compiled
    over; a folder that cannot be written only costs the next process the compile. Errors in
    the source are raised as ``compile`` raises them.
    """
    path = code_path(source, filename, folder)
    try:
        code = marshal.loads(path.read_bytes())
    except FileNotFoundError:
        code = None
    except (OSError, EOFError, ValueError, TypeError) as e:
        logger.debug("code cache: %s is unreadable (%s); compiling again", path, e)
        code = None
    if isinstance(code, CodeType) and code.co_filename == filename:
        stats["hits"] += 1
        return code
    code = compile(source, filename, "exec")
    stats["misses"] += 1
    try:
        write_atomic(path, marshal.dumps(code))
    except OSError as e:
        logger.debug("code cache: cannot write %s (%s)", path, e)
    return code
