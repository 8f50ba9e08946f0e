"""Triton code generation: one [`KernelGroup`][torchfuse.inductor.kernel_groups.KernelGroup] becomes
one ``@triton.jit`` function in a self-contained module (a [`Kernel`][torchfuse.graph.Kernel]).

Three kernel shapes:

* ``triton_poi_*`` -- 1-D tiles of ``XBLOCK`` elements; or, when an input or output is
  transposed against the loop order (`torchfuse.inductor.tiling`), 2-D tiles of
  ``[YBLOCK, XBLOCK]`` over ``ynumel x xnumel``, so that both sides are coalesced;
* ``triton_per_*`` -- persistent reductions: ``XBLOCK`` rows per program, the whole row
  (``RBLOCK >= rnumel``) in registers, every node computed once, one read of each input;
* ``triton_red_*`` -- looped reductions: rows too long for registers are walked in chunks
  of ``RBLOCK``; a kernel makes one pass per *phase* (e.g. max, then sum of exp, then the
  normalized output), recomputing cheap pointwise values instead of storing them. Over a
  symbolic row length the kernel also holds the persistent form, taken when the call's
  ``rnumel <= RBLOCK`` (``if rnumel <= RBLOCK: … else: <loop>``).

Values are computed in float32 for half inputs and cast back on store. Index arithmetic is
32-bit unless a tensor may have 2^31 or more elements (a symbolic size without an upper bound
may). Sizes that are symbols are kernel arguments (``xnumel``, ``rnumel`` and the symbols an
index uses, e.g. ``s0`` in ``s0*x1 + x0``); block sizes come from the symbols' hints, a
persistent ``RBLOCK`` from their bounds ([`torchfuse.inductor.sizes`][torchfuse.inductor.sizes]).
"""

from __future__ import annotations

import dataclasses

import sympy
from torchfuse.graph import schema as S
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.kernel_groups import RI, XI, GroupKind, KernelGroup, Role
from torchfuse.inductor.kernel_writer import FULL, ROWS, SCALAR, KernelWriterBase
from torchfuse.inductor.kernel_writer import Tmp as _Tmp
from torchfuse.inductor.sizes import size_info
from torchfuse.inductor.tiling import plan_tile, rows_transposed
from torchfuse.inductor.triton_ops import TL_DTYPE, cast_text, const_text, helper_source, helpers_in, render

_LOG2E = 1.4426950408889634
"""log2(e): ``exp(v) = exp2(v * log2(e))``, one FFMA before the ex2 instead of a sub and a mul."""

def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def format_expr(e: sympy.Expr) -> str:
    """A sympy index expression in the format's expression grammar (for grids, sizes)."""
    text = ir.print_index(e, {}, fmt=True)
    return text[1:-1] if isinstance(e, sympy.Add | sympy.Mul) else text  # the outer parentheses


