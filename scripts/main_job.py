"""The main job: what torchfuse does today with one small function, stage by stage.

Run it with ``hatch run main``. It prints the installed torchfuse packages, then walks the
pipeline of ``torchfuse.capture.compile(fn)(x, y)`` for the function below. A stage whose code
exists is run and checked against eager PyTorch; a stage that is not built yet says so and
what it will show. The pipeline is under construction, so expect several "not built yet" lines.

Exit status: 0 when every stage that exists ran and matched eager, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

PACKAGES = ("graph", "capture", "autograd", "inductor", "runtime")

if not torch.cuda.is_available():
    # Triton kernels can only run through its interpreter without a GPU; it must be set before
    # triton is imported anywhere.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def complex_function(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x + y
    b = a * 2.0
    c = torch.relu(b)
    e = torch.nn.functional.silu(c)
    d = e.sum(dim=1)
    f = d.mean()
    return f


class NotBuilt(Exception):
    """A stage's module or API does not exist yet."""


def heading(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 86 - len(title)))


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*header).rstrip())
    print(line.format(*("-" * w for w in widths)).rstrip())
    for r in rows:
        print(line.format(*r).rstrip())


def make_inputs(device: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=gen).to(device).requires_grad_(True)
    y = torch.randn(size, size, generator=gen).to(device)
    return x, y


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Raise when ``actual`` differs from eager; print the max abs difference either way."""
    diff = (actual.detach().double() - expected.detach().double()).abs().max().item()
    print(f"{name}: max abs diff vs eager = {diff:.3e}")
    torch.testing.assert_close(actual, expected)


def api(module: str, attr: str) -> Any:
    """Look up ``module.attr``; a missing module or attribute means the stage is not built."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise NotBuilt(f"{module}.{attr} is not available yet ({type(e).__name__}: {e})") from e


def backend_available(name: str) -> None:
    """Check that a backend named in the ``torchfuse.backends`` entry-point group loads."""
    eps = {ep.name: ep for ep in md.entry_points(group="torchfuse.backends")}
    if name not in eps:
        raise NotBuilt(f"no backend {name!r} registered under torchfuse.backends")
    try:
        eps[name].load()
    except (ImportError, AttributeError) as e:
        raise NotBuilt(f"backend {name!r} does not load yet ({type(e).__name__}: {e})") from e


# ----------------------------------------------------------------------------- stages


def fmt_arg(arg: Any) -> str:
    from torchfuse.graph import schema as S

    if isinstance(arg, S.TensorRef):
        return arg.name
    if isinstance(arg, S.SymRef):
        return arg.expr
    if isinstance(arg, S.ListArg):
        return "[" + ", ".join(fmt_arg(a) for a in arg.items) + "]"
    if isinstance(arg, S.NoneArg):
        return "None"
    if isinstance(arg, S.DtypeArg | S.DeviceArg | S.LayoutArg | S.MemoryFormatArg | S.SubgraphRef):
        return arg.name
    return repr(getattr(arg, "value", arg))


def fmt_meta(meta: Any) -> str:
    sizes = "x".join(str(s) for s in meta.sizes) or "scalar"
    return f"{meta.dtype}[{sizes}]"


def stage_graph(x: torch.Tensor, y: torch.Tensor, expected: torch.Tensor) -> None:
    trace = api("torchfuse.graph", "trace")
    run = api("torchfuse.graph", "run")
    start = time.perf_counter()
    graph, constants = trace(complex_function, x, y, name="complex_function")
    took = time.perf_counter() - start
    print(f"traced {len(graph.nodes)} nodes in {took * 1e3:.1f} ms; {len(constants)} constants")
    inputs = [(i.name, i.kind, fmt_meta(graph.values[i.name])) for i in graph.inputs]
    table(inputs, ("input", "kind", "value"))
    print()
    rows = []
    for node in graph.nodes:
        args = [fmt_arg(a) for a in node.args] + [f"{k}={fmt_arg(v)}" for k, v in node.kwargs.items()]
        outs = ", ".join(f"{o}: {fmt_meta(graph.values[o])}" for o in node.outputs if o)
        rows.append((node.name, node.op, ", ".join(args), outs))
    table(rows, ("node", "op", "args", "outputs"))
    print()
    table([(fmt_arg(o.value), o.kind) for o in graph.outputs], ("output", "kind"))
    print()
    start = time.perf_counter()
    (result,) = run(graph, x.detach(), y)
    print(f"reference interpreter ran in {(time.perf_counter() - start) * 1e3:.1f} ms")
    compare("torchfuse.graph.run", result, expected)


