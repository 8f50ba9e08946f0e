"""The DDP bucket split on one process: where `plan_buckets` cuts a graph, and that the
pieces `compile_pieces` chains compute what the whole graph computes, values and gradients,
with one backward node per piece (the two-rank tests are in ``tests/distributed``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchfuse.capture import compile, explain
from torchfuse.capture import distributed as D
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import run


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _graph(model, x):
    e = explain(model)(x)
    assert e.graph_count == 1, str(e)
    return e.graphs[0]


def _param_bytes(graph):
    return {i.name: 4 * int(torch.Size([int(s) for s in graph.values[i.name].sizes]).numel())
            for i in graph.inputs if i.kind == "parameter"}


def test_plan_cuts_walking_backwards_by_first_use():
    graph = _graph(_mlp(), torch.randn(2, 8))
    params = _param_bytes(graph)
    # layer sizes in bytes: 1152, 4224, 528; a cap of 500 closes a bucket at each layer
    plan = D.plan_buckets(graph, params, 500, 500)
    assert len(plan.cuts) == 2, plan
    assert plan.bucket_bytes == (1152, 4224, 528)
    # a cap of 1000: the last layer (528) joins the one before it
    assert D.plan_buckets(graph, params, 1000, 1000).bucket_bytes == (1152, 4752)
    assert sum(plan.bucket_bytes) == sum(params.values())
    ops = [n.op for n in graph.nodes]
    for cut in plan.cuts:  # each piece starts at the first use of a layer's weight
        assert ops[cut] == "aten.t.default"
    whole = D.plan_buckets(graph, params, 10**9, 10**9)
    assert whole.cuts == () and "one bucket" in whole.reason


def test_first_bucket_has_its_own_cap():
    graph = _graph(_mlp(), torch.randn(2, 8))
    params = _param_bytes(graph)
    # a first bucket of 100 bytes fills with the last layer alone; the rest fits one bucket
    plan = D.plan_buckets(graph, params, 100, 10**9)
    assert len(plan.cuts) == 1 and plan.bucket_bytes[-1] == 528


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_pieces_compute_what_the_graph_computes(backend):
    from torchfuse.capture.backends import lookup_backend

    model = _mlp()
    x = torch.randn(3, 8, requires_grad=True)
    graph = _graph(model, x)
    inputs = {"x": x, **dict(model.named_parameters())}
    examples = [x if i.kind == "user_input" else model.get_parameter(i.target) for i in graph.inputs]
    assert set(i.kind for i in graph.inputs) == {"user_input", "parameter"} and inputs
    plan = D.plan_buckets(graph, _param_bytes(graph), 500, 500)
    pieces = D.split_graph(graph, plan.cuts)
    assert len(pieces) == 3
    for p in pieces:  # every piece is a valid graph of the format
        from torchfuse.graph.verify import verify

        verify(p.graph)
    fn = D.compile_pieces(graph, examples, plan.cuts, lookup_backend(backend))
    (out,) = fn(*examples)
    want = model(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(run(graph, *examples)[0], want)
    if backend == "aot_eager":
        got = torch.autograd.grad(out.sum(), [x, *model.parameters()])
        ref = torch.autograd.grad(want.sum(), [x, *model.parameters()])
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b)
        nodes, todo = [], [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is not None:
                nodes.append(node.name())
                todo += [n for n, _ in node.next_functions]
        assert sum("Compiled" in n for n in nodes) == 3  # one backward node per piece


def test_graphs_that_stay_whole_say_why():
    def f(x):
        return x.sin().sum(0, keepdim=True).expand(3, 3) * 2  # a symbolic size: no split
    from torchfuse.capture import mark_dynamic

    x = torch.randn(4, 3)
    mark_dynamic(x, 0)
    graph = explain(f)(x).graphs[0]
    assert "symbolic" in D.splittable(graph)
    plan = D.plan_buckets(graph, {}, 1, 1)
    assert plan.cuts == () and plan.reason


class _WritesAcross(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0, self.l1 = nn.Linear(8, 32), nn.Linear(32, 32)

    def forward(self, x):
        a = self.l0(x)
        b = self.l1(a)
        a.mul_(2)  # written after l1 read it: no cut between a's making and this write
        return b + a


def test_no_cut_between_a_tensor_and_its_in_place_write():
    torch.manual_seed(0)
    model = _WritesAcross()
    x = torch.randn(2, 8)
    graph = _graph(model, x)
    ops = [n.op for n in graph.nodes]
    write = ops.index("aten.mul_.Tensor")
    plan = D.plan_buckets(graph, _param_bytes(graph), 100, 100)
    made = next(i for i, n in enumerate(graph.nodes) if n.op == "aten.addmm.default")
    assert plan.cuts and all(not made < c <= write for c in plan.cuts), (plan, ops)
    examples = [x if i.kind == "user_input" else model.get_parameter(i.target) for i in graph.inputs]
    from torchfuse.capture.backends import lookup_backend

    (out,) = D.compile_pieces(graph, examples, plan.cuts, lookup_backend("aot_eager"))(*examples)
    torch.testing.assert_close(out, model(x))


def test_compiled_module_keeps_the_module_visible():
    model = _mlp()
    cm = compile(model, backend="eager")
    assert model in list(cm.modules())
    assert dict(cm.named_modules())["_orig_mod"] is model
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in model.named_parameters()]


def test_torch_distributed_runtime_calls_are_breaks():
    import torch.distributed as dist

    assert D.is_distributed_runtime(dist.all_reduce)
    assert D.is_distributed_runtime(dist.barrier)
    assert not D.is_distributed_runtime(dist.get_rank)
    assert not D.is_distributed_runtime(torch.add)
    assert S.Graph  # the format is what the pieces are made of
