"""A Program as one standalone Python module (``output_code.py``): what prints is what runs.

The module's ``call(*args)`` is the call function `torchfuse.runtime.codegen.generate`
writes for the runtime, the very code a loaded Program runs, with each kernel's first launch
config; around it are the kernels' sources, the globals that call function names (torch
functions, dtypes, ATen ops, the kernels), and a ``__main__`` that runs it on random inputs::

    import torch
    import triton
    import triton.language as tl
    ...                                              # every kernel, helpers once
    _float32 = torch.float32                         # the call function's globals
    _k_triton_poi_fused_add_0 = triton_poi_fused_add_0
    ...
    def call(*args):                                 # generate(program, ...).source
        ...

Nothing here imports or runs a kernel: the Triton functions' parameters are read off their
sources with ``ast``.
"""

from __future__ import annotations

import ast
import types
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import codegen

_HELPERS = {  # runtime helpers the call function may name, and where they live
    codegen._retype: "_retype",
    codegen._alloc_offset: "_alloc_offset",
    codegen.fit_layout: "fit_layout",
    codegen._flatten: "_flatten",
    codegen._cuda_device: "_cuda_device",
}
_TORCH = {
    torch.empty_strided: "torch.empty_strided",
    torch.as_strided: "torch.as_strided",
    torch.Tensor.data_ptr: "torch.Tensor.data_ptr",
    torch.is_grad_enabled: "torch.is_grad_enabled",
    torch.no_grad: "torch.no_grad",
}

_PREAMBLE = [
    "",
    "",
    "class _Stats:",
    "    calls = 0",
    "    kernel_launches = 0",
    "",
    "",
    "_stats = _Stats()",
    "_current_device = torch.cuda.current_device",
    "",
    "",
    "def _bad_inputs(args):",
    "    return TypeError(f'inputs do not match the program: {[getattr(a, \"shape\", a) for a in args]}')",
]


