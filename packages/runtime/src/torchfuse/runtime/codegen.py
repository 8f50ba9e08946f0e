"""Generating the Python call function of a Program.

A Program's steps become straight-line Python, generated once per (Program, chosen configs) and
``exec``-ed; a call then costs what the launches cost, with no per-step dispatch. For a Program
with an ``add`` kernel and a matmul the generated source reads::

    def call(*args):
        if _is_grad_enabled():                   # extern ops must not record autograd history
            with _no_grad():
                return call(*args)
        if len(args) != 2:
            raise _bad_inputs(args)
        x, w = args
        try:
            _sh0 = x.shape
            ...                                  # ranks checked, symbols bound, strides read
            s0 = _sh0[0]
        except (AttributeError, TypeError):
            raise _bad_inputs(args) from None
        if (x.dtype is not _float32
                or not x.is_cuda
                ...):                            # one combined check of every input
            raise _bad_inputs(args)
        _dev = x.device
        _stats.calls += 1
        _stats.kernel_launches += 2
        buf0 = _empty_strided((s0, 16), (16, 1), dtype=_float32, device=_dev)
        _k_add[((s0*16 + 127)//128, 1, 1)](x, x, buf0, s0*16, BLOCK=128, num_warps=4, num_stages=1)
        buf1 = _aten_mm_default(buf0, w)
        del buf0
        return [buf1]

Grid expressions are translated to Python once, here, with the chosen config's meta values
folded in as constants. On the GPU a second function, ``call_fast``, launches each kernel
through its compiled launcher (``CompiledKernel.run``), skipping ``JITFunction.run``'s argument
binding and cache lookup; it takes the launcher handles from a table keyed by the size symbols
and input alignment, which ``call`` fills on its first run for that key (Triton specializes
integers on ``== 1`` and divisibility by 16, and pointers on 16-byte alignment, so those decide
which binary runs).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torchfuse.graph import expr as E
from torchfuse.graph import schema as S
from torchfuse.graph.ops import resolve_op, to_dtype, to_layout, to_memory_format
from torchfuse.runtime.checks import buffer_table, expected_device, program_expressions, symbol_source
from torchfuse.runtime.errors import InvalidProgramError

_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# Names from the Program become Python names: ASCII only (NFKC folds other letters onto
# ASCII ones, so a Unicode name could alias a generated global), and matched whole.
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")
# Names the generated code itself uses unprefixed (an input named ``call`` must not shadow it).
_RESERVED = {"args", "min", "max", "len", "float", "int", "call", "call_fast"}


@dataclass
class Generated:
    """The generated module: its source and the globals it runs with."""

    source: str
    globals: dict[str, Any]
    entry: str = "call"
    fast_entry: str | None = None
    launches: int = 0
    """Kernels plus extern ops one call launches."""
    tune_slots: dict[int, int] = field(default_factory=dict)
    """Launch-step index -> tuning slot, when generated for tuning."""
    ops: dict[str, str] = field(default_factory=dict)
    """Global name -> the qualified op it calls (``aten.mm.default``), for each extern op."""
    key: str | None = None
    """Its name in the call cache (`torchfuse.runtime.call_cache`), once looked up there."""


class _Names:
    """Python identifiers for the Program's buffers and symbols, and the module's globals."""

    def __init__(self) -> None:
        self.local: dict[str, str] = {}
        self.used: set[str] = set(_RESERVED)
        self.globals: dict[str, Any] = {}
        self.global_by_id: dict[tuple[str, int], str] = {}

    def bind_local(self, name: str) -> str:
        if name in self.local:
            return self.local[name]
        py = name if _IDENT.fullmatch(name) and not keyword.iskeyword(name) else ""
        if not py or py in self.used:
            base = _NOT_IDENT.sub("_", name).strip("_") or "v"
            base = base if base[0].isalpha() else "v" + base
            py, i = base, 0
            while py in self.used or keyword.iskeyword(py):
                i += 1
                py = f"{base}_{i}"
        self.used.add(py)
        self.local[name] = py
        return py

    def __getitem__(self, name: str) -> str:
        try:
            return self.local[name]
        except KeyError:
            raise InvalidProgramError(f"unknown name {name!r} in the program") from None

    def glob(self, hint: str, value: Any) -> str:
        """A module global holding ``value`` (one per distinct object)."""
        key = (hint, id(value))
        if key in self.global_by_id:
            return self.global_by_id[key]
        name = "_" + _NOT_IDENT.sub("_", hint)
        base, i = name, 0
        while name in self.globals:
            i += 1
            name = f"{base}_{i}"
        self.globals[name] = value
        self.global_by_id[key] = name
        return name


_PREC = {"==": 0, "!=": 0, "<=": 0, "<": 0, ">=": 0, ">": 0, "+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


def _fold(node: E.Ast, consts: Mapping[str, int]) -> E.Ast:
    """Substitute ``consts``, evaluate constant subtrees, and merge the constants of a sum
    (``s0*s1 + 64 - 1`` becomes ``s0*s1 + 63``)."""
    if isinstance(node, E.Name) and node.name in consts:
        return E.Num(int(consts[node.name]))
    if isinstance(node, E.Call):
        args = tuple(_fold(a, consts) for a in node.args)
        if all(isinstance(a, E.Num) for a in args):
            vals = [a.value for a in args]  # type: ignore[union-attr]
            return E.Num(min(vals) if node.fn == "min" else max(vals))
        return E.Call(node.fn, args)
    if not isinstance(node, E.BinOp):
        return node
    lhs, rhs = _fold(node.lhs, consts), _fold(node.rhs, consts)
    if isinstance(lhs, E.Num) and isinstance(rhs, E.Num):
        value = E.evaluate(f"({lhs.value}) {node.op} ({rhs.value})")
        if not isinstance(value, bool):
            return E.Num(int(value))
    if node.op in ("+", "-") and isinstance(rhs, E.Num):
        delta = rhs.value if node.op == "+" else -rhs.value
        if isinstance(lhs, E.BinOp) and lhs.op in ("+", "-") and isinstance(lhs.rhs, E.Num):
            delta += lhs.rhs.value if lhs.op == "+" else -lhs.rhs.value
            lhs = lhs.lhs
        if delta == 0:
            return lhs
        return E.BinOp("+" if delta > 0 else "-", lhs, E.Num(abs(delta)))
    return E.BinOp(node.op, lhs, rhs)


def _print(node: E.Ast, names: Mapping[str, str], expr: S.Expr) -> tuple[str, int]:
    """(source, precedence) with parentheses only where Python needs them."""
    if isinstance(node, E.Num):
        return (str(node.value), 3) if node.value >= 0 else (f"({node.value})", 3)
    if isinstance(node, E.Name):
        if node.name not in names:
            raise InvalidProgramError(f"expression {expr!r}: unknown name {node.name!r}")
        return names[node.name], 3
    if isinstance(node, E.Call):
        return f"{node.fn}({', '.join(_print(a, names, expr)[0] for a in node.args)})", 3
    prec = _PREC[node.op]
    lhs, lp = _print(node.lhs, names, expr)
    rhs, rp = _print(node.rhs, names, expr)
    if lp < prec:
        lhs = f"({lhs})"
    if rp < prec or (rp == prec and node.op not in ("+", "*")):
        rhs = f"({rhs})"
    space = " " if prec < 2 else ""
    return f"{lhs}{space}{node.op}{space}{rhs}", prec


def render_expr(expr: S.Expr, names: Mapping[str, str], consts: Mapping[str, int] | None = None) -> str:
    """Python source of a format expression; ``consts`` are folded in (e.g. a config's ``XBLOCK``).

    >>> render_expr("(s0*s1 + XBLOCK - 1) // XBLOCK", {"s0": "s0", "s1": "s1"}, {"XBLOCK": 64})
    '(s0*s1 + 63)//64'
    """
    if isinstance(expr, int):
        return str(expr)
    return _print(_fold(E.parse(expr), consts or {}), names, expr)[0]


def _literal(value: Any) -> str:
    if isinstance(value, float) and value != value:
        return "float('nan')"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return f"float({str(value)!r})"
    return repr(value)


@dataclass
class _Ctx:
    program: S.Program
    names: _Names
    device_type: str
    sym_names: dict[str, str]

    def arg(self, a: S.Argument) -> str:
        if isinstance(a, S.TensorRef):
            return self.names[a.name]
        if isinstance(a, S.SymRef):
            return render_expr(a.expr, self.sym_names)
        if isinstance(a, S.Int | S.Bool | S.Str):
            return repr(a.value)
        if isinstance(a, S.Float):
            return _literal(float(a.value))
        if isinstance(a, S.NoneArg):
            return "None"
        if isinstance(a, S.ListArg):
            return "[" + ", ".join(self.arg(x) for x in a.items) + "]"
        if isinstance(a, S.DtypeArg):
            return self.names.glob(a.name, to_dtype(a.name))
        if isinstance(a, S.DeviceArg):
            # Devices of the Program's own type mean "wherever this call runs" (retargeting).
            if a.name.split(":")[0] == self.program.device.split(":")[0]:
                return "_dev"
            return self.names.glob("device_" + a.name, torch.device(a.name))
        if isinstance(a, S.LayoutArg | S.MemoryFormatArg):
            value = to_layout(a.name) if isinstance(a, S.LayoutArg) else to_memory_format(a.name)
            return self.names.glob(a.name, value)
        raise InvalidProgramError(f"program {self.program.name!r}: cannot pass argument {a!r}")

    def tup(self, exprs: tuple[S.Expr, ...]) -> str:
        items = [render_expr(e, self.sym_names) for e in exprs]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def used_symbols(program: S.Program) -> frozenset[str]:
    """The size symbols some expression of ``program`` uses (buffers, steps, grids, outputs).

    A symbol that only names an input's size which the buffer table writes as another
    expression (``s2`` once a guard made it ``s0``) is left out of the call function: the
    input check ``_sh1[0] != s0`` already covers it, and binding, range-checking and keying
    on it would cost every call for nothing.
    """
    used: set[str] = set()
    for e in program_expressions(program):
        if isinstance(e, str):
            used |= E.free_symbols(e)
    # a range of its own (a max, a min above 2) is a check only the symbol itself can make
    return frozenset(s.name for s in program.symbols
                     if s.max is not None or s.min > 2 or s.name in used)


def _prologue(ctx: _Ctx, out: list[str]) -> None:
    """Argument count, symbol binding and the one combined input check."""
    p = ctx.program
    buffers = buffer_table(p)
    params = [ctx.names.bind_local(n) for n in p.inputs]
    n = len(params)
    out.append(f"    if len(args) != {n}:")
    out.append("        raise _bad_inputs(args)")
    if n:
        out.append(f"    {', '.join(params)}{',' if n == 1 else ''} = args")
    if not n:
        return
    bound: dict[tuple[int, int], str] = {}
    out.append("    try:")
    for i, name in enumerate(params):
        out.append(f"        _sh{i} = {name}.shape")
    ranks = " or ".join(f"len(_sh{i}) != {len(buffers[b].sizes)}" for i, b in enumerate(p.inputs))
    out.append(f"        if {ranks}:")
    out.append("            raise _bad_inputs(args)")
    symbols = [sym for sym in p.symbols if sym.name in ctx.sym_names]
    for sym in symbols:
        src = symbol_source(sym)
        py = ctx.sym_names[sym.name]
        if src is not None:
            out.append(f"        {py} = _sh{src[0]}[{src[1]}]")
            bound[src] = sym.name
        else:
            out.append(f"        {py} = {sym.hint}")
    big_symbols = {sym.name for sym in symbols if sym.min >= 2}
    conds: list[str] = []
    for i, (bname, py) in enumerate(zip(p.inputs, params, strict=True)):
        buf = buffers[bname]
        conds.append(f"{py}.dtype is not {ctx.names.glob(buf.dtype, to_dtype(buf.dtype))}")
        on = expected_device(ctx.device_type, buf)
        # ``is_cuda`` / ``is_cpu`` read a flag; ``.device`` would build a device object per input
        conds.append(f"not {py}.is_cuda" if on == "cuda" else f"not {py}.is_cpu")
        # whole tuples compared at once (one C-level comparison, a line of source instead of
        # one a dimension: Swin-T training's call functions are 15% shorter); a dimension
        # bound to a symbol just read from it compares equal
        if any(bound.get((i, d)) != size for d, size in enumerate(buf.sizes)):
            conds.append(f"_sh{i} != {ctx.tup(buf.sizes)}")
        stride_conds = []
        empty = any(isinstance(n, int) and n == 0 for n in buf.sizes)  # nothing read: any layout
        for d, (size, stride) in enumerate(zip(buf.sizes, buf.strides, strict=True)):
            if size == 1 or empty:
                continue  # the stride of a size-1 dimension never matters
            cond = f"_st{i}[{d}] != {render_expr(stride, ctx.sym_names)}"
            if not isinstance(size, int) and size not in big_symbols:
                cond = f"({cond} and _sh{i}[{d}] > 1)"
            stride_conds.append(cond)
        if stride_conds:
            out.append(f"        _st{i} = {py}.stride()")
            if len(stride_conds) == len(buf.sizes) and all(c.startswith("_st") for c in stride_conds):
                stride_conds = [f"_st{i} != {ctx.tup(buf.strides)}"]  # every dimension's stride counts
            conds.extend(stride_conds)
    for sym in symbols:
        py = ctx.sym_names[sym.name]
        if sym.max is not None:
            conds.append(f"not {sym.min} <= {py} <= {sym.max}")
        elif sym.min > 0:
            conds.append(f"{py} < {sym.min}")
    out.append("    except (AttributeError, TypeError):")
    out.append("        raise _bad_inputs(args) from None")
    out.append("    if (" + "\n            or ".join(conds) + "):")
    out.append("        raise _bad_inputs(args)")
    on_device = [py for b, py in zip(p.inputs, params, strict=True)
                 if expected_device(ctx.device_type, buffers[b]) == "cuda"]
    if ctx.device_type == "cuda" and on_device:
        out.append(f"    _dev = {on_device[0]}.device")
        out.append("    if _dev.index != _current_device():")
        out.append("        raise _bad_inputs(args)")


def arrange(kernel: S.Kernel, cfg: S.LaunchConfig | None, params: list[str], n_args: int
            ) -> list[tuple[str, int | str]]:
    """Where each parameter of the Triton function gets its value, in parameter order.

    ``("const", name)`` for the kernel's constexprs and the config's meta (by name),
    ``("arg", i)`` for the launch's i-th argument (the remaining parameters, in order, as
    ``fn[grid](*args, **constexprs)`` would bind them), ``("default", name)`` for a trailing
    parameter left to its default.
    """
    named = {**kernel.constexprs, **(cfg.meta if cfg else {})}
    plan: list[tuple[str, int | str]] = []
    i = 0
    for pname in params:
        if pname in named:
            plan.append(("const", pname))
        elif i < n_args:
            plan.append(("arg", i))
            i += 1
        else:
            plan.append(("default", pname))
    if i < n_args:
        raise InvalidProgramError(
            f"kernel {kernel.name!r}: the launch passes {n_args} arguments but the function "
            f"{params} has room for {i} besides the constexprs {sorted(named)}"
        )
    return plan


def _launch_args(ctx: _Ctx, kernel: S.Kernel, step: S.LaunchStep, cfg: S.LaunchConfig | None,
                 fn: Any, params: list[str]) -> tuple[str, str, list[str], list[int]]:
    """(arguments of ``fn[grid](...)``, grid source, every JIT parameter's value in order, the
    positions in that order that are tensors)."""
    pos = [ctx.arg(a) for a in step.args]
    meta = dict(cfg.meta) if cfg else {}
    named = {**kernel.constexprs, **meta}
    grid_consts = {**_int_constexprs(kernel), **meta}
    grid = [render_expr(g, ctx.sym_names, grid_consts) for g in (step.grid or kernel.grid)]
    grid += ["1"] * (3 - len(grid))
    plan = arrange(kernel, cfg, params, len(pos))
    ordered: list[str] = []
    tensors: list[int] = []
    for kind, what in plan:
        if kind == "arg":
            if isinstance(step.args[int(what)], S.TensorRef):
                tensors.append(len(ordered))
            ordered.append(pos[int(what)])
        elif kind == "const":
            ordered.append(_literal(named[str(what)]))
        else:
            default = _param_default(fn, str(what))
            if default is None:
                raise InvalidProgramError(
                    f"kernel {kernel.name!r}: its parameter {what!r} gets no value from the launch")
            ordered.append(default)
    options = [f"num_warps={cfg.num_warps}", f"num_stages={cfg.num_stages}"] if cfg is not None else []
    kinds = [k for k, _ in plan if k != "default"]
    if kinds == sorted(kinds, key=lambda k: k != "arg"):
        # Constexprs after every runtime argument: the readable form of the launch convention.
        call_args = pos + [f"{k}={_literal(v)}" for k, v in named.items()] + options
    else:
        call_args = ordered + options  # a constexpr between runtime parameters: all positional
    return ", ".join(call_args), "(" + ", ".join(grid) + ")", ordered, tensors


def _int_constexprs(kernel: S.Kernel) -> dict[str, int]:
    """The kernel's integer constexprs, which a grid expression may name as well."""
    return {k: v for k, v in kernel.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}


