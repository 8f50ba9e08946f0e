"""Template or cuBLAS, per shape: benchmark both once, keep the faster, remember the answer.

For one matched matmul ([`Matmul`][torchfuse.inductor.templates.matmul.Matmul]) the
candidates are

* ``extern`` -- the matmul and its epilogue compiled the way default mode compiles them
  (``aten.mm`` as an extern call to cuBLAS, the epilogue as a fused pointwise kernel): the
  region is cut out as a small graph and compiled by inductor without templates, then run
  by the runtime. When that compile fails, the same ops run eagerly, which is a fair stand-in:
  eager calls the same cuBLAS kernel, and its separate pointwise kernels only make the
  template look better on long epilogues (a warning says when this stand-in ran);
* ``template <config>`` -- the same small graph with the template in place, one per config
  ([`fit_configs`][torchfuse.inductor.templates.matmul.fit_configs]), run the same way, so both
  sides pay the same launch path.

Inputs are random tensors with the graph's sizes, strides, offsets and dtypes. The default
timer (`cuda_bench`) is Triton's ``do_bench`` (CUDA events, the first call compiles
outside the timed runs), median of about 50 ms of runs. The template wins when it is faster
than ``extern`` by more than ``margin``.

Decisions are stored in ``<cache_dir>/mm_choices.json`` (one JSON object, rewritten
atomically) under a key naming the op, sizes, strides, dtypes, the epilogue's
[`signature`][torchfuse.inductor.templates.epilogue.Epilogue.signature], the device name, the
torch and Triton versions, the float32 dot precision, the template version and the
candidate configs. Both times are stored, so a changed ``margin`` needs no new measurement.
Each decision is logged on the ``schedule`` channel::

    mm 4096x4096x4096 bf16 +add+gelu: template 0.61 ms (128x128x32 w4 s3) vs cuBLAS 0.74 ms -> template
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.caches import write_atomic
from torchfuse.graph.layouts import storage_extent
from torchfuse.graph.ops import to_dtype
from torchfuse.graph.verify import verify
from torchfuse.inductor.templates.matmul import DEFAULT_CONFIGS, Matmul, MMConfig, fit_configs
from torchfuse.inductor.templates.rewrite import find_matmuls, rewrite

TEMPLATE_VERSION = 2
"""Bumped when the generated kernel changes in a way that can change its speed (2: the
epilogue is the loop IR rendered by [`torchfuse.inductor.triton_ops`][torchfuse.inductor.triton_ops])."""

POLICIES = ("auto", "always", "never")
"""``auto``: benchmark per shape and keep the faster; ``always``: the template with its first
config, no benchmark; ``never``: leave the graph as it is."""

CACHE_FILE = "mm_choices.json"

log = logging.getLogger("torchfuse.inductor.templates")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to compute a matched matmul; ``run()`` computes it once on benchmark inputs."""

    kind: Literal["extern", "template"]
    config: MMConfig | None
    run: Callable[[], object]

    def label(self) -> str:
        return "extern" if self.config is None else f"template {self.config.label()}"


Bench = Callable[[Candidate], float]
"""A timer: the time of one ``candidate.run()`` in milliseconds (``inf`` when it cannot run)."""

CompileCandidate = Callable[[S.Graph, str], Callable[..., Any]]
"""Compiles a candidate's graph for a device into a callable, the way default mode would.
The pipeline that runs this pass passes its own (``inductor.compile.compile_candidate``):
a pass never imports the pipeline that contains it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Measured times of the best template config and of the extern path."""

    config: MMConfig | None
    """The fastest template config (None when no config ran)."""
    template_ms: float
    extern_ms: float

    def use_template(self, margin: float) -> bool:
        return self.config is not None and self.template_ms < self.extern_ms * (1.0 - margin)

    def to_json(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.config) if self.config else None,
                "template_ms": _finite(self.template_ms), "extern_ms": _finite(self.extern_ms)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Decision:
        cfg = d.get("config")
        return Decision(MMConfig(**cfg) if cfg else None, _unfinite(d["template_ms"]),
                        _unfinite(d["extern_ms"]))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _unfinite(x: float | None) -> float:
    return math.inf if x is None else float(x)


# ----------------------------------------------------------------------------- the store


