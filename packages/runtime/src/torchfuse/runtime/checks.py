"""Checking a Program once at load time, and explaining precisely why inputs were rejected.

The generated call function checks its inputs with one cheap combined condition; when that
fails it calls `diagnose_inputs`, which walks the inputs slowly and says exactly which one
is wrong and what was expected. Nothing here runs on the fast path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import ExprError, evaluate, free_symbols
from torchfuse.graph.ops import UnknownOpError, resolve_op, tensor_refs
from torchfuse.graph.verify import argument_problem, program_name_problem, program_size_problem
from torchfuse.runtime.errors import DeviceMismatchError, InputError, InvalidProgramError

_SOURCE = re.compile(r"input:([0-9]{1,9})\.size\(([0-9]{1,9})\)")


def symbol_source(sym: S.Symbol) -> tuple[int, int] | None:
    """``(input index, dim)`` of a symbol bound from an input's size, else ``None``."""
    m = _SOURCE.fullmatch(sym.source or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def buffer_table(program: S.Program) -> dict[str, S.Buffer]:
    return {b.name: b for b in program.buffers}


def _exprs_of_args(args: Sequence[S.Argument]) -> list[str]:
    out: list[str] = []
    for a in args:
        if isinstance(a, S.SymRef):
            out.append(a.expr)
        elif isinstance(a, S.ListArg):
            out.extend(_exprs_of_args(a.items))
    return out


def program_expressions(program: S.Program) -> list[S.Expr]:
    """Every size expression ``program`` evaluates: buffers, launch and extern arguments,
    grids, views and outputs (ints included)."""
    kernels = {k.name: k for k in program.kernels}
    out: list[S.Expr] = []
    for buf in program.buffers:
        out += [*buf.sizes, *buf.strides, buf.storage_offset]
    for step in program.steps:
        if isinstance(step, S.LaunchStep):
            out += _exprs_of_args(step.args)
            kernel = kernels.get(step.kernel)
            out += list(step.grid or (kernel.grid if kernel else ()))
        elif isinstance(step, S.ExternStep):
            out += _exprs_of_args([*step.args, *step.kwargs.values()])
        elif isinstance(step, S.ViewStep):
            out += [*step.sizes, *step.strides, step.storage_offset]
    return out + _exprs_of_args(program.outputs)


def validate_program(program: S.Program) -> None:
    """Raise `InvalidProgramError` for a Program that cannot be run as written, or that
    would put into the generated call function a name that is not an identifier, an op that
    is not a real operator, or a buffer size that does not evaluate to a non-negative int."""
    name = program.name
    problem = program_name_problem(program) or program_size_problem(program)
    if problem:
        raise InvalidProgramError(f"program {name!r}: {problem}")
    for step in program.steps:
        if isinstance(step, S.ExternStep):
            try:
                resolve_op(step.op)
            except UnknownOpError as e:
                raise InvalidProgramError(f"program {name!r}: extern step: {e}") from None
        if isinstance(step, S.ExternStep | S.LaunchStep):
            args = [*step.args, *(step.kwargs.values() if isinstance(step, S.ExternStep) else ())]
            while args:
                a = args.pop()
                if isinstance(a, S.ListArg):
                    args += a.items
                elif (problem := argument_problem(a)) is not None:
                    raise InvalidProgramError(f"program {name!r}: {_describe_step(step)}: {problem}")
    buffers = buffer_table(program)
    kernels = {k.name: k for k in program.kernels}
    for inp in program.inputs:
        if inp not in buffers:
            raise InvalidProgramError(f"program {name!r}: input {inp!r} has no Buffer entry")
    symbols = {s.name for s in program.symbols}
    for sym in program.symbols:
        src = symbol_source(sym)
        if src is None and sym.hint is None:
            raise InvalidProgramError(
                f"program {name!r}: symbol {sym.name!r} has source {sym.source!r}; expected "
                "'input:<k>.size(<d>)' or a hint"
            )
        if src is not None:
            k, d = src
            if k >= len(program.inputs) or d >= len(buffers[program.inputs[k]].sizes):
                raise InvalidProgramError(
                    f"program {name!r}: symbol {sym.name!r} comes from {sym.source!r}, which does not exist"
                )
    live: set[str] = set(program.inputs)
    freed: set[str] = set()
    gone: set[str] = set()  # freed, or freed and taken over by a reusing buffer

    def need(ref: str, step: S.Step) -> None:
        if ref not in live:
            state = "was freed" if ref in gone else "is not defined"
            raise InvalidProgramError(f"program {name!r}: step {step!r} uses {ref!r}, which {state}")

    exprs: list[str] = []
    for step in program.steps:
        if isinstance(step, S.AllocStep):
            if step.buffer not in buffers:
                raise InvalidProgramError(f"program {name!r}: AllocStep of unknown buffer {step.buffer!r}")
            if step.reuse is not None:
                if step.reuse in program.inputs:
                    raise InvalidProgramError(
                        f"program {name!r}: {step.buffer!r} may not take over the storage of input "
                        f"{step.reuse!r}"
                    )
                # A reuse of a still-live buffer ends that buffer's life here (an implicit free).
                if step.reuse not in freed and step.reuse not in live:
                    raise InvalidProgramError(
                        f"program {name!r}: {step.buffer!r} reuses {step.reuse!r}, which was never allocated"
                    )
                freed.discard(step.reuse)
                live.discard(step.reuse)
                gone.add(step.reuse)
            live.add(step.buffer)
            buf = buffers[step.buffer]
            exprs += [e for e in (*buf.sizes, *buf.strides, buf.storage_offset) if isinstance(e, str)]
        elif isinstance(step, S.LaunchStep):
            kernel = kernels.get(step.kernel)
            if kernel is None:
                raise InvalidProgramError(f"program {name!r}: launch of unknown kernel {step.kernel!r}")
            if len(step.args) != len(kernel.signature):
                raise InvalidProgramError(
                    f"program {name!r}: kernel {kernel.name!r} takes {len(kernel.signature)} arguments "
                    f"({', '.join(p.name for p in kernel.signature)}), its launch passes {len(step.args)}"
                )
            if not (step.grid or kernel.grid):
                raise InvalidProgramError(f"program {name!r}: launch of {kernel.name!r} has no grid")
            for ref in tensor_refs(step.args):
                need(ref, step)
            exprs += _exprs_of_args(step.args)
        elif isinstance(step, S.ExternStep):
            for ref in tensor_refs([*step.args, *step.kwargs.values()]):
                need(ref, step)
            exprs += _exprs_of_args([*step.args, *step.kwargs.values()])
            live.update(o for o in step.outputs if o)
        elif isinstance(step, S.ViewStep):
            need(step.base, step)
            live.add(step.output)
            exprs += [e for e in (*step.sizes, *step.strides, step.storage_offset) if isinstance(e, str)]
        elif isinstance(step, S.FreeStep):
            need(step.buffer, step)
            live.discard(step.buffer)
            freed.add(step.buffer)
            gone.add(step.buffer)
        elif isinstance(step, S.CopyStep):
            need(step.dst, step)
            need(step.src, step)
    for out in program.outputs:
        for ref in tensor_refs([out]):
            if ref not in live:
                raise InvalidProgramError(f"program {name!r}: output {ref!r} is not live at the end")
    exprs += _exprs_of_args(program.outputs)
    for e in exprs:
        try:
            unknown = free_symbols(e) - symbols
        except ExprError as err:
            raise InvalidProgramError(f"program {name!r}: {err}") from None
        if unknown:
            raise InvalidProgramError(
                f"program {name!r}: expression {e!r} uses unknown symbols {sorted(unknown)}")


def _describe_step(step: S.Step) -> str:
    return f"launch of {step.kernel!r}" if isinstance(step, S.LaunchStep) else f"extern {step.op}"


def expected_device(device_type: str, buf: S.Buffer) -> str:
    """The device type a buffer lives on when the Program runs on ``device_type``: its own
    (a cuda Program may keep small tensors on the CPU), unless the whole Program runs on the CPU."""
    own = buf.device.split(":")[0]
    return "cpu" if device_type == "cpu" or own == "cpu" else device_type


def mutated_inputs(program: S.Program) -> list[str]:
    """Inputs that a step writes into: a CopyStep's destination, or an argument that an extern
    op's schema marks written (``Tensor(a!)``: an ATen batch norm updating its running
    statistics in place)."""
    inputs = set(program.inputs)
    out: list[str] = []
    for s in program.steps:
        if isinstance(s, S.CopyStep) and s.dst in inputs:
            out.append(s.dst)
        elif isinstance(s, S.ExternStep):
            try:
                schema = resolve_op(s.op)._schema
            except UnknownOpError:
                continue
            for i, a in enumerate(schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                value = s.args[i] if i < len(s.args) else s.kwargs.get(a.name)
                if isinstance(value, S.TensorRef) and value.name in inputs and value.name not in out:
                    out.append(value.name)
    return out


# ----------------------------------------------------------------------------- input diagnosis


def _describe(expected: Sequence[S.Expr]) -> str:
    return "(" + ", ".join(str(e) for e in expected) + ")"


def diagnose_inputs(program: S.Program, device_type: str, inputs: Sequence[Any]) -> InputError | None:
    """The error that explains why ``inputs`` do not fit ``program``, or ``None`` when they do.

    Slow (it walks every input in Python); the generated call function uses it only after its
    own combined check failed.
    """
    buffers = buffer_table(program)
    n = len(program.inputs)
    if len(inputs) != n:
        names = ", ".join(program.inputs)
        return InputError(f"program {program.name!r} takes {n} inputs ({names}), got {len(inputs)}")
    for i, (name, value) in enumerate(zip(program.inputs, inputs, strict=True)):
        what = f"input {i} ({name!r})"
        if not isinstance(value, torch.Tensor):
            return InputError(f"{what}: expected a tensor, got {type(value).__name__}", index=i, name=name)
        buf = buffers[name]
        want = expected_device(device_type, buf)
        if value.device.type != want:
            hint = ""
            if want == "cuda" and value.device.type == "cpu":
                hint = " (load with device='cpu' to run it through the Triton interpreter)"
            return DeviceMismatchError(
                f"{what}: expected a tensor on {want}, got one on {value.device}{hint}",
                index=i, name=name,
            )
        if want == "cuda" and value.device.index != torch.cuda.current_device():
            return DeviceMismatchError(
                f"{what}: is on {value.device} but the current device is cuda:{torch.cuda.current_device()}; "
                f"call it under `with torch.cuda.device({value.device.index}):`", index=i, name=name
            )
        if str(value.dtype).removeprefix("torch.") != buf.dtype:
            return InputError(f"{what}: expected dtype {buf.dtype}, got {value.dtype}", index=i, name=name)
        if value.dim() != len(buf.sizes):
            return InputError(
                f"{what}: expected {len(buf.sizes)} dimensions {_describe(buf.sizes)}, got shape "
                f"{tuple(value.shape)}", index=i, name=name
            )
    env: dict[str, int] = {}
    for sym in program.symbols:
        src = symbol_source(sym)
        if src is not None:
            env[sym.name] = int(inputs[src[0]].shape[src[1]])
        elif sym.hint is not None:
            env[sym.name] = sym.hint
    for sym in program.symbols:
        value = env[sym.name]
        if value < sym.min or (sym.max is not None and value > sym.max):
            hi = "inf" if sym.max is None else sym.max
            return InputError(
                f"size symbol {sym.name} (from {sym.source}) is {value}, outside its range [{sym.min}, {hi}]"
            )
    for i, (name, value) in enumerate(zip(program.inputs, inputs, strict=True)):
        buf = buffers[name]
        what = f"input {i} ({name!r})"
        want = tuple(evaluate(e, env) for e in buf.sizes)
        if tuple(value.shape) != want:
            return InputError(
                f"{what}: expected shape {_describe(buf.sizes)} = {want}, got {tuple(value.shape)}",
                index=i, name=name,
            )
        want_strides = tuple(evaluate(e, env) for e in buf.strides)
        for d, (size, got, exp) in enumerate(zip(want, value.stride(), want_strides, strict=True)):
            if size > 1 and got != exp and 0 not in want:  # an empty tensor has any layout
                return InputError(
                    f"{what}: expected strides {want_strides}, got {value.stride()} (dim {d}); "
                    "pass a tensor with the expected layout (e.g. `.contiguous()`)", index=i, name=name,
                )
    return None
