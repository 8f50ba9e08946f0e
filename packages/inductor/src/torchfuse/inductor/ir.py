"""The loop IR: what a tensor computation is, element by element, before it becomes a kernel.

One vocabulary for this level (`VOp` for scalar operations, `ReduceOp` for
reductions). A *value* is a small expression tree evaluated at one point of an iteration
space: `Load` (a buffer at a sympy index), `Const`, `IndexValue`,
`Cast` and `Call`. A *node* computes one buffer:

* `Pointwise` -- ``buf[store_index(x)] = body(x)`` for every ``x`` in ``ranges``;
* `Reduction` -- ``buf[store_index(x)] = reduce_r body(x, r)``;
* `Extern` -- an ATen call (matmuls, anything without a lowering).

Index expressions are sympy expressions over the node's loop variables (``x0, x1, …`` for
``ranges``, ``r0, r1, …`` for ``rranges``) and size symbols (``s0``). Floor division and
modulo are the two sympy functions `FloorDiv` and `ModIdx` so that printing
and simplification stay under our control. Example (``sum((x + y) * 2, dim=1)`` on 4x8)::

    buf0 = Reduction(ranges=[4], rranges=[8], reduce=sum)
        body: ((load(arg0, 8*x0 + r0) + load(arg1, 8*x0 + r0)) * 2.0)
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy
from torchfuse.inductor.index import (  # the index algebra, re-exported
    FloorDiv as FloorDiv,
)
from torchfuse.inductor.index import (
    ModIdx as ModIdx,
)
from torchfuse.inductor.index import (
    contiguous_strides as contiguous_strides,
)
from torchfuse.inductor.index import (
    exact_div as exact_div,
)
from torchfuse.inductor.index import (
    loop_var as loop_var,
)
from torchfuse.inductor.index import (
    print_index as print_index,
)
from torchfuse.inductor.index import (
    product as product,
)
from torchfuse.inductor.index import (
    simplify_index as simplify_index,
)
from torchfuse.inductor.index import (
    size_symbol as size_symbol,
)
from torchfuse.inductor.index import (
    substitute as substitute,
)
from torchfuse.inductor.index import (
    symbolic_upper as symbolic_upper,
)
from torchfuse.inductor.index import (
    unflatten as unflatten,
)
from torchfuse.inductor.index import (
    upper_bound as upper_bound,
)

# ----------------------------------------------------------------------------- vocabulary


class VOp(enum.Enum):
    """Scalar operations of the loop IR."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    TRUEDIV = "truediv"
    FLOORDIV = "floordiv"
    REM = "rem"
    POW = "pow"
    MAX = "maximum"
    MIN = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"
    XOR = "xor"
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SIGN = "sign"
    NOT = "not"
    ISNAN = "isnan"
    ISINF = "isinf"
    BITNOT = "bitnot"
    WHERE = "where"


UNARY = frozenset(
    {
        VOp.NEG,
        VOp.ABS,
        VOp.EXP,
        VOp.EXP2,
        VOp.LOG,
        VOp.LOG2,
        VOp.LOG1P,
        VOp.EXPM1,
        VOp.SQRT,
        VOp.RSQRT,
        VOp.SIN,
        VOp.COS,
        VOp.TAN,
        VOp.TANH,
        VOp.SIGMOID,
        VOp.ERF,
        VOp.RECIPROCAL,
        VOp.FLOOR,
        VOp.CEIL,
        VOp.ROUND,
        VOp.TRUNC,
        VOp.SIGN,
        VOp.NOT,
        VOp.ISNAN,
        VOp.ISINF,
        VOp.BITNOT,
    }
)
BINARY = frozenset(
    {
        VOp.ADD,
        VOp.SUB,
        VOp.MUL,
        VOp.TRUEDIV,
        VOp.FLOORDIV,
        VOp.REM,
        VOp.POW,
        VOp.MAX,
        VOp.MIN,
        VOp.EQ,
        VOp.NE,
        VOp.LT,
        VOp.LE,
        VOp.GT,
        VOp.GE,
        VOp.AND,
        VOp.OR,
        VOp.XOR,
    }
)
TERNARY = frozenset({VOp.WHERE})
COMPARISON = frozenset({VOp.EQ, VOp.NE, VOp.LT, VOp.LE, VOp.GT, VOp.GE, VOp.ISNAN, VOp.ISINF, VOp.NOT})
"""Ops whose result is ``bool`` whatever their operands."""
FLOAT_ONLY = frozenset(
    {
        VOp.TRUEDIV,
        VOp.EXP,
        VOp.EXP2,
        VOp.LOG,
        VOp.LOG2,
        VOp.LOG1P,
        VOp.EXPM1,
        VOp.SQRT,
        VOp.RSQRT,
        VOp.SIN,
        VOp.COS,
        VOp.TAN,
        VOp.TANH,
        VOp.SIGMOID,
        VOp.ERF,
        VOp.RECIPROCAL,
        VOp.POW,
    }
)
"""Ops computed in floating point (integer operands are promoted by the lowering)."""


class ReduceOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    ANY = "any"
    ALL = "all"


INDEX_REDUCTIONS = frozenset({ReduceOp.ARGMAX, ReduceOp.ARGMIN})
SPLITTABLE = frozenset({ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.ANY, ReduceOp.ALL})
"""Reductions that can be computed as a reduction of partial reductions of the same kind."""

FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})
LOW_PRECISION = frozenset({"float16", "bfloat16"})


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic is done in: half types are widened to float32."""
    return "float32" if dtype in LOW_PRECISION else dtype


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Load:
    buffer: str
    index: sympy.Expr
    dtype: str
    indirect: tuple[tuple[sympy.Symbol, Value], ...] = ()
    """Symbols in ``index`` that stand for runtime values (gather, embedding, indexing)."""
    mask: Value | None = None
    """A boolean value: the load happens only where it is true (elsewhere it reads 0 and
    ``index`` may be out of range). ``cat`` guards each part's loads with its range, so the
    index stays affine (no clamping) and the loads stay vectorizable."""


@dataclass(frozen=True, slots=True)
class Const:
    value: float | int | bool
    dtype: str


@dataclass(frozen=True, slots=True)
class IndexValue:
    """The integer value of an index expression (``arange``, masks of ``tril``)."""

    index: sympy.Expr
    dtype: str = "int64"


@dataclass(frozen=True, slots=True)
class Cast:
    arg: Value
    dtype: str


@dataclass(frozen=True, slots=True)
class Call:
    op: VOp
    args: tuple[Value, ...]
    dtype: str


Value = Load | Const | IndexValue | Cast | Call


def value_size(v: Value) -> int:
    if isinstance(v, Call):
        return 1 + sum(value_size(a) for a in v.args)
    if isinstance(v, Cast):
        return 1 + value_size(v.arg)
    if isinstance(v, Load):
        return 1 + sum(value_size(x) for _, x in v.indirect) + (value_size(v.mask) if v.mask else 0)
    return 1


@functools.lru_cache(maxsize=1 << 16)
def free_symbols(e: sympy.Expr) -> frozenset[sympy.Symbol]:
    """``e.free_symbols``, remembered: sympy walks the whole expression each time it is
    asked, and the verifier and the kernel writer ask of the same index expressions again and
    again (OPT training's verifier: 2.6k walks, a third of its time)."""
    return frozenset(e.free_symbols)


def loads_of(v: Value) -> list[Load]:
    """Every `Load` in ``v``, indirect index loads included."""
    out: list[Load] = []
    stack = [v]
    # Values are DAGs (a value read twice is one shared object): visit each node once, or a
    # chain of such reads (small_ops' ten sin/cos rounds) costs exponential time.
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Load):
            out.append(n)
            stack.extend(x for _, x in n.indirect)
            if n.mask is not None:
                stack.append(n.mask)
        elif isinstance(n, Cast):
            stack.append(n.arg)
        elif isinstance(n, Call):
            stack.extend(n.args)
    return out


