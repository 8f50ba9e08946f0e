"""FSDP2 (``fully_shard`` per block, then the root) with compiled blocks or a compiled model,
on two CPU processes (gloo): losses and full parameters match eager FSDP2 at every step.
FSDP2's hooks (all-gather before a block's forward, reshard after, reduce-scatter in the
backward) run in Python; each block's forward is a graph of its own."""

from __future__ import annotations


def test_fully_shard_with_compiled_blocks_and_model(case_results):
    for r in case_results("fsdp"):
        assert r["blocks"] == 1  # the first block's forward: one graph
        assert r["model"] == 3  # each block's forward, and the head after the last block
