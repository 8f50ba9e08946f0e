"""Library kernels loaded in a background thread during a Program's first GPU call.

A Program's extern steps call library kernels; the first call of a cuDNN convolution
configuration in a process loads its kernels (CUDA loads modules lazily) and reads their
attributes. In a warm first call of ResNet-50 inference (``torch.profiler``, 2026-12-07) its
53 convolutions took 138 ms of CPU, 49 of them lazy module loading and 58
``cudaFuncGetAttributes`` (docs/performance.md, "The warm misses attributed"): a cost no
cache on disk removes, paid again by every process.

Loaded modules belong to the process, not to a thread. So, when a Program's first call
starts, `start` hands the distinct convolutions of its extern steps (sizes, strides, dtype
and arguments, symbols evaluated for this call) to a thread that calls each once on
uninitialised tensors of its own, while the caller chooses configs, binds its Triton kernels
and runs the first steps. The caller's later convolutions then find their kernels loaded.
The thread launches on the device's default stream, where a Program runs unless its caller
chose another: its convolutions queue between the caller's kernels (a few ms of GPU time on
a first call), and the memory it frees goes back to the pool the caller allocates from (a
stream of its own would keep those blocks apart). What the thread cannot do for the caller:
ATen keeps cuDNN's execution plans per thread (``thread_local`` in ``Conv_v8.cpp``), so the
caller still builds its own.

On by default (``TORCHFUSE_LIBRARY_WARMUP=0`` turns it off; docs/runtime.md), except under
``mode="reduce-overhead"`` (a CUDA graph being captured while another thread launches fails)
and while the runtime's background thread is compiling (`torchfuse.runtime.background.busy`:
a training step's backward compiles beside its forward's first call). Measured on an H100:
the warm first run of ResNet-50 and ResNet-18 inference was 26-42 ms shorter on every pair;
beside a backward's compiles the two threads slowed each other (ResNet-50 training's warm
first call +46 ms, MobileNet-V3's +102 ms), so there it does not start.
A job whose tensors would take more than `MAX_BYTES` is left out (the thread allocates them
beside the caller's buffers), and a failure in the thread is logged (``TORCHFUSE_LOGS=+runtime``)
and ends it: the caller's own call reports its errors, so nothing is hidden. The thread is
joined at interpreter exit (`join_all`), so it never calls into CUDA while the process tears
down.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.ops import decode_arg, resolve_op, to_dtype
from torchfuse.runtime.checks import buffer_table

logger = logging.getLogger("torchfuse.runtime")

OPS = frozenset({"aten.convolution.default"})
"""Extern ops warmed up: those whose first call in a process loads library kernels."""

MAX_BYTES = 1 << 30
"""The most bytes one job's tensors (inputs and output) may take: 1 GiB."""


@dataclass(frozen=True)
class Job:
    """One distinct library call: the op and its arguments, tensors as (sizes, strides, dtype)."""

    op: str
    args: tuple[Any, ...]
    nbytes: int


def _tensor_spec(buf: S.Buffer, symbols: Mapping[str, int]) -> tuple[Any, ...]:
    sizes = tuple(evaluate(e, symbols) for e in buf.sizes)
    strides = tuple(evaluate(e, symbols) for e in buf.strides)
    return ("tensor", sizes, strides, buf.dtype)


def _bytes(spec: tuple[Any, ...]) -> int:
    """Bytes of a (sizes, strides, dtype) tensor's elements (as `autotune.launch_bytes` counts)."""
    _, sizes, _, dtype = spec
    return math.prod(sizes) * to_dtype(dtype).itemsize


def _encode(arg: S.Argument, buffers: Mapping[str, S.Buffer], symbols: Mapping[str, int]) -> Any:
    """``arg`` with each tensor replaced by its spec (a hashable job key); KeyError for a tensor
    that is not one of the Program's buffers (a constant it was loaded with)."""
    if isinstance(arg, S.TensorRef):
        return _tensor_spec(buffers[arg.name], symbols)
    if isinstance(arg, S.ListArg):
        return ("list", tuple(_encode(a, buffers, symbols) for a in arg.items))
    return ("value", decode_arg(arg, {}, symbols))


def jobs(program: S.Program, symbols: Mapping[str, int]) -> list[Job]:
    """The distinct calls of `OPS` among ``program``'s extern steps, for these symbol values,
    in the order the Program makes them; those naming a tensor that is not a buffer (a
    constant) or too big (`MAX_BYTES`) are left out."""
    buffers = buffer_table(program)
    out: dict[tuple[Any, ...], Job] = {}
    for step in program.steps:
        if not isinstance(step, S.ExternStep) or step.op not in OPS or step.kwargs:
            continue
        try:
            args = tuple(_encode(a, buffers, symbols) for a in step.args)
            outs = [_tensor_spec(buffers[name], symbols) for name in step.outputs]
            nbytes = sum(_bytes(a) for a in (*args, *outs) if a[0] == "tensor")
        except Exception as e:  # a constant, an unbound symbol, a dtype it cannot read: left out
            logger.debug("library warm-up: %s left out (%s: %s)", step.op, type(e).__name__, e)
            continue
        key = (step.op, args)
        if key not in out and nbytes <= MAX_BYTES:
            out[key] = Job(step.op, args, nbytes)
    return list(out.values())


def _materialize(spec: Any, device: torch.device) -> Any:
    kind = spec[0]
    if kind == "tensor":
        _, sizes, strides, dtype = spec
        return torch.empty_strided(sizes, strides, dtype=to_dtype(dtype), device=device)
    if kind == "list":
        return [_materialize(s, device) for s in spec[1]]
    return spec[1]


def run(work: Sequence[Job], device: torch.device) -> int:
    """Call every job once on fresh uninitialised tensors; the number called. Raises what a
    call raises (the thread logs it)."""
    done = 0
    for job in work:
        resolve_op(job.op)(*(_materialize(a, device) for a in job.args))
        done += 1
    return done


_threads: list[threading.Thread] = []
_threads_lock = threading.Lock()


def _in_thread(work: Sequence[Job], device: torch.device, name: str) -> None:
    try:
        with torch.cuda.device(device):  # on the device's default stream (see the module's text)
            run(work, device)
    except Exception as e:  # the caller's own call of the same op reports it
        logger.debug("library warm-up of %r stopped: %s: %s", name, type(e).__name__, e)


def start(program: S.Program, symbols: Mapping[str, int], device: torch.device) -> int:
    """Start the background thread for ``program``'s library calls on CUDA ``device``; the
    number of calls it was given (0: no thread)."""
    work = jobs(program, symbols)
    if not work:
        return 0
    thread = threading.Thread(target=_in_thread, args=(work, device, program.name),
                              name=f"torchfuse-library-warmup:{program.name}", daemon=True)
    with _threads_lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return len(work)


@atexit.register
def join_all(timeout: float = 10.0) -> None:
    """Wait for the warm-up threads still running (at interpreter exit: none may call into
    CUDA while the process tears down)."""
    with _threads_lock:
        threads = list(_threads)
    for t in threads:
        t.join(timeout)
