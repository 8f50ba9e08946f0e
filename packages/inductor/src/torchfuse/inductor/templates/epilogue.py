"""Epilogues of matmul templates: the pointwise work applied to the accumulator tile.

An epilogue is the region of pointwise nodes that consume a matmul's result and can be
computed from the output tile alone, so that the template writes only the region's final
value. The op vocabulary is :class:`EOp` (one table, :data:`OPS`, maps graph op names into
it); rules test the property sets :data:`BINARY`, :data:`UNARY`, :data:`CASTS`,
:data:`RESHAPES`, never op names.

A region grows from the matmul in graph order and stops at the first node that reads a
region value but is not an epilogue op (a reduction, a view that moves elements, an op on
integers, a node with symbolic sizes ...). It is then cut back to the longest prefix whose
only value read outside it is its last one: an intermediate read by anything else (the
``x`` of ``y = relu(x); return x, y``) would otherwise have to be written too. Values
inside a region are never materialized; their shapes may differ from the matmul's only by
a row-major split of the rows (``view(mm, [b, t, n])``), so every one of them is indexed by
the same ``(batch, row, col)`` of the output tile. Tensors read from outside (a bias, a
residual) are *extra inputs*: anything that broadcasts to the tile, addressed with its own
strides over ``(batch, row, col)`` (0 where it is broadcast).

Example (``F.gelu(x @ w.t() + b)`` after decomposition)::

    mm = aten.mm(x, t);  add = aten.add.Tensor(mm, b);  mul = aten.mul.Scalar(add, 0.5)
    mul_1 = aten.mul.Scalar(add, 0.7071);  erf = aten.erf(mul_1)
    add_1 = aten.add.Scalar(erf, 1.0);  mul_2 = aten.mul.Tensor(mul, add_1)

becomes the epilogue (``x0`` is ``b`` read with strides ``(0, 0, 1)``)::

    v0 = acc + x0;  v1 = v0 * 0.5;  v2 = v0 * 0.7071;  v3 = tl.erf(v2)
    v4 = v3 + 1.0;  v5 = v1 * v4                       -> stored as mul_2
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchfuse.graph import schema as S
from torchfuse.graph.ops import UnknownOpError, node_inputs, resolve_op, tensor_refs
from torchfuse.graph.tracing import mutated_arguments


class EOp(enum.Enum):
    """The ops an epilogue computes (all in float32 on the tile)."""

    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()
    NEG = enum.auto()
    RELU = enum.auto()
    SIGMOID = enum.auto()
    TANH = enum.auto()
    ERF = enum.auto()
    EXP = enum.auto()
    SILU = enum.auto()
    GELU = enum.auto()
    CONVERT = enum.auto()
    VIEW = enum.auto()


BINARY = frozenset({EOp.ADD, EOp.SUB, EOp.MUL, EOp.DIV})
"""Two operands, tensors or scalars, broadcast to the output."""
SCALED = frozenset({EOp.ADD, EOp.SUB})
"""Binary ops with an ``alpha`` multiplying their second operand."""
UNARY = frozenset({EOp.NEG, EOp.RELU, EOp.SIGMOID, EOp.TANH, EOp.ERF, EOp.EXP, EOp.SILU, EOp.GELU})
CASTS = frozenset({EOp.CONVERT})
"""A dtype conversion (``_to_copy`` with a dtype and nothing that moves the data)."""
RESHAPES = frozenset({EOp.VIEW})
"""A row-major reshape that keeps the last dimension: the same elements, the same tile."""

OPS: Mapping[str, EOp] = {
    "aten.add.Tensor": EOp.ADD,
    "aten.add.Scalar": EOp.ADD,
    "aten.sub.Tensor": EOp.SUB,
    "aten.sub.Scalar": EOp.SUB,
    "aten.mul.Tensor": EOp.MUL,
    "aten.mul.Scalar": EOp.MUL,
    "aten.div.Tensor": EOp.DIV,
    "aten.div.Scalar": EOp.DIV,
    "aten.neg.default": EOp.NEG,
    "aten.relu.default": EOp.RELU,
    "aten.sigmoid.default": EOp.SIGMOID,
    "aten.tanh.default": EOp.TANH,
    "aten.erf.default": EOp.ERF,
    "aten.exp.default": EOp.EXP,
    "aten.silu.default": EOp.SILU,
    "aten.gelu.default": EOp.GELU,
    "aten._to_copy.default": EOp.CONVERT,
    "aten.view.default": EOp.VIEW,
    "aten._unsafe_view.default": EOp.VIEW,
    "aten.reshape.default": EOp.VIEW,
}
"""Graph op names an epilogue accepts, and what each computes."""

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32"})
"""Dtypes of every value an epilogue reads or makes (it computes in float32)."""


# ----------------------------------------------------------------------------- the epilogue IR


@dataclass(frozen=True, slots=True)
class Acc:
    """The matmul's float32 accumulator tile."""


