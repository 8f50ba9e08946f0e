"""Typed, precise errors: wrong inputs, wrong device, broken Programs and archives."""

from __future__ import annotations

import zipfile

import msgspec
import pytest
import runtime_programs as P
import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import (
    CorruptArchiveError,
    DeviceMismatchError,
    InputError,
    InterpreterRequiredError,
    InvalidProgramError,
    KernelCompileError,
    UntrustedCodeError,
    load,
)

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


@pytest.fixture
def mixed():
    return load(P.mixed_program("cpu"))


def good():
    return torch.randn(4, 6), torch.randn(4, 6), torch.randn(6, 8)


def test_wrong_number_of_inputs(mixed):
    _, y, _ = good()
    with pytest.raises(InputError, match=r"takes 3 inputs \(x, y, w\), got 2"):
        mixed(y, y)


@pytest.mark.parametrize("first_call", [True, False])
def test_wrong_dtype_names_the_input(mixed, first_call):
    if not first_call:
        mixed(*good())
    x, y, w = good()
    with pytest.raises(InputError, match=r"input 1 \('y'\): expected dtype float32, got torch.float64") as info:
        mixed(x, y.double(), w)
    assert info.value.index == 1 and info.value.name == "y"


def test_wrong_rank(mixed):
    x, y, w = good()
    with pytest.raises(InputError, match=r"input 2 \('w'\): expected 2 dimensions \(s1, 8\), got shape \(6,\)"):
        mixed(x, y, w[:, 0].contiguous())


@pytest.mark.parametrize("first_call", [True, False])
def test_sizes_that_break_a_symbol_relation(mixed, first_call):
    if not first_call:
        mixed(*good())
    x, _, w = good()
    with pytest.raises(InputError, match=r"input 1 \('y'\): expected shape \(s0, s1\) = \(4, 6\), got \(4, 5\)"):
        mixed(x, torch.randn(4, 5), w)


def test_constant_size_mismatch(mixed):
    x, y, _ = good()
    with pytest.raises(InputError, match=r"input 2 \('w'\): expected shape \(s1, 8\) = \(6, 8\), got \(6, 9\)"):
        mixed(x, y, torch.randn(6, 9))


def test_symbol_out_of_range(mixed):
    with pytest.raises(InputError, match=r"size symbol s0 \(from input:0.size\(0\)\) is 1, outside its range \[2, inf\]"):
        mixed(torch.randn(1, 6), torch.randn(1, 6), torch.randn(6, 8))


def test_wrong_strides(mixed):
    _, y, w = good()
    with pytest.raises(InputError, match=r"input 0 \('x'\): expected strides \(6, 1\), got \(1, 4\)"):
        mixed(torch.randn(6, 4).t(), y, w)


def test_not_a_tensor(mixed):
    x, y, _ = good()
    with pytest.raises(InputError, match=r"input 2 \('w'\): expected a tensor, got list"):
        mixed(x, y, [1.0, 2.0])


def test_cuda_program_given_cpu_inputs():
    fn = load(P.mixed_program("cuda"))  # no device override: it stays a cuda Program
    with pytest.raises(DeviceMismatchError, match=r"expected a tensor on cuda, got one on cpu \(load with device='cpu'"):
        fn(*good())


def test_cpu_program_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    import triton

    if not hasattr(triton, "knobs"):
        pytest.skip("this Triton reads TRITON_INTERPRET only at import")
    with pytest.raises(InterpreterRequiredError, match="TRITON_INTERPRET=1"):
        load(P.mixed_program("cpu"))


def test_unknown_device():
    with pytest.raises(Exception, match="'cpu' or 'cuda'"):
        load(P.mixed_program("cpu"), device="meta")


def test_invalid_programs_are_rejected_at_load():
    prog = P.mixed_program("cpu")
    bad_kernel = msgspec.structs.replace(prog, steps=(*prog.steps, S.LaunchStep(kernel="nope", args=())))
    with pytest.raises(InvalidProgramError, match="unknown kernel 'nope'"):
        load(bad_kernel)
    use_after_free = msgspec.structs.replace(
        prog, steps=(*prog.steps, S.ExternStep(op="aten.relu.default", args=(S.TensorRef(name="buf0"),),
                                               outputs=("r",))))
    with pytest.raises(InvalidProgramError, match="uses 'buf0', which was freed"):
        load(use_after_free)
    bad_symbol = msgspec.structs.replace(prog, symbols=(S.Symbol(name="s0", source="input:7.size(0)"),
                                                        prog.symbols[1]))
    with pytest.raises(InvalidProgramError, match="does not exist"):
        load(bad_symbol)
    wrong_arity = msgspec.structs.replace(
        prog, steps=(prog.steps[0], S.LaunchStep(kernel="add_kernel", args=(S.TensorRef(name="x"),))))
    with pytest.raises(InvalidProgramError, match="takes 4 arguments"):
        load(wrong_arity)


