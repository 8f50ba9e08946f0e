"""The generated call function: expression printing, and the fast launch path's argument layout."""

from __future__ import annotations

import itertools

import msgspec
import pytest
import runtime_programs as P
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.runtime import load
from torchfuse.runtime.codegen import generate, render_expr
from torchfuse.runtime.kernels import param_names

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")

EXPRS = [
    "(s0*s1 + XBLOCK - 1) // XBLOCK", "s0 - (s1 - 1)", "min(s0, 4) * 2", "-s0 + 3", "s0 // (s1 * 2)",
    "(s0+1)*(s1-1)", "XBLOCK*2 - 4", "s0 - s1 - 1", "s0 % 3 == 0", "s0*(s1*2)", "2 - 3", "s0 - 5 + 2 - 1",
    "-(s0 - 2)", "max(s0 - 1, s1) % (s1 + 1)", "s0 - (s1 + 2) + 1", "(s0 + 4) // 4 * 4 - s1",
    "s0 * -2 + XBLOCK // 3", "s1 - -s0", "min(XBLOCK, 8) + min(s0, s1)",
]


@pytest.mark.parametrize("text", EXPRS)
def test_rendered_expressions_evaluate_like_the_format(text):
    src = render_expr(text, {"s0": "s0", "s1": "s1"}, {"XBLOCK": 64})
    for a, b in itertools.product(range(-4, 10), range(1, 9)):
        assert eval(src, {}, {"s0": a, "s1": b}) == evaluate(text, {"s0": a, "s1": b, "XBLOCK": 64}), (src, a, b)


def test_grid_constants_are_folded():
    assert render_expr("(s0*s1 + XBLOCK - 1) // XBLOCK", {"s0": "s0", "s1": "s1"}, {"XBLOCK": 64}) == \
        "(s0*s1 + 63)//64"
    assert render_expr("(1000 + XBLOCK - 1) // XBLOCK", {}, {"XBLOCK": 128}) == "8"


MIDDLE_SRC = '''
import triton
import triton.language as tl


@triton.jit
def axpy(x_ptr, BLOCK: tl.constexpr, out_ptr, alpha, n, SCALE: tl.constexpr = 2):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha * SCALE, mask=mask)
'''


def middle_program() -> S.Program:
    """A kernel whose constexpr sits between runtime parameters, with a defaulted constexpr."""
    t = S.TensorRef
    kernel = S.Kernel(
        name="axpy", source=MIDDLE_SRC,
        signature=(S.KernelParam(name="x_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="out_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="alpha", kind="fp32"),
                   S.KernelParam(name="n", kind="i32")),
        configs=(S.LaunchConfig(meta={"BLOCK": 16}, num_warps=1),),
        grid=("(s0 + BLOCK - 1) // BLOCK",),
    )
    buf = lambda n: S.Buffer(name=n, dtype="float32", sizes=("s0",), strides=(1,), device="cpu")
    return S.Program(
        name="middle", inputs=("x",), outputs=(t(name="out"),), buffers=(buf("x"), buf("out")),
        kernels=(kernel,),
        steps=(S.AllocStep(buffer="out"),
               S.LaunchStep(kernel="axpy", args=(t(name="x"), t(name="out"), S.Float(value=1.5),
                                                 S.SymRef(expr="s0")))),
        symbols=(S.Symbol(name="s0", min=2, source="input:0.size(0)"),),
        device="cpu",
    )


def _layout_handles(layout, run):
    """Handles as ``launchers.handles`` gives them, around a generic fake launcher; the direct
    layouts get a stand-in C launcher that checks where each value lands."""
    if layout == "generic":
        return run, None, "meta"

    def direct_args(gx, gy, gz, stream, function, coop, pdl, gs, ps, meta, lmeta, enter, exit_, *args):
        assert (coop, pdl, gs, ps, meta, lmeta, enter, exit_) == ("coop", "pdl", None, None, "meta", None, None, None)
        return run(gx, gy, gz, stream, function, None, lmeta, enter, exit_, *args)

    def direct_tuple(gx, gy, gz, stream, function, coop, pdl, meta, lmeta, enter, exit_, gs, ps, ann, sig, args):
        assert (coop, pdl, meta, ann, sig) == ("coop", "pdl", "meta", "ann", "sig")
        assert (lmeta, enter, exit_, gs, ps) == (None,) * 5 and isinstance(args, tuple)
        return run(gx, gy, gz, stream, function, None, lmeta, enter, exit_, *args)

    if layout == "args":
        return direct_args, None, "meta", "coop", "pdl"
    return direct_tuple, None, "meta", "coop", "pdl", "ann", "sig"


class _Address(int):
    """A tensor's address as the fake fast path's ``_ptr`` returns it (marked, to map it back)."""


