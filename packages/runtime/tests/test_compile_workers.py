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
import threading

import pytest
import runtime_programs as P
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


@P.compiles_for_sm90
@pytest.mark.parametrize("warm", [False, True], ids=["cold-workers", "warmed-up-workers"])
def test_workers_compile_what_this_process_then_loads_from_the_cache(sm90, warm):
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
    pool = cw.WorkerPool(1, env={**os.environ, "TRITON_CACHE_DIR": os.environ["TRITON_CACHE_DIR"]},
                         target={"backend": "cuda", "arch": 90, "warp_size": 32} if warm else None)
    try:
        assert [r.error for r in pool.compile([r for _, r in planned])] == [None]
    finally:
        pool.close()
    stats = CompileStats()
    with count_compiles(stats):
        fn.warmup(*job.args, grid=(1,), **dict(job.kwargs))
    assert (stats.triton_compiles, stats.triton_cache_hits) == (0, 1), \
        "this process found the worker's binary under its own key"
    torch.testing.assert_close(load(program, device="cpu")(x)[0], torch.relu(x * 2.0 + 1.0).sum(dim=1))


@P.compiles_for_sm90
def test_a_workers_warm_up_compiles_outside_the_shared_cache(tmp_path):
    """`_warm_up` runs Triton's whole pipeline once (what a worker's first request would
    otherwise pay for) into a private cache, and leaves the shared one and the environment as
    they were. Run as a worker runs: a fresh process that imported Triton without the
    interpreter."""
    import subprocess

    shared = tmp_path / "triton"
    child = (
        "import importlib.util, json, os, sys\n"
        "spec = importlib.util.spec_from_file_location('_w', sys.argv[1])\n"
        "w = importlib.util.module_from_spec(spec); sys.modules['_w'] = w; spec.loader.exec_module(w)\n"
        "import triton\n"
        "seen = []\n"
        "triton.knobs.compilation.listener = lambda **kw: seen.append(kw.get('cache_hit'))\n"
        "w._warm_up({'backend': 'cuda', 'arch': 90, 'warp_size': 32})\n"
        "print(json.dumps({'compiles': seen, 'cache_dir': os.environ.get('TRITON_CACHE_DIR')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(shared)
    out = subprocess.run([sys.executable, "-c", child, cw.__file__], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got == {"compiles": [False], "cache_dir": str(shared)}, got
    assert not shared.exists() or not any(shared.iterdir())


def test_a_worker_whose_warm_up_fails_still_compiles(tmp_path):
    pool = cw.WorkerPool(1, target={"backend": "no-such-backend", "arch": 0, "warp_size": 32})
    try:
        bad = cw.CompileRequest(str(tmp_path / "missing.py"), "m", "k", "{}", {"backend": "cuda", "arch": 90,
                                                                               "warp_size": 32})
        (result,) = pool.compile([bad])  # answered (its own error), not lost
    finally:
        pool.close()
    assert not result.lost and "missing.py" in result.error


def test_a_failing_request_is_reported_not_raised(tmp_path):
    pool = cw.WorkerPool(1)
    try:
        bad = cw.CompileRequest(str(tmp_path / "missing.py"), "m", "k", "{}", {"backend": "cuda", "arch": 90,
                                                                               "warp_size": 32})
        (result,) = pool.compile([bad])
        error = result.error
    finally:
        pool.close()
    assert error is not None and "missing.py" in error
    program, x = _program()  # and compiling goes on as before
    torch.testing.assert_close(load(program, device="cpu")(x)[0], torch.relu(x * 2.0 + 1.0).sum(dim=1))


def test_the_default_uses_workers_on_four_cores_or_more_and_zero_turns_them_off(monkeypatch):
    from torchfuse.runtime import config as rc

    assert [rc.default_compile_workers(n) for n in (1, 2, 3, 4, 8, 16, 64)] == [0, 0, 0, 3, 7, 15, 16]
    monkeypatch.setattr(rc, "cores", lambda: 16)
    assert rc.from_environment({}).compile_workers == 15
    assert rc.from_environment({"TORCHFUSE_COMPILE_WORKERS": "0"}).compile_workers == 0
    assert rc.from_environment({"TORCHFUSE_COMPILE_WORKERS": "1000"}).compile_workers == 15
    assert rc.from_environment({}).compile_workers_min == 2
    assert rc.from_environment({"TORCHFUSE_COMPILE_WORKERS_MIN": "3"}).compile_workers_min == 3
    monkeypatch.setattr(rc, "cores", lambda: 2)
    assert rc.from_environment({}).compile_workers == 0


def _jobs(tmp_path, fns_by_program):
    """One warm-up job per (program, kernel), each on a fresh compiling ``JITFunction``."""
    from torchfuse.runtime.codegen import launch_values

    out = []
    for tag, (program, args) in fns_by_program.items():
        (tmp_path / tag).mkdir(parents=True, exist_ok=True)
        jobs = []
        for kernel in program.kernels:
            fn, _ = _real_jit(tmp_path / tag, kernel)
            cfg = kernel.configs[0] if kernel.configs else None
            values = launch_values(kernel, cfg, fn, args)
            kw = (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages)) if cfg else ()
            jobs.append(WarmupJob(kernel.name, fn, tuple(values), kw))
        out.append(jobs)
    return out


def _two_programs():
    a, b = torch.randn(4, 8), torch.randn(16)
    ga, _ = trace(lambda x: torch.relu(x * 2.0 + 1.0).sum(dim=1), a)
    gb, _ = trace(lambda y: torch.sigmoid(y) * 3.0 - y, b)
    pa = compile_graph(ga, options={"cache": False})
    pb = compile_graph(gb, options={"cache": False})
    return {"a": (pa, [torch.float32, torch.float32, 4, 8]), "b": (pb, [torch.float32, torch.float32, 16])}


def _cubins(jobs):
    import hashlib

    return [hashlib.sha256(job.fn.warmup(*job.args, grid=(1,), **dict(job.kwargs)).asm["cubin"]).hexdigest()
            for job in jobs]


_CHILD_JOBS = """
import hashlib, importlib.util, json, sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from torchfuse.runtime import compile_workers as cw
from torchfuse.runtime.kernels import CompileStats, WarmupJob, precompile

driver.set_active(cw._StubDriver(GPUTarget("cuda", 90, 32)))
jobs = []
for path, module_name, entry, args, kw in json.loads(sys.argv[1]):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, entry)
    args = [getattr(torch, a[6:]) if isinstance(a, str) and a.startswith("torch.") else a for a in args]
    jobs.append(WarmupJob(entry, fn, tuple(args), tuple(map(tuple, kw))))
"""
"""A child's preamble: the jobs of ``sys.argv[1]`` (`_spec`) on compiling ``JITFunction``s for
an sm_90 stub driver, in a process without the interpreter."""

_SEQUENTIAL = _CHILD_JOBS + """
precompile(jobs, CompileStats(), threads=1)  # one after another, in this process
print(json.dumps([hashlib.sha256(j.fn.warmup(*j.args, grid=(1,), **dict(j.kwargs)).asm["cubin"]).hexdigest()
                  for j in jobs]))
"""


def _sequential_cubins(jobs, cache):
    """The binaries of ``jobs`` compiled one after another by Triton in a fresh process (this one
    runs Triton's interpreter, which cannot compile for a GPU after it is imported)."""
    return _run_child(_SEQUENTIAL, jobs, TRITON_CACHE_DIR=str(cache), TORCHFUSE_COMPILE_WORKERS="0")


def _run_child(script, jobs, **env_vars):
    """``script`` (after `_CHILD_JOBS`) in a fresh process without the interpreter; its last
    line of output, as JSON."""
    import json
    import subprocess

    spec = [(j.fn.fn.__code__.co_filename, j.fn.fn.__module__, j.fn.fn.__name__, [str(a) if isinstance(a, torch.dtype) else a
                                                              for a in j.args], list(j.kwargs)) for j in jobs]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_vars)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], capture_output=True,
                          text=True, env=env, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def fresh_pool(monkeypatch):
    """The process's pool starts empty, and whatever a test starts is closed after it."""
    import dataclasses

    import torchfuse.runtime.config as rconfig
    import torchfuse.runtime.kernels as rk

    monkeypatch.setattr(cw, "_pool", None)
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, compile_workers=1,
                                                               compile_workers_min=1, compile_here=0))
    monkeypatch.setattr(rk, "triton_interpreting", lambda: False)
    yield
    if cw._pool is not None:
        cw._pool.close()


