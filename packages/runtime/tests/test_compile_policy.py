"""What a first call compiles: small launches are not tuned, and warm-ups run in parallel."""

from __future__ import annotations

import dataclasses
import textwrap
import threading
from concurrent.futures import Future

import pytest
import runtime_programs as P
import torch
import torchfuse.runtime.autotune as autotune
import torchfuse.runtime.config as rconfig
import torchfuse.runtime.kernels as kernels
from torchfuse.graph import schema as S
from torchfuse.runtime.checks import buffer_table

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")



def _min_bytes(monkeypatch, n: int) -> None:
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, autotune_min_bytes=n,
                                                                autotune_default_max=0, autotune_later=False))



def test_small_launch_takes_the_cheapest_config_untuned(bench, cache_dir, monkeypatch):
    _min_bytes(monkeypatch, 1 << 22)
    fn = P.tuned(P.scale_program("cpu"))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [], "a launch moving 800 bytes is not worth benchmarking"
    assert fn.stats.autotune_skipped == 1 and fn.stats.autotuned == 0
    # 32 and 128 elements over 1 and 4 warps tie at 32 per warp: the producer's first wins
    assert "XBLOCK=32" in fn.source and "num_warps=1" in fn.source
    assert not (cache_dir / "autotune").exists(), "nothing measured, nothing stored"


def test_launch_over_the_threshold_is_tuned(bench, monkeypatch):
    _min_bytes(monkeypatch, 800)  # exactly what x (400 bytes) and buf0 (400 bytes) move
    fn = P.tuned(P.scale_program("cpu"))
    x = torch.randn(100)
    (out,) = fn(x)
    torch.testing.assert_close(out, x * 0.5)
    assert bench == [32, 128, 1024] and fn.stats.autotuned == 1
    (small,) = P.tuned(P.scale_program("cpu"))(torch.randn(99))  # 792 bytes: under it
    torch.testing.assert_close(small.shape, torch.Size([99]))
    assert bench == [32, 128, 1024]


def test_launch_bytes_counts_every_pointer_argument():
    prog = P.scale_program("cpu")
    (kernel,) = prog.kernels
    assert autotune.launch_bytes(prog, kernel, {"s0": 100}, buffer_table(prog)) == 800
    assert autotune.launch_bytes(prog, kernel, {}, buffer_table(prog)) is None  # unknown size


def test_launch_bytes_of_a_shared_kernel_is_its_largest_launch():
    # a kernel launched once per layer is judged launch by launch: four 800-byte launches are
    # as latency-bound as one (the sum, 3200, would cross a threshold none of them does)
    import msgspec
    from torchfuse.graph import schema as S

    prog = P.scale_program("cpu")
    (kernel,) = prog.kernels
    (launch,) = [st for st in prog.steps if isinstance(st, S.LaunchStep)]
    prog = msgspec.structs.replace(prog, steps=prog.steps + (launch,) * 3)
    assert autotune.launch_bytes(prog, kernel, {"s0": 100}, buffer_table(prog)) == 800


def test_cheapest_to_compile_is_least_work_per_thread():
    c = S.LaunchConfig
    assert autotune.cheapest_to_compile(
        [c(meta={"XBLOCK": 1024}, num_warps=4), c(meta={"XBLOCK": 512}, num_warps=4),
         c(meta={"XBLOCK": 2048}, num_warps=8)]).meta == {"XBLOCK": 512}
    assert autotune.cheapest_to_compile(
        [c(meta={"XBLOCK": 8}, num_warps=4), c(meta={"XBLOCK": 1}, num_warps=4),
         c(meta={"XBLOCK": 1}, num_warps=8)]) == c(meta={"XBLOCK": 1}, num_warps=8)
    two_d = [c(meta={"XBLOCK": 64, "RBLOCK": 64}, num_warps=8), c(meta={"XBLOCK": 64, "RBLOCK": 16}, num_warps=4)]
    assert autotune.cheapest_to_compile(two_d) == two_d[1]


class FakeFn:
    """Stands in for a JITFunction: records which thread warmed which job."""

    def __init__(self, name: str, log: list, gate: threading.Barrier | None = None) -> None:
        self.name, self.log, self.gate = name, log, gate

    def warmup(self, *args, grid, **kwargs):
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.wait(timeout=10)  # every compile must be running at once to pass
        self.log.append((self.name, args))


def test_configs_of_one_kernel_compile_at_the_same_time(monkeypatch):
    log: list = []
    gate = threading.Barrier(3)
    fn = FakeFn("main", log, gate)
    clones = iter([FakeFn("clone1", log, gate), FakeFn("clone2", log, gate)])
    monkeypatch.setattr(kernels, "_clone", lambda f: next(clones))
    jobs = [kernels.WarmupJob("k", fn, (i,), ()) for i in range(3)]
    stats = kernels.CompileStats()
    kernels.precompile(jobs, stats, threads=4)
    first = log[:3]
    assert sorted(name for name, _ in first) == ["clone1", "clone2", "main"]
    # then the kernel itself loads what its clones compiled
    assert log[3:] == [("main", (1,)), ("main", (2,))]
    assert stats.warmups == 3


def test_uncloneable_kernel_compiles_its_configs_in_one_thread(monkeypatch):
    log: list = []
    fn = FakeFn("main", log)
    monkeypatch.setattr(kernels, "_clone", lambda f: None)
    kernels.precompile([kernels.WarmupJob("k", fn, (i,), ()) for i in range(3)], kernels.CompileStats(), threads=4)
    assert log == [("main", (0,)), ("main", (1,)), ("main", (2,))]


