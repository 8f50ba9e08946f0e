"""C++/OpenMP code generation for the CPU: one [`KernelGroup`][torchfuse.inductor.kernel_groups.KernelGroup]
becomes one ``extern "C"`` function (a [`Kernel`][torchfuse.graph.Kernel] of language ``cpp``),
from the same loop IR, scheduler and fusion decisions as the Triton path
([`torchfuse.inductor.codegen`][torchfuse.inductor.codegen]); scalar ops are rendered by
[`torchfuse.inductor.cpp_ops`][torchfuse.inductor.cpp_ops].

Two kernel shapes::

    // cpp_poi_*: chunks of the flat domain in parallel, each chunk a simd loop
    #pragma omp parallel for if(xnumel >= 32768)
    for (int64_t xo = 0; xo < xnumel; xo += 1024) {
      #pragma omp simd
      for (int64_t xindex = xo; xindex < xend; ++xindex) { ... out_ptr0[xindex] = tmp2; }
    }

    // cpp_per_* / cpp_red_*: rows in parallel; per row, one pass over r per phase, each
    // reduction folded into 64 lanes (whole blocks, then the rest), combined by a fixed tree
    #pragma omp parallel for if(xnumel * rnumel >= 32768)
    for (int32_t xindex = 0; xindex < xnumel; ++xindex) {
      float acc0_p[64]; ...                      // = 0
      for (; rb1 + 64 <= rnumel; rb1 += 64) {
        #pragma omp simd
        for (int32_t l = 0; l < 64; ++l) { const int32_t rindex = rb1 + l; acc0_p[l] += ...; }
      }
      ...                                        // the tail; acc0 = tree(acc0_p)
      ...                                        // per-row values, then the next pass
    }

On the CPU the persistent and looped forms of a reduction are the same code: a row is walked
once per *phase* (max, then sum of exp, then the normalized output), each pass's reads
coming from cache; a pass holds every reduction and store that needs no result of a
reduction of the same pass. Values that depend on the row only are computed once, before
the pass. A row's reductions run in one thread, in an order the source fixes (`LANES`), so
results depend neither on the thread count nor on the vector width; a costly value several
passes compute (softmax's ``exp``) is kept in a row scratch array (`generate_kernel`). When
there are fewer rows than threads and the rows are long, a single-pass sum/max/min/any/all
kernel splits each row into fixed chunks whose partials are computed in parallel and combined
in chunk order (deterministic per-thread partials).

Half types are computed in float32 and rounded on store; index arithmetic is ``int32_t``
where every extent fits (`IDX`), else ``int64_t``.
"""

from __future__ import annotations

import re

import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.layouts import storage_extent
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.cpp_ops import (
    CPP_TYPE,
    PRELUDE,
    STORAGE_TYPE,
    cast_text,
    const_text,
    helper_source,
    helpers_in,
    load_text,
    render,
    store_text,
)
from torchfuse.inductor.kernel_groups import GroupKind, KernelGroup, Role
from torchfuse.inductor.kernel_writer import FULL, ROWS, SCALAR, KernelWriterBase
from torchfuse.inductor.kernel_writer import Tmp as _Tmp
from torchfuse.inductor.sizes import size_info

PARALLEL_MIN_WORK = 1 << 15
"""Elements below which a kernel runs in the calling thread (a fork/join costs ~microseconds)."""
POINTWISE_CHUNK = 1024
"""Elements per simd loop of a pointwise kernel (the unit of parallel work)."""
PARTIAL_CHUNK = 1 << 14
"""Row elements per partial of a split row (fixed: the combination order never changes)."""
_SPLITTABLE = frozenset({ir.ReduceOp.SUM, ir.ReduceOp.MAX, ir.ReduceOp.MIN, ir.ReduceOp.ANY, ir.ReduceOp.ALL})
LANES = 64
"""Partial results per reduction in a pass over a row (`CppKernelWriter.open_pass`): lane ``l``
folds the elements ``r0 + l`` of every block of ``LANES``, and the lanes are combined by a
fixed tree after the pass. Independent accumulators hide the add's latency, and the order of
every operation is the source's: the same result whatever vector width the compiler picks."""
_LANE_REDUCTIONS = _SPLITTABLE
SCRATCH_MAX = 1 << 14
"""Longest row (elements) whose costly values may be kept in a row scratch array (64 KiB of
float32, per thread, on its stack) for a later pass, instead of being computed again."""
_COSTLY = re.compile(r"(tf_exp|tf_tanh|tf_sigmoid|std::(?:exp|exp2|expm1|log|log2|log1p|sin|cos|tan|"
                     r"pow|erf))\(")
