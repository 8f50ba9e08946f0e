"""The lowering rules: ATen op name -> how it becomes loaders and loop-IR nodes.

Each rule takes the [`Lowering`][torchfuse.inductor.lowering.Lowering] and the graph node and
returns a [`TensorValue`][torchfuse.inductor.lowering.TensorValue] (or a list, for ops with several
outputs), and is registered into the engine's table with
[`register`][torchfuse.inductor.lowering.register] (an op registered twice fails at import). A
rule raises [`Fallback`][torchfuse.inductor.lowering.Fallback] to have the op called through
ATen instead. Views and indexing: `.lowerings_index`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
from torchfuse.graph import schema as S
from torchfuse.graph.ops import resolve_op
from torchfuse.inductor import ir
from torchfuse.inductor.ir import VOp
from torchfuse.inductor.lowering import (
    RULES,
    Fallback,
    Lowering,
    TensorValue,
    _functional_name,
    cast,
    expr_of,
    register,
    result_dtype,
)

# ----------------------------------------------------------------------------- argument access


def _decode(L: Lowering, a: S.Argument) -> Any:
    if isinstance(a, S.TensorRef):
        return L.env[a.name]
    if isinstance(a, S.ListArg):
        return [_decode(L, x) for x in a.items]
    if isinstance(a, S.SymRef):
        return expr_of(a.expr)
    if isinstance(a, S.Int | S.Bool | S.Str):
        return a.value
    if isinstance(a, S.Float):
        return float(a.value)
    if isinstance(a, S.DtypeArg):
        return a.name
    if isinstance(a, S.DeviceArg):
        return a.name
    if isinstance(a, S.NoneArg):
        return None
    return a


def bind(L: Lowering, node: S.Node) -> dict[str, Any]:
    """Arguments by schema name, defaults filled in."""
    schema = resolve_op(_functional_name(node.op))._schema
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = _decode(L, node.args[i])
        elif arg.name in node.kwargs:
            out[arg.name] = _decode(L, node.kwargs[arg.name])
        elif arg.has_default_value():
            d = arg.default_value
            out[arg.name] = d if not hasattr(d, "is_floating_point") else str(d).removeprefix("torch.")
        else:
            out[arg.name] = None
    return out


def out_meta(L: Lowering, node: S.Node, i: int = 0) -> tuple[tuple[sympy.Expr, ...], str]:
    m = L.meta(node.outputs[i])
    return tuple(expr_of(s) for s in m.sizes), m.dtype


def broadcast_loader(tv: TensorValue, sizes: Sequence[sympy.Expr]):
    off = len(sizes) - len(tv.sizes)

    def load(idx):
        return tv.loader(
            [
                sympy.Integer(0) if (tv.sizes[i] == 1 and sizes[off + i] != 1) else idx[off + i]
                for i in range(len(tv.sizes))
            ]
        )

    return load


def _value(x: Any, sizes, dtype: str):
    """A loader for a tensor or scalar operand, cast to ``dtype``."""
    if isinstance(x, TensorValue):
        ld = broadcast_loader(x, sizes)
        return lambda idx: cast(ld(idx), dtype)
    if isinstance(x, sympy.Expr):
        return lambda idx: cast(ir.IndexValue(x), dtype)
    return lambda idx: ir.Const(pyval(x, dtype), dtype)


def pyval(x, dtype):
    if dtype == "bool":
        return bool(x)
    if dtype in ir.FLOAT_DTYPES:
        return float(x)
    return int(x)


def pointwise(
    L: Lowering, node: S.Node, fn: Callable[..., ir.Value], inputs: Sequence[Any], compute: str | None = None
) -> TensorValue:
    sizes, out = out_meta(L, node)
    cdt = compute or ir.compute_dtype(out)
    loaders = [_value(x, sizes, cdt) for x in inputs]
    tvs = [x for x in inputs if isinstance(x, TensorValue)]
    origins = (*tuple(dict.fromkeys(o for t in tvs for o in t.origins)), node.op.split(".")[1].strip("_"))

    def load(idx):
        return fn(*[ld(idx) for ld in loaders])

    return TensorValue(sizes, out, load, None, origins, 1 + sum(t.ops for t in tvs))


def call(op: VOp, *args: ir.Value) -> ir.Value:
    dtype = "bool" if op in ir.COMPARISON else args[-1].dtype if op == VOp.WHERE else args[0].dtype
    return ir.Call(op, tuple(args), dtype)


# ----------------------------------------------------------------------------- pointwise


_UNARY = {
    "neg": VOp.NEG,
    "abs": VOp.ABS,
    "exp": VOp.EXP,
    "exp2": VOp.EXP2,
    "log": VOp.LOG,
    "log2": VOp.LOG2,
    "log1p": VOp.LOG1P,
    "expm1": VOp.EXPM1,
    "sqrt": VOp.SQRT,
    "rsqrt": VOp.RSQRT,
    "sin": VOp.SIN,
    "cos": VOp.COS,
    "tan": VOp.TAN,
    "tanh": VOp.TANH,
    "sigmoid": VOp.SIGMOID,
    "erf": VOp.ERF,
    "reciprocal": VOp.RECIPROCAL,
    "floor": VOp.FLOOR,
    "ceil": VOp.CEIL,
    "round": VOp.ROUND,
    "trunc": VOp.TRUNC,
    "sign": VOp.SIGN,
}
for _name, _vop in _UNARY.items():

    def _unary(L, node, _vop=_vop):
        x = bind(L, node)["self"]
        return pointwise(L, node, lambda a: call(_vop, a), [x])

    register(f"aten.{_name}.default")(_unary)


@register("aten.relu.default")
def _relu(L, node):
    x = bind(L, node)["self"]
    return pointwise(L, node, lambda a: call(VOp.MAX, a, ir.Const(pyval(0, a.dtype), a.dtype)), [x])


@register("aten.isnan.default", "aten.isinf.default", "aten.logical_not.default", "aten.bitwise_not.default")
def _pred(L, node):
    x = bind(L, node)["self"]
    name = node.op.split(".")[1]
    vop = {"isnan": VOp.ISNAN, "isinf": VOp.ISINF, "logical_not": VOp.NOT, "bitwise_not": VOp.BITNOT}[name]
    cdt = ir.compute_dtype(x.dtype)
    if vop == VOp.BITNOT:
        return pointwise(L, node, lambda a: call(vop, a), [x])
    return pointwise(L, node, lambda a: call(vop, a), [x], compute=cdt)


_BINARY = {
    "add": VOp.ADD,
    "sub": VOp.SUB,
    "mul": VOp.MUL,
    "div": VOp.TRUEDIV,
    "true_divide": VOp.TRUEDIV,
    "maximum": VOp.MAX,
    "minimum": VOp.MIN,
    "remainder": VOp.REM,
    "floor_divide": VOp.FLOORDIV,
    "bitwise_and": VOp.AND,
    "bitwise_or": VOp.OR,
    "bitwise_xor": VOp.XOR,
}
_COMPARE = {"eq": VOp.EQ, "ne": VOp.NE, "lt": VOp.LT, "le": VOp.LE, "gt": VOp.GT, "ge": VOp.GE}
_LOGICAL = {"logical_and": VOp.AND, "logical_or": VOp.OR, "logical_xor": VOp.XOR}


def _binary_rule(vop: VOp):
    def rule(L, node):
        b = bind(L, node)
        x, y = b["self"], b["other"]
        alpha = b.get("alpha", 1)
        if alpha not in (None, 1):
            if vop not in (VOp.ADD, VOp.SUB):
                raise Fallback("alpha")
            return pointwise(L, node, lambda p, q, a: call(vop, p, call(VOp.MUL, q, a)), [x, y, alpha])
        mode = b.get("rounding_mode")
        if mode == "floor":
            return pointwise(
                L,
                node,
                lambda p, q: (
                    call(VOp.FLOORDIV, p, q)
                    if p.dtype not in ir.FLOAT_DTYPES
                    else call(VOp.FLOOR, call(VOp.TRUEDIV, p, q))
                ),
                [x, y],
            )
        if mode == "trunc":
            return pointwise(
                L,
                node,
                lambda p, q: call(VOp.TRUNC, call(VOp.TRUEDIV, cast(p, "float32"), cast(q, "float32"))),
                [x, y],
            )
        return pointwise(L, node, lambda p, q: call(vop, p, q), [x, y])

    return rule


def _rsub(L, node):
    b = bind(L, node)
    x, y, alpha = b["self"], b["other"], b.get("alpha", 1)
    return pointwise(L, node, lambda p, q, a: call(VOp.SUB, q, call(VOp.MUL, p, a)), [x, y, alpha or 1])


register("aten.rsub.Scalar", "aten.rsub.Tensor")(_rsub)


def _existing(*names: str) -> list[str]:
    out = []
    for n in names:
        try:
            resolve_op(n)
            out.append(n)
        except LookupError:
            pass
    return out


for _name, _vop in _BINARY.items():
    register(
        *_existing(
            f"aten.{_name}.Tensor",
            f"aten.{_name}.Scalar",
            f"aten.{_name}.default",
            f"aten.{_name}.Tensor_mode",
            f"aten.{_name}.Scalar_mode",
        )
    )(_binary_rule(_vop))
for _name, _vop in _COMPARE.items():

    def _cmp(L, node, _vop=_vop):
        b = bind(L, node)
        cdt = ir.compute_dtype(result_dtype(b["self"], b["other"]))
        return pointwise(L, node, lambda p, q: call(_vop, p, q), [b["self"], b["other"]], compute=cdt)

    register(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_cmp)
for _name, _vop in _LOGICAL.items():

    def _logical(L, node, _vop=_vop):
        b = bind(L, node)
        return pointwise(L, node, lambda p, q: call(_vop, p, q), [b["self"], b["other"]], compute="bool")

    register(f"aten.{_name}.default")(_logical)


@register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(L, node):
    b = bind(L, node)
    base, exp = b["self"], b["exponent"]
    if isinstance(exp, int | float) and not isinstance(exp, bool) and isinstance(base, TensorValue):
        e = float(exp)
        simple = {0.5: VOp.SQRT, -0.5: VOp.RSQRT, -1.0: VOp.RECIPROCAL}
        if e in simple and base.dtype in ir.FLOAT_DTYPES:
            return pointwise(L, node, lambda p: call(simple[e], p), [base])
        if e.is_integer() and 0 <= e <= 4:

            def mul_n(p, n=int(e)):
                if n == 0:
                    return ir.Const(pyval(1, p.dtype), p.dtype)
                out = p
                for _ in range(n - 1):
                    out = call(VOp.MUL, out, p)
                return out

            return pointwise(L, node, mul_n, [base])
    _, out = out_meta(L, node)
    if out not in ir.FLOAT_DTYPES:
        raise Fallback("integer pow")
    return pointwise(L, node, lambda p, q: call(VOp.POW, p, q), [base, exp])


@register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    return _where_impl(L, node, b, ir.compute_dtype(out), _value(b["condition"], sizes, "bool"))


def _where_impl(L, node, b, cdt, cond):
    sizes, out = out_meta(L, node)
    lx = _value(b["self"], sizes, cdt)
    ly = _value(b["other"], sizes, cdt)
    tvs = [t for t in (b["condition"], b["self"], b["other"]) if isinstance(t, TensorValue)]
    origins = (*tuple(dict.fromkeys(o for t in tvs for o in t.origins)), "where")
    return TensorValue(
        sizes,
        out,
        lambda idx: call(VOp.WHERE, cond(idx), lx(idx), ly(idx)),
        None,
        origins,
        1 + sum(t.ops for t in tvs),
    )


@register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    cdt = ir.compute_dtype(out)
    return _where_impl(
        L,
        node,
        {"condition": b["mask"], "self": b["value"], "other": b["self"]},
        cdt,
        _value(b["mask"], sizes, "bool"),
    )


@register(
    "aten.clamp.default",
    "aten.clamp.Tensor",
    "aten.clamp_min.default",
    "aten.clamp_max.default",
    "aten.clamp_min.Tensor",
    "aten.clamp_max.Tensor",
    "aten.hardtanh.default",
)
def _clamp(L, node):
    b = bind(L, node)
    name = node.op.split(".")[1]
    lo = b.get("min", b.get("min_val")) if name != "clamp_max" else None
    hi = b.get("max", b.get("max_val")) if name != "clamp_min" else None
    if name == "hardtanh":
        lo, hi = b["min_val"], b["max_val"]
    ops = [b["self"]]
    if lo is not None:
        ops.append(lo)
    if hi is not None:
        ops.append(hi)

    def fn(x, *bounds):
        i = 0
        if lo is not None:
            x = call(VOp.MAX, x, bounds[i])
            i += 1
        if hi is not None:
            x = call(VOp.MIN, x, bounds[i])
        return x

    return pointwise(L, node, fn, ops)


@register(
    "aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default", "aten.contiguous.default"
)
def _copy(L, node):
    x = bind(L, node)["self"]
    sizes, out = out_meta(L, node)
    # keep explicit narrowing casts: they round, and eager code relies on that
    return TensorValue(
        sizes,
        out,
        lambda idx: cast(x.loader(idx), out),
        None,
        (*x.origins, "to_copy" if x.dtype != out else "clone"),
        x.ops + (x.dtype != out),
    )


@register("aten.copy.default")
def _copy_into(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    ld = broadcast_loader(b["src"], sizes)
    return TensorValue(sizes, out, lambda idx: cast(ld(idx), out), None, ("copy",), b["src"].ops + 1)


# ----------------------------------------------------------------------------- factories


@register(
    "aten.full.default",
    "aten.zeros.default",
    "aten.ones.default",
    "aten.empty.memory_format",
    "aten.full_like.default",
    "aten.zeros_like.default",
    "aten.ones_like.default",
    "aten.empty_like.default",
    "aten.new_zeros.default",
    "aten.new_ones.default",
    "aten.new_full.default",
    "aten.new_empty.default",
    "aten.scalar_tensor.default",
    "aten.empty_strided.default",
)
def _full(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    name = node.op.split(".")[1]
    if "fill_value" in b and b["fill_value"] is not None:
        v = b["fill_value"]
    elif "s" in b and name == "scalar_tensor":
        v = b["s"]
    else:
        v = 1 if "ones" in name else 0
    if isinstance(v, sympy.Expr):
        raise Fallback("symbolic fill")
    return TensorValue(sizes, out, lambda idx: ir.Const(pyval(v, out), out), None, (name,), 0)


@register("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(L, node):
    b = bind(L, node)
    sizes, out = out_meta(L, node)
    start = b.get("start") or 0
    step = b.get("step") or 1
    symbolic = any(isinstance(v, sympy.Expr) and not v.is_Integer for v in (start, step))
    if symbolic and out in ir.FLOAT_DTYPES:
        raise Fallback("floating arange from a symbolic size")
    if symbolic:  # arange(s0, 2*s0): the value is the index expression itself
        first, stride = sympy.sympify(start), sympy.sympify(step)
        return TensorValue(sizes, out, lambda idx: cast(ir.IndexValue(first + stride * idx[0]), out), None,
                           ("arange",), 0)
    if out in ir.FLOAT_DTYPES or any(
        isinstance(v, float) and not float(v).is_integer() for v in (start, step)
    ):
        return TensorValue(
            sizes,
            out,
            lambda idx: call(
                VOp.ADD,
                ir.Const(float(start), "float32"),
                call(VOp.MUL, cast(ir.IndexValue(idx[0]), "float32"), ir.Const(float(step), "float32")),
            ),
            None,
            ("arange",),
            1,
        )
    return TensorValue(
        sizes,
        out,
        lambda idx: cast(ir.IndexValue(int(start) + int(step) * idx[0]), out),
        None,
        ("arange",),
        0,
    )


# ----------------------------------------------------------------------------- reductions


def _dims_arg(x: TensorValue, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, list) and not dim):
        return list(range(len(x.sizes)))
    return [d % max(len(x.sizes), 1) for d in ([dim] if isinstance(dim, int) else dim)]


def _reduce_rule(rop: ir.ReduceOp):
    def rule(L, node):
        b = bind(L, node)
        x = b["self"]
        _, out = out_meta(L, node)
        dims = _dims_arg(x, b.get("dim"))
        keepdim = bool(b.get("keepdim") or False)
        if not x.sizes:
            dims = []
        res = L.reduction(x, dims, keepdim, rop, out, node.op.split(".")[1])
        return res

    return rule


register("aten.sum.dim_IntList", "aten.sum.default")(_reduce_rule(ir.ReduceOp.SUM))
register("aten.prod.dim_int", "aten.prod.default")(_reduce_rule(ir.ReduceOp.PROD))
register("aten.amax.default")(_reduce_rule(ir.ReduceOp.MAX))
register("aten.amin.default")(_reduce_rule(ir.ReduceOp.MIN))
register("aten.any.dim", "aten.any.dims", "aten.any.default")(_reduce_rule(ir.ReduceOp.ANY))
register("aten.all.dim", "aten.all.dims", "aten.all.default")(_reduce_rule(ir.ReduceOp.ALL))


def _arg_rule(rop: ir.ReduceOp):
    def rule(L, node):
        b = bind(L, node)
        x = b["self"]
        _, out = out_meta(L, node)
        dim = b.get("dim")
        keepdim = bool(b.get("keepdim") or False)
        if dim is None:
            flat = TensorValue(
                (ir.product(x.sizes),),
                x.dtype,
                lambda idx: x.loader(ir.unflatten(idx[0], x.sizes)),
                None,
                x.origins,
                x.ops,
            )
            return L.reduction(flat, [0], False, rop, out, node.op.split(".")[1])
        return L.reduction(x, [dim], keepdim, rop, out, node.op.split(".")[1])

    return rule


register("aten.argmax.default")(_arg_rule(ir.ReduceOp.ARGMAX))
register("aten.argmin.default")(_arg_rule(ir.ReduceOp.ARGMIN))


def check_table() -> list[str]:
    """Names in the table that torch does not know (a test asserts this is empty)."""
    bad = []
    for name in RULES:
        try:
            resolve_op(name)
        except LookupError:
            bad.append(name)
    return bad
