"""Lowering: a (decomposed) Graph becomes a [`LoopProgram`][torchfuse.inductor.ir.LoopProgram].

Each graph value is held as a `TensorValue`: its sizes, dtype and a *loader*, a
function from an index (one sympy expression per dimension) to an IR value. Pointwise ops
compose loaders, views remap indices, so neither computes or copies anything. A value
becomes a buffer (is *realized*) only when it must: it is a graph output, a reduction or
extern result, an extern argument, or an expensive value read more than once.

Example: ``y = (x + 1).t()`` is one loader ``idx -> add(load(x, 8*idx[1] + idx[0]), 1.0)``;
only if ``y`` is an output does it become ``Pointwise(buf0, ranges=[8, 4], …)``.

The engine owns the one rule registry, `RULES`; the rule modules
([`lowerings`][torchfuse.inductor.lowerings], [`lowerings_index`][torchfuse.inductor.lowerings_index],
[`user_kernels`][torchfuse.inductor.user_kernels]) import the engine and `register` into it, and
the engine never imports them (the package imports them once, through ``compile``). Anything
without a rule becomes an [`Extern`][torchfuse.inductor.ir.Extern] call of the ATen op.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.ops import node_inputs, tensor_refs
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.sizes import size_info

Loader = Callable[[Sequence[sympy.Expr]], ir.Value]
Rule = Callable[["Lowering", S.Node], Any]
"""A lowering rule: the node's value(s) as `TensorValue` (or raises `Fallback`)."""

RULES: dict[str, Rule] = {}
"""Every lowering rule, by (functional) op name; filled by `register`."""

EXTERN_BY_DESIGN = frozenset({
    "aten.mm.default", "aten.bmm.default", "aten.baddbmm.default", "aten.mv.default",
    "aten.dot.default", "aten.convolution.default",
})
"""Ops that are extern calls on purpose (matmuls): not reported as fallbacks."""


def register(*names: str) -> Callable[[Rule], Rule]:
    """Register a rule for the op ``names``; an op registered twice is a bug (asserted)."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            assert n not in RULES, f"lowering rule for {n} registered twice ({RULES[n].__module__})"
            RULES[n] = fn
        return fn

    return deco


class LoweringError(RuntimeError):
    """A node the lowering cannot handle (and cannot fall back to an extern call for)."""


class Fallback(Exception):
    """Raised by a lowering rule to say: call this op through ATen instead."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A strided view of a buffer: element ``idx`` lives at ``offset + sum(idx*strides)``."""

    buffer: str
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr


@dataclass(frozen=True, slots=True)
class TensorValue:
    sizes: tuple[sympy.Expr, ...]
    dtype: str
    loader: Loader
    layout: Layout | None = None
    origins: tuple[str, ...] = ()
    ops: int = 0
    """How many computations the loader inlines (decides when to realize)."""


def expr_of(e: S.Expr) -> sympy.Expr:
    """A size expression of the format as a sympy index expression: ``//`` and ``%`` become
    `FloorDiv` and `ModIdx`
    (sizes are non-negative), so they print and simplify like every other index."""
    if isinstance(e, int):
        return sympy.Integer(e)
    return _expr_cached(e)


@functools.lru_cache(maxsize=4096)
def _expr_cached(text: str) -> sympy.Expr:
    from torchfuse.graph import expr as E

    def conv(a: E.Ast) -> sympy.Expr:
        if isinstance(a, E.Num):
            return sympy.Integer(a.value)
        if isinstance(a, E.Name):
            return ir.size_symbol(a.name)
        if isinstance(a, E.Call):
            args = [conv(x) for x in a.args]
            return sympy.Max(*args) if a.fn == "max" else sympy.Min(*args)
        lhs, rhs = conv(a.lhs), conv(a.rhs)
        if a.op == "+":
            return lhs + rhs
        if a.op == "-":
            return lhs - rhs
        if a.op == "*":
            return lhs * rhs
        if a.op == "//":
            return ir.FloorDiv(lhs, rhs)
        if a.op == "%":
            return ir.ModIdx(lhs, rhs)
        raise LoweringError(f"size expression {text!r}: {a.op!r} is not a size operation")

    return conv(E.parse(text))