def test_kernel_source_that_does_not_import():
    prog = P.scale_program("cpu")
    broken = msgspec.structs.replace(prog.kernels[0], source="import triton\ndef scale(:\n")
    # checked before anything imports it; trusted, it is imported and fails there
    with pytest.raises(UntrustedCodeError, match=r"kernel 'scale'.*does not parse"):
        load(msgspec.structs.replace(prog, kernels=(broken,)))
    with pytest.raises(KernelCompileError, match=r"kernel 'scale'.*failed to import"):
        load(msgspec.structs.replace(prog, kernels=(broken,)), trust_code=True)
    missing = msgspec.structs.replace(prog.kernels[0], entry="other")
    with pytest.raises(UntrustedCodeError, match=r"defines no @triton\.jit function 'other'"):
        load(msgspec.structs.replace(prog, kernels=(missing,)))
    with pytest.raises(KernelCompileError, match="no function named 'other'"):
        load(msgspec.structs.replace(prog, kernels=(missing,)), trust_code=True)


def test_corrupt_archives(tmp_path):
    with pytest.raises(CorruptArchiveError, match="no archive"):
        load(tmp_path / "missing.zip")
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(CorruptArchiveError, match="not a loadable Program archive"):
        load(junk)
    good_path = load(P.mixed_program("cpu")).save(tmp_path / "ok.zip")
    damaged = tmp_path / "damaged.zip"
    with zipfile.ZipFile(good_path) as src, zipfile.ZipFile(damaged, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data[: len(data) // 2] if name == "document.json" else data)
    with pytest.raises(CorruptArchiveError):
        load(damaged)


def test_graph_archive_is_not_a_program(tmp_path):
    from torchfuse.graph import Graph, save

    path = save(Graph(name="g"), tmp_path / "graph.zip")
    with pytest.raises(CorruptArchiveError, match="holds a Graph, not a Program"):
        load(path)


def test_cuda_program_with_tunable_kernels_loads_without_a_gpu():
    fn = load(P.scale_program("cuda"))
    with pytest.raises(DeviceMismatchError, match="expected a tensor on cuda"):
        fn(torch.randn(10))


def _static_add(sizes, strides):
    """out = x + x for an input of static ``sizes`` and ``strides`` (dense output)."""
    t = S.TensorRef
    n = 1
    for s in sizes:
        n *= s
    dense = tuple(int(torch.empty(sizes).stride()[d]) for d in range(len(sizes)))
    return S.Program(
        name="static_add", inputs=("x",), outputs=(t(name="out"),),
        buffers=(P._buf("x", sizes, strides, "cpu"), P._buf("out", sizes, dense, "cpu")),
        kernels=(P.add_kernel(),),
        steps=(S.AllocStep(buffer="out"),
               S.LaunchStep(kernel="add_kernel", args=(t(name="x"), t(name="x"), t(name="out"), S.Int(value=n)),
                             grid=(f"({n} + BLOCK - 1) // BLOCK", 1, 1))),
        device="cpu", opsets={"aten": 1})


def test_static_shapes_and_strides_are_checked_whole():
    """An input of static sizes is checked by whole tuples: any other size or stride fails,
    but the stride of a size-1 dimension is free (as eager's layouts make it vary)."""
    fn = load(_static_add((4, 1, 6), (6, 6, 1)))
    x = torch.randn(4, 6).unsqueeze(1)  # strides (6, 1, 1): the size-1 dimension's differs
    torch.testing.assert_close(fn(x)[0], x + x)
    with pytest.raises(InputError, match=r"expected shape \(4, 1, 6\) = \(4, 1, 6\), got \(4, 1, 5\)"):
        fn(torch.randn(4, 1, 5))
    with pytest.raises(InputError, match=r"expected strides"):
        fn(torch.randn(6, 1, 4).permute(2, 1, 0))
    fn = load(_static_add((3, 5), (5, 1)))
    torch.testing.assert_close(fn(torch.ones(3, 5))[0], torch.full((3, 5), 2.0))
    with pytest.raises(InputError, match=r"expected strides \(5, 1\), got \(1, 3\)"):
        fn(torch.ones(5, 3).t())
