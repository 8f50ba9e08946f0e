"""Compile time, observed: every entry's stages and counts, cache reuse proven by counting,
kernels of equal code shared, the progress line and its switches.

No test here times anything: they check that timings are recorded and consistent, that a
warm path runs no compiler pass, and that results equal eager.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json

import msgspec
import pytest
import torch
import torchfuse.capture as tf
import torchfuse.runtime.config as rconfig
from torchfuse.graph import observe, progress
from torchfuse.inductor import cache


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cache_dir=tmp_path / "cache"))
    tf.reset()
    yield
    tf.reset()


def _loss(x, w):
    return (torch.tanh(x @ w) * 2.0).sum(dim=1).mean()


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)


def _entry_names() -> list[str]:
    return [g for g in observe.timed_graphs() if "_loss" in g]


def test_every_stage_of_an_entry_is_timed_and_counted():
    x, w = _inputs()
    with observe.collect() as sink:
        out = tf.compile(_loss)(x, w)
        (gw,) = torch.autograd.grad(out, (w,))
        name = _entry_names()[-1]
        stages, counts = observe.timings_of(name)
    w2 = w.detach().clone().requires_grad_(True)
    expected = _loss(x, w2)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(gw, torch.autograd.grad(expected, (w2,))[0])
    for stage in ("capture", "aot.joint_graph", "aot.partition", "inductor.cache_lookup", "inductor.lower",
                  "inductor.schedule", "inductor.codegen", "runtime.load", "runtime.run",
                  "backward.inductor.lower", "backward.runtime.load", "backward.runtime.run"):
        assert stage in stages, f"{stage} missing from {sorted(stages)}"
    assert all(v >= 0 for v in stages.values())
    assert counts["inductor.cache.program_misses"] == 1
    assert counts["backward.inductor.cache.program_misses"] == 1
    assert counts["aot.cache.misses"] == 1
    assert counts["runtime.kernels"] >= 1 and counts["backward.runtime.kernels"] >= 1
    # timings.json holds the same table, its total the sum of the stages
    doc = json.loads(sink.get("timings.json", name))
    assert doc["stages_s"] == pytest.approx(stages)
    assert doc["total_s"] == pytest.approx(sum(stages.values()))
    assert doc["counts"] == counts
    assert "count" in sink.get("timings.txt", name)


def _shifted(ids):
    # transformers' shift_tokens_right: writes into slices of a new tensor (not functional)
    out = ids.new_zeros(ids.shape)
    out[:, 1:] = ids[:, :-1].clone()
    out[:, 0] = 7
    return out * 2


def test_a_warm_inference_graph_that_writes_intermediates_skips_functionalize(monkeypatch):
    import importlib

    fz = importlib.import_module("torchfuse.autograd.functionalize")  # the package exports a function of that name
    ids = torch.arange(12).reshape(3, 4)
    with torch.no_grad():
        cold = tf.compile(_shifted)(ids)
    tf.reset()
    calls = []
    real = fz._functionalize_node  # what every functionalization runs, whoever imported it
    monkeypatch.setattr(fz, "_functionalize_node", lambda *a: calls.append(a[0]) or real(*a))
    with torch.no_grad(), observe.collect(artifacts=False):
        warm = tf.compile(_shifted)(ids)
        counts = observe.timings_of([g for g in observe.timed_graphs() if "_shifted" in g][-1])[1]
    assert counts["inductor.cache.program_hits"] == 1 and calls == []
    torch.testing.assert_close(warm, cold)
    torch.testing.assert_close(warm, _shifted(ids))
    with torch.no_grad():
        # without the cache the graph is functionalized as before, and computes the same
        uncached = tf.compile(_shifted, options={"cache": False})(ids + 1)
    assert calls
    torch.testing.assert_close(uncached, _shifted(ids + 1))


def test_perf_hints_prints_each_entry_once_after_its_first_call(monkeypatch, capsys):
    monkeypatch.setattr(observe, "config", dataclasses.replace(observe.config, logs=frozenset({"perf_hints"})))
    x, w = _inputs()
    fn = tf.compile(_loss)
    out = fn(x, w)
    err = capsys.readouterr().err
    assert "[torchfuse.perf_hints]" in err and "inductor.lower" in err and "runtime.run" in err
    assert "inductor.cache.program_misses" in err
    torch.testing.assert_close(fn(x, w), out)
    assert "[torchfuse.perf_hints]" not in capsys.readouterr().err  # a cached call prints nothing
    torch.testing.assert_close(out, _loss(x, w))


def test_second_compile_of_the_same_graph_runs_no_compiler_pass(counted_lowering):
    x, w = _inputs()
    cold = tf.compile(_loss)(x, w)
    assert len(counted_lowering) == 2  # forward and backward
    tf.reset()  # what a fresh process has: nothing in memory, everything on disk
    with observe.collect():
        warm = tf.compile(_loss)(x, w)
        name = _entry_names()[-1]
        _, counts = observe.timings_of(name)
    assert len(counted_lowering) == 2, "a warm compile counted_lowering again"
    assert counts["inductor.cache.program_hits"] == 1 and counts["aot.cache.hits"] == 1
    assert "inductor.cache.program_misses" not in counts
    torch.testing.assert_close(warm, cold)
    torch.testing.assert_close(warm, _loss(x, w))


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0


def _calling(net):
    def call_net(x):  # the module is a closure cell: capture guards on its identity
        return net(x).sum(dim=1)
    return call_net


def test_an_object_address_in_a_guard_does_not_change_the_cache_key(counted_lowering):
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(3, 8)
    with torch.no_grad():
        first = tf.compile(_calling(net))(x)
    assert len(counted_lowering) == 1
    other = copy.deepcopy(net)  # another object (another address), the same graph
    with torch.no_grad():
        second = tf.compile(_calling(other))(x)
    assert len(counted_lowering) == 1, "the graph of a second module object compiled again"
    assert cache.stats.program_hits == 1
    with torch.no_grad():
        torch.testing.assert_close(first, net(x).sum(dim=1))
        torch.testing.assert_close(second, other(x).sum(dim=1))


def test_keys_cover_size_guards_and_no_other_guard():
    from torchfuse.graph import schema as S
    from torchfuse.graph import trace
    from torchfuse.inductor.config import config

    graph, _ = trace(lambda a: a * 2 + 1, torch.randn(4))
    other_graph, _ = trace(lambda a: a * 3 + 1, torch.randn(4))

    def with_guard(guard: S.Guard, g: S.Graph = graph) -> S.Graph:
        return msgspec.structs.replace(g, guards=(*g.guards, guard))

    key = lambda g: cache.program_key(g, mode="default", cfg=config)
    ident = lambda text: S.IdentityGuard(source="C[0]", description=text)
    keys_of = lambda value: S.ConstantGuard(source="tuple(L[3].keys())", value=value)
    assert key(with_guard(ident("C[0] is Net at 0x7f01"))) == key(with_guard(ident("C[0] is Net at 0x7f99")))
    # an id()-keyed dict's keys: addresses as integers, another in every process
    assert key(with_guard(keys_of("(140572007951632,)"))) == key(with_guard(keys_of("(140462443278864,)")))
    assert key(with_guard(keys_of("(1,)"))) == key(graph)
    assert key(with_guard(S.SymbolGuard(expr="s0 > 4"))) != key(with_guard(S.SymbolGuard(expr="s0 > 5")))
    assert key(with_guard(ident("C[0] is Net"), other_graph)) != key(with_guard(ident("C[0] is Net")))
    plans = cache.PlanCache()
    assert plans.key(b'{"d":"C[0] is Net at 0x7f01"}') == plans.key(b'{"d":"C[0] is Net at 0x7f99"}')
    assert plans.key(b'{"d":"C[0] is Net"}') != plans.key(b'{"d":"C[0] is Other"}')


@pytest.mark.triton_cpu  # Triton functions are what is shared
def test_kernels_of_equal_code_share_one_function_whatever_their_names():
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import kernels as rk
    from torchfuse.runtime import load

    x = torch.randn(4, 8)
    graph, _ = trace(lambda a: (a * 2 + 1).relu(), x)
    program = compile_graph(graph, options={"cache": False})
    (kernel,) = program.kernels
    renamed_name = kernel.name + "_other"
    renamed = msgspec.structs.replace(kernel, name=renamed_name, entry=renamed_name,
                                      source=kernel.source.replace(kernel.name, renamed_name))
    steps = tuple(msgspec.structs.replace(s, kernel=renamed_name) if getattr(s, "kernel", None) == kernel.name
                  else s for s in program.steps)
    other = msgspec.structs.replace(program, kernels=(renamed,), steps=steps)
    assert rk.code_key(renamed) == rk.code_key(kernel)
    assert rk.kernel_hash(renamed) != rk.kernel_hash(kernel)
    before = rk.share_stats["shared"]
    a, b = load(program, device="cpu"), load(other, device="cpu")
    assert a.kernels[kernel.name] is b.kernels[renamed_name]
    assert rk.share_stats["shared"] == before + 1
    expected = (x * 2 + 1).relu()
    torch.testing.assert_close(a(x)[0], expected)
    torch.testing.assert_close(b(x)[0], expected)
    # a kernel whose code differs is not shared
    changed = msgspec.structs.replace(renamed, source=renamed.source.replace("0.0", "0.5", 1))
    if changed.source != renamed.source:
        assert rk.code_key(changed) != rk.code_key(kernel)


def test_logs_switches_for_progress_and_perf_hints():
    cfg = observe.ObserveConfig.from_environment({"TORCHFUSE_LOGS": "-progress,perf_hints"})
    assert cfg.off == frozenset({"progress"}) and cfg.logs == frozenset({"perf_hints"})
    assert "progress" not in observe.ObserveConfig.from_environment({"TORCHFUSE_LOGS": "all"}).logs
    assert observe.ObserveConfig.from_environment({"CI": "true"}).ci
    assert not observe.ObserveConfig.from_environment({"CI": ""}).ci


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("case", ["terminal", "not_a_terminal", "ci", "minus_progress"])
def test_progress_line_only_on_a_terminal_outside_ci(case, monkeypatch):
    stream = io.StringIO() if case == "not_a_terminal" else _Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)  # every compile counts as long
    monkeypatch.setattr(observe, "config", dataclasses.replace(
        observe.config, ci=case == "ci", off=frozenset({"progress"}) if case == "minus_progress" else frozenset()))
    x, w = _inputs()
    out = tf.compile(_loss)(x, w)
    torch.testing.assert_close(out, _loss(x, w))
    text = stream.getvalue()
    if case == "terminal":
        assert "torchfuse: compiling" in text and "stages" in text
        assert text.endswith("\r\x1b[K")  # cleared when the first call ended
    else:
        assert "torchfuse: compiling" not in text


def test_progress_counts_kernels(monkeypatch):
    monkeypatch.setattr("sys.stderr", _Terminal())
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(observe, "config", dataclasses.replace(observe.config, ci=False, off=frozenset()))
    progress.stage("f/entry_0", "inductor.lower", 0.5)
    progress.kernels(3, 7)
    assert "kernels 3/7" in progress.line_text() and "(inductor.lower)" in progress.line_text()
    progress.finish("f/entry_0")
    assert "kernels" not in progress.line_text()


_WARM_CHILD = r"""
import json, sys
import torch
import torchfuse.capture as tf

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)).mul(2.0)).softmax(-1)