@P.compiles_for_sm90
def test_the_pool_makes_the_binaries_sequential_compiles_make_and_is_reused_across_programs(
        sm90, fresh_pool, monkeypatch):
    from torchfuse.runtime.kernels import precompile

    programs = _two_programs()
    seq_a, seq_b = _jobs(sm90 / "kernels", programs)
    expected = _sequential_cubins(seq_a + seq_b, sm90 / "triton_sequential")
    assert len(set(expected)) == len(seq_a) + len(seq_b)

    # through the pool, over a fresh cache: the workers compile, this process loads
    monkeypatch.setenv("TRITON_CACHE_DIR", str(sm90 / "triton_pool"))
    pool_a, pool_b = _jobs(sm90 / "kernels", programs)  # the same files: Triton's line info names them
    stats_a, stats_b = CompileStats(), CompileStats()
    with count_compiles(stats_a):
        precompile(pool_a, stats_a, threads=1)
    pool = cw._pool
    assert pool is not None and pool.started == 1
    pids = pool.pids()
    with count_compiles(stats_b):
        precompile(pool_b, stats_b, threads=1)
    assert cw._pool is pool and pool.started == 1 and pool.pids() == pids, \
        "the second Program reused the first one's worker"
    for stats, jobs in ((stats_a, pool_a), (stats_b, pool_b)):
        assert stats.worker_compiles == len(jobs)
        assert (stats.triton_compiles, stats.triton_cache_hits) == (0, len(jobs)), \
            "every binary came from the workers through the disk cache"
    assert _cubins(pool_a) + _cubins(pool_b) == expected, "the workers made the same binaries"

    # a warm start: new functions over the filled cache load here, and nothing goes to a worker
    warm = [job for jobs in _jobs(sm90 / "kernels", programs) for job in jobs]
    assert cw.plan(warm, lambda f: f.fn.__code__.co_filename) == [], "a binary on disk is not a worker's job"
    stats = CompileStats()
    with count_compiles(stats):
        precompile(warm, stats, threads=1)
    assert (stats.worker_compiles, stats.triton_compiles) == (0, 0)
    assert _cubins(warm) == expected
    assert stats.plans_skipped == 0 and not list((sm90 / "kernels").glob("*/compiled")), \
        "no device to name here: no marker"

    # With a device named, a start whose warm-ups all succeed leaves a marker, and the next
    # start over the same jobs skips the plan; a failed warm-up leaves none.
    import torchfuse.runtime.kernels as rk

    monkeypatch.setattr(rk, "device_key", lambda device: "cuda-sm90-test")
    planned = []
    real_plan = cw.plan
    monkeypatch.setattr(cw, "plan", lambda jobs, where: planned.append(len(jobs)) or real_plan(jobs, where))
    bad = _jobs(sm90 / "kernels", programs)[0]
    bad[0] = WarmupJob(bad[0].name, bad[0].fn, bad[0].args[:-1], bad[0].kwargs)  # an argument short
    for jobs, skipped, plans in ((bad, 0, 1), (bad, 0, 2), (warm, 0, 3), (warm, 1, 3)):
        stats = CompileStats()
        precompile(jobs, stats, threads=1)
        assert (stats.plans_skipped, len(planned)) == (skipped, plans)
    assert _cubins(warm) == expected
    (marker,) = (sm90 / "kernels").glob("*/compiled/*")
    listed = marker.read_text().split()
    assert len(listed) == len(warm) and all(p.endswith(".json") and os.path.exists(p) for p in listed)

    # Triton's cache emptied since: the marker no longer counts, and the plan runs again
    shutil.rmtree(sm90 / "triton_pool")
    stats = CompileStats()
    precompile([job for jobs in _jobs(sm90 / "kernels", programs) for job in jobs], stats, threads=1)
    assert (stats.plans_skipped, len(planned)) == (0, 4)


