"""Kernel sources the compiler wrote, or read back from the user's own cache, are its own:
the runtime imports them without the AST check (as it runs vouched C++); any other source,
one byte changed included, is checked as always."""

from __future__ import annotations

import msgspec
import pytest
import torch
from torchfuse.graph import kernel_source, trace
from torchfuse.inductor import compile_graph
from torchfuse.runtime import UntrustedCodeError, load


@pytest.fixture
def checked(monkeypatch):
    """The kernel sources the check looked at, with a fresh set of trusted sources."""
    seen: list[str] = []
    real = kernel_source._problem

    def counting(source, entry):
        seen.append(source)
        return real(source, entry)

    monkeypatch.setattr(kernel_source, "_problem", counting)
    monkeypatch.setattr(kernel_source, "_trusted", set())
    return seen


def _graph():
    graph, _ = trace(lambda x: (x.sin() + 1).sum(dim=1), torch.randn(4, 8))
    return graph


def test_a_compiled_programs_sources_are_imported_unchecked(checked):
    program = compile_graph(_graph(), options={"cache": False, "cpu_backend": "triton"})
    assert [k.language for k in program.kernels] == ["triton"]
    x = torch.randn(4, 8)
    torch.testing.assert_close(load(program, device="cpu")(x)[0], (x.sin() + 1).sum(dim=1))
    assert checked == []


def test_a_cache_hit_is_vouched_for(checked):
    options = {"cpu_backend": "triton"}  # the cache is on; each test has its own (conftest)
    first = compile_graph(_graph(), options=options)
    kernel_source._trusted.clear()  # as in a new process
    program = compile_graph(_graph(), options=options)  # read back from the cache
    assert program == first
    load(program, device="cpu")
    assert checked == []


def test_any_other_source_is_checked(checked):
    program = compile_graph(_graph(), options={"cache": False, "cpu_backend": "triton"})
    kernel = program.kernels[0]
    changed = msgspec.structs.replace(program, kernels=(msgspec.structs.replace(
        kernel, source=kernel.source + "\n"),))
    load(changed, device="cpu")  # still of the accepted form
    assert checked == [kernel.source + "\n"]
    evil = msgspec.structs.replace(program, kernels=(msgspec.structs.replace(
        kernel, source=kernel.source + "\nimport os\n"),))
    with pytest.raises(UntrustedCodeError, match="refusing to import"):
        load(evil, device="cpu")
