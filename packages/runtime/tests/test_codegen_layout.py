"""Extern results are put in the layout the Program planned for them."""

from __future__ import annotations

import torch
from torchfuse.runtime.codegen import fit_layout


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
