"""The ``cudagraphs`` backend: capture, then CUDA-graph replay, without code generation.

Each node of the Graph becomes one [`ExternStep`][torchfuse.graph.schema.ExternStep] (a call of its
ATen op), and the resulting Program is loaded by the runtime in ``reduce-overhead`` mode, which
records the whole call once into a CUDA graph and replays it. What this buys is launch
overhead: a graph of many small ops costs one replay instead of one Python dispatch per op.
It is the baseline that tells how much of inductor's gain is fusion and how much is overhead.

With grad mode on and an input that requires grad, the graph goes through
``torchfuse.autograd.aot`` first and each half is compiled this way. Where CUDA graphs cannot
be used (CPU inputs, programs that mutate their inputs) the runtime runs the Program normally
and logs why once.

Example::

    >>> compiled = torchfuse.capture.compile(fn, backend="cudagraphs")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import device_types, no_autocast
from torchfuse.graph.torchfuse_ops import records_grad


def extern_program(graph: S.Graph, *, device: str) -> S.Program:
    """``graph`` as a Program of extern calls, one per node, in graph order.

    Buffer names are value names, so node arguments carry over unchanged. Every value keeps
    its metadata as a [`Buffer`][torchfuse.graph.schema.Buffer], which the runtime checks inputs
    against.
    """
    buffers = tuple(
        S.Buffer(name=name, dtype=m.dtype, sizes=m.sizes, strides=m.strides,
                 storage_offset=m.storage_offset, device=m.device)
        for name, m in graph.values.items()
    )
    steps = tuple(
        S.ExternStep(op=n.op, args=n.args, kwargs=n.kwargs, outputs=n.outputs) for n in graph.nodes
    )
    return S.Program(
        name=graph.name,
        inputs=tuple(i.name for i in graph.inputs),
        outputs=tuple(o.value for o in graph.outputs),
        buffers=buffers,
        steps=steps,
        symbols=graph.symbols,
        device=device,
        opsets=dict(graph.opsets),
        meta={"backend": "cudagraphs"},
    )


def _device(example_inputs: Sequence[Any]) -> str:
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _compiler(device: str) -> Callable[[S.Graph, Sequence[Any]], Callable[..., list]]:
    def compile_half(graph: S.Graph, example_inputs: Sequence[Any]) -> Callable[..., list]:
        from torchfuse.runtime import load

        mode = "reduce-overhead" if device == "cuda" else "default"
        fn = load(extern_program(graph, device=device), device=device, mode=mode)
        types = device_types(graph)

        def run(*inputs: Any) -> list:
            # the graph's ops carry autocast's dtypes already: an enclosing autocast must not
            # cast them again (see torchfuse.graph.interpreter.no_autocast)
            with no_autocast(types):
                return list(fn(*inputs))

        return run

    return compile_half


def cudagraphs(graph: S.Graph, example_inputs: Sequence[Any]) -> Callable[..., list]:
    """The backend (entry point ``torchfuse.backends: cudagraphs``)."""
    compile_half = _compiler(_device(example_inputs))
    wants_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs) and records_grad(graph)
    if not wants_grad:
        return compile_half(graph, example_inputs)
    from torchfuse.autograd import aot

    fn = aot(graph, compile_half, compile_half)
    return lambda *inputs: list(fn(*inputs))
