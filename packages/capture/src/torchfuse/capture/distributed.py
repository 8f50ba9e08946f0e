"""Compiled code under ``torch.distributed``: DDP's bucket split, and ranks that must agree.

torch.distributed is the engine: DDP's reducer all-reduces, FSDP2's hooks all-gather and
reduce-scatter, and all of that runs in Python between our graphs (capture breaks at every
torch.distributed runtime call, `is_distributed_runtime`). This module only shapes the
graphs so that the engine can overlap.

**The bucket split.** DDP all-reduces a bucket of gradients as soon as every gradient in it
has been accumulated. A compiled forward whose backward is one autograd node produces every
parameter gradient at its very end, so no all-reduce can start before the backward is over.
When a graph is captured inside a DDP forward (DDP says so through
``DistributedDataParallel._get_active_ddp_module()``, the hook it keeps for compilers), it is
cut into pieces whose parameters fill about one bucket each, and each piece is compiled by the
backend on its own. The backward then runs piece by piece, last piece first, and DDP's hooks
fire for a bucket while the earlier pieces' backward is still running::

    graph (4 linear layers, bucket cap = 2 layers' parameters)
      t, addmm, relu, t, addmm, relu | t, addmm, relu, t, addmm
    pieces
      piece 0: x, w0, b0, w1, b1 -> h2        piece 1: h2, w2, b2, w3, b3 -> out

The cuts are chosen walking the graph backwards, as the backward visits it: a parameter
belongs to the node that first uses it (its gradient is complete only when the backward has
passed that node), and a cut goes before the node whose parameters fill the bucket (the first
bucket is DDP's smaller one, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``). The buckets
are DDP's own; the split only approximates them (DDP rebuilds its buckets after the first step
in the order gradients arrived), and a wrong guess costs overlap, never correctness.

**Ranks agree.** Every rank captures on its own. Guards and breaks depend only on the rank's
own inputs, so ranks fed alike compile alike; a rank that compiles differently (a branch on
``dist.get_rank()``, different input shapes) still computes right, but overlaps differently or
recompiles out of step. `check_ranks` compares a fingerprint of each graph across ranks
through the process group's store, with a timeout, and warns (or raises, by config) naming
the ranks and the graph: never a silent hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.capture import config as C
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED

_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
                "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


class RankDivergenceWarning(RuntimeWarning):
    """Ranks compiled different graphs at the same point, or one did not compile it in time."""


class RankDivergence(RuntimeError):
    """`RankDivergenceWarning` raised as an error (``config.rank_check = "error"``)."""


# ----------------------------------------------------------------------------- capture

_DISTRIBUTED_QUERIES = frozenset({"get_rank", "get_world_size", "is_initialized", "is_available",
                                  "get_backend", "is_torchelastic_launched"})
"""torch.distributed functions that only read this process's fixed state: folded to constants."""


def is_distributed_runtime(value: Any) -> bool:
    """A torch.distributed callable that talks to other ranks or to DDP's C++ reducer
    (collectives, ``Reducer`` and ``ProcessGroup`` methods, FSDP internals): never called on
    fakes at capture time (it would run once, then never again), always a graph break. The
    functional collectives are ordinary operators and stay capturable."""
    mod = getattr(value, "__module__", None) or ""
    if not mod.startswith(("torch.distributed", "torch._C._distributed")):
        return False
    if mod.startswith("torch.distributed._functional_collectives"):
        return False
    return getattr(value, "__name__", None) not in _DISTRIBUTED_QUERIES


# ----------------------------------------------------------------------------- DDP


