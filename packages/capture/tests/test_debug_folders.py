"""``TORCHFUSE_DEBUG``: one folder per compiled entry, never overwritten (issue #21)."""

from __future__ import annotations

import json

import torch
from torchfuse.capture import compile
from torchfuse.graph import observe


def test_recompiles_and_namesakes_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFUSE_DEBUG", "1")
    monkeypatch.setenv("TORCHFUSE_DEBUG_DIR", str(tmp_path))
    observe.reload_config()
    try:
        def f(x):
            return x.sin() + 1

        cf = compile(f, backend="eager", dynamic=False)
        cf(torch.randn(2))
        cf(torch.randn(3))  # a size change: a second entry
        cf(torch.randn(2, 2))  # and a third
        double, triple = (lambda x: x * 2), (lambda x: x * 3)
        compile(double, backend="eager")(torch.randn(2))
        compile(triple, backend="eager")(torch.randn(2))
    finally:
        monkeypatch.delenv("TORCHFUSE_DEBUG")
        observe.reload_config()
    (run,) = tmp_path.iterdir()
    entries = sorted(str(p.parent.relative_to(run)) for p in run.rglob("graph.py"))
    name = f"{test_recompiles_and_namesakes_get_their_own_folders.__name__}.f"
    lam = name[:-1] + "lambda"
    assert entries == sorted([f"{name}/entry_0", f"{name}/entry_1", f"{name}/entry_2",
                              f"{lam}/entry_0", f"{lam}_2/entry_0"])
    for i, shape in enumerate(["[2]", "[3]", "[2, 2]"]):
        folder = run / name / f"entry_{i}"
        assert shape in (folder / "graph.py").read_text()
        # the timings of each entry are its own, not the sum of every entry's
        stages = json.loads((folder / "timings.json").read_text())["stages_s"]
        assert list(stages) == ["capture"]
        assert "capture" in (folder / "timings.txt").read_text()
    assert "x * 2" in (run / lam / "entry_0/graph.py").read_text()
    assert "x * 3" in (run / f"{lam}_2/entry_0/graph.py").read_text()
