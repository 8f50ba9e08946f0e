"""``models.py --isolate``: every compiler of a row in a process of its own.

In one process, whatever a compiler leaves behind is there when the next one is timed: a
torchfuse ResNet-50 training step measured 10.6 ms with no torch.compile in its process and
19.3 ms right after torch.compile had compiled and timed the same model (runs
``models_gpu_20261202_1850_r2`` and ``models_gpu_20261202_1842``, H200; the cause was not
found). A user runs one compiler per process, so with ``--isolate`` each compiled variant of a
row runs in a fresh child (``models.py`` itself, for that one row, with the other compiler
skipped), which also times eager and checks the variant against it. The parent merges the
children's cells into one row: the ``eager`` cell is the first child's, and each compiler's
``speedup`` is over the eager time measured in its own child (``eager_ms_same_process``), so a
difference between the two processes' eager times moves neither ratio.
Each row's children get compile caches of their own (a folder per row under the run's cache
root), so every row's first call is a cold compile; until 2026-12-04 the rows of a run shared
one, and a row could reuse kernels an earlier row had compiled.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_OTHER = {"torch_compile": "--skip-torchfuse", "torchfuse": "--skip-compile"}


def child_argv(args: argparse.Namespace, name: str, mode: str, variant: str, out: str,
               cache_root: str) -> list[str]:
    """The ``models.py`` command line of the child that times ``variant`` on one row."""
    argv = [sys.executable, str(HERE / "models.py"), "--only", name, "--mode", mode, "--tag", variant,
            "--out", out, "--no-plot", "--cache-dir", cache_root, "--device", args.device,
            "--backend", args.backend, "--warmup-ms", str(args.warmup_ms), "--rep-ms", str(args.rep_ms),
            "--variant-timeout-s", str(args.variant_timeout_s), _OTHER[variant]]
    for flag in ("small", "no_explain"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    for opt in ("options", "tf_mode", "compile_mode"):
        if getattr(args, opt):
            argv += ["--" + opt.replace("_", "-"), getattr(args, opt)]
    return argv


def run_row_isolated(name: str, mode: str, variants: list[str], args: argparse.Namespace,
                     cache_root: str) -> dict[str, Any]:
    """One row, each compiled variant in its own child process (see the module doc)."""
    row: dict[str, Any] | None = None
    errors: dict[str, str] = {}
    limit = 2 * args.variant_timeout_s + 300  # build + eager + compile + timing + explain
    # caches of a row's own: a row's first call is cold in every compiler's caches, not warm
    # with the kernels an earlier row compiled (ResNet-50 after ResNet-18, say)
    row_cache = str(Path(cache_root) / f"{name}_{mode}")
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="models_child_") as out:
            argv = child_argv(args, name, mode, variant, out, row_cache)
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                errors[variant] = f"child process timed out after {limit:.0f} s"
                continue
            path = Path(out) / f"models_{variant}.json"
            if proc.returncode != 0 or not path.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                errors[variant] = f"child process failed (rc={proc.returncode}): {' | '.join(tail)}"[:400]
                continue
            child = json.loads(path.read_text())["rows"][0]
        cells = child.get("results", {})
        if row is None:
            row = child
            row["isolated"] = True
        elif child.get("error"):
            errors[variant] = child["error"]
        cell = cells.get(variant)
        if cell is None:
            continue
        eager_ms = cells.get("eager", {}).get("ms")
        cell["eager_ms_same_process"] = eager_ms
        if eager_ms and cell.get("ms"):
            cell["speedup"] = eager_ms / cell["ms"]
        row["results"][variant] = cell
    if row is None:
        return {"name": name, "mode": mode, "training": mode == "training", "results": {},
                "error": "; ".join(f"{v}: {e}" for v, e in errors.items())}
    for variant, err in errors.items():
        row["results"].setdefault(variant, {"ms": None, "error": err})
    return row
