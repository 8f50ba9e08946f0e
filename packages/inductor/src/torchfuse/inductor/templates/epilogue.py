"""Epilogues of matmul templates: the pointwise work applied to the accumulator tile.

An epilogue is the region of pointwise nodes that consume a matmul's result and can be
computed from the output tile alone, so that the template writes only the region's final
value. Which graph ops may join is a property of the op (`BINARY`, `UNARY`,
`CASTS`, `RESHAPES`); what they compute is not decided here: the region is
lowered by the ordinary lowering rules into one loop-IR value
(`Value`) over the accumulator (``load(acc, …)``) and the
extra inputs (``load(x0, …)``), and the template renders that value with the same table as
every other kernel ([`torchfuse.inductor.triton_ops`][torchfuse.inductor.triton_ops]).

A region grows from the matmul in graph order and stops at the first node that reads a
region value but is not an epilogue op (a reduction, a view that moves elements, an op on
integers, a node with symbolic sizes ...). It is then cut back to the longest prefix whose
only value read outside it is its last one: an intermediate read by anything else (the
``x`` of ``y = relu(x); return x, y``) would otherwise have to be written too. Values
inside a region are never materialized; their shapes may differ from the matmul's only by
a row-major split of the rows (``view(mm, [b, t, n])``), so every one of them is indexed by
the same ``(batch, row, col)`` of the output tile (the loads' indices carry no information
and are left at 0). Tensors read from outside (a bias, a residual) are *extra inputs*:
anything that broadcasts to the tile, addressed with its own strides over
``(batch, row, col)`` (0 where it is broadcast).

Example (``F.gelu(x @ w.t() + b)`` after decomposition)::

    mm = aten.mm(x, t);  add = aten.add.Tensor(mm, b);  mul = aten.mul.Tensor(add, 0.5)
    mul_1 = aten.mul.Tensor(add, 0.7071);  erf = aten.erf(mul_1)
    add_1 = aten.add.Tensor(erf, 1);  mul_2 = aten.mul.Tensor(mul, add_1)

becomes the epilogue value (``x0`` is ``b``, read with strides ``(0, 0, 1)``)::

    mul(mul(add(load(acc, 0), load(x0, 0)), 0.5),
        add(erf(mul(add(load(acc, 0), load(x0, 0)), 0.7071067811865476)), 1.0))
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.ops import UnknownOpError, node_inputs, resolve_op, tensor_refs
from torchfuse.graph.tracing import mutated_arguments
from torchfuse.inductor import ir

BINARY = frozenset({
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
    "aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar",
})
"""Two operands, tensors or scalars, broadcast to the output."""
SCALED = frozenset({"aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar"})
"""Binary ops with an ``alpha`` multiplying their second operand."""
UNARY = frozenset({
    "aten.neg.default", "aten.relu.default", "aten.sigmoid.default", "aten.tanh.default",
    "aten.erf.default", "aten.exp.default",
})
CASTS = frozenset({"aten._to_copy.default"})
"""A dtype conversion (``_to_copy`` with a dtype and nothing that moves the data)."""
RESHAPES = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})
"""A row-major reshape that keeps the last dimension: the same elements, the same tile."""
EPILOGUE_OPS = BINARY | UNARY | CASTS | RESHAPES
"""Graph ops an epilogue accepts (each lowered by its ordinary lowering rule)."""

TILE_DTYPES = frozenset({"float16", "bfloat16", "float32"})
"""Dtypes of every value an epilogue reads or makes (the tile is computed in float32)."""

ACC = "acc"
"""The buffer name standing for the matmul's float32 accumulator tile in an epilogue value."""


def extra_name(i: int) -> str:
    """The buffer name standing for extra input ``i`` (loaded as a float32 tile)."""
    return f"x{i}"


# ----------------------------------------------------------------------------- the epilogue


Strides3 = tuple[int, int, int]
"""Element strides over the tile's ``(batch, row, col)``; 0 where broadcast."""


@dataclass(frozen=True, slots=True)
class Extra:
    """A tensor the epilogue reads: graph value ``name`` with strides over the tile."""

    name: str
    dtype: str
    strides: Strides3


