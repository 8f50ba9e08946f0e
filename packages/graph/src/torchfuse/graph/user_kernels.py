"""User Triton kernels as one format op: the kernel description and its eager launch.

A user ``@triton.jit`` kernel launched inside a captured function is recorded as one node,
``torchfuse.triton_kernel.default(str kernel, Tensor[] tensors, int[] mutated) -> Tensor[]``
(see `torchfuse.graph.torchfuse_ops`). ``kernel`` is a canonical JSON string (sorted
keys, no spaces) describing everything a launch needs, so that a graph holding it runs with
this package and Triton alone::

    {"args": [{"name": "x_ptr", "tensor": 0},        # a pointer: tensors[0]
              {"name": "n", "value": 8},             # a runtime scalar (int/float/bool)
              {"name": "BLOCK", "constexpr": 64}],   # a tl.constexpr parameter
     "entry": "add_kernel",                          # the @triton.jit function in source
     "grid": [1],                                    # launch grid, ints (1 to 3 of them)
     "num_stages": 3, "num_warps": 4,
     "source": "import triton\\nimport triton.language as tl\\n\\n@triton.jit\\ndef add_kernel(...): ...",
     "version": 1}

``args`` lists the kernel's parameters in order; every one is passed by keyword. The op is
functional: it clones the tensors at the positions in ``mutated`` (the pointers the kernel
writes), launches the kernel on the clones, and returns them; the caller copies them back
where the program expects the mutation. Triton's ``@jit`` reads its function's source with
``inspect``, so `load_kernel` writes ``source`` to a file named by its content hash and
imports it from there -- after [`check_kernel_source`][torchfuse.graph.kernel_source.check_kernel_source]
accepted it, unless this process wrote the description itself (`dumps` marks the
sources of the user's own kernels as trusted): a graph from an archive never imports a
source that could run code at import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torchfuse.graph.caches import write_atomic
from torchfuse.graph.kernel_source import KernelSourceError, check_kernel_source, mark_trusted

SPEC_VERSION = 1
"""Version of the kernel description; readers reject a newer one."""

_modules: dict[tuple[str, bool], ModuleType] = {}
_lock = threading.Lock()


class UserKernelError(RuntimeError):
    """A kernel description that cannot be loaded or launched."""


def dumps(spec: dict[str, Any]) -> str:
    """The canonical JSON text of a kernel description (what the graph stores). Its source is
    the caller's own code: it is marked trusted (see `torchfuse.graph.kernel_source`)."""
    if isinstance(spec.get("source"), str):
        mark_trusted(spec["source"])
    return json.dumps({**spec, "version": SPEC_VERSION}, sort_keys=True, separators=(",", ":"))


def loads(text: str) -> dict[str, Any]:
    """Parse a kernel description, checking the fields every launch needs."""
    try:
        spec = json.loads(text)
    except (json.JSONDecodeError, RecursionError, TypeError) as e:
        raise UserKernelError(f"triton_kernel: the kernel description is not JSON: {e}") from e
    if not isinstance(spec, dict):
        raise UserKernelError("triton_kernel: the kernel description is not a JSON object")
    version = spec.get("version", 0)
    if not isinstance(version, int) or version > SPEC_VERSION:
        raise UserKernelError(f"triton_kernel: kernel description version {version} is newer than "
                              f"this reader's ({SPEC_VERSION}); upgrade torchfuse-graph")
    missing = [k for k in ("source", "entry", "grid", "args") if k not in spec]
    if missing:
        raise UserKernelError(f"triton_kernel: the kernel description lacks {missing}")
    if not isinstance(spec["source"], str) or not isinstance(spec["entry"], str):
        raise UserKernelError("triton_kernel: the kernel description's source and entry must be strings")
    return spec


def kernel_dir() -> Path:
    """Where kernel sources are written to be imported (a per-user temporary directory)."""
    return Path(tempfile.gettempdir()) / "torchfuse_user_kernels"


def _interpreting() -> bool:
    import triton

    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else False


def load_kernel(source: str, entry: str) -> Any:
    """The Triton function ``entry`` that ``source`` defines (imported once per process), once
    [`check_kernel_source`][torchfuse.graph.kernel_source.check_kernel_source] accepted it."""
    try:
        check_kernel_source(source, entry)
    except KernelSourceError as e:
        raise UserKernelError(f"triton_kernel: refusing to import the source of {entry!r}: {e}") from e
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    path = kernel_dir() / f"uk_{digest}.py"
    # @jit builds an interpreted function when TRITON_INTERPRET is on: keep both builds apart
    key = (str(path), _interpreting())
    with _lock:
        module = _modules.get(key)
        if module is None:
            if not (path.exists() and path.read_text() == source):
                write_atomic(path, source)  # a concurrent reader never sees half a file
            name = f"torchfuse_user_kernels.uk_{digest}{'_interp' if key[1] else ''}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                sys.modules.pop(name, None)
                raise UserKernelError(f"triton_kernel: the source of {entry!r} ({path}) failed to "
                                      f"import: {type(e).__name__}: {e}") from e
            _modules[key] = module
    fn = getattr(module, entry, None)
    if fn is None:
        raise UserKernelError(f"triton_kernel: the source defines no function {entry!r}")
    return fn


def _empty_like_strided(t: torch.Tensor) -> torch.Tensor:
    # the kernel addresses memory with the strides it was given: keep them exactly
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def launch(kernel: str, tensors: list[torch.Tensor], mutated: list[int]) -> list[torch.Tensor]:
    """The eager meaning of ``torchfuse.triton_kernel``: clone what the kernel writes, launch
    the kernel on the clones (other tensors as they are), return the clones."""
    spec = loads(kernel)
    fn = load_kernel(spec["source"], spec["entry"])
    outs = []
    env = list(tensors)
    for i in mutated:
        clone = _empty_like_strided(tensors[i])
        clone.copy_(tensors[i])
        env[i] = clone
        outs.append(clone)
    kwargs: dict[str, Any] = {}
    for a in spec["args"]:
        if "tensor" in a:
            kwargs[a["name"]] = env[a["tensor"]]
        else:
            kwargs[a["name"]] = a["value"] if "value" in a else a["constexpr"]
    options = {k: spec[k] for k in ("num_warps", "num_stages") if spec.get(k) is not None}
    grid = tuple(spec["grid"])
    cuda = next((t.device for t in tensors if t.device.type == "cuda"), None)
    if cuda is not None:  # Triton launches on the current device
        with torch.cuda.device(cuda):
            fn[grid](**kwargs, **options)
    else:
        fn[grid](**kwargs, **options)
    return outs


def meta(kernel: str, tensors: list[torch.Tensor], mutated: list[int]) -> list[torch.Tensor]:
    """Output metadata: one tensor like each mutated input (same sizes and strides)."""
    return [_empty_like_strided(tensors[i]) for i in mutated]


__all__ = ["SPEC_VERSION", "UserKernelError", "dumps", "kernel_dir", "launch", "load_kernel", "loads", "meta"]