def compiled_stage(backend: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]:
    def stage(x: torch.Tensor, y: torch.Tensor, expected: torch.Tensor) -> None:
        compile_fn = api("torchfuse.capture", "compile")
        backend_available(backend)
        compiled = compile_fn(complex_function, backend=backend)
        start = time.perf_counter()
        out = compiled(x, y)
        print(f"first call (capture + compile + run): {(time.perf_counter() - start):.2f} s")
        compare(f"compile(backend={backend!r}) forward", out, expected)
        # Gradients: the same loss through eager and through the compiled function.
        x_eager = x.detach().clone().requires_grad_(True)
        complex_function(x_eager, y).backward()
        x_ours = x.detach().clone().requires_grad_(True)
        compiled(x_ours, y).backward()
        compare(f"compile(backend={backend!r}) grad of x", x_ours.grad, x_eager.grad)

    return stage


def stage_explain(x: torch.Tensor, y: torch.Tensor, expected: torch.Tensor) -> None:
    explain = api("torchfuse.capture", "explain")
    print(explain(complex_function)(x, y))


STAGES: list[tuple[str, str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]]] = [
    ("graph: trace + reference interpreter",
     "the ATen-level Graph of the function as a table, run by the reference interpreter",
     stage_graph),
    ("capture: explain",
     "graph count, graph breaks with their source lines, ops per graph, guards, compile time",
     stage_explain),
    ("capture: compile, backend 'eager'",
     "bytecode capture with guards; the captured graph run by the reference interpreter",
     compiled_stage("eager")),
    ("autograd: compile, backend 'aot_eager'",
     "the joint forward/backward graph, its min-cut partition, and matching gradients",
     compiled_stage("aot_eager")),
    ("inductor + runtime: compile, backend 'inductor'",
     "fused Triton kernels in a Program, launched by the runtime (interpreted on a CPU)",
     compiled_stage("inductor")),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000, help="inputs are size x size (default 1000)")
    args = parser.parse_args(argv)

    heading("installed packages")
    rows = []
    for name in PACKAGES:
        dist = f"torchfuse-{name}"
        try:
            rows.append((dist, md.version(dist), f"torchfuse.{name}"))
        except md.PackageNotFoundError:
            rows.append((dist, "not installed", ""))
    for dist in ("torch", "triton"):
        try:
            rows.append((dist, md.version(dist), ""))
        except md.PackageNotFoundError:
            rows.append((dist, "not installed", ""))
    table(rows, ("distribution", "version", "import"))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = make_inputs(device, args.size)
    expected = complex_function(x, y)
    print(f"\ninputs: x, y = {args.size}x{args.size} float32 on {device}, x.requires_grad=True")
    print(f"eager result: {expected.item():.6f}")

    status = []
    for title, shows, stage in STAGES:
        heading(title)
        print(f"shows: {shows}")
        try:
            stage(x, y, expected)
        except NotBuilt as e:
            print(f"not built yet: {e}")
            status.append((title, "not built yet"))
        except Exception:
            traceback.print_exc(file=sys.stdout)
            status.append((title, "FAILED"))
        else:
            status.append((title, "ok"))

    heading("summary")
    table(status, ("stage", "status"))
    return 1 if any(s == "FAILED" for _, s in status) else 0


if __name__ == "__main__":
    sys.exit(main())
