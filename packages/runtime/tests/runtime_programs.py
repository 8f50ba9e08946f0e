"""Hand-written Programs for the runtime tests, following the launch convention of the format.

Each builder returns a Program; ``device`` is the device type it is written for.
"""

from __future__ import annotations

import os
import shutil

import msgspec
import pytest
from torchfuse.graph import schema as S


def compiles_for_sm90(test):
    """Marks a test that compiles Triton kernels for sm_90 on the CPU (``triton_cpu``): skipped
    where Triton has no ``ptxas`` to do it with."""
    try:
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    except ImportError:
        bundled = ""
    no_ptxas = shutil.which("ptxas") is None and not os.path.exists(bundled)
    return pytest.mark.triton_cpu(pytest.mark.skipif(no_ptxas, reason="no ptxas to compile with")(test))

ADD_SRC = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)
'''

ROW_SUM_SRC = '''
import triton
import triton.language as tl


@triton.jit
def row_sum(x_ptr, out_ptr, ncols, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, RBLOCK)
    acc = tl.zeros([RBLOCK], dtype=tl.float32)
    for start in range(0, ncols, RBLOCK):
        c = start + cols
        acc += tl.load(x_ptr + row * ncols + c, mask=c < ncols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, 0))
'''

SCALE_SRC = '''
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, out_ptr, alpha, n, XBLOCK: tl.constexpr):
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)
'''


ADD_CONFIGS = (S.LaunchConfig(meta={"BLOCK": 64}, num_warps=4),)


def add_kernel(configs=ADD_CONFIGS) -> S.Kernel:
    return S.Kernel(
        name="add_kernel", source=ADD_SRC,
        signature=(S.KernelParam(name="x_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="y_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="out_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="n", kind="i32")),
        configs=tuple(configs),
        grid=("(s0*s1 + BLOCK - 1) // BLOCK",),
    )


def row_sum_kernel() -> S.Kernel:
    return S.Kernel(
        name="triton_red_row_sum_0", entry="row_sum", source=ROW_SUM_SRC,
        signature=(S.KernelParam(name="x_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="out_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="ncols", kind="i32")),
        constexprs={"RBLOCK": 16},
        configs=(S.LaunchConfig(num_warps=2),),
        grid=("s0",),
    )


def scale_kernel(configs) -> S.Kernel:
    return S.Kernel(
        name="scale", source=SCALE_SRC,
        signature=(S.KernelParam(name="x_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="out_ptr", kind="ptr", dtype="float32"),
                   S.KernelParam(name="alpha", kind="fp32"),
                   S.KernelParam(name="n", kind="i32")),
        configs=tuple(configs),
        grid=("(s0 + XBLOCK - 1) // XBLOCK",),
    )


def _buf(name, sizes, strides, device, dtype="float32"):
    return S.Buffer(name=name, dtype=dtype, sizes=sizes, strides=strides, device=device)


def mixed_program(device: str = "cuda") -> S.Program:
    """x, y: (s0, s1); w: (s1, 8).  Returns rowsum(x+y), (x+y) @ w, (2x).T, and s0*s1.

    Exercises: a pointwise kernel, a reduction kernel, an extern mm, a buffer taking over a
    freed buffer's storage, a view, a scalar output, and size symbols bound from inputs.
    """
    t = S.TensorRef
    return S.Program(
        name="mixed",
        inputs=("x", "y", "w"),
        outputs=(t(name="buf1"), t(name="buf2"), t(name="v0"), S.SymRef(expr="s0*s1")),
        buffers=(
            _buf("x", ("s0", "s1"), ("s1", 1), device),
            _buf("y", ("s0", "s1"), ("s1", 1), device),
            _buf("w", ("s1", 8), (8, 1), device),
            _buf("buf0", ("s0", "s1"), ("s1", 1), device),
            _buf("buf1", ("s0",), (1,), device),
            _buf("buf2", ("s0", 8), (8, 1), device),
            _buf("buf3", ("s0", "s1"), ("s1", 1), device),
            _buf("v0", ("s1", "s0"), (1, "s1"), device),
        ),
        kernels=(add_kernel(), row_sum_kernel()),
        steps=(
            S.AllocStep(buffer="buf0"),
            S.LaunchStep(kernel="add_kernel", args=(t(name="x"), t(name="y"), t(name="buf0"), S.SymRef(expr="s0*s1"))),
            S.AllocStep(buffer="buf1"),
            S.LaunchStep(kernel="triton_red_row_sum_0", args=(t(name="buf0"), t(name="buf1"), S.SymRef(expr="s1"))),
            S.ExternStep(op="aten.mm.default", args=(t(name="buf0"), t(name="w")), outputs=("buf2",)),
            S.FreeStep(buffer="buf0"),
            S.AllocStep(buffer="buf3", reuse="buf0"),
            S.LaunchStep(kernel="add_kernel", args=(t(name="x"), t(name="x"), t(name="buf3"), S.SymRef(expr="s0*s1"))),
            S.ViewStep(output="v0", base="buf3", sizes=("s1", "s0"), strides=(1, "s1")),
        ),
        symbols=(S.Symbol(name="s0", min=2, hint=4, source="input:0.size(0)"),
                 S.Symbol(name="s1", min=2, hint=24, source="input:0.size(1)")),
        device=device,
        opsets={"aten": 1},
    )


def mixed_reference(x, y, w):
    s = x + y
    return [s.sum(1), s @ w, (2 * x).t(), x.shape[0] * x.shape[1]]


def copy_program(device: str = "cuda") -> S.Program:
    """x: (s0,).  x <- x + x (written back with a CopyStep); returns the new x as a fresh buffer."""
    t = S.TensorRef
    return S.Program(
        name="inplace_double",
        inputs=("x",),
        outputs=(t(name="buf0"),),
        buffers=(_buf("x", ("s0",), (1,), device), _buf("buf0", ("s0",), (1,), device)),
        kernels=(S.Kernel(name="add_kernel", source=ADD_SRC,
                          signature=add_kernel().signature, configs=add_kernel().configs,
                          grid=("(s0 + BLOCK - 1) // BLOCK",)),),
        steps=(
            S.AllocStep(buffer="buf0"),
            S.LaunchStep(kernel="add_kernel", args=(t(name="x"), t(name="x"), t(name="buf0"), S.SymRef(expr="s0"))),
            S.CopyStep(dst="x", src="buf0"),
        ),
        symbols=(S.Symbol(name="s0", min=2, hint=100, source="input:0.size(0)"),),
        device=device,
    )


def scale_program(device: str = "cuda", configs=None) -> S.Program:
    """x: (s0,).  Returns x * 0.5 through a kernel with several candidate configs."""
    t = S.TensorRef
    configs = configs or (S.LaunchConfig(meta={"XBLOCK": 32}, num_warps=1),
                          S.LaunchConfig(meta={"XBLOCK": 128}, num_warps=4),
                          S.LaunchConfig(meta={"XBLOCK": 1024}, num_warps=8))
    return S.Program(
        name="scale",
        inputs=("x",),
        outputs=(t(name="buf0"),),
        buffers=(_buf("x", ("s0",), (1,), device), _buf("buf0", ("s0",), (1,), device)),
        kernels=(scale_kernel(configs),),
        steps=(
            S.AllocStep(buffer="buf0"),
            S.LaunchStep(kernel="scale", args=(t(name="x"), t(name="buf0"), S.Float(value=0.5), S.SymRef(expr="s0"))),
        ),
        symbols=(S.Symbol(name="s0", min=2, hint=100, source="input:0.size(0)"),),
        device=device,
    )


def chain_program(n_kernels: int, size: int = 64, device: str = "cuda") -> S.Program:
    """A chain of ``n_kernels`` tiny adds of constant size (launch-overhead measurements)."""
    t = S.TensorRef
    bufs = [_buf("x", (size,), (1,), device)]
    steps: list[S.Step] = []
    prev = "x"
    for i in range(n_kernels):
        name = f"buf{i}"
        bufs.append(_buf(name, (size,), (1,), device))
        steps.append(S.AllocStep(buffer=name))
        steps.append(S.LaunchStep(kernel="add_kernel", args=(t(name=prev), t(name="x"), t(name=name), S.Int(value=size))))
        if prev != "x":
            steps.append(S.FreeStep(buffer=prev))
        prev = name
    kernel = msgspec.structs.replace(add_kernel(), grid=((size + 63) // 64,))
    return S.Program(name=f"chain{n_kernels}", inputs=("x",), outputs=(t(name=prev),), buffers=tuple(bufs),
                     kernels=(kernel,), steps=tuple(steps), device=device)


def tuned(program: S.Program):
    """``load(program)`` with its kernels of several configs tuned on this device too (tuning is
    GPU only otherwise): the tests' stand-in benchmark then picks among the candidates."""
    from torchfuse.runtime import load

    fn = load(program)
    fn._setup_tuning([k for k in program.kernels if len(k.configs) > 1])
    return fn


CONV = "aten.convolution.default"


def _ints(*v: int) -> S.ListArg:
    return S.ListArg(items=tuple(S.Int(value=i) for i in v))


def _conv_args(x: str, w: str, padding: int = 1) -> tuple[S.Argument, ...]:
    t = S.TensorRef
    return (t(name=x), t(name=w), S.NoneArg(), _ints(1, 1), _ints(padding, padding), _ints(1, 1),
            S.Bool(value=False), _ints(0, 0), S.Int(value=1))


def conv_program(device: str = "cuda") -> S.Program:
    """x: (s0, 4, 8, 8) channels-last, w: (6, 4, 3, 3); ``c`` is not a buffer (a constant a
    Program is loaded with). Two convolutions of x by w (one call, made twice), one of their
    output by ``c`` (a step `library_warmup` leaves out; drop it to run the Program), an mm."""
    t = S.TensorRef
    return S.Program(
        name="convs",
        inputs=("x", "w", "m"),
        outputs=(t(name="y0"), t(name="y1"), t(name="mm")),
        buffers=(
            _buf("x", ("s0", 4, 8, 8), (256, 1, 32, 4), device),
            _buf("w", (6, 4, 3, 3), (36, 9, 3, 1), device),
            _buf("m", (3, 3), (3, 1), device),
            _buf("y0", ("s0", 6, 8, 8), (384, 1, 48, 6), device),
            _buf("y1", ("s0", 6, 8, 8), (384, 1, 48, 6), device),
            _buf("mm", (3, 3), (3, 1), device),
        ),
        steps=(
            S.ExternStep(op=CONV, args=_conv_args("x", "w"), outputs=("y0",)),
            S.ExternStep(op=CONV, args=_conv_args("x", "w"), outputs=("y1",)),
            S.ExternStep(op=CONV, args=_conv_args("y0", "c"), outputs=("z",)),
            S.ExternStep(op="aten.mm.default", args=(t(name="m"), t(name="m")), outputs=("mm",)),
        ),
        symbols=(S.Symbol(name="s0", min=1, hint=2, source="input:0.size(0)"),),
        device=device,
        opsets={"aten": 1},
    )
