"""Verifiers: the invariants a Graph or a Program must satisfy, checked with located errors.

`verify` checks a Graph: names are unique and defined before use, the value table
matches what inputs and nodes define, every op is registered with torch and its namespace is
in the graph's ``opsets``, expressions parse and mention only declared symbols, and each
node's output metadata is what the op's meta kernel computes from its inputs' metadata.

`verify_program` checks a Program: buffers and kernels referenced by steps exist and
are live, launch argument counts match kernel signatures, grids parse, and symbols can be
bound from the inputs.

Both raise `VerificationError` naming the node (or step) at fault::

    >>> verify(broken)                                   # doctest: +SKIP
    VerificationError: graph 'f', node 'add' [aten.add.Tensor]: value 'y' is used before it is defined
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torchfuse.graph import schema as S
from torchfuse.graph.compat import opset_problem
from torchfuse.graph.expr import ExprError, evaluate, free_symbols
from torchfuse.graph.kernel_source import KernelSourceError, check_kernel_source
from torchfuse.graph.ops import (
    UnknownOpError,
    decode_arg,
    flatten_result,
    resolve_op,
    tensor_refs,
    to_dtype,
    to_layout,
    to_memory_format,
)
from torchfuse.graph.torchfuse_ops import CHECKPOINT, CUSTOM_GRAD, TRITON_KERNEL
from torchfuse.graph.tracing import DataDependentError, FakeTensor, fake_from_meta

SYMBOL_SOURCE = re.compile(r"input:([0-9]{1,9})\.size\(([0-9]{1,9})\)")
"""The symbol sources a runtime can bind: ``input:<k>.size(<d>)``."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")


def is_identifier(name: object) -> bool:
    """True for an ASCII Python identifier that is no keyword and no dunder name: what every
    name from a document must be before it is written into generated Python."""
    return (isinstance(name, str) and _IDENTIFIER.fullmatch(name) is not None
            and not keyword.iskeyword(name) and not name.startswith("__"))