@P.compiles_for_sm90
def test_a_marker_left_after_tuning_lets_the_next_start_skip_its_plan(sm90, fresh_pool, monkeypatch):
    """After a tuning, the winners' warm-ups (compiled by then) leave the marker a warm start
    asks for, which no precompile of this process wrote (it warmed up other sets)."""
    import torchfuse.runtime.kernels as rk
    from torchfuse.runtime.kernels import precompile

    monkeypatch.setenv("TRITON_CACHE_DIR", str(sm90 / "triton_pool"))
    programs = _two_programs()
    first, second = _jobs(sm90 / "kernels", programs)
    precompile(first, CompileStats(), threads=1)  # compiled, in two sets: no marker for both
    precompile(second, CompileStats(), threads=1)
    monkeypatch.setattr(rk, "device_key", lambda device: "cuda-sm90-test")
    assert not list((sm90 / "kernels").glob("*/compiled/*"))
    rk.mark_warm(first + second)
    (marker,) = (sm90 / "kernels").glob("*/compiled/*")
    assert len(marker.read_text().split()) == len(first + second)

    planned = []
    real_plan = cw.plan
    monkeypatch.setattr(cw, "plan", lambda jobs, where: planned.append(len(jobs)) or real_plan(jobs, where))
    warm = [job for jobs in _jobs(sm90 / "kernels", programs) for job in jobs]  # a new process's
    stats = CompileStats()
    with count_compiles(stats):
        precompile(warm, stats, threads=1)
    assert stats.plans_skipped == 1 and planned == [] and stats.triton_compiles == 0
    assert _cubins(warm) == _cubins(first + second)

    # jobs that are not all compiled leave no marker
    bad = _jobs(sm90 / "kernels", programs)[0]
    bad[0] = WarmupJob(bad[0].name, bad[0].fn, bad[0].args[:-1], bad[0].kwargs)
    rk.mark_warm(bad)
    assert len(list((sm90 / "kernels").glob("*/compiled/*"))) == 1


