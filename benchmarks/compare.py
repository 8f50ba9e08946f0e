"""Diff two benchmark result files written by ``run.py``.

    python benchmarks/compare.py benchmarks/results/before.json benchmarks/results/after.json
    python benchmarks/compare.py a.json b.json --variant torchfuse --threshold 0.03

For every workload present in both files and every variant it prints the median time in A and
B and the change (negative = B is faster), flags changes larger than ``--threshold`` (default
5%), and lists cells whose status changed (error, mismatch) and compile-time changes. Exit
status 1 when ``--fail-on-regression`` is given and some time got slower than the threshold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VARIANTS = ("eager", "torch_compile", "torchfuse")


def load(path: str) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not str(doc.get("schema", "")).startswith("torchfuse-bench/"):
        raise SystemExit(f"{path}: not a torchfuse benchmark result (schema={doc.get('schema')!r})")
    return doc


def _status(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "absent"
    if cell.get("error"):
        return "error"
    if str(cell.get("check", "")).startswith("MISMATCH"):
        return "mismatch"
    return "ok" if cell.get("ms") is not None else "absent"


def _pct(a: float | None, b: float | None) -> float | None:
    return None if not a or b is None else 100.0 * (b - a) / a


def compare(a: dict[str, Any], b: dict[str, Any], variants: list[str],
            threshold: float) -> tuple[list[str], int]:
    """Lines of the report and the number of regressions beyond ``threshold``."""
    rows_a = {r["name"]: r for r in a["rows"] if "results" in r}
    rows_b = {r["name"]: r for r in b["rows"] if "results" in r}
    env_a, env_b = a["environment"], b["environment"]
    lines = [f"A = {a['tag']} ({env_a['device']}, {(env_a.get('git_commit') or '?')[:10]}, {env_a['date']})",
             f"B = {b['tag']} ({env_b['device']}, {(env_b.get('git_commit') or '?')[:10]}, {env_b['date']})"]
    if env_a["device"] != env_b["device"]:
        lines.append("warning: different devices; times are not comparable")
    lines.append(f"copy bandwidth: A {env_a['copy_gbps']:.0f} GB/s, B {env_b['copy_gbps']:.0f} GB/s")
    header = (f"{'workload':<24} {'variant':<14} {'A ms':>9} {'B ms':>9} {'change':>8}  "
              f"{'compile A→B s':>15}  note")
    lines += ["", header, "-" * len(header)]
    regressions = 0
    for name in [n for n in rows_a if n in rows_b]:
        for v in variants:
            ca, cb = rows_a[name]["results"].get(v), rows_b[name]["results"].get(v)
            if ca is None and cb is None:
                continue
            sa, sb = _status(ca), _status(cb)
            ms_a, ms_b = (ca or {}).get("ms"), (cb or {}).get("ms")
            change = _pct(ms_a, ms_b)
            notes = []
            if sa != sb:
                notes.append(f"{sa} → {sb}")
            if change is not None and abs(change) > 100 * threshold:
                notes.append("SLOWER" if change > 0 else "faster")
                regressions += change > 0
            comp = ""
            comp_a, comp_b = (ca or {}).get("compile_s"), (cb or {}).get("compile_s")
            if comp_a is not None or comp_b is not None:
                comp = f"{_num(comp_a, '.2f')}→{_num(comp_b, '.2f')}"
            lines.append(f"{name:<24} {v:<14} {_num(ms_a, '.3f'):>9} {_num(ms_b, '.3f'):>9} "
                         f"{_num(change, '+.1f', '%'):>8}  {comp:>15}  {', '.join(notes)}")
    only_a = sorted(set(rows_a) - set(rows_b))
    only_b = sorted(set(rows_b) - set(rows_a))
    if only_a or only_b:
        lines.append(f"only in A: {only_a or '-'}; only in B: {only_b or '-'}")
    lines.append("")
    for group in ("forward", "training"):
        ga, gb = (d.get("summary", {}).get(group) or {} for d in (a, b))
        for v in variants[1:] if variants[0] == "eager" else variants:
            x, y = (g.get(v, {}).get("geomean_speedup") for g in (ga, gb))
            if x is not None or y is not None:
                lines.append(f"geomean speedup {group} {v}: {_num(x, '.2f')} → {_num(y, '.2f')}")
    return lines, regressions


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, fmt) + suffix


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="the baseline result JSON")
    p.add_argument("b", help="the new result JSON")
    p.add_argument("--variant", action="append", choices=VARIANTS,
                   help="variants to compare (repeatable; default: all)")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change worth flagging")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 on a flagged slowdown")
    args = p.parse_args(argv)
    lines, regressions = compare(load(args.a), load(args.b), args.variant or list(VARIANTS), args.threshold)
    print("\n".join(lines))
    return 1 if args.fail_on_regression and regressions else 0


if __name__ == "__main__":
    sys.exit(main())
