"""Formatting of benchmark results: summary, console table, JSON, markdown and plot.

Every function here reads the result document written by ``run.py`` (see
``docs/performance.md`` for its fields), so ``compare.py`` and later tools can reuse them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

COMPILED = ("torch_compile", "torchfuse")
SHORT = {"eager": "eager", "torch_compile": "torch.compile", "torchfuse": "torchfuse"}
BANDWIDTH_TARGET_PCT = 85.0
COMPILE_TIME_TARGET = 0.5  # torchfuse cold compile ≤ this × torch.compile's
CACHE_HIT_TARGET = 0.15  # cache-hit first call ≤ this × cold


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _cell(row: dict[str, Any], variant: str) -> dict[str, Any]:
    return row.get("results", {}).get(variant) or {}


def _mismatch(cell: dict[str, Any]) -> bool:
    return str(cell.get("check", "")).startswith("MISMATCH")


def _speedup(row: dict[str, Any], variant: str) -> float | None:
    cell = _cell(row, variant)
    return None if _mismatch(cell) else cell.get("speedup")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric-mean speedups (forward and training rows apart) and the torchfuse targets.

    A result that does not match eager does not count towards a geometric mean. ``common`` is
    the geometric mean over the rows where both compilers produced a matching result.
    """
    summary: dict[str, Any] = {}
    for group, training in (("forward", False), ("training", True)):
        part = [r for r in rows if r.get("training") is training]
        if not part:
            continue
        entry: dict[str, Any] = {}
        for variant in COMPILED:
            speedups = [s for r in part if (s := _speedup(r, variant))]
            entry[variant] = {"geomean_speedup": geomean(speedups), "n": len(speedups)}
        both = [r for r in part if all(_speedup(r, v) for v in COMPILED)]
        entry["common"] = {"n": len(both)} | {
            v: geomean([_speedup(r, v) for r in both]) for v in COMPILED}
        summary[group] = entry
    summary["targets"] = _targets(rows)
    summary["mismatches"] = [f"{r['name']}/{v}" for r in rows for v in COMPILED if _mismatch(_cell(r, v))]
    summary["errors"] = {v: [r["name"] for r in rows if _cell(r, v).get("error")] for v in
                         ("eager", *COMPILED)}
    return summary