@dataclass(frozen=True, slots=True)
class Epilogue:
    """What the template computes after the matmul, the graph nodes it replaces and the value
    it stores."""

    value: ir.Value
    """The stored value, over `ACC` and the extras (``x0``, ``x1`` …), in float32."""
    ops: tuple[str, ...]
    """Short names of the computing ops, in order (``add``, ``relu``; no views or casts)."""
    extras: tuple[Extra, ...]
    nodes: tuple[int, ...]
    """Indices (in ``graph.nodes``) of the nodes the value comes from."""
    out: str
    """The graph value the template produces (the matmul's own when there are no steps)."""
    out_meta: S.TensorMeta
    out_strides: Strides3

    def signature(self) -> str:
        """A stable text of what the epilogue computes (for decision-cache keys and logs)."""
        extras = ";".join(f"x{i}:{e.dtype}{list(e.strides)}" for i, e in enumerate(self.extras))
        return f"{let_form(self.value)}|{extras}|out:{self.out_meta.dtype}{list(self.out_strides)}"

    def summary(self) -> str:
        """``+add+relu`` style, for log lines."""
        return "".join(f"+{op}" for op in self.ops)


def let_form(value: ir.Value) -> str:
    """``value`` with each shared subvalue named once: ``v0=add(acc,x0);v1=mul(v0,v0);v1``
    (the tree form repeats a value read twice, and grows with every reuse)."""
    steps: list[str] = []
    names: dict[ir.Value, str] = {}

    def go(v: ir.Value) -> str:
        if v in names:
            return names[v]
        if isinstance(v, ir.Load):
            text = v.buffer
        elif isinstance(v, ir.Const):
            text = repr(v.value)
        else:
            args = [go(v.arg)] if isinstance(v, ir.Cast) else [go(a) for a in getattr(v, "args", ())]
            op = f"to_{v.dtype}" if isinstance(v, ir.Cast) else getattr(getattr(v, "op", None), "value", "?")
            steps.append(f"v{len(steps)}={op}({','.join(args)})")
            text = f"v{len(steps) - 1}"
        names[v] = text
        return text

    last = go(value)
    return ";".join([*steps, last])


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True, slots=True)
class Domain:
    """The output tile space of a matmul: ``batch`` x ``m`` x ``n`` (``batch`` 1 for mm)."""

    batch: int
    m: int
    n: int
    batched: bool

    def holds(self, sizes: Sequence[int]) -> bool:
        """Whether a tensor of ``sizes`` enumerates the domain in row-major order (the mm
        rows may be split in several leading dims; a bmm result must keep its shape)."""
        if self.batched:
            return tuple(sizes) == (self.batch, self.m, self.n)
        return len(sizes) >= 1 and sizes[-1] == self.n and math.prod(sizes[:-1]) == self.m

    def strides_of(self, sizes: Sequence[int], strides: Sequence[int],
                   shape: Sequence[int]) -> Strides3 | None:
        """Strides over ``(batch, row, col)`` of a tensor broadcast to ``shape`` (a shape the
        domain `holds`), or None when it does not broadcast or its row dims do not
        collapse into one stride."""
        if len(sizes) > len(shape):
            return None
        lead = len(shape) - len(sizes)
        padded: list[int] = []
        for i, size in enumerate(shape):
            j = i - lead
            if j < 0 or (sizes[j] == 1 and size != 1):
                padded.append(0)
            elif sizes[j] == size:
                padded.append(strides[j] if size != 1 else 0)
            else:
                return None
        if self.batched:
            return (padded[0], padded[1], padded[2])
        rows = [(size, st) for size, st in zip(shape[:-1], padded[:-1], strict=True) if size != 1]
        for (_, outer), (inner_size, inner) in itertools.pairwise(rows):
            if outer != inner * inner_size:
                return None
        return (0, rows[-1][1] if rows else 0, padded[-1])


def static_meta(meta: S.TensorMeta | None) -> bool:
    """Whether every size, stride and the offset of ``meta`` is a known int."""
    if meta is None:
        return False
    return all(isinstance(x, int) for x in (*meta.sizes, *meta.strides, meta.storage_offset))


# ----------------------------------------------------------------------------- growing a region


def mutates(node: S.Node) -> bool:
    """Whether ``node`` may write memory some other node reads (unknown ops are assumed to)."""
    try:
        return bool(mutated_arguments(resolve_op(node.op)))
    except UnknownOpError:
        return True


