"""The quick launcher (Triton 3.6's launch without its per-signature C build), on the CPU.

``cuLaunchKernel`` is replaced by a recorder that reads the kernel parameters back through the
pointer array, as the driver would; the GPU tests launch real kernels through it.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from types import SimpleNamespace

import pytest
import torch
from torchfuse.runtime import launchers


def _meta(**kw):
    base = dict(num_warps=4, num_ctas=1, shared=1024, launch_cooperative_grid=False, launch_pdl=False,
                global_scratch_size=0, profile_scratch_size=0)
    return SimpleNamespace(**{**base, **kw})


def _src(*types):
    return SimpleNamespace(signature={f"p{i}": t for i, t in enumerate(types)}, name="k")


class _Driver:
    """Stands in for libcuda: records each launch with its parameters read back as bytes."""

    def __init__(self, monkeypatch, codes=()):
        self.launches = []
        self.codes = list(codes)
        monkeypatch.setattr(launchers, "_driver_api", lambda: {"launch": self.launch, "error": self.error})

    def launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        raw = [ctypes.string_at(params[i], 8) for i in range(len(params))]
        self.launches.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                  stream=stream, raw=raw, extra=extra))
        return self.codes.pop(0) if self.codes else 0

    def error(self, code, out):
        return 1  # no text: the message falls back to the number


def test_parameters_reach_the_kernel_as_triton_36_passes_them(monkeypatch):
    drv = _Driver(monkeypatch)
    launch = launchers.quick_launcher(_src("*fp32", "i32", "constexpr", "i64", "fp32", "fp16", "i1", "u8"),
                                      _meta(num_warps=8, shared=4096))
    assert launch is not None
    launch(3, 2, 1, 77, 1234, 0, 0, None, None, (8, 1, 4096), None, None, None,
           1 << 34, -5, 128, 2**40, 1.5, 0.25, True, 200)
    (rec,) = drv.launches
    assert rec["function"] == 1234 and rec["grid"] == (3, 2, 1) and rec["stream"] == 77
    assert rec["block"] == (256, 1, 1) and rec["shared"] == 4096 and rec["extra"] is None
    raw = rec["raw"]
    assert len(raw) == 7 + 2  # the constexpr is not a parameter; two scratch pointers follow
    assert struct.unpack("=Q", raw[0])[0] == 1 << 34
    assert struct.unpack("=i", raw[1][:4])[0] == -5
    assert struct.unpack("=q", raw[2])[0] == 2**40
    assert struct.unpack("=f", raw[3][:4])[0] == 1.5
    assert struct.unpack("=e", raw[4][:2])[0] == 0.25
    assert struct.unpack("=b", raw[5][:1])[0] == 1
    assert struct.unpack("=B", raw[6][:1])[0] == 200
    assert raw[7] == raw[8] == bytes(8)


def test_pointer_arguments_take_ints_none_and_data_ptr(monkeypatch):
    drv = _Driver(monkeypatch)
    launch = launchers.quick_launcher(_src("*fp32", "*fp32", "*fp32"), _meta())

    class OnTheGpu:  # what the launcher reads of a CUDA tensor
        device = torch.device("cuda", 0)

        def data_ptr(self):
            return 1 << 33

    t = OnTheGpu()
    launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, 4096, None, t)
    raw = drv.launches[0]["raw"]
    assert [struct.unpack("=Q", r)[0] for r in raw[:3]] == [4096, 0, 1 << 33]
    with pytest.raises(TypeError, match="data_ptr"):
        launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, "not a pointer", None, t)
    with pytest.raises(ValueError, match="cannot be accessed from Triton"):  # as Triton's launcher
        launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, torch.ones(2), None, t)
    assert len(drv.launches) == 1


def test_an_empty_grid_launches_nothing(monkeypatch):
    drv = _Driver(monkeypatch)
    launch = launchers.quick_launcher(_src("*fp32", "i32"), _meta())
    launch(0, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, 0, 3)
    assert drv.launches == []


def test_a_failed_launch_raises_with_the_kernel_name(monkeypatch):
    _Driver(monkeypatch, codes=[700])
    launch = launchers.quick_launcher(_src("*fp32"), _meta())
    with pytest.raises(RuntimeError, match="launching k: CUDA error 700"):
        launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, 0)


def test_a_thread_without_a_context_gets_one_and_the_launch_is_retried(monkeypatch):
    drv = _Driver(monkeypatch, codes=[201])
    made = []
    monkeypatch.setattr(launchers, "_ensure_context", lambda: made.append(1))
    launch = launchers.quick_launcher(_src("*fp32"), _meta())
    launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, 8)
    assert made == [1] and len(drv.launches) == 2


def test_concurrent_launches_each_pass_their_own_arguments(monkeypatch):
    drv = _Driver(monkeypatch)
    launch = launchers.quick_launcher(_src("*fp32", "i64"), _meta())

    def many(k):
        for i in range(200):
            launch(1, 1, 1, 0, 1, 0, 0, None, None, None, None, None, None, k, k * 1000 + i)

    threads = [threading.Thread(target=many, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pairs = [(struct.unpack("=Q", r["raw"][0])[0], struct.unpack("=q", r["raw"][1])[0]) for r in drv.launches]
    assert len(pairs) == 600 and all(v // 1000 == p for p, v in pairs)


@pytest.mark.parametrize("change", [
    dict(num_ctas=2), dict(launch_cooperative_grid=True), dict(launch_pdl=True),
    dict(global_scratch_size=64), dict(profile_scratch_size=8), dict(tensordesc_meta=[{}]),
])
def test_kernels_needing_more_than_a_plain_launch_take_tritons_launcher(change):
    assert launchers.quick_launcher(_src("*fp32", "i32"), _meta(**change)) is None


@pytest.mark.parametrize("ty", ["bf16", "nvTmaDesc", "tensordesc<fp32[16, 16]>", ("i32", "i32")])
def test_argument_types_without_a_quick_form_take_tritons_launcher(ty):
    assert launchers.quick_launcher(_src("*fp32", ty), _meta()) is None


def test_the_deferred_launcher_builds_tritons_only_when_needed(monkeypatch):
    drv = _Driver(monkeypatch)
    built = []

    def build(src, metadata):
        built.append(src)
        return lambda *args: built.append(args)

    quick = launchers.DeferredLauncher(build, _src("*fp32", "constexpr"), _meta())
    quick(1, 1, 1, 0, 5, (4, 1, 0), None, None, None, 16, 128)  # JITFunction.run's convention
    assert built == [] and len(drv.launches) == 1
    hook = object()
    quick(1, 1, 1, 0, 5, (4, 1, 0), None, hook, None, 16, 128)  # a launch hook: Triton's own
    assert len(built) == 2 and built[1][-2:] == (16, 128)
    plain = launchers.DeferredLauncher(build, _src("*bf16", "bf16"), _meta())
    assert plain.quick is None
    plain(1, 1, 1, 0, 5, (4, 1, 0), None, None, None, 16, 0.5)
    assert len(built) == 4  # built once more (its own), then launched


def test_handles_of_a_deferred_kernel_use_the_quick_launcher(monkeypatch):
    _Driver(monkeypatch)
    run = launchers.DeferredLauncher(lambda s, m: None, _src("*fp32"), _meta())
    compiled = SimpleNamespace(run=run, function=9, packed_metadata=(4, 1, 1024))
    assert launchers.handles("args", compiled) == (run.quick, 9, (4, 1, 1024), 0, 0)


def test_no_swap_without_triton_36(monkeypatch):
    monkeypatch.setattr(launchers, "triton_layout", lambda: "tuple")
    with launchers.bound_without_builds() as deferred:
        assert deferred is False


class _Hooks:
    def __init__(self, calls):
        self.calls = calls


def test_an_empty_hook_chain_is_no_hook():
    assert not launchers.hook_active(None)
    assert not launchers.hook_active(_Hooks([]))
    assert launchers.hook_active(_Hooks([print]))
    assert launchers.hook_active(print)  # a plain callable


def test_jit_launches_with_an_empty_hook_chain_stay_quick(monkeypatch):
    drv = _Driver(monkeypatch)
    run = launchers.DeferredLauncher(lambda s, m: pytest.fail("built"), _src("*fp32"), _meta())
    run(1, 1, 1, 0, 5, (4, 1, 0), None, _Hooks([]), _Hooks([]), 16)
    assert len(drv.launches) == 1


class _Built:
    """Triton's launcher as `launchers.handles` reads it."""

    launch = len  # a builtin, as Triton's C function is
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, log):
        self.log = log

    def __call__(self, *args):
        self.log.append(("built", args))