def test_a_clone_has_the_triton_cache_key_of_its_original(tmp_path):
    import importlib.util

    import triton.runtime.jit as tjit
    from triton.compiler import ASTSource

    path = tmp_path / "kclone.py"
    path.write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        def add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.sin(tl.load(x_ptr + i, i < n)), i < n)
    """))
    spec = importlib.util.spec_from_file_location("kclone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    original = tjit.JITFunction(mod.add)  # compiled, not interpreted, whatever TRITON_INTERPRET says
    clone = kernels._clone(original)
    assert clone is not None and clone is not original
    assert clone.cache_key == original.cache_key
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    assert (ASTSource(clone, sig, {"BLOCK": 64}).hash() == ASTSource(original, sig, {"BLOCK": 64}).hash())
    registry = getattr(tjit, "_triton_jit_function_registry", {})
    assert all(v is not clone for v in registry.values()), "the registry keeps the original"


def _capture_warmups(monkeypatch) -> list:
    import torchfuse.runtime.program as program_module

    seen: list = []
    monkeypatch.setattr(program_module, "precompile", lambda jobs, stats, threads=None, background=False,
                        quiet=False: seen.extend(jobs))
    return seen


def test_background_warm_up_compiles_what_the_first_call_needs(monkeypatch):
    seen = _capture_warmups(monkeypatch)
    _min_bytes(monkeypatch, 0)
    fn = P.tuned(P.scale_program("cpu"))
    assert fn.precompile_async() is None, "nothing to do on the CPU"
    fn._gpu = True  # what a CUDA program does; the jobs are only recorded here
    fn.precompile_async().result(timeout=60)
    # all three candidates (to be tuned), at the hinted size s0=100
    assert sorted(job.args[-1] for job in seen) == [32, 128, 1024]
    assert all(job.args[3] == 100 for job in seen)
    before = len(seen)
    fn._precompile({"s0": 100}, fn._to_warm(fn._default_configs(), {}, ["scale"]))
    assert len(seen) == before, "the first call finds them compiled"


def test_background_warm_up_of_a_small_launch_compiles_one_config(monkeypatch):
    seen = _capture_warmups(monkeypatch)
    _min_bytes(monkeypatch, 1 << 22)
    fn = P.tuned(P.scale_program("cpu"))
    fn._gpu = True
    fn.precompile_async().result(timeout=60)
    assert [job.args[-1] for job in seen] == [32]
    assert fn.stats.autotune_skipped == 0, "counted by the call, not the warm-up"


class FakeCompiled:
    """Stands in for a CompiledKernel: records when its handles (and launcher) are made."""

    def __init__(self, name: str, types: tuple[str, ...], log: list, fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail
        self.src = type("Src", (), {"signature": {f"a{i}": t for i, t in enumerate(types)}})()

    def _init_handles(self):
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError("no device")


def test_launchers_are_bound_once_per_kernel_one_per_signature_first():
    log: list = []
    a1 = FakeCompiled("a1", ("*fp32", "i32"), log)
    a2 = FakeCompiled("a2", ("*fp32", "i32"), log)  # other names, same types: one launcher
    b1 = FakeCompiled("b1", ("*bf16", "constexpr"), log)
    bad = FakeCompiled("bad", ("*i8",), log, fail=True)  # left to its first launch, no error here
    kernels.bind_launchers([a1, a2, b1, a1, bad], threads=4)
    assert sorted(log) == ["a1", "a2", "b1", "bad"]  # each once, duplicates dropped
    assert set(log[:3]) == {"a1", "b1", "bad"} and log[3] == "a2"  # the shared one after its first


def test_precompile_binds_the_kernels_it_will_launch_not_the_clones(monkeypatch):
    log: list = []
    bound: list = []

    class Returning(FakeFn):
        def warmup(self, *args, grid, **kwargs):
            super().warmup(*args, grid=grid, **kwargs)
            return FakeCompiled(f"{self.name}{args}", ("*fp32",), bound)

    fn = Returning("main", log)
    clones = iter([Returning("clone", log)])
    monkeypatch.setattr(kernels, "_clone", lambda f: next(clones))
    kernels.precompile([kernels.WarmupJob("k", fn, (i,), ()) for i in range(2)], kernels.CompileStats(), threads=4)
    assert sorted(bound) == ["main(0,)", "main(1,)"]


def test_worker_compiles_are_handed_out_longest_first(monkeypatch):
    from torchfuse.runtime import compile_workers

    def job(name: str, source: str, block: int, warps: int) -> kernels.WarmupJob:
        fn = type("Fn", (), {"src": source, "arg_names": ["x", "XBLOCK"]})()
        return kernels.WarmupJob(name, fn, ("ptr", block), (("num_warps", warps),))

    small, wide, long = job("small", "x" * 500, 128, 4), job("wide", "x" * 500, 8192, 4), job("long", "x" * 9000, 128, 4)
    sent: list = []

    class Pool:
        def submit(self, requests, priority=0):
            sent.extend(requests)
            return [Future() for _ in requests]

    monkeypatch.setattr(compile_workers, "get_pool", lambda n: Pool())
    monkeypatch.setattr(compile_workers, "plan", lambda jobs, path: [(j, j.name) for j in jobs])
    compile_workers.hand_out([small, wide, long], 2, kernels._source_path, kernels.compile_cost)
    assert sent == ["wide", "long", "small"]
    assert kernels.compile_cost(wide) > kernels.compile_cost(small)
