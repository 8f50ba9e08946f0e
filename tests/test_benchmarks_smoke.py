"""Smoke test of the benchmark runner: a tiny CPU run must produce a well-formed result file.

The torchfuse column may hold errors while the pipeline is being built; the eager column and the
structure of the JSON must be right regardless.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert len(names) == len(set(names)) == 21
    import torch

    for wl in workloads.WORKLOADS:
        # a row added since the published table was measured has no reference numbers yet
        assert wl.reference is not None or wl.name in workloads.UNMEASURED
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


def test_compile_profile_warm_shows_a_warm_process_hitting_every_cache(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "compile_profile.py"), "--warm", "--small", "--device", "cpu", "--only",
                "layer_norm_train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| row |")).strip("|").split("|")
    cells = {line.split("|")[1].strip(): line.strip("|").split("|") for line in lines
             if line.startswith("| layer_norm_train")}
    col = {name.strip(): i for i, name in enumerate(head)}

    def count(row: str, name: str) -> int:
        text = cells[row][col[name]].strip()
        return int(text) if text else 0

    assert count("layer_norm_train cold", "prog miss") == 2 and count("layer_norm_train cold", "aot miss") == 1
    assert count("layer_norm_train warm", "prog hit") == 2 and count("layer_norm_train warm", "aot hit") == 1
    assert count("layer_norm_train warm", "prog miss") == 0 and count("layer_norm_train warm", "aot miss") == 0
    assert cells["layer_norm_train warm"][col["inductor"]].strip() == "", "a warm process ran inductor passes"
    assert "warm / cold" in proc.stdout


def test_compile_profile_repeats_under_both_collector_settings() -> None:
    proc = _run(str(BENCH / "compile_profile.py"), "--small", "--only", "softmax", "--repeat", "2",
                "--gc-pause", "on,off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| softmax")]
    assert rows == ["softmax gc=on", "softmax gc=off"]
    assert proc.stderr.count("softmax gc=off:") == 2, "each setting runs --repeat times"


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


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_models_benchmark_small_cpu_run(tmp_path: Path) -> None:
    """benchmarks/models.py on tiny configs: one text and one vision model, both modes, eager and
    torchfuse (aot_eager: no Triton interpreter); every row and field there, whatever torchfuse
    captured (zero graphs is an eager-fallback row, not a failure)."""
    proc = _run(str(BENCH / "models.py"), "--small", "--device", "cpu", "--only", "gpt2,vit",
                "--backend", "aot_eager", "--skip-compile", "--tag", "smoke", "--out", str(tmp_path),
                "--cache-dir", str(tmp_path / "caches"), "--rep-ms", "5", "--warmup-ms", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "models_smoke.json").read_text())
    assert doc["schema"] == "torchfuse-models/1" and doc["tag"] == "smoke"
    assert doc["environment"]["transformers"] and doc["environment"]["device_type"] == "cpu"
    assert doc["config"]["backend"] == "aot_eager" and doc["config"]["small"] is True
    assert doc["config"]["variants"] == ["eager", "torchfuse"]
    rows = doc["rows"]
    assert [(r["name"], r["mode"]) for r in rows] == [
        ("gpt2", "inference"), ("vit", "inference"), ("gpt2", "training"), ("vit", "training")]
    for r in rows:
        assert "error" not in r, r
        assert r["training"] is (r["mode"] == "training") and r["scale"] == "small"
        assert r["attn_implementation"] == "sdpa" and r["params_m"] > 0 and r["shapes"]
        assert set(r["results"]) == {"eager", "torchfuse"}
        eager, tf = r["results"]["eager"], r["results"]["torchfuse"]
        assert eager["error"] is None and eager["ms"] > 0 and eager["speedup"] == 1.0
        assert isinstance(tf["eager_fallback"], bool)
        # explain ran: its counts, or why not
        assert isinstance(tf.get("graph_count"), int) or tf.get("explain_error")
        if "graph_count" in tf:
            assert tf["graph_break_count"] == len(tf["break_reasons"]) or len(tf["break_reasons"]) == 8
            assert tf["eager_fallback"] == (min(tf["graph_count"], tf.get("graphs_compiled", 1)) == 0)
        if tf["error"] is None:  # measured, and compared with eager
            assert tf["ms"] > 0 and tf["compile_s"] >= 0 and tf["speedup"] > 0
            assert tf["check"] == "ok" or tf["check"].startswith("MISMATCH")
            if tf["check"] == "ok":
                assert tf["err_logits"] >= 0
                if r["training"]:
                    assert tf["err_loss"] >= 0 and tf["err_grads"] >= 0
        else:
            assert isinstance(tf["error"], str) and tf["error"]
    summary = doc["summary"]
    for mode in ("inference", "training"):
        assert set(summary[mode]) == {"torch_compile", "torchfuse", "common"}
        assert summary[mode]["torch_compile"]["n"] == 0
        assert {"geomean_speedup", "n", "n_captured", "eager_fallback"} <= set(summary[mode]["torchfuse"])
    assert summary["errors"]["eager"] == []
    md = (tmp_path / "models_smoke.md").read_text()
    assert "## inference" in md and "## training" in md and "| gpt2 |" in md and "| vit |" in md


def test_models_report_flags_eager_fallback() -> None:
    """A torchfuse cell with zero graphs is flagged in the table and left out of the captured
    geometric mean (it ran eagerly: its speedup says nothing about the compiler)."""
    sys.path.insert(0, str(BENCH))
    try:
        import models_report
    finally:
        sys.path.remove(str(BENCH))

    def row(name: str, tf_ms: float, graphs: int) -> dict:
        return {"name": name, "mode": "inference", "training": False, "results": {
            "eager": {"ms": 2.0, "error": None, "speedup": 1.0},
            "torch_compile": {"ms": 1.0, "error": None, "speedup": 2.0, "check": "ok", "graphs": 1,
                              "graph_breaks": 0},
            "torchfuse": {"ms": tf_ms, "error": None, "speedup": 2.0 / tf_ms, "check": "ok",
                          "graph_count": graphs, "graph_break_count": 1 - graphs, "graphs_compiled": graphs,
                          "eager_fallback": graphs == 0, "err_logits": 0.0}}}

    doc = {"rows": [row("a", 0.5, 1), row("b", 2.0, 0)]}
    doc["summary"] = summary = models_report.summarize(doc["rows"])
    tf = summary["inference"]["torchfuse"]
    assert tf["n"] == 2 and tf["geomean_speedup"] == pytest.approx(2.0)  # sqrt(4 × 1)
    assert tf["n_captured"] == 1 and tf["geomean_speedup_captured"] == pytest.approx(4.0)
    assert tf["eager_fallback"] == ["b"]
    assert summary["inference"]["torch_compile"]["geomean_speedup"] == pytest.approx(2.0)
    text = "\n".join(models_report.table(doc, "inference"))
    assert "| b |" in text and "0/1 EAGER FALLBACK" in text and "eager fallback (0 graphs captured)" in text


def test_models_check_against_the_float32_step() -> None:
    """A bf16 training step that differs from eager's bf16 step passes when it is no further
    from the float32 step than twice eager's own error, and fails when one gradient is."""
    import torch

    sys.path.insert(0, str(BENCH))
    try:
        import models
    finally:
        sys.path.remove(str(BENCH))
    g = torch.Generator().manual_seed(0)

    def noisy(t: torch.Tensor, rel: float) -> torch.Tensor:
        return t + rel * t.norm() / t.numel() ** 0.5 * torch.randn(t.shape, generator=g)

    ref = (torch.tensor(2.0), torch.randn(4, 10, generator=g),
           (torch.randn(16, 8, generator=g), torch.randn(8, generator=g)))
    eager = (ref[0] * 1.01, noisy(ref[1], 0.05), tuple(noisy(t, 0.4) for t in ref[2]))
    close = (ref[0] * 0.99, noisy(ref[1], 0.06), tuple(noisy(t, 0.5) for t in ref[2]))
    verdict = models.judge_by_reference(ref, eager, close, True, ["w", "b"])
    assert verdict.startswith("ok (vs float32"), verdict
    wrong = (close[0], close[1], (close[2][0], -ref[2][1]))  # one gradient with its sign flipped
    verdict = models.judge_by_reference(ref, eager, wrong, True, ["w", "b"])
    assert verdict.startswith("MISMATCH: gradient of b"), verdict
    # inference: the logits alone
    assert models.judge_by_reference(ref[1], eager[1], close[1], False, []).startswith("ok")
    assert models.judge_by_reference(ref[1], eager[1], ref[1] + 1.0, False, []).startswith("MISMATCH: logits")