class DecisionCache:
    """``<directory>/mm_choices.json``: decisions by key, read at each lookup, written whole
    to a temporary file and renamed (a reader never sees half a file; two writers racing
    lose one decision, which is then measured again)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / CACHE_FILE

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("torchfuse: ignoring unreadable %s (%s)", self.path, e)
            return {}
        if not isinstance(data, dict) or data.get("version") != 1:
            return {}
        if not isinstance(data.get("choices"), dict):
            return {}
        return data["choices"]

    def get(self, key: str) -> Decision | None:
        entry = self._read().get(key)
        if entry is None:
            return None
        try:
            return Decision.from_json(entry)
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, decision: Decision) -> None:
        choices = self._read()
        choices[key] = decision.to_json()
        text = json.dumps({"version": 1, "choices": choices}, indent=1, sort_keys=True)
        try:
            write_atomic(self.path, text)
        except OSError as e:  # a read-only disk costs the cache, never the compile
            log.warning("torchfuse: cannot write %s: %s", self.path, e)


def default_cache_dir() -> Path:
    """The runtime's cache directory (``TORCHFUSE_CACHE_DIR``), as inductor's caches use it."""
    from torchfuse.inductor.cache import cache_root

    return cache_root()


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return torch.device(device).type


def decision_key(mm: Matmul, configs: Sequence[MMConfig], fp32_precision: str) -> str:
    """The cache key of ``mm``'s decision (see the module doc for what it names)."""
    import triton

    cfgs = hashlib.sha256("|".join(c.label() + f" g{c.group_m}" for c in configs).encode()).hexdigest()[:12]
    return " | ".join([
        f"{mm.kind.name.lower()} {mm.batch}x{mm.m}x{mm.n}x{mm.k} {mm.dtype}",
        f"a{list(mm.a_strides)} b{list(mm.b_strides)}",
        mm.epilogue.signature(),
        device_name(mm.device),
        f"torch {torch.__version__} triton {triton.__version__} fp32 {fp32_precision}",
        f"template v{TEMPLATE_VERSION} configs {cfgs}",
    ])


# ----------------------------------------------------------------------------- timing


def cuda_bench(candidate: Candidate) -> float:
    """Milliseconds per ``candidate.run()`` on the current CUDA device: the median of Triton's
    ``do_bench`` (CUDA events), the timer the runtime's autotuner uses too."""
    from triton.testing import do_bench

    try:
        return float(do_bench(candidate.run, warmup=10, rep=50, return_mode="median"))
    except TypeError:  # a Triton without return_mode
        return float(do_bench(candidate.run, warmup=10, rep=50))


def random_like(meta: S.TensorMeta, device: str) -> torch.Tensor:
    """A tensor with ``meta``'s sizes, strides, offset and dtype, filled with N(0, 1)."""
    sizes, strides = tuple(meta.sizes), tuple(meta.strides)
    offset = int(meta.storage_offset)
    base = torch.randn(storage_extent(sizes, strides, offset), dtype=to_dtype(meta.dtype), device=device)
    return base.as_strided(sizes, strides, offset)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the choice


def region_graph(graph: S.Graph, mm: Matmul) -> tuple[S.Graph, Matmul]:
    """The matmul and its epilogue as a graph of their own (inputs: ``a``, ``b``, extras), and
    ``mm`` renumbered into it."""
    nodes = (graph.nodes[mm.index], *(graph.nodes[j] for j in mm.epilogue.nodes))
    inputs = list(dict.fromkeys(mm.tensors()))
    outs = [o for n in nodes for o in n.outputs]
    sub = S.Graph(
        name=f"{graph.name}_mm_choice",
        inputs=tuple(S.GraphInput(name=n) for n in inputs),
        outputs=(S.GraphOutput(value=S.TensorRef(name=mm.epilogue.out)),),
        nodes=nodes,
        values={n: graph.values[n] for n in (*inputs, *outs)},
        opsets=dict(graph.opsets),
    )
    epi = dataclasses.replace(mm.epilogue, nodes=tuple(range(1, len(nodes))))
    return sub, dataclasses.replace(mm, index=0, epilogue=epi)


def _runner(graph: S.Graph, tensors: list[torch.Tensor], device: str,
            compile_candidate: CompileCandidate | None) -> tuple[Callable[[], object], str]:
    """A callable running ``graph`` as default mode would (compiled), else eagerly."""
    from torchfuse.graph.interpreter import run as interpret

    if compile_candidate is None:
        return (lambda: interpret(graph, *tensors)), "eager"
    try:
        fn = compile_candidate(graph, device)
        return (lambda: fn(*tensors)), "compiled"
    except Exception as e:  # measuring must not fail the compile: eager runs the same matmul
        log.warning("torchfuse: mm choice: compiling %s failed (%s: %s); timing it eagerly",
                    graph.name, type(e).__name__, e)
        return (lambda: interpret(graph, *tensors)), "eager"


def candidates(graph: S.Graph, mm: Matmul, configs: Sequence[MMConfig], fp32_precision: str,
               compile_candidate: CompileCandidate | None = None) -> list[Candidate]:
    """The extern candidate first, then one template candidate per fitted config. Inputs and
    programs are made on a candidate's first run (a fake timer may never run them); each is
    compiled with ``compile_candidate`` (None: run by the graph interpreter)."""
    sub, local = region_graph(graph, mm)
    tensors: list[torch.Tensor] = []

    def inputs() -> list[torch.Tensor]:
        if not tensors:
            tensors.extend(random_like(sub.values[i.name], mm.device) for i in sub.inputs)
        return tensors

    def lazy(make: Callable[[], S.Graph]) -> Callable[[], object]:
        built: list[Callable[[], object]] = []

        def run() -> object:
            if not built:
                built.append(_runner(make(), inputs(), mm.device, compile_candidate)[0])
            return built[0]()

        return run

    out = [Candidate("extern", None, lazy(lambda: sub))]
    for cfg in fit_configs(configs, local):
        out.append(Candidate("template", cfg, lazy(
            lambda cfg=cfg: rewrite(sub, [(local, cfg)], fp32_precision=fp32_precision))))
    return out