_NO_DEFAULT = object()


def _default_value(fn: Any, pname: str) -> Any:
    import inspect

    try:
        param = inspect.signature(fn.fn).parameters[pname]
    except (AttributeError, KeyError, TypeError, ValueError):
        return _NO_DEFAULT
    if param.default is inspect.Parameter.empty:
        return _NO_DEFAULT
    return getattr(param.default, "value", param.default)  # tl.constexpr wraps its value


def _param_default(fn: Any, pname: str) -> str | None:
    default = _default_value(fn, pname)
    return _literal(default) if isinstance(default, int | float | bool | str) else None


def launch_values(kernel: S.Kernel, cfg: S.LaunchConfig | None, fn: Any, args: Sequence[Any]) -> list[Any]:
    """The positional values of ``fn[grid](*values)`` for one launch, following `arrange`
    (trailing defaulted parameters left out, earlier ones filled with their defaults)."""
    from torchfuse.runtime.kernels import param_names

    named = {**kernel.constexprs, **(cfg.meta if cfg else {})}
    plan = arrange(kernel, cfg, param_names(fn), len(args))
    while plan and plan[-1][0] == "default":
        plan.pop()
    values = []
    for kind, what in plan:
        if kind == "arg":
            values.append(args[int(what)])
        elif kind == "const":
            values.append(named[str(what)])
        else:
            default = _default_value(fn, str(what))
            if default is _NO_DEFAULT:
                raise InvalidProgramError(
                    f"kernel {kernel.name!r}: its parameter {what!r} gets no value from the launch")
            values.append(default)
    return values


