"""Smoke test of the benchmark runner: a tiny CPU run must produce a well-formed result file.

The torchfuse column may hold errors while the pipeline is being built; the eager column and the
structure of the JSON must be right regardless.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
WORKLOADS = ("seed_fn_1k", "layer_norm_train")


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **env} if env else None)


def test_small_cpu_run_writes_wellformed_results(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "run.py"), "--small", "--device", "cpu", "--skip-compile",
                "--only", ",".join(WORKLOADS), "--tag", "smoke", "--out", str(tmp_path),
                "--rep-ms", "20", "--cache-dir", str(tmp_path / "caches"),
                # The cache-hit pass starts a second process: too slow for a smoke test.
                "--no-cache-hit",
                # what a run from an exported tree (no repository of its own) is told
                env={"TORCHFUSE_BENCH_COMMIT": "0123abcd"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "smoke.json").read_text())

    assert doc["schema"] == "torchfuse-bench/1"
    assert doc["tag"] == "smoke"
    env = doc["environment"]
    for key in ("device", "python", "torch", "triton", "date", "git_commit", "copy_gbps"):
        assert key in env
    assert env["device_type"] == "cpu"
    assert env["git_commit"] == "0123abcd" and env["git_dirty"] is False
    assert env["copy_gbps"] > 0
    assert doc["config"]["variants"] == ["eager", "torchfuse"]
    assert doc["config"]["small"] is True

    assert [r["name"] for r in doc["rows"]] == list(WORKLOADS)
    for row in doc["rows"]:
        assert row["scale"] == "small"
        assert row["bytes"] > 0
        assert set(row["results"]) == {"eager", "torchfuse"}
        eager = row["results"]["eager"]
        assert eager["error"] is None
        assert eager["ms"] > 0
        assert eager["speedup"] == 1.0
        assert eager["gbps"] > 0
        tf = row["results"]["torchfuse"]
        # Either a measured result checked against eager, or a recorded error: never nothing.
        if tf["error"] is None:
            assert tf["ms"] > 0
            assert tf["check"] == "ok" or tf["check"].startswith("MISMATCH")
            assert tf["compile_s"] >= 0
        else:
            assert isinstance(tf["error"], str) and tf["error"]
    training = {r["name"]: r["training"] for r in doc["rows"]}
    assert training == {"seed_fn_1k": False, "layer_norm_train": True}

    summary = doc["summary"]
    assert set(summary) >= {"forward", "training", "targets", "mismatches", "errors"}
    assert summary["errors"]["eager"] == []

    md = (tmp_path / "smoke.md").read_text()
    assert "| workload |" in md and "seed_fn_1k" in md

    # The diff tool reads what the runner wrote.
    diff = _run(str(BENCH / "compare.py"), str(tmp_path / "smoke.json"), str(tmp_path / "smoke.json"))
    assert diff.returncode == 0, diff.stderr
    assert "seed_fn_1k" in diff.stdout and "+0.0%" in diff.stdout


def test_workload_table_matches_benchmarks_md() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import workloads
    finally:
        sys.path.remove(str(BENCH))
    names = [w.name for w in workloads.WORKLOADS]
    assert len(names) == len(set(names)) == 20
    import torch

    for wl in workloads.WORKLOADS:
        assert wl.reference is not None
        if not wl.available():
            continue
        case = wl.make_case("cpu", None, "small")
        out = case.fn(*case.inputs)
        if wl.training:
            assert case.grad_wrt and all(t.requires_grad for t in case.grad_wrt)
            grads = torch.autograd.grad(wl.loss(out), case.grad_wrt)
            assert all(g is not None and torch.isfinite(g.float()).all() for g in grads)
        else:
            outs = out if isinstance(out, tuple) else (out,)
            assert all(torch.isfinite(o.float()).all() for o in outs)


def test_dynamic_benchmark_runs_and_reuses_one_entry(tmp_path: Path) -> None:
    """benchmarks/dynamic.py on tiny CPU shapes: both columns measured, one compile serves
    the second batch size, the table written."""
    proc = _run(str(BENCH / "dynamic.py"), "--device", "cpu", "--small", "--only", "softmax,cross_entropy",
                "--tag", "smoke", "--out", str(tmp_path), "--rep-ms", "5", "--warmup-ms", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "dynamic_smoke.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["softmax", "cross_entropy"]
    for r in rows:
        assert "error" not in r, r
        assert r["static_ms"] > 0 and r["dynamic_ms"] > 0 and r["recompiled_for_other_size"] is False
        assert r["static_loop_ms"] > 0 and r["dynamic_loop_ms"] > 0
        # the two versions took turns, every round kept, the best reported
        assert len(r["static_rounds"]) == len(r["dynamic_loop_rounds"]) == 3
        assert r["dynamic_ms"] == min(r["dynamic_rounds"])
        # the dynamic version compiled once for both batch sizes
        assert r["graphs"] == 1
    assert "| softmax |" in (tmp_path / "dynamic_smoke.md").read_text()


def test_warm_start_benchmark_measures_cold_and_warm(tmp_path: Path) -> None:
    out = tmp_path / "warm.json"
    proc = _run(str(BENCH / "warm_start.py"), "--device", "cpu", "--small", "--only", "softmax", "--top", "5",
                "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["errors"] == {} and row["cold_s"] > 0 and row["warm_s"] > 0 and "cumulative" in row["profile"]


def test_cache_hit_child_gets_the_compile_environment_of_the_cold_compile(monkeypatch) -> None:
    """run.py's torchfuse hit child sets each workload's compile-related variables to what its
    cold compile saw: a variable torch.compile set in the parent later is dropped, one it
    changed is restored, the others stay."""
    sys.path.insert(0, str(BENCH))
    try:
        import run
    finally:
        sys.path.remove(str(BENCH))
    for key, value in run._compile_env().items():  # restored after the test, whatever it deletes
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/set/later/by/another/compiler")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/changed")
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "kept")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run._apply_compile_env({"TRITON_CACHE_DIR": "/cold", "TRITON_INTERPRET": "1"})
    assert "TRITON_PTXAS_PATH" not in os.environ
    assert os.environ["TRITON_CACHE_DIR"] == "/cold" and os.environ["TRITON_INTERPRET"] == "1"
    assert os.environ["HOME_OF_SOMETHING_ELSE"] == "kept"
