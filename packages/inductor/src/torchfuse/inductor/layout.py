"""Channels-last per graph: a convolution network's graph run in NHWC, converted at its edges.

cuDNN's convolutions run on NHWC data; given NCHW data they convert it on every call
(``nchwToNhwcKernel`` before, ``nhwcToNchwKernel`` after) and 1x1 convolutions take slower
GEMM kernels. `channels_last` rewrites a graph so that each 4-d convolution's input and weight
are channels-last; their outputs then are too (ATen's rule, which our fake tensors follow:
`torchfuse.graph.layouts`), and so are the pointwise ops and per-channel reductions between
them, whose lowering reads the recorded strides. The conversions happen once, at the edges::

    before:  conv = convolution(x, w1, ...)          # f32[2, 16, 8, 8] (1024, 64, 8, 1)
             relu = relu(conv)
             conv_1 = convolution(relu, w2, ...)
             out = add(conv_1, relu)                  # a user output: (1024, 64, 8, 1)
    after:   clone = clone(x, memory_format=channels_last)       # the input, once
             clone_1 = clone(w1, memory_format=channels_last)    # each weight, once
             conv = convolution(clone, clone_1, ...)  # (1024, 1, 128, 16)
             relu = relu(conv)                        # (1024, 1, 128, 16)
             clone_2 = clone(w2, memory_format=channels_last)
             conv_1 = convolution(relu, clone_2, ...)
             add = add(conv_1, relu)
             out = clone(add, memory_format=contiguous_format)   # eager's strides again

Graph outputs get the strides the graph recorded (eager's), so the user sees eager's layout;
an op that cannot take the new layout (a ``view`` that needs the old strides) gets its inputs
back in the recorded layout first. In a training graph the rewrite runs before the joint graph
is built (`torchfuse.inductor.backend`), so the saved activations and the backward's
convolutions are channels-last too; parameter gradients come back channels-last from the
weight conversion's backward and take the parameter's layout where autograd accumulates them.

When it applies (`wants_channels_last`, ``InductorConfig.channels_last``): ``"auto"`` (the
default) on CUDA inference graphs with a 2-d convolution of at least `MIN_CHANNELS` output
channels and no grouped one; ``"always"`` on any graph with a 2-d convolution (the CPU
tests: oneDNN takes channels-last too); ``"never"``. ``"auto"`` leaves training graphs and
graphs with a grouped or depthwise convolution in NCHW because both were measured slower in
channels-last on the H200 (docs/inductor.md, "Channels-last per graph"). The decision is
taken once per captured graph: a training graph's halves are never rewritten on their own.
"""

from __future__ import annotations

from typing import Any

import torch
from torchfuse.autograd.common import (
    PassRecorder,
    decode,
    fake_from_meta,
    retrace_builder,
    retracing,
    where,
)
from torchfuse.graph import schema as S
from torchfuse.graph.layouts import channels_last_strides, is_dense
from torchfuse.graph.ops import encode_arg, flatten_result, resolve_op
from torchfuse.inductor.config import CHANNELS_LAST as CHANNELS_LAST_POLICIES

_CONV = "aten.convolution.default"
MIN_CHANNELS = 64
"""``"auto"`` takes channels-last for a CUDA graph with a 2-d convolution of at least this
many output channels (ResNet's and MobileNet's every stage has one)."""


class LayoutError(RuntimeError):
    """The channels-last rewrite met an op it could not run in either layout."""


def _conv2d_nodes(graph: S.Graph) -> list[S.Node]:
    out = []
    for n in graph.nodes:
        if n.op == _CONV and isinstance(n.args[0], S.TensorRef) and isinstance(n.args[1], S.TensorRef):
            x, w = graph.values[n.args[0].name], graph.values[n.args[1].name]
            concrete = all(isinstance(s, int) for s in (*x.sizes, *w.sizes))
            if len(x.sizes) == 4 and len(w.sizes) == 4 and concrete:
                out.append(n)
    return out