def _fake_launcher(fn, addresses):
    """Stands in for CompiledKernel.run: takes every JIT parameter positionally, in order, as
    Triton's launcher does, and runs the interpreted kernel with them (tensors arrive as
    addresses; ``addresses`` maps each back to its tensor)."""
    names = param_names(fn)
    calls = []

    def run(gx, gy, gz, stream, function, packed, launch_metadata, enter, exit_, *args):
        assert len(args) == len(names)
        assert (launch_metadata, enter, exit_) == (None, None, None)
        calls.append((gx, gy, gz))
        fn[(gx, gy, gz)](*[addresses.get(a, a) if type(a) is _Address else a for a in args])

    return run, calls


@pytest.mark.parametrize("layout", ["generic", "args", "tuple"])
@pytest.mark.parametrize("build", [middle_program, lambda: P.mixed_program("cpu")])
def test_fast_path_passes_every_parameter_in_order(build, layout):
    prog = build()
    fn = load(prog)
    gen = generate(prog, device_type="cpu", kernels=fn.kernels, configs=fn._default_configs(), fast=True,
                   layout=layout)
    assert gen.fast_entry == "call_fast"
    launches = [s for s in prog.steps if isinstance(s, S.LaunchStep)]
    addresses = {}
    runners = [_fake_launcher(fn.kernels[s.kernel], addresses) for s in launches]
    handles = {}

    def record(key, compiled):
        assert len(compiled) == len(launches)
        handles[key] = tuple(x for run, _ in runners for x in _layout_handles(layout, run))

    pointer_reads = []

    def ptr(t):  # the fast path hands tensors to the launcher as addresses
        pointer_reads.append(t)
        address = _Address(t.data_ptr())
        addresses[address] = t
        return address

    ns = dict(gen.globals, _stats=fn.stats, _bad_inputs=fn._bad_inputs, _handles=handles, _record=record,
              _get_stream=lambda index: 0, _ptr=ptr)
    exec(compile(gen.source, "<test>", "exec"), ns)
    if prog.name == "middle":
        x = torch.randn(40)
        want = [x * 1.5 * 2]
        args = (x,)
        assert "1.5, s0, 2)" in gen.source  # the defaulted constexpr SCALE is passed too
    else:
        args = (torch.randn(4, 10), torch.randn(4, 10), torch.randn(10, 8))
        want = P.mixed_reference(*args)
    for n_fast in (0, 1, 2):  # the first call records the handles, the next ones use them
        pointer_reads.clear()
        got = ns["call_fast"](*args)
        assert all(len(calls) == n_fast for _, calls in runners)
        tensor_args = {a.name for s in launches for a in s.args if isinstance(a, S.TensorRef)}
        # each input's address is read once per call (the key tests alignment), and every other
        # tensor a launch takes once, however many launches take it
        assert len(pointer_reads) == len(set(prog.inputs) | tensor_args) if n_fast else len(prog.inputs)
        for g, w in zip(got, want, strict=True):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)
            else:
                assert g == w


def test_middle_constexpr_through_the_normal_path():
    fn = load(middle_program())
    x = torch.randn(33)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 3.0)
    # a constexpr between runtime parameters: every parameter is passed positionally, in order
    assert "_k_axpy[((s0 + 15)//16, 1, 1)](x, 16, out, 1.5, s0, 2, num_warps=1, num_stages=1)" in fn.source


def test_symbols_without_input_sources_use_their_hint():
    prog = P.scale_program("cpu")
    prog = msgspec.structs.replace(
        prog, buffers=tuple(msgspec.structs.replace(b, sizes=(50,)) if b.name == "buf0" else b for b in prog.buffers),
        symbols=(*prog.symbols, S.Symbol(name="s9", hint=50)),
        steps=(S.AllocStep(buffer="buf0"),
               S.LaunchStep(kernel="scale", args=(S.TensorRef(name="x"), S.TensorRef(name="buf0"),
                                                  S.Float(value=2.0), S.SymRef(expr="s9")))),
    )
    fn = load(prog)
    x = torch.randn(80)
    (out,) = fn(x)
    torch.testing.assert_close(out, x[:50] * 2)
    assert "s9 = 50" in fn.source


def scalar_input_program(device: str) -> S.Program:
    """A cuda Program whose second input is a CPU 0-dim tensor (as torch passes scalars)."""
    t = S.TensorRef
    return S.Program(
        name="scalar_in", inputs=("x", "c"), outputs=(t(name="y"),),
        buffers=(S.Buffer(name="x", dtype="float32", sizes=(8,), strides=(1,), device=device),
                 S.Buffer(name="c", dtype="float32", sizes=(), strides=(), device="cpu"),
                 S.Buffer(name="y", dtype="float32", sizes=(8,), strides=(1,), device=device)),
        steps=(S.ExternStep(op="aten.mul.Tensor", args=(t(name="x"), t(name="c")), outputs=("y",)),),
        device=device, opsets={"aten": 1},
    )


