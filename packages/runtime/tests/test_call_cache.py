"""Generated call functions kept between processes (`torchfuse.runtime.call_cache`)."""

from __future__ import annotations

import pytest
import runtime_programs as P
import torch
import torchfuse.runtime.call_cache as cc
import torchfuse.runtime.codegen as codegen
from torchfuse.runtime import load
from torchfuse.runtime.kernels import load_kernel

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


def _inputs():
    torch.manual_seed(0)
    return torch.randn(6, 5), torch.randn(6, 5), torch.randn(5, 8)


def test_a_second_load_reads_the_call_function_instead_of_generating_it(cache_dir, monkeypatch):
    first = load(P.mixed_program("cpu"))
    want = first(*_inputs())
    kept = list((cache_dir / "calls").glob("*.json"))
    assert len(kept) == 1, "the call function was kept"

    hits = cc.stats["hits"]
    monkeypatch.setattr(codegen, "generate", lambda *a, **k: pytest.fail("generated again"))
    second = load(P.mixed_program("cpu"))  # as a new process would: a new CompiledProgram
    got = second(*_inputs())
    assert cc.stats["hits"] == hits + 1
    assert second.source == first.source
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def test_a_program_read_back_from_a_cache_finds_the_call_function_its_compiling_process_kept(
        cache_dir, monkeypatch):
    """The process that compiles a Program holds its dicts in the order they were built; a
    later process reads it back from the program cache with sorted keys. The call function
    kept by the first must be found by the second (its key was the Program's insertion-ordered
    bytes, so a warm start never hit)."""
    import msgspec
    from torchfuse.graph import schema as S

    program = P.mixed_program("cpu")
    kernels = [msgspec.structs.replace(k, constexprs=dict(reversed(sorted(k.constexprs.items()))),
                                   meta={"z": "1", "a": "2"}) for k in program.kernels]
    built = msgspec.structs.replace(program, kernels=tuple(kernels))
    read_back = msgspec.json.decode(msgspec.json.encode(built, order="sorted"), type=S.Program)
    assert msgspec.msgpack.encode(read_back) != msgspec.msgpack.encode(built)  # the orders differ
    want = load(built)(*_inputs())
    hits = cc.stats["hits"]
    monkeypatch.setattr(codegen, "generate", lambda *a, **k: pytest.fail("generated again"))
    got = load(read_back)(*_inputs())
    assert cc.stats["hits"] == hits + 1
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)


def test_the_recipe_gives_back_every_global_of_a_gpu_call_function():
    """The GPU source with its fast path, an extern op, dtypes and the device helpers; generated
    on the CPU (the kernels are interpreted functions, named all the same)."""
    program = P.mixed_program("cuda")
    kernels = {k.name: load_kernel(k) for k in program.kernels}
    configs = {k.name: (k.configs[0] if k.configs else None) for k in program.kernels}
    gen = codegen.generate(program, device_type="cuda", kernels=kernels, configs=configs, fast=True,
                           layout="args")
    recipe = cc.recipe_of(gen, kernels)
    assert recipe is not None and {kind for kind, _ in recipe.values()} >= {"op", "dtype", "kernel", "helper"}
    rebuilt = cc.rebuild(recipe, kernels)
    assert rebuilt.keys() == gen.globals.keys()
    assert all(rebuilt[k] is v or (isinstance(v, torch.device) and rebuilt[k] == v)
               for k, v in gen.globals.items())


def test_a_call_function_with_a_global_it_cannot_describe_is_not_kept(tmp_path):
    program = P.mixed_program("cpu")
    kernels = {k.name: load_kernel(k) for k in program.kernels}
    configs = {k.name: (k.configs[0] if k.configs else None) for k in program.kernels}
    gen = codegen.generate(program, device_type="cpu", kernels=kernels, configs=configs)
    gen.globals["_odd"] = object()
    assert not cc.store(tmp_path, "k", gen, kernels)
    assert not (tmp_path / "k.json").exists()
    del gen.globals["_odd"]
    assert cc.store(tmp_path, "k", gen, kernels)
    again = cc.load(tmp_path, "k", kernels)
    assert again is not None and again.source == gen.source


def test_an_unreadable_entry_is_generated_again(cache_dir):
    load(P.mixed_program("cpu"))(*_inputs())
    (kept,) = (cache_dir / "calls").glob("*.json")
    kept.write_text('{"source": "def call(*args):\\n    pass\\n", "recipe": {"_x": ["nothing", "?"]}}')
    fresh = load(P.mixed_program("cpu"))
    got = fresh(*_inputs())  # generated again, and right
    torch.testing.assert_close(got[0], (lambda x, y: (x + y).sum(dim=1))(*_inputs()[:2]))
    assert "nothing" not in kept.read_text(), "written over"


def test_the_key_changes_with_what_generate_reads():
    base = dict(device="cuda", fast=True, layout="args", tune=[], tuned_for=None, configs={"k": None})
    key = cc.call_key("p", **base)
    assert key == cc.call_key("p", **base)
    for change in ({"fast": False}, {"layout": "tuple"}, {"tune": ["k"]}, {"tuned_for": ["s0"]},
                   {"configs": {"k": {"meta": {"XBLOCK": 64}}}}, {"device": "cpu"}):
        assert cc.call_key("p", **{**base, **change}) != key, change
    assert cc.call_key("q", **base) != key
