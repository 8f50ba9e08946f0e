"""The launch plan: kernels and a schedule become a :class:`~torchfuse.graph.Program`
(buffers, allocations with reuse, launches, extern calls, views, frees), and the Program
becomes a standalone ``output_code.py``.

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

import msgspec
import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.ops import to_dtype
from torchfuse.inductor import ir
from torchfuse.inductor.codegen import format_expr
from torchfuse.inductor.scheduler import KERNEL_KINDS, GroupKind, Schedule


def _fmt(e: sympy.Expr) -> S.Expr:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else format_expr(e)


def _scalar(e: sympy.Expr) -> S.Argument:
    e = sympy.sympify(e)
    return S.Int(value=int(e)) if e.is_Integer else S.SymRef(expr=format_expr(e))


def _nbytes(spec: ir.BufferSpec) -> int | sympy.Expr | None:
    """The bytes a buffer spans: an int, or a sympy expression when sizes are symbols (two
    buffers can share storage when their expressions are equal: equal at every size)."""
    n = ir.product(spec.sizes)
    if n.is_Integer:
        extent = (
            1
            + sum(
                (int(s) - 1) * int(st)
                for s, st in zip(spec.sizes, spec.strides, strict=True)
                if sympy.sympify(st).is_Integer and int(s) > 0
            )
            if int(n)
            else 0
        )
        return extent * to_dtype(spec.dtype).itemsize
    if any(sympy.sympify(s).is_Integer and int(s) == 0 for s in spec.sizes):
        return 0
    # symbols are >= 2, so every symbolic dim is non-empty; size-1 dims add nothing
    extent = 1 + sum(((s - 1) * st for s, st in zip(spec.sizes, spec.strides, strict=True)), sympy.S.Zero)
    return sympy.expand(extent * to_dtype(spec.dtype).itemsize)


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


def build_program(prog: ir.LoopProgram, sched: Schedule, kernels: dict[int, S.Kernel]) -> S.Program:
    same = shared_kernels(kernels)
    by_name = {k.name: k for k in kernels.values()}
    launches: dict[str, int] = {}
    outputs = {o for o in prog.outputs if isinstance(o, str)}
    view_base = {b.name: b.view_of for b in prog.buffers.values() if b.kind == "view"}

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
    for k, g in enumerate(sched.groups):
        if g.kind in KERNEL_KINDS:
            kern = kernels[g.index]
            for name in sorted(g.stores, key=lambda n: [m.name for m in g.nodes].index(n)):
                spec = prog.buffers[name]
                used[name] = spec
                size = _nbytes(spec)
                reuse = next((b for s, b in free_pool if s == size), None) if size else None
                if reuse is not None:
                    free_pool.remove((size, reuse))
                steps.append(S.AllocStep(buffer=name, reuse=reuse))
            bufs = kern.meta["buffers"].split(",") if kern.meta.get("buffers") else []
            args: list[S.Argument] = [S.TensorRef(name=b) for b in bufs]
            args.append(_scalar(g.xnumel))
            if g.kind != GroupKind.POINTWISE:
                args.append(_scalar(g.rnumel))
            for p in kern.signature[len(args) :]:
                # INDEX32 is computed per call from the sizes (see codegen.index32_expr)
                args.append(S.SymRef(expr=kern.meta["index32"] if p.name == "INDEX32" else p.name))
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
            for k in (kernels[g.index] for g in sched.groups if g.index in kernels)
            if k.name not in same
        ),
        steps=tuple(steps),
        symbols=tuple(prog.symbols),
        device=prog.device.split(":")[0],
        opsets={"aten": 1, "torchfuse": 1},
        meta={"producer": "torchfuse-inductor", "fallbacks": prog.meta.get("fallbacks", "")},
    )


# ----------------------------------------------------------------------------- output_code.py


def _py_arg(a: S.Argument) -> str:
    if isinstance(a, S.TensorRef):
        return a.name
    if isinstance(a, S.SymRef):
        return f"({a.expr})"
    if isinstance(a, S.Int | S.Bool):
        return repr(a.value)
    if isinstance(a, S.Float):
        return repr(float(a.value)) if not isinstance(a.value, str) else f"float({a.value!r})"
    if isinstance(a, S.Str):
        return repr(a.value)
    if isinstance(a, S.NoneArg):
        return "None"
    if isinstance(a, S.ListArg):
        return "[" + ", ".join(_py_arg(x) for x in a.items) + "]"
    if isinstance(a, S.DtypeArg | S.LayoutArg | S.MemoryFormatArg):
        return f"torch.{a.name}"
    if isinstance(a, S.DeviceArg):
        return f"torch.device({a.name!r})"
    raise TypeError(f"cannot print argument {a!r}")


def _tuple(xs) -> str:
    items = [f"({x})" if isinstance(x, str) else str(x) for x in xs]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def output_code(program: S.Program) -> str:
    """A standalone module: every kernel, ``call(args)`` running the plan, and a ``__main__``
    that runs it on random inputs (first launch config of each kernel)."""
    lines = [
        f'"""Generated by torchfuse-inductor for graph {program.name!r}."""',
        "",
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
    ]
    helpers_done: set[str] = set()
    for k in program.kernels:
        chunk, skip = [], False
        for ln in k.source.splitlines():
            if ln.startswith(("import triton", "import torch")):
                continue
            if ln.startswith("def _"):
                skip = ln in helpers_done
                helpers_done.add(ln)
                if skip and chunk and chunk[-1] == "@triton.jit":
                    chunk.pop()
            elif ln.startswith(("def ", "@")):
                skip = False
            if not skip:
                chunk.append(ln)
        lines += chunk
    kernels = {k.name: k for k in program.kernels}
    bufs = {b.name: b for b in program.buffers}
    lines += ["", "", "def call(args):"]
    if program.inputs:
        lines.append(f"    {', '.join(program.inputs)}{',' if len(program.inputs) == 1 else ''} = args")
        lines.append(f"    device = {program.inputs[0]}.device")
    else:
        lines.append(f"    device = torch.device({'cuda' if program.device == 'cuda' else 'cpu'!r})")
    for sym in program.symbols:
        src = sym.source or ""
        if src.startswith("input:"):
            i, d = src[len("input:") :].split(".size(")
            lines.append(f"    {sym.name} = {program.inputs[int(i)]}.size({d.rstrip(')')})")
    for st in program.steps:
        if isinstance(st, S.AllocStep):
            b = bufs[st.buffer]
            note = f"  # may reuse {st.reuse}" if st.reuse else ""
            lines.append(
                f"    {b.name} = torch.empty_strided({_tuple(b.sizes)}, {_tuple(b.strides)}, "
                f"dtype=torch.{b.dtype}, device=device){note}"
            )
        elif isinstance(st, S.LaunchStep):
            k = kernels[st.kernel]
            cfg = k.configs[0]
            env = dict(cfg.meta)
            grid = []
            for g in st.grid or k.grid:
                text = str(g)
                for name, v in env.items():
                    text = text.replace(name, str(v))
                grid.append(text)
            kw = [f"{n}={v}" for n, v in {**k.constexprs, **cfg.meta}.items()]
            kw += [f"num_warps={cfg.num_warps}", f"num_stages={cfg.num_stages}"]
            lines.append(
                f"    {k.entry or k.name}[{_tuple(grid)}]({', '.join([_py_arg(a) for a in st.args] + kw)})"
            )
        elif isinstance(st, S.ExternStep):
            args = [_py_arg(a) for a in st.args] + [f"{n}={_py_arg(v)}" for n, v in st.kwargs.items()]
            ns, name, overload = st.op.split(".")
            outs = [o or "_" for o in st.outputs]
            target = outs[0] if len(outs) == 1 else ", ".join(outs)
            lines.append(f"    {target} = torch.ops.{ns}.{name}.{overload}({', '.join(args)})")
        elif isinstance(st, S.ViewStep):
            lines.append(
                f"    {st.output} = {st.base}.as_strided({_tuple(st.sizes)}, {_tuple(st.strides)}, "
                f"({st.storage_offset}))"
            )
        elif isinstance(st, S.FreeStep):
            lines.append(f"    del {st.buffer}")
        elif isinstance(st, S.CopyStep):
            lines.append(f"    {st.dst}.copy_({st.src})")
    lines.append(f"    return [{', '.join(_py_arg(o) for o in program.outputs)}]")
    lines += [
        "",
        "",
        'if __name__ == "__main__":',
        '    dev = "cuda" if torch.cuda.is_available() else "cpu"',
        "    inputs = []",
    ]
    env = {s.name: s.hint or 8 for s in program.symbols}
    for name in program.inputs:
        b = bufs[name]
        sizes = [s if isinstance(s, int) else env.get(s, 8) for s in b.sizes]
        if b.dtype in ("float32", "float64", "float16", "bfloat16"):
            lines.append(f"    inputs.append(torch.randn({sizes}, dtype=torch.{b.dtype}, device=dev))")
        elif b.dtype == "bool":
            lines.append(f"    inputs.append(torch.rand({sizes}, device=dev) > 0.5)")
        else:
            lines.append(
                f"    inputs.append(torch.randint(0, 2, {sizes}, dtype=torch.{b.dtype}, device=dev))"
            )
    lines += [
        "    for out in call(inputs):",
        "        print(getattr(out, 'shape', out), getattr(out, 'dtype', ''))",
        "",
    ]
    return "\n".join(lines)