def strided_loader(layout: Layout, dtype: str) -> Loader:
    def load(idx: Sequence[sympy.Expr]) -> ir.Value:
        return ir.Load(layout.buffer, strided_index(layout.offset, tuple(idx), tuple(layout.strides)), dtype)

    return load


@functools.lru_cache(maxsize=1 << 16)
def strided_index(offset: sympy.Expr, idx: tuple, strides: tuple) -> sympy.Expr:
    """``offset + sum(i * s)``, expanded; remembered, since a model's layers load buffers of
    the same layouts at the same loop variables (Swin-T training: 3.4k loads, a third of
    lowering's time in ``sympy.expand``)."""
    index = offset + sum((i * s for i, s in zip(idx, strides, strict=True)), sympy.Integer(0))
    return sympy.expand(index)


def memory_order(sizes: Sequence[sympy.Expr], strides: Sequence[sympy.Expr],
                 hint: Callable[[sympy.Expr], int] | None = None) -> list[int]:
    """The dims of a buffer from the largest stride to the smallest: a node that writes a
    transposed result (``h.t()`` handed to a matmul) loops in the order of its memory, so
    its store, and the loads of inputs laid out like it, stay coalesced. Symbolic strides
    are ordered by their ``hint`` (a loop order is a performance choice, right in any order);
    logical order when a stride is symbolic and there is no ``hint``."""
    nd = len(sizes)
    if not all(sympy.sympify(s).is_Integer for s in strides):
        if hint is None:
            return list(range(nd))
        strides = [sympy.Integer(hint(s)) for s in strides]
    # size-1 dims keep their place relative to the rest (their stride means nothing)
    keyed = [(int(strides[d]) if sizes[d] != 1 else None, d) for d in range(nd)]
    real = sorted((k for k in keyed if k[0] is not None), key=lambda k: -k[0])
    it = iter(real)
    return [next(it)[1] if k[0] is not None else k[1] for k in keyed]


def cast(v: ir.Value, dtype: str) -> ir.Value:
    if _dtype_of(v) == dtype:
        return v
    if isinstance(v, ir.Const):
        return ir.Const(_py_value(v.value, dtype), dtype)
    return ir.Cast(v, dtype)


def _py_value(value, dtype: str):
    if dtype == "bool":
        return bool(value)
    if dtype in ir.FLOAT_DTYPES:
        return float(value)
    return int(value)


def _dtype_of(v: ir.Value) -> str:
    return v.dtype