@dataclass(frozen=True, slots=True)
class Val:
    """The result of epilogue step ``index``."""

    index: int


@dataclass(frozen=True, slots=True)
class Ext:
    """Extra input ``index`` (:attr:`Epilogue.extras`), loaded at the tile's indices."""

    index: int


@dataclass(frozen=True, slots=True)
class Const:
    """A Python scalar of the graph."""

    value: float


Operand = Acc | Val | Ext | Const


@dataclass(frozen=True, slots=True)
class Step:
    """One epilogue op; ``value`` names the graph value it computes."""

    op: EOp
    args: tuple[Operand, ...]
    value: str
    alpha: float = 1.0
    dtype: str = ""
    """Target dtype of a :data:`CASTS` op."""
    approximate: str = "none"
    """``gelu``'s form: ``none`` (erf) or ``tanh``."""


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
    """The steps after the matmul, the graph nodes they replace and the value they store."""

    steps: tuple[Step, ...]
    extras: tuple[Extra, ...]
    nodes: tuple[int, ...]
    """Indices (in ``graph.nodes``) of the nodes the steps come from."""
    out: str
    """The graph value the template produces (the matmul's own when there are no steps)."""
    out_meta: S.TensorMeta
    out_strides: Strides3

    def signature(self) -> str:
        """A stable text of what the epilogue computes (for decision-cache keys and logs)."""
        parts = []
        for s in self.steps:
            args = ",".join(operand_text(a) for a in s.args)
            extra = (f"*{s.alpha:g}" if s.alpha != 1.0 else "") + (f":{s.dtype}" if s.dtype else "")
            extra += f":{s.approximate}" if s.op is EOp.GELU else ""
            parts.append(f"{s.op.name.lower()}({args}){extra}")
        extras = ";".join(f"x{i}:{e.dtype}{list(e.strides)}" for i, e in enumerate(self.extras))
        return f"{'>'.join(parts) or 'none'}|{extras}|out:{self.out_meta.dtype}{list(self.out_strides)}"

    def summary(self) -> str:
        """``+add+relu`` style, for log lines."""
        return "".join(f"+{s.op.name.lower()}" for s in self.steps if s.op not in RESHAPES)


