"""The Program: launch convention, archives, debug artifacts, standalone output_code.py."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from inductor_helpers import assert_matches, compile_fn, run_runtime
from torchfuse.graph import load, save, trace
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.inductor import DEBUG_FILES, PASSES, compile_graph, compile_graph_stages, write_debug


def seed_fn(x, y):
    return F.silu(torch.relu((x + y) * 2.0)).sum(dim=1).mean()


def test_launch_steps_follow_the_convention(cpu_backend):
    x = torch.randn(4, 8)
    program = compile_fn(lambda x: (x.softmax(-1), (x * 2).sum(0), x + 1), x)
    kernels = {k.name: k for k in program.kernels}
    buffers = {b.name for b in program.buffers}
    launches = [s for s in program.steps if isinstance(s, S.LaunchStep)]
    assert launches
    for step in launches:
        k = kernels[step.kernel]
        assert k.language == cpu_backend
        assert len(step.args) == len(k.signature)
        for arg, param in zip(step.args, k.signature, strict=True):
            if param.kind == "ptr":
                assert isinstance(arg, S.TensorRef) and arg.name in buffers
            else:
                assert isinstance(arg, S.Int | S.SymRef)
        if cpu_backend == "cpp":  # a C function: no grid, no launch configs
            assert not k.configs and not step.grid
            assert f'extern "C" void {k.entry}(' in k.source
            continue
        assert k.configs, "every kernel offers launch configs"
        for cfg in k.configs:
            grid = [evaluate(g, dict(cfg.meta)) if isinstance(g, str) else g for g in (step.grid or k.grid)]
            assert all(isinstance(g, int) and g >= 1 for g in grid)
        assert f"def {k.entry}(" in k.source and "import triton.language as tl" in k.source


def test_program_round_trips_through_an_archive(tmp_path):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    program = compile_fn(seed_fn, x, y)
    save(program, tmp_path / "seed")
    loaded = load(tmp_path / "seed")
    assert loaded == program
    assert_matches(run_runtime(loaded, [x, y]), seed_fn(x, y), atol=1e-5, rtol=1e-5)


def test_stages_and_debug_artifacts(tmp_path):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    graph, _ = trace(seed_fn, x, y)
    result = compile_graph_stages(graph, [x, y])
    assert [s.name for s in result.stages] == [name for name, _ in PASSES]
    assert all(s.seconds >= 0 for s in result.stages)
    written = write_debug(result.program, tmp_path)
    assert sorted(os.path.basename(p) for p in written) == sorted(DEBUG_FILES)
    pre = (tmp_path / "ir_pre_fusion.txt").read_text()
    post = (tmp_path / "ir_post_fusion.txt").read_text()
    assert "Reduction" in pre and "kernel 0 [per]" in post


def test_output_code_runs_standalone(tmp_path):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    program = compile_fn(lambda x, y: (seed_fn(x, y), x @ y.t()), x, y)
    path = tmp_path / "output_code.py"
    path.write_text(program.meta["output_code.py"])
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "torch.Size([])" in proc.stdout and "torch.Size([4, 4])" in proc.stdout


def test_runtime_and_output_code_agree():
    x = torch.randn(6, 10)
    fn = lambda x: (F.layer_norm(x, (10,)), x.t().contiguous(), x[::2].sum(1))
    program = compile_fn(fn, x)
    assert_matches(run_runtime(program, [x]), fn(x), atol=1e-5, rtol=1e-5)


def test_symbolic_sizes_serve_several_shapes():
    import msgspec

    x = torch.randn(7, 5)
    fn = lambda x, y: ((x * y).sum(1), (x.exp() + y).sum(0), (x + y).relu())
    graph, _ = trace(fn, x, x)
    values = {
        k: msgspec.structs.replace(m, sizes=tuple("s0" if s == 7 else s for s in m.sizes))
        for k, m in graph.values.items()
    }
    graph = msgspec.structs.replace(
        graph, values=values, symbols=(S.Symbol(name="s0", min=2, hint=7, source="input:0.size(0)"),)
    )
    program = compile_graph(graph)
    for n in (7, 3, 12):
        a, b = torch.randn(n, 5), torch.randn(n, 5)
        assert_matches(run_runtime(program, [a, b]), fn(a, b), atol=1e-5, rtol=1e-5)


def test_config_from_env_and_logs(capsys):
    from torchfuse.inductor.config import from_environment

    cfg = from_environment({"TORCHFUSE_LOGS": "schedule, output_code", "TORCHFUSE_DEBUG": "1"})
    assert cfg.logs == {"schedule", "output_code"} and cfg.debug
    assert cfg.pad_mm and cfg.mm_templates == "auto" and cfg.pointwise_rows == 0
    cfg = from_environment({"TORCHFUSE_PAD_MM": "0", "TORCHFUSE_MM_TEMPLATES": "never", "TORCHFUSE_POINTWISE_ROWS": "1024"})
    assert not cfg.pad_mm and cfg.mm_templates == "never" and cfg.pointwise_rows == 1024
    x = torch.randn(4, 8)
    compile_fn(lambda x: x.softmax(-1), x, options={"logs": frozenset({"schedule", "output_code"})})
    text = capsys.readouterr().err
    assert "[torchfuse.schedule]" in text and "[torchfuse.output_code]" in text
    assert "kernel 0 [per]" in text and "def call(*args):" in text


def test_debug_env_writes_artifacts(tmp_path):
    x = torch.randn(4, 8)
    compile_fn(lambda x: x.relu(), x, options={"debug": True, "debug_dir": str(tmp_path)})
    (run_dir,) = list(tmp_path.iterdir())
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(DEBUG_FILES)


def test_fusion_decisions_carry_their_reasons():
    """``fusion.txt`` answers "why were these not fused?"; the schedule verifier ran."""
    def fn(x):
        s = x.sum(1, keepdim=True)
        return x / s, torch.cumsum(x, 0) + s

    program = compile_fn(fn, torch.randn(8, 16))
    text = program.meta["fusion.txt"]
    assert "fused into the kernel of" in text
    assert "not fused into the kernel of buf" in text and ": it is an extern call" in text
    assert "fusion.txt" in DEBUG_FILES


def test_schedule_verifier_catches_a_lost_node_and_an_unstored_value():
    import dataclasses

    import pytest
    from torchfuse.inductor.scheduler import ScheduleVerifyError, verify_schedule

    graph, _ = trace(lambda x: (x.exp().sum(1), x.exp() + 1), torch.randn(4, 8))
    stages = {s.name: s.value for s in compile_graph_stages(graph).stages}
    prog, sched = stages["dead_code"], stages["schedule"]
    assert verify_schedule(sched, prog) is sched
    with pytest.raises(ScheduleVerifyError, match="in no kernel"):
        verify_schedule(dataclasses.replace(sched, groups=sched.groups[1:]), prog)
    g = sched.groups[0]
    with pytest.raises(ScheduleVerifyError, match="in registers"):
        verify_schedule(dataclasses.replace(sched, groups=(dataclasses.replace(g, stores=frozenset()),
                                                           *sched.groups[1:])), prog)
