"""GPU tests: compiled kernels, the fast launch path, autotuning, caches across processes, CUDA graphs.

Skipped without CUDA (the root conftest marks them); run them on the GPU machine with
``python -m pytest packages/runtime/tests -m gpu``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import runtime_programs as P
import torch
from torchfuse.runtime import load

pytestmark = pytest.mark.gpu


def _close(got, want):
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def _inputs(rows=64, cols=300, offset=0):
    x = torch.randn(rows * cols + offset, device="cuda")[offset:].view(rows, cols)
    return x, torch.randn(rows, cols, device="cuda"), torch.randn(cols, 8, device="cuda")


def test_mixed_program_and_the_fast_launch_path():
    fn = load(P.mixed_program("cuda"))
    for rows, cols in [(64, 300), (64, 300), (7, 33), (7, 33), (64, 300)]:
        x, y, w = _inputs(rows, cols)
        _close(fn(x, y, w), P.mixed_reference(x, y, w))
    assert fn.call.__name__ == "call_fast"
    handles = fn.call.__globals__["_handles"]
    assert len(handles) == 2, fn.stats.fallback_reasons  # one per (sizes, alignment) seen
    assert "_r0(" in fn.source


def test_misaligned_inputs_take_the_checked_path():
    fn = load(P.mixed_program("cuda"))
    x, y, w = _inputs(16, 40)
    fn(x, y, w)
    x, y, w = _inputs(16, 40, offset=1)  # 4-byte aligned only: Triton specializes on 16
    _close(fn(x, y, w), P.mixed_reference(x, y, w))
    _close(fn(x, y, w), P.mixed_reference(x, y, w))


def test_fast_launch_can_be_turned_off(monkeypatch):
    import torchfuse.runtime.config as rconfig

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, fast_launch=False))
    fn = load(P.mixed_program("cuda"))
    x, y, w = _inputs()
    for _ in range(2):
        _close(fn(x, y, w), P.mixed_reference(x, y, w))
    assert fn.call.__name__ == "call" and "_r0(" not in fn.source


def test_copy_step_on_gpu():
    fn = load(P.copy_program("cuda"))
    x = torch.randn(1000, device="cuda")
    before = x.clone()
    (out,) = fn(x)
    torch.testing.assert_close(out, 2 * before)
    torch.testing.assert_close(x, 2 * before)


def test_autotuning_picks_and_persists(cache_dir, monkeypatch):
    import torchfuse.runtime.config as rconfig

    # 8 MB moved: under the default threshold, which would take the cheapest config untuned;
    # tuned before the first call returns (after it: the next test)
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, autotune_min_bytes=0,
                                                                autotune_later=False))
    fn = load(P.scale_program("cuda"))
    x = torch.randn(1 << 20, device="cuda")
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert fn.stats.autotuned == 1
    (stored,) = (cache_dir / "autotune").iterdir()
    assert stored.name.startswith("cuda-sm")
    ((key, winner),) = json.loads(stored.read_text()).items()
    assert key.endswith(f"|s0<={1 << 20}")  # the size bucket (a power of two) the winner serves
    assert winner["meta"]["XBLOCK"] in (32, 128, 1024)
    assert f"XBLOCK={winner['meta']['XBLOCK']}" in fn.source
    again = load(P.scale_program("cuda"))
    (out,) = again(x)
    torch.testing.assert_close(out, x * 0.5)
    assert again.stats.autotuned == 0 and again.stats.autotune_cache_hits == 1


def test_tuning_after_the_first_call(cache_dir, monkeypatch):
    import torchfuse.runtime.config as rconfig

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(
        rconfig.config, autotune_min_bytes=0, autotune_default_max=0, autotune_later=True))
    fn = load(P.scale_program("cuda"))
    x = torch.randn(1 << 20, device="cuda")
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert fn.stats.autotuned == 0 and "XBLOCK=32" in fn.source  # the first candidate
    fn._later_compiles.result(timeout=300)  # the other two, compiled in the background
    assert fn.stats.later["background"] > 0
    y = torch.randn(1 << 20, device="cuda")
    (out,) = fn(y)  # the first call after them tunes
    torch.testing.assert_close(out, y * 0.5)
    assert fn.stats.autotuned == 1 and fn.stats.tuned_later == 1
    (stored,) = (cache_dir / "autotune").iterdir()
    ((_, winner),) = json.loads(stored.read_text()).items()
    assert f"XBLOCK={winner['meta']['XBLOCK']}" in fn.source
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert fn.stats.autotuned == 1


_CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    import torch
    import runtime_programs as P
    from torchfuse.runtime import load

    x = torch.randn(1 << 16, device="cuda")
    a, b, w = torch.randn(64, 300, device="cuda"), torch.randn(64, 300, device="cuda"), torch.randn(300, 8, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    f1 = load(P.mixed_program("cuda")); f1(a, b, w)
    f2 = load(P.scale_program("cuda")); f2(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    stats = [vars(f.stats) for f in (f1, f2)]
    print(json.dumps({"first_call_s": first, "stats": stats}))
""")