def test_a_worker_that_dies_is_replaced_and_a_warning_says_what_was_compiled_here(tmp_path, caplog):
    dies = tmp_path / "dies.py"
    dies.write_text("import os\nos._exit(3)\n")
    target = {"backend": "cuda", "arch": 90, "warp_size": 32}
    pool = cw.WorkerPool(1)
    try:
        with caplog.at_level("WARNING", logger="torchfuse.runtime"):
            (result,) = pool.compile([cw.CompileRequest(str(dies), "dies", "k", "{}", target)])
        assert result.lost and not result.ok and "status 3" in result.error
        assert any("compile worker died" in r.getMessage() and "compiled in this process" in r.getMessage()
                   for r in caplog.records)
        missing = cw.CompileRequest(str(tmp_path / "missing.py"), "m", "k", "{}", target)
        (again,) = pool.compile([missing])
        assert not again.lost and "missing.py" in again.error, "a new worker answered the next request"
        assert pool.started == 2 and pool.lost == 1
    finally:
        pool.close()


def _stub_workers(monkeypatch, one, ready=None):
    """Workers without processes: each "starts" at once, is ready when ``ready`` (an Event) is
    set, and answers a request with ``one(request)``."""
    monkeypatch.setattr(cw.WorkerPool, "_start", lambda self: object())
    monkeypatch.setattr(cw.WorkerPool, "_await_ready",
                        lambda self, proc: ready.wait(timeout=10) if ready is not None else True)
    monkeypatch.setattr(cw.WorkerPool, "_one", lambda self, proc, request: one(request))


def test_a_first_calls_compiles_go_before_a_queued_background_warm_up(monkeypatch):
    import time

    order: list[str] = []
    gate = threading.Event()

    def one(request):
        order.append(request)
        if request == "bg1":
            assert gate.wait(timeout=10)
        return cw.CompileResult()

    _stub_workers(monkeypatch, one)
    pool = cw.WorkerPool(1)
    try:
        background = threading.Thread(target=pool.compile, args=(["bg1", "bg2", "bg3"], 1))
        background.start()
        while order != ["bg1"]:  # the one server is busy with the first background request
            time.sleep(0.01)
        results: list = []
        first_call = threading.Thread(target=lambda: results.extend(pool.compile(["fg1", "fg2"])))
        first_call.start()
        while len(pool._queue) < 4:
            time.sleep(0.01)
        gate.set()
        first_call.join(timeout=10)
        background.join(timeout=10)
        assert order == ["bg1", "fg1", "fg2", "bg2", "bg3"]
        assert [r.ok for r in results] == [True, True]
    finally:
        gate.set()
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.compile(["late"])