def _in_channels_last_order(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a 4-d layout is channels-last in memory (size-1 dims ignored: a 1x1 weight
    laid out contiguously is one already, and cuDNN takes it without a copy)."""
    want = channels_last_strides(sizes)
    return want is not None and all(n == 1 or a == b for n, a, b in zip(sizes, strides, want, strict=True))


def _is_channels_last(meta: S.TensorMeta) -> bool:
    return all(isinstance(s, int) for s in (*meta.sizes, *meta.strides)) and \
        _in_channels_last_order(tuple(meta.sizes), tuple(meta.strides))


def _grouped(node: S.Node) -> bool:
    groups = node.args[8].value if len(node.args) > 8 and isinstance(node.args[8], S.Int) else None
    return groups != 1  # a symbolic count counts as grouped


def wants_channels_last(graph: S.Graph, policy: str, *, training: bool = False) -> bool:
    """Whether `channels_last` should rewrite ``graph`` under ``policy`` (see the module doc):
    never when every 2-d convolution already reads channels-last data (a graph rewritten
    before, such as the forward and backward halves of a rewritten training graph).
    ``training``: the graph is about to become a joint forward/backward graph."""
    if policy not in CHANNELS_LAST_POLICIES:
        choices = ", ".join(map(repr, CHANNELS_LAST_POLICIES))
        raise ValueError(f"channels_last={policy!r}: use one of {choices}")
    if policy == "never":
        return False
    convs = _conv2d_nodes(graph)
    todo = [n for n in convs if not (_is_channels_last(graph.values[n.args[0].name])
                                     and _is_channels_last(graph.values[n.args[1].name]))]
    if not todo:
        return False
    if policy == "always":
        return True
    on_cuda = graph.values[convs[0].outputs[0]].device.startswith("cuda")
    if not on_cuda or training or any(map(_grouped, convs)):
        return False
    return any(graph.values[n.args[1].name].sizes[0] >= MIN_CHANNELS for n in convs)


def _same_layout(t: torch.Tensor, meta: S.TensorMeta) -> bool:
    if not all(isinstance(s, int) for s in (*meta.sizes, *meta.strides)) or len(meta.sizes) != t.dim():
        return True  # symbolic: left as recorded
    return all(n == 1 or a == b for n, a, b in zip(meta.sizes, t.stride(), meta.strides, strict=True))


def _as_recorded(t: torch.Tensor, meta: S.TensorMeta) -> torch.Tensor:
    """``t`` copied into the dense layout ``meta`` records (contiguous, channels-last, or any
    dim order: permute, copy, permute back); ``t`` itself when it has it already, or when the
    recorded layout is not dense (a view: nothing to copy into)."""
    if _same_layout(t, meta) or not is_dense(meta.sizes, meta.strides):
        return t
    sizes, strides = tuple(meta.sizes), tuple(meta.strides)
    if strides == channels_last_strides(sizes) and t.dim() == 4:
        return torch.ops.aten.clone.default(t, memory_format=torch.channels_last)
    order = sorted(range(t.dim()), key=lambda d: (-strides[d] if sizes[d] > 1 else 0, d))
    if order == list(range(t.dim())):
        return torch.ops.aten.clone.default(t, memory_format=torch.contiguous_format)
    back = sorted(range(t.dim()), key=order.__getitem__)
    dense = torch.ops.aten.clone.default(torch.ops.aten.permute.default(t, order),
                                         memory_format=torch.contiguous_format)
    return torch.ops.aten.permute.default(dense, back)


def layout_pass(graph: S.Graph, policy: str, *, training: bool = False) -> S.Graph:
    """The pipeline's ``layout`` pass: `channels_last` where `wants_channels_last`, else
    ``graph`` itself."""
    return channels_last(graph) if wants_channels_last(graph, policy, training=training) else graph


def channels_last(graph: S.Graph) -> S.Graph:
    """``graph`` with its 2-d convolutions' inputs and weights channels-last and its outputs
    in the recorded layout (see the module doc). Inputs, outputs and their order are kept."""
    builder, sizes = retrace_builder(graph, graph.name)
    rec = PassRecorder(builder)
    env: dict[str, Any] = {}
    converted: dict[str, torch.Tensor] = {}  # value name -> its channels-last copy
    convs = {n.name for n in _conv2d_nodes(graph)}

    def to_channels_last(t: torch.Tensor) -> torch.Tensor:
        if _in_channels_last_order(tuple(t.shape), t.stride()):
            return t
        name = rec.names.get(id(t))  # by value name: an in-place write makes a new one
        if name is None or name not in converted:
            out = torch.ops.aten.clone.default(t, memory_format=torch.channels_last)
            if name is None:
                return out
            converted[name] = out
        return converted[name]

    with retracing(sizes):
        # the input fakes are made outside the recorder: making them records nothing
        fakes = [fake_from_meta(graph.values[inp.name], sizes) for inp in graph.inputs]
        with rec, torch.no_grad():
            _retrace(graph, rec, sizes, env, fakes, to_channels_last, convs)
    for o in graph.outputs:
        value = o.value
        if isinstance(value, S.TensorRef | S.ListArg):
            value = encode_arg(decode(value, env, sizes), rec.name_of)
        builder.add_output(value, kind=o.kind, target=o.target, aliases_input=o.aliases_input)
    # no dead-code elimination: a captured graph may still write its inputs in place (the
    # training path runs this before functionalization), and those nodes have no readers
    return builder.build()


def _retrace(graph: S.Graph, rec: PassRecorder, sizes: Any, env: dict[str, Any], fakes: list[Any],
             to_channels_last: Any, convs: set[str]) -> None:
    """Re-run ``graph``'s nodes under ``rec``, convolutions on channels-last values, outputs
    put back in their recorded layout (`channels_last`'s loop)."""
    for inp, fake in zip(graph.inputs, fakes, strict=True):
        env[inp.name] = rec.input(fake, name=inp.name, kind=inp.kind, target=inp.target)
    for node in graph.nodes:
        args = [decode(a, env, sizes) for a in node.args]
        kwargs = {k: decode(a, env, sizes) for k, a in node.kwargs.items()}
        rec.loc, rec.module_path = node.loc, node.module_path
        if node.name in convs:
            args[0], args[1] = to_channels_last(args[0]), to_channels_last(args[1])
        result = _run(node, graph, args, kwargs)
        for name, value in zip(node.outputs, flatten_result(result)[: len(node.outputs)], strict=True):
            if name:
                env[name] = value
    for o in graph.outputs:
        value = o.value
        if isinstance(value, S.TensorRef) and o.aliases_input is None:
            env[value.name] = _as_recorded(env[value.name], graph.values[value.name])
        elif isinstance(value, S.ListArg):
            for item in value.items:
                if isinstance(item, S.TensorRef):
                    env[item.name] = _as_recorded(env[item.name], graph.values[item.name])
    rec.loc = rec.module_path = None


def _run(node: S.Node, graph: S.Graph, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``node``'s op on the rewritten values; an op that rejects the new layout (a
    ``view`` whose sizes need the recorded strides) runs on its inputs in the recorded layout."""
    op = resolve_op(node.op)
    try:
        return op(*args, **kwargs)
    except RuntimeError as first:
        if op._schema.is_mutable:  # a write must reach the tensor itself, not a copy of it
            raise LayoutError(f"{where(node)}: fails in channels-last ({first})") from first
        refs = [a.name if isinstance(a, S.TensorRef) else None for a in node.args]
        back = [_as_recorded(v, graph.values[r]) if r is not None and isinstance(v, torch.Tensor) else v
                for v, r in zip(args, refs, strict=True)]
        try:
            return op(*back, **kwargs)
        except RuntimeError as e:
            raise LayoutError(f"{where(node)}: fails in channels-last ({first}) and in the "
                              f"recorded layout ({e})") from e