def _child(env):
    proc = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path, cache_dir):
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(cache_dir), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TORCHFUSE_AUTOTUNE_MIN_BYTES="0",  # tune the small scale kernel anyway,
               TORCHFUSE_AUTOTUNE_LATER="0",  # in the first call,
               # compiling in this process: the counts below are its own compiles and loads
               # (the workers' path: test_compile_workers.py)
               TORCHFUSE_COMPILE_WORKERS="0")
    cold = _child(env)
    warm = _child(env)
    print(f"first call, cold caches: {cold['first_call_s']:.3f} s; warm caches: {warm['first_call_s']:.3f} s")
    for s in warm["stats"]:
        assert s["autotuned"] == 0
        if s["triton_compiles"] is not None:
            assert s["triton_compiles"] == 0
            # nor warmed anything up: both launch from the handles the cold process kept (the
            # scale kernel's tuned function kept them when installed, its tuning run having
            # given that call's result: `handle_cache.keep_tuned`)
            assert s["triton_cache_hits"] == 0, s
    assert sum(s["autotuned"] for s in cold["stats"]) == 1
    if cold["stats"][0]["triton_compiles"] is not None:
        assert sum(s["triton_compiles"] for s in cold["stats"]) > 0
        # the scale kernel's three candidates are built once each: compiled, or (a candidate
        # whose binary a clone compiled first) loaded from Triton's disk cache; the launches
        # after tuning build nothing more (the warm-ups had the launches' specializations)
        scale = cold["stats"][1]
        assert scale["triton_compiles"] >= 1, scale
        assert scale["triton_compiles"] + scale["triton_cache_hits"] == 3, scale


def test_reduce_overhead_replays_a_cuda_graph():
    fn = load(P.mixed_program("cuda"), mode="reduce-overhead")
    eager_launches = None
    for i in range(6):
        x, y, w = _inputs()
        _close([t.clone() if isinstance(t, torch.Tensor) else t for t in fn(x, y, w)], P.mixed_reference(x, y, w))
        if i == 1:
            eager_launches = fn.stats.kernel_launches  # warm-up + side-stream run + capture
    assert fn.stats.graph_captures == 1
    assert fn.stats.graph_replays == 5
    assert fn.stats.kernel_launches == eager_launches  # replays launch nothing from Python
    x, y, w = _inputs(8, 20)  # a new shape is recorded again
    _close(fn(x, y, w), P.mixed_reference(x, y, w))
    _close(fn(x, y, w), P.mixed_reference(x, y, w))
    assert fn.stats.graph_captures == 2