def test_compile_profile_hashes_repeat_across_processes_and_retarget_skips_the_load(tmp_path: Path) -> None:
    """Two processes hash the same graphs and Programs alike (what makes ``--hashes`` a
    before/after check); ``--retarget`` compiles the training halves for the GPU, unloaded."""
    files = [tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cuda.json"]
    for path, extra in zip(files, ([], [], ["--retarget", "cuda:0"]), strict=True):
        proc = _run(str(BENCH / "compile_profile.py"), "--small", "--only", "layer_norm_train",
                    "--hashes", str(path), *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b, cuda = (json.loads(p.read_text()) for p in files)
    assert a[0][0].startswith("captured ")
    assert any(w.startswith("program ") for w, _ in a) and a == b
    assert [w for w, _ in cuda] == [w for w, _ in a]
    programs = [(x, y) for x, y in zip(a, cuda, strict=True) if x[0].startswith("program ")]
    assert all(x[1] != y[1] for x, y in programs), "a retargeted Program is another Program"
    head = next(line for line in proc.stdout.splitlines() if line.startswith("| workload |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert "schedule" in cols and "load" not in cols


def test_compile_profile_pool_makespan_hands_out_the_longest_compiles_first() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import compile_profile
    finally:
        sys.path.remove(str(BENCH))
    assert compile_profile.pool_makespan([], 4) == 0.0
    assert compile_profile.pool_makespan([1, 1, 1, 1, 1, 5], 2) == 5.0  # the 5 s one alone
    assert compile_profile.pool_makespan([2, 3, 2, 3, 2], 2) == 7.0  # longest first, not optimal
    assert compile_profile.pool_makespan([1.5, 2.5], 1) == 4.0


def test_compile_targets_measures_both_compilers_and_judges_the_targets(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "compile_targets.py"), "--device", "cpu", "--small", "--only", "softmax",
                "--out", str(tmp_path), "--tag", "smoke", "--timeout", "240")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc["schema"] == "torchfuse-compile-targets/1"
    (row,) = doc["rows"]
    assert row["row"] == "softmax" and row["tc_cold_s"] > 0 and row["tf_cold_s"] > 0 and row["tf_warm_s"] > 0
    assert row["tf_cold_over_tc"] == pytest.approx(row["tf_cold_s"] / row["tc_cold_s"])
    warm = row["tf_stages"]["softmax warm"]["counts"]
    assert warm.get("inductor.cache.program_hits") == 1 and not warm.get("inductor.cache.program_misses")
    text = (tmp_path / "smoke.md").read_text()
    assert "| softmax |" in text and "targets: cold <= 50%" in text and "| softmax warm |" in text


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="two slots need two cores")
def test_compile_targets_slots_run_rows_at_once_on_their_own_cores(tmp_path: Path) -> None:
    proc = _run(str(BENCH / "compile_targets.py"), "--device", "cpu", "--small", "--only", "softmax,cross_entropy",
                "--slots", "2", "--skip-tc", "--out", str(tmp_path), "--tag", "slots", "--timeout", "240")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "slots.json").read_text())
    assert [r["row"] for r in doc["rows"]] == ["softmax", "cross_entropy"]  # the rows' order, not the slots'
    assert sorted(r["slot"] for r in doc["rows"]) == [0, 1] and all(r["tf_warm_s"] > 0 for r in doc["rows"])
    if len(os.sched_getaffinity(0)) == 2:  # each slot ran on one of the two cores
        assert [r["slot_cores"] for r in doc["rows"]] == [1, 1]
    slots = {s["slot"]: s for s in doc["slots"]}
    assert slots[0]["cores"] != slots[1]["cores"] and slots[0]["rows"] != slots[1]["rows"]
    assert "[slot 0]" in proc.stderr and "[slot 1]" in proc.stderr  # each slot's progress, labelled