def test_launchers_built_later_replace_the_quick_one(monkeypatch):
    import time

    _Driver(monkeypatch)
    order = []

    def build(src, metadata):
        order.append(src.name)
        time.sleep(0.05)
        return _Built(order)

    a = [launchers.DeferredLauncher(build, SimpleNamespace(signature={"x": "*fp32"}, name=f"a{i}"), _meta())
         for i in range(3)]
    b = launchers.DeferredLauncher(build, SimpleNamespace(signature={"x": "*fp16", "n": "i32"}, name="b"), _meta())
    done = threading.Event()
    calls = []
    launchers.build_soon([*a, b], lambda: (calls.append(1), done.set()))
    launchers.build_soon(a[:1], lambda: calls.append(2))  # already scheduled: waits for the same build
    launchers.wait_for_builds(10)  # the builds, and what was to run after them
    assert done.is_set() and sorted(calls) == [1, 2]
    # one signature's kernels are built in turn, in one thread; the signatures side by side
    assert [n for n in order if isinstance(n, str) and n.startswith("a")] == ["a0", "a1", "a2"]
    assert all(d.built is not None for d in [*a, b])
    compiled = SimpleNamespace(run=b, function=9, packed_metadata=(4, 1, 1024))
    assert launchers.handles("args", compiled)[0] is len  # Triton's C launcher, as before
    b(1, 1, 1, 0, 9, (4, 1, 1024), None, None, None, 16, 3)
    assert order[-1][0] == "built"
    calls.clear()
    launchers.build_soon([*a, b], lambda: calls.append(3))  # nothing left to build
    assert calls == []


