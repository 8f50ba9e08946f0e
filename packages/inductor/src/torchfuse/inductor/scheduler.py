"""Scheduling and fusion: which loop-IR nodes share a kernel, and in what order kernels run.

A kernel iterates over a *domain* ``(xnumel, rnumel)``: pointwise kernels have
``rnumel == 1``; reduction kernels compute rows of ``rnumel`` elements. Each node in a
kernel has a *role*: ``FULL`` (one value per ``(x, r)`` point: pointwise nodes of
``xnumel*rnumel`` elements and the bodies of reductions), ``ROW`` (one value per ``x``:
pointwise epilogues of reductions) or ``REDUCE`` (a reduction; its result is per row).

Fusion is greedy over nodes in program order. A node joins an existing kernel when

* its sizes fit the kernel's domain (a pointwise kernel grows into a reduction domain when
  a reduction over its elements, or over its rows, joins);
* every value it reads from the kernel is read at exactly the point where it is computed
  (the index expressions, rewritten in kernel coordinates, are equal), so it can be taken
  from registers -- this is checked, never assumed;
* no cycle appears between kernels, the kernel stays under ``max_fusion_size`` nodes and
  ``max_kernel_reductions`` reductions, and a looped reduction needs at most
  ``max_loop_phases`` passes;
* it saves memory traffic (the cost model: bytes of reads shared with the kernel).

With symbolic sizes (``s0``) every "same domain" and "same point" question above is sympy
equality, never a comparison of hints; a reduction is persistent only when its row has an
upper bound that fits, and a looped one over a row as short as its hint keeps a persistent
path for such rows (``KernelGroup.fits``). The rules: [`torchfuse.inductor.sizes`][torchfuse.inductor.sizes].

Example, ``softmax`` over rows of 8: ``amax`` (REDUCE), ``exp(x - amax)`` (FULL), ``sum``
(REDUCE), ``exp / sum`` (FULL) all land in one kernel over domain ``(rows, 8)``; only the
last value is stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sympy
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.kernel_groups import (
    KERNEL_KINDS,
    RI,
    XI,
    GroupKind,
    KernelGroup,
    Placement,
    Role,
    Schedule,
)
from torchfuse.inductor.sizes import size_info

log = logging.getLogger("torchfuse.inductor.schedule")


@dataclass(slots=True)
class _Group:
    """A kernel while the scheduler builds it."""

    kind: GroupKind
    nodes: list[ir.Node]
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    placed: dict[str, Placement]


@dataclass(frozen=True, slots=True)
class Fit:
    """A node fits a kernel: the bytes of reads it shares with it, and the kernel after."""

    shared: int
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    placed: dict[str, Placement]


@dataclass(frozen=True, slots=True)
class Reject:
    """A node does not fit a kernel, and why."""

    reason: str


def _numels(node: ir.Node) -> tuple[sympy.Expr, sympy.Expr]:
    if isinstance(node, ir.Reduction):
        return ir.product(node.ranges), ir.product(node.rranges)
    assert isinstance(node, ir.Pointwise)
    return ir.product(node.ranges), sympy.Integer(1)


def _eq(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


def _vars(prefix: str, n: int) -> list[sympy.Symbol]:
    return [ir.loop_var(prefix, i) for i in range(n)]


def _reductions(nodes: list[ir.Node]) -> int:
    return sum(isinstance(n, ir.Reduction) for n in nodes)


def _varmap(node: ir.Node, role: Role, xnumel: sympy.Expr, rnumel: sympy.Expr):
    if isinstance(node, ir.Reduction):
        xs = ir.unflatten(XI, node.ranges) if node.ranges else []
        rs = ir.unflatten(RI, node.rranges)
        return tuple(zip(_vars("x", len(node.ranges)), xs, strict=True)) + tuple(
            zip(_vars("r", len(node.rranges)), rs, strict=True)
        )
    assert isinstance(node, ir.Pointwise)
    ranges = list(node.ranges)
    xs_syms = _vars("x", len(ranges))
    if role == Role.ROW or rnumel == 1:
        return tuple(zip(xs_syms, ir.unflatten(XI, ranges) if ranges else [], strict=True))
    acc = sympy.Integer(1)
    for i in range(len(ranges) + 1):  # a split point: leading dims are rows, the rest is r
        if _eq(acc, xnumel) and _eq(ir.product(ranges[i:]), rnumel):
            coords = (ir.unflatten(XI, ranges[:i]) if i else []) + (
                ir.unflatten(RI, ranges[i:]) if i < len(ranges) else []
            )
            return tuple(zip(xs_syms, coords, strict=True))
        if i < len(ranges):
            acc = acc * ranges[i]
    return tuple(zip(xs_syms, ir.unflatten(XI * rnumel + RI, ranges), strict=True))


def _role(node: ir.Node, xnumel, rnumel) -> Role | None:
    nx, nr = _numels(node)
    if isinstance(node, ir.Reduction):
        return Role.REDUCE if _eq(nx, xnumel) and _eq(nr, rnumel) else None
    if _eq(nx, xnumel * rnumel):
        return Role.FULL
    if _eq(nx, xnumel):
        return Role.ROW
    return None


class _Builder:
    def __init__(self, prog: ir.LoopProgram, config: InductorConfig) -> None:
        self.prog = prog
        self.config = config
        self.sizes = size_info(tuple(prog.symbols))
        # A node's variable map and its indices under that map depend only on (node, role,
        # domain); `place` checks every candidate kernel again from its first node, so a
        # model's schedule asked sympy for the same substitution and simplification many
        # times over (GPT-2 training: the larger part of `schedule`).
        self._maps: dict[tuple[Any, ...], dict] = {}
        self._indices: dict[tuple[Any, ...], sympy.Expr] = {}
        # what a node reads, asked for each candidate kernel of each later node: walked once
        self._read_memo: dict[int, tuple[ir.Node, list[str], list[ir.Load]]] = {}
        # a buffer's bytes, asked for by every fusion candidate and every step of `order`
        self._bytes: dict[str, int] = {}
        self.producer: dict[str, int] = {}  # buffer -> group index
        self.groups: list[_Group] = []
        self.decisions: list[str] = []
        self.group_deps: list[set[int]] = []
        self.readers: dict[str, set[int]] = {}  # buffer -> groups reading it
        self.consumers: dict[str, set[str]] = {}
        for node in prog.nodes:
            for b in self._reads(node):
                self.consumers.setdefault(b, set()).add(node.name)

    def _walked(self, node: ir.Node) -> tuple[ir.Node, list[str], list[ir.Load]]:
        found = self._read_memo.get(id(node))
        if found is None or found[0] is not node:  # the node is kept: its id stays its own
            loads = ir.loads_of(node.body) if isinstance(node, ir.Pointwise | ir.Reduction) else []
            found = self._read_memo[id(node)] = (node, ir.reads(node), loads)
        return found

    def _reads(self, node: ir.Node) -> list[str]:
        """`ir.reads`, remembered."""
        return self._walked(node)[1]

    def _loads(self, node: ir.Node) -> list[ir.Load]:
        """`ir.loads_of` of the node's body, remembered."""
        return self._walked(node)[2]

    def bytes_of(self, buf: str) -> int:
        if buf in self._bytes:
            return self._bytes[buf]
        spec = self.prog.buffers.get(buf)
        if spec is None:
            return 0
        from torchfuse.graph.ops import to_dtype

        # a cost, not a correctness question: symbolic sizes count with their hints
        self._bytes[buf] = n = self.sizes.hint(ir.product(spec.sizes)) * to_dtype(spec.dtype).itemsize
        return n

    def deps(self, gi: int) -> set[int]:
        return self.group_deps[gi]

    def _record(self, gi: int, node: ir.Node) -> None:
        """Book-keeping after ``node`` joined group ``gi``."""
        for b in ir.writes(node):
            self.producer[b] = gi
        for b in self._reads(node):
            self.readers.setdefault(b, set()).add(gi)
            h = self.producer.get(b)
            if h is not None and h != gi:
                self.group_deps[gi].add(h)

    def reaches(self, src: int, dst: int) -> bool:
        """True when ``dst`` is ``src`` or a (transitive) dependency of ``src``."""
        return self.reaches_any([src], dst)

    def reaches_any(self, srcs: list[int], dst: int) -> bool:
        """`reaches` for any of ``srcs``, in one walk (the kernels seen from one are not
        walked again from the next)."""
        seen, stack = set(), list(srcs)
        while stack:
            g = stack.pop()
            if g == dst:
                return True
            if g in seen:
                continue
            seen.add(g)
            stack.extend(self.deps(g))
        return False

    # -- validation of a candidate kernel
    def place(self, nodes: list[ir.Node], xnumel, rnumel) -> dict[str, Placement] | Reject:
        """Every node's placement in a kernel over ``(xnumel, rnumel)``, or why there is none."""
        roles: dict[str, Role] = {}
        maps: dict[str, dict] = {}
        for n in nodes:
            role = _role(n, xnumel, rnumel)
            if role is None:
                nx, nr = _numels(n)
                return Reject(f"{n.name} ({ir.text(nx)} x {ir.text(nr)}) fits neither the domain "
                              f"{ir.text(xnumel)} x {ir.text(rnumel)} nor its rows")
            roles[n.name] = role
            maps[n.name] = self._varmap(n, role, xnumel, rnumel)
        bounds = {XI: xnumel, RI: rnumel}
        at = self._at
        by_name = {n.name: n for n in nodes}
        phase: dict[str, int] = {}
        online: dict[str, str] = {}
        for n in nodes:
            ctx_full = roles[n.name] != Role.ROW
            p = 0 if ctx_full else -1
            for ld in self._loads(n):
                prod = by_name.get(ld.buffer)
                if prod is None:
                    continue
                if ld.indirect or ld.mask is not None:
                    return Reject(f"{n.name} reads {prod.name} through an indirect or masked load")
                if roles[prod.name] == Role.FULL and not ctx_full:
                    return Reject(f"{n.name} (one value per row) reads {prod.name} (one per element)")
                lhs = at(ld.index, n.name, maps, bounds)
                rhs = at(prod.store_index, prod.name, maps, bounds)
                if lhs != rhs:
                    return Reject(f"{n.name} reads {prod.name} at {ir.text(lhs)}, "
                                  f"where it is computed at {ir.text(rhs)}")
                pp = phase[prod.name]
                if roles[prod.name] == Role.FULL:
                    p = max(p, pp)
                elif ctx_full:
                    p = max(p, pp + 1)
                else:
                    p = max(p, pp)
            if isinstance(n, ir.Reduction) and n.reduce == ir.ReduceOp.SUM:
                partner = self._online_partner(n, nodes, roles, maps, bounds)
                if partner is not None and partner not in online.values():
                    online[n.name] = partner
                    p = phase[partner]
            phase[n.name] = p
        return {
            n.name: Placement(roles[n.name], tuple(maps[n.name].items()), phase[n.name], online.get(n.name))
            for n in nodes
        }

    def _varmap(self, node: ir.Node, role: Role, xnumel: sympy.Expr, rnumel: sympy.Expr) -> dict:
        key = (node.name, node.ranges, getattr(node, "rranges", ()), role, xnumel, rnumel)
        found = self._maps.get(key)
        if found is None:
            found = self._maps[key] = dict(_varmap(node, role, xnumel, rnumel))
        return found

    def _at(self, index: sympy.Expr, owner: str, maps: dict, bounds: dict) -> sympy.Expr:
        """``index`` of node ``owner`` in the kernel's variables, simplified (remembered). The
        map is one of `_varmap`'s, kept alive by its cache: its identity names it."""
        key = (index, id(maps[owner]), bounds[XI], bounds[RI])
        found = self._indices.get(key)
        if found is None:
            found = self._indices[key] = ir.simplify_index(index.xreplace(maps[owner]), bounds)
        return found

    def _online_partner(self, s_node, nodes, roles, maps, bounds) -> str | None:
        """The max reduction ``m`` when ``s_node`` is ``sum(exp(v - m))`` with ``m = max(v)``."""
        by_name = {n.name: n for n in nodes}

        def norm(v: ir.Value, owner: str) -> ir.Value:
            if isinstance(v, ir.Load):
                prod = by_name.get(v.buffer)
                if prod is not None and isinstance(prod, ir.Pointwise) and roles[prod.name] == Role.FULL:
                    return norm(prod.body, prod.name)
                idx = self._at(v.index, owner, maps, bounds)
                mask = norm(v.mask, owner) if v.mask is not None else None
                ind = tuple((k, norm(x, owner)) for k, x in v.indirect)
                return ir.Load(v.buffer, idx, v.dtype, ind, mask)
            if isinstance(v, ir.Cast):
                return ir.Cast(norm(v.arg, owner), v.dtype)
            if isinstance(v, ir.Call):
                return ir.Call(v.op, tuple(norm(a, owner) for a in v.args), v.dtype)
            if isinstance(v, ir.IndexValue):
                return ir.IndexValue(self._at(v.index, owner, maps, bounds), v.dtype)
            return v

        def top(v: ir.Value) -> ir.Value:
            # what `norm` puts at the top of ``v``: loads of inlined producers followed
            while isinstance(v, ir.Load):
                prod = by_name.get(v.buffer)
                if prod is None or not isinstance(prod, ir.Pointwise) or roles[prod.name] != Role.FULL:
                    break
                v = prod.body
            return v

        # the shape is read on the tops alone (what `norm` would put there), so that a sum that
        # is no softmax, most of them, is never rebuilt: rebuilding every sum's body was most
        # of `place`'s time (OPT training: 1.4k calls); only the last test needs `norm`
        t = top(s_node.body)
        if not (isinstance(t, ir.Call) and t.op == ir.VOp.EXP):
            return None
        t = top(t.args[0])
        if not (isinstance(t, ir.Call) and t.op == ir.VOp.SUB):
            return None
        t = top(t.args[1])
        if not isinstance(t, ir.Load):
            return None
        m = by_name.get(t.buffer)
        if not (isinstance(m, ir.Reduction) and m.reduce == ir.ReduceOp.MAX) or m.dtype != "float32":
            return None
        inner = norm(s_node.body, s_node.name).args[0]  # exp(v - m), normalized: v - m
        return m.name if norm(m.body, m.name) == inner.args[0] else None

    def try_add(self, gi: int, node: ir.Node) -> Fit | Reject:
        g = self.groups[gi]
        if g.kind not in KERNEL_KINDS:
            return Reject(f"it is an {g.kind.value} call")
        if len(g.nodes) >= self.config.max_fusion_size:
            return Reject(f"it has max_fusion_size={self.config.max_fusion_size} nodes")
        if isinstance(node, ir.Reduction) and _reductions(g.nodes) >= self.config.max_kernel_reductions:
            return Reject(f"it has max_kernel_reductions={self.config.max_kernel_reductions} reductions")
        shared = 0
        produced = {m.name for m in g.nodes}
        group_reads = {b for m in g.nodes for b in self._reads(m)}
        for b in self._reads(node):
            if b in produced or b in group_reads:
                shared += self.bytes_of(b)
        if shared == 0:
            return Reject("no bytes are shared")
        for b in self._reads(node):
            h = self.producer.get(b)
            if h is not None and h != gi and self.reaches(h, gi):
                return Reject(f"{b} comes from {self.label(h)}, which needs this kernel first: a cycle")
        X, R = g.xnumel, g.rnumel
        nx, nr = _numels(node)
        if isinstance(node, ir.Reduction) and R == 1:
            if not (_eq(X, nx * nr) or _eq(X, nx)):
                return Reject(f"a reduction of {ir.text(nx)} x {ir.text(nr)} covers neither its {ir.text(X)} "
                              "elements nor its rows")
            X, R = nx, nr
        placed = self.place([*g.nodes, node], X, R)
        if isinstance(placed, Reject):
            return placed
        if R != 1 and not self._persistent(R):
            phases = max(p.phase for p in placed.values()) + 1
            if phases > self.config.max_loop_phases:
                return Reject(f"{phases} passes over the row (max_loop_phases={self.config.max_loop_phases})")
        return Fit(shared, X, R, placed)

    def _persistent(self, rnumel) -> bool:
        # the whole row sits in registers: it needs a bound on the longest row (see .sizes)
        ub = self.sizes.upper(rnumel)
        return ub is not None and ub <= self.config.persistent_rnumel_max

    def new_group(self, node: ir.Node) -> None:
        if isinstance(node, ir.Extern | ir.View):
            kind = GroupKind.EXTERN if isinstance(node, ir.Extern) else GroupKind.VIEW
            X, R = sympy.Integer(1), sympy.Integer(1)
        else:
            X, R = _numels(node)
            kind = GroupKind.POINTWISE
        placed = self.place([node], X, R) if kind == GroupKind.POINTWISE else {}
        assert not isinstance(placed, Reject), placed  # a node alone always places
        self.groups.append(_Group(kind, [node], X, R, placed))
        self.group_deps.append(set())
        self._record(len(self.groups) - 1, node)

    def run(self) -> Schedule:
        for node in self.prog.nodes:
            best: tuple[int, Fit] | None = None
            if isinstance(node, ir.Pointwise | ir.Reduction):
                # only kernels that produce or read what this node reads can save traffic
                cands: set[int] = set()
                for b in self._reads(node):
                    cands.update(self.readers.get(b, ()))
                    if b in self.producer:
                        cands.add(self.producer[b])
                for gi in sorted(cands):
                    res = self.try_add(gi, node)
                    if isinstance(res, Reject):
                        self.decide(f"{node.name} not fused into {self.label(gi)}: {res.reason}")
                    elif best is None or res.shared > best[1].shared:
                        best = (gi, res)
            if best is None:
                self.new_group(node)
                continue
            gi, fit = best
            g = self.groups[gi]
            g.nodes.append(node)
            g.xnumel, g.rnumel, g.placed = fit.xnumel, fit.rnumel, fit.placed
            self._record(gi, node)
            self.decide(f"{node.name} fused into {self.label(gi)} "
                        f"(domain {ir.text(fit.xnumel)} x {ir.text(fit.rnumel)}, {fit.shared} bytes shared)")
        self.merge()
        if self.config.pointwise_rows:
            self.split_rows(self.config.pointwise_rows)
        return Schedule(self.finish(self.order()), tuple(self.decisions))

    def label(self, gi: int) -> str:
        """A kernel named by its first node (kernel numbers change when kernels are ordered)."""
        return f"the kernel of {self.groups[gi].nodes[0].name}"

    def decide(self, text: str) -> None:
        """Record one fusion decision."""
        self.decisions.append(text)
        log.debug("%s", text)

    def split_rows(self, min_row: int) -> None:
        """Pointwise kernels over long rows whose length is not a power of two become row x
        chunk kernels (``InductorConfig.pointwise_rows``): ``xnumel`` the rows, ``rnumel`` the
        row length, so indices are ``row * stride + col`` instead of divisions of a flat index."""
        for g in self.groups:
            if g.kind != GroupKind.POINTWISE or g.rnumel != 1:
                continue
            shapes = {tuple(n.ranges) for n in g.nodes}
            if len(shapes) != 1:
                continue
            (ranges,) = shapes
            row = ranges[-1] if len(ranges) >= 2 else None
            if row is None or not row.is_Integer or int(row) < min_row or int(row) & (int(row) - 1) == 0:
                continue
            rows = ir.product(ranges[:-1])
            placed = self.place(g.nodes, rows, row)
            if isinstance(placed, Reject):
                continue
            g.xnumel, g.rnumel, g.placed = rows, row, placed
            log.debug("kernel of %s: rows x chunks (%s x %s)", g.nodes[0].name, rows, row)

    def merge(self) -> None:
        """A second chance for reduction kernels the greedy pass kept apart because neither
        shared anything when it was made: in a layer_norm backward ``sum(g * w)`` per row is
        met before the row statistics of ``x``, so it started its own kernel and ``g`` was
        read twice. Kernels over the same rows that share reads (or feed one another) are
        merged when the result still places, stays acyclic and within the limits."""
        order = {n.name: i for i, n in enumerate(self.prog.nodes)}
        changed = True
        while changed:
            changed = False
            by_domain: dict[tuple, list[int]] = {}
            for i, g in enumerate(self.groups):
                if g.nodes and g.kind in KERNEL_KINDS and g.rnumel != 1:
                    by_domain.setdefault((g.xnumel, g.rnumel), []).append(i)
            for live in by_domain.values():
                for a in live:
                    for b in live:
                        if b <= a or not self.groups[a].nodes or not self.groups[b].nodes:
                            continue
                        res = self._try_merge(a, b, order)
                        if res is None:
                            changed = True
                        elif res.reason:
                            self.decide(f"{self.label(b)} not merged into {self.label(a)}: {res.reason}")

    def _try_merge(self, a: int, b: int, order: dict[str, int]) -> Reject | None:
        """Merge kernel ``b`` into kernel ``a``; None when done, else why not (an empty
        reason: the two were never candidates)."""
        ga, gb = self.groups[a], self.groups[b]
        into, merged = self.label(a), self.label(b)
        X, R = ga.xnumel, ga.rnumel
        if R == 1 or not (_eq(X, gb.xnumel) and _eq(R, gb.rnumel)):
            return Reject("")
        if len(ga.nodes) + len(gb.nodes) > self.config.max_fusion_size:
            return Reject(f"together over max_fusion_size={self.config.max_fusion_size} nodes")
        if _reductions(ga.nodes) + _reductions(gb.nodes) > self.config.max_kernel_reductions:
            return Reject(f"together over max_kernel_reductions={self.config.max_kernel_reductions} "
                          "reductions")
        reads_a = {x for m in ga.nodes for x in self._reads(m)} | {m.name for m in ga.nodes}
        most = self.sizes.upper(X * R)
        small = most is not None and most <= self.config.merge_small_numel
        if not small and not any(x in reads_a for m in gb.nodes for x in self._reads(m)):
            return Reject("")  # nothing shared: two kernels cost no more traffic than one
        # merging must not close a cycle through a third kernel
        for src, dst in ((a, b), (b, a)):
            if self.reaches_any([h for h in self.deps(src) if h != dst], dst):
                return Reject("a third kernel sits between them: a cycle")
        nodes = sorted([*ga.nodes, *gb.nodes], key=lambda n: order[n.name])
        placed = self.place(nodes, X, R)
        if isinstance(placed, Reject):
            return placed
        phases = max(p.phase for p in placed.values()) + 1
        if not self._persistent(R) and phases > self.config.max_loop_phases:
            return Reject(f"{phases} passes over the row (max_loop_phases={self.config.max_loop_phases})")
        ga.nodes, ga.placed = nodes, placed
        gb.nodes, gb.placed = [], {}
        self.group_deps[a] = (self.group_deps[a] | self.group_deps[b]) - {a, b}
        self.group_deps[b] = set()
        for deps in self.group_deps:
            if b in deps:
                deps.discard(b)
                deps.add(a)
        for buf, gi in self.producer.items():
            if gi == b:
                self.producer[buf] = a
        for groups in self.readers.values():
            if b in groups:
                groups.discard(b)
                groups.add(a)
        self.decide(f"{merged} merged into {into} (domain {X} x {R})")
        return None

    def order(self) -> list[int]:
        """A topological order of kernels that, among the ready ones, runs first the one that
        frees the most memory (a greedy bound on peak memory); ties go to the lowest index.

        Linear bookkeeping: each kernel counts its unfinished dependencies (ready at zero), and
        its reads and its bytes made are computed once, not per step."""
        alive = [i for i, g in enumerate(self.groups) if g.nodes]
        waiting = {i: len(self.deps(i)) for i in alive}
        users: dict[int, list[int]] = {i: [] for i in alive}
        for i in alive:
            for d in self.deps(i):
                users.setdefault(d, []).append(i)
        reads = {i: {b for m in self.groups[i].nodes for b in self._reads(m)} for i in alive}
        remaining_reads: dict[str, int] = {}
        for i in alive:
            for b in reads[i]:
                remaining_reads[b] = remaining_reads.get(b, 0) + 1
        nbytes = self.bytes_of
        bufs = self.prog.buffers
        freeable = {i: [b for b in reads[i] if bufs.get(b) is not None and bufs[b].kind != "input"]
                    for i in alive}
        made = {i: sum(nbytes(b) for m in self.groups[i].nodes for b in ir.writes(m)) for i in alive}

        def gain(i: int) -> int:
            return sum(nbytes(b) for b in freeable[i] if remaining_reads.get(b) == 1) - made[i]

        ready = {i for i in alive if waiting[i] == 0}
        done: list[int] = []
        while ready:
            pick = max(ready, key=lambda i: (gain(i), -i)) if self.config.memory_order else min(ready)
            for b in reads[pick]:
                remaining_reads[b] -= 1
            done.append(pick)
            ready.discard(pick)
            for u in users[pick]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.add(u)
        if len(done) != len(alive):
            raise AssertionError(f"kernel dependencies form a cycle: {sorted(set(alive) - set(done))}")
        return done

    def finish(self, order: list[int]) -> tuple[KernelGroup, ...]:
        outputs = {o for o in self.prog.outputs if isinstance(o, str)}
        out: list[KernelGroup] = []
        for k, gi in enumerate(order):
            g = self.groups[gi]
            names = {m.name for m in g.nodes}
            kind = g.kind
            placed = g.placed
            phases = 1 + max((p.phase for p in placed.values()), default=0)
            outer = False
            if kind == GroupKind.POINTWISE and g.rnumel != 1:
                kind = GroupKind.PERSISTENT if self._persistent(g.rnumel) else GroupKind.LOOPED
                outer = self._outer(g) and phases <= self.config.max_loop_phases
                if outer:  # rows are strided in memory: tiles of many rows, short chunks of r
                    kind = GroupKind.LOOPED
            fits = 0
            if kind == GroupKind.LOOPED and not outer and not g.rnumel.is_Integer:
                # unbounded, so looped; but rows as long as the hint's fit in registers: the
                # kernel checks the row length per call and keeps such rows persistent
                hint = self.sizes.hint(g.rnumel)
                if hint <= self.config.persistent_rnumel_max:
                    fits = max(16, 1 << max(0, hint - 1).bit_length())
            stores = frozenset(
                m.name
                for m in g.nodes
                if m.name in outputs or any(c not in names for c in self.consumers.get(m.name, ()))
            )
            out.append(
                KernelGroup(
                    k,
                    kind,
                    tuple(g.nodes),
                    g.xnumel,
                    g.rnumel,
                    tuple(placed.items()),
                    stores,
                    phases,
                    outer,
                    fits,
                )
            )
        return tuple(out)

    def _outer(self, g: _Group) -> bool:
        """True when the kernel's reads are contiguous along x and strided along r (a
        reduction over a leading dim, e.g. the weight gradient of a layer_norm)."""
        bounds = {XI: g.xnumel, RI: g.rnumel}
        names = {m.name for m in g.nodes}
        inner = outer = 0
        for m in g.nodes:
            p = g.placed[m.name]
            if p.role == Role.ROW:
                continue
            for ld in self._loads(m):
                if ld.buffer in names:
                    continue
                e = ir.simplify_index(ir.substitute(ld.index, p.varmap), bounds)
                cx, cr = _steps(e)
                if cr == 1:
                    inner += 1
                elif cx == 1 and cr != 0:
                    outer += 1
        return outer > inner