def choose(graph: S.Graph, mm: Matmul, *, configs: Sequence[MMConfig], bench: Bench,
           cache: DecisionCache, margin: float, fp32_precision: str,
           compile_candidate: CompileCandidate | None = None) -> tuple[MMConfig | None, Decision]:
    """The config to use for ``mm`` (None: keep the extern matmul) and the decision behind it,
    measured with ``bench`` unless ``cache`` has it."""
    key = decision_key(mm, configs, fp32_precision)
    decision = cache.get(key)
    cached = decision is not None
    if decision is None:
        times: dict[MMConfig | None, float] = {}
        on_gpu = mm.device.startswith("cuda")
        for cand in candidates(graph, mm, configs, fp32_precision, compile_candidate):
            try:
                with torch.cuda.device(mm.device) if on_gpu else contextlib.nullcontext():
                    times[cand.config] = float(bench(cand))
            except Exception as e:  # a config that does not compile (shared memory) just loses
                log.info("torchfuse: mm choice: %s failed: %s: %s", cand.label(), type(e).__name__, e)
                times[cand.config] = math.inf
        extern_ms = times.pop(None)
        best = min(times, key=times.__getitem__, default=None)
        decision = Decision(best, times[best] if best is not None else math.inf, extern_ms)
        if math.isfinite(extern_ms):  # a failed baseline proves nothing: measure again next time
            cache.put(key, decision)
    use = decision.use_template(margin)
    cfg = f" ({decision.config.label()})" if decision.config else ""
    observe.get_logger("schedule").info(
        "%s: template %.3f ms%s vs cuBLAS %.3f ms -> %s%s", mm.describe(), decision.template_ms, cfg,
        decision.extern_ms, "template" if use else "cuBLAS", " (cached)" if cached else "")
    return (decision.config if use else None), decision


# ----------------------------------------------------------------------------- the pass


def _fp32_precision() -> str:
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def apply_mm_templates(
    graph: S.Graph,
    *,
    device: str,
    policy: str = "auto",
    cache_dir: Path | None = None,
    bench: Bench | None = None,
    configs: Sequence[MMConfig] = DEFAULT_CONFIGS,
    margin: float = 0.02,
    check: bool = True,
    compile_candidate: CompileCandidate | None = None,
) -> S.Graph:
    """Replace static-shape matmuls (``mm``, ``addmm``, ``bmm``) and their pointwise epilogues
    by Triton template launches (see the module doc for the before/after).

    ``device`` is the device the graph will run on. ``policy`` (`POLICIES`): ``"auto"``
    benchmarks each new shape against the extern (cuBLAS) path and keeps the template only
    when it is faster by more than ``margin``; it considers CUDA matmuls, or any device when
    a ``bench`` timer is given (default `cuda_bench`). Decisions are cached in
    ``<cache_dir>/mm_choices.json`` (default: the runtime's ``TORCHFUSE_CACHE_DIR``).
    ``"always"`` takes the template with the first of ``configs`` that fits, on any device,
    without measuring; ``"never"`` returns ``graph`` unchanged. Symbolic sizes are left
    alone. ``check`` runs [`verify`][torchfuse.graph.verify.verify] on the result.
    ``compile_candidate`` compiles the benchmark candidates (the pipeline passes its own,
    `torchfuse.inductor.compile.compile_candidate`; None: they run through the graph
    interpreter).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown mm template policy {policy!r}; use one of {', '.join(POLICIES)}")
    if policy == "never":
        return graph
    measured = policy == "auto"
    if measured and bench is None and not device.startswith("cuda"):
        return graph  # nothing to measure against without a GPU timer

    def device_ok(d: str) -> bool:
        return policy == "always" or bench is not None or d.startswith("cuda")

    found = find_matmuls(graph, device_ok)
    if not found:
        return graph
    precision = _fp32_precision()
    chosen: list[tuple[Matmul, MMConfig]] = []
    if measured:
        store = DecisionCache(cache_dir if cache_dir is not None else default_cache_dir())
        timer = bench or cuda_bench
        for mm in found:
            cfg, _ = choose(graph, mm, configs=configs, bench=timer, cache=store, margin=margin,
                            fp32_precision=precision, compile_candidate=compile_candidate)
            if cfg is not None:
                chosen.append((mm, cfg))
    else:
        chosen = [(mm, fit_configs(configs, mm)[0]) for mm in found]
    out = rewrite(graph, chosen, fp32_precision=precision)
    if check and chosen:
        verify(out)
    return out


__all__ = [
    "CACHE_FILE",
    "POLICIES",
    "TEMPLATE_VERSION",
    "Bench",
    "Candidate",
    "CompileCandidate",
    "Decision",
    "DecisionCache",
    "apply_mm_templates",
    "candidates",
    "choose",
    "cuda_bench",
    "decision_key",
    "default_cache_dir",
    "device_name",
    "random_like",
    "region_graph",
]