def generate(program: S.Program, *, device_type: str, kernels: Mapping[str, Any],
             configs: Mapping[str, S.LaunchConfig | None], fast: bool = False,
             tune: frozenset[str] = frozenset(), tuned_for: tuple[str, ...] | None = None,
             layout: str = "generic") -> Generated:
    """Python source (and globals) of the call function(s) of ``program``.

    ``kernels`` maps kernel names to Triton functions, ``configs`` kernel names to the chosen
    config. Launches of kernels named in ``tune`` become ``_tune(slot, fn, args, env)`` calls
    (the autotuner picks the config there). ``tuned_for`` names the symbols whose values the
    configs were chosen for: a call with other values goes to ``_redispatch``. ``layout`` is how
    ``call_fast`` calls each kernel's launcher (`LAUNCH_LAYOUTS`).
    """
    from torchfuse.runtime.kernels import param_names

    names = _Names()
    used = used_symbols(program)
    sym_names = {s.name: names.bind_local(s.name) for s in program.symbols if s.name in used}
    ctx = _Ctx(program, names, device_type, sym_names)
    kmap = {k.name: k for k in program.kernels}
    g = names.globals
    g.update(_empty_strided=torch.empty_strided, _as_strided=torch.as_strided, _ptr=torch.Tensor.data_ptr)
    buffers = buffer_table(program)
    reuse_sources = {s.reuse for s in program.steps if isinstance(s, S.AllocStep) and s.reuse}

    head: list[str] = []
    _prologue(ctx, head)
    cpu = names.glob("device_cpu", torch.device("cpu"))
    if device_type != "cuda":
        head.append(f"    _dev = {cpu}")
    elif not any(expected_device(device_type, buffers[b]) == "cuda" for b in program.inputs):
        g["_cuda_device"] = _cuda_device  # no input on the GPU to take the device from
        head.append("    _dev = _cuda_device(_current_device())")
    # Only ``call`` checks that the configs were chosen for these symbol values: ``call_fast``
    # finds a launcher handle only under a key (every symbol's value) that ``call`` recorded.
    tuned_check: list[str] = []
    if tuned_for:
        key = "(" + ", ".join(sym_names[s] for s in tuned_for) + ",)"
        tuned_check = [f"    if {key} not in _TUNED_FOR:", "        return _redispatch(args)"]

    # Body lines are built twice when fast launching: once with fn[grid] (recording handles),
    # once with direct launcher calls.
    slow: list[str] = []
    quick: list[str] = []
    launches = 0
    n_launch = 0
    tune_slots: dict[int, int] = {}
    param_cache: dict[str, list[str]] = {}
    extern_ops: dict[str, str] = {}
    # Each input's address is read once per fast call: for the key's alignment test and the launches.
    pointers: dict[str, str] = {names[i]: f"_p_{names[i]}" for i in program.inputs}
    for idx, step in enumerate(program.steps):
        if isinstance(step, S.AllocStep):
            buf = buffers[step.buffer]
            py = names.bind_local(step.buffer)
            dt = names.glob(buf.dtype, to_dtype(buf.dtype))
            sizes, strides = ctx.tup(buf.sizes), ctx.tup(buf.strides)
            off = render_expr(buf.storage_offset, sym_names)
            where = "_dev" if expected_device(device_type, buf) == device_type else cpu
            if step.reuse:
                old = names[step.reuse]
                prev = buffers.get(step.reuse)
                same = prev is not None and (prev.dtype, prev.sizes, prev.strides, prev.storage_offset) == (
                    buf.dtype, buf.sizes, buf.strides, buf.storage_offset)
                if same:
                    line = f"    {py} = {old}"
                elif prev is not None and prev.dtype == buf.dtype:
                    line = f"    {py} = _as_strided({old}, {sizes}, {strides}, {off})"
                else:
                    g["_retype"] = _retype
                    line = f"    {py} = _retype({old}, {dt}, {sizes}, {strides}, {off})"
                lines = [f"{line}  # reuses {step.reuse}", f"    del {old}"]
            elif buf.storage_offset != 0:
                g["_alloc_offset"] = _alloc_offset
                lines = [f"    {py} = _alloc_offset({sizes}, {strides}, {off}, {dt}, {where})"]
            else:
                lines = [f"    {py} = _empty_strided({sizes}, {strides}, dtype={dt}, device={where})"]
            slow += lines
            quick += lines
        elif isinstance(step, S.LaunchStep):
            kernel = kmap[step.kernel]
            fn = kernels[kernel.name]
            kname = names.glob("k_" + kernel.name, fn)
            if kernel.language == "cpp":
                # a C function (`torchfuse.runtime.cpp`): buffer addresses and sizes, no grid
                cargs = [f"_ptr({ctx.arg(a)})" if isinstance(a, S.TensorRef) else ctx.arg(a)
                         for a in step.args]
                call = f"    {kname}({', '.join(cargs)})"
                slow.append(call)
                quick.append(call)
                launches += 1
                continue
            params = param_cache.setdefault(kernel.name, param_names(fn))
            cfg = configs.get(kernel.name)
            call_args, grid, ordered, tensors = _launch_args(ctx, kernel, step, cfg, fn, params)
            launches += 1
            if kernel.name in tune:
                tune_slots[idx] = len(tune_slots)
                env = "{" + ", ".join(f"{s!r}: {py}" for s, py in sym_names.items()) + "}"
                pos = [ctx.arg(a) for a in step.args]
                packed = ", ".join(pos) + ("," if len(pos) == 1 else "")
                slow.append(f"    _tune({tune_slots[idx]}, {idx}, ({packed}), {env})")
                continue
            call = f"{kname}[{grid}]({call_args})"
            slow.append(f"    _c{n_launch} = {call}" if fast else f"    {call}")
            i = n_launch
            # Tensors go to the launcher as raw addresses, each read once per call: given a
            # tensor, Triton's launcher calls data_ptr() and asks the driver to validate the
            # pointer (cuPointerGetAttribute) on every launch. The prologue has already checked
            # the inputs' devices, and our own buffers are allocated on the launch device.
            for k in tensors:
                var = ordered[k]
                if var not in pointers:
                    pointers[var] = f"_p_{var}"
                    quick.append(f"    {pointers[var]} = _ptr({var})")
                ordered[k] = pointers[var]
            quick.append(_quick_launch(layout, i, grid[1:-1], ordered))
            n_launch += 1
        elif isinstance(step, S.ExternStep):
            op = resolve_op(step.op)
            oname = names.glob(step.op.replace(".", "_"), bound_op(op))
            extern_ops[oname] = step.op
            args = [ctx.arg(a) for a in step.args] + [f"{k}={ctx.arg(v)}" for k, v in step.kwargs.items()]
            outs = [names.bind_local(o) if o else "_" for o in step.outputs]
            call = f"{oname}({', '.join(args)})"
            launches += 1
            returns = op._schema.returns
            simple = len(returns) == len(outs) and not any(_is_list(r) for r in returns)
            if not outs:
                line = f"    {call}"
            elif len(outs) == 1 and len(returns) == 1 and not _is_list(returns[0]):
                line = f"    {outs[0]} = {call}"
            elif simple:
                line = f"    {', '.join(outs)} = {call}"
            else:
                g["_flatten"] = _flatten
                line = f"    {', '.join(outs)}, *_ = _flatten({call})"
            slow.append(line)
            quick.append(line)
            for o in step.outputs:  # the layout the kernels after it index it with
                want = _static_strides(buffers.get(o)) if o else None
                if want is not None:
                    g["_fit"] = fit_layout
                    # the common case, the planned layout, costs a stride() and a comparison
                    # (an output a kernel left undefined is None, whatever its schema says)
                    v = names[o]
                    line = (f"    if {v} is not None and {v}.stride() != {want!r}:\n"
                            f"        {v} = _fit({v}, {want!r})")
                    slow.append(line)
                    quick.append(line)
        elif isinstance(step, S.ViewStep):
            view = (names[step.base], ctx.tup(step.sizes), ctx.tup(step.strides),
                    render_expr(step.storage_offset, sym_names))
            line = f"    {names.bind_local(step.output)} = _as_strided({', '.join(view)})"
            slow.append(line)
            quick.append(line)
        elif isinstance(step, S.FreeStep):
            if step.buffer in reuse_sources:
                line = f"    # {step.buffer} freed; its storage is taken over below"
            else:
                line = f"    del {names[step.buffer]}"
            slow.append(line)
            quick.append(line)
        elif isinstance(step, S.CopyStep):
            line = f"    {names[step.dst]}.copy_({names[step.src]})"
            slow.append(line)
            quick.append(line)
            launches += 1
        else:  # pragma: no cover - the schema has no other step kinds
            raise InvalidProgramError(f"unknown step {step!r}")
    ret = "    return [" + ", ".join(ctx.arg(o) for o in program.outputs) + "]"

    counters = ["    _stats.calls += 1", f"    _stats.kernel_launches += {launches}"]
    src = [f"# generated by torchfuse.runtime for program {program.name!r} ({device_type})"]
    for k in program.kernels:
        cfg = configs.get(k.name)
        if cfg is not None:
            src.append(f"# {k.name}: {dict(cfg.meta)} num_warps={cfg.num_warps} num_stages={cfg.num_stages}")
    fast = fast and n_launch > 0
    key = [f"    _key = {_key_src(program, sym_names, names)}"] if fast else []
    fast_key = [f"    {pointers[names[i]]} = _ptr({names[i]})" for i in program.inputs]
    fast_key.append(f"    _key = {_key_src(program, sym_names, names, pointers)}")

    def no_grad(entry: str) -> list[str]:
        # Extern ops and copies would record autograd history (and copy_ into a leaf that
        # requires grad fails); Triton launches never do. Differentiation is the caller's job.
        if not any(isinstance(s, S.ExternStep | S.CopyStep) for s in program.steps):
            return []
        g.update(_is_grad_enabled=torch.is_grad_enabled, _no_grad=torch.no_grad)
        return ["    if _is_grad_enabled():",
                "        with _no_grad():",
                f"            return {entry}(*args)"]

    src += ["", "", "def call(*args):", *no_grad("call"), *head, *tuned_check, *counters, *key, *slow]
    fast_entry = None
    if fast:
        handles = ", ".join(f"_c{i}" for i in range(n_launch))
        src.append(f"    _record(_key, ({handles},))")
    src.append(ret)
    if fast:
        fast_entry = "call_fast"
        unpack = ", ".join(", ".join(f"{h}{i}" for h in LAUNCH_LAYOUTS[layout]) for i in range(n_launch))
        src += ["", "", "def call_fast(*args):", *no_grad("call_fast"), *head, *fast_key,
                "    _h = _handles.get(_key)",
                "    if _h is None:",
                "        return call(*args)",
                *counters,
                f"    {unpack}{',' if n_launch == 1 else ''} = _h",
                "    _stream = _get_stream(_dev.index)",
                *quick, ret]
    return Generated(source="\n".join(src) + "\n", globals=g, fast_entry=fast_entry, launches=launches,
                     tune_slots=tune_slots, ops=extern_ops)


