"""The report of ``models.py``: geometric means, the Markdown tables, the details and the plot.

Kept apart from the runner (``models.py``) so that a results file can be re-rendered without
building a model: ``summarize(rows)``, ``markdown(doc)``, ``write_all(doc, out_dir, plot_png)``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from report import SHORT, _cell, _check, _f, _mismatch, _ms, _speed, _speedup, geomean, pyplot, write_json  # noqa: E402
from run import short_error  # noqa: E402

COMPILED = ("torch_compile", "torchfuse")
MODES = ("inference", "training")


# ----------------------------------------------------------------------------- summary


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric-mean speedups over eager per mode and compiler, over the rows matching eager.

    torchfuse's ``geomean_speedup`` counts its eager-fallback rows (what a user of it gets, ≈1×);
    ``geomean_speedup_captured`` leaves them out. ``common``: the rows where both compilers have a
    matching result, so the two numbers are comparable.
    """
    summary: dict[str, Any] = {}
    for mode in MODES:
        part = [r for r in rows if r.get("mode") == mode and "results" in r]
        if not part:
            continue
        entry: dict[str, Any] = {}
        for v in COMPILED:
            speedups = [s for r in part if (s := _speedup(r, v))]
            entry[v] = {"geomean_speedup": geomean(speedups), "n": len(speedups)}
        fallback = [r["name"] for r in part if _cell(r, "torchfuse").get("eager_fallback")]
        captured = [s for r in part if (s := _speedup(r, "torchfuse")) and r["name"] not in fallback]
        entry["torchfuse"].update(geomean_speedup_captured=geomean(captured), n_captured=len(captured),
                                  eager_fallback=fallback)
        both = [r for r in part if all(_speedup(r, v) for v in COMPILED)]
        entry["common"] = {"n": len(both)} | {v: geomean([_speedup(r, v) for r in both]) for v in COMPILED}
        summary[mode] = entry
    measured = [r for r in rows if "results" in r]
    summary["mismatches"] = [f"{r['name']}/{r['mode']}/{v}" for r in measured for v in COMPILED
                             if _mismatch(_cell(r, v))]
    summary["errors"] = {v: [f"{r['name']}/{r['mode']}" for r in measured if _cell(r, v).get("error")]
                         for v in ("eager", *COMPILED)}
    return summary


# ----------------------------------------------------------------------------- report


def _graphs(cell: dict[str, Any], variant: str) -> str:
    if variant == "torch_compile":
        return "" if cell.get("graphs") is None else f"{cell['graphs']}/{cell['graph_breaks']}"
    graphs = cell.get("graph_count", cell.get("graphs_compiled"))
    text = "" if graphs is None else f"{graphs}/{cell.get('graph_break_count', '?')}"
    return (text + " EAGER FALLBACK").strip() if cell.get("eager_fallback") else text


def _err(cell: dict[str, Any], training: bool) -> str:
    keys = ("err_logits", "err_loss", "err_grads") if training else ("err_logits",)
    if all(cell.get(k) is None for k in keys):
        return ""
    return "/".join(_f(cell.get(k), ".1e") or "-" for k in keys)


def table(doc: dict[str, Any], mode: str) -> list[str]:
    """The markdown table of one mode, with its geometric means under it."""
    training = mode == "training"
    err = "err logits/loss/grads" if training else "err logits"
    header = ("model", "eager ms", "tc ms", "tf ms", "tc ×", "tf ×", "tc cold s", "tf cold s",
              "peak MB e/tc/tf", "tc graphs/breaks", "tf graphs/breaks", f"tc {err}", f"tf {err}", "check")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in (r for r in doc["rows"] if r.get("mode") == mode):
        if not r.get("results"):  # skipped, or the model did not build
            reason = r.get("skipped") or r.get("error", "")
            lines.append("| " + " | ".join((r["name"], *[""] * (len(header) - 2), reason)) + " |")
            continue
        e, tc, tf = (_cell(r, v) for v in ("eager", *COMPILED))
        peaks = "/".join(_f(c.get("peak_mb"), ".0f") or "-" for c in (e, tc, tf))
        cells = (r["name"], _ms(e), _ms(tc), _ms(tf), _speed(tc), _speed(tf), _f(tc.get("compile_s"), ".2f"),
                 _f(tf.get("compile_s"), ".2f"), "" if peaks == "-/-/-" else peaks,
                 _graphs(tc, "torch_compile"), _graphs(tf, "torchfuse"), _err(tc, training),
                 _err(tf, training), _check(r))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    s = (doc.get("summary") or {}).get(mode)
    if s:
        parts = [f"{SHORT[v]} {_f(s[v]['geomean_speedup'], '.2f') or '-'}× (n={s[v]['n']})" for v in COMPILED]
        tf_s = s["torchfuse"]
        if tf_s["eager_fallback"]:
            captured = _f(tf_s["geomean_speedup_captured"], ".2f") or "-"
            parts.append(f"torchfuse without its eager-fallback rows {captured}× (n={tf_s['n_captured']})")
        parts.append(f"on the {s['common']['n']} rows both ran: "
                     + ", ".join(f"{SHORT[v]} {_f(s['common'][v], '.2f') or '-'}×" for v in COMPILED))
        lines += ["", f"geomean speedup over eager, {mode}: " + "; ".join(parts)]
        if tf_s["eager_fallback"]:
            names = ", ".join(tf_s["eager_fallback"])
            lines.append(f"torchfuse eager fallback (0 graphs captured), {mode}: {names}")
    return lines


