"""``python -m torchfuse.runtime``: print the generated source, warm the caches for an archive."""

from __future__ import annotations

import json

import pytest
import runtime_programs as P
import torch
from torchfuse.runtime import load
from torchfuse.runtime.__main__ import example_inputs, main

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


def test_example_inputs_fit_the_program():
    prog = P.mixed_program("cpu")
    x, y, w = example_inputs(prog, "cpu", {"s1": 5})
    assert x.shape == y.shape == (4, 5) and w.shape == (5, 8)  # s0 from its hint
    out = load(prog)(x, y, w)
    torch.testing.assert_close(out[0], (x + y).sum(1))


def test_cli_source_and_warm(tmp_path, capsys):
    path = load(P.mixed_program("cpu")).save(tmp_path / "m.zip")
    assert main(["source", str(path)]) == 0
    assert "def call(*args):" in capsys.readouterr().out
    assert main(["warm", str(path), "--size", "s0=3", "--size", "s1=6"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calls"] == 1 and report["kernel_launches"] == 4 and report["generated"] == 1
