"""Lowering rules for views, ``split``/``chunk``, ``cat`` and indexing (``gather``,
``index_select``, ``embedding``, ``index.Tensor``), ``constant_pad_nd``, and the writes
that functionalized in-place code leaves (``slice_scatter``, ``select_scatter``, ``fill``)
and ``roll``, all as index arithmetic inside the consumer's kernel.

Views never copy: a strided value takes the view's strides from the graph; a lazy value
gets an index remap. Indexing by tensors loads the index first and uses it inside the
address (an *indirect* load). Rules are registered into the engine's table
([`register`][torchfuse.inductor.lowering.register]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy
from torchfuse.graph import schema as S
from torchfuse.inductor import ir
from torchfuse.inductor.ir import VOp
from torchfuse.inductor.lowering import (
    Fallback,
    Layout,
    Lowering,
    TensorValue,
    cast,
    expr_of,
    register,
    strided_loader,
)
from torchfuse.inductor.lowerings import bind, broadcast_loader, call, out_meta, pyval

# ----------------------------------------------------------------------------- views


def _view_layout(L: Lowering, node: S.Node, x: TensorValue, i: int = 0) -> TensorValue | None:
    """A view of a strided value is a strided value: its strides come from the graph."""
    if x.layout is None:
        return None
    m = L.meta(node.outputs[i])
    base_name = next(a.name for a in node.args if isinstance(a, S.TensorRef))
    base_off = expr_of(L.meta(base_name).storage_offset)
    layout = Layout(
        x.layout.buffer,
        tuple(expr_of(s) for s in m.strides),
        sympy.expand(x.layout.offset + expr_of(m.storage_offset) - base_off),
    )
    sizes = tuple(expr_of(s) for s in m.sizes)
    return TensorValue(sizes, m.dtype, strided_loader(layout, m.dtype), layout)


def view_rule(remap: Callable[[dict, tuple, tuple], Callable[[Sequence[sympy.Expr]], list[sympy.Expr]]]):
    """A view op: strided values take the graph's layout; lazy values get an index remap."""

    def rule(L, node):
        b = bind(L, node)
        x = b["self"]
        strided = _view_layout(L, node, x)
        if strided is not None:
            return strided
        sizes, out = out_meta(L, node)
        fn = remap(b, x.sizes, sizes)
        return TensorValue(sizes, out, lambda idx: x.loader(fn(idx)), None, x.origins, x.ops)

    return rule


def _reshape_map(b, old, new):
    def fn(idx):
        flat = sum((i * s for i, s in zip(idx, ir.contiguous_strides(new), strict=True)), sympy.Integer(0))
        return ir.unflatten(flat, old)

    return fn


def _permute_map(b, old, new):
    dims = [d % len(old) for d in b["dims"]]
    inv = [dims.index(i) for i in range(len(old))]
    return lambda idx: [idx[inv[i]] for i in range(len(old))]


def _transpose_map(b, old, new):
    n = len(old)
    d0, d1 = (b.get("dim0", 0) % max(n, 1), b.get("dim1", 1) % max(n, 1)) if n > 1 else (0, 0)

    def fn(idx):
        idx = list(idx)
        idx[d0], idx[d1] = idx[d1], idx[d0]
        return idx

    return fn


def _expand_map(b, old, new):
    off = len(new) - len(old)
    return lambda idx: [
        sympy.Integer(0) if old[i] == 1 and new[off + i] != 1 else idx[off + i] for i in range(len(old))
    ]


def _squeeze_like_map(b, old, new):
    # squeeze/unsqueeze only add or drop size-1 dims: map the non-1 dims in order
    keep_old = [i for i, s in enumerate(old) if s != 1]
    keep_new = [i for i, s in enumerate(new) if s != 1]
    if len(keep_old) != len(keep_new):
        raise Fallback("squeeze of a non-unit dim")

    def fn(idx):
        out = [sympy.Integer(0)] * len(old)
        for o, n in zip(keep_old, keep_new, strict=True):
            out[o] = idx[n]
        return out

    return fn


