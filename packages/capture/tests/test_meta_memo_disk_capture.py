"""A second process's capture answers from the meta-kernel memo the first one saved
(`torchfuse.graph.meta_memo_store`): no meta kernel runs for the ops the first saved, and the
graph is the one captured with every meta kernel run, computing what eager does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchfuse.capture.config import from_environment

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import msgspec, torch
from torchfuse.graph import tracing
from torchfuse.graph.meta_memo import MEMO
from torchfuse.graph.meta_memo_store import record_key
from test_meta_memo_capture import capture_stack

ran = []
real_run = tracing._run_on_meta

def counting(func, args, kwargs):
    ran.append(str(func))
    return real_run(func, args, kwargs)

tracing._run_on_meta = counting
graph, out, expected = capture_stack()
torch.testing.assert_close(out, expected)
assert out.dtype == torch.float64
saved = sorted({k[0] for k in MEMO._unsaved if record_key(k) is not None}, key=str)
print(json.dumps({
    "graph": {f: msgspec.to_builtins(getattr(graph, f)) for f in ("inputs", "outputs", "nodes", "values")},
    "ran": ran, "saved": [str(op) for op in saved],
    "hits": MEMO.hits, "misses": MEMO.misses, "disk_hits": MEMO.disk_hits,
}))
"""


def _capture(cache: Path, **env: str) -> dict:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFUSE_META_MEMO")}
    child_env.update(env, TORCHFUSE_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent)], env=child_env,
                         capture_output=True, text=True, timeout=300, cwd=cache.parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_runs_no_meta_kernel_the_first_saved(tmp_path):
    cache = tmp_path / "cache"
    first = _capture(cache)
    assert first["disk_hits"] == 0 and first["saved"], "the first process starts from nothing"
    assert list((cache / "meta_memo").iterdir()), "saved at exit"

    second = _capture(cache)
    assert second["disk_hits"] > 0 and second["misses"] == 0
    assert not set(first["saved"]) & set(second["ran"]), "a meta kernel ran for a saved op"
    assert len(second["ran"]) < len(first["ran"])
    assert second["graph"] == first["graph"]

    # the graph every meta kernel makes; and the switch keeps the memo in memory
    plain = _capture(tmp_path / "plain", TORCHFUSE_META_MEMO="0")
    assert plain["graph"] == first["graph"] and plain["hits"] == 0
    off = _capture(cache, TORCHFUSE_META_MEMO_DISK="0")
    assert off["disk_hits"] == 0 and off["misses"] > 0 and off["graph"] == first["graph"]
    assert not (tmp_path / "plain" / "meta_memo").exists()


def test_the_switch():
    assert from_environment({}).meta_memo_disk
    assert not from_environment({"TORCHFUSE_META_MEMO_DISK": "0"}).meta_memo_disk
    autograd_config = pytest.importorskip("torchfuse.autograd.config").from_environment
    assert autograd_config({}).meta_memo_disk
    assert not autograd_config({"TORCHFUSE_META_MEMO_DISK": "off"}).meta_memo_disk