"""Calls worth a store and a load to avoid computing twice (vector exp: ~20 instructions);
a value whose expression is one of them is kept for later passes."""
_TMP = re.compile(r"\btmp\d+\b")
IDX = "IDX_T"
"""Placeholder of the loops' index type in the lines being written: ``int32_t`` where every
extent the kernel indexes fits (`CppKernelWriter.index_type`), else ``int64_t``. g++ 12
vectorizes a loop whose index math is all 32-bit (``x % 1024``, ``x / 7``: a broadcast
bias) and leaves it scalar when a 64-bit division or remainder is in it."""


def print_index(e: sympy.Expr, names: dict) -> str:
    """An index expression as C++ (``int64_t`` arithmetic; operands of ``/`` and ``%`` are
    non-negative, as in the Triton path)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return const_text(int(e), "int64")
    if e.is_Symbol:
        return names.get(e, e.name)
    if isinstance(e, sympy.Add):
        terms = sorted(e.args, key=sympy.default_sort_key)
        return "(" + " + ".join(print_index(a, names) for a in terms) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + "*".join(print_index(a, names) for a in e.args) + ")"
    if isinstance(e, ir.FloorDiv):
        return f"({print_index(e.args[0], names)} / {print_index(e.args[1], names)})"
    if isinstance(e, ir.ModIdx):
        return f"({print_index(e.args[0], names)} % {print_index(e.args[1], names)})"
    if isinstance(e, sympy.Min | sympy.Max):
        fn = "std::min<int64_t>" if isinstance(e, sympy.Min) else "std::max<int64_t>"
        out = print_index(e.args[0], names)
        for a in e.args[1:]:
            out = f"{fn}({out}, {print_index(a, names)})"
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + "*".join([print_index(e.base, names)] * int(e.exp)) + ")"
    raise NotImplementedError(f"cannot print index expression {e}")


class CppKernelWriter(KernelWriterBase):
    """Writes one C++ kernel; `write` returns the format Kernel record."""

    PREFIX = "cpp"
    INDENT = "  "
    print_index = staticmethod(print_index)

    def __init__(self, group: KernelGroup, prog: ir.LoopProgram, config: InductorConfig,
                 reuse: dict[str, int] | None = None) -> None:
        super().__init__(group, prog, config)
        self.reuse = {c: (f"row{i}", first) for i, (c, first) in enumerate(sorted((reuse or {}).items()))}
        """Costly full-size values computed in more than one pass (by their identity):
        the first pass stores each into a row scratch array (``row0[rindex]``), later passes
        read it back. Filled from a first writing of the kernel (`reusable`)."""
        self.canon: dict[str, str] = {}
        """tmp name -> the identity of its value (``v3``), the same in every pass."""
        self.value_ids: dict[str, str] = {}
        """A value's text over its operands' identities -> its identity."""
        self.seen: dict[str, list[int]] = {}
        """Costly full-size values -> the passes computing them (from safe passes only)."""
        self.pass_no = -1
        self.pass_safe = False
        self.sizes = size_info(tuple(prog.symbols))
        self.scratch_types: dict[str, str] = {}
        self.scopes: list[dict[tuple[str, str], _Tmp]] = [{}]
        self.depth = 0
        """Loop levels of the pass being written (a lane pass has two: blocks, then lanes)."""
        self.lanes = False
        """Whether the pass being written folds its reductions into `LANES` partials."""
        self.values: list[dict[str, _Tmp]] = [{}]
        self._deps: dict[str, frozenset[str]] = {}

    # -- emission helpers

    def fresh(self, prefix: str = "tmp") -> str:
        self.count += 1
        return f"{prefix}{self.count - 1}"

    def tmp(self, expr: str, shape: int, dtype: str) -> _Tmp:
        key = (expr, dtype)
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        self.helpers |= helpers_in(expr)
        t = _Tmp(self.fresh(), shape, dtype)
        # the value's identity across passes: its text over the identities of its operands
        # (hash-consed: a shared operand is named, not inlined, so the text stays small)
        canon = _TMP.sub(lambda m: self.canon.get(m.group(), m.group()), expr) + f" : {dtype}"
        self.canon[t.name] = self.value_ids.setdefault(canon, f"v{len(self.value_ids)}")
        decl = f"const {CPP_TYPE[dtype]} {t.name} = {expr};"
        if shape == FULL and self.loop_at is not None:
            if self.pass_safe and _COSTLY.match(expr):
                self.seen.setdefault(canon, []).append(self.pass_no)
            hit = self.reuse.get(canon)
            if hit is not None and self.pass_no > hit[1]:  # computed by an earlier pass
                decl = f"const {CPP_TYPE[dtype]} {t.name} = {hit[0]}[rindex];"
            elif hit is not None and self.pass_no == hit[1]:
                self.line(decl)
                self.line(f"{hit[0]}[rindex] = {t.name};")
                self.scopes[-1][key] = t
                self.scratch_types[hit[0]] = CPP_TYPE[dtype]
                return t
        if self.loop_at is not None and shape != FULL:
            # a per-row value inside a pass over the row: computed once, before the pass
            self.lines.insert(self.loop_at, "  " * (self.indent - self.depth) + decl)
            self.loop_at += 1
            self.scopes[-2][key] = t
            return t
        self.line(decl)
        self.scopes[-1][key] = t
        return t

    # -- values
    def emit(self, v: ir.Value, node: ir.Node) -> _Tmp:
        placement = self.g.placement(node.name)
        if isinstance(v, ir.Const):
            return _Tmp(const_text(v.value, v.dtype), SCALAR, v.dtype)
        if isinstance(v, ir.IndexValue):
            text, shape = self.index(v.index, placement)
            return self.tmp(text, shape, "int64") if shape != SCALAR else _Tmp(text, SCALAR, "int64")
        if isinstance(v, ir.Cast):
            if isinstance(v.arg, ir.Const) and v.dtype not in ir.LOW_PRECISION:
                folded = _fold_cast(v.arg.value, v.dtype)
                if folded is not None:
                    return _Tmp(const_text(folded, v.dtype), SCALAR, v.dtype)
            a = self.emit(v.arg, node)
            if a.dtype == v.dtype:
                return a
            return self.tmp(cast_text(a.name, v.dtype), a.shape, v.dtype)
        if isinstance(v, ir.Load):
            return self.emit_load(v, node, placement)
        args = [self.emit(a, node) for a in v.args]
        shape = max(a.shape for a in args)
        return self.tmp(render(v.op, [x.name for x in args], v.dtype), shape, v.dtype)

    def emit_load(self, ld: ir.Load, node: ir.Node, placement) -> _Tmp:
        prod = self.members.get(ld.buffer)
        if prod is not None:
            return self.value_of(prod)
        extra, shapes = {}, []
        for s, val in ld.indirect:
            t = self.emit(val, node)
            extra[s] = t.name
            shapes.append(t.shape)
        text, shape = self.index(ld.index, placement, extra)
        guard = self.emit(ld.mask, node) if ld.mask is not None else None
        if guard is not None:
            shapes.append(guard.shape)
        shape = max([shape, *shapes])
        dtype = self.prog.buffers[ld.buffer].dtype
        value = load_text(self.ptr(ld.buffer, out=False), text, dtype)
        if guard is not None:  # elsewhere the index may be out of range: not read at all
            value = f"({guard.name} ? {value} : ({CPP_TYPE[dtype]})0)"
        return self.tmp(value, shape, ld.dtype if ld.dtype in CPP_TYPE else dtype)

    def value_of(self, node: ir.Node) -> _Tmp:
        if self.g.placement(node.name).role != Role.FULL:
            return self.row_values[node.name]
        for scope in reversed(self.values):
            if node.name in scope:
                return scope[node.name]
        assert isinstance(node, ir.Pointwise), node
        t = self.emit(node.body, node)
        self.values[-1][node.name] = t
        return t

    def store(self, node: ir.Node, t: _Tmp) -> None:
        if node.name not in self.g.stores:
            return
        text, _ = self.index(node.store_index, self.g.placement(node.name))
        spec = self.prog.buffers[node.name]
        self.line(f"{self.ptr(node.name, out=True)}[{text}] = {store_text(t.name, spec.dtype)};")
        self.helpers |= helpers_in(store_text("x", spec.dtype))

    def row_deps(self, node: ir.Node) -> frozenset[str]:
        """The per-row values (row nodes, reductions) of this kernel that ``node`` reads,
        directly or through the full-size values it computes inline."""
        if node.name in self._deps:
            return self._deps[node.name]
        out: set[str] = set()
        if isinstance(node, ir.Pointwise | ir.Reduction):
            for ld in ir.loads_of(node.body):
                m = self.members.get(ld.buffer)
                if m is None:
                    continue
                if self.g.placement(m.name).role == Role.FULL:
                    out |= self.row_deps(m)
                else:
                    out.add(m.name)
        self._deps[node.name] = frozenset(out)
        return self._deps[node.name]

    # -- reductions
    def identity(self, rop: ir.ReduceOp, dtype: str) -> str:
        t = CPP_TYPE[dtype]
        if rop in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
            return "false" if rop == ir.ReduceOp.ANY else "true"
        if rop == ir.ReduceOp.SUM:
            return const_text(0, dtype)
        if rop == ir.ReduceOp.PROD:
            return const_text(1, dtype)
        lo = rop in (ir.ReduceOp.MAX, ir.ReduceOp.ARGMAX)
        if dtype in ir.FLOAT_DTYPES:
            return f"{'-' if lo else ''}std::numeric_limits<{t}>::infinity()"
        return f"std::numeric_limits<{t}>::{'lowest' if lo else 'max'}()"

    def acc_dtype(self, node: ir.Reduction) -> str:
        if node.reduce in (ir.ReduceOp.ANY, ir.ReduceOp.ALL):
            return "bool"
        return ir.compute_dtype(node.body.dtype)

    def combine(self, rop: ir.ReduceOp, acc: str, val: str, dtype: str) -> str:
        """The statement folding ``val`` into ``acc`` (not for argmax/argmin)."""
        if rop == ir.ReduceOp.SUM:
            return f"{acc} += {val};"
        if rop == ir.ReduceOp.PROD:
            return f"{acc} *= {val};"
        if rop == ir.ReduceOp.ANY:
            return f"{acc} = {acc} || ({val} != 0);"
        if rop == ir.ReduceOp.ALL:
            return f"{acc} = {acc} && ({val} != 0);"
        op = ir.VOp.MAX if rop == ir.ReduceOp.MAX else ir.VOp.MIN
        text = render(op, [acc, val], dtype)
        self.helpers |= helpers_in(text)
        return f"{acc} = {text};"

    def accumulate(self, node: ir.Reduction, acc: str, dtype: str) -> None:
        v = self.emit(node.body, node)
        rop = node.reduce
        if self.lanes:  # lane l of the partials
            acc, nan = f"{acc}_p[l]", f"{acc}_pn[l]"
        else:
            nan = f"{acc}_nan"
        if rop in ir.INDEX_REDUCTIONS:
            # eager: the first NaN is the extreme value; ties keep the lower index
            cmp = ">" if rop == ir.ReduceOp.ARGMAX else "<"
            isnan = f" || ({v.name} != {v.name} && {acc} == {acc})" if dtype in ir.FLOAT_DTYPES else ""
            self.line(f"if ({v.name} {cmp} {acc}{isnan}) {{ {acc} = {v.name}; {acc}_i = rindex; }}")
            return
        if rop in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):
            # the plain compare-select vectorizes (an OpenMP max/min reduction); a NaN is
            # remembered on the side and is the result (eager's max propagates NaN)
            cmp = ">" if rop == ir.ReduceOp.MAX else "<"
            self.line(f"{acc} = {v.name} {cmp} {acc} ? {v.name} : {acc};")
            if dtype in ir.FLOAT_DTYPES:
                self.line(f"{nan} |= ({v.name} != {v.name});")
            return
        self.line(self.combine(rop, acc, v.name, dtype))

    def finish(self, node: ir.Reduction, acc: str, dtype: str) -> None:
        """After the pass: a max/min that saw a NaN is NaN."""
        if node.reduce in (ir.ReduceOp.MAX, ir.ReduceOp.MIN) and dtype in ir.FLOAT_DTYPES:
            self.line(f"if ({acc}_nan) {acc} = std::numeric_limits<{CPP_TYPE[dtype]}>::quiet_NaN();")

    def _has_nan_flag(self, n: ir.Reduction, dtype: str) -> bool:
        return n.reduce in (ir.ReduceOp.MAX, ir.ReduceOp.MIN) and dtype in ir.FLOAT_DTYPES

    def open_pass(self, reds: list[ir.Reduction], start: str = "0", stop: str = "rnumel",
                  stores: bool = False, lanes: bool = False) -> dict:
        """Declare the pass's accumulators and open its loop over ``[start, stop)``. With
        ``lanes``, each reduction folds into `LANES` partials (``acc0_p[l]``), lane by lane
        in a ``simd`` loop over blocks of the row; `close_pass` combines them."""
        accs = {}
        self.lanes = lanes
        self.pass_no += 1
        # a scratch store may join a pass that folds lanes or reduces nothing; not an OpenMP
        # simd reduction (see the g++ note below)
        self.pass_safe = (lanes or not reds) and start == "0" and stop == "rnumel"
        for n in reds:
            dtype = self.acc_dtype(n)
            name = self.fresh("acc")
            t, ident = CPP_TYPE[dtype], self.identity(n.reduce, dtype)
            if lanes:
                flag = self._has_nan_flag(n, dtype)
                self.line(f"{t} {name}_p[{LANES}];" + (f" int {name}_pn[{LANES}];" if flag else ""))
                init = f"{name}_p[l] = {ident};" + (f" {name}_pn[l] = 0;" if flag else "")
                self.line(f"for (int l = 0; l < {LANES}; ++l) {{ {init} }}")
            else:
                self.line(f"{t} {name} = {ident};")
                if n.reduce in ir.INDEX_REDUCTIONS:
                    self.line(f"int64_t {name}_i = 0;")
                if self._has_nan_flag(n, dtype):
                    self.line(f"int {name}_nan = 0;")
            accs[n.name] = (name, dtype)
        if lanes:  # whole blocks, then the rest of the row (`tail_pass`)
            self.block = self.fresh("rb")
            self.line(f"{IDX} {self.block} = {start};")
            self.loop_at = len(self.lines)
            self.line(f"for (; {self.block} + {LANES} <= {stop}; {self.block} += {LANES}) {{")
            self.line("  #pragma omp simd")
            self.line(f"  for ({IDX} l = 0; l < {LANES}; ++l) {{")
            self.line(f"    const {IDX} rindex = {self.block} + l;")
            self.indent += 2
            self.depth = 2
            self.scopes.append({})
            self.values.append({})
            return accs
        self.loop_at = len(self.lines)
        clauses = {ir.ReduceOp.SUM: "+", ir.ReduceOp.MAX: "max", ir.ReduceOp.MIN: "min"}
        # Not a simd reduction in a pass that also stores: g++ 12 (-O3 -fopenmp, AVX2 and
        # AVX-512) computed wrong sums for tanh(x).sum(1) fused with a bf16 store of x * 2
        # (test_cpp_codegen's output-code test); such passes are lane passes, or left to the
        # auto-vectorizer.
        if all(n.reduce in clauses for n in reds) and not (reds and stores):
            # reassociating a sum is what lets it vectorize: a fixed order for a given build
            red = ""
            for rop, sym in clauses.items():
                names = [accs[n.name][0] for n in reds if n.reduce == rop]
                red += f" reduction({sym}:{', '.join(names)})" if names else ""
            flags = [f"{accs[n.name][0]}_nan" for n in reds
                     if n.reduce != ir.ReduceOp.SUM and accs[n.name][1] in ir.FLOAT_DTYPES]
            red += f" reduction(|:{', '.join(flags)})" if flags else ""
            self.line(f"#pragma omp simd{red}")
        self.line(f"for ({IDX} rindex = {start}; rindex < {stop}; ++rindex) {{")
        self.indent += 1
        self.depth = 1
        self.scopes.append({})
        self.values.append({})
        return accs

    def tail_pass(self, stop: str = "rnumel") -> None:
        """Close a lane pass's loop over whole blocks and open the one over the rest of the
        row (fewer than `LANES` elements), whose body is written again."""
        self.scopes.pop()
        self.values.pop()
        for _ in range(self.depth):
            self.indent -= 1
            self.line("}")
        self.line("#pragma omp simd")
        self.line(f"for ({IDX} l = 0; l < {stop} - {self.block}; ++l) {{")
        self.line(f"  const {IDX} rindex = {self.block} + l;")
        self.indent += 1
        self.depth = 1
        self.scopes.append({})
        self.values.append({})

    def close_pass(self, reds: list[ir.Reduction] = (), accs: dict | None = None) -> None:
        """Close the pass's loop; in a lane pass, combine each reduction's partials (a fixed
        tree: lane l with lane l + w, for w = LANES/2 ... 1) into ``acc`` (and ``acc_nan``)."""
        self.scopes.pop()
        self.values.pop()
        for _ in range(self.depth):
            self.indent -= 1
            self.line("}")
        self.loop_at = None
        self.depth = 0
        if not self.lanes:
            return
        self.lanes = False
        for n in reds:
            name, dtype = (accs or {})[n.name]
            flag = self._has_nan_flag(n, dtype)
            step = self.combine(n.reduce, f"{name}_p[l]", f"{name}_p[l + w]", dtype)
            if n.reduce in (ir.ReduceOp.MAX, ir.ReduceOp.MIN):  # NaNs are in the flags
                cmp = ">" if n.reduce == ir.ReduceOp.MAX else "<"
                step = f"{name}_p[l] = {name}_p[l + w] {cmp} {name}_p[l] ? {name}_p[l + w] : {name}_p[l];"
            if flag:
                step += f" {name}_pn[l] |= {name}_pn[l + w];"
            self.line(f"for (int w = {LANES // 2}; w >= 1; w /= 2) {{")
            self.line(f"  for (int l = 0; l < w; ++l) {{ {step} }}")
            self.line("}")
            nan = f" int {name}_nan = {name}_pn[0];" if flag else ""
            self.line(f"{CPP_TYPE[dtype]} {name} = {name}_p[0];{nan}")

    def use_lanes(self, reds: list[ir.Reduction]) -> bool:
        """A pass folds its reductions into lanes when they are all sums/extremes/any/all
        and the row is long enough to fill them (or its length is not known)."""
        r = self.g.rnumel
        return bool(reds) and all(n.reduce in _LANE_REDUCTIONS for n in reds) and (
            not r.is_Integer or int(r) >= 2 * LANES)

    def run_pass(self, batch: list[ir.Node]) -> None:
        reds = [n for n in batch if isinstance(n, ir.Reduction)]
        lanes = self.use_lanes(reds)
        accs = self.open_pass(reds, stores=any(n.name in self.g.stores for n in batch
                                               if not isinstance(n, ir.Reduction)), lanes=lanes)
        for _ in range(2 if lanes else 1):  # a lane pass: whole blocks, then the rest
            if _:
                self.tail_pass()
            for node in batch:
                if isinstance(node, ir.Reduction):
                    self.accumulate(node, *accs[node.name])
                else:
                    self.store(node, self.value_of(node))
        self.close_pass(reds, accs)
        for n in reds:
            self.finish(n, *accs[n.name])
        for n in reds:
            name, dtype = accs[n.name]
            index = n.reduce in ir.INDEX_REDUCTIONS
            t = _Tmp(f"{name}_i", ROWS, "int64") if index else _Tmp(name, ROWS, dtype)
            self.row_values[n.name] = t
            self.store(n, t)

    def passes(self) -> list[list[ir.Node] | ir.Node]:
        """The kernel's row program: passes over r (lists of nodes) and per-row nodes, in order."""
        out: list[list[ir.Node] | ir.Node] = []
        batch: list[ir.Node] = []
        pending: set[str] = set()
        for node in self.g.nodes:
            role = self.g.placement(node.name).role
            if role == Role.FULL and node.name not in self.g.stores:
                continue  # computed where it is read
            if self.row_deps(node) & pending:
                out.append(batch)
                batch, pending = [], set()
            if role == Role.ROW:
                out.append(node)
            else:
                batch.append(node)
                if isinstance(node, ir.Reduction):
                    pending.add(node.name)
        if batch:
            out.append(batch)
        return out

    # -- kernel bodies
    def body_pointwise(self) -> None:
        self.line(f"#pragma omp parallel for if(xnumel >= {PARALLEL_MIN_WORK})")
        self.line(f"for ({IDX} xo = 0; xo < xnumel; xo += {POINTWISE_CHUNK}) {{")
        self.indent += 1
        self.line(f"const {IDX} xend = xo + {POINTWISE_CHUNK} < xnumel ? xo + {POINTWISE_CHUNK} : xnumel;")
        self.line("#pragma omp simd")
        self.line(f"for ({IDX} xindex = xo; xindex < xend; ++xindex) {{")
        self.indent += 1
        for node in self.g.nodes:
            self.store(node, self.value_of(node))
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")

    def body_rows(self) -> None:
        self.line(f"#pragma omp parallel for if(xnumel * rnumel >= {PARALLEL_MIN_WORK})")
        self.line(f"for ({IDX} xindex = 0; xindex < xnumel; ++xindex) {{")
        self.indent += 1
        at = len(self.lines)
        self.run_steps(self.passes())
        for name, ctype in sorted(self.scratch_types.items(), reverse=True):  # each thread's own
            self.lines.insert(at, f"{self.INDENT * self.indent}alignas(64) {ctype} {name}[{self.g.rnumel}];")
        self.indent -= 1
        self.line("}")

    def run_steps(self, steps: list) -> None:
        """The row program's steps in order: passes over the row, and per-row values."""
        for step in steps:
            if isinstance(step, list):
                self.run_pass(step)
            else:
                t = self.emit(step.body, step)
                self.row_values[step.name] = t
                self.store(step, t)

    def splittable(self) -> bool:
        """One pass of sums/extremes (no stores inside it): rows can be split into partials."""
        steps = self.passes()
        if not steps or not isinstance(steps[0], list):
            return False
        first = steps[0]
        return all(isinstance(n, ir.Reduction) and n.reduce in _SPLITTABLE for n in first)

    def body_split(self) -> None:
        """Few long rows: the first pass's partials over fixed chunks of each row in parallel,
        combined in chunk order; the rest of the row program runs per row as usual."""
        steps = self.passes()
        first = steps[0]
        assert isinstance(first, list)
        reds = [n for n in first if isinstance(n, ir.Reduction)]
        self.line(f"const int64_t nchunks = (rnumel + {PARTIAL_CHUNK - 1}) / {PARTIAL_CHUNK};")
        parts = {}
        for n in reds:
            dtype = self.acc_dtype(n)
            name = self.fresh("part")
            # std::vector would need <vector>; one allocation per call
            self.line(f"{CPP_TYPE[dtype]}* {name} = new {CPP_TYPE[dtype]}[xnumel * nchunks + 1];")
            parts[n.name] = (name, dtype)
        self.line("#pragma omp parallel for collapse(2)")
        self.line("for (int64_t xindex = 0; xindex < xnumel; ++xindex) {")
        self.line("  for (int64_t c = 0; c < nchunks; ++c) {")
        self.indent += 2
        stop = f"(c + 1) * {PARTIAL_CHUNK} < rnumel ? (c + 1) * {PARTIAL_CHUNK} : rnumel"
        self.line(f"const int64_t rend = {stop};")
        accs = self.open_pass(reds, start=f"c * {PARTIAL_CHUNK}", stop="rend")
        for n in reds:
            self.accumulate(n, *accs[n.name])
        self.close_pass()
        for n in reds:
            self.finish(n, *accs[n.name])
            self.line(f"{parts[n.name][0]}[xindex * nchunks + c] = {accs[n.name][0]};")
        self.indent -= 2
        self.line("  }")
        self.line("}")
        self.scopes, self.values = [{}], [{}]
        self.line("for (int64_t xindex = 0; xindex < xnumel; ++xindex) {")
        self.indent += 1
        for n in reds:
            name, dtype = parts[n.name]
            acc = self.fresh("acc")
            self.line(f"{CPP_TYPE[dtype]} {acc} = {self.identity(n.reduce, dtype)};")
            self.line("for (int64_t c = 0; c < nchunks; ++c) {")
            self.line("  " + self.combine(n.reduce, acc, f"{name}[xindex * nchunks + c]", dtype))
            self.line("}")
            self.row_values[n.name] = _Tmp(acc, ROWS, dtype)
            self.store(n, self.row_values[n.name])
        self.run_steps(steps[1:])
        self.indent -= 1
        self.line("}")
        for name, _ in parts.values():
            self.line(f"delete[] {name};")

    # -- the whole kernel
    def reusable(self) -> dict[str, int]:
        """After `write`: costly values computed by more than one pass of a row kernel whose
        rows are short enough for a scratch array, each with the first pass computing it."""
        r = self.g.rnumel
        if self.g.kind == GroupKind.POINTWISE or self.use_split() or not r.is_Integer or int(r) > SCRATCH_MAX:
            return {}
        return {c: passes[0] for c, passes in self.seen.items() if len(set(passes)) > 1}

    def use_split(self) -> bool:
        x, r = self.g.xnumel, self.g.rnumel
        # static sizes only: a symbolic row would need both forms in the kernel
        return bool(x.is_Integer and r.is_Integer and int(x) < 8 and int(r) >= 4 * PARTIAL_CHUNK
                    and self.splittable())

    def index_type(self) -> str:
        """``int32_t`` when every buffer the kernel indexes (its elements, and its furthest
        element from the storage start) and its domain have fewer than 2**31 elements at
        every size its symbols allow; else ``int64_t``."""
        extents = [self.g.xnumel * self.g.rnumel]
        for buf in self.params:
            spec = self.prog.buffers[buf]
            extents.append(ir.product(spec.sizes))
            extents.append(storage_extent(spec.sizes, spec.strides, spec.offset))
        return "int32_t" if all(self.sizes.fits_int32(sympy.sympify(e)) for e in extents) else "int64_t"

    def write(self) -> S.Kernel:
        kind = self.g.kind
        if kind == GroupKind.POINTWISE:
            self.body_pointwise()
        elif self.use_split():
            self.body_split()
        else:
            self.body_rows()
        itype = self.index_type()
        body = [line.replace(IDX, itype) for line in self.lines]
        name = self.name()
        ptr_params = sorted(self.params.items(), key=lambda kv: (kv[1].startswith("out"),
                                                                  int(kv[1].split("ptr")[1])))
        sym_params = sorted(self.size_syms, key=lambda s: s.name)
        scalar_names = ["xnumel"] + (["rnumel"] if kind != GroupKind.POINTWISE else [])
        args = []
        for buf, p in ptr_params:
            const = "" if p.startswith("out") else "const "
            args.append(f"{const}{STORAGE_TYPE[self.prog.buffers[buf].dtype]}* {p}")
        args += [f"int64_t {n}" for n in scalar_names + [s.name for s in sym_params]]
        src = [PRELUDE.rstrip(), *helper_source(self.helpers), "",
               f'extern "C" void {name}({", ".join(args)}) {{', *body, "}", ""]
        params = [S.KernelParam(name=p, kind="ptr", dtype=self.prog.buffers[b].dtype) for b, p in ptr_params]
        params += [S.KernelParam(name=n, kind="i64") for n in scalar_names + [s.name for s in sym_params]]
        meta = {
            "buffers": ",".join(b for b, _ in ptr_params),
            "kind": kind.value,
            "nodes": ",".join(n.name for n in self.g.nodes),
        }
        return S.Kernel(name=name, source="\n".join(src), entry=name, language="cpp",
                        signature=tuple(params), grid=(1,), meta=meta)


def _fold_cast(value: float | int | bool, dtype: str) -> float | int | bool | None:
    if dtype == "bool":
        return bool(value)
    if dtype in ir.FLOAT_DTYPES:
        return float(value)
    try:
        return int(value)
    except (OverflowError, ValueError):  # a non-finite float: left to the compiled cast
        return None


def generate_kernel(group: KernelGroup, prog: ir.LoopProgram, config: InductorConfig) -> S.Kernel:
    """The kernel of ``group``; written twice when a first writing finds costly values that
    several passes compute (softmax: ``exp(x - max)``, summed, then divided by the sum): the
    second keeps them in a row scratch array."""
    writer = CppKernelWriter(group, prog, config)
    kernel = writer.write()
    reuse = writer.reusable()
    return CppKernelWriter(group, prog, config, reuse).write() if reuse else kernel