class KernelWriter(KernelWriterBase):
    """Writes one Triton kernel; `write` returns the format Kernel record."""

    PREFIX = "triton"

    def __init__(self, group: KernelGroup, prog: ir.LoopProgram, config: InductorConfig) -> None:
        super().__init__(group, prog, config)
        self.scopes: list[dict[str, _Tmp]] = [{}]
        self.full_values: list[dict[str, _Tmp]] = [{}]
        self.sizes = size_info(tuple(prog.symbols))
        self.tile = plan_tile(group, prog, self.sizes.hint)
        if self.tile is not None:
            # the tile's coordinates: XI is the rows (``yindex``), RI the columns (``xindex``),
            # so a value's shape (ROWS, FULL) and masks follow the reduction kernels' rules
            self.g = dataclasses.replace(group, placements=self.tile.placements)
            self.bounds = {XI: self.tile.ynumel, RI: self.tile.xnumel}
        self.two_d = group.kind != GroupKind.POINTWISE or self.tile is not None
        self.accs: dict[str, tuple[str, str]] = {}

    # -- emission helpers

    def tmp(self, expr: str, shape: int, dtype: str) -> _Tmp:
        for scope in reversed(self.scopes):
            if expr in scope:
                return scope[expr]
        t = _Tmp(f"tmp{self.count}", shape, dtype)
        self.count += 1
        if self.loop_at is not None and shape != FULL:
            # a per-row value inside a looped reduction: computed once, before the loop
            self.lines.insert(self.loop_at, "    " * (self.indent - 1) + f"{t.name} = {expr}")
            self.loop_at += 1
            self.scopes[-2][expr] = t
            return t
        self.line(f"{t.name} = {expr}")
        self.scopes[-1][expr] = t
        return t

    def mask_for(self, shape: int) -> str | None:
        if shape == SCALAR:
            return None
        if shape == FULL:
            return "mask"
        return "ymask" if self.tile is not None else "xmask"

    def shape_text(self, shape: int) -> str:
        if not self.two_d:
            return "[XBLOCK]"
        if self.tile is not None:
            return "[YBLOCK, XBLOCK]" if shape == FULL else "[YBLOCK, 1]"
        return "[XBLOCK, RBLOCK]" if shape == FULL else "[XBLOCK, 1]"

    def index(self, e: sympy.Expr, placement, extra: dict | None = None) -> tuple[str, int]:
        if self.tile is not None:  # a tile's rows and columns print as yindex and xindex
            extra = {XI: "yindex", RI: "xindex", **(extra or {})}
        return super().index(e, placement, extra)

    # -- values
    def emit(self, v: ir.Value, node: ir.Node) -> _Tmp:
        placement = self.g.placement(node.name)
        if isinstance(v, ir.Const):
            return _Tmp(const_text(v.value, v.dtype), SCALAR, v.dtype)
        if isinstance(v, ir.IndexValue):
            text, shape = self.index(v.index, placement)
            return self.tmp(text, shape, "int32") if shape != SCALAR else _Tmp(text, SCALAR, "int64")
        if isinstance(v, ir.Cast):
            a = self.emit(v.arg, node)
            if a.dtype == v.dtype:
                return _Tmp(a.name, a.shape, v.dtype)
            if v.dtype == "bool":
                return self.tmp(cast_text(a.name, "bool"), a.shape, "bool")
            if a.shape == SCALAR and a.name.lstrip("-").replace(".", "").replace("e", "").isdigit():
                return _Tmp(
                    const_text(float(a.name) if v.dtype in ir.FLOAT_DTYPES else int(float(a.name)), v.dtype),
                    SCALAR,
                    v.dtype,
                )
            return self.tmp(cast_text(a.name, v.dtype), a.shape, v.dtype)
        if isinstance(v, ir.Load):
            return self.emit_load(v, node, placement)
        args = [self.emit(a, node) for a in v.args]
        shape = max(a.shape for a in args)
        return self.tmp(self.call_text(v, args), shape, v.dtype)

    def call_text(self, v: ir.Call, args: list[_Tmp]) -> str:
        text = render(v.op, [x.name for x in args], v.dtype)
        self.helpers |= helpers_in(text)
        return text

    def emit_load(self, ld: ir.Load, node: ir.Node, placement) -> _Tmp:
        prod = self.members.get(ld.buffer)
        if prod is not None:
            return self.value_of(prod)
        extra = {}
        shapes = []
        for s, val in ld.indirect:
            t = self.emit(val, node)
            extra[s] = t.name
            shapes.append(t.shape)
        text, shape = self.index(ld.index, placement, extra)
        guard = self.emit(ld.mask, node) if ld.mask is not None else None
        if guard is not None and shape == SCALAR and not shapes:
            # One element at a fixed index (a 0-d buffer: a loss scale, a count) is always
            # in bounds: the load needs no guard, and Triton rejects a block mask on a scalar
            # pointer (a 0-d read inside a padded region, GPT-2's backward with pad_mm).
            guard = None
        if guard is not None:
            shapes.append(guard.shape)
        shape = max([shape, *shapes])
        ptr = self.ptr(ld.buffer, out=False)
        mask = self.mask_for(shape)
        if guard is not None:
            mask = f"{mask} & {guard.name}" if mask else guard.name
        m = f", {mask}, other=0" if mask else ""
        return self.tmp(f"tl.load({ptr} + ({text}){m})", shape, ld.dtype)

    def value_of(self, node: ir.Node) -> _Tmp:
        p = self.g.placement(node.name)
        if p.role != Role.FULL:
            return self.row_values[node.name]
        for scope in reversed(self.full_values):
            if node.name in scope:
                return scope[node.name]
        assert isinstance(node, ir.Pointwise)
        t = self.emit(node.body, node)
        self.full_values[-1][node.name] = t
        return t

    def store(self, node: ir.Node, t: _Tmp) -> None:
        if node.name not in self.g.stores:
            return
        p = self.g.placement(node.name)
        text, shape = self.index(node.store_index, p)
        spec = self.prog.buffers[node.name]
        want = FULL if p.role == Role.FULL and self.two_d else ROWS
        val = t.name
        if t.dtype != spec.dtype:
            val = f"{val}.to({TL_DTYPE[spec.dtype]})" if spec.dtype != "bool" else f"({val} != 0)"
        if shape < want:  # a pointer block of the stored shape, even for a constant index
            text = f"{text} + tl.zeros({self.shape_text(want)}, tl.int32)"
        if t.shape == SCALAR:
            val = f"tl.full({self.shape_text(want)}, {val}, {TL_DTYPE[spec.dtype]})"
        elif t.shape < want:
            val = f"tl.broadcast_to({val}, {self.shape_text(want)})"
        self.line(f"tl.store({self.ptr(node.name, out=True)} + ({text}), {val}, {self.mask_for(want)})")

    # -- reductions
    def identity(self, rop: ir.ReduceOp, dtype: str) -> str:
        floaty = dtype in ir.FLOAT_DTYPES
        if rop in (ir.ReduceOp.SUM, ir.ReduceOp.ANY):
            return "0"
        if rop in (ir.ReduceOp.PROD, ir.ReduceOp.ALL):
            return "1"
        lo = rop in (ir.ReduceOp.MAX, ir.ReduceOp.ARGMAX)
        if floaty:
            return 'float("-inf")' if lo else 'float("inf")'
        bits = {"int64": 63, "int32": 31, "int16": 15, "int8": 7, "uint8": 8, "bool": 1}[dtype]
        if dtype in ("uint8", "bool"):
            return "0" if lo else str((1 << bits) - 1)
        return str(-(1 << bits)) if lo else str((1 << bits) - 1)

    def minmax_text(self, rop: ir.ReduceOp, block: str, dtype: str) -> str:
        if dtype in ir.FLOAT_DTYPES:
            helper = "_max_nan" if rop == ir.ReduceOp.MAX else "_min_nan"
            self.helpers.add(helper)
            return f"tl.reduce({block}, 1, {helper})[:, None]"
        return f"{'tl.max' if rop == ir.ReduceOp.MAX else 'tl.min'}({block}, 1)[:, None]"

    def arg_nan(self, rop: ir.ReduceOp, values: str, indices: str) -> str:
        """The row's argmax/argmin as eager's: the first NaN wins, ties go to the lower index
        (``tl.argmax`` skips NaN). Returns the ``[XBLOCK, 1]`` index block's text."""
        helper = "_argmax_nan" if rop == ir.ReduceOp.ARGMAX else "_argmin_nan"
        self.helpers.add(helper)
        name = f"tmp{self.count}"
        self.count += 1
        self.line(f"_, {name} = tl.reduce(({values}, {indices}), 1, {helper})")
        return f"{name}[:, None]"

    def full_operand(self, t: _Tmp) -> str:
        if t.shape == FULL:
            return t.name
        if t.shape == SCALAR:
            return f"tl.full([XBLOCK, RBLOCK], {t.name}, {TL_DTYPE[t.dtype]})"
        return f"tl.broadcast_to({t.name}, [XBLOCK, RBLOCK])"

    def reduce_persistent(self, node: ir.Reduction) -> _Tmp:
        v = self.emit(node.body, node)
        val = self.full_operand(v)
        ident = self.identity(node.reduce, v.dtype)
        masked = self.tmp(f"tl.where(mask, {val}, {ident})", FULL, v.dtype)
        rop = node.reduce
        if rop == ir.ReduceOp.SUM:
            expr = f"tl.sum({masked.name}, 1)[:, None]"
        elif rop in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):
            expr = self.minmax_text(rop, masked.name, v.dtype)
        elif rop == ir.ReduceOp.PROD:
            self.helpers.add("_prod_combine")
            expr = f"tl.reduce({masked.name}, 1, _prod_combine)[:, None]"
        elif rop == ir.ReduceOp.ANY:
            expr = f"(tl.max({masked.name}.to(tl.int8), 1)[:, None] != 0)"
        elif rop == ir.ReduceOp.ALL:
            expr = f"(tl.min({masked.name}.to(tl.int8), 1)[:, None] != 0)"
        elif v.dtype in ir.FLOAT_DTYPES:
            rows = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])"
            expr = f"{self.arg_nan(rop, masked.name, rows)}.to(tl.int64)"
        else:
            fn = "tl.argmax" if rop == ir.ReduceOp.ARGMAX else "tl.argmin"
            expr = f"{fn}({masked.name}, 1)[:, None].to(tl.int64)"
        dtype = node.dtype if rop in ir.INDEX_REDUCTIONS else v.dtype
        if rop in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
            dtype = "bool"
        return self.tmp(expr, ROWS, dtype)

    # -- kernel bodies
    def body_pointwise(self) -> None:
        for node in self.g.nodes:
            self.store(node, self.value_of(node))

    def body_persistent(self) -> None:
        for node in self.g.nodes:
            p = self.g.placement(node.name)
            if isinstance(node, ir.Reduction):
                t = self.reduce_persistent(node)
                self.row_values[node.name] = t
            elif p.role == Role.ROW:
                t = self.emit(node.body, node)
                self.row_values[node.name] = t
            else:
                t = self.value_of(node)
            self.store(node, t)

    def body_looped(self) -> None:
        def rows_after(phase: int) -> None:
            for node in self.g.nodes:
                p = self.g.placement(node.name)
                if p.role == Role.ROW and p.phase == phase:
                    t = self.emit(node.body, node)
                    self.row_values[node.name] = t
                    self.store(node, t)

        rows_after(-1)
        for phase in range(self.g.phases):
            reds = [
                n
                for n in self.g.nodes
                if isinstance(n, ir.Reduction) and self.g.placement(n.name).phase == phase
            ]
            accs = {}
            for n in reds:
                acc_dtype = (
                    ir.compute_dtype(n.body.dtype)
                    if n.reduce not in (ir.ReduceOp.ANY, ir.ReduceOp.ALL)
                    else "bool"
                )
                name = f"acc{self.count}"
                self.count += 1
                # the max of an online logsumexp is kept per row (see ``accumulate``)
                width = "1" if self.online_partner_of(n) is not None else "RBLOCK"
                self.line(
                    f"{name} = tl.full([XBLOCK, {width}], {self.identity(n.reduce, acc_dtype)}, "
                    f"{TL_DTYPE[acc_dtype]})"
                )
                if n.reduce in ir.INDEX_REDUCTIONS:
                    self.line(f"{name}_i = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
                accs[n.name] = (name, acc_dtype)
            self.loop_at = len(self.lines)
            self.line("for roffset in range(0, rnumel, RBLOCK):")
            self.indent += 1
            self.scopes.append({})
            self.full_values.append({})
            self.line("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
            self.line("rmask = rindex < rnumel")
            self.line("mask = xmask & rmask")
            for node in self.g.nodes:
                p = self.g.placement(node.name)
                if p.phase != phase:
                    continue
                if isinstance(node, ir.Reduction):
                    self.accs = accs
                    self.accumulate(node, *accs[node.name])
                elif p.role == Role.FULL and node.name in self.g.stores:
                    self.store(node, self.value_of(node))
            self.scopes.pop()
            self.full_values.pop()
            self.indent -= 1
            self.loop_at = None
            self.accs = accs
            for n in reds:
                self.row_values[n.name] = self.finish_acc(n, *accs[n.name])
                self.store(n, self.row_values[n.name])
            rows_after(phase)

    def body_dual(self) -> None:
        """A looped reduction over a symbolic row with a persistent path: one branch per call
        (the row length is the same for every program), so short rows are read once."""
        self.line("if rnumel <= RBLOCK:")
        self.indent += 1
        self.line("rindex = tl.arange(0, RBLOCK)[None, :]")
        self.line("rmask = rindex < rnumel")
        self.line("mask = xmask & rmask")
        self.body_persistent()
        self.indent -= 1
        # nothing computed in one branch is visible in the other
        self.scopes, self.full_values, self.row_values, self.accs = [{}], [{}], {}, {}
        self.line("else:")
        self.indent += 1
        self.body_looped()
        self.indent -= 1

    def online_partner_of(self, node: ir.Reduction) -> ir.Node | None:
        return next((n for n in self.g.nodes if self.g.placement(n.name).online_with == node.name), None)

    def accumulate(self, node: ir.Reduction, acc: str, acc_dtype: str) -> None:
        if self.g.placement(node.name).online_with is not None:
            return  # accumulated together with its max (see below)
        v = self.emit(node.body, node)
        val = self.full_operand(v)
        rop = node.reduce
        partner = self.online_partner_of(node)
        if partner is not None:
            # Online logsumexp with one max per chunk and row: the chunk's max (a tree over
            # the block) moves the row's max, the lane sums are rescaled by one exp per row,
            # and each element costs one FFMA + one ex2 + one FFMA. The lane-wise form (a
            # compare, two selects and an exp per element) made the 8192x32000 loop
            # ALU-issue bound at ~65% of copy bandwidth. Masked lanes are -inf, which add
            # exp2(-inf) = 0; a row that is all -inf so far uses 0 as its reference.
            self.helpers.add("_max_nan")
            s_acc = self.accs[partner.name][0]
            self.line(f'v_new = tl.where(mask, {val}, float("-inf"))')
            self.line(f"m_new = _max_nan({acc}, tl.reduce(v_new, 1, _max_nan)[:, None])")
            self.line(f'm_old_ref = tl.where({acc} == float("-inf"), 0.0, {acc})')
            self.line('m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)')
            self.line(f"{s_acc} = {s_acc} * tl.exp(m_old_ref - m_ref) + "
                      f"tl.exp2(v_new * {_LOG2E!r} - m_ref * {_LOG2E!r})")
            self.line(f"{acc} = m_new")
            return
        if rop == ir.ReduceOp.SUM:
            new = f"{acc} + {val}"
        elif rop == ir.ReduceOp.PROD:
            new = f"{acc} * {val}"
        elif rop in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):
            fn = "tl.maximum" if rop == ir.ReduceOp.MAX else "tl.minimum"
            nan = ", propagate_nan=tl.PropagateNan.ALL" if acc_dtype in ir.FLOAT_DTYPES else ""
            new = f"{fn}({acc}, {val}{nan})"
        elif rop == ir.ReduceOp.ANY:
            new = f"{acc} | {val}"
        elif rop == ir.ReduceOp.ALL:
            new = f"{acc} & {val}"
        else:
            cmp = ">" if rop == ir.ReduceOp.ARGMAX else "<"
            nan = f" | (({val} != {val}) & ({acc} == {acc}))" if acc_dtype in ir.FLOAT_DTYPES else ""
            self.line(f"take = mask & (({val} {cmp} {acc}){nan})")
            self.line(f"{acc} = tl.where(take, {val}, {acc})")
            self.line(
                f"{acc}_i = tl.where(take, tl.broadcast_to(rindex.to(tl.int64), [XBLOCK, RBLOCK]), {acc}_i)"
            )
            return
        self.line(f"{acc} = tl.where(mask, {new}, {acc})")

    def finish_acc(self, node: ir.Reduction, acc: str, acc_dtype: str) -> _Tmp:
        rop = node.reduce
        with_max = self.g.placement(node.name).online_with
        if with_max is not None:
            # the lane sums are already relative to the row's final max (0 for an all -inf row)
            return self.tmp(f"tl.sum({acc}, 1)[:, None]", ROWS, acc_dtype)
        if rop == ir.ReduceOp.SUM:
            return self.tmp(f"tl.sum({acc}, 1)[:, None]", ROWS, acc_dtype)
        if rop in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):
            return self.tmp(self.minmax_text(rop, acc, acc_dtype), ROWS, acc_dtype)
        if rop == ir.ReduceOp.PROD:
            self.helpers.add("_prod_combine")
            return self.tmp(f"tl.reduce({acc}, 1, _prod_combine)[:, None]", ROWS, acc_dtype)
        if rop in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
            fn = "tl.max" if rop == ir.ReduceOp.ANY else "tl.min"
            return self.tmp(f"({fn}({acc}.to(tl.int8), 1)[:, None] != 0)", ROWS, "bool")
        if acc_dtype in ir.FLOAT_DTYPES:
            return self.tmp(self.arg_nan(rop, acc, f"{acc}_i"), ROWS, "int64")
        best = self.tmp(
            f"{'tl.max' if rop == ir.ReduceOp.ARGMAX else 'tl.min'}({acc}, 1)[:, None]", ROWS, acc_dtype
        )
        return self.tmp(
            f"tl.min(tl.where({acc} == {best.name}, {acc}_i, {2**62}), 1)[:, None]", ROWS, "int64"
        )

    # -- the whole kernel
    def write(self) -> S.Kernel:
        kind = self.g.kind
        body_start = len(self.lines)
        if kind == GroupKind.POINTWISE:
            self.body_pointwise()
        elif kind == GroupKind.PERSISTENT:
            self.body_persistent()
        elif self.g.fits:
            self.body_dual()
        else:
            self.body_looped()
        body = self.lines[body_start:]
        name = self.name()
        wide = self.needs_int64()
        # 64-bit index math only when some call may need it: when the bounds cannot rule it
        # out (an unbounded symbol) but the sizes may fit, the launch passes INDEX32 (1 when
        # every indexed extent of this call fits in int32, from index32_expr) and Triton
        # compiles the variant asked for. 64-bit division by a runtime size is several times
        # the cost of 32-bit (rope with dynamic=True ran at 1.6x its static time).
        switch = wide and self.index32_expr() is not None
        head = self.tile_head(wide, switch) if self.tile is not None else self.flat_head(wide, switch)
        ptr_params = list(self.params.items())
        # stable order: inputs first, then outputs
        ptr_params.sort(key=lambda kv: (kv[1].startswith("out"), int(kv[1].split("ptr")[1])))
        sym_params = sorted(self.size_syms, key=lambda s: s.name)
        # a tile's launch passes the flat size, like every pointwise kernel's; its rows and
        # columns are written in the kernel (constants, or products of size arguments)
        scalar_names = ["numel" if self.tile is not None else "xnumel"]
        scalar_names += ["rnumel"] if kind != GroupKind.POINTWISE else []
        sig = [p for _, p in ptr_params] + scalar_names + [s.name for s in sym_params]
        sig += ["INDEX32: tl.constexpr"] if switch else []
        constexprs = ["XBLOCK: tl.constexpr"] + (
            ["RBLOCK: tl.constexpr"] if kind != GroupKind.POINTWISE else []
        )
        if self.tile is not None:
            constexprs = ["YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
        src = ["import triton", "import triton.language as tl", *helper_source(self.helpers)]
        src += ["", "", "@triton.jit", f"def {name}({', '.join(sig + constexprs)}):", *head, *body, ""]
        idx_kind = "i64" if wide else "i32"
        params = [S.KernelParam(name=p, kind="ptr", dtype=self.prog.buffers[b].dtype) for b, p in ptr_params]
        params += [S.KernelParam(name=n, kind=idx_kind) for n in scalar_names]
        params += [S.KernelParam(name=s.name, kind="i32" if self.sizes.fits_int32(s) else "i64")
                   for s in sym_params]
        params += [S.KernelParam(name="INDEX32", kind="i32")] if switch else []
        constexprs_v, configs = self.configs(body_lines=len(body))
        grid = (f"({format_expr(self.g.xnumel)} + XBLOCK - 1) // XBLOCK", 1, 1)
        if self.tile is not None:
            ny, nx = format_expr(self.tile.ynumel), format_expr(self.tile.xnumel)
            grid = (f"(({ny} + YBLOCK - 1) // YBLOCK) * (({nx} + XBLOCK - 1) // XBLOCK)", 1, 1)
        meta = {
            **({"index32": self.index32_expr()} if switch else {}),
            **({"tile": f"{format_expr(self.tile.ynumel)} x {format_expr(self.tile.xnumel)}"}
               if self.tile is not None else {}),
            "buffers": ",".join(b for b, _ in ptr_params),
            "kind": kind.value,
            "nodes": ",".join(n.name for n in self.g.nodes),
        }
        return S.Kernel(
            name=name,
            source="\n".join(src),
            entry=name,
            signature=tuple(params),
            constexprs=constexprs_v,
            configs=configs,
            grid=grid,
            meta=meta,
        )

    def flat_head(self, wide: bool, switch: bool) -> list[str]:
        """The first lines of a kernel over ``XBLOCK`` elements or rows per program."""
        kind = self.g.kind
        if switch:
            head = ["    if INDEX32:",
                    "        xoffset = tl.program_id(0) * XBLOCK",
                    "    else:",
                    "        xoffset = tl.program_id(0).to(tl.int64) * XBLOCK"]
        else:
            pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
            head = [f"    xoffset = {pid} * XBLOCK"]
        if kind == GroupKind.POINTWISE:
            head += ["    xindex = xoffset + tl.arange(0, XBLOCK)", "    xmask = xindex < xnumel"]
        else:
            head += ["    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]", "    xmask = xindex < xnumel"]
        if kind == GroupKind.PERSISTENT:
            head += [
                "    rindex = tl.arange(0, RBLOCK)[None, :]",
                "    rmask = rindex < rnumel",
                "    mask = xmask & rmask",
            ]
        return head

    def tile_head(self, wide: bool, switch: bool) -> list[str]:
        """The first lines of a tiled pointwise kernel: a 1-D grid of ``[YBLOCK, XBLOCK]``
        tiles, row-major (a 2-D grid would cap the rows at 65535 tiles)."""
        assert self.tile is not None
        if switch:
            head = ["    if INDEX32:", "        pid = tl.program_id(0)",
                    "    else:", "        pid = tl.program_id(0).to(tl.int64)"]
        else:
            head = [f"    pid = {'tl.program_id(0).to(tl.int64)' if wide else 'tl.program_id(0)'}"]
        ny, nx = self.tile.ynumel, self.tile.xnumel
        for e in (ny, nx):
            self.size_syms |= {s for s in sympy.sympify(e).free_symbols if isinstance(s, sympy.Symbol)}
        return [
            *head,
            f"    ynumel = {self.print_index(ny)}",
            f"    xnumel = {self.print_index(nx)}",
            "    xtiles = (xnumel + XBLOCK - 1) // XBLOCK",
            "    yindex = (pid // xtiles) * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
            "    ymask = yindex < ynumel",
            "    xindex = (pid % xtiles) * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
            "    xmask = xindex < xnumel",
            "    mask = ymask & xmask",
        ]

    def index_extents(self) -> list[sympy.Expr]:
        """What the kernel's indices range over: every tensor it indexes, and its domain."""
        extents = [ir.product(spec.sizes) for spec in self.prog.buffers.values() if spec.name in self.params]
        extents.append(self.g.xnumel * self.g.rnumel)
        return list(dict.fromkeys(sympy.sympify(e) for e in extents))

    def index32_expr(self) -> str | None:
        """The launch argument ``INDEX32``: 1 when every `index_extents` is below 2**31
        for the call's sizes, else 0 (in the format's grammar), or None when nothing here is
        symbolic (then the answer never changes)."""
        extents = self.index_extents()
        if all(e.is_Integer for e in extents):
            return None
        text = format_expr(extents[0])
        for e in extents[1:]:
            text = f"max({text}, {format_expr(e)})"
        return f"min(1, {2**31 - 1} // ({text}))"

    def needs_int64(self) -> bool:
        """64-bit index math unless every `index_extents` provably holds fewer than
        2**31 elements at every allowed size (see `.sizes`)."""
        return not all(self.sizes.fits_int32(e) for e in self.index_extents())

    def pointwise_block(self, numel: int) -> tuple[int, int]:
        """(XBLOCK, num_warps) of a pointwise kernel over ``numel`` elements."""
        if numel <= self.config.pointwise_small_numel:
            return 128, 4
        if numel < self.config.pointwise_large_numel:
            return 1024, 4
        return 2048, 4

    def tile_configs(self) -> tuple[S.LaunchConfig, ...]:
        """Candidate blocks of a tiled pointwise kernel. 32 x 32 with 4 warps (8 values per
        thread) is TorchInductor's choice for the same kernels; 64 x 64 with 8 warps has twice
        the loads in flight per thread. Two candidates, tuned on the first call of a large
        kernel (each is a Triton compile); a small kernel takes one."""
        assert self.tile is not None
        caps = []
        for e in (self.tile.ynumel, self.tile.xnumel):
            most = self.sizes.upper(e)  # a symbolic extent is capped by its bound only
            caps.append(next_pow2(most) if most is not None else 1 << 30)
        numel = self.sizes.hint(self.tile.ynumel * self.tile.xnumel)
        cands = [(1024, 4)] if numel <= self.config.pointwise_small_numel else [(4096, 8), (1024, 4)]
        blocks = dict.fromkeys((*tile_blocks(caps[0], caps[1], elements), warps) for elements, warps in cands)
        return tuple(S.LaunchConfig(meta={"YBLOCK": yb, "XBLOCK": xb}, num_warps=w) for yb, xb, w in blocks)

    def configs(self, body_lines: int = 0) -> tuple[dict, tuple[S.LaunchConfig, ...]]:
        if self.tile is not None:
            return {}, self.tile_configs()
        x = self.g.xnumel
        xh = self.sizes.hint(x)  # block sizes are a performance choice: from hints
        # Blocks are capped by the largest x can be, so that a small x wastes no lanes; a
        # symbolic x is capped by its bound only (its hint says nothing about other calls).
        most = self.sizes.upper(x)
        xcap = next_pow2(most) if most is not None else 1 << 30
        kind = self.g.kind
        if kind == GroupKind.POINTWISE:
            # One config, no tuning: a pointwise kernel is memory- or launch-bound and the
            # choice follows from its size, while each extra candidate is a Triton compile on
            # a cold start (0.1-1.8 s, the largest part of a first call). Tiny tensors: one
            # element per thread (compiles fastest: sin/cos unrolled 8x took 1.8 s); big
            # ones: 16 elements per thread, two 16-byte bf16 loads in flight per thread.
            # A symbolic size takes the block its hint calls for, like every other
            # performance choice: keeping big blocks for a small hint left small_ops with
            # 4 programs on 132 SMs (8.9x its static time on the H200, run 1415), while a
            # small block on a later big size costs a few percent of bandwidth.
            xb, warps = self.pointwise_block(xh)
            return {}, (S.LaunchConfig(meta={"XBLOCK": min(xb, max(16, xcap))}, num_warps=warps),)
        if kind == GroupKind.PERSISTENT or self.g.fits:
            if self.g.fits:  # the persistent path's block is also the loop's chunk
                rb = self.g.fits
            else:
                longest = self.sizes.upper(self.g.rnumel)  # the scheduler made it persistent: bounded
                assert longest is not None, self.g.rnumel
                rb = next_pow2(longest)
            warps = 16 if rb >= 8192 else 8 if rb >= 2048 else 4
            first, first_warps = min(max(1, 8192 // rb), xcap), warps if rb >= 1024 else 4
            if rows_transposed(self.g, self.prog):
                # an access contiguous across rows is coalesced over the rows a program holds:
                # 16 rows (64 bytes of fp32), or as many as 16384 values allow, with a warp
                # per 2048 values (64 per thread, as the default of 1024-long rows has)
                first = min(max(first, min(16, 16384 // rb)), xcap)
                first_warps = max(first_warps, min(16, first * rb // 2048))
            # Triton's compile time grows with the values a thread holds times the kernel's
            # length, so a tile of several rows takes more warps, not more values per thread:
            # at most 32, and 16 in a long kernel. Measured for sm_90 (2-core host): a fused
            # layer-norm backward over 768-wide rows, 8 rows a program, 155 lines: 4 warps
            # 5.1 s, 8 warps 2.0 s, 16 warps 1.5 s; GPT-2's chained layer-norm recomputes
            # (313 lines): 11.5, 5.2 and 3.8 s -- the longest compile of its cold first call.
            per_thread = 16 if body_lines > self.config.long_kernel_lines else 32
            first_warps = max(first_warps, min(16, first * rb // (32 * per_thread)))
            # (rows per program, warps): the default first, then one row per program. Two
            # candidates only: every candidate is a Triton compile on a cold start, and the
            # ones dropped (more warps, fewer rows) rarely won on memory-bound rows.
            cands = [(first, first_warps), (1, warps)]
            out = [S.LaunchConfig(meta={"XBLOCK": xb}, num_warps=w) for xb, w in dict.fromkeys(cands)]
            return {"RBLOCK": rb}, tuple(out)
        if self.g.outer:
            rmost = self.sizes.upper(self.g.rnumel)
            if rmost is not None and rmost < 32:
                # short strided rows (T5's position-bias gradient: 2M columns summed over a
                # batch of 8): the chunk is the whole row and the tile widens instead; a
                # 64 x 64 tile left 7 of 8 lanes masked (190 us on the H200, run 2046)
                rb = next_pow2(rmost)
                return {}, tuple(
                    S.LaunchConfig(meta={"XBLOCK": min(xb, xcap), "RBLOCK": rb}, num_warps=w)
                    for xb, w in ((max(64, 2048 // rb), 4), (max(64, 4096 // rb), 8))
                )
            xb = min(64, xcap)
            return {}, (
                S.LaunchConfig(meta={"XBLOCK": xb, "RBLOCK": 64}, num_warps=8),
                S.LaunchConfig(meta={"XBLOCK": min(128, xcap), "RBLOCK": 32}, num_warps=8),
            )
        rb = self.config.looped_rblock
        cands = [(1, rb, 8), (1, 4096, 16), (4, 1024, 8)]
        if self.sizes.hint(self.g.rnumel) >= 16384:
            # long rows (a 32000-class cross_entropy): 16 elements per thread per chunk, so
            # each thread has two 16-byte loads in flight (the loop is not software-pipelined)
            # and a per-chunk row reduction is amortized over more elements; two candidates
            # only (each is a compile on a cold start)
            cands = [(1, 4096, 8), (1, 8192, 16)]
        if rows_transposed(self.g, self.prog):
            # some access is contiguous across rows: the column reductions' square tile first
            # (coalesced along the rows for it, along the chunk for the others), then the
            # best row walk
            cands = [(min(64, xcap), 64, 8), cands[0]]
        rh = self.sizes.hint(self.g.rnumel)
        if not self.g.rnumel.is_Integer and rh < rb:
            # a symbolic row, looped because it has no bound, but short for the example sizes:
            # first a chunk that fits the hinted row, several rows per program (~2048 elements)
            rbh = max(16, next_pow2(rh))
            xb = min(max(1, rb // rbh), xcap)
            cands.insert(0, (xb, rbh, 4 if xb * rbh <= 1024 else 8))
        return {}, tuple(
            S.LaunchConfig(meta={"XBLOCK": xb, "RBLOCK": r}, num_warps=w) for xb, r, w in dict.fromkeys(cands)
        )


def tile_blocks(ycap: int, xcap: int, elements: int) -> tuple[int, int]:
    """(YBLOCK, XBLOCK) of a tile of about ``elements`` values, as square as the extents
    allow: a block dim is at most its extent's power of two, and the other one grows into
    what is left (a channels-last store of 3 channels takes ``[256, 4]``, not ``[32, 4]``)."""
    side = 1 << (max(1, elements).bit_length() - 1) // 2
    xb = min(side, xcap)
    yb = min(max(side, elements // xb), ycap)
    xb = min(max(xb, elements // yb), xcap)
    return yb, xb


def generate_kernel(group: KernelGroup, prog: ir.LoopProgram, config: InductorConfig) -> S.Kernel:
    return KernelWriter(group, prog, config).write()
