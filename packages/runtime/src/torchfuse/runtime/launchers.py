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

**Launching without the launcher build.** Triton 3.6 also *builds* that C launcher, once per
kernel signature, with the system C compiler (0.2-0.4 s each, cached in Triton's disk cache);
torch.compile launches through a launcher of its own and builds none. Here kernels are loaded
with a stand-in (`DeferredLauncher`, see `bound_without_builds`), and a kernel with a plain
launch is launched through ``cuLaunchKernel`` by `quick_launcher`, which packs the arguments as
Triton's launcher would, until Triton's launcher is built after the first call (`build_soon`);
the others build Triton's launcher while they load. ``TORCHFUSE_QUICK_LAUNCH=0`` turns this off.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torchfuse.runtime.config as rconfig
from torchfuse.runtime import background
from torchfuse.runtime.config import logger

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
    if isinstance(run, DeferredLauncher):
        if run.built is not None:
            run = run.built
        elif layout == "args" and run.quick is not None and rconfig.config.quick_launch:
            return run.quick, function, meta, 0, 0
        else:
            run = run.real()
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


# --- Launching without Triton's per-signature launcher build (Triton 3.6) -------------------
#
# Triton 3.6 builds a C launcher for each kernel signature with the system C compiler, the first
# time a kernel of that signature is loaded (``CudaLauncher.__init__``), and caches it on disk.
# A build takes 0.2-0.4 s; on the GPU machine a cold first call of cross_entropy spent 0.40 s of
# its 0.87 s in two of them (``compile_profile --real --cprofile``, H100, 2026-12-07), while its
# two Triton compiles took 0.39 s. torch.compile does not build these (it launches through its
# own launcher), so this cost was ours alone.
#
# `bound_without_builds` loads kernels with a `DeferredLauncher` in place of Triton's launcher
# class: the module is loaded onto the device as before (``CompiledKernel._init_handles``), but
# no launcher is built. A kernel whose arguments are plain (pointers, integers, ``fp16``/``fp32``/
# ``fp64`` scalars, constexprs), with one CTA per program, no cooperative or PDL launch and no
# scratch memory, is launched through ``cuLaunchKernel`` with ``ctypes`` (`quick_launcher`)
# until Triton's launcher, built after the first call in a background thread (`build_soon`),
# replaces it (a quick launch costs about 2 µs more). Any other kernel builds Triton's launcher
# while it loads (`torchfuse.runtime.kernels.bind_launchers`), and a launch with Triton's launch
# hooks set goes through Triton's launcher, built then if need be.

PARAM_FORMAT = {
    "i1": "b7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q",
    "u1": "B7x", "u8": "B7x", "u16": "H6x", "u32": "I4x", "u64": "Q",
    "fp16": "e6x", "fp32": "f4x", "f32": "f4x", "fp64": "d",
}
"""Triton's scalar types -> a ``struct`` code in an 8-byte slot, as Triton 3.6's launcher
passes them to the kernel (``ty_to_cpp``, and floats as their storage bits). ``bf16`` has no
``struct`` code: such a kernel takes Triton's launcher."""


def signature_key(src: Any) -> tuple[str, ...]:
    """What a kernel's Triton launcher depends on: its arguments' types in order (a constant
    argument's type is ``constexpr``), not their names. Kernels of one key share a build."""
    return tuple(str(v) for v in dict(src.signature).values())


def hook_active(hook: Any) -> bool:
    """Whether a Triton launch hook (``knobs.runtime.launch_enter_hook``/``exit_hook``) does
    anything: Triton 3.6 passes an empty hook chain (``calls == []``) to every launch."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or bool(calls)


_CUDA_ERROR_INVALID_CONTEXT = 201
_cuda_lock = threading.Lock()
_cuda: dict[str, Any] = {}
_patch_lock = threading.Lock()
_patch_depth: list[Any] = [0, None]  # open `bound_without_builds` blocks, Triton's launcher class
_retrying = threading.local()  # a launch retried after making a context current


def _driver_api() -> dict[str, Any]:
    """The few CUDA driver functions the quick launcher calls, loaded once."""
    with _cuda_lock:
        if not _cuda:
            lib = ctypes.CDLL("libcuda.so.1")
            launch = lib.cuLaunchKernel
            launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
            launch.restype = ctypes.c_int
            error = lib.cuGetErrorString
            error.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            error.restype = ctypes.c_int
            _cuda.update(lib=lib, launch=launch, error=error)
        return _cuda


def _error_text(code: int) -> str:
    text = ctypes.c_char_p()
    if _driver_api()["error"](code, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode(errors="replace")
    return f"CUDA error {code}"


def _ensure_context() -> None:
    """Make the current device's primary context current on this thread, as Triton's
    launcher does before each launch (a thread that never touched CUDA has none)."""
    import torch

    lib = _driver_api()["lib"]
    device, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (lib.cuDeviceGet(ctypes.byref(device), torch.cuda.current_device()),
               lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device),
               lib.cuCtxSetCurrent(ctx)):
        if rc:
            raise RuntimeError(f"CUDA error making a context current: {_error_text(rc)}")


def _address(value: Any) -> int:
    """A pointer argument as Triton's launcher reads it: an int, None (null) or ``data_ptr()``
    (a tensor on another device refused, as Triton's launcher refuses it)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cuda") != "cuda":
        raise ValueError(f"Pointer argument cannot be accessed from Triton ({device} tensor)")
    try:
        return value.data_ptr()
    except AttributeError:
        raise TypeError("Pointer argument must be either uint64 or have data_ptr method") from None


_TEMPLATES: dict[tuple[str, ...], Callable[..., Any]] = {}


def _template(types: tuple[str, ...]) -> Callable[..., Any]:
    """``make(...) -> launch``: the quick launcher's code for one signature, exec-ed once."""
    made = _TEMPLATES.get(types)
    if made is not None:
        return made
    names = [f"a{i}" for i in range(len(types))]
    head = "gx, gy, gz, stream, function, _c, _p, _g, _s, _m, _l, _e, _x" + "".join(", " + n for n in names)
    packed = [f"{n} if {n}.__class__ is int else _address({n})" if t[0] == "*" else n
              for n, t in zip(names, types, strict=True) if t != "constexpr"]
    lines = [
        "def make(_launch, _pack, _buf, _params, _block, _shared, _lock, _address, _fail):",
        f"    def launch({head}):",
        "        if gx * gy * gz > 0:",
        "            with _lock:",
        f"                _pack(_buf, 0{''.join(', ' + p for p in packed)}, 0, 0)",
        "                rc = _launch(function, gx, gy, gz, _block, 1, 1, _shared, stream, _params, None)",
        "            if rc:",
        f"                _fail(rc, launch, ({head}))",
        "    return launch",
    ]
    scope: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<torchfuse launcher {','.join(types)}>", "exec"), scope)
    _TEMPLATES[types] = made = scope["make"]
    return made


def quick_refusal(types: Sequence[Any], metadata: Any) -> str | None:
    """Why `quick_launcher` cannot launch a kernel of these argument types and metadata (None:
    it can)."""
    if int(metadata.num_ctas) != 1:
        return f"num_ctas={metadata.num_ctas}"
    for what in ("launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size"):
        if getattr(metadata, what):
            return f"{what}={getattr(metadata, what)}"
    if getattr(metadata, "tensordesc_meta", None):
        return "tensor descriptors"
    odd = [t for t in types
           if not (isinstance(t, str) and (t == "constexpr" or t[0] == "*" or t in PARAM_FORMAT))]
    return f"argument types {odd}" if odd else None


def quick_launcher(src: Any, metadata: Any) -> Callable[..., Any] | None:
    """A ``cuLaunchKernel`` launcher with Triton 3.6's C launcher's calling convention
    (``LAUNCH_LAYOUTS["args"]``), or None where this kernel needs Triton's own."""
    try:
        types = tuple(dict(src.signature).values())
        num_warps, shared = int(metadata.num_warps), int(metadata.shared)
        refused = quick_refusal(types, metadata)
    except (AttributeError, TypeError, ValueError) as e:
        refused = f"unreadable metadata ({type(e).__name__}: {e})"
    if refused is not None:
        logger.debug("kernel %s launches through Triton's launcher: %s", getattr(src, "name", "?"), refused)
        return None
    fmt = "=" + "".join("Q" if t[0] == "*" else PARAM_FORMAT[t] for t in types if t != "constexpr") + "QQ"
    layout = struct.Struct(fmt)
    count = layout.size // 8  # every parameter in an 8-byte slot, the two scratch pointers last
    buf = ctypes.create_string_buffer(layout.size)
    base = ctypes.addressof(buf)
    params = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
    try:
        api = _driver_api()
    except (OSError, AttributeError):  # no loadable libcuda: Triton's launcher does it all
        return None

    def fail(rc: int, launch: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if rc == _CUDA_ERROR_INVALID_CONTEXT and not getattr(_retrying, "on", False):
            _ensure_context()
            _retrying.on = True
            try:
                launch(*args)
            finally:
                _retrying.on = False
            return
        raise RuntimeError(f"CUDA error launching {getattr(src, 'name', 'a kernel')}: {_error_text(rc)}")

    # the closure holds ``buf`` and ``params``: they live as long as the launcher
    return _template(types)(api["launch"], layout.pack_into, buf, params, 32 * num_warps, shared,
                            threading.Lock(), _address, fail)


class DeferredLauncher:
    """Stands in for Triton 3.6's ``CudaLauncher`` (``driver.active.launcher_cls``): nothing is
    built at load; launches go through `quick_launcher` when the kernel allows it, else through
    Triton's launcher, built at the first launch that needs it (`real`)."""

    def __init__(self, build: Callable[..., Any], src: Any, metadata: Any) -> None:
        self._build, self._src, self._metadata = build, src, metadata
        self._real: Any = None
        self._lock = threading.Lock()
        self.future: Future[None] | None = None
        """Its build in the background (`build_soon`), once scheduled."""
        self.num_ctas = getattr(metadata, "num_ctas", 1)
        self.global_scratch_size = metadata.global_scratch_size
        self.profile_scratch_size = metadata.profile_scratch_size
        self.launch_cooperative_grid = metadata.launch_cooperative_grid
        self.launch_pdl = metadata.launch_pdl
        self.quick = quick_launcher(src, metadata)

    @property
    def built(self) -> Any:
        """Triton's launcher once built (`real`, `build_soon`), else None."""
        return self._real

    def real(self) -> Any:
        """Triton's own launcher for this kernel (built on first use)."""
        with self._lock:
            if self._real is None:
                self._real = self._build(self._src, self._metadata)
            return self._real

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: int, *args: Any) -> None:
        # args: packed metadata, launch metadata, enter hook, exit hook, then the kernel's own
        real = self._real
        if real is None and self.quick is not None and not hook_active(args[2]) and not hook_active(args[3]):
            self.quick(gridX, gridY, gridZ, stream, function, 0, 0, None, None, *args)
        else:
            (real or self.real())(gridX, gridY, gridZ, stream, function, *args)


_builder: list[Any] = [None]  # the thread pool building Triton's launchers after first calls
_build_lock = threading.Lock()
_pending: set[Future[None]] = set()


def build_soon(deferred: Sequence[DeferredLauncher], then: Callable[[], None]) -> None:
    """Build Triton's launchers of ``deferred`` in background threads (one kernel of each
    signature first: the others then find it in Triton's disk cache), and call ``then`` once
    the builds are done. A call function's recorded launch handles are dropped by ``then``, so
    that its next call records Triton's launchers, which launch about 2 µs faster than
    `quick_launcher` (H100 host, 2026-12-07). A build that fails keeps the quick launcher (and
    is not retried); at interpreter exit, builds not yet started are dropped."""
    def build(group: list[DeferredLauncher]) -> None:
        for d in group:
            if background.exiting():
                return
            try:
                d.real()
            except Exception as e:  # logged; this kernel keeps the quick launcher
                logger.debug("building Triton's launcher of %s failed (%s: %s)",
                             getattr(d._src, "name", "a kernel"), type(e).__name__, e)
                return

    waiting: list[Future[None]] = []
    with _build_lock:
        groups: dict[tuple[str, ...], list[DeferredLauncher]] = {}
        for d in deferred:
            if d.built is None and d.future is None:
                groups.setdefault(signature_key(d._src), []).append(d)
        if groups and _builder[0] is None:
            _builder[0] = ThreadPoolExecutor(max_workers=4, thread_name_prefix="torchfuse-launchers")
        for group in groups.values():
            future = _builder[0].submit(build, group)
            _pending.add(future)
            future.add_done_callback(_pending.discard)
            for d in group:
                d.future = future
        waiting = list({id(d.future): d.future for d in deferred
                        if d.built is None and d.future is not None and not d.future.done()}.values())
    if not waiting:
        return  # built already, or failed before: nothing new to record
    # ``then`` runs in a callback, after the builds' waiters wake: its own future, kept with the
    # builds', is what `wait_for_builds` waits on for it
    after: Future[None] = Future()
    left = [len(waiting)]
    with _build_lock:
        _pending.add(after)
        after.add_done_callback(_pending.discard)

    def one_done(_: Any) -> None:
        with _build_lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            try:
                then()
            finally:
                after.set_result(None)

    for f in waiting:
        f.add_done_callback(one_done)


def wait_for_builds(timeout: float | None = None) -> None:
    """Wait for the launcher builds `build_soon` started so far, and for what each caller
    asked to run after them."""
    while True:
        with _build_lock:
            pending = [f for f in _pending if not f.done()]
        if not pending:
            return
        for f in pending:
            f.result(timeout)


background.add_waiter(wait_for_builds)


@contextmanager
def bound_without_builds() -> Iterator[bool]:
    """While open, kernels loaded in this process (``CompiledKernel._init_handles``) get a
    `DeferredLauncher` instead of a built Triton launcher; yields whether that applies (Triton
    3.6 on a CUDA device). Nested and concurrent uses share one swap."""
    if triton_layout() != "args" or not rconfig.config.quick_launch:
        yield False
        return
    try:
        import triton

        drv = triton.runtime.driver.active
        original = drv.launcher_cls
    except Exception:  # no driver: nothing to swap
        yield False
        return
    with _patch_lock:
        if _patch_depth[0] == 0:
            _patch_depth[1] = original
            drv.launcher_cls = functools.partial(DeferredLauncher, original)
        _patch_depth[0] += 1
    try:
        yield True
    finally:
        with _patch_lock:
            _patch_depth[0] -= 1
            if _patch_depth[0] == 0:
                drv.launcher_cls = _patch_depth[1]


def launch_hooks_active() -> bool:
    """Whether Triton's launch enter or exit hook is set (a profiler, say): the fast path is off then."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return False
    return hook_active(knobs.runtime.launch_enter_hook) or hook_active(knobs.runtime.launch_exit_hook)


def launcher_compatible(run: Any) -> bool:
    """Whether a compiled kernel's launcher takes what ``JITFunction.run`` passes it in the
    Triton versions we know (grid x/y/z, stream, function, then everything else positionally)."""
    import inspect

    try:
        params = list(inspect.signature(run).parameters.values())
    except (TypeError, ValueError):
        return True  # a launcher written in C: nothing to check
    names = [p.name for p in params[:5]]
    var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    return names == ["gridX", "gridY", "gridZ", "stream", "function"] and var


def recorder(table: dict[tuple[Any, ...], tuple[Any, ...]], layout: str, *, aligned_only: bool,
             note_fallback: Callable[[str], None], kept: Any = None) -> Callable[..., None]:
    """``_record`` of a generated call function: keeps the launchers of one call's compiled
    kernels in ``table`` under the call's key (`handles` per launch, in ``layout``), and with
    ``kept`` (a `torchfuse.runtime.handle_cache.Recorder`) where their binaries are, for a warm
    start. ``aligned_only``: a key whose last item (every input aligned) is false keeps the
    checked path. Launches through `quick_launcher` are recorded again, with Triton's
    launchers, once those are built (`build_soon`)."""

    def record(key: tuple[Any, ...], compiled: tuple[Any, ...], keep: bool = True) -> None:
        if aligned_only and not key[-1]:
            return  # a misaligned input: keep the checked path for such calls
        if launch_hooks_active():
            note_fallback("fast launch off: Triton launch hooks are installed (profiler?)")
            return
        entries: list[Any] = []
        quick: list[DeferredLauncher] = []
        for c in compiled:
            if c is None or not hasattr(c, "packed_metadata") or not hasattr(c, "function"):
                note_fallback("fast launch off: Triton returned no compiled kernel")
                return
            run = c.run
            if not launcher_compatible(run):
                note_fallback(f"fast launch off: unknown launcher signature {run!r}")
                return
            entries += handles(layout, c)
            if isinstance(run, DeferredLauncher) and run.built is None and run.quick:
                quick.append(run)  # launched through cuLaunchKernel until Triton's is built
        table[key] = tuple(entries)
        if kept is not None and keep:
            kept.remember(key, compiled)
        if quick:  # recorded again, with Triton's launchers, once they are built
            build_soon(quick, lambda: record(key, compiled, keep=False))

    return record