LAUNCH_LAYOUTS: dict[str, tuple[str, ...]] = {
    # CompiledKernel.run(gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit, *args)
    "generic": ("_r", "_f", "_m"),
    # Triton 3.6's C launcher, called without its Python wrapper: (gx, gy, gz, stream, function,
    # cooperative, pdl, global_scratch, profile_scratch, metadata, launch_metadata, enter, exit, *args)
    "args": ("_r", "_f", "_m", "_x", "_y"),
    # Triton 3.9's: (gx, gy, gz, stream, function, cooperative, pdl, metadata, launch_metadata,
    # enter, exit, global_scratch, profile_scratch, arg_annotations, kernel_signature, args)
    "tuple": ("_r", "_f", "_m", "_x", "_y", "_a", "_s"),
}
"""The handles ``call_fast`` unpacks per launch, by launcher layout (see ``runtime.launchers``)."""


def _quick_launch(layout: str, i: int, grid: str, ordered: Sequence[str]) -> str:
    # launch_metadata and the enter/exit hooks are None: no launch hooks are installed; the
    # scratch pointers are None: only kernels that need no scratch memory take this path.
    args = ", ".join(ordered)
    if layout == "args":
        return f"    _r{i}({grid}, _stream, _f{i}, _x{i}, _y{i}, None, None, _m{i}, None, None, None, {args})"
    if layout == "tuple":
        packed = args + ("," if len(ordered) == 1 else "")
        return (f"    _r{i}({grid}, _stream, _f{i}, _x{i}, _y{i}, _m{i}, None, None, None, None, None, "
                f"_a{i}, _s{i}, ({packed}))")
    return f"    _r{i}({grid}, _stream, _f{i}, _m{i}, None, None, None, {args})"


