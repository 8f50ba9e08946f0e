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


def test_an_extern_op_updating_an_input_in_place_is_a_mutation():
    # a training batch norm updating its running statistics in the inputs (inductor's
    # ``inplace`` pass): a replay would update the static copies, not the caller's tensors
    from torchfuse.runtime.checks import mutated_inputs
    from torchfuse.runtime.cudagraphs import _static_reason

    t = S.TensorRef
    bufs = [S.Buffer(name="x", dtype="float32", sizes=(4, 3), strides=(3, 1), device="cuda")]
    bufs += [S.Buffer(name=n, dtype="float32", sizes=(3,), strides=(1,), device="cuda")
             for n in ("rm", "rv", "mean", "rstd")]
    bufs.append(S.Buffer(name="y", dtype="float32", sizes=(4, 3), strides=(3, 1), device="cuda"))
    prog = S.Program(
        name="bn", inputs=("x", "rm", "rv"), outputs=(t(name="y"), t(name="rm"), t(name="rv")),
        buffers=tuple(bufs),
        steps=(S.ExternStep(op="aten._native_batch_norm_legit.default",
                            args=(t(name="x"), S.NoneArg(), S.NoneArg(), t(name="rm"), t(name="rv"),
                                  S.Bool(value=True), S.Float(value=0.1), S.Float(value=1e-5)),
                            outputs=("y", "mean", "rstd")),),
        device="cuda", opsets={"aten": 1},
    )
    assert mutated_inputs(prog) == ["rm", "rv"]
    assert "writes into its inputs ['rm', 'rv']" in (_static_reason(prog, "cuda") or "")
    # on the CPU it runs as eager's in-place op does: the caller's statistics updated
    x, rm, rv = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
    want_rm, want_rv = rm.clone(), rv.clone()
    want = torch.ops.aten._native_batch_norm_legit.default(x, None, None, want_rm, want_rv, True, 0.1, 1e-5)[0]
    y, got_rm, got_rv = load(prog, device="cpu")(x, rm, rv)
    torch.testing.assert_close(y, want)
    assert got_rm is rm and got_rv is rv
    torch.testing.assert_close(rm, want_rm)
    torch.testing.assert_close(rv, want_rv)
