"""Shared helpers: compile a torch function with inductor and run the result."""

from __future__ import annotations

import importlib.util
import itertools
import tempfile
from pathlib import Path

import torch
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph

_counter = itertools.count()

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
"""bf16 tolerance. Results are computed in fp32 and rounded once on store; Triton's CPU
interpreter truncates (instead of rounding) when narrowing to bf16, so compare to 2 ulps."""


def compile_fn(fn, *inputs, options=None) -> S.Program:
    graph, constants = trace(fn, *inputs)
    assert not constants, "test functions must not capture tensors"
    return compile_graph(graph, inputs, options=options)


def load_output_code(program: S.Program):
    path = Path(tempfile.mkdtemp()) / f"output_code_{next(_counter)}.py"
    path.write_text(program.meta["output_code.py"])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_output_code(program: S.Program, inputs) -> list:
    """Run the printed ``output_code.py``: the runtime's call function with first configs."""
    return list(load_output_code(program).call(*inputs))


def run_runtime(program: S.Program, inputs) -> list:
    from torchfuse.runtime import load

    # no trust_code: C++ kernels compiled by this process are its own (runtime.cpp.vouch)
    return list(load(program, device="cpu")(*inputs))


def as_tuple(x):
    return tuple(x) if isinstance(x, tuple | list) else (x,)


def assert_matches(out, ref, **tol) -> None:
    ref = as_tuple(ref)
    assert len(out) == len(ref)
    for a, b in zip(out, ref, strict=True):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        assert a.shape == b.shape, (a.shape, b.shape)
        if b.dtype.is_floating_point:
            torch.testing.assert_close(a, b, **tol)
        else:
            assert torch.equal(a, b), (a, b)


def triton_source(program: S.Program) -> bool:
    """Whether the Program's kernels are Triton (source-text assertions are per language)."""
    return all(k.language == "triton" for k in program.kernels)


def kernel_kinds(program: S.Program) -> list[str]:
    return [k.name.split("_")[1] for k in program.kernels]


SNAPSHOTS = Path(__file__).parent / "snapshots"


def assert_snapshot(name: str, program: S.Program) -> None:
    """The program's kernel sources equal the golden file ``snapshots/<name>.py.txt``;
    ``TORCHFUSE_UPDATE_SNAPSHOTS=1`` rewrites it, and a missing one is written and fails."""
    import pytest
    from torchfuse.inductor.config import from_environment

    text = "\n# ----\n".join(k.source for k in program.kernels)
    path = SNAPSHOTS / f"{name}.py.txt"
    if from_environment().update_snapshots or not path.exists():
        path.write_text(text)
        if not from_environment().update_snapshots:
            pytest.fail(f"snapshot {path.name} was missing and has been written; review and rerun")
    assert text == path.read_text(), f"generated code changed; TORCHFUSE_UPDATE_SNAPSHOTS=1 to accept ({path})"
