"""The launch plan: kernels and a schedule become a [`Program`][torchfuse.graph.Program]
(buffers, allocations with reuse, launches, extern calls, views, frees). Its printed form,
``output_code.py``, is the runtime's (`torchfuse.runtime.standalone`).

Buffer lifetimes: a buffer is allocated right before the step that writes it and freed
right after its last reader (views keep their base alive). A new allocation takes over the
storage of a freed buffer with the same byte size when there is one
(``AllocStep(reuse=...)``), so peak memory follows the schedule's order.

Kernels with the same code are one kernel: the groups of a model's repeated layers generate
the same Triton function under different names (GPT-2's 39 forward kernels are 15 distinct
ones), and Triton compiles and caches by source, so each name would be a compile of its own on
a cold start. Every launch of such a group names the first of them, with its own grid when
that differs (static grids name the launch's size); the Program keeps that one (its ``meta``
describes its first launch, plus ``launches``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.compat import opsets_for
from torchfuse.graph.layouts import storage_extent
from torchfuse.graph.ops import to_dtype
from torchfuse.inductor import ir
from torchfuse.inductor.codegen import format_expr
from torchfuse.inductor.kernel_groups import KERNEL_KINDS, GroupKind, KernelGroup, Schedule


def _fmt(e: sympy.Expr) -> S.Expr:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else format_expr(e)


def _scalar(e: sympy.Expr) -> S.Argument:
    e = sympy.sympify(e)
    return S.Int(value=int(e)) if e.is_Integer else S.SymRef(expr=format_expr(e))


def _nbytes(spec: ir.BufferSpec) -> int | sympy.Expr | None:
    """The bytes a buffer spans: an int, or a sympy expression when sizes are symbols (two
    buffers can share storage when their expressions are equal: equal at every size)."""
    nbytes = sympy.sympify(storage_extent(spec.sizes, spec.strides)) * to_dtype(spec.dtype).itemsize
    return int(nbytes) if nbytes.is_Integer else sympy.expand(nbytes)


def _code_key(kernel: S.Kernel) -> bytes:
    """What makes two generated kernels the same compiled code: everything but the name and
    the grid (a launch of a shared kernel carries its own grid when it differs)."""
    entry = kernel.entry or kernel.name
    body = re.sub(rf"\b{re.escape(entry)}\b", "<kernel>", kernel.source)
    return msgspec.json.encode((body, kernel.language, kernel.signature, kernel.constexprs,
                                kernel.configs))


def shared_kernels(kernels: dict[int, S.Kernel]) -> dict[str, str]:
    """Kernel name -> the name of the first kernel with the same code, for every repeat."""
    first: dict[bytes, str] = {}
    same: dict[str, str] = {}
    for index in sorted(kernels):
        kernel = kernels[index]
        name = first.setdefault(_code_key(kernel), kernel.name)
        if name != kernel.name:
            same[kernel.name] = name
    return same


def extern_aliases(node: ir.Extern) -> dict[str, str]:
    """Outputs of an extern call that are views of one of its arguments (its schema says
    ``Tensor(a) self -> Tensor(a)``: ``as_strided``, ``expand``, … called through ATen), each
    with that argument: they share its storage, so it must outlive them."""
    from torchfuse.graph.ops import UnknownOpError, resolve_op

    try:
        schema = resolve_op(node.op)._schema
    except UnknownOpError:
        return {}
    by_set: dict[str, str] = {}
    for arg, value in zip(schema.arguments, node.args, strict=False):
        info = arg.alias_info
        if info is not None and not info.is_write and isinstance(value, S.TensorRef):
            for a in info.before_set:
                by_set[a] = value.name
    out: dict[str, str] = {}
    for ret, name in zip(schema.returns, node.outputs, strict=False):
        info = ret.alias_info
        if name and info is not None and not info.is_write:
            base = next((by_set[a] for a in info.before_set if a in by_set), None)
            if base is not None:
                out[name] = base
    return out


def _launch_args(g: KernelGroup, kern: S.Kernel) -> list[S.Argument]:
    """The arguments of ``kern``'s launch for group ``g``: its buffers, sizes and symbols."""
    bufs = kern.meta["buffers"].split(",") if kern.meta.get("buffers") else []
    args: list[S.Argument] = [S.TensorRef(name=b) for b in bufs]
    args.append(_scalar(g.xnumel))
    if g.kind != GroupKind.POINTWISE:
        args.append(_scalar(g.rnumel))
    for p in kern.signature[len(args) :]:
        # INDEX32 is computed per call from the sizes (see codegen.index32_expr)
        args.append(S.SymRef(expr=kern.meta["index32"] if p.name == "INDEX32" else p.name))
    return args


