"""An example torchfuse codegen backend, small enough to read in one sitting.

``extern(graph, example_inputs)`` is a complete backend: it turns a captured
`torchfuse.graph.Graph` into a `torchfuse.graph.Program` in which every node
is an `ExternStep` (a call of the node's ATen op, no Triton),
checks it with `torchfuse.graph.verify_program`, and hands it to
`torchfuse.runtime.load`, whose result is the callable torchfuse.capture calls.

It is registered under the ``torchfuse.backends`` entry-point group (see ``pyproject.toml``),
so after ``pip install`` it is selected with::

    torchfuse.capture.compile(fn, backend="extern")

A real codegen would fuse nodes into kernels; this one shows the contract and the Program
format with nothing else in the way. ``explain_program(program)`` prints what it produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph import verify_program
from torchfuse.graph.ops import tensor_refs
from torchfuse.runtime import CompiledProgram, load

__version__ = "0.1.0"
__all__ = ["ExternBackendError", "codegen", "compile_program", "explain_program", "extern"]


class ExternBackendError(RuntimeError):
    """The extern backend cannot compile this call; the message says what to do instead."""


def extern(graph: S.Graph, example_inputs: Sequence[Any]) -> Callable[..., list[Any]]:
    """The backend: ``extern(graph, example_inputs)(*flat_inputs) -> list of outputs``.

    ``example_inputs`` are the real tensors of the first call, in ``graph.inputs`` order.
    The runtime never records autograd history, so when gradients are wanted the graph goes
    through ``torchfuse.autograd.aot`` (the optional ``autograd`` extra), which splits it
    into a forward and a backward graph and compiles each with `compile_program`.
    """
    wants_grad = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    if not wants_grad:
        return compile_program(graph, example_inputs)
    try:
        from torchfuse.autograd import aot
    except ImportError as e:
        raise ExternBackendError(
            f"graph {graph.name!r} needs gradients and the extern backend gets them from "
            "torchfuse-autograd, which is not installed: pip install "
            "'torchfuse-example-extern[autograd]', or call under torch.no_grad()") from e
    differentiable = aot(graph, compile_program, compile_program)
    return lambda *inputs: list(differentiable(*inputs))


def compile_program(graph: S.Graph, example_inputs: Sequence[Any]) -> CompiledProgram:
    """Generate the Program for ``graph`` and load it on the example inputs' device."""
    device = _device_of(graph, example_inputs)
    program = codegen(graph, device=device)
    # load() checks the Program again and generates one straight-line Python function for it.
    return load(program, device=device)


def codegen(graph: S.Graph, *, device: str = "cpu") -> S.Program:
    """Translate ``graph`` into a Program of extern calls (one per node), verified."""
    # Every value of the graph (inputs and node results) gets a Buffer entry with its
    # metadata: the runtime checks inputs against theirs, the verifier wants every step's
    # outputs declared.
    buffers = tuple(
        S.Buffer(name=name, dtype=m.dtype, sizes=m.sizes, strides=m.strides,
                 storage_offset=m.storage_offset, device=m.device)
        for name, m in graph.values.items()
    )
    # The codegen proper. Node args are already format Arguments (TensorRef, SymRef, Int, ...)
    # naming graph values, and buffer names *are* value names, so they carry over as they are.
    steps = [
        S.ExternStep(op=node.op, args=node.args, kwargs=node.kwargs, outputs=node.outputs)
        for node in graph.nodes
    ]
    # Graph outputs carry over too: a TensorRef to a node result or to an *input* (``return
    # x``) is a live buffer at the end; an Int/Float/Bool or a SymRef (a size) is returned as
    # a value and needs no buffer.
    outputs = tuple(out.value for out in graph.outputs)
    inputs = tuple(inp.name for inp in graph.inputs)
    program = S.Program(
        name=graph.name,
        inputs=inputs,
        outputs=outputs,
        buffers=buffers,
        steps=tuple(_free_after_last_use(steps, keep={*inputs, *tensor_refs(outputs)})),
        # Symbols keep their sources (``input:<k>.size(<d>)``): Program inputs are the graph's
        # inputs in the same order, so the runtime binds them the same way.
        symbols=graph.symbols,
        device=device,
        # Ops outside aten (capture's ``torchfuse.set_grad_enabled``) need their namespace listed.
        opsets=dict(graph.opsets),
        meta={"producer": f"torchfuse-example-extern {__version__}"},
    )
    verify_program(program)  # raises VerificationError naming the faulty step
    return program


