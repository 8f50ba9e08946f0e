"""The on-disk caches of compiled Programs and autograd plans (torchfuse.inductor.cache)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torchfuse.graph import trace
from torchfuse.graph.archive import to_json
from torchfuse.inductor import cache, compile_graph
from torchfuse.inductor import compile as compile_module


def _f(x, y):
    return torch.relu(x * y + 1.0).sum(dim=1)


def _g(x, y):
    return torch.sigmoid(x * y + 1.0).sum(dim=1)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(4, 8)


def _untimed(program):
    """A Program without its pass timings (the only part of a recompile that differs)."""
    import msgspec

    meta = {k: v for k, v in program.meta.items() if not k.startswith("timings")}
    return msgspec.structs.replace(program, meta=meta)


def test_hit_skips_the_passes_and_returns_the_same_program(counted_lowering):
    graph, _ = trace(_f, *_inputs())
    first = compile_graph(graph)
    assert len(counted_lowering) == 1
    assert (cache.stats.program_misses, cache.stats.program_stores) == (1, 1)
    again = compile_graph(graph)
    assert len(counted_lowering) == 1, "a cache hit must not lower again"
    assert cache.stats.program_hits == 1
    assert to_json(again) == to_json(first)
    from torchfuse.runtime import load

    x, y = _inputs()
    torch.testing.assert_close(load(again, device="cpu")(x, y)[0], _f(x, y))


def test_on_miss_is_called_when_the_passes_run_and_only_then(counted_lowering):
    """The ``inductor`` backend starts the compile workers on a miss (a GPU graph about to get
    kernels to compile): the hook runs once per compile, before the passes, never on a hit."""
    graph, _ = trace(_f, *_inputs())
    calls = []

    def on_miss():
        calls.append(len(counted_lowering))  # how many lowerings had run when it ran

    compile_graph(graph, on_miss=on_miss)
    assert calls == [0]
    compile_graph(graph, on_miss=on_miss)  # a hit
    assert calls == [0]
    compile_graph(graph, options={"cache": False}, on_miss=on_miss)  # no cache: compiled again
    assert calls == [0, 1]


def test_changed_graph_or_options_miss(counted_lowering):
    x, y = _inputs()
    compile_graph(trace(_f, x, y)[0])
    compile_graph(trace(_g, x, y)[0])
    compile_graph(trace(_f, x, y)[0], options={"max_inline_ops": 3})
    compile_graph(trace(_f, x, y)[0], mode="max-autotune")
    assert cache.stats.program_hits == 0
    assert len(counted_lowering) == 4
    compile_graph(trace(_f, torch.randn(4, 9), torch.randn(4, 9))[0])  # other sizes: another graph
    assert cache.stats.program_hits == 0
    compile_graph(trace(_f, x, y)[0], options={"debug_dir": "elsewhere"})  # not in the key
    assert cache.stats.program_hits == 1


def test_disabled_cache_writes_nothing(counted_lowering):
    graph, _ = trace(_f, *_inputs())
    compile_graph(graph, options={"cache": False})
    compile_graph(graph, options={"cache": False})
    assert len(counted_lowering) == 2
    assert not (cache.cache_root() / "programs").exists()


@pytest.mark.parametrize("damage", [b"", b"not a zip at all", b"PK\x03\x04broken"])
def test_corrupt_entry_is_ignored_and_rewritten(counted_lowering, caplog, damage):
    graph, _ = trace(_f, *_inputs())
    first = compile_graph(graph)
    key = cache.program_key(graph, mode="default", cfg=compile_module.default_config)
    cache.programs.path(key).write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="torchfuse.inductor.cache"):
        again = compile_graph(graph)
    assert "unreadable entry" in caplog.text
    assert cache.stats.corrupt == 1
    assert len(counted_lowering) == 2
    assert _untimed(again) == _untimed(first)
    assert cache.lookup_program(key) is not None, "the recompiled Program is stored again"


def test_key_covers_producer_fingerprint(monkeypatch):
    graph, _ = trace(_f, *_inputs())
    cfg = compile_module.default_config
    before = cache.program_key(graph, mode="default", cfg=cfg)
    assert before == cache.program_key(graph, mode="default", cfg=cfg)
    monkeypatch.setattr(cache, "_versions", lambda: "another compiler")
    assert cache.program_key(graph, mode="default", cfg=cfg) != before


def test_writes_are_atomic_leftovers_free():
    graph, _ = trace(_f, *_inputs())
    compile_graph(graph)
    names = os.listdir(cache.cache_root() / "programs")
    assert len(names) == 1 and names[0].endswith(".zip"), names


_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    from torchfuse.graph import trace
    from torchfuse.graph.archive import to_json
    from torchfuse.inductor import cache, compile_graph, inductor
    from torchfuse.inductor import compile as compile_module
    from torchfuse.runtime import load

    # the producer fingerprint hashes our sources; pin it so that an edit made between the two
    # processes (a developer saving a file) does not turn the second run into a miss
    cache._versions = lambda: "pinned for this test"
    lowered = []
    real = compile_module.lower
    compile_module.lower = lambda *a, **k: lowered.append(1) or real(*a, **k)

    def f(x, y):
        return torch.relu(x * y + 1.0).sum(dim=1)

    def loss(x, w):
        return (torch.tanh(x * w) * x).sum(dim=0)

    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    program = compile_graph(trace(f, x, y)[0])
    out = load(program, device="cpu")(x, y)[0]

    xt, wt = torch.randn(3, 5, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    graph, _ = trace(loss, xt, wt)
    res = inductor(graph, [xt, wt])(xt, wt)[0]
    gx, gw = torch.autograd.grad(res.sum(), (xt, wt))
    print("RESULT" + json.dumps({
        "lowered": len(lowered), "program_hits": cache.stats.program_hits,
        "program_stores": cache.stats.program_stores, "aot_hits": cache.stats.aot_hits,
        "aot_stores": cache.stats.aot_stores, "program": to_json(program).decode(),
        "out": out.tolist(), "grads": [gx.tolist(), gw.tolist()], "res": res.tolist(),
    }))
""")


def _run_child(tmp_path) -> dict:
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(tmp_path / "shared"), TRITON_INTERPRET="1",
               TORCHFUSE_COMPILE_CACHE="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_second_process_loads_instead_of_compiling(tmp_path):
    cold = _run_child(tmp_path)
    assert cold["lowered"] == 3  # the inference graph, then the forward and backward graphs
    assert (cold["program_hits"], cold["program_stores"], cold["aot_stores"]) == (0, 3, 1)
    warm = _run_child(tmp_path)
    assert warm["lowered"] == 0, f"a warm process must not run the compiler passes: { {k: v for k, v in warm.items() if k != 'program'} }"
    assert (warm["program_hits"], warm["program_stores"]) == (3, 0)
    assert (warm["aot_hits"], warm["aot_stores"]) == (1, 0)
    assert warm["program"] == cold["program"]
    for key in ("out", "grads", "res"):
        assert warm[key] == cold[key]
    # and both agree with eager
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(torch.tensor(warm["out"]), _f(x, y))
    xt, wt = torch.randn(3, 5, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    res = (torch.tanh(xt * wt) * xt).sum(dim=0)
    gx, gw = torch.autograd.grad(res.sum(), (xt, wt))
    torch.testing.assert_close(torch.tensor(warm["res"]), res.detach())
    torch.testing.assert_close(torch.tensor(warm["grads"][0]), gx)
    torch.testing.assert_close(torch.tensor(warm["grads"][1]), gw)