def test_cpu_inputs_of_a_cuda_program_are_checked_for_the_cpu():
    prog = scalar_input_program("cuda")
    src = generate(prog, device_type="cuda", kernels={}, configs={}).source
    assert "not x.is_cuda" in src and "not c.is_cpu" in src
    assert "_dev = x.device" in src
    fn = load(prog, device="cpu")  # retargeted: everything on the CPU
    x, c = torch.randn(8), torch.tensor(3.0)
    (y,) = fn(x, c)
    torch.testing.assert_close(y, x * 3)


def test_a_cuda_program_without_inputs_takes_the_current_device():
    prog = S.Program(
        name="zeros", outputs=(S.TensorRef(name="z"),),
        steps=(S.ExternStep(op="aten.zeros.default", args=(S.ListArg(items=(S.Int(value=3),)),),
                            kwargs={"device": S.DeviceArg(name="cuda")}, outputs=("z",)),),
        device="cuda",
    )
    src = generate(prog, device_type="cuda", kernels={}, configs={}).source
    assert "_dev = _cuda_device(_current_device())" in src
    assert "device=_dev" in src
    (z,) = load(prog, device="cpu")()  # retargeted: the DeviceArg follows
    torch.testing.assert_close(z, torch.zeros(3))


def test_grid_may_name_a_constexpr():
    prog = P.mixed_program("cpu")
    kernels = tuple(msgspec.structs.replace(k, grid=("s0 * RBLOCK // RBLOCK",)) if k.name == "triton_red_row_sum_0"
                    else k for k in prog.kernels)
    fn = load(msgspec.structs.replace(prog, kernels=kernels))
    x, y, w = torch.randn(3, 20), torch.randn(3, 20), torch.randn(20, 8)
    torch.testing.assert_close(fn(x, y, w)[0], (x + y).sum(1))
    assert "_k_triton_red_row_sum_0[(s0*16//16, 1, 1)]" in fn.source


class _FakeLauncher:
    """Stands in for Triton's CudaLauncher: a C ``launch`` and the attributes we read."""

    launch = staticmethod(len)  # any builtin function: "the C launcher"

    def __init__(self, scratch=0):
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True
        self.arg_annotations = "ann"
        self.kernel_signature = "sig"
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


class _FakeCompiled:
    def __init__(self, scratch=0):
        self.run = _FakeLauncher(scratch)
        self.function = 1234
        self.packed_metadata = (4, 1, 0)


def test_launcher_handles_go_direct_only_without_scratch():
    from torchfuse.runtime import launchers

    plain, scratchy = _FakeCompiled(), _FakeCompiled(scratch=128)
    assert launchers.handles("generic", plain) == (plain.run, 1234, (4, 1, 0))
    assert launchers.handles("args", plain) == (len, 1234, (4, 1, 0), False, True)
    assert launchers.handles("tuple", plain) == (len, 1234, (4, 1, 0), False, True, "ann", "sig")
    # a kernel that needs scratch memory keeps Triton's Python launcher, behind an adapter
    adapter, *_ = launchers.handles("args", scratchy)
    adapter(1, 2, 3, "stream", 1234, None, None, None, None, (4, 1, 0), None, None, None, "a", "b")
    assert scratchy.run.calls == [(1, 2, 3, "stream", 1234, (4, 1, 0), None, None, None, "a", "b")]
    adapter, *_ = launchers.handles("tuple", scratchy)
    adapter(1, 2, 3, "stream", 1234, None, None, (4, 1, 0), None, None, None, None, None, "ann", "sig", ("a",))
    assert scratchy.run.calls[-1] == (1, 2, 3, "stream", 1234, (4, 1, 0), None, None, None, "a")


def test_layout_follows_the_installed_triton(monkeypatch):
    import triton
    from torchfuse.runtime import launchers

    for version, layout in (("3.6.0", "args"), ("3.9.1", "tuple"), ("3.7.0", "generic"), ("4.0", "generic")):
        monkeypatch.setattr(triton, "__version__", version)
        assert launchers.triton_layout() == layout


def test_a_symbol_no_expression_uses_is_not_bound():
    """Two inputs whose sizes a guard made equal: the second input's symbol (s1) appears in
    no expression, so the call function neither binds nor keys on it; the first's check covers
    the second input's size, and a mismatching size is still refused."""
    import torch
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime.codegen import used_symbols

    graph, _ = trace(lambda x, y: x * y, torch.randn(5), torch.randn(5), dynamic={0: [0], 1: [0]})
    prog = compile_graph(graph, options={"cache": False})
    assert [s.name for s in prog.symbols] == ["s0", "s1"]
    assert used_symbols(prog) == {"s0"}
    fn = load(prog)
    gen = generate(prog, device_type="cpu", kernels=fn.kernels, configs=fn._default_configs())
    assert "s1" not in gen.source
    x, y = torch.randn(7), torch.randn(7)
    torch.testing.assert_close(fn(x, y)[0], x * y)
    with pytest.raises(Exception, match="input"):
        fn(torch.randn(7), torch.randn(6))
