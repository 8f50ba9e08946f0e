"""Autotuning logic, exercised on the CPU with a stand-in benchmark (the real one needs a GPU)."""

from __future__ import annotations

import json

import msgspec
import pytest
import runtime_programs as P
import torch
import torchfuse.runtime.autotune as autotune
from torchfuse.graph import schema as S

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


@pytest.fixture(autouse=True)
def tune_small_launches(monkeypatch):
    """These programs are tiny; tune them anyway (the default skips launches under 16 MiB)."""
    import dataclasses

    import torchfuse.runtime.config as rconfig

    # and every candidate (mode="default" tunes the first two: test_default_mode_tunes_little),
    # before the first call returns (tuning after it: test_autotune_later.py)
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, autotune_min_bytes=0,
                                                                autotune_default_max=0, autotune_later=False))




def test_tuning_picks_the_fastest_and_persists_it(bench, cache_dir):
    fn = P.tuned(P.scale_program("cpu"))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128, 1024]
    assert fn.stats.autotuned == 1
    assert "(s0 + 127)//128" in fn.source and "XBLOCK=128" in fn.source
    (stored,) = (cache_dir / "autotune").iterdir()
    entries = json.loads(stored.read_text())
    ((key, cfg),) = entries.items()
    assert key.endswith("|s0<=128") and cfg["meta"] == {"XBLOCK": 128}  # s0 = 100, bucketed
    (again,) = fn(x)  # the generated function now runs without tuning
    torch.testing.assert_close(again, x * 0.5)
    assert bench == [32, 128, 1024]

    fresh = P.tuned(P.scale_program("cpu"))  # a new load (as a new process would) benchmarks nothing
    (out,) = fresh(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128, 1024]
    assert fresh.stats.autotune_cache_hits == 1 and fresh.stats.autotuned == 0
    # where the first calls spent their time is recorded, phase by phase
    for stats in (fn.stats, fresh.stats):
        assert set(stats.first_call) == {"wait", "choose", "precompile", "tune", "generate", "run"}
        assert all(v >= 0 for v in stats.first_call.values())
    assert fn.stats.first_call["tune"] > 0


def test_new_symbol_values_are_tuned_once_each(bench):
    fn = P.tuned(P.scale_program("cpu"))
    a, b = torch.randn(100), torch.randn(37)
    for x in (a, b, a, b):
        (out,) = fn(x)
        torch.testing.assert_close(out, x * 0.5)
    assert len(bench) == 6  # two keys, three candidates each
    # both keys chose the same configs, so one generated function serves them (plus the
    # two tuning runs)
    assert fn.stats.generated == 3


def test_winner_that_is_no_longer_a_candidate_is_ignored(bench, cache_dir):
    fn = P.tuned(P.scale_program("cpu"))
    fn(torch.randn(100))
    other = P.scale_program("cpu", configs=(S.LaunchConfig(meta={"XBLOCK": 64}), S.LaunchConfig(meta={"XBLOCK": 128})))
    # same kernel source, other candidates: the stored winner (128) is still one of them
    fresh = P.tuned(other)
    fresh(torch.randn(100))
    assert fresh.stats.autotune_cache_hits == 1
    only_small = P.scale_program("cpu", configs=(S.LaunchConfig(meta={"XBLOCK": 16}),
                                                 S.LaunchConfig(meta={"XBLOCK": 32})))
    third = P.tuned(only_small)
    third(torch.randn(100))
    assert third.stats.autotune_cache_hits == 0 and third.stats.autotuned == 1


def test_in_place_kernels_are_restored_between_candidates(bench):
    t = S.TensorRef
    base = P.scale_program("cpu")
    prog = msgspec.structs.replace(
        base,
        steps=(S.ExternStep(op="aten.clone.default", args=(t(name="x"),), outputs=("buf0",)),
               S.LaunchStep(kernel="scale", args=(t(name="buf0"), t(name="buf0"), S.Float(value=0.5),
                                                  S.SymRef(expr="s0")))),
    )
    fn = P.tuned(prog)
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)  # not x * 0.5**4
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)