def detail_lines(doc: dict[str, Any]) -> list[str]:
    """Errors, mismatches, torchfuse's break reasons and the notes, one line each."""
    lines = []
    for r in doc["rows"]:
        where = f"{r['name']}/{r['mode']}"
        if r.get("error"):
            lines.append(f"error {where}: {r['error']}")
        for v, cell in r.get("results", {}).items():
            if cell.get("error"):
                lines.append(f"error {where}/{SHORT[v]}: {cell['error']}")
            if _mismatch(cell):
                lines.append(f"!!! {where}/{SHORT[v]}: {cell['check']}")
            if cell.get("check_vs_eager"):  # judged against the float32 step (models.judge_by_reference)
                lines.append(f"{where}/{SHORT[v]}: not within tolerance of eager's bf16 result "
                             f"({cell['check_vs_eager'][:160]}); against the float32 step: {cell['check']}")
            if cell.get("explain_error"):
                lines.append(f"explain {where}: {cell['explain_error']}")
            for b in cell.get("break_reasons", [])[:3]:
                at = f" at {b['where']}" if b.get("where") else ""
                lines.append(f"break {where}/{SHORT[v]}: {b['reason']}{at}"
                             + (f" (not resumed: {b['fallback']})" if b.get("fallback") else ""))
        tf = _cell(r, "torchfuse")
        if tf.get("graphs_after_timing", 0) > (tf.get("graphs_compiled") or 0):
            lines.append(f"torchfuse recompiled while timed, {where}: "
                         f"{tf['graphs_compiled']} → {tf['graphs_after_timing']} graphs")
        lines += [f"config {where}: {note}" for note in r.get("config_notes", [])]
        if r.get("device_lost"):
            lines.append(f"!!! device lost in {where} {r['device_lost']}")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    lines += [f"prewarm {SHORT[v]} failed: {m}" for v, m in (doc.get("prewarm_failures") or {}).items()]
    return lines


def markdown(doc: dict[str, Any]) -> str:
    env, cfg = doc["environment"], doc["config"]
    out = [f"# Model benchmarks: {doc['tag']}", "",
           f"{env['device']}; Python {env['python']}, torch {env['torch']}, triton {env['triton']}, "
           f"transformers {env['transformers']}; {env['date']}; commit {(env.get('git_commit') or '?')[:12]}"
           + (" (dirty)" if env.get("git_dirty") else "") + ".",
           f"{'Tiny configs (--small)' if cfg['small'] else 'Full-size configs'}, random weights, bf16 "
           f"autocast; torchfuse backend `{cfg['backend']}`. tc = torch.compile, tf = torchfuse; × = speedup "
           "over eager (! = does not match eager); graphs/breaks: torch.compile's from Dynamo's counters, "
           "torchfuse's from explain; err = max|Δ|/max|eager| of the logits, |Δ|/|eager| of the loss, "
           "relative L2 of all gradients.", ""]
    for mode in MODES:
        if any(r.get("mode") == mode for r in doc["rows"]):
            out += [f"## {mode}", "", *table(doc, mode), ""]
    details = detail_lines(doc)
    if details:
        out += ["## details", "", *[f"- {line}" for line in details], ""]
    return "\n".join(out)


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """Bars of speedup over eager per model, one panel per mode; None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    modes = [m for m in MODES if any(r.get("mode") == m and "results" in r for r in doc["rows"])]
    if not modes:
        return None
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 4 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        rows = [r for r in doc["rows"] if r.get("mode") == mode and "results" in r]
        for i, v in enumerate(COMPILED):
            xs = [k + (i - 0.5) * 0.4 for k in range(len(rows))]
            bars = ax.bar(xs, [_speedup(r, v) or float("nan") for r in rows], 0.4, label=SHORT[v])
            for bar, r in zip(bars, rows, strict=True):
                if _cell(r, v).get("eager_fallback"):
                    bar.set_hatch("//")
                    bar.set_alpha(0.5)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["name"] for r in rows], rotation=30, ha="right")
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_ylabel("speedup over eager")
        s = (doc.get("summary") or {}).get(mode) or {}
        means = ", ".join(f"{SHORT[v]} {_f(s.get(v, {}).get('geomean_speedup'), '.2f') or '-'}×"
                          for v in COMPILED)
        ax.set_title(f"{mode}: geomean {means} (hatched: torchfuse eager fallback; no bar: error or "
                     "mismatch)", fontsize=9)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"models_{doc['tag']}: {doc['environment']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(doc: dict[str, Any], out_dir: Path, plot_png: bool) -> list[Path]:
    stem, png = f"models_{doc['tag']}", None
    try:
        png = plot(doc, out_dir / f"{stem}.png") if plot_png else None
    except Exception as e:  # a plotting problem must not lose the measured results
        doc["notes"].append(f"plot failed: {short_error(e)}")
    md = out_dir / f"{stem}.md"
    md.write_text(markdown(doc))
    return [write_json(doc, out_dir / f"{stem}.json"), md, *([png] if png else [])]


def progress_line(row: dict[str, Any], seconds: float) -> str:
    parts = []
    for v, cell in row.get("results", {}).items():
        text = f"{SHORT[v]} " + ("ERROR" if cell.get("error") else _f(cell.get("ms"), ".3f") + " ms")
        if cell.get("compile_s") is not None:
            text += f" (cold {cell['compile_s']:.1f} s)"
        if cell.get("eager_fallback"):
            text += " EAGER FALLBACK"
        parts.append(text)
    return f"[{seconds:6.1f} s] {row['name']}/{row['mode']}: " + ", ".join(parts or [row.get("error", "")])
