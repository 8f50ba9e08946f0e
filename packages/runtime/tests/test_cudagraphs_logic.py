"""The reduce-overhead bookkeeping (static inputs, copy-in, re-recording, passthrough outputs),
exercised on the CPU with torch.cuda's graph API replaced by a stand-in that re-runs the call."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
import runtime_programs as P
import torch
from torchfuse.graph import schema as S
from torchfuse.runtime import load
from torchfuse.runtime.cudagraphs import GraphRunner

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


class FakeGraph:
    """Replays by running the captured call again on the static inputs, writing the static outputs."""

    captured = None

    def replay(self):
        compiled, static, outs = self.captured
        fresh = compiled.run_uncaptured(*static)
        for o, f in zip(outs, fresh, strict=True):
            if isinstance(o, torch.Tensor):
                o.copy_(f)


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    state = {}

    @contextlib.contextmanager
    def graph(g, pool=None):
        state["graph"] = g
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", lambda: type("S", (), {"wait_stream": lambda self, s: None})())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"wait_stream": lambda self, s: None})())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    original = GraphRunner._record

    def record(self, inputs):
        rec = original(self, inputs)
        rec.graph.captured = (self.compiled, rec.static_inputs, rec.static_outputs)
        return rec

    monkeypatch.setattr(GraphRunner, "_record", record)


def graphed(prog):
    fn = load(prog, mode="reduce-overhead")
    fn._graphs.reason = None  # pretend this CPU program can be captured
    return fn


def test_replays_see_new_inputs_and_shapes_record_again(fake_cuda_graphs):
    fn = graphed(P.mixed_program("cpu"))
    for shape in [(3, 5), (3, 5), (3, 5), (2, 7), (2, 7), (3, 5)]:
        x, y, w = torch.randn(shape), torch.randn(shape), torch.randn(shape[1], 8)
        got = fn(x, y, w)
        want = P.mixed_reference(x, y, w)
        for g, e in zip(got, want, strict=True):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
            else:
                assert g == e
    assert fn.stats.graph_captures == 2
    assert fn.stats.graph_replays == 4


def test_replayed_outputs_are_the_static_tensors(fake_cuda_graphs):
    fn = graphed(P.scale_program("cpu"))
    fn(torch.randn(10))
    (a,) = fn(torch.ones(10))
    (b,) = fn(torch.full((10,), 4.0))
    assert a is b  # overwritten by the next replay, as documented
    torch.testing.assert_close(b, torch.full((10,), 2.0))


def test_an_output_that_is_an_input_is_the_callers_tensor(fake_cuda_graphs):
    prog = P.scale_program("cpu")
    fn = graphed(msgspec.structs.replace(prog, outputs=(S.TensorRef(name="buf0"), S.TensorRef(name="x"))))
    for _ in range(3):
        x = torch.randn(10)
        out, same = fn(x)
        assert same is x
        torch.testing.assert_close(out, x * 0.5)


def test_inputs_that_do_not_fit_still_raise(fake_cuda_graphs):
    from torchfuse.runtime import InputError

    fn = graphed(P.scale_program("cpu"))
    fn(torch.randn(10))
    fn(torch.randn(10))
    with pytest.raises(InputError, match="expected dtype float32"):
        fn(torch.randn(10, dtype=torch.float64))
    with pytest.raises(InputError, match="expected a tensor"):
        fn("not a tensor")


def test_at_most_cudagraph_max_graphs_least_recently_replayed_dropped(fake_cuda_graphs, monkeypatch):
    import dataclasses

    import torchfuse.runtime.config as rconfig

    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, cudagraph_max=2))
    fn = graphed(P.scale_program("cpu"))
    # sizes 3, 4 recorded; 3 replayed (4 is now the least recent); 5 drops 4; 4 records again
    for n in (3, 4, 3, 5, 3, 4):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x)[0], x * 0.5)
    assert list(fn._graphs.recorded) and len(fn._graphs.recorded) == 2
    assert fn.stats.graph_captures == 4  # 3, 4, 5, 4 again
    assert fn.stats.graph_evictions == 2  # 4 for 5, then 5 for 4
    assert fn.stats.graph_replays == 2  # 3 twice
    sizes = [key[0][0][0] for key in fn._graphs.recorded]
    assert sizes == [3, 4]


def test_cudagraph_max_from_the_environment():
    from torchfuse.runtime.config import from_environment

    assert from_environment({"TORCHFUSE_CUDAGRAPH_MAX": "3"}).cudagraph_max == 3
    assert from_environment({"TORCHFUSE_CUDAGRAPH_MAX": "0"}).cudagraph_max == 0  # no limit
    assert from_environment({}).cudagraph_max == 8