def _key_src(program: S.Program, sym_names: Mapping[str, str], names: _Names,
             pointers: Mapping[str, str] | None = None) -> str:
    """Source of the fast-launch key: symbol values, and whether every input is 16-byte aligned
    (its address read by ``.data_ptr()``, or from the local ``pointers`` names)."""
    parts = [sym_names[s.name] for s in program.symbols if s.name in sym_names]
    ptrs = [pointers[names[i]] if pointers else f"{names[i]}.data_ptr()" for i in program.inputs]
    if ptrs:
        parts.append(f"(({' | '.join(ptrs)}) & 15) == 0")
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def handle_key(program: S.Program, env: Mapping[str, int], inputs: Sequence[Any]) -> tuple[Any, ...] | None:
    """What the fast path's ``_key`` (`_key_src`) is for a call with ``inputs`` and symbol
    values ``env``; None when an input is not a tensor (no fast path for it)."""
    used = used_symbols(program)
    parts: list[Any] = [int(env[s.name]) for s in program.symbols if s.name in used]
    if program.inputs:
        if len(inputs) != len(program.inputs) or not all(isinstance(t, torch.Tensor) for t in inputs):
            return None
        ptr = 0
        for t in inputs:
            ptr |= t.data_ptr()
        parts.append((ptr & 15) == 0)
    return tuple(parts)