def operand_text(a: Operand) -> str:
    """An operand as the epilogue's Triton text names it: ``acc``, ``v<i>``, ``x<i>`` or a literal."""
    if isinstance(a, Acc):
        return "acc"
    if isinstance(a, Val):
        return f"v{a.index}"
    if isinstance(a, Ext):
        return f"x{a.index}"
    return repr(a.value)


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
        domain :meth:`holds`), or None when it does not broadcast or its row dims do not
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
    """Turns graph nodes into epilogue steps (one :meth:`step` per node, or None)."""

    def __init__(self, graph: S.Graph, domain: Domain, device: str) -> None:
        self.graph = graph
        self.domain = domain
        self.device = device
        self.region: dict[str, Operand] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.extras: dict[str, Extra] = {}

    def extra(self, name: str, shape: tuple[int, ...]) -> Ext | None:
        meta = self.graph.values.get(name)
        if not static_meta(meta) or meta.dtype not in FLOAT_DTYPES or meta.device != self.device:
            return None
        strides = self.domain.strides_of(meta.sizes, meta.strides, shape)  # type: ignore[arg-type]
        if strides is None:
            return None
        known = self.extras.get(name)
        if known is not None and known.strides != strides:
            return None  # one extra, one addressing: the same tensor broadcast two ways is rare
        self.extras[name] = Extra(name, meta.dtype, strides)
        return Ext(list(self.extras).index(name))

    def operand(self, a: S.Argument, shape: tuple[int, ...]) -> Operand | None:
        if isinstance(a, S.TensorRef):
            if a.name in self.region:
                # region values are tiles of this very shape; a broadcast one would repeat rows
                return self.region[a.name] if self.shapes[a.name] == shape else None
            return self.extra(a.name, shape)
        if isinstance(a, S.Int | S.Float) and not isinstance(a.value, str) and math.isfinite(a.value):
            return Const(float(a.value))
        return None

    def step(self, node: S.Node) -> Step | None:
        op = OPS.get(node.op)
        if op is None or len(node.outputs) != 1:
            return None
        out = node.outputs[0]
        meta = self.graph.values.get(out)
        if (not static_meta(meta) or meta.dtype not in FLOAT_DTYPES or meta.requires_grad
                or meta.device != self.device or not self.domain.holds(meta.sizes)):
            return None
        shape = tuple(meta.sizes)  # type: ignore[arg-type]
        if op in BINARY:
            return self._binary(op, node, shape, out)
        if op in UNARY:
            return self._unary(op, node, shape, out)
        if op in CASTS:
            return self._cast(op, node, shape, out)
        if op in RESHAPES:
            first = node.args[0] if node.args else None
            if isinstance(first, S.TensorRef) and first.name in self.region:
                return Step(op, (self.region[first.name],), out)
            return None
        raise AssertionError(f"epilogue op {op} has no rule")

    def _binary(self, op: EOp, node: S.Node, shape: tuple[int, ...], out: str) -> Step | None:
        if len(node.args) != 2 or set(node.kwargs) - {"alpha"}:
            return None
        alpha = 1.0
        if "alpha" in node.kwargs:
            a = node.kwargs["alpha"]
            if op not in SCALED or not isinstance(a, S.Int | S.Float) or isinstance(a.value, str):
                return None
            alpha = float(a.value)
        args = tuple(self.operand(a, shape) for a in node.args)
        if any(a is None for a in args):
            return None
        return Step(op, args, out, alpha=alpha)  # type: ignore[arg-type]

    def _unary(self, op: EOp, node: S.Node, shape: tuple[int, ...], out: str) -> Step | None:
        approximate = "none"
        if op is EOp.GELU:
            if len(node.args) > 2 or set(node.kwargs) - {"approximate"}:
                return None
            a = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else S.Str("none"))
            if not isinstance(a, S.Str) or a.value not in ("none", "tanh"):
                return None
            approximate = a.value
        elif len(node.args) != 1 or node.kwargs:
            return None
        x = self.operand(node.args[0], shape)
        if not isinstance(x, Acc | Val):
            return None
        return Step(op, (x,), out, approximate=approximate)

    def _cast(self, op: EOp, node: S.Node, shape: tuple[int, ...], out: str) -> Step | None:
        if len(node.args) != 1:
            return None
        kw = node.kwargs
        dtype = kw.get("dtype")
        if not isinstance(dtype, S.DtypeArg) or dtype.name not in FLOAT_DTYPES:
            return None
        device, layout = kw.get("device", S.NoneArg()), kw.get("layout", S.NoneArg())
        pinned = kw.get("pin_memory", S.NoneArg())
        if not isinstance(device, S.NoneArg) and not (isinstance(device, S.DeviceArg)
                                                     and device.name == self.device):
            return None
        if not isinstance(layout, S.NoneArg) and not (isinstance(layout, S.LayoutArg)
                                                     and layout.name == "strided"):
            return None
        if not isinstance(pinned, S.NoneArg) and not (isinstance(pinned, S.Bool) and not pinned.value):
            return None
        if set(kw) - {"dtype", "device", "layout", "pin_memory", "non_blocking", "memory_format"}:
            return None
        x = self.operand(node.args[0], shape)  # memory_format: only the stored value's layout counts
        if not isinstance(x, Acc | Val):
            return None
        return Step(op, (x,), out, dtype=dtype.name)

    def add(self, step: Step, shape: tuple[int, ...], index: int) -> None:
        self.region[step.value] = Val(index)
        self.shapes[step.value] = shape


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
    steps: list[Step] = []
    shape = tuple(meta.sizes)  # type: ignore[arg-type]
    g.region[value] = Acc()
    g.shapes[value] = shape
    if bias is not None:
        ext = g.extra(bias, shape)
        if ext is None:
            return None
        steps.append(Step(EOp.ADD, (Acc(), ext), value))
        g.region[value] = Val(0)
    members: list[int] = []
    for j in range(start + 1, len(graph.nodes)):
        n = graph.nodes[j]
        if not any(r in g.region for r in node_inputs(n)):
            if mutates(n):
                break  # the template runs where the epilogue ends: nothing may write before it
            continue
        if j in claimed:
            break
        step = g.step(n)
        if step is None:
            break
        steps.append(step)
        members.append(j)
        g.add(step, tuple(graph.values[step.value].sizes), len(steps) - 1)  # type: ignore[arg-type]
    return _cut(graph, start, value, steps, members, g, domain, uses)


