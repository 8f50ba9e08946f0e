"""Triton compiles in worker processes (`torchfuse.runtime.compile_workers`), on the CPU.

No GPU is needed to compile for one: this process plans with a stub driver naming an sm_90
target (what Triton asks of a driver to specialize and compile, not to launch), a real worker
process compiles into a private Triton cache, and this process's own warm-up must then find
every binary there (Triton's listener: cache hits, no compile). The kernel is then run through
the interpreter and compared with eager, so the source the workers compiled is the one that
computes the right values.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest
import torch
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph
from torchfuse.runtime import compile_workers as cw
from torchfuse.runtime import load
from torchfuse.runtime.kernels import CompileStats, WarmupJob, count_compiles

triton = pytest.importorskip("triton")
if not hasattr(getattr(triton, "knobs", None), "runtime") or not hasattr(triton.knobs.runtime, "jit_cache_hook"):
    pytest.skip("this Triton has no jit_cache_hook", allow_module_level=True)
if not hasattr(triton.runtime.jit.JITFunction, "preload"):
    pytest.skip("this Triton has no JITFunction.preload", allow_module_level=True)


def _program():
    x = torch.randn(4, 8)
    graph, _ = trace(lambda a: torch.relu(a * 2.0 + 1.0).sum(dim=1), x)
    return compile_graph(graph, options={"cache": False}), x


@pytest.fixture
def sm90(monkeypatch, tmp_path):
    """A stub driver for an sm_90 target in this process, and a private Triton cache."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    saved = driver._active
    driver.set_active(cw._StubDriver(GPUTarget("cuda", 90, 32)))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    yield tmp_path
    driver._active = saved


def _real_jit(tmp_path, kernel):
    """The kernel as a compiling ``JITFunction`` (this process imports kernels interpreted)."""
    path = tmp_path / f"k_{kernel.name}.py"
    path.write_text(kernel.source)
    name = f"torchfuse_test_workers.{kernel.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    interpreted = getattr(module, kernel.entry or kernel.name)
    fn = triton.runtime.jit.JITFunction(interpreted.fn)
    return fn, path


@pytest.mark.triton_cpu  # the workers compile Triton kernels
@pytest.mark.skipif(shutil.which("ptxas") is None and not os.path.exists(
    os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")),
    reason="no ptxas to compile with")
def test_workers_compile_what_this_process_then_loads_from_the_cache(sm90):
    program, x = _program()
    (kernel,) = program.kernels
    fn, path = _real_jit(sm90, kernel)
    from torchfuse.runtime.codegen import launch_values

    cfg = kernel.configs[0]
    # what the runtime's precompile hands Triton: pointers as dtypes, sizes as values
    values = launch_values(kernel, cfg, fn, [torch.float32, torch.float32, 4, 8])
    job = WarmupJob(kernel.name, fn, tuple(values), (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages)))

    planned = cw.plan([job], lambda f: path)
    assert len(planned) == 1, "the plan records the compile Triton would run"
    assert not fn.device_caches[0][0], "planning compiled nothing"
    pool = cw.WorkerPool(1, env={**os.environ, "TRITON_CACHE_DIR": os.environ["TRITON_CACHE_DIR"]})
    try:
        assert pool.compile([r for _, r in planned]) == [None]
    finally:
        pool.close()
    stats = CompileStats()
    with count_compiles(stats):
        fn.warmup(*job.args, grid=(1,), **dict(job.kwargs))
    assert (stats.triton_compiles, stats.triton_cache_hits) == (0, 1), \
        "this process found the worker's binary under its own key"
    torch.testing.assert_close(load(program, device="cpu")(x)[0], torch.relu(x * 2.0 + 1.0).sum(dim=1))


def test_a_failing_request_is_reported_not_raised(tmp_path):
    pool = cw.WorkerPool(1)
    try:
        bad = cw.CompileRequest(str(tmp_path / "missing.py"), "m", "k", "{}", {"backend": "cuda", "arch": 90,
                                                                               "warp_size": 32})
        (error,) = pool.compile([bad])
    finally:
        pool.close()
    assert error is not None and "missing.py" in error
    program, x = _program()  # and compiling goes on as before
    torch.testing.assert_close(load(program, device="cpu")(x)[0], torch.relu(x * 2.0 + 1.0).sum(dim=1))


def test_the_knob_is_off_by_default_and_bounded_by_the_cores():
    from torchfuse.runtime.config import from_environment

    assert from_environment({}).compile_workers == 0
    assert from_environment({"TORCHFUSE_COMPILE_WORKERS": "1000"}).compile_workers == (os.cpu_count() or 1) - 1
    assert from_environment({"TORCHFUSE_COMPILE_WORKERS": "0"}).compile_workers == 0