def _slice_map(b, old, new):
    d = b["dim"] % len(old)
    start = b.get("start") or 0
    step = b.get("step") or 1
    size = old[d]
    if isinstance(start, int) and start < 0:
        start += size
    start = sympy.Min(sympy.Max(sympy.sympify(start), 0), size) if not isinstance(size, int) else start

    def fn(idx):
        idx = list(idx)
        idx[d] = start + step * idx[d]
        return idx

    return fn


def _select_map(b, old, new):
    d = b["dim"] % len(old)
    i = b["index"]
    if isinstance(i, int) and i < 0:
        i += old[d]
    return lambda idx: [*idx[:d], sympy.sympify(i), *idx[d:]]


register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_as.default")(
    view_rule(_reshape_map)
)
register("aten.permute.default")(view_rule(_permute_map))
register("aten.transpose.int", "aten.t.default")(view_rule(_transpose_map))
register("aten.expand.default", "aten.expand_as.default")(view_rule(_expand_map))
register("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default")(
    view_rule(_squeeze_like_map)
)
register("aten.slice.Tensor")(view_rule(_slice_map))
register("aten.select.int")(view_rule(_select_map))
register("aten.alias.default", "aten.detach.default", "aten.lift_fresh.default")(
    view_rule(lambda b, old, new: lambda idx: list(idx))
)


@register("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int")
def _split(L, node):
    b = bind(L, node)
    x = b["self"]
    d = b.get("dim", 0) % len(x.sizes)
    outs = []
    start = sympy.Integer(0)
    for i, name in enumerate(node.outputs):
        if not name:
            outs.append(None)
            continue
        strided = _view_layout(L, node, x, i)
        m = L.meta(name)
        sizes = tuple(expr_of(s) for s in m.sizes)
        if strided is not None:
            outs.append(strided)
        elif node.op.startswith("aten.unbind"):
            outs.append(
                TensorValue(
                    sizes,
                    x.dtype,
                    (lambda k: lambda idx: x.loader([*idx[:d], sympy.Integer(k), *idx[d:]]))(i),
                    None,
                    x.origins,
                    x.ops,
                )
            )
        else:
            outs.append(
                TensorValue(
                    sizes,
                    x.dtype,
                    (lambda s0: lambda idx: x.loader([*idx[:d], idx[d] + s0, *idx[d + 1 :]]))(start),
                    None,
                    x.origins,
                    x.ops,
                )
            )
            start = start + sizes[d]
    return outs


# ----------------------------------------------------------------------------- cat, indexing


