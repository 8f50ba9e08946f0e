"""Conformance records that must capture with no graph break at all (issue 20): a break
before the first torch op still counts one graph, so the records' graph count alone would
not see it."""

from __future__ import annotations

import pytest
import semantics_cases as S
import torch
from torchfuse.capture import explain

NO_BREAK = [S.cls_metaclass_call_interpreted, S.cls_metaclass_without_call,
            S.cls_python_new_then_init, S.fn_functools_wraps_inner_function,
            S.fn_attributes_of_a_lambda, S.np_traced_mean_times_ones, S.np_traced_meshgrid_arange,
            S.np_traced_returned_as_ndarray, S.np_traced_attributes_and_methods,
            S.std_dict_fromkeys, S.std_fromkeys_shares_the_value,
            S.np_traced_astype_numpy_type_and_in_place]


@pytest.mark.parametrize("fn", NO_BREAK, ids=[f.__name__ for f in NO_BREAK])
def test_captured_whole(fn):
    e = explain(fn)(torch.randn(3, 4))
    assert [b.reason for b in e.break_reasons] == []
    assert len(e.graphs) == 1