def test_a_failed_build_keeps_the_quick_launcher_and_is_not_retried(monkeypatch):
    _Driver(monkeypatch)
    tries = []

    def build(src, metadata):
        tries.append(1)
        raise OSError("no C compiler")

    d = launchers.DeferredLauncher(build, _src("*fp32"), _meta())
    done = threading.Event()
    launchers.build_soon([d], done.set)
    assert done.wait(10)
    assert d.built is None and d.quick is not None
    again = []
    launchers.build_soon([d], lambda: again.append(1))
    launchers.wait_for_builds(10)
    assert tries == [1] and again == []


def test_the_swap_restores_tritons_launcher_class(monkeypatch):
    import triton

    class Original:
        pass

    drv = SimpleNamespace(launcher_cls=Original)
    monkeypatch.setattr(launchers, "triton_layout", lambda: "args")
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=drv), raising=False)
    with launchers.bound_without_builds() as outer:
        assert outer is True
        with launchers.bound_without_builds():
            made = drv.launcher_cls(_src("*fp32"), _meta())
            assert isinstance(made, launchers.DeferredLauncher)
        assert drv.launcher_cls is not Original  # the outer block is still open
    assert drv.launcher_cls is Original


def test_binding_builds_now_only_what_the_quick_launcher_cannot_launch(monkeypatch):
    """`kernels.bind_launchers` under the swap: every kernel is loaded; those with a quick
    launcher build nothing, the others build Triton's launcher at once (one per signature
    first), not at their first launch."""
    import contextlib

    from torchfuse.runtime import kernels

    _Driver(monkeypatch)
    monkeypatch.setattr(launchers, "bound_without_builds", lambda: contextlib.nullcontext(True))
    built = []

    class Kernel:
        def __init__(self, name, *types):
            self.name, self.src = name, SimpleNamespace(signature=dict(enumerate(types)), name=name)
            self._run = None

        def _init_handles(self):
            self._run = launchers.DeferredLauncher(lambda s, m: built.append(s.name), self.src, _meta())

    ks = [Kernel("quick", "*fp32", "i32"), Kernel("b1", "*bf16", "bf16"), Kernel("b2", "*bf16", "bf16"),
          Kernel("b3", "*fp32", "bf16")]
    kernels.bind_launchers(ks, threads=4)
    assert all(isinstance(k._run, launchers.DeferredLauncher) for k in ks)
    assert sorted(built) == ["b1", "b2", "b3"] and built[-1] == "b2"  # after b1, of its signature
    assert ks[0]._run.built is None and ks[0]._run.quick is not None


def test_a_refused_kernel_says_why():
    assert launchers.quick_refusal(("*fp32", "i32"), _meta()) is None
    assert launchers.quick_refusal(("*fp32",), _meta(num_ctas=2)) == "num_ctas=2"
    assert launchers.quick_refusal(("*fp32",), _meta(global_scratch_size=64)) == "global_scratch_size=64"
    assert launchers.quick_refusal(("*bf16", "bf16"), _meta()) == "argument types ['bf16']"