def test_tuning_a_kernel_with_a_constexpr_between_its_parameters(monkeypatch):
    from test_codegen import middle_program

    seen = []

    def fake(kernel, cfg, launch):
        launch()
        seen.append(cfg.meta["BLOCK"])
        return float(cfg.meta["BLOCK"])  # the smallest block wins

    monkeypatch.setattr(autotune, "benchmark", fake)
    prog = middle_program()
    kernel = msgspec.structs.replace(prog.kernels[0], configs=(S.LaunchConfig(meta={"BLOCK": 32}),
                                                               S.LaunchConfig(meta={"BLOCK": 8})))
    fn = P.tuned(msgspec.structs.replace(prog, kernels=(kernel,)))
    x = torch.randn(50)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 3.0)
    assert seen == [32, 8]
    assert "(s0 + 7)//8" in fn.source


def test_tuning_keys_bucket_sizes_by_powers_of_two():
    from torchfuse.runtime.autotune import size_bucket, tuning_key

    assert [size_bucket(n) for n in (1, 2, 3, 500, 512, 513)] == [1, 2, 4, 512, 512, 1024]
    k = lambda n: tuning_key("h", ["s0"], {"s0": n})
    assert k(500) == k(512) != k(513)


def _same_warps_xnumel_program():
    """scale_program with its extent named as inductor names it and one warp count for all."""
    import re

    configs = tuple(S.LaunchConfig(meta={"XBLOCK": b}, num_warps=4) for b in (32, 128, 1024))
    prog = P.scale_program("cpu", configs=configs)
    (kernel,) = prog.kernels
    kernel = msgspec.structs.replace(
        kernel, source=re.sub(r"\bn\b", "xnumel", kernel.source),
        signature=tuple(msgspec.structs.replace(p, name="xnumel") if p.name == "n" else p for p in kernel.signature))
    return msgspec.structs.replace(prog, kernels=(kernel,))


def test_candidates_equal_at_these_sizes_are_pruned_before_compiling(bench):
    prog = _same_warps_xnumel_program()
    (kernel,) = prog.kernels
    blocks = lambda env, limit=0: [c.meta["XBLOCK"] for c in autotune.prune_candidates(prog, kernel, env, limit)]
    assert blocks({"s0": 100}) == [32, 128]          # 1024 and 128 both cover 100 in one program
    assert blocks({"s0": 20}) == [32]                # all three do: one candidate, nothing to tune
    assert blocks({"s0": 5000}) == [32, 128, 1024]   # all differ
    assert blocks({"s0": 5000}, limit=2) == [32, 128]
    fn = P.tuned(prog)
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128]  # 1024 was never compiled nor benchmarked
    fn2 = P.tuned(prog)
    x = torch.randn(20)
    (out,) = fn2(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128] and fn2.stats.autotuned == 0  # one candidate left: no tuning


@pytest.mark.parametrize("mode", ["default", "max-autotune"])
def test_default_mode_tunes_little_max_autotune_everything(bench, monkeypatch, mode):
    import dataclasses

    import torchfuse.runtime.config as rconfig

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, autotune_default_max=2))
    prog = P.scale_program("cpu")
    prog = msgspec.structs.replace(prog, meta={**prog.meta, "mode": mode})
    fn = P.tuned(prog)
    x = torch.randn(5000)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == ([32, 128] if mode == "default" else [32, 128, 1024])


def test_a_tuning_run_writes_its_winners_in_one_rewrite(bench, cache_dir, monkeypatch):
    """Two kernels tuned in one run: one read and one write of the autotune file, both stored."""
    t = S.TensorRef
    base = P.scale_program("cpu")
    (scale,) = base.kernels
    # another kernel (another hash, so its own autotune key) of the same code
    other = msgspec.structs.replace(scale, name="scale_again", entry=scale.entry or "scale",
                                    source=scale.source + "\n# another kernel\n")
    prog = msgspec.structs.replace(
        base,
        outputs=(t(name="buf1"),),
        buffers=(*base.buffers, msgspec.structs.replace(base.buffers[1], name="buf1")),
        kernels=(scale, other),
        steps=(*base.steps, S.AllocStep(buffer="buf1"),
               S.LaunchStep(kernel="scale_again",
                            args=(t(name="buf0"), t(name="buf1"), S.Float(value=0.5), S.SymRef(expr="s0")))),
    )
    writes = []
    real = autotune.write_atomic
    monkeypatch.setattr(autotune, "write_atomic", lambda path, data: writes.append(path) or real(path, data))
    fn = P.tuned(prog)
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.25)
    assert fn.stats.autotuned == 2 and len(writes) == 1
    (stored,) = (cache_dir / "autotune").iterdir()
    assert len(json.loads(stored.read_text())) == 2