def test_reduce_overhead_falls_back_for_programs_that_mutate_inputs():
    fn = load(P.copy_program("cuda"), mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(500, device="cuda")
        before = x.clone()
        (out,) = fn(x)
        torch.testing.assert_close(out, 2 * before)
        torch.testing.assert_close(x, 2 * before)
    assert fn.stats.graph_captures == 0
    assert any("writes into its inputs ['x']" in r for r in fn.stats.fallback_reasons), fn.stats.fallback_reasons


def test_reduce_overhead_with_a_tuned_kernel():
    fn = load(P.scale_program("cuda"), mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(4096, device="cuda")
        (out,) = fn(x)
        torch.testing.assert_close(out, x * 0.5)
    assert fn.stats.graph_replays == 2


def test_cpu_scalar_input_of_a_cuda_program():
    from test_codegen import scalar_input_program

    fn = load(scalar_input_program("cuda"))
    x, c = torch.randn(8, device="cuda"), torch.tensor(3.0)
    for _ in range(2):
        (y,) = fn(x, c)
        torch.testing.assert_close(y, x * 3)


def test_reduce_overhead_falls_back_for_cpu_inputs():
    from test_codegen import scalar_input_program

    fn = load(scalar_input_program("cuda"), mode="reduce-overhead")
    x = torch.randn(8, device="cuda")
    for value in (3.0, 5.0):
        (y,) = fn(x, torch.tensor(value))
        torch.testing.assert_close(y, x * value)
    assert fn.stats.graph_captures == 0


_QUICK_SRC = """
import triton
import triton.language as tl


@triton.jit
def scaled(x_ptr, out_ptr, n, big, scale, half, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale + half + (big - 2**40).to(tl.float32), mask=mask)
"""


def _quick_kernel(tmp_path):
    import importlib.util

    path = tmp_path / "quick_kernel.py"
    path.write_text(_QUICK_SRC)
    spec = importlib.util.spec_from_file_location("quick_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.scaled


def test_the_quick_launcher_launches_as_tritons_does(tmp_path):
    """Triton 3.6: pointers, i32, i64, fp32 and fp16 scalars and a constexpr reach the kernel
    through cuLaunchKernel as through Triton's own launcher, from any thread."""
    import threading

    import triton
    from torchfuse.runtime import launchers

    if launchers.triton_layout() != "args":
        pytest.skip("the quick launcher applies to Triton 3.6 only")
    kernel = _quick_kernel(tmp_path)
    x = torch.randn(1000, device="cuda")
    want = torch.empty_like(x)
    args = (x, want, 1000, 2**40 + 3, 1.5, 0.25)
    compiled = kernel[(triton.cdiv(1000, 128),)](*args, BLOCK=128)  # Triton's launch, its launcher built
    torch.cuda.synchronize()
    torch.testing.assert_close(want, x * 1.5 + 0.25 + 3)
    run = launchers.DeferredLauncher(lambda s, m: pytest.fail("built"), compiled.src, compiled.metadata)
    assert run.quick is not None
    got = torch.full_like(x, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    grid = (triton.cdiv(1000, 128), 1, 1)
    run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
        x, got, 1000, 2**40 + 3, 1.5, 0.25, 128)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    got2 = torch.full_like(x, float("nan"))
    errors = []

    def in_a_new_thread():
        try:
            run.quick(*grid, stream, compiled.function, 0, 0, None, None, compiled.packed_metadata, None,
                      None, None, x.data_ptr(), got2.data_ptr(), 1000, 2**40 + 3, 1.5, 0.25, 128)
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    t = threading.Thread(target=in_a_new_thread)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    torch.testing.assert_close(got2, want, rtol=0, atol=0)


_NO_BUILD_CHILD = """
import json, sys, threading
sys.path.insert(0, sys.argv[1])
import triton.backends.nvidia.driver as nv_driver
builds = []
real = nv_driver.compile_module_from_src
def counting(*a, **kw):
    # the builds after the first call run in the launchers' threads, and may start before
    # the caller reads the count: those are told apart by their thread
    after = threading.current_thread().name.startswith("torchfuse-launchers")
    builds.append(kw.get("name") + (" (after)" if after else ""))
    return real(*a, **kw)
nv_driver.compile_module_from_src = counting
import torch
import runtime_programs as P
from torchfuse.runtime import load
from torchfuse.runtime import wait_for_background
fn = load(P.mixed_program("cuda"))
first = None
for rows, cols in [(64, 300), (64, 300), (7, 33), ("wait", 0), (64, 300), (64, 300), (7, 33)]:
    if rows == "wait":
        wait_for_background()  # Triton's launchers, built after the first call
        continue
    x = torch.randn(rows, cols, device="cuda")
    y = torch.randn(rows, cols, device="cuda")
    w = torch.randn(cols, 8, device="cuda")
    for g, r in zip(fn(x, y, w), P.mixed_reference(x, y, w)):
        torch.testing.assert_close(g, r)
    if first is None:
        first = list(builds)
kinds = sorted({type(h[i]).__name__ for h in fn.call.__globals__["_handles"].values() for i in range(0, len(h), 5)})
print(json.dumps({"first": first, "builds": builds, "entry": fn.call.__name__, "launchers": kinds}))
"""


def test_a_cold_program_builds_no_triton_launcher(tmp_path, cache_dir):
    """A first call in a fresh process and fresh caches loads its kernels without compiling
    Triton 3.6's C launchers, matches eager, and takes the fast path."""
    from torchfuse.runtime import launchers

    if launchers.triton_layout() != "args":
        pytest.skip("Triton 3.6 only")
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(cache_dir), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", _NO_BUILD_CHILD, here], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "__triton_launcher" not in got["first"], got  # none before the first call returned
    assert "__triton_launcher (after)" in got["builds"], got  # built after it, in the background,
    assert got["entry"] == "call_fast", got
    assert got["launchers"] == ["builtin_function_or_method"], got  # and the calls since use them
    quiet = dict(env, TORCHFUSE_QUICK_LAUNCH="0")  # the switch restores Triton's builds
    out = subprocess.run([sys.executable, "-c", _NO_BUILD_CHILD, here], env=quiet, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "__triton_launcher" in json.loads(out.stdout.strip().splitlines()[-1])["first"]


_WARM_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import runtime_programs as P
from torchfuse.runtime import kernels as K
from torchfuse.runtime import load, wait_for_background

fn = load(P.mixed_program("cuda"))
out = {}
for step, (rows, cols) in enumerate([(64, 300), (64, 300), tuple(json.loads(sys.argv[2]))]):
    x, y = torch.randn(rows, cols, device="cuda"), torch.randn(rows, cols, device="cuda")
    w = torch.randn(cols, 8, device="cuda")
    for g, r in zip(fn(x, y, w), P.mixed_reference(x, y, w)):
        torch.testing.assert_close(g, r)
    if step == 0:
        out["first"] = {"compiles": fn.stats.triton_compiles, "hits": fn.stats.triton_cache_hits,
                        "kept": fn.stats.handles_kept,
                        "entry": fn.call.__name__,
                        "made": [k._fn is not None for k in fn.kernels.values() if isinstance(k, K.LazyKernel)],
                        "lazy": sum(isinstance(k, K.LazyKernel) for k in fn.kernels.values())}
        wait_for_background()
print(json.dumps(out))
"""


def test_a_warm_start_launches_from_the_kept_handles_without_triton_jit(tmp_path, cache_dir):
    """A second process over the same caches records the kept launch handles before its
    first call: no warm-up (no Triton cache lookup at all), no ``JITFunction`` made, values as
    eager's; a size it has no handles for then goes the ordinary way."""
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(cache_dir), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    here = os.path.dirname(__file__)
    runs = []
    for last in ([7, 33], [5, 20]):  # the warm process's last size has no handles kept
        out = subprocess.run([sys.executable, "-c", _WARM_CHILD, here, json.dumps(last)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1])["first"])
    cold, warm = runs
    # compiled here or by the compile workers (then a hit here)
    assert cold["compiles"] + cold["hits"] > 0 and cold["lazy"] == 2 and all(cold["made"]), cold
    assert list(cache_dir.glob("calls/*.handles.json")), "the cold process kept its handles"
    assert (warm["compiles"], warm["hits"]) == (0, 0), warm  # nothing warmed up, nothing looked up
    assert cold["kept"] == 0 and warm["kept"] == 2, (cold, warm)  # the two sizes the cold one ran
    assert warm["entry"] == "call_fast" and warm["made"] == [False, False], warm


def _warmup_case(monkeypatch, mode="default"):
    """The warm-up switched on, and a CUDA Program of one convolution (and an mm) with its
    inputs: ``fn, (x, w, m)``."""
    import msgspec
    import torchfuse.runtime.config as rconfig

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, library_warmup=True))
    program = P.conv_program("cuda")
    program = msgspec.structs.replace(program, steps=program.steps[:2] + program.steps[3:])
    fn = load(program, device="cuda", mode=mode)
    x = torch.randn(2, 4, 8, 8, device="cuda").to(memory_format=torch.channels_last)
    w, m = torch.randn(6, 4, 3, 3, device="cuda"), torch.randn(3, 3, device="cuda")
    return fn, (x, w, m)


def test_library_warmup_loads_the_convolutions_in_a_thread(monkeypatch, caplog):
    """``TORCHFUSE_LIBRARY_WARMUP``: the first call hands its one distinct convolution to the
    thread, which runs it without an error, and the call's results are eager's."""
    import logging

    from torchfuse.runtime import library_warmup

    fn, (x, w, m) = _warmup_case(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="torchfuse.runtime"):
        y0, y1, mm = fn(x, w, m)
        library_warmup.join_all()
    torch.testing.assert_close(y0, torch.nn.functional.conv2d(x, w, padding=1))
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(mm, m @ m)
    assert fn.stats.library_warmups == 1
    assert not [r for r in caplog.records if "library warm-up" in r.getMessage()]


def test_library_warmup_stays_off_under_reduce_overhead(monkeypatch):
    fn, (x, w, m) = _warmup_case(monkeypatch, mode="reduce-overhead")
    y0, _, _ = fn(x, w, m)
    torch.testing.assert_close(y0, torch.nn.functional.conv2d(x, w, padding=1))
    assert fn.stats.library_warmups == 0


def test_library_warmup_waits_out_the_background_compiler(monkeypatch):
    """No warm-up thread while the background thread works (a training step's backward
    compiling beside its forward's first call: the two slowed each other, 46-102 ms on
    ResNet-50 and MobileNet-V3 training, H100): the call is as without it."""
    import threading

    from torchfuse.runtime import background

    fn, (x, w, m) = _warmup_case(monkeypatch)
    release = threading.Event()
    job = background.submit(release.wait)
    try:
        y0, _, _ = fn(x, w, m)
    finally:
        release.set()
        job.result()
    torch.testing.assert_close(y0, torch.nn.functional.conv2d(x, w, padding=1))
    assert fn.stats.library_warmups == 0
