"""User Triton kernels (``torchfuse.triton_kernel.default``): an opaque node the runtime launches.

Two steps, one on each side of scheduling:

* `lower_user_kernel` (the lowering rule) makes the node an [`Extern`][torchfuse.inductor.ir.Extern]:
  its inputs are realized as buffers with the strides the graph recorded (the kernel
  addresses memory with them), and the scheduler fuses nothing across it, so pointwise work
  before and after it still fuses into generated kernels of its own;
* `launch_user_kernels` (a pass over the finished Program) turns each such extern step
  into the user's [`Kernel`][torchfuse.graph.schema.Kernel] and a `LaunchStep`. The op is
  functional, so each pointer the kernel writes gets a buffer of its own first, filled by a
  ``CopyStep``, unless the input buffer dies at this launch (a temporary, not a graph input
  or output, not viewed, read by nothing later): then the kernel writes into it in place.

Before (``plan``)::

    buf1 = torch.ops.torchfuse.triton_kernel.default('{"entry":"scale_inplace",...}', [buf0], [0])
    del buf0

After::

    scale_inplace[(2,)](buf0, 13, 2.0, BLOCK=8, num_warps=4, num_stages=3)   # buf1 renamed buf0
"""

from __future__ import annotations

from typing import Any

import msgspec
from torchfuse.graph import schema as S
from torchfuse.graph.ops import rename_arg
from torchfuse.graph.torchfuse_ops import TRITON_KERNEL
from torchfuse.graph.tracing import mutated_arguments
from torchfuse.graph.user_kernels import loads
from torchfuse.inductor.lowering import register

_I32 = 2**31


@register(TRITON_KERNEL)
def lower_user_kernel(L: Any, node: S.Node) -> None:
    """Lowering rule: an extern call by design (a barrier for fusion)."""
    L.extern(node)


def mutates_inputs(graph: S.Graph) -> bool:
    """True when a node of ``graph`` writes into a graph input (an in-place op or a user
    kernel's write-back, directly or through a view): the graph must then be functionalized
    and the input written back after it, which the program alone does not do."""
    from torchfuse.graph.ops import UnknownOpError, resolve_op
    from torchfuse.graph.tracing import is_view_op

    aliases = {i.name for i in graph.inputs}  # names whose storage is an input's
    for node in graph.nodes:
        try:
            op = resolve_op(node.op)
        except UnknownOpError:
            continue
        written = mutated_arguments(op)
        for i in written:
            a = node.args[i] if i < len(node.args) else node.kwargs.get(op._schema.arguments[i].name)
            if isinstance(a, S.TensorRef) and a.name in aliases:
                return True
        first = node.args[0] if node.args else None
        if (written or is_view_op(op)) and isinstance(first, S.TensorRef) and first.name in aliases:
            aliases.update(o for o in node.outputs if o)
    return False


def _scalar_kind(value: int | float) -> str:
    if isinstance(value, float):
        return "fp32"
    return "i32" if -_I32 <= value < _I32 else "i64"


def _scalar_arg(value: int | float) -> S.Argument:
    return S.Float(value=value) if isinstance(value, float) else S.Int(value=value)


def user_kernel(spec: dict[str, Any], dtypes: list[str], name: str) -> S.Kernel:
    """The Program kernel of a user kernel description: pointers and numbers are its
    signature (in parameter order), constexprs and bools are passed by name."""
    signature: list[S.KernelParam] = []
    constexprs: dict[str, int | float | bool | str] = {}
    for a in spec["args"]:
        if "tensor" in a:
            signature.append(S.KernelParam(name=a["name"], kind="ptr", dtype=dtypes[a["tensor"]]))
        elif "constexpr" in a or isinstance(a["value"], bool):
            constexprs[a["name"]] = a["constexpr"] if "constexpr" in a else a["value"]
        else:
            signature.append(S.KernelParam(name=a["name"], kind=_scalar_kind(a["value"])))  # type: ignore[arg-type]
    cfg = S.LaunchConfig(meta={}, num_warps=int(spec.get("num_warps") or 4),
                         num_stages=int(spec.get("num_stages") or 3))
    return S.Kernel(name=name, source=spec["source"], entry=spec["entry"], signature=tuple(signature),
                    constexprs=constexprs, configs=(cfg,), grid=tuple(int(g) for g in spec["grid"]),
                    meta={"origin": "user"})


# ----------------------------------------------------------------------------- the Program pass


def _refs(a: S.Argument) -> list[str]:
    if isinstance(a, S.TensorRef):
        return [a.name]
    if isinstance(a, S.ListArg):
        return [n for x in a.items for n in _refs(x)]
    return []


def step_reads(step: S.Step) -> list[str]:
    """Buffer names a step mentions (reads, writes, bases, reuses)."""
    if isinstance(step, S.AllocStep):
        return [step.buffer] + ([step.reuse] if step.reuse else [])
    if isinstance(step, S.LaunchStep):
        return [n for a in step.args for n in _refs(a)]
    if isinstance(step, S.ExternStep):
        return [n for a in (*step.args, *step.kwargs.values()) for n in _refs(a)] + list(step.outputs)
    if isinstance(step, S.ViewStep):
        return [step.output, step.base]
    if isinstance(step, S.FreeStep):
        return [step.buffer]
    return [step.dst, step.src]