torch.manual_seed(0)
m, x = MLP(), torch.randn(3, 8)
cm = tf.compile(m)
out = cm(x)
out.sum().backward()
grads = [p.grad.clone() for p in m.parameters()]
m.zero_grad()
ref = m(x)
ref.sum().backward()
same = torch.allclose(out, ref, atol=1e-5) and all(
    torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, m.parameters()))
print(json.dumps({"from_disk": cm._compiled.entries[0].result.from_disk, "same": bool(same),
                  "requires_grad": out.requires_grad}))
"""


def test_a_warm_process_rebuilds_the_captured_entry_and_trains_as_eager(tmp_path):
    """The whole pipeline across two processes on one cache directory: the second rebuilds
    the captured entry (`torchfuse.capture.entry_cache`) instead of capturing, the backend
    finds its Program and plan, and values and gradients equal eager's in both."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHFUSE_CACHE_DIR": str(tmp_path / "cache"), "TORCHFUSE_CAPTURE_CACHE": "1"}
    script = tmp_path / "child.py"  # a file: code from no file is not kept
    script.write_text(_WARM_CHILD)

    def child() -> dict:
        p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    assert child() == {"from_disk": False, "same": True, "requires_grad": True}
    assert child() == {"from_disk": True, "same": True, "requires_grad": True}