def _targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Which rows meet each torchfuse target from BENCHMARKS.md (rows not measurable omitted)."""
    out: dict[str, dict[str, list[str]]] = {
        k: {"pass": [], "fail": []} for k in ("bandwidth", "compile_time", "cache_hit", "memory")}

    def put(key: str, name: str, ok: bool) -> None:
        out[key]["pass" if ok else "fail"].append(name)

    for r in rows:
        tf, tc, eager = _cell(r, "torchfuse"), _cell(r, "torch_compile"), _cell(r, "eager")
        name = r["name"]
        if r.get("bound") == "memory-bound" and not r.get("training") and eager.get("ms"):
            put("bandwidth", name, (tf.get("pct_copy") or 0.0) >= BANDWIDTH_TARGET_PCT)
        if tc.get("compile_s") and tf.get("compile_s") is not None:
            put("compile_time", name, tf["compile_s"] <= COMPILE_TIME_TARGET * tc["compile_s"])
        if tf.get("compile_hit_s") is not None and tf.get("compile_s"):
            put("cache_hit", name, tf["compile_hit_s"] <= CACHE_HIT_TARGET * tf["compile_s"])
        if tf.get("peak_mb") is not None and eager.get("peak_mb") is not None:
            put("memory", name, tf["peak_mb"] <= eager["peak_mb"] * 1.001 + 0.01)
    return out


# ----------------------------------------------------------------------------- table


def _f(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _ms(cell: dict[str, Any]) -> str:
    if cell.get("error"):
        return "ERROR"
    return _f(cell.get("ms"), ".3f")


def _speed(cell: dict[str, Any]) -> str:
    value = cell.get("speedup")
    text = _f(value, ".2f" if value is None or value >= 0.01 else ".1e")
    return text + "!" if text and _mismatch(cell) else text


def _check(row: dict[str, Any]) -> str:
    bad = [SHORT[v] for v in COMPILED if _mismatch(_cell(row, v))]
    if bad:
        return "MISMATCH " + ",".join(bad)
    checks = [str(_cell(row, v).get("check", "")) for v in COMPILED]
    if any(c.startswith("ok (vs float32") for c in checks):
        return "ok (fp32 ref)"  # within eager's own bf16 error of the float32 step (models.py)
    return "ok" if "ok" in checks else ""


def _throughput(row: dict[str, Any], variant: str) -> str:
    cell = _cell(row, variant)
    if cell.get("gbps") is not None and row.get("bound") == "memory-bound":
        return f"{cell['gbps']:.0f} ({cell['pct_copy']:.0f}%)"
    if cell.get("tflops") is not None:
        return f"{cell['tflops']:.0f} TF/s"
    return ""


HEADER = ("workload", "eager ms", "tc ms", "tf ms", "tc ×", "tf ×", "tc GB/s (%copy)",
          "tf GB/s (%copy)", "tc cold s", "tf cold s", "tc hit s", "tf hit s",
          "peak MB e/tc/tf", "check")


def table_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for r in doc["rows"]:
        if "results" not in r:
            out.append((r["name"], *([""] * (len(HEADER) - 2)), r.get("skipped") or r.get("error", "")))
            continue
        e, tc, tf = (_cell(r, v) for v in ("eager", *COMPILED))
        peaks = "/".join(_f(c.get("peak_mb"), ".0f") or "-" for c in (e, tc, tf))
        out.append((r["name"], _ms(e), _ms(tc), _ms(tf), _speed(tc), _speed(tf),
                    _throughput(r, "torch_compile"), _throughput(r, "torchfuse"),
                    _f(tc.get("compile_s"), ".2f"), _f(tf.get("compile_s"), ".2f"),
                    _f(tc.get("compile_hit_s"), ".2f"), _f(tf.get("compile_hit_s"), ".2f"),
                    peaks if peaks != "-/-/-" else "", _check(r)))
    return out


def summary_lines(doc: dict[str, Any]) -> list[str]:
    s = doc.get("summary") or {}
    lines = []
    for group in ("forward", "training"):
        g = s.get(group)
        if not g:
            continue
        parts = [f"{SHORT[v]} {_f(g[v]['geomean_speedup'], '.2f') or '-'}× (n={g[v]['n']})" for v in COMPILED]
        common = g["common"]
        parts.append(f"on the {common['n']} rows both ran: "
                     + ", ".join(f"{SHORT[v]} {_f(common[v], '.2f') or '-'}×" for v in COMPILED))
        lines.append(f"geomean speedup over eager, {group}: " + "; ".join(parts))
    for key, res in (s.get("targets") or {}).items():
        if res["pass"] or res["fail"]:
            lines.append(f"target {key}: {len(res['pass'])} pass, {len(res['fail'])} fail"
                         + (f" ({', '.join(res['fail'])})" if res["fail"] else ""))
    for m in s.get("mismatches", []):
        lines.append(f"!!! MISMATCH against eager: {m}")
    for r in doc["rows"]:
        for v, cell in r.get("results", {}).items():
            if cell.get("error"):
                lines.append(f"error {r['name']}/{SHORT[v]}: {cell['error']}")
            if _mismatch(cell):
                lines.append(f"!!! {r['name']}/{SHORT[v]}: {cell['check']}")
            if cell.get("compile_hit_error"):
                lines.append(f"cache-hit {r['name']}/{SHORT[v]}: {cell['compile_hit_error']}")
        if r.get("device_lost"):
            lines.append(f"!!! device lost in {r['name']} {r['device_lost']}")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    failures = doc.get("prewarm_failures") or {}
    lines += [f"prewarm {SHORT.get(v, v)} failed: {m}" for v, m in failures.items()]
    return lines


def progress_line(row: dict[str, Any], seconds: float) -> str:
    parts = []
    for v, cell in row.get("results", {}).items():
        parts.append(f"{SHORT[v]} " + ("ERROR" if cell.get("error") else _f(cell.get("ms"), ".3f") + " ms"))
    return f"[{seconds:6.1f} s] {row['name']}: " + ", ".join(parts or [row.get("error", "")])


def print_table(doc: dict[str, Any]) -> None:
    rows = table_rows(doc)
    env = doc["environment"]
    title = (f"{doc['tag']}: {env['device']}, torch {env['torch']}, triton {env['triton']}, "
             f"copy {env['copy_gbps']:.0f} GB/s")
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for h in HEADER:
            table.add_column(h, justify="left" if h in ("workload", "check") else "right")
        for r in rows:
            table.add_row(*r, style="bold red" if "MISMATCH" in r[-1] else None)
        Console(width=220).print(table)
    except ImportError:
        print(title)
        widths = [max(len(x[i]) for x in [HEADER, *rows]) for i in range(len(HEADER))]
        for r in [HEADER, tuple("-" * w for w in widths), *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for line in summary_lines(doc):
        print(line)


# ----------------------------------------------------------------------------- files


def write_json(doc: dict[str, Any], path: Path) -> Path:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def markdown(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    out = [f"# Benchmark results: {doc['tag']}", "",
           f"{env['device']}; Python {env['python']}, torch {env['torch']}, triton {env['triton']}; "
           f"{env['date']}; commit {(env.get('git_commit') or '?')[:12]}"
           + (" (dirty)" if env.get("git_dirty") else "") + ".",
           f"Device-to-device copy bandwidth in this run: **{env['copy_gbps']:.0f} GB/s**. "
           "tc = torch.compile, tf = torchfuse; × = speedup over eager; % = of the copy bandwidth.",
           "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table_rows(doc)]
    out += ["", *[f"- {line}" for line in summary_lines(doc)], ""]
    return "\n".join(out)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """Bars of speedup over eager per workload (eager = 1); None when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    rows = [r for r in doc["rows"] if "results" in r]
    if not rows:
        return None
    variants = [v for v in ("eager", *COMPILED) if any(v in r["results"] for r in rows)]
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.7 * len(rows)), 5))
    for i, v in enumerate(variants):
        heights = [(_speedup(r, v) or float("nan")) if v != "eager" else 1.0 for r in rows]
        xs = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(rows))]
        ax.bar(xs, heights, width, label=SHORT[v])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["name"] for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_ylabel("speedup over eager (log scale)")
    ax.set_title(f"{doc['tag']}: {doc['environment']['device']} (no bar: error or mismatch)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(doc: dict[str, Any], out_dir: Path, tag: str, plot_png: bool = True) -> list[Path]:
    """Write ``<tag>.png`` (when possible), ``<tag>.md`` and ``<tag>.json``; return the paths."""
    paths = []
    if plot_png:
        try:
            png = plot(doc, out_dir / f"{tag}.png")
        except Exception as e:  # a plotting problem must not lose the measured results
            doc.setdefault("notes", []).append(f"plot failed: {type(e).__name__}: {e}")
            png = None
        if png is not None:
            paths.append(png)
    md_path = out_dir / f"{tag}.md"
    md_path.write_text(markdown(doc))
    return [write_json(doc, out_dir / f"{tag}.json"), md_path, *paths]