class VerificationError(ValueError):
    """A Graph or Program that breaks an invariant; ``where`` names the node or step."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.where = where


# ----------------------------------------------------------------------------- graph


class _GraphChecker:
    def __init__(self, graph: S.Graph, check_meta: bool) -> None:
        self.g = graph
        self.check_meta = check_meta
        self.symbols = {s.name for s in graph.symbols}
        self.hints = {s.name: s.hint for s in graph.symbols if s.hint is not None}
        self.defined: set[str] = set()
        self.where = f"graph {graph.name!r}"
        self.node: str | None = None

    def fail(self, message: str) -> None:
        raise VerificationError(f"{self.where}: {message}", self.node)

    def expr(self, expr: S.Expr, what: str) -> None:
        try:
            names = free_symbols(expr)
        except ExprError as e:
            self.fail(f"{what}: {e}")
        unknown = names - self.symbols
        if unknown:
            self.fail(f"{what} {expr!r} uses undeclared symbols {sorted(unknown)}")

    def meta(self, name: str, meta: S.TensorMeta) -> None:
        try:
            to_dtype(meta.dtype)
            torch.device(meta.device)
        except (ValueError, RuntimeError) as e:
            self.fail(f"value {name!r}: {e}")
        if len(meta.sizes) != len(meta.strides):
            self.fail(f"value {name!r} has {len(meta.sizes)} sizes but {len(meta.strides)} strides")
        for e in (*meta.sizes, *meta.strides, meta.storage_offset):
            self.expr(e, f"value {name!r}")

    def ref(self, name: str) -> None:
        if name in self.defined:
            return
        if name in self.g.values:
            self.fail(f"value {name!r} is used before it is defined")
        self.fail(f"value {name!r} is not defined")

    def args(self, args: Iterable[S.Argument]) -> None:
        for a in args:
            if isinstance(a, S.TensorRef):
                self.ref(a.name)
            elif isinstance(a, S.SymRef):
                self.expr(a.expr, "symbolic argument")
            elif isinstance(a, S.ListArg):
                self.args(a.items)
            else:
                problem = argument_problem(a)
                if problem:
                    self.fail(problem)

    def run(self) -> None:
        g = self.g
        for sym in g.symbols:
            if not is_identifier(sym.name):
                self.fail(f"symbol name {sym.name!r} is not an identifier")
            if sym.source and sym.source.startswith("input:"):
                m = SYMBOL_SOURCE.fullmatch(sym.source)
                if not m or int(m.group(1)) >= len(g.inputs):
                    self.fail(f"symbol {sym.name!r} has a malformed source {sym.source!r}")
        if len(self.symbols) != len(g.symbols):
            self.fail("symbol names are not unique")
        for name, meta in g.values.items():
            self.meta(name, meta)
        for inp in g.inputs:
            if inp.name in self.defined:
                self.fail(f"input {inp.name!r} is declared twice")
            if inp.name not in g.values:
                self.fail(f"input {inp.name!r} has no entry in the value table")
            self.defined.add(inp.name)
        node_names: set[str] = set()
        for node in g.nodes:
            self.node = node.name
            self.where = f"graph {g.name!r}, node {node.name!r} [{node.op}]"
            if node.name in node_names:
                self.fail("node name is not unique")
            node_names.add(node.name)
            self.node_(node)
        self.node, self.where = None, f"graph {g.name!r}"
        for i, out in enumerate(g.outputs):
            self.where = f"graph {g.name!r}, output {i}"
            self.args([out.value])
            inputs = {inp.name for inp in g.inputs}
            if out.aliases_input is not None and out.aliases_input not in inputs:
                self.fail(f"aliases_input {out.aliases_input!r} is not an input")
            # a gradient's target names a *forward* input, which a backward graph lacks
            if out.kind == "mutated_input" and out.target is not None and out.target not in inputs:
                self.fail(f"mutated_input target {out.target!r} is not an input")
        self.where = f"graph {g.name!r}"
        for name in g.values:
            if name not in self.defined:
                self.fail(f"value table entry {name!r} is defined by no input or node")
        for guard in g.guards:
            if isinstance(guard, S.SymbolGuard):
                self.expr(guard.expr, "symbol guard")
            elif isinstance(guard, S.TensorGuard):
                for e in (*guard.sizes, *(guard.strides or ())):
                    if e is not None:
                        self.expr(e, f"tensor guard on {guard.source}")

    def node_(self, node: S.Node) -> None:
        try:
            op = resolve_op(node.op)
        except UnknownOpError as e:
            self.fail(f"unknown op: {e}")
        bad = [k for k in node.kwargs if not is_identifier(k)]
        if bad:
            self.fail(f"keyword {bad[0]!r} is not an identifier")
        problem = opset_problem(node.op, self.g.opsets)
        if problem is not None:
            self.fail(problem)
        if node.op == TRITON_KERNEL:
            self.user_kernel(node)
        if node.op in (CUSTOM_GRAD, CHECKPOINT):
            from torchfuse.graph.custom_grad import check

            why = check(node.args[0] if node.args else None,
                        lambda g: verify(g, check_meta=self.check_meta),
                        "backward graph" if node.op == CUSTOM_GRAD else "region graph")
            if why is None and node.op == CHECKPOINT:
                why = _recompute_problem(node.args[0])
            if why is not None:
                self.fail(why)
        self.args(node.args)
        self.args(node.kwargs.values())
        for out in node.outputs:
            if not out:
                continue
            if out in self.defined:
                self.fail(f"value {out!r} is defined twice")
            if out not in self.g.values:
                self.fail(f"output {out!r} has no entry in the value table")
            self.defined.add(out)
        if self.check_meta:
            self.meta_kernel(node, op)

    def user_kernel(self, node: S.Node) -> None:
        from torchfuse.graph.user_kernels import UserKernelError, loads

        first = node.args[0] if node.args else None
        if not isinstance(first, S.Str):
            self.fail("the kernel description (first argument) is not a string")
        try:
            spec = loads(first.value)
            check_kernel_source(spec["source"], spec["entry"])
        except (UserKernelError, KernelSourceError) as e:
            self.fail(str(e))

    def meta_kernel(self, node: S.Node, op: torch._ops.OpOverload) -> None:
        refs = tensor_refs(list(node.args) + list(node.kwargs.values()))
        metas = [self.g.values[r] for r in refs] + [self.g.values[o] for o in node.outputs if o]
        exprs = [e for m in metas for e in (*m.sizes, *m.strides, m.storage_offset)]
        exprs += [a.expr for a in _sym_args(list(node.args) + list(node.kwargs.values()))]
        names = set().union(*(free_symbols(e) for e in exprs)) if exprs else set()
        if names - self.hints.keys():
            return  # a symbol without a hint: nothing concrete to compare against
        symbolic = bool(names)
        with _disable_current_modes():
            env = {r: fake_from_meta(self.g.values[r], self.hints, requires_grad=False) for r in refs}
            try:
                args = [decode_arg(a, env, self.hints) for a in node.args]
                kwargs = {k: decode_arg(a, env, self.hints) for k, a in node.kwargs.items()}
                result = op(*args, **kwargs)
            except (DataDependentError, NotImplementedError):
                return  # no meta kernel: the op cannot be checked this way
            except Exception as e:
                self.fail(f"the op's meta kernel rejects the recorded input metadata: {e}")
        flat = flatten_result(result)
        if len(flat) < len(node.outputs):
            self.fail(f"the op returns {len(flat)} values, the node names {len(node.outputs)}")
        for name, got in zip(node.outputs, flat[: len(node.outputs)], strict=True):
            if name:
                self.compare(name, self.g.values[name], got, symbolic)

    def compare(self, name: str, want: S.TensorMeta, got: Any, symbolic: bool) -> None:
        if not isinstance(got, torch.Tensor):
            self.fail(f"output {name!r} is a tensor in the value table, the op returns {got!r}")
        got_dtype = str(got.dtype).removeprefix("torch.")
        if want.dtype != got_dtype:
            self.fail(f"output {name!r} has dtype {want.dtype} in the value table, the op gives {got_dtype}")
        sizes = tuple(evaluate(s, self.hints) for s in want.sizes)
        if sizes != tuple(got.shape):
            self.fail(f"output {name!r} has sizes {list(want.sizes)} in the value table, "
                      f"the op gives {list(got.shape)}")
        got_device = got.fake_device if isinstance(got, FakeTensor) else got.device
        if torch.device(want.device) != got_device:
            self.fail(f"output {name!r} is on {want.device} in the value table, the op gives {got_device}")
        if not symbolic:
            if tuple(want.strides) != tuple(got.stride()):
                self.fail(f"output {name!r} has strides {list(want.strides)} in the value table, "
                          f"the op gives {list(got.stride())}")
            if want.storage_offset != got.storage_offset():
                self.fail(f"output {name!r} has storage offset {want.storage_offset} in the value "
                          f"table, the op gives {got.storage_offset()}")


def argument_problem(a: S.Argument) -> str | None:
    """What is wrong with a dtype, layout, memory-format or device argument's name, or None."""
    try:
        if isinstance(a, S.DtypeArg):
            to_dtype(a.name)
        elif isinstance(a, S.LayoutArg):
            to_layout(a.name)
        elif isinstance(a, S.MemoryFormatArg):
            to_memory_format(a.name)
        elif isinstance(a, S.DeviceArg):
            torch.device(a.name)
    except (ValueError, RuntimeError, TypeError) as e:
        return f"argument {a!r}: {e}"
    return None


