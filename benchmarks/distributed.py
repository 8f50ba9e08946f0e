"""DDP training steps on several GPUs: eager DDP vs torch.compile DDP vs torchfuse DDP.

Run with torchrun, one process per GPU (NCCL)::

    torchrun --standalone --nproc-per-node 2 benchmarks/distributed.py --model gpt2 --steps 20
    torchrun --standalone --nproc-per-node 2 benchmarks/distributed.py --model llama --steps 20

For each mode (``eager``, ``torch.compile``, ``torchfuse``, and ``torchfuse-nosplit`` with
the DDP bucket split turned off) it trains the model of ``benchmarks/models.py`` at its full
size (GPT-2: 6 layers, 768 wide; Llama: 6 layers, 1024 wide, GQA) with SGD, checks the first
step's loss against eager's, times ``--steps`` steps after ``--warmup`` (compile included in
the warm-up), and profiles three steps with ``torch.profiler``: a Chrome trace (rank 0, for
the modes in ``--traces``, torchfuse's by default) and the *overlap*, the share of NCCL kernel
time during which a compute kernel ran on the GPU too. Rank 0 writes
``distributed_<tag>_<model>.json`` and ``.md`` (a table: median step ms, ratio to eager,
overlap %, pieces per graph) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).parent))
from models import MODELS, build_model, make_inputs

MODES = ("eager", "torch.compile", "torchfuse", "torchfuse-nosplit")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2", choices=[m.name for m in MODELS])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    p.add_argument("--traces", default="torchfuse",
                   help="comma-separated modes whose profile rank 0 writes as a Chrome trace")
    p.add_argument("--small", action="store_true",
                   help="tiny configs on the CPU under gloo (a check of the script, not a measurement)")
    p.add_argument("--backend", default="inductor", help="torchfuse backend")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--tag", default=time.strftime("gpu_%Y%m%d_%H%M"))
    return p.parse_args(argv)


def overlap(prof: Any) -> tuple[float, float]:
    """(NCCL kernel ms, share of it during which a compute kernel also ran)."""
    comm, compute = [], []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        span = (e.time_range.start, e.time_range.end)
        (comm if "nccl" in e.name.lower() else compute).append(span)
    compute.sort()
    merged: list[list[float]] = []
    for a, b in compute:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = sum(b - a for a, b in comm)
    shared = sum(max(0.0, min(b, mb) - max(a, ma)) for a, b in comm for ma, mb in merged)
    return total / 1000, (shared / total if total else 0.0)


def make_runner(mode: str, model: torch.nn.Module, rank: int, args: argparse.Namespace) -> tuple[Any, Any]:
    ids = None if args.small else [rank]
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
    if mode == "eager":
        return ddp, ddp
    if mode == "torch.compile":
        return torch.compile(ddp), ddp
    from torchfuse.capture import compile, config

    config.ddp_split = mode == "torchfuse"
    return compile(ddp, backend=args.backend), ddp


def pieces(runner: Any) -> list[int]:
    compiled = getattr(runner, "_compiled", None)
    if compiled is None:
        return []
    return [len(r.ddp_plan.cuts) + 1 for r in compiled.results if getattr(r, "ddp_plan", None) is not None]


def run_mode(mode: str, args: argparse.Namespace, rank: int, out: Path) -> dict[str, Any]:
    spec = next(m for m in MODELS if m.name == args.model)
    device = torch.device("cpu") if args.small else torch.device("cuda", rank)
    scale = "small" if args.small else "full"
    model, info = build_model(spec, scale, device)
    inputs = make_inputs(spec, model.config, scale, device, training=True)
    runner, ddp = make_runner(mode, model, rank, args)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    def sync() -> None:
        if not args.small:
            torch.cuda.synchronize()

    def step() -> float:
        loss = runner(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t0 = time.perf_counter()
    first = float(step())
    sync()
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    times = []
    for _ in range(args.steps):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        sync()
    comm_ms, share = overlap(prof)
    trace = out / f"distributed_{args.tag}_{args.model}_{mode}.trace.json"
    traced = rank == 0 and mode in [m.strip() for m in args.traces.split(",")]
    if traced:
        prof.export_chrome_trace(str(trace))
    return {"mode": mode, "first_loss": first, "compile_s": compile_s, "step_ms": statistics.median(times),
            "nccl_ms_per_3_steps": comm_ms, "overlap": share, "pieces": pieces(runner),
            "trace": trace.name if traced else None, "params_m": info["params_m"]}


def markdown(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    eager = next((r for r in rows if r["mode"] == "eager"), None)
    lines = [f"# DDP training step, {doc['model']}, {doc['world']} ranks, {doc['device']} ({doc['tag']})", "",
             "| mode | step ms | vs eager | overlap | NCCL ms / 3 steps | pieces | first loss | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{eager['step_ms'] / r['step_ms']:.2f}x" if eager else "-"
        lines.append(f"| {r['mode']} | {r['step_ms']:.2f} | {ratio} | {r['overlap'] * 100:.0f}% | "
                     f"{r['nccl_ms_per_3_steps']:.2f} | {r['pieces'] or '-'} | {r['first_loss']:.5f} | "
                     f"{r['compile_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo" if args.small else "nccl")
    rank = dist.get_rank()
    if not args.small:
        torch.cuda.set_device(rank)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        row = run_mode(mode, args, rank, out)
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        dist.barrier()
    if rank == 0:
        doc = {"model": args.model, "world": dist.get_world_size(), "tag": args.tag, "rows": rows,
               "torch": torch.__version__,
               "device": "cpu (--small)" if args.small else torch.cuda.get_device_name(0),
               "env": {k: v for k, v in os.environ.items() if k.startswith("TORCHFUSE_")}}
        stem = out / f"distributed_{args.tag}_{args.model}"
        stem.with_suffix(".json").write_text(json.dumps(doc, indent=2))
        stem.with_suffix(".md").write_text(markdown(doc))
        print(markdown(doc))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
