"""Hand-written Programs run through the Triton interpreter on the CPU, compared with eager PyTorch."""

from __future__ import annotations

import msgspec
import pytest
import runtime_programs as P
import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import CompiledProgram, load

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def test_mixed_program_matches_eager():
    fn = load(P.mixed_program("cuda"), device="cpu")
    assert isinstance(fn, CompiledProgram)
    x, y, w = torch.randn(4, 24), torch.randn(4, 24), torch.randn(24, 8)
    _close(fn(x, y, w), P.mixed_reference(x, y, w))


def test_a_cpu_program_loads_without_device_override():
    fn = load(P.mixed_program("cpu"))
    x, y, w = torch.randn(3, 5), torch.randn(3, 5), torch.randn(5, 8)
    _close(fn(x, y, w), P.mixed_reference(x, y, w))


def test_one_generated_function_serves_every_size():
    fn = load(P.mixed_program("cpu"))
    for rows, cols in [(4, 24), (3, 17), (5, 2)]:
        x, y, w = torch.randn(rows, cols), torch.randn(rows, cols), torch.randn(cols, 8)
        _close(fn(x, y, w), P.mixed_reference(x, y, w))
    assert fn.stats.generated == 1
    assert fn.stats.calls == 3


def test_view_output_shares_storage_with_the_reused_buffer():
    fn = load(P.mixed_program("cpu"))
    x, y, w = torch.randn(4, 6), torch.randn(4, 6), torch.randn(6, 8)
    _, _, view, _ = fn(x, y, w)
    assert view.stride() == (1, 6)
    assert not view.is_contiguous()
    torch.testing.assert_close(view, (2 * x).t())


def test_buffer_reuse_takes_over_the_freed_storage():
    fn = load(P.mixed_program("cpu"))
    fn(torch.randn(2, 3), torch.randn(2, 3), torch.randn(3, 8))
    src = fn.source
    assert "buf3 = buf0  # reuses buf0" in src
    assert "buf3 = _empty_strided" not in src


def test_reuse_across_dtypes_reinterprets_the_storage():
    prog = P.mixed_program("cpu")
    # buf3 becomes an int32 buffer of the same byte size taking over float32 buf0; the kernel
    # then adds x to itself bitwise-reinterpreted, so check against eager on the same bits.
    bufs = tuple(msgspec.structs.replace(b, dtype="int32") if b.name == "buf3" else b for b in prog.buffers)
    prog = msgspec.structs.replace(prog, buffers=bufs, outputs=prog.outputs[:3])
    fn = load(prog)
    fn(torch.randn(2, 3), torch.randn(2, 3), torch.randn(3, 8))
    assert "_retype(buf0, _int32" in fn.source


def test_copy_step_writes_the_input_back():
    fn = load(P.copy_program("cpu"))
    x = torch.randn(37)
    before = x.clone()
    (out,) = fn(x)
    torch.testing.assert_close(out, before * 2)
    torch.testing.assert_close(x, before * 2)


def test_cpu_uses_the_first_config_and_folds_it_into_the_source():
    fn = load(P.scale_program("cpu"))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    src = fn.source
    assert "XBLOCK=32" in src and "num_warps=1" in src
    assert "(s0 + 31)//32" in src  # grid expression translated once, with the config folded in
    assert fn.stats.autotuned == 0


def test_chain_of_kernels():
    fn = load(P.chain_program(5, size=50, device="cpu"))
    x = torch.randn(50)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 6)
    assert fn.stats.kernel_launches == 5
    assert fn.source.count("del buf") == 4


def test_extern_with_kwargs_scalars_and_multiple_outputs():
    t = S.TensorRef
    prog = S.Program(
        name="externs",
        inputs=("x",),
        outputs=(t(name="vals"), t(name="idx"), t(name="m")),
        buffers=(S.Buffer(name="x", dtype="float32", sizes=(3, "s0"), strides=("s0", 1), device="cpu"),),
        steps=(
            S.ExternStep(op="aten.max.dim", args=(t(name="x"), S.Int(value=1)),
                         kwargs={"keepdim": S.Bool(value=True)}, outputs=("vals", "idx")),
            S.ExternStep(op="aten.mul.Scalar", args=(t(name="x"), S.Float(value="inf")), outputs=("m",)),
        ),
        symbols=(S.Symbol(name="s0", min=2, source="input:0.size(1)"),),
        device="cpu",
    )
    fn = load(prog)
    x = torch.randn(3, 5)
    vals, idx, m = fn(x)
    want = x.max(1, keepdim=True)
    torch.testing.assert_close(vals, want.values)
    torch.testing.assert_close(idx, want.indices)
    torch.testing.assert_close(m, x * float("inf"))


