"""Kernel loading, parallel precompilation and compile counting (Triton itself stubbed where a GPU is needed)."""

from __future__ import annotations

import threading

import pytest
import runtime_programs as P
import torch
from test_codegen import middle_program
from torchfuse.runtime import load
from torchfuse.runtime.kernels import CompileStats, WarmupJob, count_compiles, precompile


class FakeJit:
    """Records warm-up calls; ``arg_names`` as a Triton function has them."""

    def __init__(self, arg_names):
        self.arg_names = arg_names
        self.calls = []
        self.threads = set()

    def warmup(self, *args, grid, **kwargs):
        self.calls.append((args, grid, kwargs))
        self.threads.add(threading.get_ident())


def test_precompile_passes_arguments_in_parameter_order():
    fn = load(middle_program())
    fake = FakeJit(["x_ptr", "BLOCK", "out_ptr", "alpha", "n", "SCALE"])
    fn.kernels["axpy"] = fake
    fn._precompile({"s0": 40}, {"axpy": list(fn.program.kernels[0].configs)})
    # pointers as dtypes (Triton mocks them as aligned pointers), BLOCK in its place,
    # the defaulted SCALE left out
    assert fake.calls == [((torch.float32, 16, torch.float32, 1.5, 40), (1,), {"num_warps": 1, "num_stages": 1})]
    fn._precompile({"s0": 40}, {"axpy": list(fn.program.kernels[0].configs)})
    assert len(fake.calls) == 1  # already warmed: nothing new
    fn._precompile({"s0": 41}, {"axpy": list(fn.program.kernels[0].configs)})
    assert len(fake.calls) == 2
    assert fn.stats.warmups == 2


def test_precompile_runs_kernels_concurrently_but_one_function_serially():
    fakes = [FakeJit(["a"]) for _ in range(4)]
    jobs = [WarmupJob(f"k{i}", f, (j,), ()) for i, f in enumerate(fakes) for j in range(3)]
    stats = CompileStats()
    precompile(jobs, stats, threads=4)
    assert stats.warmups == 12
    for f in fakes:
        assert [c[0] for c in f.calls] == [(0,), (1,), (2,)]  # in order, in one thread
        assert len(f.threads) == 1


def test_failed_warmups_are_left_to_the_first_launch():
    class Broken(FakeJit):
        def warmup(self, *args, grid, **kwargs):
            raise RuntimeError("no GPU here")

    stats = CompileStats()
    precompile([WarmupJob("k", Broken(["a"]), (1,), ())], stats)
    assert stats.warmups == 1


def test_a_quiet_precompile_draws_no_progress_line(monkeypatch):
    """Compiles after a first call ended (a deferred tuning's candidates) must not draw a
    progress line that no first call will clear."""
    import torchfuse.runtime.kernels as K

    drawn = []
    monkeypatch.setattr(K.progress, "kernels", lambda done, total: drawn.append((done, total)))
    jobs = [WarmupJob(f"k{i}", FakeJit(["a"]), (i,), ()) for i in range(3)]
    precompile(jobs, CompileStats(), quiet=True)
    assert drawn == []
    precompile(jobs, CompileStats())
    assert sorted(drawn)[-1] == (3, 3)


def test_count_compiles_chains_to_an_installed_listener():
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        pytest.skip("this Triton has no compilation listener")
    seen = []
    previous = knobs.compilation.listener
    knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
    try:
        stats = CompileStats()
        with count_compiles(stats):
            knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
            knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
        assert (stats.triton_cache_hits, stats.triton_compiles) == (1, 1)
        assert seen == [True, False]
        assert knobs.compilation.listener is not None and knobs.compilation.listener.__name__ == "<lambda>"
    finally:
        knobs.compilation.listener = previous


def test_same_source_in_two_programs_shares_one_module():
    a = load(P.mixed_program("cpu"))
    b = load(P.chain_program(2, device="cpu"))
    assert a.kernels["add_kernel"] is b.kernels["add_kernel"]
