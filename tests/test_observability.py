"""The one debug switch and the one log switch, end to end (DESIGN §6).

A training call with ``TORCHFUSE_DEBUG=1`` writes, per compiled entry,
``torchfuse_debug/run_<time>/<function>/entry_<n>/`` with the captured graph, guards,
joint/forward/backward graphs, pre/post-fusion IR, output code and stage timings; a recompile
gets the next entry folder and overwrites nothing. ``TORCHFUSE_LOGS`` channels print
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
    import sys
    import torch, torchfuse.capture as tfc

    def seed(x, y):
        return torch.nn.functional.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean()

    x = torch.randn(8, 16, requires_grad=True)
    y = torch.randn(8, 16)
    compiled = tfc.compile(seed)
    out = compiled(x, y)
    out.backward()
    if len(sys.argv) > 1:  # a recompile: another size
        compiled(torch.randn(4, 16, requires_grad=True), torch.randn(4, 16)).backward()
    print("OK", float(out))
""")


def _run(tmp_path, *args, **env):
    full = {**os.environ, "TRITON_INTERPRET": "1", "TORCHFUSE_CACHE_DIR": str(tmp_path / "cache"), **env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK")
    return proc


def test_debug_directory_has_every_stage(tmp_path):
    _run(tmp_path, "recompile", TORCHFUSE_DEBUG="1")
    (run_dir,) = (tmp_path / "torchfuse_debug").iterdir()
    assert run_dir.name.startswith("run_")
    assert sorted(p.name for p in (run_dir / "seed").iterdir()) == ["entry_0", "entry_1"]
    graph_dir = run_dir / "seed" / "entry_0"
    files = {p.name for p in graph_dir.iterdir()}
    expected = {"graph.py", "guards.txt", "joint.py", "forward.py", "backward.py",
                "ir_pre_fusion.txt", "ir_post_fusion.txt", "output_code.py", "timings.json",
                "timings.txt",
                "backward_ir_pre_fusion.txt", "backward_ir_post_fusion.txt", "backward_output_code.py"}
    assert expected <= files, sorted(files)
    assert "aten.silu.default" in (graph_dir / "graph.py").read_text()
    assert "requires_grad=True" in (graph_dir / "guards.txt").read_text()
    # the CPU default: C++ kernels, and the debug files say which code generator wrote them
    assert 'extern "C" void cpp_' in (graph_dir / "output_code.py").read_text()
    assert (graph_dir / "fusion.txt").read_text().startswith("kernels: cpp (")
    timings = json.loads((graph_dir / "timings.json").read_text())
    assert "capture" in timings["stages_s"]
    assert any(k.startswith("inductor.") for k in timings["stages_s"])
    assert any(k.startswith("backward.inductor.") for k in timings["stages_s"])
    assert "runtime.load" in timings["stages_s"]
    table = (graph_dir / "timings.txt").read_text()
    assert "capture" in table and "inductor.schedule" in table and "total" in table
    # the recompile's entry has its own graph (the new size) and its own timings
    second = run_dir / "seed" / "entry_1"
    assert "[8, 16]" in (graph_dir / "graph.py").read_text()
    assert "[8, 16]" not in (second / "graph.py").read_text()
    assert json.loads((second / "timings.json").read_text())["stages_s"]["capture"] != \
        timings["stages_s"]["capture"]
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
