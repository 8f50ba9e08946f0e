"""The one debug switch and the one log switch, end to end (DESIGN §6).

A training call with ``TORCHFUSE_DEBUG=1`` writes, per compiled graph,
``torchfuse_debug/run_<time>/<graph>/`` with the captured graph, guards, joint/forward/backward
graphs, pre/post-fusion IR, output code and stage timings. ``TORCHFUSE_LOGS`` channels print
``[torchfuse.<channel>]`` lines on stderr. Both run in a subprocess so the switches are read
from a fresh environment, as a user sets them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, torchfuse.capture as tfc

    def seed(x, y):
        return torch.nn.functional.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean()

    x = torch.randn(8, 16, requires_grad=True)
    y = torch.randn(8, 16)
    out = tfc.compile(seed)(x, y)
    out.backward()
    print("OK", float(out))
""")


def _run(tmp_path, **env):
    full = {**os.environ, "TRITON_INTERPRET": "1", "TORCHFUSE_CACHE_DIR": str(tmp_path / "cache"), **env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK")
    return proc


def test_debug_directory_has_every_stage(tmp_path):
    _run(tmp_path, TORCHFUSE_DEBUG="1")
    (run_dir,) = (tmp_path / "torchfuse_debug").iterdir()
    assert run_dir.name.startswith("run_")
    graph_dir = run_dir / "seed"
    files = {p.name for p in graph_dir.iterdir()}
    expected = {"graph.py", "guards.txt", "joint.py", "forward.py", "backward.py",
                "ir_pre_fusion.txt", "ir_post_fusion.txt", "output_code.py", "timings.json",
                "backward_ir_pre_fusion.txt", "backward_ir_post_fusion.txt", "backward_output_code.py"}
    assert expected <= files, sorted(files)
    assert "aten.silu.default" in (graph_dir / "graph.py").read_text()
    assert "requires_grad=True" in (graph_dir / "guards.txt").read_text()
    assert "@triton.jit" in (graph_dir / "output_code.py").read_text()
    timings = json.loads((graph_dir / "timings.json").read_text())
    assert "capture" in timings["stages_s"]
    assert any(k.startswith("inductor.") for k in timings["stages_s"])
    assert any(k.startswith("backward.inductor.") for k in timings["stages_s"])
    # the printed graph is runnable Python
    ns: dict = {}
    exec(compile((graph_dir / "graph.py").read_text(), "graph.py", "exec"), ns)
    assert callable(ns["seed"])


def test_log_channels_print_to_stderr(tmp_path):
    proc = _run(tmp_path, TORCHFUSE_LOGS="graph,guards,aot,schedule,output_code")
    for channel in ("graph", "guards", "aot", "schedule", "output_code"):
        assert f"[torchfuse.{channel}]" in proc.stderr, channel
    quiet = _run(tmp_path)
    assert "[torchfuse." not in quiet.stderr
