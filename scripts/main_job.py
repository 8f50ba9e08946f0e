"""The main job: compile a real function with torchfuse and show what every stage produced.

Run it with ``hatch run main`` (README quickstart, first command). It compiles

    def complex_function(x, y):
        a = x + y; b = a * 2.0; c = torch.relu(b); e = silu(c); d = e.sum(dim=1); return d.mean()

for two 1000x1000 float32 inputs (the first requiring grad) with the default ``inductor``
backend, and prints, stage by stage: the captured graph and its guards, the joint graph and
its forward/backward partition, the pre- and post-fusion loop IR, the generated kernels
and the runtime's call function. Then it runs compiled and eager, checks that values and
gradients agree, and reports compile time and steady-state time. A small MLP training step
(compiled module + SGD) follows, checked against eager step by step.

On a machine without a GPU the kernels are C++ with OpenMP (the CPU default; the script says
which code generator wrote them, and why). With a GPU it uses the GPU.

Exit status 0 when every comparison with eager passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.metadata as md
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch

# Without a GPU the kernels are C++ with OpenMP, the inductor's CPU default. With
# TRITON_INTERPRET=1 (set before anything imports triton) they are Triton kernels run by
# Triton's interpreter (slow: the test path); TORCHFUSE_CPU_BACKEND=cpp|triton chooses
# explicitly (docs: "C++ code for the CPU").

# A fresh compile cache, so that every stage really runs (and shows its artifacts) and the
# first-call time is a cold compile. Set TORCHFUSE_CACHE_DIR yourself to see a warm start.
if "TORCHFUSE_CACHE_DIR" not in os.environ:
    os.environ["TORCHFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchfuse_main_job_")
    atexit.register(shutil.rmtree, os.environ["TORCHFUSE_CACHE_DIR"], ignore_errors=True)

import torchfuse.capture as tfc
import torchfuse.runtime
from torchfuse.graph import observe

# The job says itself, in its header, that kernels run in Triton's interpreter on the CPU;
# the runtime's own warning about it would point into library code.
warnings.filterwarnings("ignore", message="torchfuse.runtime: running Triton kernels on the CPU")

PACKAGES = ("graph", "capture", "autograd", "inductor", "runtime")
STAGES = (
    # (title, artifact file name, what it is)
    ("1. capture: the graph", "graph.py", "the ATen-level graph capture recorded from the bytecode"),
    ("1. capture: the guards", "guards.txt", "the checks that must hold to reuse the graph"),
    ("2. autograd: the joint graph", "joint.py", "primals + tangents -> outputs + gradients"),
    ("2. autograd: the forward graph", "forward.py", "what runs in the forward, incl. saved values"),
    ("2. autograd: the backward graph", "backward.py", "saved values + tangents -> gradients"),
    ("3. inductor: loop IR before fusion", "ir_pre_fusion.txt", "one loop nest per ATen op"),
    ("3. inductor: loop IR after fusion", "ir_post_fusion.txt", "the kernels the scheduler formed"),
    ("3. inductor: generated code", "output_code.py", "the kernels (C++ on the CPU) + a call function"),
)


def complex_function(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x + y
    b = a * 2.0
    c = torch.relu(b)
    e = torch.nn.functional.silu(c)
    d = e.sum(dim=1)
    f = d.mean()
    return f


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, n_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x))
        return torch.nn.functional.cross_entropy(self.fc2(h), target)


def heading(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def step(text: str) -> None:
    """Say what is about to take a while (a cold compile on the CPU takes seconds)."""
    print(f"   ... {text}", flush=True)


class LoadedPrograms:
    """Keeps every CompiledProgram the inductor backend loads while active, to show the
    runtime's side (call function, launches, caches). The backend calls
    ``torchfuse.runtime.load`` at compile time, so wrapping that one name sees them all."""

    def __init__(self) -> None:
        self.programs: list = []

    def __enter__(self) -> LoadedPrograms:
        self._real = torchfuse.runtime.load

        def load(*args, **kwargs):
            program = self._real(*args, **kwargs)
            self.programs.append(program)
            return program

        torchfuse.runtime.load = load
        return self

    def __exit__(self, *exc) -> None:
        torchfuse.runtime.load = self._real


def stage_table(art: observe.Collector) -> list[tuple[str, str, float]]:
    """(folder, stage, seconds) from the last ``timings.json`` of each compiled entry."""
    import json

    latest: dict[str, str] = {}
    for a in art.artifacts:
        if a.filename == "timings.json":
            latest[a.graph] = a.text
    return [(folder, stage, seconds) for folder, text in latest.items()
            for stage, seconds in json.loads(text)["stages_s"].items()]


GROUP_ORDER = ("capture", "aot", "inductor", "runtime", "backward.inductor", "backward.runtime")


def stage_group(stage: str) -> str:
    """``inductor.schedule`` -> ``inductor``; ``backward.inductor.lower`` -> ``backward.inductor``."""
    parts = stage.split(".")
    return ".".join(parts[:2]) if parts[0] == "backward" else parts[0]


def show_timings(rows: list[tuple[str, str, float]], wall: float) -> None:
    heading("4. time per stage of the first call  [each entry's timings.json / timings.txt]")
    if not rows:
        show(None, 0)
        return
    rank = {g: i for i, g in enumerate(GROUP_ORDER)}
    for folder in dict.fromkeys(f for f, _, _ in rows):
        print(f"   --- {folder}")
        groups: dict[str, list[tuple[str, float]]] = {}
        for f, stage, seconds in rows:
            if f == folder:
                groups.setdefault(stage_group(stage), []).append((stage, seconds))
        for group in sorted(groups, key=lambda g: rank.get(g, len(rank))):
            stages = groups[group]
            print(f"   {group:<36} {sum(s for _, s in stages) * 1e3:10.2f} ms")
            if len(stages) > 1 or stages[0][0] != group:
                for stage, seconds in stages:
                    print(f"       {stage:<32} {seconds * 1e3:10.2f} ms")
    total = sum(s for _, _, s in rows)
    print(f"   {'compile stages, total':<36} {total * 1e3:10.2f} ms")
    print(f"   {'first forward + backward, wall':<36} {wall * 1e3:10.2f} ms   (the rest is kernel "
          f"compiles and the first launches: see 5.)")


def show_runtime(programs: list, max_lines: int) -> None:
    heading("5. runtime: the generated call function, launches and caches")
    if not programs:
        show(None, 0)
        return
    for p in programs:
        st = p.stats
        print(f"   --- {p!r}")
        phases = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in st.first_call.items()) or \
            "none (no kernel to choose a config for)"
        print(f"   kernels imported {st.kernels_loaded} "
              f"(import + precompile {st.compile_seconds * 1e3:.1f} ms); first-call phases: {phases}")
        hits = "n/a" if st.triton_cache_hits is None else st.triton_cache_hits
        made = "n/a" if st.triton_compiles is None else st.triton_compiles
        print(f"   calls {st.calls}, kernel launches {st.kernel_launches}, Triton cache hits {hits}, "
              f"Triton compiles {made}, autotuned {st.autotuned}, "
              f"autotune-cache hits {st.autotune_cache_hits}")
        show(p.source, max_lines)


def show(text: str | None, max_lines: int) -> None:
    if text is None:
        print("   (this stage emitted no artifact)")
        return
    lines = text.rstrip().splitlines()
    for line in lines[:max_lines]:
        print("   " + line)
    if len(lines) > max_lines:
        print(f"   ... ({len(lines) - max_lines} more lines; run with --full or TORCHFUSE_DEBUG=1)")


def timed_median(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_seed_function(device: str, size: int, repeats: int, max_lines: int) -> bool:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=gen).to(device).requires_grad_(True)
    y = torch.randn(size, size, generator=gen).to(device)

    compiled = tfc.compile(complex_function)
    with observe.collect() as art, LoadedPrograms() as loaded:
        step("first call: capture, autograd, inductor and the runtime compile the function")
        t0 = time.perf_counter()
        out = compiled(x, y)
        sync()
        first_fwd = time.perf_counter() - t0
        step(f"first call done in {first_fwd:.2f} s; first backward")
        t0 = time.perf_counter()
        (gx,) = torch.autograd.grad(out, [x])
        sync()
        first_bwd = time.perf_counter() - t0

    for title, filename, what in STAGES:
        heading(f"{title}  [{filename}: {what}]")
        # forward (or inference) first, then the backward half
        texts = sorted((a for a in art.artifacts if a.filename.endswith(filename)),
                       key=lambda a: a.filename.startswith("backward_"))
        if not texts:
            show(None, max_lines)
        for a in texts:
            if len(texts) > 1:
                print(f"   --- {a.graph}/{a.filename}")
            show(a.text, max_lines)

    show_timings(stage_table(art), first_fwd + first_bwd)
    show_runtime(loaded.programs, max_lines)

    heading("6. run: compiled vs eager")
    xe = x.detach().clone().requires_grad_(True)
    ref = complex_function(xe, y)
    (gref,) = torch.autograd.grad(ref, [xe])
    ok = True
    for name, got, want in (("output", out, ref), ("grad x", gx, gref)):
        diff = (got.detach() - want.detach()).abs().max().item()
        try:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            verdict = "match"
        except AssertionError:
            verdict, ok = "MISMATCH", False
        print(f"   {name:<7} max |compiled - eager| = {diff:.3e}  -> {verdict}")

    step(f"timing {repeats} calls each, compiled and eager")
    steady = timed_median(lambda: compiled(x, y), repeats, sync)
    with torch.no_grad():
        eager = timed_median(lambda: complex_function(x, y), repeats, sync)
    print(f"   first call (capture + aot + inductor + runtime + run): forward {first_fwd:.2f} s, "
          f"first backward {first_bwd:.2f} s")
    print(f"   steady-state forward: compiled {steady * 1e3:.3f} ms, eager {eager * 1e3:.3f} ms "
          f"(median of {repeats})")
    return ok


def run_mlp(device: str, steps: int) -> bool:
    heading(f"7. a small MLP training step, compiled module + SGD, {steps} steps vs eager")
    torch.manual_seed(0)
    model = MLP().to(device)
    ref_model = MLP().to(device)
    ref_model.load_state_dict(model.state_dict())
    compiled = tfc.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 32, generator=gen).to(device)
    target = torch.randint(0, 10, (16,), generator=gen).to(device)
    worst = 0.0
    t0 = time.perf_counter()
    for step in range(steps):
        loss = compiled(x, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = ref_model(x, target)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        worst = max(worst, abs(loss.item() - ref_loss.item()))
        if step in (0, steps - 1):
            print(f"   step {step:2d}: loss compiled {loss.item():.6f}  eager {ref_loss.item():.6f}")
    print(f"   {steps} steps in {time.perf_counter() - t0:.2f} s; largest loss difference {worst:.2e}")
    ok = worst < 1e-4
    print(f"   -> {'match' if ok else 'MISMATCH'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1000, help="rows and columns of x and y")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (default 3 CPU, 50 GPU)")
    ap.add_argument("--steps", type=int, default=20, help="MLP training steps")
    ap.add_argument("--full", action="store_true", help="print every artifact in full")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    heading("torchfuse: from a Python function to fused kernels")
    for name in PACKAGES:
        print(f"   torchfuse-{name:<9} {md.version(f'torchfuse-{name}')}")
    import triton

    print(f"   torch {torch.__version__}, triton {triton.__version__}, Python {sys.version.split()[0]}")
    if device == "cpu":
        from torchfuse.inductor.config import config as inductor_config
        from torchfuse.inductor.config import cpu_kernels

        language, why = cpu_kernels(inductor_config)
        print(f"   No GPU: the kernels are {'C++ with OpenMP' if language == 'cpp' else 'Triton'} ({why}).")
        if language == "triton":
            print("   Triton's interpreter is exact but slow: seconds per call where a GPU takes")
            print("   microseconds.")
        else:
            print(f"   threads: {torch.get_num_threads()} (torch intra-op; C++ kernels: OpenMP's default)")
    else:
        print(f"   GPU: {torch.cuda.get_device_name()}")

    repeats = args.repeats or (3 if device == "cpu" else 50)
    ok = run_seed_function(device, args.size, repeats, 10_000 if args.full else 40)
    ok = run_mlp(device, args.steps) and ok
    heading("result: " + ("compiled matches eager everywhere" if ok else "MISMATCH, see above"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
