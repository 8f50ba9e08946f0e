"""pytest setup for the distributed suite: ``run_ranks`` launches a case of ``workers.py`` on
two CPU processes (the ``gloo`` backend on 127.0.0.1, a free port picked per launch) and
fails the test, never hangs, when the ranks do not finish in time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("workers.py")
TIMEOUT_S = 240
"""Per launch of one case: two fresh interpreters import torch and torchfuse, then run a few
tiny steps."""
LAUNCH_TIMEOUT_S = 600
"""The launch of every CPU case at once (about a minute on an idle 2-core machine)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, tmp_path: Path, world: int = 2, timeout: float = TIMEOUT_S,
           env: dict[str, str] | None = None) -> list[dict]:
    """Run ``case`` on ``world`` ranks; each rank's JSON result, in rank order."""
    port = free_port()
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([*sys.path, full_env.get("PYTHONPATH", "")])
    procs = []
    logs = []
    for rank in range(world):
        log = open(tmp_path / f"rank{rank}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), case, str(rank), str(world), str(port), str(tmp_path)],
            stdout=log, stderr=subprocess.STDOUT, env=full_env))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        pytest.fail(f"case {case!r} did not finish in {timeout} s\n{_tails(logs)}")
    finally:
        for log in logs:
            log.flush()
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    text = _tails(logs)
    for log in logs:
        log.close()
    if failed:
        pytest.fail(f"case {case!r}: rank(s) {failed} failed\n{text}")
    return [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(world)]


def _tails(logs: list) -> str:
    out = []
    for rank, log in enumerate(logs):
        log.seek(0)
        out.append(f"--- rank {rank} ---\n{log.read()[-6000:]}")
    return "\n".join(out)


CPU_CASES = ("ddp_both_ways", "ddp_gpt2", "ddp_overlap", "ddp_no_split", "ddp_no_sync",
             "ddp_unused", "ddp_static_graph", "ddp_inductor", "ranks_differ", "fsdp",
             "rank_missing")
"""Run in one launch per test session (per xdist worker): two interpreters start once.
``rank_missing`` comes last: only rank 0 compiles there, and the ranks count their DDP graphs
(`torchfuse.capture.distributed.check_ranks`) out of step from then on."""


@pytest.fixture(scope="session")
def _cpu_results(tmp_path_factory) -> list[dict]:
    return launch(",".join(CPU_CASES), tmp_path_factory.mktemp("ranks"), timeout=LAUNCH_TIMEOUT_S)


@pytest.fixture
def case_results(_cpu_results):
    """``case_results(name)``: each rank's result of one case of `CPU_CASES`; the test fails
    with the ranks' tracebacks when the case raised."""
    def get(case: str) -> list[dict]:
        results = [r[case] for r in _cpu_results]
        errors = [f"--- rank {rank} ---\n{r['error']}" for rank, r in enumerate(results) if "error" in r]
        if errors:
            pytest.fail(f"case {case!r} failed\n" + "\n".join(errors))
        return results
    return get


@pytest.fixture
def run_ranks(tmp_path):
    """``run_ranks(case, env=...)``: one case in a launch of its own; each rank's result."""
    def run(case: str, **kw) -> list[dict]:
        return [r[case] for r in launch(case, tmp_path, **kw)]
    return run
