"""``mode="reduce-overhead"``: record a call as a CUDA graph once per input layout, then replay it.

Per distinct (shapes, strides, dtypes, device) of the inputs: the first call runs normally (it
compiles and autotunes), then the call is run once more on a side stream and recorded with
``torch.cuda.graph`` into a memory pool private to this CompiledProgram, reading from static
input buffers. Later calls copy their inputs into those buffers and replay the graph.

The outputs of a replay are the graph's static output tensors: the next call with the same
layout overwrites them (clone an output to keep it), as with ``torch.compile``'s mode of the
same name. A program keeps at most ``TORCHFUSE_CUDAGRAPH_MAX`` graphs (default 8: with dynamic shapes
there is one per size seen); recording one more drops the least recently replayed, with its
static buffers, and logs it once. Programs the graph cannot express run the normal path, with
the reason logged once
and kept in ``stats.fallback_reasons``: CPU programs, programs that write into their inputs
(a CopyStep into an input, or an extern op that updates one in place), programs returning
views of their inputs, and programs taking CPU tensors (a 0-dim CPU tensor is read as a scalar when recorded).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import config as rconfig
from torchfuse.runtime.checks import mutated_inputs

if TYPE_CHECKING:
    from torchfuse.runtime.program import CompiledProgram

logger = logging.getLogger("torchfuse.runtime")


@dataclass
class _Recorded:
    graph: Any
    static_inputs: list[torch.Tensor]
    static_outputs: list[Any]
    passthrough: dict[int, int]
    """Output position -> input position, for outputs that are inputs themselves."""


def _static_reason(program: S.Program, device_type: str) -> str | None:
    if device_type != "cuda":
        return "CUDA graphs need a cuda program; running the normal path (CPU)"
    on_cpu = [b.name for b in program.buffers if b.name in program.inputs and b.device.split(":")[0] == "cpu"]
    if on_cpu:
        # A 0-dim CPU tensor is read as a scalar when the op is recorded: a replay would reuse it.
        return f"inputs {on_cpu} live on the CPU; running the normal path"
    mutated = mutated_inputs(program)
    if mutated:
        return f"the program writes into its inputs {mutated}; running the normal path"
    from_inputs = set(program.inputs)
    for step in program.steps:
        if isinstance(step, S.ViewStep) and step.base in from_inputs:
            from_inputs.add(step.output)
    views = [o.name for o in program.outputs
             if isinstance(o, S.TensorRef) and o.name in from_inputs and o.name not in program.inputs]
    if views:
        return f"outputs {views} are views of inputs; running the normal path"
    return None


class GraphRunner:
    """The reduce-overhead call path of one CompiledProgram."""

    def __init__(self, compiled: CompiledProgram) -> None:
        self.compiled = compiled
        self.reason = _static_reason(compiled.program, compiled.device_type)
        # input layout -> its graph (None: capture failed), least recently replayed first
        self.recorded: OrderedDict[tuple[Any, ...], _Recorded | None] = OrderedDict()
        self._told_eviction = False
        self.pool: Any = None
        positions = {name: i for i, name in enumerate(compiled.program.inputs)}
        self.passthrough = {j: positions[o.name] for j, o in enumerate(compiled.program.outputs)
                            if isinstance(o, S.TensorRef) and o.name in positions}

    def __call__(self, inputs: tuple[Any, ...]) -> list[Any]:
        compiled = self.compiled
        if self.reason is not None:
            compiled._note_fallback(self.reason)
            return compiled.run_uncaptured(*inputs)
        try:
            key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in inputs)
        except AttributeError:
            return compiled.run_uncaptured(*inputs)  # raises the precise input error
        rec = self.recorded.get(key, False)
        if rec is False:
            out = compiled.run_uncaptured(*inputs)  # warm-up: compiles, autotunes, checks inputs
            self._make_room()
            self.recorded[key] = self._record(inputs)
            return out
        self.recorded.move_to_end(key)
        if rec is None:
            return compiled.run_uncaptured(*inputs)
        for static, value in zip(rec.static_inputs, inputs, strict=True):
            static.copy_(value)
        rec.graph.replay()
        compiled.stats.graph_replays += 1
        outs = list(rec.static_outputs)
        for j, i in rec.passthrough.items():
            outs[j] = inputs[i]
        return outs

    def _make_room(self) -> None:
        """Drop the least recently replayed graphs until one more fits the limit."""
        limit = rconfig.config.cudagraph_max
        while limit and len(self.recorded) >= limit:
            self.recorded.popitem(last=False)
            self.compiled.stats.graph_evictions += 1
            if not self._told_eviction:
                self._told_eviction = True
                logger.info("program %r: more than %d input layouts under reduce-overhead; dropping "
                            "the least recently replayed CUDA graph (TORCHFUSE_CUDAGRAPH_MAX)",
                            self.compiled.program.name, limit)

    def _record(self, inputs: tuple[Any, ...]) -> _Recorded | None:
        compiled = self.compiled
        static = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
                  for t in inputs]
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            # One run on a side stream first, as torch.cuda.graph asks (lazy library state such
            # as cuBLAS workspaces must exist before capture), which also records fast launches.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                compiled.run_uncaptured(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outs = compiled.run_uncaptured(*static)
        except Exception as e:
            compiled._note_fallback(
                f"CUDA graph capture failed ({type(e).__name__}: {e}); running the normal path")
            return None
        compiled.stats.graph_captures += 1
        return _Recorded(graph, static, outs, dict(self.passthrough))
