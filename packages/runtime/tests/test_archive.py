"""Saving and loading Program archives, and running one with only graph + runtime importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import runtime_programs as P
import torch
from torchfuse.graph import load as load_document
from torchfuse.runtime import load

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")


@pytest.mark.parametrize("suffix", [".zip", ""])
def test_save_load_round_trip(tmp_path, suffix):
    fn = load(P.mixed_program("cpu"))
    path = fn.save(tmp_path / f"mixed{suffix}")
    assert load_document(path) == fn.program
    again = load(path)
    x, y, w = torch.randn(3, 7), torch.randn(3, 7), torch.randn(7, 8)
    for a, b in zip(again(x, y, w), fn(x, y, w), strict=True):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
    manifest = json.loads((path / "manifest.json").read_text()) if path.is_dir() else None
    if manifest is not None:
        assert manifest["kind"] == "program" and manifest["producer"] == "torchfuse-runtime"


def test_archive_tensors_survive_a_round_trip(tmp_path):
    from torchfuse.graph import load_archive, save

    w = torch.randn(4, 4)
    path = save(P.mixed_program("cpu"), tmp_path / "with_weights.zip", tensors={"w": w})
    fn = load(path)
    assert set(fn.tensors) == {"w"}
    again = fn.save(tmp_path / "resaved.zip")
    torch.testing.assert_close(load_archive(again).tensors["w"], w)


# The child blocks the other torchfuse packages before anything is imported, then runs the
# archive and checks it against eager; it prints JSON so the parent can assert on it.
_CHILD = textwrap.dedent("""
    import importlib.abc, json, sys

    BLOCKED = ("torchfuse.capture", "torchfuse.autograd", "torchfuse.inductor")

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in BLOCKED or name.startswith(tuple(b + "." for b in BLOCKED)):
                raise ImportError(f"{name} is blocked in this standalone test")
            return None

    sys.meta_path.insert(0, Blocker())
    import torch
    from torchfuse.runtime import load

    path = sys.argv[1]
    fn = load(path, device="cpu")
    torch.manual_seed(0)
    x, y, w = torch.randn(5, 9), torch.randn(5, 9), torch.randn(9, 8)
    got = fn(x, y, w)
    s = x + y
    want = [s.sum(1), s @ w, (2 * x).t()]
    ok = all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got[:3], want)) and got[3] == 45
    blocked = []
    for name in BLOCKED:
        try:
            __import__(name)
        except ImportError:
            blocked.append(name)
    loaded = sorted(m for m in sys.modules if m.startswith(BLOCKED))
    print(json.dumps({"ok": ok, "blocked": blocked, "loaded": loaded}))
""")


def test_archive_runs_standalone_in_a_subprocess(tmp_path, cache_dir):
    path = load(P.mixed_program("cuda"), device="cpu").save(tmp_path / "standalone.zip")
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHFUSE_CACHE_DIR=str(cache_dir), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"ok": True, "blocked": ["torchfuse.capture", "torchfuse.autograd", "torchfuse.inductor"],
                      "loaded": []}
