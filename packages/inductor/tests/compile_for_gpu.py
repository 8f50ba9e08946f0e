"""Compile (not run) generated kernels for an sm_90 target with Triton's real compiler.

Run without ``TRITON_INTERPRET``; needs no GPU (Triton ships its own LLVM and ptxas). Catches
code that the CPU interpreter accepts but the compiler rejects. Usage:
``python compile_for_gpu.py [--benchmarks]`` prints one ``OK <kernel>`` / ``FAIL <kernel>
<error>`` line per kernel and exits 1 on any failure, 77 when the toolchain is unavailable.
``--benchmarks`` compiles the kernels of the benchmark workloads at their full sizes (every
launch config) instead of the op and snapshot tables; ``--dynamic`` the same workloads with
symbolic sizes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import torch
import triton
from inductor_helpers import compile_fn
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTR = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float64": "fp64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}


_PROBE = """
import triton
import triton.language as tl


@triton.jit
def probe(x_ptr, n, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, i < n) + 1.0, i < n)
"""


def _load(name: str, source: str):
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _launch_constexprs(fn, given) -> list[str]:
    """Parameters the function declares ``tl.constexpr`` that no config fixes: the launch
    passes their value (``INDEX32``, chosen per call), so each value must compile."""
    return [p.name for p in fn.params if p.is_constexpr and p.name not in given]


def compile_kernel(kernel) -> None:
    fn = getattr(_load(kernel.name, kernel.source), kernel.entry)
    for cfg in kernel.configs:
        base = {**kernel.constexprs, **cfg.meta}
        per_call = _launch_constexprs(fn, base)
        for value in (0, 1) if per_call else (None,):
            consts = {**base, **{name: value for name in per_call}}
            sig = {p.name: ("*" + PTR[p.dtype]) if p.kind == "ptr" else p.kind for p in kernel.signature}
            sig.update({c: "constexpr" for c in consts})
            src = ASTSource(fn=fn, signature=sig, constexprs=consts)
            triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


def toolchain_works() -> None:
    """Raises when Triton cannot compile even a trivial kernel for sm_90 here."""
    fn = _load("probe", _PROBE).probe
    src = ASTSource(fn=fn, signature={"x_ptr": "*fp32", "n": "i32", "XBLOCK": "constexpr"},
                    constexprs={"XBLOCK": 128})
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def benchmark_programs() -> list:
    """The Programs of every benchmark workload at its full size (forward, and the forward
    and backward halves of training rows), compiled from graphs traced on CPU tensors."""
    from pathlib import Path

    from torchfuse.autograd.backend import interpreter_compiler
    from torchfuse.autograd.glue import aot
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import workloads

    programs = []
    for wl in workloads.select(None):
        if wl.fn is None:  # model rows: built from modules, covered by their layers' rows
            continue
        case = wl.make_case("cpu", scale="full")
        graph, _ = trace(case.fn, *case.inputs)
        graphs = [graph]
        if wl.training:
            plan = aot(graph, interpreter_compiler).plan(
                tuple(getattr(t, "requires_grad", False) for t in case.inputs), True
            )
            graphs = [plan.forward_graph, plan.partition.backward]
        programs += [compile_graph(g) for g in graphs]
    return programs


def dynamic_programs() -> list:
    """Every forward benchmark workload at its full size traced with each dim of 2 or more
    symbolic (what ``dynamic=True`` captures), plus split reductions over a symbolic row:
    kernels with size arguments, 64-bit indices and the persistent-or-looped branch."""
    from pathlib import Path

    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import workloads

    programs = []
    for wl in workloads.select(None):
        if wl.fn is None or wl.training:
            continue
        case = wl.make_case("cpu", scale="full")
        dynamic = {i: [d for d, n in enumerate(t.shape) if n >= 2] for i, t in enumerate(case.inputs)
                   if isinstance(t, torch.Tensor) and t.dim()}
        graph, _ = trace(case.fn, *case.inputs, dynamic=dynamic)
        programs.append(compile_graph(graph))
    split = {"split_min_rnumel": 32, "split_target": 4, "outer_split_programs": 8, "outer_split_min_chunk": 2}
    for fn in (lambda x: x.sum(), lambda x: x.amax(0), lambda x: (x.argmax(-1), x.sum(-1))):
        graph, _ = trace(fn, torch.randn(37, 9), dynamic={0: [0, 1]})
        programs.append(compile_graph(graph, options=split))
    return programs


def main() -> int:
    import test_codegen_snapshots as snaps
    import test_op_lowerings as ops

    programs = []
    if "--benchmarks" in sys.argv:
        programs = benchmark_programs()
    elif "--dynamic" in sys.argv:
        programs = dynamic_programs()
    else:
        for case in ops.CASES + ops.BF16_CASES:
            programs.append(compile_fn(case.fn, *ops._inputs(case), options=case.options))
        for fn, inputs, options in snaps.CASES.values():
            programs.append(compile_fn(fn, *inputs, options=options))
        # a 0-d read inside a padded region (what pad_mm makes of GPT-2's backward)
        programs.append(compile_fn(lambda x, s: torch.nn.functional.pad(x * s, (0, 3)),
                                   torch.randn(4, 5), torch.tensor(2.0)))
        # pointwise kernels written as rows x chunks (the experimental pointwise_rows option):
        # a persistent row and a looped one
        import test_fusion_counts as fusion

        for cols in (1001, 20001):
            programs.append(compile_fn(fusion._dlogits, *fusion._dlogits_inputs(cols),
                                       options={"pointwise_rows": 1000}))
        # 2-D tiles of pointwise kernels with a transposed access, and row reductions that
        # read across rows
        import test_tiling as tiling

        programs += tiling.gpu_programs()
        # a combo kernel (`torchfuse.inductor.combo`): 1-d and tiled members, bf16, a helper
        import test_combo_kernels as combo

        programs.append(compile_fn(combo.independent, *combo.independent_inputs(),
                                   options={"combo_kernels": True}))
    try:
        toolchain_works()
    except Exception as e:  # no usable nvidia toolchain here
        print(f"SKIP {e!r}")
        return 77
    failed = 0
    for program in programs:
        for kernel in program.kernels:
            try:
                compile_kernel(kernel)
                print("OK", kernel.name)
            except Exception as e:
                failed += 1
                print("FAIL", kernel.name, repr(e)[:500])
    return 1 if failed else 0


if __name__ == "__main__":
    torch.manual_seed(0)
    sys.exit(main())
