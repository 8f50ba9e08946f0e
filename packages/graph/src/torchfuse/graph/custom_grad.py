"""A custom ``torch.autograd.Function`` as the format holds it: its forward as ordinary
nodes, its backward as a Graph of its own, joined by one op.

``torchfuse.custom_grad.default(str backward, Tensor[] inputs, Tensor[] outputs, Tensor[] saved) -> Tensor[]``

Capture writes a Function's ``forward`` into the graph with grad mode off (as eager runs
it), then this op. ``outputs`` are what ``forward`` returned (the differentiable ones),
``inputs`` the arguments that require grad, ``saved`` the tensors its ``backward`` reads
(``ctx.saved_tensors`` and tensors kept as ``ctx`` attributes). The op returns new tensors
equal to ``outputs``; differentiating them runs ``backward``: a Graph whose inputs are
``saved`` then one gradient per output, and whose outputs are one gradient per entry of
``inputs`` (``None`` where ``backward`` returned none). ``outputs`` and ``saved`` get no
gradient through the op: they were computed under grad mode off.

``backward`` is the Graph's canonical JSON text (the format's own encoding), so that a graph
holding the op is a plain document: the backward is data, read and verified like the outer
graph (`verify` checks it too), and run by the reference interpreter, whose ops resolve only
to registered operators. Nothing of the Function's Python is kept.

How each stage meets the op:

- the reference interpreter and every backend that calls it: its ``Autograd`` kernel
  (`_CustomGrad`) runs the forward below autograd and, on ``backward``, interprets the
  backward Graph on the real gradients;
- the joint graph (``torchfuse.autograd``): the same kernel runs on fake tensors under the
  recorder, so the backward Graph's ops are recorded into the joint graph's backward, as
  ATen's own derivative formulas are;
- below autograd (a forward compiled for inference or training): a copy of ``outputs``
  (inductor decomposes it into clones, which fuse).
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.graph_symbols import carrier, used_symbols

_MAX_TEXT = 8 << 20
"""The largest backward Graph text accepted (bytes): a Function's backward is small."""


class CustomGradError(RuntimeError):
    """A backward Graph that cannot be read."""


def dumps(graph: S.Graph) -> str:
    """The canonical JSON text of a backward Graph (what the op's first argument holds)."""
    return msgspec.json.encode(graph, order="sorted").decode()


@functools.lru_cache(maxsize=256)
def loads(text: str) -> S.Graph:
    """The Graph of ``text`` (a backward, or a checkpointed region), validated against the
    schema."""
    if len(text) > _MAX_TEXT:
        raise CustomGradError(f"{len(text)} bytes, over the {_MAX_TEXT}-byte limit")
    try:
        return msgspec.json.decode(text, type=S.Graph)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise CustomGradError(f"not a valid Graph document: {e}") from e


def bound_to_inputs(graph: S.Graph) -> S.Graph | None:
    """``graph`` (recorded with the outer graph's size symbols) with only the symbols it uses,
    each bound from its own inputs (``input:<k>.size(<d>)`` of the first input with that
    symbol as a size) and none of the outer graph's guards; None when a symbol it uses is
    no input's size."""
    used = used_symbols(graph)
    carriers = {name: carrier(graph, name) for name in used}
    if None in carriers.values():
        return None
    symbols = tuple(msgspec.structs.replace(sym, source=carriers[sym.name])
                    for sym in graph.symbols if sym.name in used)
    return msgspec.structs.replace(graph, symbols=symbols, guards=())


def run_held(graph: S.Graph, inputs: list[torch.Tensor]) -> list[Any]:
    """Run a held Graph on ``inputs``. With sizes that are symbols (fakes of a symbolic joint
    graph), its symbols are bound to those symbolic sizes as they are, not made ints (which
    would specialize them); otherwise the reference interpreter's `run`, inputs checked."""
    from torchfuse.graph.interpreter import Interpreter, bind_symbols, no_autocast, run

    if not any(isinstance(n, torch.SymInt) for t in inputs for n in t.shape):
        return list(run(graph, *inputs))
    interp = Interpreter(graph)
    interp.symbols = bind_symbols(graph.symbols, inputs, symbolic=True)
    with no_autocast():
        return interp._run_nodes({inp.name: v for inp, v in zip(graph.inputs, inputs, strict=True)})


def forward(backward: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
            saved: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op below autograd: new tensors equal to ``outputs``."""
    return [o.clone() for o in outputs]


class _CustomGrad(torch.autograd.Function):
    """The op above autograd: ``outputs`` copied, with ``backward`` as their derivative."""

    @staticmethod
    def forward(ctx, backward: str, n_inputs: int, n_outputs: int, *tensors: torch.Tensor):  # type: ignore[override]
        inputs = list(tensors[:n_inputs])
        outputs = list(tensors[n_inputs:n_inputs + n_outputs])
        saved = list(tensors[n_inputs + n_outputs:])
        ctx.backward_text = backward
        ctx.n_inputs, ctx.n_outputs = n_inputs, n_outputs
        ctx.output_metas = [(o.shape, o.dtype, o.device) for o in outputs]
        ctx.save_for_backward(*saved)
        with torch._C._AutoDispatchBelowAutograd():
            return tuple(torch.ops.torchfuse.custom_grad.default(backward, inputs, outputs, saved))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):  # type: ignore[override]
        graph = loads(ctx.backward_text)
        filled = [g.contiguous() if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                  for g, (shape, dtype, device) in zip(grads, ctx.output_metas, strict=True)]
        result = run_held(graph, [*ctx.saved_tensors, *filled])
        if len(result) != ctx.n_inputs:
            raise CustomGradError(f"backward graph gives {len(result)} gradients for {ctx.n_inputs} inputs")
        saved = len(ctx.saved_tensors)
        return (None, None, None, *result, *[None] * (ctx.n_outputs + saved))


def with_grad(backward: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
              saved: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op's ``Autograd`` kernel."""
    return list(_CustomGrad.apply(backward, len(inputs), len(outputs), *inputs, *outputs, *saved))


def check(text: Any, verify_graph: Any, what: str = "backward graph") -> str | None:
    """Why the first argument of a ``custom_grad`` (or ``checkpoint``) node is not a readable,
    valid Graph (``verify_graph`` checks it as the outer one is checked), or None."""
    if not isinstance(text, S.Str):
        return f"{what}: the first argument is not a string"
    try:
        graph = loads(text.value)
    except CustomGradError as e:
        return f"{what}: {e}"
    try:
        verify_graph(graph)
    except Exception as e:  # the verifier's own error, re-raised by the caller with context
        return f"{what}: {e}"
    return None