def _rename(step: S.Step, m: dict[str, str]) -> S.Step:
    if not m:
        return step
    r = msgspec.structs.replace
    if isinstance(step, S.AllocStep):
        return r(step, buffer=m.get(step.buffer, step.buffer), reuse=m.get(step.reuse, step.reuse))
    if isinstance(step, S.LaunchStep):
        return r(step, args=tuple(rename_arg(a, m) for a in step.args))
    if isinstance(step, S.ExternStep):
        return r(step, args=tuple(rename_arg(a, m) for a in step.args),
                 kwargs={k: rename_arg(v, m) for k, v in step.kwargs.items()},
                 outputs=tuple(m.get(o, o) for o in step.outputs))
    if isinstance(step, S.ViewStep):
        return r(step, output=m.get(step.output, step.output), base=m.get(step.base, step.base))
    if isinstance(step, S.FreeStep):
        return r(step, buffer=m.get(step.buffer, step.buffer))
    return r(step, dst=m.get(step.dst, step.dst), src=m.get(step.src, step.src))


def launch_user_kernels(program: S.Program) -> S.Program:
    """Replace every ``torchfuse.triton_kernel`` extern step by a launch of the user's kernel."""
    if not any(isinstance(s, S.ExternStep) and s.op == TRITON_KERNEL for s in program.steps):
        return program
    buffers = {b.name: b for b in program.buffers}
    out_names = {n for o in program.outputs for n in _refs(o)}
    viewed = {n for s in program.steps if isinstance(s, S.ViewStep) for n in (s.output, s.base)}
    steps = list(program.steps)
    kernels = list(program.kernels)
    by_key: dict[bytes, str] = {}
    rename: dict[str, str] = {}  # kernel outputs written in place: their later name
    dropped: set[str] = set()
    new_steps: list[S.Step] = []
    pending_free: set[str] = set()  # buffers now living on under another name
    for k, step in enumerate(steps):
        step = _rename(step, rename)
        if isinstance(step, S.FreeStep) and step.buffer in pending_free:
            pending_free.discard(step.buffer)  # freed later, under the output's name
            continue
        if isinstance(step, S.AllocStep) and step.reuse in pending_free:
            step = msgspec.structs.replace(step, reuse=None)
        if not (isinstance(step, S.ExternStep) and step.op == TRITON_KERNEL):
            new_steps.append(step)
            continue
        text, tensors_arg, mutated_arg = step.args
        assert isinstance(text, S.Str) and isinstance(tensors_arg, S.ListArg)
        assert isinstance(mutated_arg, S.ListArg)
        spec = loads(text.value)
        env = [a.name for a in tensors_arg.items if isinstance(a, S.TensorRef)]
        mutated = [int(a.value) for a in mutated_arg.items if isinstance(a, S.Int)]
        later = {n for s in steps[k + 1:] if not isinstance(s, S.FreeStep)
                 for n in step_reads(_rename(s, rename))}
        for j, out in zip(mutated, step.outputs, strict=True):
            src = env[j]
            in_place = (src not in program.inputs and src not in out_names and src not in viewed
                        and src not in later and env.count(src) == 1
                        and buffers[src].sizes == buffers[out].sizes
                        and buffers[src].strides == buffers[out].strides
                        and buffers[src].dtype == buffers[out].dtype)
            if in_place:
                rename[out] = src
                dropped.add(out)
                pending_free.add(src)
            else:
                new_steps += [S.AllocStep(buffer=out), S.CopyStep(dst=out, src=src)]
                env[j] = out
        dtypes = [buffers[n].dtype for n in env]
        kernel = user_kernel(spec, dtypes, "")
        key = msgspec.json.encode(kernel)  # the same launch twice: one kernel
        name = by_key.get(key)
        if name is None:
            name = f"user_{spec['entry']}_{len(by_key)}"
            by_key[key] = name
            kernels.append(msgspec.structs.replace(kernel, name=name))
        args: list[S.Argument] = []
        for a in spec["args"]:
            if "tensor" in a:
                args.append(S.TensorRef(name=env[a["tensor"]]))
            elif "value" in a and not isinstance(a["value"], bool):
                args.append(_scalar_arg(a["value"]))
        new_steps.append(S.LaunchStep(kernel=name, args=tuple(args)))
    outputs = tuple(rename_arg(o, rename) for o in program.outputs)
    return msgspec.structs.replace(
        program, steps=tuple(new_steps), kernels=tuple(kernels), outputs=outputs,
        buffers=tuple(b for b in program.buffers if b.name not in dropped))


__all__ = ["launch_user_kernels", "lower_user_kernel", "mutates_inputs", "user_kernel"]
