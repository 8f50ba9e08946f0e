"""How the outputs of a compiled training call relate, as views, to its inputs and buffers.

The compiled forward returns tensors in the Graph's output order. Two of them need
reshaping before the caller sees them:

* an output that is a view of an input (`alias_input`) is made again as a view of the
  caller's real input, so that a write through one is seen through the other, as in eager;
* an output the forward made as a view of one of its own buffers (`views_made_plain`)
  comes back as a plain tensor over that memory: autograd forbids writing a custom
  Function's view outputs in place, where eager's result may be written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.interpreter import bind_symbols


def alias_input(g: S.Graph, o: S.GraphOutput, value: Any, inputs: Sequence[Any],
           position: dict[str, int]) -> Any:
    """An output that is a view of an input is re-made as a view of the real input."""
    if not o.aliases_input or not isinstance(o.value, S.TensorRef):
        return value
    base = inputs[position[o.aliases_input]]
    if o.value.name == o.aliases_input:
        return base
    try:
        env = bind_symbols(g.symbols, inputs)
        meta, base_meta = g.values[o.value.name], g.values[o.aliases_input]
        sizes = [evaluate(s, env) for s in meta.sizes]
        strides = [evaluate(s, env) for s in meta.strides]
        offset = evaluate(meta.storage_offset, env) - evaluate(base_meta.storage_offset, env)
        if [evaluate(s, env) for s in base_meta.strides] != list(base.stride()):
            return value  # the caller's input is laid out differently: keep the copy
        return base.as_strided(sizes, strides, base.storage_offset() + offset)
    except (KeyError, ValueError, RuntimeError):
        return value


def views_made_plain(user: list[Any], saved: Sequence[Any]) -> list[Any]:
    """The outputs, each one the compiled forward made as a view of a buffer of its own
    (``(x @ w).view(-1)``) and that shares its memory with no other output and no saved
    tensor replaced by a tensor over the same memory that is not a view.

    Returned from a custom Function, such a view may not be written in place ("Output 0 of
    _CompiledFunction is a view and is being modified inplace"), while eager's result is a
    view of an intermediate nobody else holds, which may be (wav2vec2 masks its hidden
    states so after a graph break). Where the memory is shared, a write would change what
    the backward reads, or another output, behind autograd's back: those stay views, and
    autograd keeps refusing the write. Outputs that alias an input are made again from that
    input afterwards (`alias_input`)."""
    def key(t: Any) -> int | None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return None
        return t.untyped_storage().data_ptr()

    count: dict[int, int] = {}
    for t in [*user, *saved]:
        k = key(t)
        if k is not None:
            count[k] = count.get(k, 0) + 1
    out = []
    for t in user:
        if type(t) is torch.Tensor and t._base is not None and count.get(key(t), 0) == 1:
            plain = t.new_empty(0)
            plain.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
            t = plain
        out.append(t)
    return out