def _sym_args(args: Iterable[S.Argument]) -> list[S.SymRef]:
    out: list[S.SymRef] = []
    for a in args:
        if isinstance(a, S.SymRef):
            out.append(a)
        elif isinstance(a, S.ListArg):
            out.extend(_sym_args(a.items))
    return out


def verify(graph: S.Graph, *, check_meta: bool = True) -> None:
    """Check every invariant of ``graph``; raise `VerificationError` naming the node.

    ``check_meta`` re-runs each op on meta tensors built from its inputs' metadata and
    compares dtype, sizes, device and (for concrete sizes) strides with the value table.
    Symbolic sizes are compared after substituting the symbols' hints; nodes that mention a
    symbol without a hint are not re-run.
    """
    _GraphChecker(graph, check_meta).run()


# ----------------------------------------------------------------------------- program


_SCALAR_ARGS = (S.SymRef, S.Int, S.Float, S.Bool)


class _ProgramChecker:
    def __init__(self, program: S.Program) -> None:
        self.p = program
        self.buffers = {b.name: b for b in program.buffers}
        self.kernels = {k.name: k for k in program.kernels}
        self.symbols = {s.name for s in program.symbols}
        self.live: set[str] = set()
        self.freed: set[str] = set()
        self.where = f"program {program.name!r}"
        self.step: str | None = None

    def fail(self, message: str) -> None:
        raise VerificationError(f"{self.where}: {message}", self.step)

    def expr(self, expr: S.Expr, what: str, extra: Iterable[str] = ()) -> None:
        try:
            names = free_symbols(expr)
        except ExprError as e:
            self.fail(f"{what}: {e}")
        unknown = names - self.symbols - set(extra)
        if unknown:
            self.fail(f"{what} {expr!r} uses undeclared names {sorted(unknown)}")

    def use(self, name: str) -> None:
        if name in self.live:
            return
        if name in self.freed:
            self.fail(f"buffer {name!r} is used after it was freed")
        if name in self.buffers:
            self.fail(f"buffer {name!r} is used before it is allocated or written")
        self.fail(f"buffer {name!r} is not declared")

    def define(self, name: str) -> None:
        if name not in self.buffers:
            self.fail(f"buffer {name!r} is not declared in Program.buffers")
        if name in self.live:
            self.fail(f"buffer {name!r} is defined twice")
        self.live.add(name)
        self.freed.discard(name)

    def args(self, args: Iterable[S.Argument]) -> None:
        for a in args:
            if isinstance(a, S.TensorRef):
                self.use(a.name)
            elif isinstance(a, S.SymRef):
                self.expr(a.expr, "symbolic argument")
            elif isinstance(a, S.ListArg):
                self.args(a.items)

    def run(self) -> None:
        p = self.p
        problem = program_name_problem(p) or program_size_problem(p)
        if problem:
            self.fail(problem)
        if len(self.buffers) != len(p.buffers):
            self.fail("buffer names are not unique")
        if len(self.kernels) != len(p.kernels):
            self.fail("kernel names are not unique")
        if len(self.symbols) != len(p.symbols):
            self.fail("symbol names are not unique")
        for b in p.buffers:
            try:
                to_dtype(b.dtype)
            except ValueError as e:
                self.fail(f"buffer {b.name!r}: {e}")
            if len(b.sizes) != len(b.strides):
                self.fail(f"buffer {b.name!r} has {len(b.sizes)} sizes but {len(b.strides)} strides")
            for e in (*b.sizes, *b.strides, b.storage_offset):
                self.expr(e, f"buffer {b.name!r}")
        for name in p.inputs:
            self.define(name)
        for sym in p.symbols:
            self.symbol(sym)
        for k in p.kernels:
            self.kernel(k)
        for i, step in enumerate(p.steps):
            self.step = f"step {i}"
            self.where = f"program {p.name!r}, step {i} ({_describe(step)})"
            self.step_(step)
        self.step, self.where = None, f"program {p.name!r}, outputs"
        self.args(p.outputs)

    def symbol(self, sym: S.Symbol) -> None:
        if sym.source is None:
            if sym.hint is None:
                self.fail(f"symbol {sym.name!r} has neither a source nor a hint")
            return
        m = SYMBOL_SOURCE.fullmatch(sym.source)
        if not m:
            self.fail(f"symbol {sym.name!r}: source {sym.source!r} is not 'input:<k>.size(<d>)'")
        k, d = int(m.group(1)), int(m.group(2))
        if k >= len(self.p.inputs):
            self.fail(f"symbol {sym.name!r}: source {sym.source!r} names input {k}, "
                      f"the program has {len(self.p.inputs)}")
        if d >= len(self.buffers[self.p.inputs[k]].sizes):
            self.fail(f"symbol {sym.name!r}: source {sym.source!r} names dimension {d} of a "
                      f"{len(self.buffers[self.p.inputs[k]].sizes)}-d input")

    def kernel(self, k: S.Kernel) -> None:
        self.where = f"program {self.p.name!r}, kernel {k.name!r}"
        if k.language == "cpp":
            self.cpp_kernel(k)
        else:
            try:
                check_kernel_source(k.source, k.entry or k.name)
            except KernelSourceError as e:
                self.fail(str(e))
        meta_names = set(k.constexprs)
        for c in k.configs:
            meta_names |= set(c.meta)
        for e in k.grid:
            self.expr(e, "grid", meta_names)
        for param in k.signature:
            if param.kind == "ptr" and param.dtype is not None:
                try:
                    to_dtype(param.dtype)
                except ValueError as e:
                    self.fail(f"parameter {param.name!r}: {e}")

    def cpp_kernel(self, k: S.Kernel) -> None:
        """What can be checked of C++ without a compiler: an identifier entry that the source
        defines with C linkage, and parameters of the kinds a C function takes. (C++ cannot be
        validated like a Triton source: running it needs ``trust_code=True``.)"""
        entry = k.entry or k.name
        if not entry.isidentifier():
            self.fail(f"entry {entry!r} is not an identifier")
        if f'extern "C" void {entry}(' not in k.source:
            self.fail(f'the source defines no extern "C" void {entry}(...)')
        for param in k.signature:
            if param.kind not in ("ptr", "i64", "i32"):
                self.fail(f"parameter {param.name!r}: kind {param.kind!r} cannot be passed to C++")

    def step_(self, step: S.Step) -> None:
        if isinstance(step, S.AllocStep):
            self.define(step.buffer)
            if step.reuse is not None and step.reuse not in self.freed:
                self.fail(f"reuses buffer {step.reuse!r}, which is not freed")
        elif isinstance(step, S.LaunchStep):
            self.launch(step)
        elif isinstance(step, S.ExternStep):
            try:
                resolve_op(step.op)
            except UnknownOpError as e:
                self.fail(f"unknown op: {e}")
            problem = opset_problem(step.op, self.p.opsets)
            if problem is not None:
                self.fail(problem)
            self.args(step.args)
            self.args(step.kwargs.values())
            for out in step.outputs:
                if out:
                    self.define(out)
        elif isinstance(step, S.ViewStep):
            self.use(step.base)
            for e in (*step.sizes, *step.strides, step.storage_offset):
                self.expr(e, "view")
            self.define(step.output)
        elif isinstance(step, S.FreeStep):
            self.use(step.buffer)
            self.live.discard(step.buffer)
            self.freed.add(step.buffer)
        elif isinstance(step, S.CopyStep):
            self.use(step.dst)
            self.use(step.src)

    def launch(self, step: S.LaunchStep) -> None:
        kernel = self.kernels.get(step.kernel)
        if kernel is None:
            self.fail(f"kernel {step.kernel!r} is not declared")
        if len(step.args) != len(kernel.signature):
            self.fail(f"passes {len(step.args)} arguments, kernel {kernel.name!r} takes "
                      f"{len(kernel.signature)} ({', '.join(p.name for p in kernel.signature)})")
        for param, arg in zip(kernel.signature, step.args, strict=True):
            if param.kind == "ptr" and not isinstance(arg, S.TensorRef):
                self.fail(f"parameter {param.name!r} is a pointer, got {arg!r}")
            if param.kind != "ptr" and not isinstance(arg, _SCALAR_ARGS):
                self.fail(f"parameter {param.name!r} is a {param.kind} scalar, got {arg!r}")
        self.args(step.args)
        grid = step.grid or kernel.grid
        if not grid:
            self.fail(f"neither the step nor kernel {kernel.name!r} gives a grid")
        meta_names = set(kernel.constexprs)
        for c in kernel.configs:
            meta_names |= set(c.meta)
        for e in grid:
            self.expr(e, "grid", meta_names)


