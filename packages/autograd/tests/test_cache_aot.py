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


def test_backward_compiled_with_the_forward_and_warmed_early(monkeypatch):
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

    # TORCHFUSE_COMPILE_FORWARD_FIRST=1: the forward is lowered and its compiles started first
    import dataclasses

    import torchfuse.autograd.config as aconfig

    monkeypatch.setattr(glue_module, "config", aconfig.from_environment({"TORCHFUSE_COMPILE_FORWARD_FIRST": "1"}))
    assert glue_module.config.forward_first and not aconfig.from_environment({}).forward_first
    assert dataclasses.replace(glue_module.config, forward_first=False) == aconfig.from_environment({})
    events.clear()
    fn = aot(graph, compiler, compile_backward_early=True)
    got = _grads(fn, _inputs())
    assert events == ["forward", "warm forward", "backward", "warm backward", "run forward", "run backward"]
    for a, b in zip(got, _grads(_loss, _inputs()), strict=True):
        torch.testing.assert_close(a, b)


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


def test_a_hit_runs_no_functionalize_and_gives_the_same_plan(monkeypatch):
    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()
    first = aot(graph, interpreter_compiler, cache=store)
    cold = _grads(first, _inputs())
    assert "functionalize" in _stage_names(first)
    calls = []
    real = glue_module.functionalize
    monkeypatch.setattr(glue_module, "functionalize", lambda g: calls.append(g) or real(g))
    second = aot(graph, interpreter_compiler, cache=store)
    warm = _grads(second, _inputs())
    assert store.hits == 1 and calls == []
    assert "functionalize" not in _stage_names(second)
    p1 = first.plan((True, True, True), True)
    p2 = second.plan((True, True, True), True)
    assert (p2.partition.forward, p2.partition.backward) == (p1.partition.forward, p1.partition.backward)
    assert (p2.partition.saved, p2.partition.recomputed) == (p1.partition.saved, p1.partition.recomputed)
    assert (p2.tangent_of, p2.grad_of, p2.guards) == (p1.tangent_of, p1.grad_of, p1.guards)
    assert p2.mutated_input_positions == p1.mutated_input_positions
    for a, b in zip(warm, cold, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the functional graph is still there for whoever asks (computed then, once)
    assert second.functional == first.functional and len(calls) == 1


def _scaled_and_counted(x, w, count):
    count.add_(1)  # an input written in place: a mutated_input output, copied back by the call
    y = (x @ w).t()  # a view of an intermediate, returned
    return y.relu().sum(), x.view(-1)  # the second output aliases the input x


def _mutating_inputs():
    torch.manual_seed(1)
    return torch.randn(4, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True), torch.zeros(())


def test_a_hit_writes_mutated_inputs_back_and_views_inputs_like_eager():
    graph, _ = trace(_scaled_and_counted, *_mutating_inputs())
    store = MemoryCache()
    aot(graph, interpreter_compiler, cache=store)(*_mutating_inputs())
    warm_fn = aot(graph, interpreter_compiler, cache=store)
    x, w, count = _mutating_inputs()
    loss, flat = warm_fn(x, w, count)
    assert store.hits == 1 and "functionalize" not in _stage_names(warm_fn)
    ex, ew, ecount = _mutating_inputs()
    eloss, eflat = _scaled_and_counted(ex, ew, ecount)
    torch.testing.assert_close(count, ecount)  # written back on the hit too
    torch.testing.assert_close(loss, eloss)
    assert flat.data_ptr() == x.data_ptr() and flat.shape == eflat.shape  # a view of the real input
    got = torch.autograd.grad(loss + flat.sum(), (x, w))
    want = torch.autograd.grad(eloss + eflat.sum(), (ex, ew))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_record_naming_no_input_is_invalid_and_the_plan_rebuilt():
    import msgspec

    graph, _ = trace(_scaled_and_counted, *_mutating_inputs())
    store = MemoryCache()
    aot(graph, interpreter_compiler, cache=store)(*_mutating_inputs())
    (material,) = store.entries
    rec = msgspec.json.decode(store.entries[material], type=glue_module._PlanRecord)
    outs = tuple(msgspec.structs.replace(o, target="not_an_input") if o.kind == "mutated_input" else o
                 for o in rec.interface.outputs)
    assert outs != rec.interface.outputs, "the graph must write an input for this test"
    bad = msgspec.structs.replace(rec, interface=msgspec.structs.replace(rec.interface, outputs=outs))
    store.entries[material] = msgspec.json.encode(bad)
    fn = aot(graph, interpreter_compiler, cache=store)
    x, w, count = _mutating_inputs()
    loss, _ = fn(x, w, count)
    assert len(store.invalid_reasons) == 1 and "not_an_input" in store.invalid_reasons[0]
    assert "functionalize" in _stage_names(fn) and "joint_graph" in _stage_names(fn)
    ex, ew, ecount = _mutating_inputs()
    torch.testing.assert_close(loss, _scaled_and_counted(ex, ew, ecount)[0])
    torch.testing.assert_close(count, ecount)


def test_guards_other_than_size_guards_do_not_change_the_plan_key():
    import msgspec
    from torchfuse.graph import schema as S

    graph, _ = trace(_loss, *_inputs())
    store = MemoryCache()

    def guarded(*guards):
        return msgspec.structs.replace(graph, guards=(*graph.guards, *guards))

    # the keys of a dict keyed by id(): another value in every process, nothing compiled differs
    aot(guarded(S.ConstantGuard(source="tuple(L[3].keys())", value="(140572007951632,)")),
        interpreter_compiler, cache=store)(*_inputs())
    fn = aot(guarded(S.ConstantGuard(source="tuple(L[3].keys())", value="(140462443278864,)"),
                     S.IdentityGuard(source="C[0]", description="C[0] is Net at 0x7f99")),
             interpreter_compiler, cache=store)
    for a, b in zip(_grads(fn, _inputs()), _grads(_loss, _inputs()), strict=True):
        torch.testing.assert_close(a, b)
    assert (store.hits, len(store.entries)) == (1, 1)
    aot(guarded(S.SymbolGuard(expr="s0 > 4")), interpreter_compiler, cache=store)(*_inputs())
    assert len(store.entries) == 2, "a size guard is part of the key"
