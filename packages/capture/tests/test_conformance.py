"""Every record of the conformance table, compared with eager (return values and mutated
inputs), called twice so the second call hits the cache without recompiling."""

from __future__ import annotations

import sys
import warnings

# the table's modules: each registers its records into CASES on import
import object_cases
import pytest
import python_cases  # noqa: F401
import semantics_cases  # noqa: F401
import torch
from capture_cases import CASES
from capture_helpers import assert_same
from torchfuse.capture import compile


def _args(case, seed: int):
    torch.manual_seed(seed)
    return case.make()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_eager(case, capsys):
    cf = compile(case.fn, backend="eager")
    graphs = None
    for seed in (0, 1):
        eager_args = _args(case, seed)
        compiled_args = _args(case, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = case.fn(*eager_args)
            got = cf(*compiled_args)
        assert_same(got, expected)
        assert_same(compiled_args, eager_args, "inputs after the call")
        if graphs is None:  # graphs of the first call: a break resumes, each piece a graph
            graphs = cf.graph_count()
    assert len(cf.entries) == 1, [e.result.error for e in cf.entries]
    assert cf.recompiles == 0
    entry = cf.entries[0]
    assert graphs == case.graphs, f"expected {case.graphs} graph(s): {entry.result.error}"
    if case.breaks is not None:  # a break before the first op would still be one graph
        breaks = [r.error for r in cf.results if r.error is not None]
        assert len(breaks) == case.breaks, breaks
    for slot in entry.result.inputs:  # parameters must never be frozen into constants
        assert not isinstance(slot.constant, torch.nn.Parameter), slot


def test_table_is_large_enough():
    assert len(CASES) >= 200
    assert len({c.name for c in CASES}) == len(CASES)


def _codes(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from _codes(c)


def test_every_opcode_in_the_table_is_handled():
    """All instructions of this Python's bytecode for the table's functions have a handler."""
    import dis

    from torchfuse.capture.ops import DISPATCH

    seen = set()
    fns = [c.fn for c in CASES] + [object_cases.Derived.f, object_cases.Block.forward, object_cases.Scaler.apply]
    for fn in fns:
        for code in _codes(fn.__code__):
            seen |= {i.opname for i in dis.get_instructions(code)}
    missing = seen - set(DISPATCH)
    assert not missing, missing
    if sys.version_info >= (3, 12):
        assert {"LOAD_FAST_AND_CLEAR", "END_FOR", "RETURN_CONST", "BINARY_SLICE",
                "LOAD_SUPER_ATTR", "CALL_INTRINSIC_1"} <= seen
    else:
        assert {"PRECALL", "LOAD_METHOD", "POP_JUMP_FORWARD_IF_FALSE", "KW_NAMES"} <= seen
