"""Tuning after the first call (``Config.autotune_later``), on the CPU with a stand-in benchmark.

On the CPU no candidate needs compiling, so the call after the first tunes; on the GPU it is
the first call after the background compiles end (test_gpu.py)."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import runtime_programs as P
import torch
import torchfuse.runtime.config as rconfig
from torchfuse.runtime import load
from torchfuse.runtime.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


@pytest.fixture(autouse=True)
def later(monkeypatch):
    # the test programs are tiny: tune them anyway, every candidate, after the first call
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(
        rconfig.config, autotune_min_bytes=0, autotune_default_max=0, autotune_later=True))




def test_first_call_runs_the_cheapest_candidate_and_the_next_call_tunes(bench, cache_dir):
    fn = P.tuned(P.scale_program("cpu"))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [] and fn.stats.autotuned == 0 and fn.stats.tuned_later == 0
    assert "XBLOCK=32" in fn.source and "_TUNED_FOR" not in fn.source  # cheapest to compile, no size check
    assert set(fn.stats.first_call) == {"wait", "choose", "precompile", "generate", "run"}
    assert not (cache_dir / "autotune").exists()

    y = torch.randn(100)
    (out,) = fn(y)  # tunes, on this call's buffers, and switches to the winner
    torch.testing.assert_close(out, y * 0.5)
    assert bench == [32, 128, 1024]
    assert fn.stats.autotuned == 1 and fn.stats.tuned_later == 1
    assert "XBLOCK=128" in fn.source
    assert fn.stats.later["tune"] > 0 and "tune" not in fn.stats.first_call
    assert len(list((cache_dir / "autotune").iterdir())) == 1  # kept on disk as ever

    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128, 1024]  # tuned once

    fresh = P.tuned(P.scale_program("cpu"))  # a new process starts tuned: nothing deferred
    (out,) = fresh(x)
    torch.testing.assert_close(out, x * 0.5)
    assert fresh.stats.autotune_cache_hits == 1 and "XBLOCK=128" in fresh.source
    assert bench == [32, 128, 1024] and fresh.stats.tuned_later == 0


def test_sizes_met_after_the_first_call_tune_at_once(bench):
    fn = P.tuned(P.scale_program("cpu"))
    a, b = torch.randn(100), torch.randn(37)
    fn(a)
    fn(a)
    assert len(bench) == 3
    (out,) = fn(b)  # a new size for a tuned Program: tuned before this call returns
    torch.testing.assert_close(out, b * 0.5)
    assert len(bench) == 6 and fn.stats.tuned_later == 1


def test_the_tuning_call_tunes_its_own_sizes(bench):
    fn = P.tuned(P.scale_program("cpu"))
    a, b = torch.randn(100), torch.randn(3000)
    fn(a)
    (out,) = fn(b)  # the deferred tuning happens here, for b's sizes
    torch.testing.assert_close(out, b * 0.5)
    assert len(bench) == 3 and fn.stats.tuned_later == 1
    (out,) = fn(a)  # a's sizes were never tuned: now they are, at once
    torch.testing.assert_close(out, a * 0.5)
    assert len(bench) == 6


def test_max_autotune_tunes_before_the_first_call_returns(bench):
    prog = P.scale_program("cpu")
    fn = P.tuned(msgspec.structs.replace(prog, meta={**prog.meta, "mode": "max-autotune"}))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128, 1024] and fn.stats.tuned_later == 0


def test_bad_inputs_still_fail_on_the_first_call_and_during_the_wait(bench):
    fn = P.tuned(P.scale_program("cpu"))
    with pytest.raises(InputError):
        fn(torch.randn(4, 4))
    fn(torch.randn(100))
    with pytest.raises(InputError):  # the provisional function checks its inputs too
        fn(torch.randn(100, dtype=torch.float64))
    assert bench == []


def test_the_switch_is_read_from_the_environment():
    assert rconfig.from_environment({}).autotune_later is True
    assert rconfig.from_environment({"TORCHFUSE_AUTOTUNE_LATER": "0"}).autotune_later is False


def test_deferred_compiles_are_dropped_once_the_interpreter_exits(monkeypatch):
    import torchfuse.runtime.background as background

    fn = P.tuned(P.scale_program("cpu"))
    monkeypatch.setattr(fn, "_precompile", lambda *a, **k: pytest.fail("compiled while exiting"))
    monkeypatch.setattr(background, "_exiting", True)
    fn._compile_later({"s0": 100}, {"scale": []}, 0)  # returns before touching the device
    assert "background" not in fn.stats.later


def test_the_exit_flag_is_set_before_the_background_thread_is_joined():
    """What a queued deferred compile sees when the script ends: the flag, so it skips."""
    import subprocess
    import sys

    child = (
        "import time\n"
        "import torchfuse.runtime.background as p\n"
        "def job():\n"
        "    time.sleep(0.5)\n"
        "    print('exiting', p._exiting, flush=True)\n"
        "p.submit(job)\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "exiting True" in out.stdout


def test_the_deferred_tuning_is_filed_with_its_entry(bench):
    from torchfuse.graph import observe

    with observe.collect(artifacts=False):
        with observe.compiling("g/entry_0"):
            fn = P.tuned(P.scale_program("cpu"))
        x = torch.randn(100)
        fn(x)
        first, _ = observe.timings_of("g/entry_0")
        assert "runtime.precompile" in first and not any(k.startswith("runtime.later") for k in first)
        fn(x)
        stages, counts = observe.timings_of("g/entry_0")
    assert counts["runtime.tuned_later"] == 1
    assert stages["runtime.later.tune"] == fn.stats.later["tune"] > 0
    assert {"runtime.later.choose", "runtime.later.precompile", "runtime.later.generate"} <= set(stages)


def test_a_warm_up_set_naming_some_kernels_warms_up_only_those():
    """The background compile of deferred candidates names only the kernels still to tune:
    the others (compiled by the first call) must not be warmed up again, nor with no config."""
    prog = P.mixed_program("cpu")
    fn = load(prog)
    first = prog.kernels[0]
    assert len(prog.kernels) > 1
    env = {s.name: 8 for s in prog.symbols}
    jobs = fn._warmup_jobs(env, {first.name: [first.configs[0] if first.configs else None]})
    assert jobs and {job.name for job in jobs} == {first.name}
    assert fn._warmup_jobs(env, {}) == []