def active_ddp() -> Any:
    """The DDP module whose forward is running on this thread's call stack, or ``None``."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


@dataclasses.dataclass(frozen=True, slots=True)
class BucketPlan:
    """Where a graph is cut for DDP, and why (explain and the ``graph`` log show it)."""

    cuts: tuple[int, ...]
    """Node indices where a new piece starts (sorted; empty: one piece)."""
    bucket_bytes: tuple[int, ...]
    """Parameter bytes per piece, in forward order."""
    reason: str = ""
    """Why the graph was not split, when it was not."""


def bucket_caps(ddp: Any) -> tuple[int, int]:
    """(first bucket cap, bucket cap) in bytes: ``config.ddp_bucket_bytes`` when set, else
    DDP's ``bucket_bytes_cap`` and torch's first-bucket size."""
    cap = C.config.ddp_bucket_bytes or int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))
    # torch 2.13 keeps DDP's first-bucket size in its bucket config; older ones use torch's
    first = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    if first is None or C.config.ddp_bucket_bytes:
        first = int(getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", cap))
    return min(int(first), cap), cap


def plan_buckets(graph: S.Graph, params: dict[str, int], first_cap: int, cap: int) -> BucketPlan:
    """Cuts for ``graph`` given the byte size of each parameter input that DDP reduces
    (by input name). See the module docstring."""
    why = splittable(graph)
    if why:
        return BucketPlan((), (), why)
    first_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for name in _tensor_names(node):
            if name in params:
                first_use.setdefault(name, i)
    by_node: dict[int, int] = {}
    for name, i in first_use.items():
        by_node[i] = by_node.get(i, 0) + params[name]
    forbidden = _uncuttable(graph)
    cuts: list[int] = []
    sizes: list[int] = []
    filled, limit = 0, first_cap
    for i in range(len(graph.nodes) - 1, 0, -1):
        filled += by_node.get(i, 0)
        if filled >= limit and i not in forbidden:  # else the cut moves up to the next place
            cuts.append(i)
            sizes.append(filled)
            filled, limit = 0, cap
    sizes.append(filled + by_node.get(0, 0))
    if not cuts:
        return BucketPlan((), (sizes[0],), "its parameters fit in one bucket")
    return BucketPlan(tuple(reversed(cuts)), tuple(reversed(sizes)))


def _uncuttable(graph: S.Graph) -> set[int]:
    """Node indices no cut may go before: a tensor written in place (or through a view of it)
    must be made in the piece that writes it, since a piece's outputs are another piece's
    autograd results. Graph inputs written in place are fine (each piece gets the caller's
    tensor, and the backend copies a new value back into it, as for a whole graph)."""
    from torchfuse.graph.ops import resolve_op
    from torchfuse.graph.tracing import is_view_op, mutated_arguments

    made_at: dict[str, int] = {}
    root: dict[str, str] = {}
    out: set[int] = set()
    for i, node in enumerate(graph.nodes):
        try:
            op = resolve_op(node.op)
        except Exception:  # not an ATen op (a user kernel): its writes are not declared
            op = None
        if op is not None:
            for k in mutated_arguments(op):
                arg = node.args[k] if k < len(node.args) else None
                if isinstance(arg, S.TensorRef):
                    base = root.get(arg.name, arg.name)
                    if base in made_at:
                        out.update(range(made_at[base] + 1, i + 1))
        names = _tensor_names(node)
        for o in node.outputs:
            if o:
                made_at[o] = i
                if op is not None and names and is_view_op(op):
                    root[o] = root.get(names[0], names[0])
    return out


def splittable(graph: S.Graph) -> str:
    """Why ``graph`` cannot be cut into pieces (empty when it can)."""
    if graph.symbols:
        return "it has symbolic sizes"
    for out in graph.outputs:
        if out.kind not in ("user_output", "loss") or not isinstance(out.value, S.TensorRef):
            return f"it has a {out.kind} output that is not a plain tensor (mutated inputs stay in one graph)"
    if any(node.op == SET_GRAD_ENABLED for node in graph.nodes):
        return "it switches grad mode"
    return ""


def ddp_parameters(graph: S.Graph, ddp: Any) -> dict[str, int]:
    """Byte sizes of the graph's parameter inputs that DDP reduces (by input name)."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    out: dict[str, int] = {}
    for inp in graph.inputs:
        meta = graph.values.get(inp.name)
        if inp.kind != "parameter" or meta is None or not meta.requires_grad:
            continue
        if inp.target is not None and any(inp.target == i or inp.target.endswith("." + i) for i in ignored):
            continue
        n = 1
        for s in meta.sizes:
            n *= int(s) if isinstance(s, int) else 0
        out[inp.name] = n * _DTYPE_BYTES.get(meta.dtype, 4)
    return out


# ----------------------------------------------------------------------------- splitting


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    graph: S.Graph
    inputs: tuple[str, ...]
    """Value names fed to the piece, in its input order."""
    outputs: tuple[str, ...]
    """Value names it returns, in its output order."""


