"""2-D tiles for pointwise kernels whose memory accesses disagree in their fastest dimension.

A pointwise kernel loops in its output's memory order (`lowering.memory_order`), so its
store, and every load laid out like the output, is contiguous along the last loop dimension.
A load of a transposed input (``x.t() + y``, a channels-last conversion, a permute before a
matmul) is contiguous along another dimension: walked as one flat index, neighbouring lanes
read it a whole row apart, and each 4-byte element costs a 32-byte memory sector.

`plan_tile` finds such kernels and splits their loop dimensions in two, just after the
dimension the transposed access is contiguous along: ``ranges[:split]`` become the tile's rows
(``yindex``), ``ranges[split:]`` its columns (``xindex``). Each program computes one
``[YBLOCK, XBLOCK]`` block; the store walks ``xindex`` and the transposed load ``yindex``, each
along its own contiguous axis. Triton lays each access out by its own contiguity and converts
between the layouts through shared memory, so both sides are coalesced. Example, ``x.t() + y``
on 64x64 with ``x`` contiguous (the output takes ``x.t()``'s strides, so ``y`` is the
transposed side)::

    ranges (64, 64); store out[64*x0 + x1]; loads x[64*x0 + x1], y[x0 + 64*x1]
    1-D:  tl.load(in_ptr1 + ((xindex // 64) + 64*(xindex % 64)))     lanes 256 bytes apart
    tile: split 1, yindex = x0, xindex = x1
          tl.load(in_ptr1 + (yindex + 64*xindex), mask)               contiguous along yindex

How the split is chosen (TorchInductor's ``candidate_tilings`` weighs the same evidence):
each access that reads or writes memory votes for the split after its contiguous
dimension, weighted by its element size (stores twice: a write that misses coalescing costs a
read-modify-write of the sector). Accesses contiguous along the last dimension, and
broadcasts (no stride after the split: a bias along the rows), do not vote. A contiguous run
shorter than `MIN_RUN` elements gains nothing from a tile and does not vote either. Kernels
with no votes (every ordinary contiguous kernel) keep their 1-D form, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy
from torchfuse.graph.ops import to_dtype
from torchfuse.inductor import ir
from torchfuse.inductor.kernel_groups import RI, XI, GroupKind, KernelGroup, Placement, Role

MIN_RUN = 8
"""A transposed access must be contiguous over at least this many elements along the tile's
rows for a tile to pay off (8 fp32 values fill a 32-byte sector). A shorter run (NHWC to NCHW
with 3 channels reads runs of 3) gives Triton no contiguity to lay the access out by, and
the tile would only add the conversion between layouts."""


@dataclass(frozen=True, slots=True)
class Tile:
    """A pointwise kernel as ``ynumel x xnumel`` tiles: its loop dims split at ``split``."""

    split: int
    ynumel: sympy.Expr
    xnumel: sympy.Expr
    placements: tuple[tuple[str, Placement], ...]
    """Every node's loop variables in the tile's coordinates (``XI`` is ``yindex``, the rows;
    ``RI`` is ``xindex``, the columns)."""


def strides(index: sympy.Expr, nvars: int) -> list[sympy.Expr]:
    """How far ``index`` moves for one step of each loop variable ``x0 … x{n-1}``, taken at
    the origin (``(x1 // 4)*8`` moves 0 for ``x1``: divisions count as broadcasts there)."""
    xs = [ir.loop_var("x", i) for i in range(nvars)]
    zero = {x: sympy.Integer(0) for x in xs}
    base = index.xreplace(zero)
    return [sympy.expand(index.xreplace({**zero, x: sympy.Integer(1)}) - base) for x in xs]


def contiguous_dim(st: Sequence[sympy.Expr], ranges: Sequence[sympy.Expr]) -> int | None:
    """The last loop dim (of more than one element) an access steps by 1 along, or None."""
    found = None
    for d, (s, n) in enumerate(zip(st, ranges, strict=True)):
        if n != 1 and s == 1:
            found = d
    return found


def run_length(st: Sequence[sympy.Expr], ranges: Sequence[sympy.Expr], d: int,
               hint: Callable[[sympy.Expr], int]) -> int:
    """Elements an access covers in one contiguous run along the rows ``ranges[:d+1]``:
    ``d``'s extent, times the extents of the dims before it whose strides continue the run."""
    run, expect = hint(ranges[d]), sympy.expand(st[d] * ranges[d])
    for k in range(d - 1, -1, -1):
        if ranges[k] == 1:
            continue
        if sympy.expand(st[k] - expect) != 0:
            break
        run *= hint(ranges[k])
        expect = sympy.expand(expect * ranges[k])
    return run


def _accesses(group: KernelGroup, prog: ir.LoopProgram):
    """(index, bytes per element, is a store) of every memory access of ``group``."""
    members = {n.name for n in group.nodes}
    for node in group.nodes:
        assert isinstance(node, ir.Pointwise)
        for ld in ir.loads_of(node.body):
            if ld.buffer in members or ld.indirect:
                continue  # from registers; a gather's index has no stride to speak of
            yield ld.index, to_dtype(ld.dtype).itemsize, False
        if node.name in group.stores:
            yield node.store_index, to_dtype(prog.buffers[node.name].dtype).itemsize, True


def plan_tile(group: KernelGroup, prog: ir.LoopProgram, hint: Callable[[sympy.Expr], int]) -> Tile | None:
    """The 2-D tiling of a pointwise kernel with a transposed access, or None (1-D).

    ``hint(expr) -> int`` sizes a symbolic extent (a performance choice only: the split
    itself is exact for every size)."""
    if group.kind != GroupKind.POINTWISE or group.rnumel != 1:
        return None
    if not all(isinstance(n, ir.Pointwise) for n in group.nodes):
        return None
    shapes = {tuple(n.ranges) for n in group.nodes}
    if len(shapes) != 1:
        return None  # nodes over other shapes of the same size: their flat maps differ
    (ranges,) = shapes
    real = [d for d, n in enumerate(ranges) if n != 1]
    if len(real) < 2:
        return None
    last = real[-1]
    votes: dict[int, int] = {}
    for index, size, is_store in _accesses(group, prog):
        st = strides(index, len(ranges))
        d = contiguous_dim(st, ranges)
        if d is None or d == last:
            continue
        if all(s == 0 for s in st[d + 1:]):
            continue  # a broadcast along the columns (a bias per row), not a transpose
        if run_length(st, ranges, d, hint) < MIN_RUN:
            continue
        votes[d] = votes.get(d, 0) + size * (2 if is_store else 1)
    if not votes:
        return None
    d = max(votes, key=lambda k: (votes[k], -k))
    split = d + 1
    ynumel, xnumel = ir.product(ranges[:split]), ir.product(ranges[split:])
    rows, cols = ir.unflatten(XI, ranges[:split]), ir.unflatten(RI, ranges[split:])
    varmap = tuple(zip([ir.loop_var("x", i) for i in range(len(ranges))], rows + cols, strict=True))
    placements = tuple((n.name, Placement(Role.FULL, varmap)) for n in group.nodes)
    return Tile(split, ynumel, xnumel, placements)


def rows_transposed(group: KernelGroup, prog: ir.LoopProgram) -> bool:
    """True when a reduction kernel that walks its rows (not a column reduction, whose tiles
    are already wide) reads or writes an element-wise tensor contiguously *across* rows: a
    ``sum`` or ``softmax`` of a transposed input, a layer_norm over the channels of NCHW data.
    Such an access is coalesced only over the rows a program holds, so its configs take more
    rows per program (`codegen.KernelWriter.configs`)."""
    if group.kind not in (GroupKind.PERSISTENT, GroupKind.LOOPED) or group.outer:
        return False
    members = {n.name for n in group.nodes}
    bounds = {XI: group.xnumel, RI: group.rnumel}
    for node in group.nodes:
        p = group.placement(node.name)
        if p.role == Role.ROW or not isinstance(node, ir.Pointwise | ir.Reduction):
            continue
        indices = [ld.index for ld in ir.loads_of(node.body) if ld.buffer not in members and not ld.indirect]
        if node.name in group.stores and p.role == Role.FULL:
            indices.append(node.store_index)
        for index in indices:
            e = ir.simplify_index(ir.substitute(index, p.varmap), bounds)
            at = {XI: sympy.Integer(0), RI: sympy.Integer(0)}
            base = e.xreplace(at)
            dx = sympy.expand(e.xreplace({**at, XI: sympy.Integer(1)}) - base)
            dr = sympy.expand(e.xreplace({**at, RI: sympy.Integer(1)}) - base)
            if dx == 1 and dr != 0:
                return True
    return False