def _steps(e: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """How far an index moves for one step of ``xindex`` and of ``rindex``, taken at the
    origin (an index like ``(xindex // 4096)*k + xindex % 4096 + 4096*rindex``, the first
    stage of a split column reduction, is contiguous along x there)."""
    at = {XI: sympy.Integer(0), RI: sympy.Integer(0)}
    base = e.xreplace(at)
    dx = sympy.expand(e.xreplace({**at, XI: sympy.Integer(1)}) - base)
    dr = sympy.expand(e.xreplace({**at, RI: sympy.Integer(1)}) - base)
    return dx, dr


def dead_code_elimination(prog: ir.LoopProgram) -> ir.LoopProgram:
    """Drop nodes whose buffers nobody reads (unused mean/rstd of layer_norm, say)."""
    live = {o for o in prog.outputs if isinstance(o, str)}
    kept: list[ir.Node] = []
    for node in reversed(prog.nodes):
        if isinstance(node, ir.Extern) or any(w in live for w in ir.writes(node)):
            kept.append(node)
            live.update(ir.reads(node))
    kept.reverse()
    return ir.LoopProgram(
        prog.name, prog.inputs, prog.buffers, tuple(kept), prog.outputs, prog.symbols, prog.device, prog.meta
    )


def schedule(prog: ir.LoopProgram, config: InductorConfig) -> Schedule:
    return _Builder(prog, config).run()


class ScheduleVerifyError(AssertionError):
    """A schedule that breaks an invariant (a compiler bug, not a user error)."""


def verify_schedule(s: Schedule, prog: ir.LoopProgram) -> Schedule:
    """Check the invariants of a schedule of ``prog``; returns it unchanged.

    Every node of the program is in exactly one group, and every node of a kernel has a
    placement; groups run in an order where each buffer is written before it is read; a
    kernel stores every output it computes and every value another group reads.
    """
    where: dict[str, int] = {}
    for g in s.groups:
        for n in g.nodes:
            if n.name in where:
                raise ScheduleVerifyError(f"{n.name} is in kernels {where[n.name]} and {g.index}")
            where[n.name] = g.index
            if g.kind in KERNEL_KINDS and n.name not in g.by_name:
                raise ScheduleVerifyError(f"{n.name} has no placement in kernel {g.index}")
    missing = [n.name for n in prog.nodes if n.name not in where]
    if missing:
        raise ScheduleVerifyError(f"nodes in no kernel: {missing}")
    written = set(prog.inputs)
    outputs = {o for o in prog.outputs if isinstance(o, str)}
    last_read: dict[str, int] = {}  # buffer -> the last group reading it
    for g in s.groups:
        for n in g.nodes:
            for b in ir.reads(n):
                last_read[b] = max(last_read.get(b, -1), g.index)
    for g in s.groups:
        inside = {w for n in g.nodes for w in ir.writes(n)}
        for n in g.nodes:
            for b in ir.reads(n):
                if b not in written and b not in inside:
                    raise ScheduleVerifyError(f"kernel {g.index} reads {b} before any kernel writes it")
        if g.kind in KERNEL_KINDS:
            unstored = sorted(n.name for n in g.nodes if n.name not in g.stores
                              and (n.name in outputs or last_read.get(n.name, -1) > g.index))
            if unstored:
                raise ScheduleVerifyError(f"kernel {g.index} keeps {unstored} in registers; "
                                          "they are read later")
        written |= inside
    return s


def format_decisions(s: Schedule) -> str:
    """``fusion.txt``: every fusion decision, with its reason."""
    return "".join(f"{d}\n" for d in s.decisions)


def format_schedule(s: Schedule) -> str:
    lines = []
    for g in s.groups:
        head = f"kernel {g.index} [{g.kind.value}]"
        if g.kind in KERNEL_KINDS:
            head += (f" xnumel={ir.text(g.xnumel)} rnumel={ir.text(g.rnumel)} phases={g.phases} "
                     f"stores={sorted(g.stores)}")
        lines.append(head)
        for node in g.nodes:
            text = ir.format_node(node).replace("\n", "\n    ")
            role = ""
            if g.kind in KERNEL_KINDS:
                p = g.placement(node.name)
                role = f"({p.role.value}, phase {p.phase}) "
            lines.append(f"  {role}{text}")
    for k, c in enumerate(s.combos):
        lines.append(f"combo {k}: kernels {', '.join(map(str, c))} in one launch")
    return "\n".join(lines) + "\n"