def value_uses(graph: S.Graph) -> dict[str, list[int]]:
    """Each value's readers, as indices into ``graph.nodes``."""
    out: dict[str, list[int]] = {}
    for j, n in enumerate(graph.nodes):
        for r in node_inputs(n):
            out.setdefault(r, []).append(j)
    return out


def _cut(graph: S.Graph, start: int, value: str, steps: list[Step], members: list[int],
         g: _Grower, domain: Domain, uses: Mapping[str, Sequence[int]] | None) -> Epilogue | None:
    """The longest prefix of the region whose only value read outside it is its last."""
    uses = value_uses(graph) if uses is None else uses
    outputs = {n for o in graph.outputs for n in tensor_refs([o.value])}
    fixed = len(steps) - len(members)  # steps of the matmul itself (addmm's bias)
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
        kept = steps[:fixed + p]
        return _renumber_extras(kept, g, tuple(members[:p]), last, meta, strides)
    return None


def _broadcast_store(meta: S.TensorMeta) -> bool:
    # a stride-0 dim of size > 1 in the stored value would make tiles write the same memory
    return any(st == 0 and size != 1 for size, st in zip(meta.sizes, meta.strides, strict=True))


def _renumber_extras(steps: list[Step], g: _Grower, nodes: tuple[int, ...], out: str,
                     meta: S.TensorMeta, strides: Strides3) -> Epilogue:
    """Keep only the extras the kept steps read, numbered in order of first use."""
    order: dict[int, int] = {}
    for s in steps:
        for a in s.args:
            if isinstance(a, Ext) and a.index not in order:
                order[a.index] = len(order)
    every = list(g.extras.values())
    new_steps = tuple(
        Step(s.op, tuple(Ext(order[a.index]) if isinstance(a, Ext) else a for a in s.args), s.value,
             s.alpha, s.dtype, s.approximate)
        for s in steps
    )
    extras = tuple(every[i] for i in sorted(order, key=order.__getitem__))
    return Epilogue(new_steps, extras, nodes, out, meta, strides)


__all__ = [
    "BINARY", "CASTS", "FLOAT_DTYPES", "OPS", "RESHAPES", "SCALED", "UNARY", "Acc", "Const", "Domain", "EOp",
    "Epilogue", "Ext", "Extra", "Operand", "Step", "Val", "grow_epilogue", "mutates", "operand_text",
    "static_meta", "value_uses",
]