class _Grower:
    """Decides, node by node, whether a graph node joins the region (`step`)."""

    def __init__(self, graph: S.Graph, domain: Domain, device: str) -> None:
        self.graph = graph
        self.domain = domain
        self.device = device
        self.shapes: dict[str, tuple[int, ...]] = {}
        """Region values and their shapes."""
        self.extras: dict[str, Extra] = {}

    def extra(self, name: str, shape: tuple[int, ...]) -> bool:
        meta = self.graph.values.get(name)
        if not static_meta(meta) or meta.dtype not in TILE_DTYPES or meta.device != self.device:
            return False
        strides = self.domain.strides_of(meta.sizes, meta.strides, shape)  # type: ignore[arg-type]
        if strides is None:
            return False
        known = self.extras.get(name)
        if known is not None and known.strides != strides:
            return False  # one extra, one addressing: the same tensor broadcast two ways is rare
        self.extras[name] = Extra(name, meta.dtype, strides)
        return True

    def operand(self, a: S.Argument, shape: tuple[int, ...], region_only: bool = False) -> bool:
        if isinstance(a, S.TensorRef):
            if a.name in self.shapes:
                # region values are tiles of this very shape; a broadcast one would repeat rows
                return self.shapes[a.name] == shape
            return not region_only and self.extra(a.name, shape)
        if region_only:
            return False
        return isinstance(a, S.Int | S.Float) and not isinstance(a.value, str) and math.isfinite(a.value)

    def step(self, node: S.Node) -> bool:
        """Whether ``node`` (which reads a region value) joins the region."""
        op = node.op
        if op not in EPILOGUE_OPS or len(node.outputs) != 1:
            return False
        meta = self.graph.values.get(node.outputs[0])
        if (not static_meta(meta) or meta.dtype not in TILE_DTYPES or meta.requires_grad
                or meta.device != self.device or not self.domain.holds(meta.sizes)):
            return False
        shape = tuple(meta.sizes)  # type: ignore[arg-type]
        if op in BINARY:
            ok = self._binary(node, shape)
        elif op in CASTS:
            ok = self._cast(node, shape)
        elif op in RESHAPES:
            first = node.args[0] if node.args else None
            ok = isinstance(first, S.TensorRef) and first.name in self.shapes
        else:
            unary = len(node.args) == 1 and not node.kwargs
            ok = unary and self.operand(node.args[0], shape, region_only=True)
        if ok:
            self.shapes[node.outputs[0]] = shape
        return ok

    def _binary(self, node: S.Node, shape: tuple[int, ...]) -> bool:
        if len(node.args) != 2 or set(node.kwargs) - {"alpha"}:
            return False
        if "alpha" in node.kwargs:
            a = node.kwargs["alpha"]
            if node.op not in SCALED or not isinstance(a, S.Int | S.Float) or isinstance(a.value, str):
                return False
        return all(self.operand(a, shape) for a in node.args)

    def _cast(self, node: S.Node, shape: tuple[int, ...]) -> bool:
        if len(node.args) != 1:
            return False
        kw = node.kwargs
        dtype = kw.get("dtype")
        if not isinstance(dtype, S.DtypeArg) or dtype.name not in TILE_DTYPES:
            return False
        device, layout = kw.get("device", S.NoneArg()), kw.get("layout", S.NoneArg())
        pinned = kw.get("pin_memory", S.NoneArg())
        if not isinstance(device, S.NoneArg) and not (isinstance(device, S.DeviceArg)
                                                     and device.name == self.device):
            return False
        if not isinstance(layout, S.NoneArg) and not (isinstance(layout, S.LayoutArg)
                                                     and layout.name == "strided"):
            return False
        if not isinstance(pinned, S.NoneArg) and not (isinstance(pinned, S.Bool) and not pinned.value):
            return False
        if set(kw) - {"dtype", "device", "layout", "pin_memory", "non_blocking", "memory_format"}:
            return False
        # memory_format: only the stored value's layout counts
        return self.operand(node.args[0], shape, region_only=True)


def grow_epilogue(graph: S.Graph, start: int, domain: Domain, device: str, *,
                  bias: str | None = None, claimed: frozenset[int] = frozenset(),
                  uses: Mapping[str, Sequence[int]] | None = None) -> Epilogue | None:
    """The epilogue of the matmul at ``graph.nodes[start]``.

    ``bias`` is a tensor the matmul itself adds (``addmm``'s first argument); ``claimed``
    are node indices already in another template's epilogue; ``uses`` maps each value to
    the indices of the nodes reading it (computed when not given). Returns None when the
    matmul has no single live result or its bias cannot be read as an extra input.
    """
    node = graph.nodes[start]
    value = node.outputs[0]
    meta = graph.values[value]
    g = _Grower(graph, domain, device)
    shape = tuple(meta.sizes)  # type: ignore[arg-type]
    g.shapes[value] = shape
    if bias is not None and not g.extra(bias, shape):
        return None
    members: list[int] = []
    for j in range(start + 1, len(graph.nodes)):
        n = graph.nodes[j]
        if not any(r in g.shapes for r in node_inputs(n)):
            if mutates(n):
                break  # the template runs where the epilogue ends: nothing may write before it
            continue
        if j in claimed or not g.step(n):
            break
        members.append(j)
    return _cut(graph, start, value, members, g, domain, bias, uses)


