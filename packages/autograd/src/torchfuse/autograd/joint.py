r"""The joint forward+backward graph, produced by the eager autograd engine on fake tensors.

The (functionalized) graph is re-run on [`FakeTensor`][torchfuse.graph.FakeTensor] primals that
require grad, under a [`Recorder`][torchfuse.graph.Recorder]; then
``torch.autograd.grad(outputs, primals, tangents, allow_unused=True)`` runs the backward,
whose ATen ops the recorder also writes down. The result is one graph::

    inputs:  primals (the original inputs, same names and kinds), then tangents
             (kind ``tangent``, target ``output:<i>``: the gradient of forward output i)
    outputs: the forward outputs (same kinds), then one ``gradient`` output per input that
             requires grad (target = input name)

Undefined gradients (an input the outputs do not depend on) are outputs whose value is
`NoneArg`: the glue returns ``None`` for them, as eager does
with ``allow_unused=True``, and no zeros are materialized.

Tangents exist only for floating tensor outputs (not for list outputs) that depend on an
input requiring grad. A tangent is laid out as its output is when that output is dense
(channels-last, permuted: the layout an upstream gradient computed from the output has, so
the backward's gradients get eager's strides), contiguous otherwise (an expanded or sliced
output, or sizes with symbols); see `tangent_strides`. Callers pass tangents in that layout
(the glue copies one that comes in another).

Symbolic sizes: the primals of a graph with size symbols are fakes whose sizes are
``SymInt``\ s of a [`SizeEnv`][torchfuse.graph.symbolic.SizeEnv] holding the graph's symbols, so
the derivative formulas compute with size expressions and the joint graph has the same
symbols. A relation a formula branches on (``prod``'s backward asks whether the reduced dim
is 2) is appended to the joint graph's guards. Ops whose formulas turn sizes into a float
(``var``'s ``2 / (n - 1)``) are differentiated through their rules in
[`SYMBOLIC_PRE_AUTOGRAD`][torchfuse.autograd.decompositions.SYMBOLIC_PRE_AUTOGRAD] instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import torch
from torchfuse.autograd.common import (
    AutogradError,
    PassRecorder,
    decode,
    eliminate_dead_code,
    fake_from_meta,
    retrace_builder,
    retracing,
    strip_identities,
    where,
)
from torchfuse.autograd.decompositions import SYMBOLIC_PRE_AUTOGRAD
from torchfuse.autograd.functionalize import functionalize, has_mutations
from torchfuse.graph import schema as S
from torchfuse.graph.ops import encode_arg, flatten_result, resolve_op
from torchfuse.graph.symbolic import SizeEnv
from torchfuse.graph.tracing import FakeTensor, Recorder, no_user_saved_tensor_hooks

NUM_FWD_OUTPUTS = "autograd.num_fwd_outputs"
"""``Graph.meta`` key of a joint graph: how many leading outputs are forward outputs."""


def _differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def tangent_target(index: int) -> str:
    return f"output:{index}"


def tangent_index(target: str | None) -> int:
    if not target or not target.startswith("output:"):
        raise AutogradError(f"tangent input with target {target!r}; expected 'output:<i>'")
    return int(target.removeprefix("output:"))


def tangent_strides(sizes: Sequence[object], strides: Sequence[object]) -> tuple[int, ...] | None:
    """The strides a tangent of an output with these sizes and strides is traced with: the
    output's own when they are concrete and the output is non-overlapping and dense (every
    element once, no gaps: contiguous, channels-last, any permutation), else None
    (contiguous). Eager's gradients follow the layout of the gradient they are given, which
    for a dense output is usually the output's; a tangent traced dense would make a
    channels-last network's backward produce contiguous gradients, unlike eager's."""
    if not all(isinstance(v, int) for v in (*sizes, *strides)):
        return None
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(sizes, strides, strict=True) if n != 1):
        if stride != expected:
            return None
        expected *= size
    return tuple(strides)  # type: ignore[arg-type]


def joint_graph(graph: S.Graph, requires_grad: Sequence[bool]) -> S.Graph:
    """The joint graph of ``graph`` for inputs flagged by ``requires_grad`` (see module doc).

    ``graph`` is functionalized first when it has mutations. Non-floating inputs never get a
    gradient even when flagged. Example, for ``(x * w).sin().sum()`` with only ``w``
    requiring grad::

        def graph_joint(x, w, tangent_0):
            mul = aten.mul.Tensor(x, w); sin = aten.sin.default(mul); sum = aten.sum.default(sin)
            expand = aten.expand.default(tangent_0, [4]); cos = aten.cos.default(mul)
            mul_1 = aten.mul.Tensor(expand, cos); mul_2 = aten.mul.Tensor(mul_1, x)
            return (sum, mul_2)   # user_output, gradient w
    """
    if len(requires_grad) != len(graph.inputs):
        raise AutogradError(f"requires_grad has {len(requires_grad)} entries, graph {graph.name!r} "
                            f"has {len(graph.inputs)} inputs")
    if has_mutations(graph):
        graph = functionalize(graph)
    absent = _absent_device(graph)
    if absent is not None:
        # the autograd engine needs a device guard for the fakes' device: trace on cpu, then
        # stamp the real device back (the graph must not also hold genuine cpu values)
        joint = joint_graph(retarget_device(graph, absent, "cpu"), requires_grad)
        return retarget_device(joint, "cpu", absent)
    builder, env = retrace_builder(graph, f"{graph.name}_joint")
    rec = PassRecorder(builder)
    primals: list[FakeTensor] = []
    with retracing(env), rec, torch.enable_grad(), no_user_saved_tensor_hooks():
        for inp, rg in zip(graph.inputs, requires_grad, strict=True):
            fake = fake_from_meta(graph.values[inp.name], env, requires_grad=rg)
            primals.append(rec.input(fake, name=inp.name, kind=inp.kind, target=inp.target))
        outs = _run(graph, primals, env)
        diff_outs, tangents = [], []
        for i, out in enumerate(outs):
            if isinstance(out, torch.Tensor) and out.requires_grad and _differentiable(out.dtype):
                strides = tangent_strides(out.shape, out.stride())
                meta = (torch.empty(out.shape, dtype=out.dtype, device="meta") if strides is None else
                        torch.empty_strided(out.shape, strides, dtype=out.dtype, device="meta"))
                example = FakeTensor(meta, out.device)
                tangents.append(rec.input(example, name=f"tangent_{i}", kind="tangent",
                                          target=tangent_target(i), requires_grad=False))
                diff_outs.append(out)
        wanted = [p for p in primals if p.requires_grad]
        grads: Sequence[torch.Tensor | None] = [None] * len(wanted)
        if diff_outs and wanted:
            grads = torch.autograd.grad(diff_outs, wanted, tangents, allow_unused=True)
    for o, value in zip(graph.outputs, outs, strict=True):
        rec.builder.add_output(_encode(rec, value, o.value), kind=o.kind, target=o.target,
                               aliases_input=o.aliases_input)
    by_fake = dict(zip(map(id, primals), graph.inputs, strict=True))
    for p, g in zip(wanted, grads, strict=True):
        target = by_fake[id(p)].name
        value = S.NoneArg() if g is None else S.TensorRef(name=rec.name_of(g))
        rec.builder.add_output(value, kind="gradient", target=target)
    rec.builder.meta[NUM_FWD_OUTPUTS] = str(len(graph.outputs))
    joint = strip_identities(rec.builder.build())
    if has_mutations(joint):
        # some derivative formulas write in place (maximum's backward uses masked_fill_);
        # they only ever write to their own temporaries, so no output is added
        n_outputs = len(joint.outputs)
        joint = functionalize(joint)
        extra = joint.outputs[n_outputs:]
        if extra:
            raise AutogradError(f"the backward of {graph.name!r} writes to inputs "
                                f"{[o.target for o in extra]}; this is not supported")
    return eliminate_dead_code(joint)


def _run(graph: S.Graph, inputs: Sequence[torch.Tensor], env: SizeEnv | None) -> list[object]:
    """Run ``graph`` on fakes, passing size expressions as ``SymInt``s (the reference
    interpreter would bind symbols to ints read off the inputs, specializing them)."""
    values: dict[str, object] = {i.name: t for i, t in zip(graph.inputs, inputs, strict=True)}
    for node in graph.nodes:
        args = [decode(a, values, env) for a in node.args]
        kwargs = {k: decode(a, values, env) for k, a in node.kwargs.items()}
        rule = SYMBOLIC_PRE_AUTOGRAD.get(node.op) if env is not None else None
        try:
            flat = flatten_result((rule or resolve_op(node.op))(*args, **kwargs))
        except Exception as e:
            raise AutogradError(f"{where(node)} failed on fake inputs: {type(e).__name__}: {e}") from e
        values.update((name, v) for name, v in zip(node.outputs, flat[: len(node.outputs)], strict=True)
                      if name)
    return [decode(o.value, values, env) for o in graph.outputs]


def _encode(rec: Recorder, value: object, original: S.Argument) -> S.Argument:
    if isinstance(original, S.TensorRef | S.ListArg):
        return encode_arg(value, rec.name_of)
    return original


def num_fwd_outputs(joint: S.Graph) -> int:
    """Forward outputs of a joint graph (from its meta, else all non-gradient outputs)."""
    if NUM_FWD_OUTPUTS in joint.meta:
        return int(joint.meta[NUM_FWD_OUTPUTS])
    return sum(1 for o in joint.outputs if o.kind != "gradient")


def _absent_device(graph: S.Graph) -> str | None:
    """A device of ``graph`` that this torch build cannot run autograd on (cuda without CUDA)."""
    devices = {m.device for m in graph.values.values()}
    absent = sorted(d for d in devices if torch.device(d).type == "cuda" and not torch.cuda.is_available())
    if not absent:
        return None
    if len(devices) > 1:
        raise AutogradError(f"graph {graph.name!r} mixes devices {sorted(devices)} and "
                            f"{absent[0]} is not available here; cannot build its joint graph")
    return absent[0]


def _retarget_arg(arg: S.Argument, old: str, new: str) -> S.Argument:
    if isinstance(arg, S.DeviceArg) and arg.name == old:
        return S.DeviceArg(name=new)
    if isinstance(arg, S.ListArg):
        return S.ListArg(items=tuple(_retarget_arg(a, old, new) for a in arg.items))
    return arg


def retarget_device(graph: S.Graph, old: str, new: str) -> S.Graph:
    """``graph`` with device ``old`` renamed ``new`` in values and device arguments."""
    values = {k: msgspec.structs.replace(m, device=new) if m.device == old else m
              for k, m in graph.values.items()}
    nodes = tuple(msgspec.structs.replace(
        n, args=tuple(_retarget_arg(a, old, new) for a in n.args),
        kwargs={k: _retarget_arg(a, old, new) for k, a in n.kwargs.items()}) for n in graph.nodes)
    return msgspec.structs.replace(graph, values=values, nodes=nodes)
