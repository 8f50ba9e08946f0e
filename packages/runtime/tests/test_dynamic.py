"""Symbolic Programs: one call function for every size, grids and buffers from the actual sizes
of each call, symbols checked against their ranges."""

from __future__ import annotations

import msgspec
import pytest
import runtime_programs as P
import torch
from test_cudagraphs_logic import fake_cuda_graphs, graphed  # noqa: F401 - a fixture and its helper
from torchfuse.graph import schema as S
from torchfuse.runtime import InputError, load

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")

ONE_CONFIG = (S.LaunchConfig(meta={"XBLOCK": 32}, num_warps=1),)


def ranged_scale(min: int = 2, max: int | None = 64) -> S.Program:
    """``x * 0.5`` for x of ``s0`` elements, ``s0`` in ``[min, max]``."""
    prog = P.scale_program("cpu", configs=ONE_CONFIG)
    (sym,) = prog.symbols
    return msgspec.structs.replace(prog, symbols=(msgspec.structs.replace(sym, min=min, max=max),))


def test_one_call_function_serves_every_size_with_grids_from_the_actual_sizes():
    fn = load(ranged_scale(max=None))
    for n in (3, 7, 40, 33, 100, 7):
        x = torch.randn(n)
        (out,) = fn(x)
        assert out.shape == (n,)
        torch.testing.assert_close(out, x * 0.5)
    assert fn.stats.generated == 1  # no regeneration per size
    assert fn.stats.calls == 6
    src = fn.source
    # the symbol is read from the input once per call; the grid and the size argument are
    # expressions of it, with the config's block folded in
    assert src.count("s0 = _sh0[0]") == 1
    assert "[((s0 + 31)//32, 1, 1)]" in src
    assert "evaluate" not in src and "_bind" not in src  # nothing interpreted per call


@pytest.mark.parametrize("first_call", [True, False])
def test_sizes_outside_the_symbol_range_are_rejected(first_call):
    fn = load(ranged_scale(min=4, max=64))
    if not first_call:
        fn(torch.randn(10))  # the generated function's own check, not only the first call's
    for n in (1, 3, 65, 200):
        with pytest.raises(InputError, match=rf"size symbol s0 \(from input:0.size\(0\)\) is {n}, "
                                             r"outside its range \[4, 64\]"):
            fn(torch.randn(n))
    for n in (4, 64):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x)[0], x * 0.5)


def test_range_checks_are_in_the_generated_check():
    fn = load(ranged_scale(min=4, max=64))
    fn(torch.randn(10))
    assert "not 4 <= s0 <= 64" in fn.source


def test_an_input_sized_by_an_expression_of_a_symbol():
    """y must have 2*s0 elements, s0 bound from x: checked per call, named in the error."""
    prog = ranged_scale(max=None)
    y = S.Buffer(name="y", dtype="float32", sizes=("2*s0",), strides=(1,), device="cpu")
    prog = msgspec.structs.replace(prog, inputs=("x", "y"), buffers=(*prog.buffers, y))
    fn = load(prog)
    for n in (3, 9):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x, torch.randn(2 * n))[0], x * 0.5)
    with pytest.raises(InputError, match=r"input 1 \('y'\): expected shape \(2\*s0\) = \(8,\), got \(7,\)"):
        fn(torch.randn(4), torch.randn(7))


def test_buffers_are_allocated_from_the_actual_sizes():
    fn = load(P.mixed_program("cpu"))
    for shape in [(2, 3), (5, 7), (3, 33)]:
        x, y, w = torch.randn(shape), torch.randn(shape), torch.randn(shape[1], 8)
        got = fn(x, y, w)
        want = P.mixed_reference(x, y, w)
        for g, e in zip(got, want, strict=True):
            if isinstance(e, torch.Tensor):
                assert g.shape == e.shape
                torch.testing.assert_close(g, e)
            else:
                assert g == e  # a symbolic scalar output: s0*s1 of this call
    assert fn.stats.generated == 1


def test_a_symbolic_program_survives_an_archive_round_trip(tmp_path):
    fn = load(ranged_scale(min=2, max=64))
    path = fn.save(tmp_path / "scale.tfp.zip")
    again = load(path)
    assert again.program.symbols == fn.program.symbols
    x = torch.randn(17)
    torch.testing.assert_close(again(x)[0], x * 0.5)
    with pytest.raises(InputError, match="outside its range"):
        again(torch.randn(65))


@pytest.mark.usefixtures("fake_cuda_graphs")
def test_cuda_graph_mode_records_once_per_symbol_values():
    fn = graphed(ranged_scale(max=None))
    for n in (10, 10, 20, 10, 20, 30):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x)[0], x * 0.5)
    assert fn.stats.graph_captures == 3  # 10, 20, 30
    assert fn.stats.graph_replays == 3
