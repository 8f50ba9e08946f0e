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

**Random numbers.** Eager's checkpoint keeps the random generator's state and replays it,
so the recompute draws the numbers the forward drew. A Graph run twice would draw new ones.
So a region that draws (dropout's ``bernoulli_``, drop path's ``rand``) is held with its
draws kept (`keep_draws`): after each random node, a ``clone`` of what it drew becomes an
extra output of the region (the last ``meta["checkpoint.draws"]`` outputs), saved for the
backward beside the inputs; the recompute (`recompute_graph`) writes the saved numbers where
the region drew (``copy_`` into the buffer an in-place draw fills, ``clone`` for one that
makes its own), and everything after reads them as the forward did. That keeps one tensor
per draw (a dropout mask, as large as the activation it masks), still far less than the
region's activations; eager keeps none, only the generator's state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.custom_grad import dumps, loads, run_held
from torchfuse.graph.layouts import is_dense
from torchfuse.graph.tracing import mutated_arguments

__all__ = ["DRAWS", "RegionError", "after", "draws", "dumps", "keep_draws", "loads", "recompute_graph",
           "region_meta", "run_region", "with_grad"]

DRAWS = "checkpoint.draws"
"""Meta key of a region Graph: how many of its last outputs are kept draws."""


class RegionError(ValueError):
    """A region Graph whose kept draws are not laid out as `keep_draws` lays them out."""


def draws(graph: S.Graph) -> int:
    """How many of ``graph``'s last outputs are kept draws."""
    try:
        k = int(graph.meta.get(DRAWS, "0"))
    except ValueError:
        raise RegionError(f"{DRAWS} is {graph.meta.get(DRAWS)!r}, not a count") from None
    if not 0 <= k <= len(graph.outputs):
        raise RegionError(f"{DRAWS} is {k}, for {len(graph.outputs)} outputs")
    return k


def keep_draws(graph: S.Graph, draws_numbers: Callable[[S.Node], bool]) -> S.Graph | None:
    """``graph`` with what each random node (``draws_numbers(node)``) drew cloned right after
    it and returned as an extra output; None when a random node has more than one output or
    a layout a ``clone`` would not keep (not dense)."""
    from torchfuse.graph.ops import resolve_op

    nodes: list[S.Node] = []
    values = dict(graph.values)
    kept: list[str] = []
    for node in graph.nodes:
        nodes.append(node)
        if not draws_numbers(node):
            continue
        outs = [o for o in node.outputs if o]
        if len(outs) != 1 or not is_dense(values[outs[0]].sizes, values[outs[0]].strides):
            return None
        if mutated_arguments(resolve_op(node.op)) not in ([], [0]):
            return None
        name = _fresh(values, f"{outs[0]}_drawn")
        values[name] = values[outs[0]]
        nodes.append(S.Node(name=name, op="aten.clone.default", args=(S.TensorRef(name=outs[0]),),
                            kwargs={}, outputs=(name,)))
        kept.append(name)
    if not kept:
        return graph
    outputs = (*graph.outputs, *(S.GraphOutput(value=S.TensorRef(name=n)) for n in kept))
    return msgspec.structs.replace(graph, nodes=tuple(nodes), values=values, outputs=outputs,
                                   meta={**graph.meta, DRAWS: str(len(kept))})


def recompute_graph(graph: S.Graph) -> S.Graph:
    """The region of `keep_draws` as the backward runs it again: the kept draws are its last
    inputs; each random node writes them where it drew instead of drawing (``copy_`` into
    the buffer an in-place one fills, a ``clone`` for one that makes its own); the clones
    and the extra outputs are gone."""
    from torchfuse.graph.ops import resolve_op

    k = draws(graph)
    if not k:
        return graph
    kept = [o.value.name for o in graph.outputs[-k:] if isinstance(o.value, S.TensorRef)]
    clones = {n.name: n for n in graph.nodes if n.name in kept and n.op == "aten.clone.default"
              and len(n.args) == 1 and isinstance(n.args[0], S.TensorRef)}
    if len(kept) != k or len(clones) != k:
        raise RegionError("its kept draws are not the clones keep_draws writes")
    drawn = {clones[n].args[0].name: n for n in kept}  # type: ignore[union-attr]
    inputs = list(graph.inputs)
    nodes: list[S.Node] = []
    for node in graph.nodes:
        if node.name in clones:
            continue
        out = next((o for o in node.outputs if o in drawn), None)
        if out is None:
            nodes.append(node)
            continue
        saved = drawn[out]
        inputs.append(S.GraphInput(name=saved))
        in_place = mutated_arguments(resolve_op(node.op)) == [0]
        if in_place and node.args and isinstance(node.args[0], S.TensorRef):
            nodes.append(S.Node(name=node.name, op="aten.copy_.default",
                                args=(node.args[0], S.TensorRef(name=saved)), kwargs={}, outputs=(out,)))
        else:
            nodes.append(S.Node(name=node.name, op="aten.clone.default", args=(S.TensorRef(name=saved),),
                                kwargs={}, outputs=(out,)))
    if len(inputs) != len(graph.inputs) + k:
        raise RegionError("a kept draw has no random node that made it")
    meta = {key: v for key, v in graph.meta.items() if key != DRAWS}
    return msgspec.structs.replace(graph, inputs=tuple(inputs), nodes=tuple(nodes),
                                   outputs=graph.outputs[:-k], meta=meta)


@functools.lru_cache(maxsize=64)
def _recompute(region: str) -> S.Graph:
    """The Graph the backward runs for ``region`` (itself when it keeps no draws)."""
    return recompute_graph(loads(region))


def _fresh(values: dict[str, S.TensorMeta], base: str) -> str:
    name, n = base, 0
    while name in values:
        n += 1
        name = f"{base}_{n}"
    return name

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
        ctx.region, ctx.n_inputs = region, len(inputs)
        with torch._C._AutoDispatchBelowAutograd():
            outs = torch.ops.torchfuse.checkpoint.default(region, list(inputs))
        k = draws(loads(region))
        kept = list(outs[len(outs) - k:]) if k else []
        ctx.save_for_backward(*inputs, *kept)  # the draws: the recompute reads them, not the generator
        ctx.mark_non_differentiable(
            *[o for o in outs if not (o.dtype.is_floating_point or o.dtype.is_complex)], *kept)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):  # type: ignore[override]
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(need) for t, need in
                  zip(saved[:ctx.n_inputs], ctx.needs_input_grad[1:], strict=True)]
        kept = [t.detach() for t in saved[ctx.n_inputs:]]
        grads = grads[:len(grads) - len(kept)] if kept else grads
        # the recompute reads the inputs through `after` a gradient: traced into a joint graph,
        # its ops then depend on a tangent, so the partition keeps them in the backward
        # (ops that depend on primals alone it may move to the forward and save)
        anchor = [g for g in grads if g is not None][:1]
        with torch.enable_grad():
            outs = run_held(_recompute(ctx.region),
                            [*(after(t, anchor) if anchor else t for t in inputs), *kept])
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
