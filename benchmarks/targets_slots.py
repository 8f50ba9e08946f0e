"""``compile_targets.py --slots N``: the rows measured in N slots at once, one GPU each.

A host of N GPUs is used as N one-GPU machines: slot ``i`` is a ``compile_targets.py`` process
that sees GPU ``i`` alone (``CUDA_VISIBLE_DEVICES``) and runs on its own ``1/N`` of the cores
(``--cores``: it calls ``sched_setaffinity`` before importing torch, and every child process it
starts inherits them; both compilers size their
compile workers by it, torch.compile through ``TORCHINDUCTOR_COMPILE_THREADS``). Each slot runs
its rows as a one-slot run would (torch.compile cold, torchfuse cold, torchfuse warm, one after
the other, fresh caches of their own). What the slots still share is the host's memory
bandwidth, disk and PCIe, so a row measured in a slot may be slower than alone: compare a few
rows with a one-slot run before reading small differences.

Rows are dealt to slots longest first (`cost`: a training row counts as about 2.5 inference
rows) so the slots end at about the same time; ``--plan`` prints the deal and the expected
minutes without running anything. The merged ``<tag>.json`` records each row's slot, GPU
and cores, and is rewritten every few seconds while the slots run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def cost(name: str) -> float:
    """A row's expected seconds for its three processes, from the one-GPU runs of 2026-12-07
    (a micro row's compile is short, but its processes still import, warm up and build)."""
    if name.endswith("/training"):
        return 130.0
    return 55.0 if "/" in name else 45.0


def deal(names: list[str], n: int) -> list[list[str]]:
    """``names`` over ``n`` slots, longest first onto the least loaded slot; each slot keeps the
    rows' own order."""
    slots: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for name in sorted(names, key=cost, reverse=True):
        i = load.index(min(load))
        slots[i].append(name)
        load[i] += cost(name)
    order = {name: k for k, name in enumerate(names)}
    return [sorted(s, key=order.__getitem__) for s in slots]


def plan(names: list[str], n: int) -> list[str]:
    """What ``--slots n`` would run where, and the minutes each slot is expected to take
    (`cost`; a run ends with its slowest slot)."""
    lines = []
    for i, part in enumerate(deal(names, n)):
        lines.append(f"slot {i}: {sum(map(cost, part)) / 60:.1f} min: {', '.join(part) or '-'}")
    total = sum(map(cost, names)) / 60
    lines.append(f"{len(names)} rows, {total:.1f} min of rows in all; the run takes about "
                 f"{max(sum(map(cost, p)) for p in deal(names, n)) / 60:.1f} min over {n} slot(s)")
    return lines


def core_sets(n: int) -> list[list[int]]:
    """This process's cores in ``n`` equal, disjoint parts (a remainder is left unused)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    per = len(cores) // n
    if per < 1:
        raise SystemExit(f"--slots {n}: this process may use {len(cores)} cores, fewer than the slots")
    return [cores[i * per:(i + 1) * per] for i in range(n)]


def gpu_ids(n: int, device: str) -> list[str]:
    """The GPU each slot sees: the ``n`` first of those this process sees."""
    if not device.startswith("cuda"):
        return [""] * n
    import torch

    have = torch.cuda.device_count()
    if have < n:
        raise SystemExit(f"--slots {n} needs {n} GPUs; this process sees {have}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(have)]
    return ids[:n]


def _span(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else \
        ",".join(map(str, cores))


def _command(args: argparse.Namespace, folder: Path, i: int, names: list[str], cores: list[int]) -> list[str]:
    cmd = [sys.executable, str(HERE / "compile_targets.py"), "--device", args.device,
           "--timeout", str(args.timeout), "--repeat", str(args.repeat), "--out", str(folder),
           "--tag", f"slot{i}", "--rows", ",".join(names), "--model-modes", args.model_modes,
           "--cores", ",".join(map(str, cores))]
    cmd += ["--only", args.only] if args.only else []
    cmd += ["--models", args.models] if args.models else []
    cmd += ["--small"] if args.small else []
    cmd += ["--skip-tc"] if args.skip_tc else []
    return cmd


def _relay(i: int, stream: Any) -> None:
    for line in stream:
        print(f"[slot {i}] {line.rstrip()}", file=sys.stderr, flush=True)


def run_slots(rows: list[Any], args: argparse.Namespace, doc: dict[str, Any],
              write: Callable[[], None]) -> None:
    """Measure ``rows`` in ``args.slots`` slots; ``doc["rows"]`` gets every finished row (in
    ``rows``' order) and ``write()`` is called whenever that changes, and at the end."""
    n = args.slots
    names = [r.name for r in rows]
    parts, cores, gpus = deal(names, n), core_sets(n), gpu_ids(n, args.device)
    folder = Path(tempfile.mkdtemp(prefix="torchfuse_targets_slots_"))
    doc["slots"] = [{"slot": i, "gpu": gpus[i], "cores": _span(cores[i]), "rows": parts[i]}
                    for i in range(n) if parts[i]]
    procs: list[subprocess.Popen[str]] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout: stop the slots
    try:
        for i in range(n):
            if not parts[i]:
                continue
            env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(len(cores[i])))
            if gpus[i]:
                env["CUDA_VISIBLE_DEVICES"] = gpus[i]
            print(f"slot {i}: GPU {gpus[i] or '-'}, cores {_span(cores[i])}: {', '.join(parts[i])}",
                  file=sys.stderr, flush=True)
            # the slot sets its own affinity first thing (--cores): no preexec_fn, which is not
            # safe beside the relay threads of the slots started before
            proc = subprocess.Popen(_command(args, folder, i, parts[i], cores[i]), cwd=HERE, env=env,
                                    text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
            threading.Thread(target=_relay, args=(i, proc.stderr), daemon=True).start()
            procs.append(proc)
        seen = -1
        while any(p.poll() is None for p in procs):
            time.sleep(5)
            seen = _merge(doc, folder, names, seen, write)
        _merge(doc, folder, names, seen, write)
        for i, p in zip([i for i in range(n) if parts[i]], procs):
            if p.returncode:
                print(f"slot {i}: exited with {p.returncode}", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)  # the slot and the children it started
        _merge(doc, folder, names, -2, write)
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(folder, ignore_errors=True)


def _merge(doc: dict[str, Any], folder: Path, names: list[str], seen: int, write: Callable[[], None]) -> int:
    """The slots' finished rows into ``doc``, each with its slot; ``write()`` when their number
    differs from ``seen``. Returns the number. A row once merged stays (a file being rewritten
    when read is read at the next poll, or not at all after a timeout)."""
    found: dict[str, dict[str, Any]] = {r["row"]: r for r in doc.get("rows", [])}
    for path in folder.glob("slot*.json"):
        try:
            part = json.loads(path.read_text())
        except (OSError, ValueError):  # being rewritten: read again at the next poll
            continue
        slot = int(path.stem.removeprefix("slot"))
        usable = part.get("environment", {}).get("usable_cores")
        for r in part.get("rows", []):
            found[r["row"]] = dict(r, slot=slot, slot_cores=usable)
    doc["rows"] = [found[name] for name in names if name in found]
    if len(doc["rows"]) != seen:
        write()
    return len(doc["rows"])
