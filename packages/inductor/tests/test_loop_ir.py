"""The loop IR's index algebra, checked exhaustively over small ranges, and the rule tables."""

from __future__ import annotations

import itertools

import pytest
import sympy
from torchfuse.graph.ops import resolve_op
from torchfuse.inductor import DECOMPOSITIONS, ir
from torchfuse.inductor.lowerings import check_table


def _eval(e, env):
    return int(e.xreplace({k: sympy.Integer(v) for k, v in env.items()}))


@pytest.mark.parametrize("sizes", [(4,), (2, 3), (3, 1, 4), (2, 2, 3)])
def test_unflatten_is_row_major(sizes):
    x = ir.loop_var("x", 0)
    coords = ir.unflatten(x, sizes)
    expect = list(itertools.product(*[range(s) for s in sizes]))
    for flat, want in enumerate(expect):
        assert tuple(_eval(c, {x: flat}) for c in coords) == want


@pytest.mark.parametrize("sizes", [(4, 5), (2, 3, 4), (3, 1, 2, 2)])
def test_simplify_folds_unflattened_contiguous_index(sizes):
    x = ir.loop_var("x", 0)
    coords = ir.unflatten(x, sizes)
    index = sum(c * s for c, s in zip(coords, ir.contiguous_strides(sizes), strict=True))
    assert ir.simplify_index(sympy.expand(index)) == x


@pytest.mark.parametrize("xn,rn", [(3, 4), (2, 6), (1, 5)])
def test_simplify_keeps_values_with_bounds(xn, rn):
    x, r = ir.loop_var("x", 0), ir.loop_var("r", 0)
    flat = x * rn + r
    exprs = [
        ir.FloorDiv(flat, rn),
        ir.ModIdx(flat, rn),
        ir.ModIdx(ir.FloorDiv(flat, 2), 3) + 7 * ir.ModIdx(flat, 2),
    ]
    for e in exprs:
        s = ir.simplify_index(e, {x: xn, r: rn})
        for xv, rv in itertools.product(range(xn), range(rn)):
            assert _eval(s, {x: xv, r: rv}) == _eval(e, {x: xv, r: rv})


def test_simplify_folds_nested_modulo_of_a_quotient():
    """``c*(e % b) + c*b*((e // b) % m)`` is ``c*(e % (b*m))``: how a tile's rows over (h, w)
    of NCHW data read it (``y % 56 + 56*((y // 56) % 56)`` is ``y % 3136``)."""
    x, s0 = ir.loop_var("x", 0), ir.size_symbol("s0")
    cases = [
        (ir.ModIdx(x, 6) + 6 * ir.ModIdx(ir.FloorDiv(x, 6), 5), ir.ModIdx(x, 30), 100),
        (3 * ir.ModIdx(x, 4) + 12 * ir.ModIdx(ir.FloorDiv(x, 4), 7) + 5, 3 * ir.ModIdx(x, 28) + 5, 100),
        (ir.ModIdx(x, s0) + s0 * ir.ModIdx(ir.FloorDiv(x, s0), 5), ir.ModIdx(x, 5 * s0), 100),
        # three levels fold into one, and the bound drops the last modulo
        (ir.ModIdx(x, 2) + 2 * ir.ModIdx(ir.FloorDiv(x, 2), 3) + 6 * ir.ModIdx(ir.FloorDiv(x, 6), 4), x, 24),
    ]
    for e, want, bound in cases:
        s = ir.simplify_index(sympy.expand(e), {x: bound})
        assert s == want
        for xv, sv in itertools.product(range(bound), range(1, 5)):
            env = {x: xv, s0: sv}
            assert _eval(s, env) == _eval(e, env)
    # not the same quotient, or not the matching coefficient: left alone
    for e in (ir.ModIdx(x, 6) + 6 * ir.ModIdx(ir.FloorDiv(x, 3), 5),
              ir.ModIdx(x, 6) + 5 * ir.ModIdx(ir.FloorDiv(x, 6), 5)):
        s = ir.simplify_index(sympy.expand(e))
        assert s == sympy.expand(e)


def test_floordiv_and_mod_constant_fold():
    x = ir.loop_var("x", 0)
    assert ir.FloorDiv(sympy.Integer(17), sympy.Integer(5)) == 3
    assert ir.ModIdx(sympy.Integer(17), sympy.Integer(5)) == 2
    assert ir.FloorDiv(8 * x + 3, sympy.Integer(8)) == x
    assert ir.ModIdx(8 * x + 3, sympy.Integer(8)) == 3


def test_every_lowering_and_decomposition_names_a_real_op():
    assert check_table() == []
    for name in DECOMPOSITIONS:
        resolve_op(name)


def test_value_printing_is_stable():
    x = ir.loop_var("x", 0)
    v = ir.Call(ir.VOp.ADD, (ir.Load("buf0", 2 * x, "float32"), ir.Const(1.0, "float32")), "float32")
    assert ir.format_value(v) == "add(load(buf0, 2*x0), 1.0)"
    assert ir.value_size(v) == 3


def test_verifier_rejects_reads_before_writes():
    from torchfuse.inductor.ir import BufferSpec, IRVerifyError, LoopProgram, Pointwise, verify

    x = ir.loop_var("x", 0)
    one = (sympy.Integer(4),)
    bufs = {n: BufferSpec(n, "float32", one, (sympy.Integer(1),)) for n in ("a", "b", "c")}
    good = Pointwise("b", one, ir.Load("a", x, "float32"), "float32", x)
    bad = Pointwise("c", one, ir.Load("zzz", x, "float32"), "float32", x)
    verify(LoopProgram("p", ("a",), bufs, (good,), ("b",)))
    with pytest.raises(IRVerifyError):
        verify(LoopProgram("p", ("a",), bufs, (good, bad), ("c",)))
    stray = Pointwise("c", one, ir.Load("a", ir.loop_var("r", 0), "float32"), "float32", x)
    with pytest.raises(IRVerifyError):
        verify(LoopProgram("p", ("a",), bufs, (stray,), ("c",)))