def split_graph(graph: S.Graph, cuts: Sequence[int]) -> list[Piece]:
    """Cut ``graph`` before each node index in ``cuts``: sequential pieces, each a Graph whose
    inputs are the original inputs it reads and the values earlier pieces made, and whose
    outputs are the values later pieces read and the graph outputs it makes."""
    bounds = [0, *cuts, len(graph.nodes)]
    spans = [graph.nodes[a:b] for a, b in itertools.pairwise(bounds)]
    made_in: dict[str, int] = {}
    for k, nodes in enumerate(spans):
        for node in nodes:
            for o in node.outputs:
                if o:
                    made_in[o] = k
    wanted: list[set[str]] = [set() for _ in spans]
    for k, nodes in enumerate(spans):
        for node in nodes:
            for name in _tensor_names(node):
                if made_in.get(name, k) < k:
                    wanted[made_in[name]].add(name)
    for out in graph.outputs:
        name = out.value.name  # type: ignore[union-attr]  # splittable() checked TensorRef
        if name in made_in:
            wanted[made_in[name]].add(name)
    by_name = {inp.name: inp for inp in graph.inputs}
    pieces: list[Piece] = []
    for k, nodes in enumerate(spans):
        reads: list[str] = []
        seen: set[str] = set()
        for node in nodes:
            for name in _tensor_names(node):
                if name not in seen and made_in.get(name, -1) != k and (name in by_name or name in made_in):
                    seen.add(name)
                    reads.append(name)
        inputs = tuple(by_name[n] if n in by_name else S.GraphInput(name=n, kind="user_input")
                       for n in reads)
        made = [o for node in nodes for o in node.outputs if o]
        outs = tuple(n for n in made if n in wanted[k])
        used = set(reads) | set(made)
        piece = S.Graph(name=f"{graph.name}_piece{k}", inputs=inputs,
                        outputs=tuple(S.GraphOutput(value=S.TensorRef(name=n)) for n in outs),
                        nodes=tuple(nodes), values={n: m for n, m in graph.values.items() if n in used},
                        opsets=graph.opsets, meta=graph.meta)
        pieces.append(Piece(piece, (reads and tuple(reads)) or (), outs))
    return pieces


def _tensor_names(node: S.Node) -> list[str]:
    names: list[str] = []

    def visit(arg: S.Argument) -> None:
        if isinstance(arg, S.TensorRef):
            names.append(arg.name)
        elif isinstance(arg, S.ListArg):
            for item in arg.items:
                visit(item)
    for arg in (*node.args, *node.kwargs.values()):
        visit(arg)
    return names


def _example(meta: S.TensorMeta) -> torch.Tensor:
    sizes = [int(s) for s in meta.sizes]
    strides = [int(s) for s in meta.strides]
    dtype = getattr(torch, meta.dtype)
    t = torch.empty_strided(sizes, strides, dtype=dtype, device=meta.device)
    if meta.requires_grad and (dtype.is_floating_point or dtype.is_complex):
        t.requires_grad_(True)
    return t


def compile_pieces(graph: S.Graph, examples: Sequence[Any], cuts: Sequence[int],
                   compile_one: Callable[[S.Graph, list[Any]], Callable[..., list[Any]]]
                   ) -> Callable[..., list[Any]]:
    """Compile each piece of ``graph`` with ``compile_one`` and chain them: one callable with
    the graph's calling convention. Values between pieces are kept by name."""
    pieces = split_graph(graph, cuts)
    given = {inp.name: ex for inp, ex in zip(graph.inputs, examples, strict=True)}
    steps: list[tuple[Callable[..., list[Any]], tuple[int, ...], tuple[int, ...]]] = []
    slot: dict[str, int] = {inp.name: i for i, inp in enumerate(graph.inputs)}
    folder = observe.current_graph()
    for k, piece in enumerate(pieces):
        piece_examples = [given[n] if n in given else _example(graph.values[n]) for n in piece.inputs]
        # each piece's artifacts (TORCHFUSE_DEBUG) in a folder of its own under the graph's
        with observe.compiling(f"{folder}/piece_{k}") if folder else contextlib.nullcontext():
            fn = compile_one(piece.graph, piece_examples)
        for n in piece.outputs:
            slot.setdefault(n, len(slot))
        steps.append((fn, tuple(slot[n] for n in piece.inputs), tuple(slot[n] for n in piece.outputs)))
    result = tuple(slot[o.value.name] for o in graph.outputs)  # type: ignore[union-attr]
    size = len(slot)

    def run(*inputs: Any) -> list[Any]:
        env: list[Any] = [*inputs, *([None] * (size - len(inputs)))]
        for fn, reads, writes in steps:
            outs = fn(*[env[i] for i in reads])
            for i, v in zip(writes, outs, strict=True):
                env[i] = v
        return [env[i] for i in result]
    run.pieces = [p.graph for p in pieces]  # type: ignore[attr-defined]
    return run