def _retype(old: torch.Tensor, dtype: torch.dtype, sizes: tuple[int, ...], strides: tuple[int, ...],
            offset: int) -> torch.Tensor:
    """A tensor of another dtype over ``old``'s storage (buffer reuse across dtypes)."""
    out = torch.empty(0, dtype=dtype, device=old.device)
    return out.set_(old.untyped_storage(), offset, sizes, strides)


def _alloc_offset(sizes: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    extent = offset + 1 + sum((s - 1) * st for s, st in zip(sizes, strides, strict=True) if s > 0)
    return torch.as_strided(torch.empty(extent, dtype=dtype, device=device), sizes, strides, offset)


def _cuda_device(index: int) -> torch.device:
    return torch.device("cuda", index)


def bound_op(op: Any) -> Any:
    """The callable an extern step calls for ``op``: an ``OpOverload``'s own C++ operator
    (``OpOverload.__call__`` is a Python frame that only forwards to it), else ``op``."""
    inner = getattr(op, "_op", None)
    return inner if callable(inner) else op


def _is_list(ret: torch._C.Argument) -> bool:
    """A schema return that is a list of tensors (``Tensor[]``, printed ``List[Tensor]``)."""
    return isinstance(ret.type, torch.ListType)


def _static_strides(buf: S.Buffer | None) -> tuple[int, ...] | None:
    """The planned strides of a buffer with integer sizes and strides, or None."""
    if buf is None or not all(isinstance(x, int) for x in (*buf.sizes, *buf.strides)):
        return None
    return tuple(buf.strides)


def fit_layout(t: Any, strides: tuple[int, ...]) -> Any:
    """``t`` in the layout the Program planned for it. An ATen kernel may return another
    layout than its meta kernel says (cuDNN's convolution backward gives a channels-last
    weight gradient for a channels-last gradient input); the kernels after it index the buffer
    with the planned strides, so it is copied. One tuple comparison when the layouts agree;
    dims of size 1 may have any stride. An output the kernel left undefined (``None``: cuDNN
    attention's log-sum-exp when none was asked for, whose meta kernel still returns an empty
    tensor) is passed on as it is."""
    if t is None:
        return t
    have = t.stride()
    if have == strides or all(a == b or n == 1 for a, b, n in zip(have, strides, t.shape, strict=True)):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _flatten(result: Any) -> list[Any]:
    from torchfuse.graph.ops import flatten_result

    return flatten_result(result)


HELPERS: dict[str, Any] = {
    "_empty_strided": torch.empty_strided, "_as_strided": torch.as_strided, "_ptr": torch.Tensor.data_ptr,
    "_cuda_device": _cuda_device, "_retype": _retype, "_alloc_offset": _alloc_offset,
    "_flatten": _flatten, "_fit": fit_layout, "_is_grad_enabled": torch.is_grad_enabled,
    "_no_grad": torch.no_grad,
}
"""The fixed objects a call function's globals may hold, by global name (what
`torchfuse.runtime.call_cache` makes them again from)."""
