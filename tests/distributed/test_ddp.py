"""Compiled models under DDP, on two CPU processes (gloo): losses and parameters match eager
DDP at every step (checked inside each rank, `workers.same`), and the backward is cut at DDP's
bucket boundaries so that all-reduces start before it ends."""

from __future__ import annotations


def test_compiled_ddp_both_ways(case_results):
    for r in case_results("ddp_both_ways"):
        # MLP's three layers in buckets of about one layer: the graph is cut into pieces
        assert r["outer_graphs"] == 1
        assert r["outer_pieces"] == [2] and r["inner_pieces"] == [2]
        assert r["explain_pieces"] == [2]
        assert "Pieces per graph (DDP buckets): [2]" in r["explain_text"]


def test_gpt2_under_compiled_ddp(case_results):
    for r in case_results("ddp_gpt2"):
        # transformers' GPT-2 (2 layers): one graph, cut into one piece per ~10 kB bucket
        assert r["graphs"] == 1 and r["pieces"][0] > 2, r


def test_bucket_split_overlaps_the_backward(case_results):
    for r in case_results("ddp_overlap"):
        split, whole = r["split=True"], r["split=False"]
        # cut: a bucket is all-reduced before the first piece's backward has begun
        assert split.index("bucket 0") < split.index("first piece backward")
        # one graph: every gradient arrives when the whole backward is over
        assert whole[0] == "first piece backward" and len(whole) > 1


def test_split_can_be_turned_off(case_results):
    for r in case_results("ddp_no_split"):
        assert r["pieces"] == [1]


def test_no_sync_and_gradient_accumulation(case_results):
    case_results("ddp_no_sync")


def test_find_unused_parameters(case_results):
    case_results("ddp_unused")


def test_static_graph(case_results):
    # DDP queues step 1's delayed all-reduce in the backward of its _DDPSink Function
    for r in case_results("ddp_static_graph"):
        assert r["pieces"] == [2]


def test_compiled_ddp_inductor(case_results):
    for r in case_results("ddp_inductor"):
        assert r["pieces"] == [2]


def test_ranks_that_compile_differently_are_reported(case_results):
    results = case_results("ranks_differ")
    assert all(any("differs between rank" in w for w in r["warnings"]) for r in results), results


def test_a_rank_that_never_compiles_is_reported_not_waited_for(case_results):
    rank0, rank1 = case_results("rank_missing")
    assert any("rank(s) [1] did not" in w for w in rank0["warnings"]), rank0
    assert rank1["warnings"] == []
