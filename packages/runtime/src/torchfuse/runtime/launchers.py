"""Calling Triton's compiled-kernel launchers with as little Python in between as possible.

A compiled Triton kernel is launched through ``CompiledKernel.run``: a Python object
(``CudaLauncher``) whose ``__call__`` works out scratch memory on every launch and then calls
the C function that does ``cuLaunchKernelEx``. For a kernel that needs no scratch memory, that
Python layer only adds time (about a microsecond a launch, with two closures made each call),
so the fast path of the generated call function calls the C function itself.

The C function's argument order is not a public interface, so this is done only for Triton
versions whose launcher we have read (``LAYOUT_BY_VERSION``), only for kernels with no global or
profile scratch, no tensor descriptors and no sanitizer, and everything else goes through
``CompiledKernel.run`` ("generic" layout) exactly as Triton itself would call it. A kernel that
cannot take the direct path in a Program that does gets a small adapter with the same calling
convention, so one Program can mix both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LAYOUT_BY_VERSION = {(3, 6): "args", (3, 9): "tuple"}
"""Triton (major, minor) -> the layout of its C launcher (see ``codegen.LAUNCH_LAYOUTS``)."""


def triton_layout() -> str:
    """The launcher layout the installed Triton takes ("generic" when unknown)."""
    try:
        import triton
    except ImportError:
        return "generic"
    try:
        major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:
        return "generic"
    return LAYOUT_BY_VERSION.get((major, minor), "generic")


def _direct_ok(launcher: Any) -> bool:
    launch = getattr(launcher, "launch", None)
    return (
        type(launch).__name__ == "builtin_function_or_method"  # the C function, not a wrapper
        and getattr(launcher, "global_scratch_size", 1) == 0
        and getattr(launcher, "profile_scratch_size", 1) == 0
        and not getattr(launcher, "gsan_enabled", False)
    )


def handles(layout: str, compiled: Any) -> tuple[Any, ...]:
    """What ``call_fast`` unpacks for one launch of ``compiled`` (a Triton ``CompiledKernel``)."""
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    if layout == "generic":
        return run, function, meta
    if _direct_ok(run):
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        if layout == "args":
            return run.launch, function, meta, coop, pdl
        return run.launch, function, meta, coop, pdl, run.arg_annotations, run.kernel_signature
    return (_adapter(layout, run), function, meta, None, None) + ((None, None) if layout == "tuple" else ())


def _adapter(layout: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """A function with the direct layout's arguments that launches through ``run`` (Triton's
    own Python launcher), for kernels that need scratch memory or other launcher work."""
    if layout == "args":
        def launch_args(gx, gy, gz, stream, function, _coop, _pdl, _gs, _ps, meta, lmeta, enter, exit_,
                        *args):
            return run(gx, gy, gz, stream, function, meta, lmeta, enter, exit_, *args)

        return launch_args

    def launch_tuple(gx, gy, gz, stream, function, _coop, _pdl, meta, lmeta, enter, exit_, _gs, _ps,
                     _ann, _sig, args):
        return run(gx, gy, gz, stream, function, meta, lmeta, enter, exit_, *args)

    return launch_tuple