def split_for_ddp(graph: S.Graph, examples: Sequence[Any], ddp: Any,
                  compile_one: Callable[[S.Graph, list[Any]], Callable[..., list[Any]]],
                  name: str | None = None) -> tuple[Callable[..., list[Any]], BucketPlan]:
    """The compiled graph, cut at DDP's bucket boundaries when ``config.ddp_split`` is on.
    With ``name`` (the compiled function's), the ranks compare the graph and its cuts
    (`check_ranks`) before the backend compiles it: ranks compile at their own pace, so what
    they wait for each other is the capture alone."""
    first, cap = bucket_caps(ddp)
    plan = plan_buckets(graph, ddp_parameters(graph, ddp), first, cap) if C.config.ddp_split else \
        BucketPlan((), (), "config.ddp_split is off")
    if C.log_enabled("graph"):
        how = f"{len(plan.cuts) + 1} pieces at nodes {list(plan.cuts)}, parameter bytes " \
              f"{list(plan.bucket_bytes)}" if plan.cuts else f"not split: {plan.reason}"
        C.logger("graph").info("DDP bucket split of %s (caps %d/%d bytes): %s", graph.name,
                               first, cap, how)
    if name is not None:
        check_ranks(name, graph, plan)
    if not plan.cuts:
        return compile_one(graph, list(examples)), plan
    return compile_pieces(graph, examples, plan.cuts, compile_one), plan


# ----------------------------------------------------------------------------- ranks


def fingerprint(graph: S.Graph, plan: BucketPlan | None) -> str:
    """What must be equal across ranks: the ops, the input metadata, the cuts."""
    h = hashlib.sha256()
    for inp in graph.inputs:
        m = graph.values.get(inp.name)
        h.update(f"{inp.kind}:{inp.target}:{m.dtype if m else ''}:{m.sizes if m else ''};".encode())
    for node in graph.nodes:  # ops with their arguments: a constant that differs counts too
        h.update(repr((node.op, node.args, node.kwargs)).encode())
    h.update(repr(plan.cuts if plan else ()).encode())
    return h.hexdigest()[:16]


_COUNTS: dict[str, int] = {}


def check_ranks(name: str, graph: S.Graph, plan: BucketPlan | None) -> None:
    """Compare this graph with the graph every other rank captured at the same point (the
    n-th graph of ``name`` captured inside a DDP forward). Ranks publish a fingerprint in the
    default process group's store and wait for the others' for
    ``config.rank_check_timeout`` seconds; a difference or a rank that never arrives is
    reported as `RankDivergenceWarning` (``config.rank_check = "warn"``, the default) or
    `RankDivergence` (``"error"``). Off without a process group of two or more ranks, or
    with ``config.rank_check = "off"``."""
    mode = C.config.rank_check
    if mode == "off" or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    if world < 2:
        return
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    n = _COUNTS[name] = _COUNTS.get(name, 0) + 1
    key = f"torchfuse/graphs/{name}/{n}"
    mine = fingerprint(graph, plan)
    store.set(f"{key}/{rank}", mine)
    others = [f"{key}/{r}" for r in range(world) if r != rank]
    try:
        store.wait(others, datetime.timedelta(seconds=C.config.rank_check_timeout))
    except Exception:  # the store raises its own timeout error type per backend
        missing = [r for r in range(world) if r != rank and not store.check([f"{key}/{r}"])]
        _report(f"rank {rank} captured graph {n} of {name} ({len(graph.nodes)} nodes), but "
                f"rank(s) {missing} did not within {C.config.rank_check_timeout:g} s: the ranks "
                f"capture differently (a guard or a graph break that depends on the rank or "
                f"on its data); run explain() on each rank to compare")
        return
    theirs = {r: store.get(f"{key}/{r}").decode() for r in range(world) if r != rank}
    differ = sorted(r for r, fp in theirs.items() if fp != mine)
    if differ:
        _report(f"graph {n} of {name} differs between rank {rank} and rank(s) {differ} "
                f"(ops, input metadata or DDP bucket cuts): every rank should compile the same "
                f"graphs; run explain() on each rank to compare")


def _report(message: str) -> None:
    if C.config.rank_check == "error":
        raise RankDivergence(f"torchfuse: {message}")
    warnings.warn(f"torchfuse: {message}", RankDivergenceWarning, stacklevel=2)


def reset_rank_checks() -> None:
    """Forget how many graphs each name compiled (a test starting over in one process)."""
    _COUNTS.clear()


__all__ = ["BucketPlan", "RankDivergence", "RankDivergenceWarning", "active_ddp", "check_ranks",
           "compile_pieces", "is_distributed_runtime", "plan_buckets", "split_for_ddp", "split_graph"]