def guard(v: Value, cond: Value) -> Value:
    """``v`` with every load (indirect index loads included) done only where ``cond``."""

    def add(ld: Load) -> Load:
        mask = cond if ld.mask is None else Call(VOp.AND, (ld.mask, cond), "bool")
        return Load(ld.buffer, ld.index, ld.dtype, ld.indirect, mask)

    return map_loads(v, add)


def map_loads(v: Value, fn) -> Value:
    """Rebuild ``v`` with every Load replaced by ``fn(load)``."""
    if isinstance(v, Load):
        ind = tuple((s, map_loads(x, fn)) for s, x in v.indirect)
        mask = map_loads(v.mask, fn) if v.mask is not None else None
        same = ind == v.indirect and mask == v.mask
        return fn(v if same else Load(v.buffer, v.index, v.dtype, ind, mask))
    if isinstance(v, Cast):
        return Cast(map_loads(v.arg, fn), v.dtype)
    if isinstance(v, Call):
        return Call(v.op, tuple(map_loads(a, fn) for a in v.args), v.dtype)
    return v


# ----------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """A buffer of the loop program: inputs, computed buffers and extern outputs."""

    name: str
    dtype: str
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.S.Zero
    kind: str = "computed"
    """``input``, ``computed`` (written by a kernel), ``extern`` (returned by an op) or ``view``."""
    view_of: str | None = None
    device: str | None = None
    """Set for a CPU input or extern result of a GPU program; ``None``: the program's device."""


@dataclass(frozen=True, slots=True)
class Pointwise:
    name: str
    ranges: tuple[sympy.Expr, ...]
    body: Value
    dtype: str
    store_index: sympy.Expr
    origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reduction:
    name: str
    ranges: tuple[sympy.Expr, ...]
    rranges: tuple[sympy.Expr, ...]
    body: Value
    reduce: ReduceOp
    dtype: str
    store_index: sympy.Expr
    origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Extern:
    """An ATen call; tensor arguments are buffer names (``TensorRef``) in ``args``."""

    name: str
    op: str
    args: tuple = ()
    kwargs: tuple[tuple[str, object], ...] = ()
    outputs: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class View:
    """A named strided view of a buffer (for extern arguments and outputs)."""

    name: str
    base: str


Node = Pointwise | Reduction | Extern | View


@dataclass(frozen=True, slots=True)
class LoopProgram:
    """The lowered graph: buffers, nodes in a valid order, and outputs."""

    name: str
    inputs: tuple[str, ...]
    buffers: Mapping[str, BufferSpec]
    nodes: tuple[Node, ...]
    outputs: tuple[object, ...]
    """Buffer names (``str``) or format scalars for non-tensor outputs."""
    symbols: tuple = ()
    device: str = "cpu"
    meta: Mapping[str, str] = field(default_factory=dict)


def reads(node: Node) -> list[str]:
    """Buffer names a node reads, without duplicates, in first-use order."""
    if isinstance(node, Pointwise | Reduction):
        names = [ld.buffer for ld in loads_of(node.body)]
    elif isinstance(node, View):
        names = [node.base]
    else:
        from torchfuse.graph.ops import tensor_refs

        names = tensor_refs(list(node.args) + [v for _, v in node.kwargs])
    return list(dict.fromkeys(names))


def writes(node: Node) -> list[str]:
    if isinstance(node, Extern):
        return [o for o in node.outputs if o]
    return [node.name]


# ----------------------------------------------------------------------------- printing


@functools.lru_cache(maxsize=1 << 16)
def _idx(e: sympy.Expr) -> str:
    """An index as the debug texts print it; remembered (the pre- and post-fusion texts of
    every compile print the same indices again, sympy's printer being most of their time)."""
    text = print_index(e)
    return text[1:-1] if isinstance(e, sympy.Add | sympy.Mul) else text


