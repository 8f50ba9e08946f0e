"""Kernel launches per call with combo kernels on and off (`torchfuse.inductor.combo`).

    python benchmarks/combo_launches.py                      # the rows below, bf16 autocast
    python benchmarks/combo_launches.py --rows swin_t:1 --json out.json

Rows (``model:batch``; ``gpt2_train`` is GPT-2's ``--small`` config of ``models.py``, 2 layers,
width 64, batch 2 x 16 tokens, a training step): ``swin_t:1``, ``mobilenet_v3_small:1``,
``mobilenet_v3_small:32`` (torchvision, full size, 224 x 224 images) and ``gpt2_train``.

Runs on the CPU and runs no kernel: each model is captured under bf16 autocast by a backend
that only records the graphs (`compile_profile.Recorder`); a training graph is split by
autograd's plan into its forward and backward halves; each graph is compiled to Triton
kernels (``cpu_backend="triton"``: what a GPU gets) twice, with ``combo_kernels`` on and off.
A call's launches are the Triton launch steps of its Programs; extern calls (matmuls,
convolutions: the same either way) are counted apart. ``peak MiB`` is the most bytes the
plans keep allocated at once (the sum over a call's Programs of each one's peak, buffers
counted from their allocation to their free, storage reuse ignored): what combos cost in
memory. Graphs are compiled for the CPU device: a CUDA graph's choices that differ
(training batch norms, channels-last) are left at their CPU defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ROWS = ("swin_t:1", "mobilenet_v3_small:1", "mobilenet_v3_small:32", "gpt2_train")


def capture(row: str) -> list[tuple[Any, bool]]:
    """The row's graphs: (graph, needs the training split)."""
    import torch
    import torchfuse.capture as tf
    from compile_profile import Recorder

    name, _, batch = row.partition(":")
    rec = Recorder()
    tf.reset()
    if name == "gpt2_train":
        import models

        spec = models.select("gpt2", "")[0]
        model, _ = models.build_model(spec, "small", "cpu")
        model.train()
        inputs = models.make_inputs(spec, model.config, "small", "cpu", True)
        params = tuple(p for p in model.parameters() if p.requires_grad)
        models.make_step(tf.compile(model, backend=rec), inputs, True, params, "cpu")()
    else:
        import vision_models

        model, _ = vision_models.build(name, "full", "cpu")
        model.eval()
        pixels = torch.randn(int(batch or 1), 3, 224, 224, generator=torch.Generator().manual_seed(0))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            tf.compile(model, backend=rec)(pixel_values=pixels)
    out = []
    for graph, examples, _, grad_mode in rec.graphs:
        training = grad_mode and any(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
        out.append((graph, examples, training))
    return out


def halves(graph: Any, examples: list[Any], training: bool) -> list[Any]:
    if not training:
        return [graph]
    import torch
    from torchfuse.autograd import aot

    keep = lambda g, ex: (lambda *a: None)  # the halves are compiled below, not here
    fn = aot(graph, keep, keep)
    rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in examples)
    plan = fn.plan(rg, True, fn.sizes_key(examples))
    return [plan.partition.forward, plan.partition.backward]


def peak_bytes(program: Any) -> int:
    from torchfuse.graph import schema as S
    from torchfuse.graph.ops import to_dtype

    def nbytes(b: Any) -> int:
        n = 1
        for s in b.sizes:
            n *= int(s)
        return n * to_dtype(b.dtype).itemsize

    sizes = {b.name: nbytes(b) for b in program.buffers}
    live = peak = 0
    for step in program.steps:
        if isinstance(step, S.AllocStep):
            live += sizes.get(step.buffer, 0)
            peak = max(peak, live)
        elif isinstance(step, S.FreeStep):
            live -= sizes.get(step.buffer, 0)
    return peak


def count(graphs: list[Any], combo: bool) -> dict[str, Any]:
    from torchfuse.graph import schema as S
    from torchfuse.inductor import compile_graph

    options = {"cpu_backend": "triton", "combo_kernels": combo, "cache": False}
    out = {"launches": 0, "externs": 0, "combos": 0, "members": 0, "kernels": 0, "peak_mib": 0.0}
    for graph in graphs:
        program = compile_graph(graph, options=options)
        out["launches"] += sum(isinstance(s, S.LaunchStep) for s in program.steps)
        out["externs"] += sum(isinstance(s, S.ExternStep) for s in program.steps)
        out["kernels"] += len(program.kernels)
        combos = [k for k in program.kernels if k.meta.get("kind") == "combo"]
        out["combos"] += len(combos)
        out["members"] += sum(len(k.meta["members"].split(",")) for k in combos)
        out["peak_mib"] += peak_bytes(program) / 2**20
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    os.environ.setdefault("TORCHFUSE_COMPILE_CACHE", "0")
    import vision_models

    vision_models.ensure_importable()  # before transformers imports torchvision
    results = {}
    print(f"{'row':24s} {'launches off -> on':>20s} {'externs':>8s} {'combos (members)':>17s} "
          f"{'peak MiB off -> on':>20s}")
    for row in [r for r in args.rows.split(",") if r]:
        graphs = [h for g, ex, tr in capture(row) for h in halves(g, ex, tr)]
        off, on = count(graphs, False), count(graphs, True)
        results[row] = {"graphs": len(graphs), "off": off, "on": on}
        print(f"{row:24s} {off['launches']:>9d} -> {on['launches']:<8d} {on['externs']:>8d} "
              f"{on['combos']:>8d} ({on['members']:>4d}) {off['peak_mib']:>9.1f} -> {on['peak_mib']:<8.1f}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