def test_targets_slots_deal_rows_longest_first_and_split_cores() -> None:
    spec = importlib.util.spec_from_file_location("targets_slots", BENCH / "targets_slots.py")
    slots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(slots)
    names = ["softmax", "gpt2/inference", "gpt2/training", "bert/training", "vit/inference"]
    dealt = slots.deal(names, 2)
    assert sorted(n for part in dealt for n in part) == sorted(names)  # every row once
    # the training rows first, one per slot, then each inference row onto the lighter slot
    assert dealt == [["softmax", "gpt2/inference", "gpt2/training"], ["bert/training", "vit/inference"]]
    assert slots.deal(["softmax"], 3) == [["softmax"], [], []]
    *per_slot, total = slots.plan(names, 2)
    assert len(per_slot) == 2 and per_slot[0].startswith("slot 0: 3.8 min: softmax")
    assert total.startswith("5 rows, 6.9 min of rows in all; the run takes about 3.8 min over 2 slot(s)")
    cores = slots.core_sets(1)
    assert cores == [sorted(os.sched_getaffinity(0))]
    with pytest.raises(SystemExit, match="fewer than the slots"):
        slots.core_sets(len(cores[0]) + 1)


def _targets_doc(tag: str, date: str, rows: list[tuple[str, float, float, float]], **env: str) -> dict:
    return {"schema": "torchfuse-compile-targets/1", "tag": tag,
            "environment": {"device": "cuda", "gpu": "NVIDIA H100", "date": date, **env},
            "rows": [{"row": name, "tc_cold_s": tc, "tf_cold_s": cold, "tf_warm_s": warm,
                      "tf_cold_over_tc": cold / tc, "tf_warm_over_cold": warm / cold, "tf_stages": {}}
                     for name, tc, cold, warm in rows]}


