"""Extern results are put in the layout the Program planned for them."""

from __future__ import annotations

import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import load
from torchfuse.runtime.codegen import bound_op, fit_layout


def test_an_extern_result_in_another_layout_is_copied_to_the_planned_one():
    planned = torch.empty(2, 3, 4, 5).stride()
    got = torch.randn(2, 5, 4, 3).permute(0, 3, 2, 1)  # same sizes, another memory order
    fitted = fit_layout(got, planned)
    assert fitted.stride() == planned
    torch.testing.assert_close(fitted, got)


def test_a_result_already_in_the_planned_layout_is_returned_as_is():
    t = torch.randn(2, 1, 4)
    # a dim of size 1 may have any stride: only dims longer than 1 are compared
    assert fit_layout(t, (4, 1, 1)) is t


def test_an_output_the_kernel_left_undefined_passes_through():
    # cuDNN attention returns no log-sum-exp when none is asked for, though its meta kernel
    # plans one; the Program must not index into the missing tensor.
    assert fit_layout(None, (32, 8, 1)) is None


def _transpose_program(planned: tuple[int, int]) -> S.Program:
    """``y = x.t()`` by an extern op (a view: strides (1, 3)), with ``planned`` strides for y."""
    t = S.TensorRef
    return S.Program(
        name="transpose", inputs=("x",), outputs=(t(name="y"),),
        buffers=(S.Buffer(name="x", dtype="float32", sizes=(2, 3), strides=(3, 1), device="cpu"),
                 S.Buffer(name="y", dtype="float32", sizes=(3, 2), strides=planned, device="cpu")),
        steps=(S.ExternStep(op="aten.t.default", args=(t(name="x"),), outputs=("y",)),),
        device="cpu", opsets={"aten": 1},
    )


def test_a_program_copies_an_extern_result_only_when_its_layout_is_not_the_planned_one():
    x = torch.randn(2, 3)
    # planned dense (2, 1): the view's (1, 3) is copied into that layout
    (y,) = load(_transpose_program((2, 1)))(x)
    assert y.stride() == (2, 1) and y.data_ptr() != x.data_ptr()
    torch.testing.assert_close(y, x.t())
    # planned as the op returns it: no copy, the extern's result itself
    (y,) = load(_transpose_program((1, 3)))(x)
    assert y.stride() == (1, 3) and y.data_ptr() == x.data_ptr()
    torch.testing.assert_close(y, x.t())


def test_extern_ops_are_called_through_their_operator():
    # the generated code calls the OpOverload's own operator (one Python frame less); the
    # result is what the OpOverload returns
    op = torch.ops.aten.t.default
    inner = bound_op(op)
    assert inner is not op and callable(inner)
    x = torch.randn(2, 3)
    assert torch.equal(inner(x), op(x))
    fn = load(_transpose_program((2, 1)))
    fn(x)
    assert inner in fn.call.__globals__.values()
    assert bound_op(len) is len  # anything else is called as it is
