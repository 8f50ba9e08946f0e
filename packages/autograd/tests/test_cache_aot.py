"""``aot(..., cache=)``: a training plan read back from a plan cache instead of rebuilt."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchfuse.autograd import aot, interpreter_compiler
from torchfuse.autograd import glue as glue_module
from torchfuse.autograd.decompositions import DEFAULT_TABLE
from torchfuse.graph import trace


class MemoryCache:
    """A plan cache in a dict (the inductor backend's is on disk), counting what it serves."""

    def __init__(self) -> None:
        self.entries: dict[bytes, bytes] = {}
        self.hits = self.misses = 0
        self.invalid_reasons: list[str] = []

    def get(self, material: bytes) -> bytes | None:
        data = self.entries.get(material)
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        return data

    def put(self, material: bytes, data: bytes) -> None:
        self.entries[material] = data

    def invalid(self, material: bytes, reason: str) -> None:
        self.invalid_reasons.append(reason)
        self.entries.pop(material, None)


def _loss(x, w, b):
    return F.layer_norm(torch.tanh(x @ w), (w.shape[1],), None, b).sum(dim=1)


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(4, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True),
            torch.randn(5, requires_grad=True))


def _grads(fn, inputs):
    out = fn(*inputs)
    out = out[0] if isinstance(out, list) else out
    return (out.detach(), *torch.autograd.grad(out.sum(), inputs))


def _stage_names(fn):
    return [s.name for s in fn.stages]


def test_second_plan_comes_from_the_cache_and_matches_eager(monkeypatch):
    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()
    first = aot(graph, interpreter_compiler, cache=store)
    cold = _grads(first, _inputs())
    assert "joint_graph" in _stage_names(first)
    assert (store.misses, len(store.entries)) == (1, 1)

    def no_joint(*args, **kwargs):
        raise AssertionError("a cached plan must not trace the joint graph again")

    monkeypatch.setattr(glue_module, "joint_graph", no_joint)
    monkeypatch.setattr(glue_module, "partition", no_joint)
    second = aot(graph, interpreter_compiler, cache=store)
    warm = _grads(second, _inputs())
    assert store.hits == 1
    assert "joint_graph" not in _stage_names(second) and "cache.forward" in _stage_names(second)
    eager = _grads(_loss, _inputs())
    for a, b, c in zip(warm, cold, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c)
    p1 = first.plan((True, True, True), True)
    p2 = second.plan((True, True, True), True)
    assert p2.partition.forward == p1.partition.forward
    assert p2.partition.backward == p1.partition.backward
    assert (p2.tangent_of, p2.grad_of) == (p1.tangent_of, p1.grad_of)


def test_other_requires_grad_pattern_is_another_entry():
    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()
    aot(graph, interpreter_compiler, cache=store)(*_inputs())
    x, w, b = _inputs()
    fn = aot(graph, interpreter_compiler, cache=store)
    out = fn(x, w.detach(), b)[0]
    gx, gb = torch.autograd.grad(out.sum(), (x, b))
    ex, eb = torch.autograd.grad(_loss(x, w.detach(), b).sum(), (x, b))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gb, eb)
    assert store.hits == 0 and len(store.entries) == 2


def test_undecodable_entry_is_reported_and_rebuilt():
    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()
    aot(graph, interpreter_compiler, cache=store)(*_inputs())
    (material,) = store.entries
    store.entries[material] = b'{"forward": 1}'
    fn = aot(graph, interpreter_compiler, cache=store)
    got = _grads(fn, _inputs())
    assert len(store.invalid_reasons) == 1
    assert "joint_graph" in _stage_names(fn)
    for a, b in zip(got, _grads(_loss, _inputs()), strict=True):
        torch.testing.assert_close(a, b)
    assert store.entries[material] != b'{"forward": 1}', "the rebuilt plan is stored again"


def test_custom_decomposition_table_is_not_cached():
    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()
    table = dict(DEFAULT_TABLE)
    fn = aot(graph, interpreter_compiler, cache=store, decompositions=table)
    for a, b in zip(_grads(fn, _inputs()), _grads(_loss, _inputs()), strict=True):
        torch.testing.assert_close(a, b)
    assert store.entries == {} and store.misses == 0


def test_backward_compiled_with_the_forward_and_warmed_early():
    graph, _ = trace(_loss, *_inputs())
    events = []

    def compiler(g, examples):
        kind = "backward" if any(i.kind == "tangent" for i in g.inputs) else "forward"
        events.append(kind)
        run = interpreter_compiler(g, examples)

        def compiled(*args):
            events.append(f"run {kind}")
            return run(*args)

        compiled.precompile_async = lambda: events.append(f"warm {kind}")
        return compiled

    fn = aot(graph, compiler, compile_backward_early=True)
    got = _grads(fn, _inputs())
    assert events == ["backward", "warm backward", "forward", "run forward", "run backward"]
    for a, b in zip(got, _grads(_loss, _inputs()), strict=True):
        torch.testing.assert_close(a, b)
    _grads(fn, _inputs())
    assert events.count("backward") == 1


def test_backward_compiled_late_by_default():
    graph, _ = trace(_loss, *_inputs())
    events = []

    def compiler(g, examples):
        events.append("backward" if any(i.kind == "tangent" for i in g.inputs) else "forward")
        return interpreter_compiler(g, examples)

    fn = aot(graph, compiler)
    out = fn(*_inputs())[0]
    assert events == ["forward"]
    out.sum().backward()
    assert events == ["forward", "backward"]