def _stand_in(kernel: S.Kernel) -> Any:
    """An object with the parameter names and literal defaults of ``kernel``'s entry function,
    all [`generate`][torchfuse.runtime.codegen.generate] reads of a Triton function."""
    entry = kernel.entry or kernel.name
    tree = ast.parse(kernel.source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    names = [a.arg for a in fn.args.args]
    defaults: dict[str, Any] = {}
    for a, d in zip(fn.args.args[len(fn.args.args) - len(fn.args.defaults):], fn.args.defaults, strict=True):
        try:
            defaults[a.arg] = ast.literal_eval(d)
        except ValueError:
            continue
    params = [
        f"{n}={defaults[n]!r}" if n in defaults else n
        for n in names
    ]
    # only identifiers (ast-parsed parameter names) and literals reach this source
    scope: dict[str, Any] = {}
    exec(f"def {entry}({', '.join(params)}):\n    pass\n", {}, scope)
    return types.SimpleNamespace(arg_names=names, fn=scope[entry], name=entry)


def _cpp_source(program: S.Program) -> list[str]:
    """The C++ kernels as one source string, built and loaded by `torchfuse.runtime.cpp`."""
    from torchfuse.runtime import cpp

    kernels = [k for k in program.kernels if k.language == "cpp"]
    if not kernels:
        return []
    # one repr'd string per line: readable, and nothing in a source can end the literal
    lines = [f"    {line!r}," for line in cpp.translation_unit(kernels).split("\n")]
    return ["", "from torchfuse.runtime.cpp import load_source as _load_cpp", "",
            '_CPP_SOURCE = "\\n".join([', *lines, "])",
            f"_cpp_kernels = _load_cpp(_CPP_SOURCE, {cpp.signatures(kernels)!r})"]


def _kernel_sources(program: S.Program) -> tuple[list[str], list[str]]:
    """The kernels' imports (once each) and their sources; a helper shared by kernels
    appears once."""
    imports: dict[str, None] = {}
    lines: list[str] = []
    helpers_done: set[str] = set()
    for k in program.kernels:
        if k.language != "triton":
            continue
        chunk: list[str] = []
        skip = False
        for ln in k.source.splitlines():
            if ln.startswith(("import ", "from ")):
                imports[ln] = None
                continue
            if ln.startswith("def _"):
                skip = ln in helpers_done
                helpers_done.add(ln)
                if skip and chunk and chunk[-1] == "@triton.jit":
                    chunk.pop()
            elif ln.startswith(("def ", "@")):
                skip = False
            if not skip:
                chunk.append(ln)
        lines += chunk
    return list(imports), lines


def _global_source(name: str, value: Any, kernels: dict[int, str], ops: dict[str, str]) -> str:
    if name in ops and not isinstance(value, torch._ops.OpOverload):
        # the OpOverload's own operator (`codegen.bound_op`): the same call, one frame less
        return f"{name} = torch.ops.{ops[name]}._op"
    if id(value) in kernels:
        return f"{name} = {kernels[id(value)]}"
    if isinstance(value, torch.dtype):
        return f"{name} = {value}"
    if isinstance(value, torch.device):
        return f"{name} = torch.device({str(value)!r})"
    if isinstance(value, torch._ops.OpOverload):
        return f"{name} = torch.ops.{value._schema.name.replace('::', '.')}.{value._overloadname}"
    for table, form in ((_TORCH, "{name} = {where}"),
                        (_HELPERS, "from torchfuse.runtime.codegen import {where} as {name}")):
        where = next((w for v, w in table.items() if v is value), None)
        if where is not None:
            return form.format(name=name, where=where)
    raise TypeError(f"output_code: no source for the global {name} = {value!r}")


def _main(program: S.Program) -> list[str]:
    lines = ["", "", 'if __name__ == "__main__":',
             '    dev = "cuda" if torch.cuda.is_available() else "cpu"', "    inputs = []"]
    bufs = {b.name: b for b in program.buffers}
    env = {s.name: s.hint or 8 for s in program.symbols}
    for name in program.inputs:
        b = bufs[name]
        sizes = [s if isinstance(s, int) else env.get(s, 8) for s in b.sizes]
        if b.dtype in ("float32", "float64", "float16", "bfloat16"):
            lines.append(f"    inputs.append(torch.randn({sizes}, dtype=torch.{b.dtype}, device=dev))")
        elif b.dtype == "bool":
            lines.append(f"    inputs.append(torch.rand({sizes}, device=dev) > 0.5)")
        else:
            lines.append(f"    inputs.append(torch.randint(0, 2, {sizes}, dtype=torch.{b.dtype}, "
                         "device=dev))")
    lines += ["    for out in call(*inputs):",
              "        print(getattr(out, 'shape', out), getattr(out, 'dtype', ''))", ""]
    return lines


def standalone_source(program: S.Program, *, device_type: str | None = None) -> str:
    """``program`` as a module whose ``call(*args)`` is the runtime's call function (each
    kernel launched with its first config), for ``device_type`` (default: the program's)."""
    device_type = device_type or ("cuda" if program.device.startswith("cuda") else "cpu")
    stand_ins = {k.name: _stand_in(k) if k.language == "triton"
                 else types.SimpleNamespace(name=f"_cpp_kernels[{(k.entry or k.name)!r}]")
                 for k in program.kernels}
    configs = {k.name: (k.configs[0] if k.configs else None) for k in program.kernels}
    gen = codegen.generate(program, device_type=device_type, kernels=stand_ins, configs=configs)
    kernels = {id(fn): fn.name for fn in stand_ins.values()}
    imports, sources = _kernel_sources(program)
    head = ["import torch", *dict.fromkeys(["import triton", "import triton.language as tl", *imports])]
    lines = [f'"""Generated by torchfuse for program {program.name!r}: the call function the runtime',
             'runs, with each kernel\'s first launch config."""', "", *head, "", "", *sources,
             *_cpp_source(program), *_PREAMBLE, ""]
    lines += [_global_source(n, v, kernels, gen.ops) for n, v in sorted(gen.globals.items())]
    lines += ["", "", *gen.source.rstrip().splitlines(), *_main(program)]
    return "\n".join(lines)


__all__ = ["standalone_source"]