def test_compile_targets_collect_keeps_each_rows_latest_default_run(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("compile_targets", BENCH / "compile_targets.py")
    targets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(targets)
    docs = {"old": _targets_doc("old", "2026-12-07T10:00", [("softmax", 1.0, 0.4, 0.1), ("rope", 1.0, 0.2, 0.01)]),
            "new": _targets_doc("new", "2026-12-07T11:00", [("softmax", 1.0, 0.3, 0.01)]),
            # later, but under a setting of its own: an experiment, not the compiler's default
            "exp": _targets_doc("exp", "2026-12-07T12:00", [("softmax", 1.0, 0.9, 0.5)],
                                TORCHFUSE_CHANNELS_LAST="never")}
    for name, doc in docs.items():
        (tmp_path / f"compile_targets_{name}.json").write_text(json.dumps(doc))
    lines = targets.collect(tmp_path)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.endswith("(H100) |")}
    assert set(rows) == {"softmax", "rope"}
    assert "new (H100)" in rows["softmax"] and "| 3.3% ok |" in rows["softmax"]
    assert "old (H100)" in rows["rope"] and "| 5.0% ok |" in rows["rope"]
    assert not any("exp (" in line for line in lines)
    assert "2 rows: cold <= 50% of torch.compile's on 2, warm <= 15% of cold on 2" in "\n".join(lines)
    assert any(line.startswith("micro rows never measured:") and "softmax" not in line for line in lines)
