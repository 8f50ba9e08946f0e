"""An activation-checkpointed region (``torch.utils.checkpoint.checkpoint``) as the format
holds it: the region as a Graph of its own, run by one op.

``torchfuse.checkpoint.default(str region, Tensor[] inputs) -> Tensor[]``

``region`` is the canonical JSON text of a Graph (as for `torchfuse.graph.custom_grad`):
its inputs are the tensors the region reads (the checkpointed function's tensor arguments,
then the parameters, buffers and constants it reads), its outputs the function's tensor
results. The op returns what running that Graph on ``inputs`` returns. What makes it a
checkpoint is its derivative: its ``Autograd`` kernel (`_Checkpoint`) keeps only ``inputs``
for the backward, and there runs the region again with grad mode on and differentiates that,
as eager's checkpoint recomputes the region instead of keeping its activations.

How each stage meets the op:

- the reference interpreter: the kernel above, on real tensors;
- the joint graph (``torchfuse.autograd``): the same kernel on fakes under the recorder, so
  the forward holds one ``checkpoint`` node and the backward the region's ops again, then
  their derivatives; the partition then saves the region's inputs, not its activations;
- below autograd: the region's ops (inductor inlines the Graph, `run_region`).

Capture writes the op only for a region without random ops: eager's checkpoint replays the
random generator's state to draw the same numbers twice, which a Graph run twice does not.
"""

from __future__ import annotations

import torch
from torchfuse.graph.custom_grad import dumps, loads, run_held

__all__ = ["after", "dumps", "loads", "region_meta", "run_region", "with_grad"]


def run_region(region: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op below autograd: the region Graph run on ``inputs``."""
    return run_held(loads(region), inputs)


def region_meta(region: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op's meta kernel: empty tensors laid out as the region Graph's outputs were
    recorded (running the Graph on meta tensors would not do: a factory op in it that names
    the CPU, a 0-d constant, makes a real tensor beside the meta ones)."""
    from torchfuse.graph.expr import evaluate
    from torchfuse.graph.interpreter import bind_symbols
    from torchfuse.graph.ops import to_dtype

    graph = loads(region)
    env = bind_symbols(graph.symbols, inputs, symbolic=True)  # symbolic sizes stay symbolic
    outs = []
    for o in graph.outputs:
        meta = graph.values[o.value.name]  # type: ignore[union-attr]
        outs.append(torch.empty_strided([evaluate(n, env) for n in meta.sizes],
                                        [evaluate(n, env) for n in meta.strides],
                                        dtype=to_dtype(meta.dtype), device="meta"))
    return outs


class _Checkpoint(torch.autograd.Function):
    """The op above autograd: the region run without keeping what it computed; run again,
    with grad mode on, on backward."""

    @staticmethod
    def forward(ctx, region: str, *inputs: torch.Tensor):  # type: ignore[override]
        ctx.region = region
        ctx.save_for_backward(*inputs)
        with torch._C._AutoDispatchBelowAutograd():
            outs = torch.ops.torchfuse.checkpoint.default(region, list(inputs))
        ctx.mark_non_differentiable(*[o for o in outs
                                      if not (o.dtype.is_floating_point or o.dtype.is_complex)])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):  # type: ignore[override]
        inputs = [t.detach().requires_grad_(need) for t, need in
                  zip(ctx.saved_tensors, ctx.needs_input_grad[1:], strict=True)]
        # the recompute reads the inputs through `after` a gradient: traced into a joint graph,
        # its ops then depend on a tangent, so the partition keeps them in the backward
        # (ops that depend on primals alone it may move to the forward and save)
        anchor = [g for g in grads if g is not None][:1]
        with torch.enable_grad():
            outs = run_held(loads(ctx.region), [after(t, anchor) if anchor else t for t in inputs])
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
        wanted = [t for t in inputs if t.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                       allow_unused=True) if pairs and wanted else ())
        return (None, *[next(got, None) if t.requires_grad else None for t in inputs])


class _After(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, *deps: torch.Tensor):  # type: ignore[override]
        ctx.n = len(deps)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.torchfuse.after.default(x, list(deps))

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return (g, *[None] * ctx.n)


def after(x: torch.Tensor, deps: list[torch.Tensor]) -> torch.Tensor:
    """``x``, read after ``deps`` (``torchfuse.after``): a copy of ``x`` whose gradient is
    ``x``'s; below autograd inductor makes it ``x`` itself."""
    return _After.apply(x, *deps)


def after_no_grad(x: torch.Tensor, deps: list[torch.Tensor]) -> torch.Tensor:
    """The ``after`` op below autograd."""
    return x.clone()


def with_grad(region: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op's ``Autograd`` kernel."""
    return list(_Checkpoint.apply(region, *inputs))
