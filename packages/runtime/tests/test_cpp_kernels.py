"""C++ kernels (format 1.1): built once per Program with the system compiler, cached on disk,
launched through ctypes, and run only when the caller trusts the Program's code."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torchfuse.runtime.config as rconfig
from torchfuse.graph.fixtures import fixture_path, load_fixture
from torchfuse.runtime import cpp, load
from torchfuse.runtime.errors import UntrustedCodeError

FIXTURE = "program_cpp_add_relu"


@pytest.fixture
def compiler():
    try:
        return cpp.find_compiler()
    except cpp.CompilerNotFoundError as e:
        pytest.skip(str(e))


def test_a_cpp_program_from_an_archive_needs_trust(compiler):
    with pytest.raises(UntrustedCodeError, match="trust_code=True"):
        load(fixture_path(FIXTURE))
    program, *_ = load_fixture(FIXTURE)
    with pytest.raises(UntrustedCodeError, match="C\\+\\+ kernels"):
        load(program)  # the same from memory: what it came from does not change what it is


def test_own_cpp_code_runs_without_trust_and_nothing_else_does(compiler):
    """What the compiler vouches for (its own output, or its own cache's) runs without
    ``trust_code``; the same Program with one byte of its C++ changed does not."""
    import msgspec

    program, inputs, expected, _ = load_fixture(FIXTURE)
    kernel = program.kernels[0]
    assert "? v : 0.0f)" in kernel.source  # another source than the fixture's, same values
    mine = msgspec.structs.replace(program, kernels=(msgspec.structs.replace(
        kernel, source=kernel.source.replace("? v : 0.0f)", "? v : 0.0f + 0.0f)")),))
    assert not cpp.is_vouched(mine.kernels)
    cpp.vouch(mine)
    assert cpp.is_vouched(mine.kernels)
    torch.testing.assert_close(load(mine)(*inputs)[0], expected[0])
    other = msgspec.structs.replace(mine, kernels=(msgspec.structs.replace(
        mine.kernels[0], source=mine.kernels[0].source + " "),))
    with pytest.raises(UntrustedCodeError, match="trust_code=True"):
        load(other)


def test_the_cpp_fixture_runs_at_its_size_and_another(compiler):
    _, inputs, expected, _ = load_fixture(FIXTURE)
    fn = load(fixture_path(FIXTURE), trust_code=True)
    torch.testing.assert_close(fn(*inputs)[0], expected[0])
    x = torch.randn(1, 8)
    torch.testing.assert_close(fn(x, inputs[1])[0], torch.relu(x + inputs[1]))
    x = torch.randn(1000, 8)
    torch.testing.assert_close(fn(x, inputs[1])[0], torch.relu(x + inputs[1]))


def test_the_shared_object_is_cached_by_source_and_flags(compiler, cache_dir):
    program, *_ = load_fixture(FIXTURE)
    source = cpp.translation_unit(program.kernels)
    path = cpp.build(source)
    assert path.parent == cache_dir / "cpp" and path.exists()
    stamp = path.stat().st_mtime_ns
    assert cpp.build(source) == path and path.stat().st_mtime_ns == stamp  # not rebuilt
    flags = cpp.compiler_flags(compiler)
    assert "-O3" in flags and cpp.library_path(source, compiler, (*flags, "-g")) != path


def test_a_missing_compiler_says_how_to_install_one(monkeypatch):
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cxx="no-such-compiler++"))
    cpp.find_compiler.cache_clear()
    try:
        with pytest.raises(cpp.CompilerNotFoundError, match="apt-get install g\\+\\+"):
            cpp.find_compiler()
    finally:
        cpp.find_compiler.cache_clear()


def test_a_compile_error_is_reported_with_the_compiler_output(compiler):
    with pytest.raises(cpp.KernelCompileError, match="failed to compile"):
        cpp.build('extern "C" void broken( {')