def test_extern_returning_a_one_element_tensor_list_binds_the_tensor():
    # aten.split returns Tensor[] (printed List[Tensor]); with one piece the output name must
    # be bound to the tensor, not to the list.
    t = S.TensorRef
    prog = S.Program(
        name="split_one",
        inputs=("x",),
        outputs=(t(name="part"),),
        buffers=(S.Buffer(name="x", dtype="float32", sizes=(2, 4), strides=(4, 1), device="cpu"),),
        steps=(S.ExternStep(op="aten.split.Tensor", args=(t(name="x"), S.Int(value=4), S.Int(value=1)),
                            outputs=("part",)),),
        device="cpu",
    )
    x = torch.randn(2, 4)
    (part,) = load(prog)(x)
    assert isinstance(part, torch.Tensor)
    torch.testing.assert_close(part, x)


def test_input_returned_as_output_is_the_same_tensor():
    prog = S.Program(name="ident", inputs=("x",), outputs=(S.TensorRef(name="x"), S.Int(value=7)),
                     buffers=(S.Buffer(name="x", dtype="float32", sizes=(2,), strides=(1,), device="cpu"),),
                     device="cpu")
    x = torch.randn(2)
    out = load(prog)(x)
    assert out[0] is x and out[1] == 7


def test_odd_buffer_names_become_valid_identifiers():
    prog = P.copy_program("cpu")
    ren = {"x": "in:0", "buf0": "class"}
    prog = msgspec.structs.replace(
        prog,
        inputs=("in:0",),
        outputs=(S.TensorRef(name="class"),),
        buffers=tuple(msgspec.structs.replace(b, name=ren[b.name]) for b in prog.buffers),
        steps=(S.AllocStep(buffer="class"),
               S.LaunchStep(kernel="add_kernel", args=(S.TensorRef(name="in:0"), S.TensorRef(name="in:0"),
                                                       S.TensorRef(name="class"), S.SymRef(expr="s0"))),),
    )
    x = torch.randn(9)
    (out,) = load(prog)(x)
    torch.testing.assert_close(out, 2 * x)


def test_source_is_available_before_the_first_call_and_compiles():
    fn = load(P.mixed_program("cpu"))
    src = fn.source
    assert src.startswith("# generated by torchfuse.runtime")
    compile(src, "<generated>", "exec")
    assert "_aten_mm_default(buf0, w)" in src


def test_kernel_modules_are_cached_by_content_hash(cache_dir):
    from torchfuse.runtime.kernels import kernel_hash

    prog = P.mixed_program("cpu")
    load(prog)
    files = sorted(p.name for p in (cache_dir / "kernels").iterdir())
    assert files == sorted(f"k_{kernel_hash(k)}.py" for k in prog.kernels)
    mtimes = [p.stat().st_mtime_ns for p in (cache_dir / "kernels").iterdir()]
    load(prog)  # a second load finds the modules and writes nothing
    assert mtimes == [p.stat().st_mtime_ns for p in (cache_dir / "kernels").iterdir()]


def test_reduce_overhead_on_cpu_runs_the_normal_path():
    fn = load(P.mixed_program("cpu"), mode="reduce-overhead")
    x, y, w = torch.randn(3, 5), torch.randn(3, 5), torch.randn(5, 8)
    _close(fn(x, y, w), P.mixed_reference(x, y, w))
    _close(fn(x, y, w), P.mixed_reference(x, y, w))
    assert fn.stats.graph_captures == 0
    assert any("CPU" in r for r in fn.stats.fallback_reasons)


def test_names_the_generated_code_uses_are_not_shadowed():
    prog = P.copy_program("cpu")
    ren = {"x": "call", "buf0": "args"}
    prog = msgspec.structs.replace(
        prog,
        inputs=("call",),
        outputs=(S.TensorRef(name="args"),),
        buffers=tuple(msgspec.structs.replace(b, name=ren[b.name]) for b in prog.buffers),
        steps=(S.AllocStep(buffer="args"),
               S.LaunchStep(kernel="add_kernel", args=(S.TensorRef(name="call"), S.TensorRef(name="call"),
                                                       S.TensorRef(name="args"), S.SymRef(expr="s0"))),),
    )
    x = torch.randn(9)
    fn = load(prog)
    (out,) = fn(x)
    torch.testing.assert_close(out, 2 * x)
    assert "def call(*args)" in fn.source and "call_1" in fn.source and "args_1" in fn.source


def test_inputs_that_require_grad_run_without_recording_history():
    fn = load(P.mixed_program("cpu"))
    x, y, w = (torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True),
               torch.randn(4, 8, requires_grad=True))
    out = fn(x, y, w)
    with torch.no_grad():
        _close(out, P.mixed_reference(x, y, w))
    assert all(t.grad_fn is None for t in out if isinstance(t, torch.Tensor))
    leaf = torch.randn(20, requires_grad=True)
    (doubled,) = load(P.copy_program("cpu"))(leaf)  # copy_ into a leaf that requires grad
    torch.testing.assert_close(doubled, leaf.detach())


def test_the_hand_written_programs_satisfy_the_format_verifier():
    from test_codegen import middle_program
    from torchfuse.graph import verify_program

    for prog in (P.mixed_program(), P.copy_program(), P.scale_program(), P.chain_program(3), middle_program()):
        verify_program(prog)