def _describe(step: S.Step) -> str:
    if isinstance(step, S.LaunchStep):
        return f"launch {step.kernel}"
    if isinstance(step, S.ExternStep):
        return f"extern {step.op} -> {', '.join(step.outputs)}"
    if isinstance(step, S.AllocStep | S.FreeStep):
        return f"{type(step).__name__.removesuffix('Step').lower()} {step.buffer}"
    if isinstance(step, S.ViewStep):
        return f"view {step.output} of {step.base}"
    return f"copy {step.src} -> {step.dst}"


def program_name_problem(program: S.Program) -> str | None:
    """The first name of ``program`` that generated Python would contain but that is not an
    identifier (`is_identifier`): kernel and entry names, kernel parameters, constexpr
    and launch-config keys, extern keywords and symbols. None when all are."""
    # buffer names are not here: the call function's generator renames them to identifiers
    named: list[tuple[str, object]] = [("symbol", s.name) for s in program.symbols]
    for k in program.kernels:
        named += [("kernel", k.name)] + ([("kernel entry", k.entry)] if k.entry else [])
        named += [(f"parameter of kernel {k.name!r}", p.name) for p in k.signature]
        named += [(f"constexpr of kernel {k.name!r}", c) for c in k.constexprs]
        named += [(f"launch-config key of kernel {k.name!r}", m) for c in k.configs for m in c.meta]
    for step in program.steps:
        if isinstance(step, S.ExternStep):
            named += [(f"keyword of {step.op}", kw) for kw in step.kwargs]
    for what, name in named:
        if not is_identifier(name):
            return f"{what} name {name!r} is not an identifier"
    return None


