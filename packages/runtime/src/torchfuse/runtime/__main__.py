"""``python -m torchfuse.runtime``: inspect an archive, or warm the caches for it on this machine.

    python -m torchfuse.runtime source model.tfp.zip [--device cpu]
    python -m torchfuse.runtime warm model.tfp.zip [--size s0=128 ...] [--device cuda]

``warm`` calls the Program once on random inputs made from its buffer metadata (size symbols
from ``--size`` or their hints), so that the kernels are compiled into Triton's cache and the
autotune winners written, before the first real call; it prints what that call cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.ops import to_dtype


def example_inputs(program: S.Program, device: str,
                   sizes: Mapping[str, int] | None = None) -> list[torch.Tensor]:
    """Random inputs that fit ``program``: symbols from ``sizes``, else their hints, else their minimum."""
    env = {s.name: (sizes or {}).get(s.name, s.hint if s.hint is not None else max(s.min, 2))
           for s in program.symbols}
    buffers = {b.name: b for b in program.buffers}
    out = []
    for name in program.inputs:
        buf = buffers[name]
        shape = [evaluate(e, env) for e in buf.sizes]
        stride = [evaluate(e, env) for e in buf.strides]
        on = "cpu" if buf.device.startswith("cpu") else device
        t = torch.empty_strided(shape, stride, dtype=to_dtype(buf.dtype), device=on)
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.normal_()
        elif t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape, device=on) > 0.5)
        else:
            t.zero_()  # indices: zero is in range of every gather
        out.append(t)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from torchfuse.runtime import load

    parser = argparse.ArgumentParser(prog="python -m torchfuse.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["source", "warm"])
    parser.add_argument("archive")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the Program's)")
    parser.add_argument("--size", action="append", default=[], metavar="SYM=N", help="a size symbol's value")
    opts = parser.parse_args(argv)
    fn = load(opts.archive, device=opts.device)
    if opts.command == "source":
        print(fn.source)
        return 0
    sizes = dict((k, int(v)) for k, v in (s.split("=", 1) for s in opts.size))
    inputs = example_inputs(fn.program, fn.device_type, sizes)
    start = time.perf_counter()
    fn(*inputs)
    if fn.device_type == "cuda":
        torch.cuda.synchronize()
    stats = dataclasses.asdict(fn.stats)
    print(json.dumps({"first_call_s": round(time.perf_counter() - start, 4), **stats}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