class Lowering:
    """Walks the graph once; `run` returns the LoopProgram."""

    def __init__(self, graph: S.Graph, config: InductorConfig) -> None:
        self.graph = graph
        self.config = config
        self.sizes = size_info(tuple(graph.symbols))
        self.env: dict[str, object] = {}
        self.buffers: dict[str, ir.BufferSpec] = {}
        self.nodes: list[ir.Node] = []
        self.fallbacks: list[str] = []
        self._views: dict[tuple, str] = {}
        self._realized: dict[tuple, tuple[TensorValue, TensorValue]] = {}
        self._count = 0
        self._indirect = 0
        self.uses = Counter(n for node in graph.nodes for n in node_inputs(node))
        self.uses.update(tensor_refs([o.value for o in graph.outputs]))
        self.output_names = set(tensor_refs([o.value for o in graph.outputs]))
        self.producer = {o: node for node in graph.nodes for o in node.outputs if o}
        self.device = next((graph.values[i.name].device for i in graph.inputs), None) or next(
            (m.device for m in graph.values.values()), "cpu"
        )
        self.on_gpu = any(not m.device.startswith("cpu") for m in graph.values.values())
        """Whether the graph computes on a GPU: its CPU tensors are then ATen's business."""

    # -- names
    def fresh(self, prefix: str = "buf") -> str:
        name = f"{prefix}{self._count}"
        self._count += 1
        return name

    def indirect_symbol(self) -> sympy.Symbol:
        self._indirect += 1
        return sympy.Symbol(f"ind{self._indirect - 1}", integer=True)

    def meta(self, value_name: str) -> S.TensorMeta:
        return self.graph.values[value_name]

    # -- realization
    def add_buffer(self, spec: ir.BufferSpec) -> None:
        self.buffers[spec.name] = spec

    def realize(self, tv: TensorValue, meta: S.TensorMeta | None = None) -> TensorValue:
        """Make ``tv`` a buffer (strides from ``meta`` when given, else contiguous)."""
        if tv.layout is not None:
            return tv
        strides = [expr_of(s) for s in meta.strides] if meta is not None else ir.contiguous_strides(tv.sizes)
        # a value passed to several externs (``x @ w`` and ``w.t()`` of the same product) is
        # one buffer, not one copy per use
        key = (id(tv), tuple(strides))
        hit = self._realized.get(key)
        if hit is not None and hit[0] is tv:
            return hit[1]
        name = self.fresh()
        order = memory_order(tv.sizes, strides, self.sizes.hint)
        ys = [ir.loop_var("x", i) for i in range(len(tv.sizes))]
        xs: list[sympy.Expr] = [sympy.Integer(0)] * len(tv.sizes)
        for y, d in zip(ys, order, strict=True):
            xs[d] = y
        body = cast(tv.loader(xs), tv.dtype)
        store = sympy.expand(sum((x * s for x, s in zip(xs, strides, strict=True)), sympy.Integer(0)))
        self.add_buffer(ir.BufferSpec(name, tv.dtype, tv.sizes, tuple(strides)))
        ranges = tuple(tv.sizes[d] for d in order)
        self.nodes.append(ir.Pointwise(name, ranges, body, tv.dtype, store, tv.origins))
        layout = Layout(name, tuple(strides), sympy.Integer(0))
        out = TensorValue(tv.sizes, tv.dtype, strided_loader(layout, tv.dtype), layout)
        self._realized[key] = (tv, out)
        return out

    def as_buffer(self, tv: TensorValue, meta: S.TensorMeta | None = None) -> str:
        """A buffer name holding exactly ``tv`` (a named view when it is a strided view)."""
        tv = self.realize(tv, meta)
        lay = tv.layout
        assert lay is not None
        base = self.buffers[lay.buffer]
        if (
            tuple(tv.sizes) == tuple(base.sizes)
            and tuple(lay.strides) == tuple(base.strides)
            and lay.offset == 0
        ):
            return lay.buffer
        key = (lay.buffer, tuple(tv.sizes), tuple(lay.strides), lay.offset)
        if key in self._views:
            return self._views[key]
        name = self.fresh("view")
        self._views[key] = name
        self.add_buffer(
            ir.BufferSpec(
                name,
                tv.dtype,
                tv.sizes,
                lay.strides,
                base.offset + lay.offset,
                kind="view",
                view_of=lay.buffer,
            )
        )
        self.nodes.append(ir.View(name, lay.buffer))
        return name

    def maybe_realize(self, value_name: str, tv: TensorValue) -> TensorValue:
        if tv.layout is not None:
            return tv
        if value_name in self.output_names:
            # an output is a buffer anyway: made now, views of it (``reshape`` handed to a
            # bmm) are views of that buffer instead of second copies of the same values
            return self.realize(tv, self.meta(value_name))
        if tv.ops == 0:
            return tv
        # cheap values read twice are recomputed by each reader: that costs a few flops, a
        # buffer costs a write and a read of the whole tensor
        if tv.ops > self.config.max_inline_ops:
            return self.realize(tv, self.meta(value_name))
        if self.uses[value_name] > 1 and tv.ops > self.config.max_recompute_ops:
            if not self._narrow_inputs(tv):
                return self.realize(tv, self.meta(value_name))
        return tv

    def _narrow_inputs(self, tv: TensorValue) -> bool:
        """True when recomputing ``tv`` reads no more bytes per element than a buffer of it
        would (the normalized ``x`` of a layer_norm backward: bf16 ``x`` and per-row stats,
        against a float32 buffer written once and read twice), so each reader recomputes it."""
        from torchfuse.graph.ops import to_dtype

        numel = ir.product(tv.sizes)
        xs = [ir.loop_var("x", i) for i in range(len(tv.sizes))]
        full = 0
        for b in {ld.buffer for ld in ir.loads_of(tv.loader(xs))}:
            spec = self.buffers[b]
            if sympy.expand(ir.product(spec.sizes) - numel) == 0:
                full += to_dtype(spec.dtype).itemsize
        return full <= to_dtype(tv.dtype).itemsize

    # -- reductions
    def reduction(
        self,
        x: TensorValue,
        dims: Sequence[int],
        keepdim: bool,
        rop: ir.ReduceOp,
        out_dtype: str,
        origin: str,
        body: Callable[[ir.Value], ir.Value] | None = None,
    ) -> TensorValue:
        nd = len(x.sizes)
        dims = sorted({d % nd for d in dims}) if nd else []
        kept = [d for d in range(nd) if d not in dims]
        ranges = tuple(x.sizes[d] for d in kept)
        rranges = tuple(x.sizes[d] for d in dims)
        if rop in ir.INDEX_REDUCTIONS:
            acc = ir.compute_dtype(x.dtype)
        elif rop in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
            acc = "bool"
        elif rop in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):
            acc = ir.compute_dtype(x.dtype)
        else:
            acc = ir.compute_dtype(out_dtype)

        def value_at(xs: Sequence[sympy.Expr], rs: Sequence[sympy.Expr]) -> ir.Value:
            idx: list[sympy.Expr] = [sympy.Integer(0)] * nd
            for d, v in zip(kept, xs, strict=True):
                idx[d] = v
            for d, v in zip(dims, rs, strict=True):
                idx[d] = v
            v = x.loader(idx)
            v = body(v) if body else v
            if acc == "bool":
                return (
                    ir.Call(ir.VOp.NE, (v, ir.Const(0, _dtype_of(v))), "bool")
                    if _dtype_of(v) != "bool"
                    else v
                )
            return cast(v, acc)

        origins = (*x.origins, origin)
        rnumel = ir.product(rranges)
        xs = [ir.loop_var("x", i) for i in range(len(ranges))]
        if rnumel == 1:  # nothing to reduce: a pointwise cast

            def load_one(idx):
                return (
                    cast(value_at(idx, [sympy.Integer(0)] * len(rranges)), out_dtype)
                    if rop not in ir.INDEX_REDUCTIONS
                    else ir.Const(0, "int64")
                )

            res = TensorValue(ranges, out_dtype, load_one, None, origins, x.ops + 1)
            return self._keep_dims(self.realize(res), nd, dims, keepdim)
        name = self.fresh()
        split, split_exact = self._split_factor(ranges, rranges, rop)
        lead, lead_exact = self._outer_split_factor(ranges, rranges, rop, bool(kept))
        if lead and max(dims) > min(kept) and not _leading_in_memory(value_at, ranges, rranges):
            lead, lead_exact = 0, False  # leading neither in the sizes nor in memory
        if lead:
            # a reduction over leading dims with few columns (a weight gradient: 16384 rows
            # of 4096) walks each column tile with one program; split the rows into ``lead``
            # chunks (stage 1: partials[lead, cols], one program per column tile and chunk),
            # then add the partials (stage 2, tiny)
            chunk = _chunk(rnumel, lead, lead_exact)
            part = self.fresh()
            s = ir.loop_var("x", 0)
            ys = [ir.loop_var("x", i + 1) for i in range(len(ranges))]
            r = ir.loop_var("r", 0)
            body1 = _chunk_value(value_at, ys, s, chunk, rranges, rop, acc, lead_exact)
            pranges = (sympy.Integer(lead), *ranges)
            pstrides = ir.contiguous_strides(pranges)
            pstore = sympy.expand(
                sum((v * st for v, st in zip([s, *ys], pstrides, strict=True)), sympy.Integer(0))
            )
            self.add_buffer(ir.BufferSpec(part, acc, pranges, tuple(pstrides)))
            self.nodes.append(
                ir.Reduction(part, pranges, (chunk,), body1, rop, acc, pstore, origins)
            )
            cstrides = ir.contiguous_strides(ranges)
            xflat = sympy.expand(sum((v * st for v, st in zip(xs, cstrides, strict=True)), sympy.Integer(0)))
            body = ir.Load(part, sympy.expand(r * ir.product(ranges) + xflat), acc)
            rranges2: tuple[sympy.Expr, ...] = (sympy.Integer(lead),)
        elif split:
            chunk = _chunk(rnumel, split, split_exact)
            part = self.fresh()
            s = ir.loop_var("x", len(ranges))
            r = ir.loop_var("r", 0)
            body1 = _chunk_value(value_at, xs, s, chunk, rranges, rop, acc, split_exact)
            pranges = (*ranges, sympy.Integer(split))
            pstore = sympy.expand(
                sum(
                    (v * st for v, st in zip([*xs, s], ir.contiguous_strides(pranges), strict=True)),
                    sympy.Integer(0),
                )
            )
            self.add_buffer(ir.BufferSpec(part, acc, pranges, tuple(ir.contiguous_strides(pranges))))
            self.nodes.append(
                ir.Reduction(part, pranges, (chunk,), body1, rop, acc, pstore, origins)
            )
            xflat = sympy.expand(
                sum(
                    (v * st for v, st in zip(xs, ir.contiguous_strides(ranges), strict=True)),
                    sympy.Integer(0),
                )
            )
            body2 = ir.Load(part, sympy.expand(xflat * split + r), acc)
            rranges2 = (sympy.Integer(split),)
            body = body2
        else:
            rs = [ir.loop_var("r", i) for i in range(len(rranges))]
            body = value_at(xs, rs)
            rranges2 = rranges
        strides = ir.contiguous_strides(ranges)
        store = sympy.expand(sum((v * st for v, st in zip(xs, strides, strict=True)), sympy.Integer(0)))
        self.add_buffer(ir.BufferSpec(name, out_dtype, ranges, tuple(strides)))
        self.nodes.append(ir.Reduction(name, ranges, rranges2, body, rop, out_dtype, store, origins))
        layout = Layout(name, tuple(strides), sympy.Integer(0))
        res = TensorValue(ranges, out_dtype, strided_loader(layout, out_dtype), layout)
        return self._keep_dims(res, nd, dims, keepdim)

    def _split_factor(self, ranges, rranges, rop) -> tuple[int, bool]:
        """``(k, exact)``: cut each row into ``k`` chunks (0: no split); ``exact`` when ``k``
        divides the row length for every size (else the chunks are ``ceil(n/k)`` long and the
        tail is masked). Decided from hints: it is a performance choice (see `.sizes`)."""
        xnumel, rnumel = ir.product(ranges), ir.product(rranges)
        if rop not in ir.SPLITTABLE:
            return 0, False
        symbolic = not (xnumel.is_Integer and rnumel.is_Integer)
        x, n = self.sizes.hint(xnumel), self.sizes.hint(rnumel)
        if x > self.config.split_max_outputs or n < self.config.split_min_rnumel:
            return 0, False
        target = self.config.split_target
        cands = sorted(range(16, 4 * target + 1), key=lambda c: (abs(c - target), c))
        exact = next((c for c in cands if ir.exact_div(rnumel, sympy.Integer(c)) is not None), 0)
        if exact or not symbolic:
            return exact, True
        return target, False

    def _outer_split_factor(self, ranges, rranges, rop, leading: bool) -> tuple[int, bool]:
        """How many row chunks a reduction over leading dims is split into (0: none), and
        whether they divide the rows exactly (see `_split_factor`). ``leading``: whether it may
        be one at all; the caller checks that the dims lead, in the sizes or in memory, only
        when a split would be taken (the memory check walks the loader)."""
        xnumel, rnumel = ir.product(ranges), ir.product(rranges)
        if rop not in ir.SPLITTABLE or not leading:
            return 0, False
        symbolic = not (xnumel.is_Integer and rnumel.is_Integer)
        x, n = self.sizes.hint(xnumel), self.sizes.hint(rnumel)
        tiles = max(1, x // 64)  # column tiles of the outer kernel (XBLOCK 64)
        want = -(-self.config.outer_split_programs // tiles)
        most = n // self.config.outer_split_min_chunk
        # As many chunks as the program target asks for, but no shorter than the minimum
        # chunk: a wide gradient ([4096, 768] in BERT) wants 86 chunks and may have 16. Asking
        # for at least ``want`` chunks left such rows unsplit, 12 programs on 132 SMs
        # (36 us per bias gradient on the H200, run 2046).
        top = min(want, most)
        if top < 2:
            return 0, False
        for cand in range(top, 1, -1):  # the most chunks that divide the rows exactly
            if ir.exact_div(rnumel, sympy.Integer(cand)) is not None:
                return cand, True
        if not symbolic:
            return 0, False
        return top, False

    def _keep_dims(self, tv: TensorValue, nd: int, dims: Sequence[int], keepdim: bool) -> TensorValue:
        if not keepdim or not dims:
            return tv
        kept = [d for d in range(nd) if d not in dims]
        sizes = tuple(sympy.Integer(1) if d in dims else tv.sizes[kept.index(d)] for d in range(nd))
        inner = tv.loader

        def load(idx):
            return inner([idx[d] for d in kept])

        layout = None
        if tv.layout is not None:
            strides = list(tv.layout.strides)
            full = [sympy.Integer(0) if d in dims else strides[kept.index(d)] for d in range(nd)]
            layout = Layout(tv.layout.buffer, tuple(full), tv.layout.offset)
        return TensorValue(sizes, tv.dtype, load, layout, tv.origins)

    # -- extern calls
    def through_view(self, name: str) -> TensorValue | None:
        """``name`` (a lazy view) as a view of its realized source, when that source has other
        readers: the extern then reads the one buffer every reader shares, written in the
        source's own layout, instead of a second copy laid out like the view. GPT-2's padded
        dlogits, read as it is by ``dlogits @ w`` and transposed by ``dlogits.t() @ h``, was
        written twice by one kernel. Only views that keep every element (transposes,
        permutes, reshapes) qualify: realizing a whole source for a slice of it writes more."""
        node = self.producer.get(name)
        if node is None or node.op not in _REALIZE_THROUGH or not isinstance(node.args[0], S.TensorRef):
            return None
        src = node.args[0].name
        src_tv = self.env.get(src)
        if not isinstance(src_tv, TensorValue) or self.uses[src] < 2:
            return None
        if src_tv.layout is None:
            src_tv = self.through_view(src) or src_tv
        if src_tv.layout is None:
            self.env[src] = src_tv = self.realize(src_tv, self.meta(src))
        tv = RULES[_functional_name(node.op)](self, node)  # the view again, over the buffer
        if not isinstance(tv, TensorValue) or tv.layout is None:
            return None
        self.env[name] = tv
        return tv

    def extern(self, node: S.Node, reason: str = "") -> None:
        def enc(a: S.Argument) -> S.Argument:
            if isinstance(a, S.TensorRef):
                tv = self.env[a.name]
                assert isinstance(tv, TensorValue)
                if tv.layout is None:
                    tv = self.through_view(a.name) or tv
                return S.TensorRef(name=self.as_buffer(tv, self.meta(a.name)))
            if isinstance(a, S.ListArg):
                return S.ListArg(items=tuple(enc(x) for x in a.items))
            return a

        args = tuple(enc(a) for a in node.args)
        kwargs = tuple((k, enc(v)) for k, v in node.kwargs.items())
        outs = []
        for o in node.outputs:
            if not o:
                outs.append("")
                continue
            m = self.meta(o)
            name = self.fresh()
            sizes = tuple(expr_of(s) for s in m.sizes)
            strides = tuple(expr_of(s) for s in m.strides)
            self.add_buffer(
                ir.BufferSpec(name, m.dtype, sizes, strides, expr_of(m.storage_offset), kind="extern",
                              device=self._cpu_of(m))
            )
            layout = Layout(name, strides, sympy.Integer(0))
            self.env[o] = TensorValue(sizes, m.dtype, strided_loader(layout, m.dtype), layout)
            outs.append(name)
        self.nodes.append(
            ir.Extern(
                outs[0] if outs and outs[0] else self.fresh("extern"),
                _extern_op(node.op),
                args,
                kwargs,
                tuple(outs),
                (_short(node.op),),
            )
        )
        if reason:
            self.fallbacks.append(f"{node.name}: {node.op} ({reason})")

    def _cpu_of(self, m: S.TensorMeta) -> str | None:
        """``"cpu"`` for a CPU tensor of a GPU graph (its buffer stays on the CPU)."""
        return "cpu" if self.on_gpu and m.device.startswith("cpu") else None

    def _touches_cpu(self, node: S.Node) -> bool:
        names = [o for o in node.outputs if o] + tensor_refs([*node.args, *node.kwargs.values()])
        return any(self.meta(n).device.startswith("cpu") for n in names)

    # -- driver
    def run(self) -> ir.LoopProgram:
        g = self.graph
        for inp in g.inputs:
            m = g.values[inp.name]
            sizes = tuple(expr_of(s) for s in m.sizes)
            strides = tuple(expr_of(s) for s in m.strides)
            self.add_buffer(
                ir.BufferSpec(inp.name, m.dtype, sizes, strides, expr_of(m.storage_offset), "input",
                              device=self._cpu_of(m))
            )
            layout = Layout(inp.name, strides, sympy.Integer(0))
            self.env[inp.name] = TensorValue(sizes, m.dtype, strided_loader(layout, m.dtype), layout)
        rules = RULES
        for node in g.nodes:
            op = _functional_name(node.op)
            rule = rules.get(op)
            if self.on_gpu and self._touches_cpu(node):
                # a CPU tensor in a GPU graph (``torch.rand([])`` for a layer-drop test): ATen
                # computes it, and mixes a CPU scalar with GPU tensors, as eager does
                self.extern(node, "a CPU tensor in a GPU graph")
                continue
            if rule is None:
                self.extern(node, "" if op in EXTERN_BY_DESIGN else "no lowering")
                continue
            try:
                result = rule(self, node)
            except Fallback as e:
                self.extern(node, str(e) or "lowering declined")
                continue
            results = result if isinstance(result, list | tuple) else [result]
            for name, tv in zip(node.outputs, results, strict=False):
                if name and tv is not None:
                    self.env[name] = self.maybe_realize(name, tv) if isinstance(tv, TensorValue) else tv
        outputs: list[object] = []
        for out in g.outputs:
            if isinstance(out.value, S.TensorRef):
                tv = self.env[out.value.name]
                assert isinstance(tv, TensorValue)
                outputs.append(self.as_buffer(tv, self.meta(out.value.name)))
            else:
                outputs.append(out.value)
        return ir.LoopProgram(
            name=g.name,
            inputs=tuple(i.name for i in g.inputs),
            buffers=dict(self.buffers),
            nodes=tuple(self.nodes),
            outputs=tuple(outputs),
            symbols=tuple(g.symbols),
            device=self.device,
            meta={"fallbacks": "\n".join(self.fallbacks)},
        )


_REALIZE_THROUGH = frozenset({
    "aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.view.default",
    "aten._unsafe_view.default", "aten.reshape.default",
})
"""View ops `Lowering.through_view` looks through: each keeps every element of its source."""


def _leading_in_memory(value_at, ranges, rranges) -> bool:
    """Whether every read of a reduction that depends on both the kept and the reduced dims
    walks the reduced dims outside the kept ones in memory (a per-channel reduction of NHWC
    data: the channels are contiguous, the reduced N, H, W outside them), so that it is a
    reduction over a leading dim of the memory even though it is not one of the sizes. Static
    sizes and indices linear in the loop variables only."""
    xs = [ir.loop_var("x", i) for i in range(len(ranges))]
    rs = [ir.loop_var("r", i) for i in range(len(rranges))]
    sizes = [*ranges, *rranges]
    if not all(getattr(n, "is_Integer", False) for n in sizes):
        return False
    found = False
    for ld in ir.loads_of(value_at(xs, rs)):
        e = sympy.expand(ld.index)
        coef: dict[sympy.Symbol, int] = {}
        for v in (*xs, *rs):
            c = e.coeff(v)
            if c.free_symbols or sympy.expand(e - c * v).has(v):
                return False  # not linear in v (a broadcast's % or //)
            coef[v] = abs(int(c))
        red = [coef[v] for v, n in zip(rs, rranges, strict=True) if int(n) > 1 and coef[v]]
        keep = [coef[v] * int(n) for v, n in zip(xs, ranges, strict=True) if int(n) > 1 and coef[v]]
        if not red or not keep:
            continue  # a per-row or per-column input: no say in the order
        if min(red) < max(keep):
            return False
        found = True
    return found


def _chunk(rnumel: sympy.Expr, k: int, exact: bool) -> sympy.Expr:
    """The length of each of ``k`` chunks of a row of ``rnumel`` elements."""
    if exact:
        q = ir.exact_div(rnumel, sympy.Integer(k))
        assert q is not None
        return q
    return ir.FloorDiv(rnumel + (k - 1), sympy.Integer(k))


def _chunk_value(value_at, xs, s, chunk, rranges, rop: ir.ReduceOp, acc: str, exact: bool) -> ir.Value:
    """Element ``r`` of chunk ``s`` of a row: the first stage of a split reduction. Chunks of
    ``ceil(n/k)`` run past the row's end in the last chunk(s): there the loads are masked off
    and the value is the reduction's identity, so the partial results are right for any ``n``."""
    pos = s * chunk + ir.loop_var("r", 0)
    v = value_at(xs, ir.unflatten(pos, rranges))
    if exact:
        return v
    inside = ir.Call(ir.VOp.LT, (ir.IndexValue(pos), ir.IndexValue(ir.product(rranges))), "bool")
    return ir.Call(ir.VOp.WHERE, (inside, ir.guard(v, inside), ir.Const(_identity(rop, acc), acc)), acc)


def _identity(rop: ir.ReduceOp, dtype: str) -> float | int | bool:
    if rop in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
        return rop == ir.ReduceOp.ALL
    if rop == ir.ReduceOp.SUM:
        return 0.0 if dtype in ir.FLOAT_DTYPES else 0
    if rop == ir.ReduceOp.PROD:
        return 1.0 if dtype in ir.FLOAT_DTYPES else 1
    lowest = rop == ir.ReduceOp.MAX
    if dtype in ir.FLOAT_DTYPES:
        return -math.inf if lowest else math.inf
    info = torch.iinfo(getattr(torch, dtype))
    return info.min if lowest else info.max


def _short(op: str) -> str:
    return op.split(".")[1].strip("_")


def _functional_name(op: str) -> str:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor``: an in-place op in an SSA graph is its
    functional twin (its result already has a fresh value name)."""
    ns, name, overload = op.split(".")
    if name.endswith("_") and not name.endswith("__") and not name.startswith("_"):
        return f"{ns}.{name[:-1]}.{overload}"
    return op


def _extern_op(op: str) -> str:
    """The op an extern step calls: the functional twin of an in-place op when torch has one
    (the graph is SSA, so the mutated argument must keep its old value)."""
    from torchfuse.graph.ops import UnknownOpError, resolve_op

    functional = _functional_name(op)
    if functional == op:
        return op
    try:
        resolve_op(functional)
    except UnknownOpError:
        return op
    return functional


def lower(graph: S.Graph, config: InductorConfig) -> ir.LoopProgram:
    """Lower a graph (already decomposed) to the loop IR."""
    return Lowering(graph, config).run()


def result_dtype(*args: object) -> str:
    """Eager type promotion over tensors (0-dim ones rank below the rest) and Python scalars."""
    from torchfuse.graph.ops import dtype_name, to_dtype

    def category(dt: torch.dtype) -> int:
        return 0 if dt == torch.bool else (2 if dt.is_floating_point else (3 if dt.is_complex else 1))

    groups: list[list[torch.dtype]] = [[], [], []]
    for a in args:
        if isinstance(a, TensorValue):
            groups[0 if a.sizes else 1].append(to_dtype(a.dtype))
        elif isinstance(a, bool):
            groups[2].append(torch.bool)
        elif isinstance(a, int):
            groups[2].append(torch.int64)
        elif isinstance(a, float):
            groups[2].append(torch.get_default_dtype())
    result: torch.dtype | None = None
    for group in groups:
        if not group:
            continue
        g = group[0]
        for dt in group[1:]:
            g = torch.promote_types(g, dt)
        # a lower-priority group (0-dim tensors, then scalars) only lifts the category
        if result is None or category(g) > category(result):
            result = g
    return dtype_name(result or torch.float32)

