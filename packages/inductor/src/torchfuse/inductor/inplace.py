"""Extern calls that write a mutated input's new value straight into the input.

Functionalization makes an op that updates an input (a training batch norm's running mean and
variance) a functional op plus an output marked ``mutated_input``, which the caller copies
back into the input after the call. For an extern call that is two copies per updated
tensor: ATen's functional variant clones the input to update the clone, and the caller copies
the clone back. When nothing else reads the input, the op's in-place variant does the same
with none: it updates the input itself, and the Program returns the input as that output (the
caller then finds it already written; `torchfuse.autograd` skips it).

Before (``running_mean``, ``running_var`` inputs; ``buf3``, ``buf4`` returned as their new
values)::

    buf0, buf1, buf2, buf3, buf4 = aten._native_batch_norm_legit_functional.default(
        x, w, b, running_mean, running_var, True, 0.1, 1e-05)
    return [buf0, ..., buf3, buf4]

After::

    buf0, buf1, buf2 = aten._native_batch_norm_legit.default(
        x, w, b, running_mean, running_var, True, 0.1, 1e-05)
    return [buf0, ..., running_mean, running_var]

Each rule of `IN_PLACE` is (in-place op, which output is written into which argument, how
many outputs it returns). A step is rewritten only when every written argument is a Program
input that no other step reads and that is not returned otherwise, and every written output
is returned once, as the graph's ``mutated_input`` output for that very input, and read by no
other step.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from torchfuse.graph import schema as S
from torchfuse.graph.ops import tensor_refs


@dataclass(frozen=True, slots=True)
class InPlace:
    op: str
    """The in-place variant's qualified name."""
    written: tuple[tuple[int, int], ...]
    """(output index of the functional op, argument index the in-place op writes it into)."""
    returns: int
    """How many outputs the in-place op returns (the functional op's first ones)."""


IN_PLACE: dict[str, InPlace] = {
    "aten._native_batch_norm_legit_functional.default": InPlace(
        "aten._native_batch_norm_legit.default", ((3, 3), (4, 4)), 3),
}


def _reads(step: S.Step) -> list[str]:
    if isinstance(step, S.ExternStep):
        return tensor_refs([*step.args, *step.kwargs.values()])
    if isinstance(step, S.LaunchStep):
        return tensor_refs(list(step.args))
    if isinstance(step, S.ViewStep):
        return [step.base]
    if isinstance(step, S.CopyStep):
        return [step.src, step.dst]
    return []


def write_in_place(program: S.Program, graph: S.Graph) -> S.Program:
    """``program`` (compiled from ``graph``) with the extern steps of `IN_PLACE` that may
    write into their inputs rewritten to do so."""
    if not any(isinstance(s, S.ExternStep) and s.op in IN_PLACE for s in program.steps):
        return program
    if len(graph.outputs) != len(program.outputs) or len(graph.inputs) != len(program.inputs):
        return program
    inputs = set(program.inputs)
    graph_input = dict(zip(program.inputs, (i.name for i in graph.inputs), strict=True))
    reads: dict[str, int] = {}
    for step in program.steps:
        for name in _reads(step):
            reads[name] = reads.get(name, 0) + 1
    returned: dict[str, list[int]] = {}
    for j, o in enumerate(program.outputs):
        if isinstance(o, S.TensorRef):
            returned.setdefault(o.name, []).append(j)

    steps = list(program.steps)
    outputs = list(program.outputs)
    dropped: set[str] = set()
    for k, step in enumerate(steps):
        rule = IN_PLACE.get(step.op) if isinstance(step, S.ExternStep) else None
        if rule is None or not isinstance(step, S.ExternStep):
            continue
        if {o for o, _ in rule.written} != set(range(rule.returns, len(step.outputs))):
            continue  # the in-place op must return all the rest
        plan: list[tuple[int, str, str]] = []  # (output position, output buffer, input)
        for out_i, arg_i in rule.written:
            arg = step.args[arg_i] if arg_i < len(step.args) else None
            out = step.outputs[out_i] if out_i < len(step.outputs) else ""
            if not isinstance(arg, S.TensorRef) or arg.name not in inputs or not out:
                break
            if reads.get(arg.name) != 1 or arg.name in returned or reads.get(out):
                break  # another step reads the old value, or the caller gets it back
            places = returned.get(out, [])
            if len(places) != 1:
                break
            g_out = graph.outputs[places[0]]
            if g_out.kind != "mutated_input" or g_out.target != graph_input[arg.name]:
                break
            plan.append((places[0], out, arg.name))
        else:
            for j, out, name in plan:
                outputs[j] = S.TensorRef(name=name)
                dropped.add(out)
            steps[k] = msgspec.structs.replace(step, op=rule.op, outputs=step.outputs[: rule.returns])
    if not dropped:
        return program
    buffers = tuple(b for b in program.buffers if b.name not in dropped)
    return msgspec.structs.replace(program, steps=tuple(steps), outputs=tuple(outputs), buffers=buffers)