def _free_after_last_use(steps: list[S.ExternStep], keep: set[str]) -> list[S.Step]:
    """Insert a FreeStep after the last step that reads each intermediate value.

    Inputs belong to the caller and outputs are returned, so both are kept. Freeing only
    drops the Program's reference: a view of a freed value keeps its storage alive.
    """
    last_use: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name in tensor_refs([*step.args, *step.kwargs.values()]):
            last_use[name] = i
    dead_after: dict[int, list[str]] = {}
    for name, i in last_use.items():
        if name not in keep:
            dead_after.setdefault(i, []).append(name)
    out: list[S.Step] = []
    for i, step in enumerate(steps):
        out.append(step)
        out.extend(S.FreeStep(buffer=name) for name in sorted(dead_after.get(i, ())))
    return out


def _device_of(graph: S.Graph, example_inputs: Sequence[Any]) -> str:
    """``"cpu"`` or ``"cuda"``: where the example tensors live (else the graph's values)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device.type
    for meta in graph.values.values():
        return torch.device(meta.device).type
    return "cpu"


# ----------------------------------------------------------------------------- printing


def explain_program(program: S.Program) -> str:
    """A Program as readable pseudo-Python: inputs with their metadata, one line per step.

    Extern and free steps (all this backend emits) print as calls and ``del``; other step
    kinds print as their record, so any Program can be shown.
    """
    buffers = {b.name: b for b in program.buffers}
    lines = [f"program {program.name!r} on {program.device}: {len(program.inputs)} inputs, "
             f"{len(program.steps)} steps, {len(program.kernels)} kernels"]
    lines += [f"  {name}: {_describe(buffers[name])}  (input {i})" for i, name in enumerate(program.inputs)]
    for step in program.steps:
        if isinstance(step, S.ExternStep):
            args = [_fmt(a) for a in step.args] + [f"{k}={_fmt(v)}" for k, v in step.kwargs.items()]
            call = f"{step.op}({', '.join(args)})"
            if not any(step.outputs):
                lines.append(f"  {call}")
            else:
                metas = ", ".join(_describe(buffers[o]) for o in step.outputs if o in buffers)
                lines.append(f"  {', '.join(o or '_' for o in step.outputs)} = {call}  # {metas}")
        elif isinstance(step, S.FreeStep):
            lines.append(f"  del {step.buffer}")
        else:
            lines.append(f"  {step!r}")
    lines.append(f"  return [{', '.join(_fmt(o) for o in program.outputs)}]")
    return "\n".join(lines)


def _describe(buf: S.Buffer) -> str:
    sizes = ", ".join(str(s) for s in buf.sizes)
    return f"{buf.dtype}[{sizes}]"


def _fmt(arg: S.Argument) -> str:
    match arg:
        case S.TensorRef(name=name):
            return name
        case S.SymRef(expr=expr):
            return expr
        case S.ListArg(items=items):
            return "[" + ", ".join(_fmt(a) for a in items) + "]"
        case S.NoneArg():
            return "None"
        case S.Int() | S.Float() | S.Bool() | S.Str():
            return repr(arg.value)
        case _:  # dtype, device, layout, memory format, subgraph: all carry a name
            return f"{type(arg).__name__.removesuffix('Arg').lower()}:{arg.name}"  # type: ignore[union-attr]