def format_value(v: Value) -> str:
    if isinstance(v, Load):
        ind = "".join(f", {s}={format_value(x)}" for s, x in v.indirect)
        if v.mask is not None:
            ind += f", mask={format_value(v.mask)}"
        return f"load({v.buffer}, {_idx(v.index)}{ind})"
    if isinstance(v, Const):
        return repr(v.value)
    if isinstance(v, IndexValue):
        return f"index({_idx(v.index)})"
    if isinstance(v, Cast):
        return f"{format_value(v.arg)}.to({v.dtype})"
    return f"{v.op.value}({', '.join(format_value(a) for a in v.args)})"


@functools.lru_cache(maxsize=1 << 14)
def text(e: sympy.Expr) -> str:
    """``str(e)``, remembered: sympy prints even an integer through its printer, and the debug
    texts and the scheduler's decisions print the same few hundred sizes thousands of times
    (BERT training's decisions: 1.4k, 37 ms under cProfile)."""
    return str(e)


def _sizes(sizes: tuple[sympy.Expr, ...]) -> str:
    """A node's loop sizes as a list prints them."""
    return "[" + ", ".join(map(text, sizes)) + "]"


def format_node(node: Node) -> str:
    if isinstance(node, Pointwise):
        return (
            f"{node.name}: Pointwise[{node.dtype}] ranges={_sizes(node.ranges)} "
            f"origins={list(node.origins)}\n  store[{_idx(node.store_index)}] = {format_value(node.body)}"
        )
    if isinstance(node, Reduction):
        return (
            f"{node.name}: Reduction[{node.dtype}] {node.reduce.value} ranges={_sizes(node.ranges)} "
            f"rranges={_sizes(node.rranges)} origins={list(node.origins)}\n"
            f"  store[{_idx(node.store_index)}] = {node.reduce.value}_r {format_value(node.body)}"
        )
    if isinstance(node, View):
        return f"{node.name}: View of {node.base}"
    return f"{', '.join(node.outputs)}: Extern {node.op}({', '.join(map(str, node.args))})"


def format_program(p: LoopProgram) -> str:
    lines = [f"# loop program {p.name}", f"inputs: {', '.join(p.inputs)}"]
    for node in p.nodes:
        lines.append(format_node(node))
    lines.append(f"outputs: {', '.join(map(str, p.outputs))}")
    return "\n".join(lines) + "\n"


class IRVerifyError(AssertionError):
    """A loop program that breaks an invariant (a compiler bug, not a user error)."""


def verify(p: LoopProgram) -> LoopProgram:
    """Check the invariants of a loop program; returns it unchanged.

    Every buffer read is an input or written by an earlier node; every written buffer is
    declared; a node's indices use only its own loop variables, size symbols and indirect
    symbols bound by the same load.
    """
    known = set(p.inputs)
    for name in p.inputs:
        if name not in p.buffers:
            raise IRVerifyError(f"input {name} has no buffer")
    for node in p.nodes:
        loads = loads_of(node.body) if isinstance(node, Pointwise | Reduction) else None
        names = dict.fromkeys(ld.buffer for ld in loads) if loads is not None else reads(node)
        for b in names:
            if b not in known:
                raise IRVerifyError(f"{node.name} reads {b} before it is written")
        if isinstance(node, Pointwise | Reduction):
            assert loads is not None
            allowed = {loop_var("x", i) for i in range(len(node.ranges))}
            if isinstance(node, Reduction):
                allowed |= {loop_var("r", i) for i in range(len(node.rranges))}
            exprs = [node.store_index] + [ld.index for ld in loads]
            for ld in loads:
                allowed |= {s for s, _ in ld.indirect}
            for e in exprs:
                stray = {s for s in free_symbols(e) if s.name[0] in "xr" and s not in allowed}
                if stray:
                    raise IRVerifyError(f"{node.name}: index {e} uses {sorted(map(str, stray))}")
        for w in writes(node):
            if w not in p.buffers:
                raise IRVerifyError(f"{node.name} writes undeclared buffer {w}")
            known.add(w)
    for o in p.outputs:
        if isinstance(o, str) and o not in known:
            raise IRVerifyError(f"output {o} is never written")
    return p