def value_uses(graph: S.Graph) -> dict[str, list[int]]:
    """Each value's readers, as indices into ``graph.nodes``."""
    out: dict[str, list[int]] = {}
    for j, n in enumerate(graph.nodes):
        for r in node_inputs(n):
            out.setdefault(r, []).append(j)
    return out


def _cut(graph: S.Graph, start: int, value: str, members: list[int], g: _Grower, domain: Domain,
         bias: str | None, uses: Mapping[str, Sequence[int]] | None) -> Epilogue | None:
    """The longest prefix of the region whose only value read outside it is its last."""
    uses = value_uses(graph) if uses is None else uses
    outputs = {n for o in graph.outputs for n in tensor_refs([o.value])}
    for p in range(len(members), -1, -1):
        inside = {start, *members[:p]}
        produced = [value] + [graph.nodes[j].outputs[0] for j in members[:p]]
        last = produced[-1]
        live = {v for v in produced if v in outputs or any(u not in inside for u in uses.get(v, ()))}
        if live != {last}:
            continue
        meta = graph.values[last]
        strides = domain.strides_of(meta.sizes, meta.strides, meta.sizes)  # type: ignore[arg-type]
        if strides is None or meta.storage_offset != 0 or _broadcast_store(meta):
            continue
        return _lower(graph, start, tuple(members[:p]), g, bias, meta, strides)
    return None


def _broadcast_store(meta: S.TensorMeta) -> bool:
    # a stride-0 dim of size > 1 in the stored value would make tiles write the same memory
    return any(st == 0 and size != 1 for size, st in zip(meta.sizes, meta.strides, strict=True))


def _lower(graph: S.Graph, start: int, nodes: tuple[int, ...], g: _Grower, bias: str | None,
           meta: S.TensorMeta, strides: Strides3) -> Epilogue:
    """The kept region as one loop-IR value, lowered by the ordinary rules: the matmul's
    result is the accumulator (plus ``bias``), tensors from outside are the extras, numbered
    in order of first use."""
    from torchfuse.inductor.config import InductorConfig
    from torchfuse.inductor.lowering import Lowering, TensorValue, expr_of
    from torchfuse.inductor.rules import RULES

    region = {graph.nodes[start].outputs[0], *(graph.nodes[j].outputs[0] for j in nodes)}
    order = [bias] if bias is not None else []
    for j in nodes:
        order += [r for r in tensor_refs(list(graph.nodes[j].args)) if r not in region]
    extras = tuple(g.extras[name] for name in dict.fromkeys(order))
    index = {e.name: i for i, e in enumerate(extras)}
    L = Lowering(graph, InductorConfig())

    def tile(name: str, buffer: str) -> TensorValue:
        # every value of the region is read at the tile's own (batch, row, col): no index
        m = graph.values[name]
        load = ir.Load(buffer, sympy.Integer(0), "float32")
        return TensorValue(tuple(expr_of(s) for s in m.sizes), m.dtype, lambda idx: load)

    for e in extras:
        L.env[e.name] = tile(e.name, extra_name(index[e.name]))
    mm = graph.nodes[start].outputs[0]
    acc = tile(mm, ACC)
    ops: list[str] = []
    if bias is not None:
        plus = ir.Call(ir.VOp.ADD, (acc.loader(()), L.env[bias].loader(())), "float32")
        acc = TensorValue(acc.sizes, acc.dtype, lambda idx: plus)
        ops.append("add")
    L.env[mm] = acc
    for j in nodes:
        n = graph.nodes[j]
        L.env[n.outputs[0]] = RULES[n.op](L, n)
        if n.op not in RESHAPES | CASTS:
            ops.append(n.op.split(".")[1])
    value = L.env[graph.nodes[nodes[-1]].outputs[0] if nodes else mm]
    assert isinstance(value, TensorValue) and not L.nodes, "an epilogue rule made a buffer"
    return Epilogue(value.loader([sympy.Integer(0)] * len(value.sizes)), tuple(ops), extras, nodes,
                    graph.nodes[nodes[-1]].outputs[0] if nodes else mm, meta, strides)


__all__ = [
    "ACC", "BINARY", "CASTS", "EPILOGUE_OPS", "RESHAPES", "SCALED", "TILE_DTYPES", "UNARY", "Domain",
    "Epilogue", "Extra", "extra_name", "grow_epilogue", "mutates", "static_meta", "value_uses",
]