def build_program(prog: ir.LoopProgram, sched: Schedule, kernels: dict[int, S.Kernel],
                  combos: Mapping[tuple[int, ...], S.Kernel] | None = None) -> S.Program:
    """The Program of ``sched``: ``kernels`` by group index, and ``combos`` (combo kernels,
    `torchfuse.inductor.combo`, by the group indices each runs): a combo launches where its
    first member would, after every member's allocations, with the members' arguments in
    order; a buffer its members read last is freed after it."""
    combos = dict(combos or {})
    combo_at = {c[0]: c for c in combos}
    in_combo = {i for c in combos for i in c}
    launched = {i: k for i, k in kernels.items() if i not in in_combo}
    launched |= {c[0]: k for c, k in combos.items()}
    group_of = {g.index: g for g in sched.groups}
    same = shared_kernels(launched)
    by_name = {k.name: k for k in launched.values()}
    launches: dict[str, int] = {}
    outputs = {o for o in prog.outputs if isinstance(o, str)}
    view_base = {b.name: b.view_of for b in prog.buffers.values() if b.kind == "view"}
    for g in sched.groups:  # an extern view (as_strided through ATen) keeps its base alive
        if g.kind == GroupKind.EXTERN and isinstance(g.nodes[0], ir.Extern):
            view_base.update(extern_aliases(g.nodes[0]))

    def root(buf: str) -> str:
        while buf in view_base:
            buf = view_base[buf]
        return buf

    # the step index of each buffer's last reader (a view's reads count for its base)
    last_use: dict[str, int] = {}
    for k, g in enumerate(sched.groups):
        for node in g.nodes:
            for b in ir.reads(node):
                last_use[root(b)] = k
                last_use[b] = k
    keep = {root(o) for o in outputs} | set(prog.inputs)

    steps: list[S.Step] = []
    used: dict[str, ir.BufferSpec] = {name: prog.buffers[name] for name in prog.inputs}
    free_pool: list[tuple[int, str]] = []

    def allocate(g: KernelGroup) -> None:
        for name in sorted(g.stores, key=lambda n: [m.name for m in g.nodes].index(n)):
            spec = prog.buffers[name]
            used[name] = spec
            size = _nbytes(spec)
            reuse = next((b for s, b in free_pool if s == size), None) if size else None
            if reuse is not None:
                free_pool.remove((size, reuse))
            steps.append(S.AllocStep(buffer=name, reuse=reuse))

    for k, g in enumerate(sched.groups):
        if g.kind in KERNEL_KINDS:
            if g.index in in_combo and g.index not in combo_at:
                pass  # launched with its combo, at the combo's first member
            else:
                args: list[S.Argument] = []
                for i in combo_at.get(g.index, (g.index,)):
                    allocate(group_of[i])
                    args += _launch_args(group_of[i], kernels[i])
                kern = launched[g.index]
                name = same.get(kern.name, kern.name)
                launches[name] = launches.get(name, 0) + 1
                grid = kern.grid if kern.grid != by_name[name].grid else ()
                steps.append(S.LaunchStep(kernel=name, args=tuple(args), grid=tuple(grid)))
        elif g.kind == GroupKind.EXTERN:
            node = g.nodes[0]
            assert isinstance(node, ir.Extern)
            for o in node.outputs:
                if o:
                    used[o] = prog.buffers[o]
            steps.append(
                S.ExternStep(
                    op=node.op, args=tuple(node.args), kwargs=dict(node.kwargs), outputs=tuple(node.outputs)
                )
            )
        else:
            node = g.nodes[0]
            spec = prog.buffers[node.name]
            used[node.name] = spec
            base = used[spec.view_of]
            steps.append(
                S.ViewStep(
                    output=node.name,
                    base=spec.view_of,
                    sizes=tuple(_fmt(s) for s in spec.sizes),
                    strides=tuple(_fmt(s) for s in spec.strides),
                    storage_offset=_fmt(spec.offset - base.offset if base.kind == "view" else spec.offset),
                )
            )
        for b in sorted(b for b, last in last_use.items() if last == k):
            if b in keep or b not in used or b in view_base or root(b) in keep:
                continue
            steps.append(S.FreeStep(buffer=b))
            size = _nbytes(used[b])
            if size and used[b].kind == "computed":
                free_pool.append((size, b))
    buffers = tuple(
        S.Buffer(
            name=spec.name,
            dtype=spec.dtype,
            sizes=tuple(_fmt(s) for s in spec.sizes),
            strides=tuple(_fmt(s) for s in spec.strides),
            device=spec.device or prog.device,
            storage_offset=_fmt(spec.offset),
        )
        for spec in used.values()
    )
    outs = tuple(S.TensorRef(name=o) if isinstance(o, str) else o for o in prog.outputs)
    return S.Program(
        name=prog.name,
        inputs=prog.inputs,
        outputs=outs,
        buffers=buffers,
        kernels=tuple(
            msgspec.structs.replace(k, meta={**k.meta, "launches": str(launches.get(k.name, 0))})
            for k in (launched[g.index] for g in sched.groups if g.index in launched)
            if k.name not in same
        ),
        steps=tuple(steps),
        symbols=tuple(prog.symbols),
        device=prog.device.split(":")[0],
        opsets=opsets_for((s.op for s in steps if isinstance(s, S.ExternStep)), {"aten": 1, "torchfuse": 1}),
        meta={"producer": "torchfuse-inductor", "fallbacks": prog.meta.get("fallbacks", "")},
    )