def test_a_request_no_worker_started_can_be_claimed_back(monkeypatch):
    served: list[str] = []
    ready = threading.Event()
    _stub_workers(monkeypatch, lambda r: served.append(r) or cw.CompileResult(), ready)
    pool = cw.WorkerPool(1)
    try:
        first, second = pool.submit(["first", "second"])
        assert pool.ready == 0 and pool.claim(first), "no worker is ready: the caller takes it"
        ready.set()
        assert second.result(timeout=10).ok
        assert not pool.claim(second), "a worker has it"
        assert pool.results([first, second])[0] is None
        assert served == ["second"], "a claimed request never reaches a worker"
    finally:
        ready.set()
        pool.close()


def test_workers_that_cannot_start_answer_every_request_as_lost(monkeypatch, caplog):
    monkeypatch.setattr(cw, "_BOOT", "import sys; sys.exit(5)")
    pool = cw.WorkerPool(2)
    try:
        with caplog.at_level("WARNING", logger="torchfuse.runtime"):
            results = pool.compile(["a", "b"])  # answered, whether queued before or after they died
        assert [(r.ok, r.lost) for r in results] == [(False, True), (False, True)]
        assert any("compiled in this process" in r.getMessage() for r in caplog.records)
        assert [(r.ok, r.lost) for r in pool.compile(["c"])] == [(False, True)]
    finally:
        pool.close()


_STILL_STARTING = _CHILD_JOBS + """
import threading
from torchfuse.runtime.kernels import count_compiles
ready = threading.Event()  # the workers' start is held back until the first call is done
real = cw.WorkerPool._await_ready
cw.WorkerPool._await_ready = lambda self, proc: ready.wait(timeout=60) and real(self, proc)
out = {}
for name in ("first", "again"):
    stats = CompileStats()
    with count_compiles(stats):
        precompile(jobs, stats, threads=2)
    out[name] = [stats.worker_compiles, stats.triton_compiles, stats.triton_cache_hits, cw._pool.ready]
ready.set()
print(json.dumps(out))
"""


@P.compiles_for_sm90
def test_a_first_call_compiles_here_what_workers_still_starting_have_not_taken(sm90):
    jobs = [job for jobs in _jobs(sm90 / "kernels", _two_programs()) for job in jobs]
    got = _run_child(_STILL_STARTING, jobs, TRITON_CACHE_DIR=str(sm90 / "triton_here"), TORCHFUSE_COMPILE_WORKERS="1",
                     TORCHFUSE_COMPILE_WORKERS_MIN="1", TORCHFUSE_COMPILE_HERE="2")
    assert got["first"] == [0, len(jobs), 0, 0], "no worker was ready: every compile ran here"
    assert got["again"] == [0, 0, 0, 0], "the next call finds them compiled, and queues nothing"


def test_a_warm_start_starts_no_workers(monkeypatch, tmp_path):
    from torchfuse.runtime import kernels as K

    graph, _ = trace(lambda a: torch.relu(a * 2.0 + 1.0).sum(dim=1), torch.randn(4, 8))
    program = compile_graph(graph, options={"cache": False, "cpu_backend": "triton"})
    (kernel,) = program.kernels
    K.load_kernel(kernel, tmp_path)
    assert K.any_new_source(program.kernels, tmp_path), "this process wrote its source"
    monkeypatch.setattr(K, "_new_sources", set())  # a second process over the same cache
    monkeypatch.setattr(K, "_shared", {})
    monkeypatch.setattr(K, "_modules", {})
    K.load_kernel(kernel, tmp_path)
    assert not K.any_new_source(program.kernels, tmp_path), "its source was on disk already"
    # and a first call whose binaries are all on disk plans nothing, so starts no pool
    monkeypatch.setattr(cw, "plan", lambda jobs, path: [])
    monkeypatch.setattr(cw, "get_pool", lambda n: pytest.fail("a pool was started"))
    assert cw.hand_out([WarmupJob("k", object(), (), ())], 4, K._source_path, K.compile_cost) is None