def symbol_samples(symbols: Iterable[S.Symbol]) -> dict[str, int]:
    """The values the verifier evaluates sizes at: each symbol's hint, else its minimum (at
    least 2, as capture specializes 0 and 1)."""
    return {s.name: s.hint if s.hint is not None else max(s.min, 2) for s in symbols}


def program_size_problem(program: S.Program) -> str | None:
    """What is wrong with a buffer's or view's sizes, strides or offset, or None: each must
    evaluate (no division by zero, only declared symbols) to a non-negative int at the
    symbols' hints (`symbol_samples`)."""
    env = symbol_samples(program.symbols)
    laid_out: list[tuple[str, S.Buffer | S.ViewStep]] = [(f"buffer {b.name!r}", b) for b in program.buffers]
    laid_out += [(f"view {s.output!r}", s) for s in program.steps if isinstance(s, S.ViewStep)]
    for what, item in laid_out:
        for field, exprs in (("sizes", item.sizes), ("strides", item.strides),
                             ("storage offset", (item.storage_offset,))):
            for e in exprs:
                try:
                    value = evaluate(e, env)
                except ExprError as err:
                    return f"{what}: {field} {e!r} does not evaluate at the symbols' hints {env}: {err}"
                if isinstance(value, bool) or value < 0:
                    return f"{what}: {field} {e!r} is {value} at the symbols' hints {env}; expected >= 0"
    return None


def verify_program(program: S.Program) -> None:
    """Check every invariant of ``program``; raise `VerificationError` naming the step."""
    _ProgramChecker(program).run()


def _recompute_problem(region: Any) -> str | None:
    """Why a checkpoint region's recompute cannot be derived (its kept draws not laid out as
    `checkpoint_region.keep_draws` lays them out), or None."""
    from torchfuse.graph.checkpoint_region import RegionError, recompute_graph
    from torchfuse.graph.custom_grad import loads

    try:
        recompute_graph(loads(region.value))
    except RegionError as e:
        return f"region graph: {e}"
    return None