@register("aten.cat.default")
def _cat(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    parts = [t for t in b["tensors"] if not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    d = b.get("dim", 0) % len(sizes)
    offsets, acc = [], sympy.Integer(0)
    for t in parts:
        offsets.append(acc)
        acc = acc + t.sizes[d]
    cdt = ir.compute_dtype(out)

    def load(idx):
        c = idx[d]
        value = None
        last = len(parts) - 1
        for k, (t, off) in reversed(list(enumerate(zip(parts, offsets, strict=True)))):
            v = cast(t.loader([*idx[:d], c - off, *idx[d + 1 :]]), cdt)
            if len(parts) > 1:
                # each part's loads happen only inside its range: the index stays affine
                # (``xindex + 64`` for rotate_half) instead of clamped, so loads vectorize
                # and no part is read where another one is used
                inside = []
                if k > 0:
                    inside.append(call(VOp.GE, ir.IndexValue(c), ir.IndexValue(off)))
                if k < last:
                    inside.append(call(VOp.LT, ir.IndexValue(c), ir.IndexValue(off + t.sizes[d])))
                cond = inside[0] if len(inside) == 1 else call(VOp.AND, *inside)
                v = ir.guard(v, cond)
            if value is None:
                value = v
            else:
                limit = ir.IndexValue(off + t.sizes[d])
                value = call(VOp.WHERE, call(VOp.LT, ir.IndexValue(c), limit), v, value)
        return value

    return TensorValue(sizes, out, load, None, ("cat",), 1 + sum(t.ops for t in parts))


def _indirect(
    L: Lowering, x: TensorValue, idx: list[sympy.Expr], positions: dict[int, ir.Value], wrap: bool
) -> ir.Value:
    """Load ``x`` at ``idx`` where the coordinates in ``positions`` are runtime values."""
    binds = []
    for d, v in positions.items():
        s = L.indirect_symbol()
        v = cast(v, "int64")
        if wrap:
            v = call(
                VOp.WHERE,
                call(VOp.LT, v, ir.Const(0, "int64")),
                call(VOp.ADD, v, cast(ir.IndexValue(x.sizes[d]), "int64")),
                v,
            )
        idx[d] = s
        binds.append((s, v))
    value = x.loader(idx)
    syms = {s for s, _ in binds}

    def attach(ld: ir.Load) -> ir.Load:
        used = tuple((s, v) for s, v in binds if s in ld.index.free_symbols)
        return ir.Load(ld.buffer, ld.index, ld.dtype, ld.indirect + used, ld.mask) if used else ld

    out = ir.map_loads(value, attach)
    if any(isinstance(n, ir.IndexValue) and n.index.free_symbols & syms for n in _walk(out)):
        raise Fallback("indirect index used as a value")
    return out


def _walk(v: ir.Value):
    yield v
    if isinstance(v, ir.Call):
        for a in v.args:
            yield from _walk(a)
    elif isinstance(v, ir.Cast):
        yield from _walk(v.arg)


def _probed(tv: TensorValue) -> TensorValue:
    """``tv`` after one load of a generic element: a gather whose source uses its own index
    as a value (``_indirect``'s Fallback) is declined while its rule runs, so the node becomes
    an extern call, and not later when a reader or ``maybe_realize`` expands the value."""
    tv.loader([ir.loop_var("x", i) for i in range(len(tv.sizes))])
    return tv


@register("aten.gather.default")
def _gather(L, node):
    b = bind(L, node)
    x, index = b["self"], b["index"]
    d = b["dim"] % max(len(x.sizes), 1)
    sizes, out = out_meta(L, node)
    return _probed(TensorValue(
        sizes,
        out,
        lambda idx: _indirect(L, x, list(idx), {d: index.loader(list(idx))}, False),
        None,
        ("gather",),
        1 + x.ops + index.ops,
    ))


@register("aten.index_select.default")
def _index_select(L, node):
    b = bind(L, node)
    x, index = b["self"], b["index"]
    d = b["dim"] % max(len(x.sizes), 1)
    sizes, out = out_meta(L, node)
    return _probed(TensorValue(
        sizes,
        out,
        lambda idx: _indirect(L, x, list(idx), {d: index.loader([idx[d]])}, False),
        None,
        ("index_select",),
        1 + x.ops + index.ops,
    ))


@register("aten.embedding.default")
def _embedding(L, node):
    b = bind(L, node)
    w, ind = b["weight"], b["indices"]
    sizes, out = out_meta(L, node)
    n = len(ind.sizes)
    return _probed(TensorValue(
        sizes,
        out,
        lambda idx: _indirect(L, w, [sympy.Integer(0), idx[n]], {0: ind.loader(list(idx[:n]))}, False),
        None,
        ("embedding",),
        1 + w.ops + ind.ops,
    ))


@register("aten.index.Tensor")
def _index(L, node):
    b = bind(L, node)
    x, indices = b["self"], b["indices"]
    sizes, out = out_meta(L, node)
    present = [i for i, t in enumerate(indices) if t is not None]
    if any(t.dtype in ("bool", "uint8") for t in indices if t is not None):
        raise Fallback("boolean mask index")
    ishapes = [indices[i].sizes for i in present]
    nb = max(len(s) for s in ishapes)
    adjacent = present == list(range(present[0], present[-1] + 1))
    first = present[0] if adjacent else 0

    def load(idx):
        bidx = list(idx[first : first + nb])
        coords: list[sympy.Expr] = []
        positions: dict[int, ir.Value] = {}
        rest = list(idx[:first]) + list(idx[first + nb :])
        k = 0
        for d in range(len(x.sizes)):
            if d in present:
                t = indices[d]
                positions[d] = broadcast_loader(t, bidx)(bidx) if len(t.sizes) else t.loader([])
                coords.append(sympy.Integer(0))
            else:
                coords.append(rest[k])
                k += 1
        return _indirect(L, x, coords, positions, True)

    return _probed(TensorValue(sizes, out, load, None, ("index",), 1 + x.ops))


@register("aten.constant_pad_nd.default")
def _pad(L, node):
    b = bind(L, node)
    x, pad, value = b["self"], b["pad"], b.get("value") or 0
    sizes, out = out_meta(L, node)
    if any(p < 0 for p in pad if isinstance(p, int)):
        raise Fallback("negative padding")
    cdt = ir.compute_dtype(out)

    def load(idx):
        src = list(idx)
        conds = []
        for k in range(len(pad) // 2):
            d = len(sizes) - 1 - k
            lo = pad[2 * k]
            src[d] = idx[d] - lo  # loaded only where inside (see ``cat``): no clamping
            conds.append(call(VOp.GE, ir.IndexValue(idx[d]), ir.IndexValue(sympy.sympify(lo))))
            conds.append(call(VOp.LT, ir.IndexValue(idx[d]), ir.IndexValue(lo + x.sizes[d])))
        ok = conds[0]
        for c in conds[1:]:
            ok = call(VOp.AND, ok, c)
        inside = ir.guard(cast(x.loader(src), cdt), ok)
        return call(VOp.WHERE, ok, inside, ir.Const(pyval(value, cdt), cdt))

    return TensorValue(sizes, out, load, None, (*x.origins, "constant_pad_nd"), x.ops + 1)


@register("aten.triu.default", "aten.tril.default")
def _tri(L, node):
    b = bind(L, node)
    x, k = b["self"], b.get("diagonal") or 0
    sizes, out = out_meta(L, node)
    upper = node.op.startswith("aten.triu")
    cdt = ir.compute_dtype(out)

    def load(idx):
        row, col = idx[-2], idx[-1]
        keep = call(VOp.GE if upper else VOp.LE, ir.IndexValue(col - row), ir.IndexValue(sympy.sympify(k)))
        return call(VOp.WHERE, keep, cast(x.loader(idx), cdt), ir.Const(pyval(0, cdt), cdt))

    return TensorValue(sizes, out, load, None, (*x.origins, node.op.split(".")[1]), x.ops + 1)


@register("aten.scatter.src", "aten.scatter.value")
def _scatter(L, node):
    """``scatter`` with one index per row along ``dim`` (e.g. the backward of nll_loss):
    ``out[..., j, ...] = src[..., 0, ...] if index[..., 0, ...] == j else self[..., j, ...]``."""
    b = bind(L, node)
    x, index = b["self"], b["index"]
    d = b["dim"] % max(len(x.sizes), 1)
    sizes, out = out_meta(L, node)
    others_match = all(index.sizes[k] == x.sizes[k] for k in range(len(x.sizes)) if k != d) and len(
        index.sizes
    ) == len(x.sizes)
    if not others_match or index.sizes[d] != 1 or b.get("reduce") is not None:
        raise Fallback("scatter with several indices per row")
    src = b.get("src", b.get("value"))
    cdt = ir.compute_dtype(out)

    def load(idx):
        at = [*idx[:d], sympy.Integer(0), *idx[d + 1 :]]
        hit = call(VOp.EQ, cast(index.loader(at), "int64"), cast(ir.IndexValue(idx[d]), "int64"))
        new = cast(src.loader(at), cdt) if isinstance(src, TensorValue) else ir.Const(pyval(src, cdt), cdt)
        return call(VOp.WHERE, hit, new, cast(x.loader(idx), cdt))

    ops = x.ops + index.ops + (src.ops if isinstance(src, TensorValue) else 0)
    return TensorValue(sizes, out, load, None, (*x.origins, "scatter"), ops + 2)


# ----------------------------------------------------------------------------- writes into slices, roll


def _static(e: sympy.Expr) -> int | None:
    return int(e) if getattr(e, "is_Integer", False) else None


def _slice_bounds(start: object, end: object, size: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """``start``/``end`` of a slice over ``size`` as Python's ``slice.indices`` gives them
    (negative from the end, clamped to ``[0, size]``)."""
    n = _static(size)
    s = 0 if start is None else start
    e = n if end is None else end
    if n is None:
        if s == 0 and (end is None or (isinstance(end, int) and end >= 2**62)):
            return sympy.Integer(0), size
        raise Fallback("slice_scatter over a symbolic size")
    if not isinstance(s, int) or not isinstance(e, int):
        raise Fallback("slice_scatter with symbolic bounds")
    s, e, _ = slice(s, e).indices(n)
    return sympy.Integer(s), sympy.Integer(max(e, s))


def _slice_write(x: TensorValue | None, src: TensorValue, sizes, out, d: int, start, end, step: int):
    """The loader of ``x`` (zeros when ``x`` is None) with ``[..., start:end:step, ...]``
    replaced by ``src``: ``src`` is loaded only inside the slice."""
    if not isinstance(step, int) or step < 1:
        raise Fallback("a slice write with a symbolic step")
    start, end = _slice_bounds(start, end, sizes[d])
    cdt = ir.compute_dtype(out)

    def load(idx):
        c = idx[d]
        inside = call(VOp.AND, call(VOp.GE, ir.IndexValue(c), ir.IndexValue(start)),
                      call(VOp.LT, ir.IndexValue(c), ir.IndexValue(end)))
        if step > 1:
            on_step = call(VOp.EQ, ir.IndexValue(ir.ModIdx(c - start, step)), ir.IndexValue(sympy.Integer(0)))
            inside = call(VOp.AND, inside, on_step)
            at = ir.FloorDiv(c - start, step)
        else:
            at = c - start
        new = ir.guard(cast(src.loader([*idx[:d], at, *idx[d + 1 :]]), cdt), inside)
        base = ir.Const(pyval(0, cdt), cdt) if x is None else cast(x.loader(idx), cdt)
        return call(VOp.WHERE, inside, new, base)

    return load


def _select_write(x: TensorValue | None, src: TensorValue, sizes, out, d: int, i: object):
    """The loader of ``x`` (zeros when ``x`` is None) with ``[..., i, ...]`` replaced by ``src``."""
    if not isinstance(i, int) or (_static(sizes[d]) is None and i < 0):
        raise Fallback("a select write with a symbolic index")
    at = sympy.Integer(i + int(sizes[d]) if i < 0 else i)
    cdt = ir.compute_dtype(out)

    def load(idx):
        hit = call(VOp.EQ, ir.IndexValue(idx[d]), ir.IndexValue(at))
        new = ir.guard(cast(src.loader([*idx[:d], *idx[d + 1 :]]), cdt), hit)
        base = ir.Const(pyval(0, cdt), cdt) if x is None else cast(x.loader(idx), cdt)
        return call(VOp.WHERE, hit, new, base)

    return load


@register("aten.slice_scatter.default")
def _slice_scatter(L, node):
    """``out = self`` with ``out[..., start:end:step, ...] = src`` (what an in-place write
    into a slice functionalizes to)."""
    b = bind(L, node)
    x, src = b["self"], b["src"]
    sizes, out = out_meta(L, node)
    d = (b.get("dim") or 0) % max(len(sizes), 1)
    load = _slice_write(x, src, sizes, out, d, b.get("start"), b.get("end"), b.get("step") or 1)
    return TensorValue(sizes, out, load, None, (*x.origins, "slice_scatter"), x.ops + src.ops + 1)


@register("aten.slice_backward.default")
def _slice_backward(L, node):
    """The gradient of a slice: zeros of the input's size with the slice's gradient in place
    (``slice_scatter`` into zeros, without the zeros buffer)."""
    b = bind(L, node)
    g = b["grad_output"]
    sizes, out = out_meta(L, node)
    d = b["dim"] % max(len(sizes), 1)
    load = _slice_write(None, g, sizes, out, d, b["start"], b["end"], b["step"])
    return TensorValue(sizes, out, load, None, (*g.origins, "slice_backward"), g.ops + 1)


@register("aten.select_scatter.default")
def _select_scatter(L, node):
    """``out = self`` with ``out[..., index, ...] = src`` (an in-place write into ``x[i]``)."""
    b = bind(L, node)
    x, src = b["self"], b["src"]
    sizes, out = out_meta(L, node)
    d = b["dim"] % max(len(sizes), 1)
    load = _select_write(x, src, sizes, out, d, b["index"])
    return TensorValue(sizes, out, load, None, (*x.origins, "select_scatter"), x.ops + src.ops + 1)


@register("aten.select_backward.default")
def _select_backward(L, node):
    """The gradient of ``x[..., i, ...]``: zeros of the input's size, the gradient at ``i``."""
    b = bind(L, node)
    g = b["grad_output"]
    sizes, out = out_meta(L, node)
    d = b["dim"] % max(len(sizes), 1)
    load = _select_write(None, g, sizes, out, d, b["index"])
    return TensorValue(sizes, out, load, None, (*g.origins, "select_backward"), g.ops + 1)


@register("aten.fill.Scalar", "aten.fill.Tensor")
def _fill(L, node):
    """``fill``: every element is ``value`` (a number, or a 0-d tensor read once per element)."""
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    v = b["value"]
    if isinstance(v, TensorValue):
        ld = broadcast_loader(v, sizes)
        return TensorValue(sizes, out, lambda idx: cast(ld(idx), out), None, ("fill",), v.ops + 1)
    if isinstance(v, sympy.Expr):
        raise Fallback("symbolic fill")
    return TensorValue(sizes, out, lambda idx: ir.Const(pyval(v, out), out), None, ("fill",), 0)


@register("aten.roll.default")
def _roll(L, node):
    """``roll``: ``out[..., i, ...] = self[..., (i - shift) mod size, ...]`` along each dim."""
    b = bind(L, node)
    x = b["self"]
    sizes, out = out_meta(L, node)
    shifts, dims = list(b["shifts"]), list(b.get("dims") or [])
    if not dims or len(dims) != len(shifts):
        raise Fallback("roll of the flattened tensor")
    moves: dict[int, int] = {}
    for shift, dim in zip(shifts, dims, strict=True):
        d = dim % len(sizes)
        n = _static(sizes[d])
        if n is None or not isinstance(shift, int):
            raise Fallback("roll over a symbolic size or shift")
        if n:
            moves[d] = (moves.get(d, 0) + shift) % n

    def load(idx):
        src = list(idx)
        for d, k in moves.items():
            if k:
                # (i - k) mod n, written with a non-negative operand: i + (n - k)
                src[d] = ir.ModIdx(idx[d] + (int(sizes[d]) - k), sizes[d])
        return x.loader(src)

    return TensorValue(sizes, out, load, None, (*x.origins, "roll"), x.ops + 1)
