"""The ranks' side of the distributed tests: ``python workers.py CASES RANK WORLD PORT OUT``.

Each case trains a tiny model for a few steps twice on the same process group, once eagerly
(the reference) and once compiled, with the same seed and the same per-rank data, and checks
at every step that the losses and all parameters match. It writes what the test asserts on
(graph and piece counts, warnings) to ``OUT/result<RANK>.json``, one entry per case of the
comma-separated ``CASES``; a case that raises (a mismatch) has its traceback there instead.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3
BACKEND = "aot_eager"
DIST_BACKEND = os.environ.get("TORCHFUSE_TEST_DIST_BACKEND", "gloo")
"""``nccl`` on the GPU machine (`test_gpu.py`): then every rank uses GPU ``rank``."""
DEVICE = "cuda" if DIST_BACKEND == "nccl" else "cpu"


def ddp(module: nn.Module, **kwargs) -> DDP:
    """``DDP(module)`` on this rank's device."""
    if DEVICE == "cuda":
        return DDP(module.to(f"cuda:{dist.get_rank()}"), device_ids=[dist.get_rank()], **kwargs)
    return DDP(module, **kwargs)


class MLP(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.l0 = nn.Linear(8, 32)
        self.l1 = nn.Linear(32, 32)
        self.l2 = nn.Linear(32, 4)
        self.spare = nn.Linear(32, 4) if unused else None

    def forward(self, x):
        return self.l2(torch.relu(self.l1(torch.relu(self.l0(x)))))


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, n: int = 2, d: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def data(rank: int, step: int, micro: int = 0, features: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return (torch.randn(4, features, generator=g).to(_device()),
            torch.randn(4, 4, generator=g).to(_device()))


def _device() -> str:
    return f"cuda:{dist.get_rank()}" if DEVICE == "cuda" else "cpu"


def fresh(make, seed: int = 0):
    torch.manual_seed(seed)
    return make()


def train(model, params, steps: int = STEPS, accumulate: int = 1, features: int = 8,
          no_sync=None) -> list[tuple[float, list[torch.Tensor]]]:
    """Losses and parameters after each step (``accumulate`` micro-batches per step, all but
    the last under ``no_sync`` when given)."""
    opt = torch.optim.SGD(params, lr=0.1)
    rank = dist.get_rank()
    history = []
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for micro in range(accumulate):
            x, y = data(rank, step, micro, features)
            ctx = no_sync() if no_sync is not None and micro < accumulate - 1 else _null()
            with ctx:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            total += loss.item()
        opt.step()
        history.append((total, [p.detach().clone() for p in params]))
    return history


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def same(compiled, eager, what: str) -> None:
    assert len(compiled) == len(eager)
    for step, ((lc, pc), (le, pe)) in enumerate(zip(compiled, eager, strict=True)):
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, step=step: f"{what} step {step} loss: {m}")
        for i, (a, b) in enumerate(zip(pc, pe, strict=True)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, i=i, step=step: f"{what} step {step} param {i}: {m}")


def pieces(compiled_fn) -> list[int]:
    """Pieces per compiled graph that carries a DDP bucket plan."""
    return [len(r.ddp_plan.cuts) + 1 for r in compiled_fn.results if r.ddp_plan is not None]


def graph_count(compiled_fn) -> int:
    from torchfuse.capture.compiler import counts_as_graph

    return sum(1 for r in compiled_fn.results if counts_as_graph(r))


# ----------------------------------------------------------------------------- cases
# bucket_cap_mb=0.001 (1048 bytes) puts each of MLP's layers in a bucket of its own


def ddp_both_ways(rank: int, world: int) -> dict:
    from torchfuse.capture import compile

    out = {}
    eager = fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001))
    ref = train(eager, list(eager.parameters()))
    outer = compile(fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001)), backend=BACKEND)
    same(train(outer, list(outer.parameters())), ref, "compile(DDP(m))")
    out["outer_pieces"] = pieces(outer._compiled)
    out["outer_graphs"] = graph_count(outer._compiled)
    inner_model = compile(fresh(MLP), backend=BACKEND)
    inner = ddp(inner_model, bucket_cap_mb=0.001)
    same(train(inner, list(inner.parameters())), ref, "DDP(compile(m))")
    out["inner_pieces"] = pieces(inner_model._compiled)
    from torchfuse.capture import explain

    with outer.no_sync():  # explain runs one forward; a synced one would expect a backward
        report = explain(outer)(data(rank, 0)[0])
    out["explain_pieces"], out["explain_text"] = report.pieces, str(report)
    return out


def ddp_gpt2(rank: int, world: int) -> dict:
    """A real model: transformers' GPT-2 with a tiny config, compiled around DDP."""
    from torchfuse.capture import compile

    # a worker is its own process: PyPI's torchvision next to a CPU torch needs the shim the
    # root conftest installs, before transformers imports torchvision
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import torchvision_compat

    torchvision_compat.install()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=0, eos_token_id=0)

    def make():
        torch.manual_seed(0)
        return ddp(GPT2LMHeadModel(cfg), bucket_cap_mb=0.01)

    def steps(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        history = []
        for _ in range(2):
            ids = torch.randint(0, 64, (2, 8), generator=g).to(_device())
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            history.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
        return history
    ref = steps(make())
    compiled = compile(make(), backend=BACKEND)
    same(steps(compiled), ref, "compile(DDP(GPT-2))")
    return {"pieces": pieces(compiled._compiled), "graphs": graph_count(compiled._compiled)}


def overlap_order(ddp_call, wrapped) -> list[str]:
    """One backward of ``ddp_call``: the order in which DDP all-reduced its buckets and the
    first piece of the compiled graph (the one nearest the input) began its backward, in the
    second step (DDP puts every parameter in one bucket until its first backward is over)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    events: list[str] = []

    def hook(state, bucket):
        events.append(f"bucket {bucket.index()}")
        return allreduce_hook(state, bucket)
    x, y = data(dist.get_rank(), 0)
    nn.functional.mse_loss(ddp_call(x), y).backward()  # DDP rebuilds its buckets after step 1
    wrapped.register_comm_hook(None, hook)
    loss = nn.functional.mse_loss(ddp_call(x), y)
    compiled, todo, seen = [], [loss.grad_fn], set()
    while todo:  # the compiled pieces' backward nodes, nearest the loss first
        node = todo.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Compiled" in node.name():
            compiled.append(node)
        todo += [n for n, _ in node.next_functions]
    compiled[-1].register_prehook(lambda grads: events.append("first piece backward"))
    loss.backward()
    return events


def ddp_overlap(rank: int, world: int) -> dict:
    from torchfuse.capture import compile, config

    out = {}
    for split in (True, False):
        with config.patch(ddp_split=split):
            wrapped = fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001))
            out[f"split={split}"] = overlap_order(compile(wrapped, backend=BACKEND), wrapped)
    return out


def ddp_no_split(rank: int, world: int) -> dict:
    from torchfuse.capture import compile, config

    eager = fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001))
    ref = train(eager, list(eager.parameters()))
    with config.patch(ddp_split=False):
        outer = compile(fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001)), backend=BACKEND)
        same(train(outer, list(outer.parameters())), ref, "compile(DDP(m)), no split")
    return {"pieces": pieces(outer._compiled)}


def ddp_no_sync(rank: int, world: int) -> dict:
    from torchfuse.capture import compile

    eager = fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001))
    ref = train(eager, list(eager.parameters()), accumulate=3, no_sync=eager.no_sync)
    outer = compile(fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001)), backend=BACKEND)
    same(train(outer, list(outer.parameters()), accumulate=3, no_sync=outer.no_sync), ref,
         "compile(DDP(m)) under no_sync")
    inner = ddp(compile(fresh(MLP), backend=BACKEND), bucket_cap_mb=0.001)
    same(train(inner, list(inner.parameters()), accumulate=3, no_sync=inner.no_sync), ref,
         "DDP(compile(m)) under no_sync")
    return {}


def ddp_unused(rank: int, world: int) -> dict:
    from torchfuse.capture import compile

    make = lambda: ddp(MLP(unused=True), bucket_cap_mb=0.001, find_unused_parameters=True)
    eager = fresh(make)
    ref = train(eager, list(eager.parameters()))
    outer = compile(fresh(make), backend=BACKEND)
    same(train(outer, list(outer.parameters())), ref, "compile(DDP(m, find_unused_parameters))")
    inner = ddp(compile(fresh(lambda: MLP(unused=True)), backend=BACKEND), bucket_cap_mb=0.001,
                find_unused_parameters=True)
    same(train(inner, list(inner.parameters())), ref, "DDP(compile(m), find_unused_parameters)")
    return {}


def ddp_static_graph(rank: int, world: int) -> dict:
    """``static_graph=True``: DDP delays the first step's all-reduce to the end of backward."""
    from torchfuse.capture import compile

    make = lambda: ddp(MLP(), bucket_cap_mb=0.001, static_graph=True)
    eager = fresh(make)
    ref = train(eager, list(eager.parameters()))
    outer = compile(fresh(make), backend=BACKEND)
    same(train(outer, list(outer.parameters())), ref, "compile(DDP(m, static_graph=True))")
    inner = ddp(compile(fresh(MLP), backend=BACKEND), bucket_cap_mb=0.001, static_graph=True)
    same(train(inner, list(inner.parameters())), ref, "DDP(compile(m), static_graph=True)")
    return {"pieces": pieces(outer._compiled)}


def ddp_inductor(rank: int, world: int) -> dict:
    from torchfuse.capture import compile

    eager = fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001))
    ref = train(eager, list(eager.parameters()), steps=2)
    outer = compile(fresh(lambda: ddp(MLP(), bucket_cap_mb=0.001)), backend="inductor")
    same(train(outer, list(outer.parameters()), steps=2), ref, "compile(DDP(m)), inductor")
    return {"pieces": pieces(outer._compiled)}


class RankBranch(MLP):
    def forward(self, x):
        if dist.get_rank() == 0:  # a rank-dependent branch: the ranks' graphs differ
            x = x * 2
        return super().forward(x)


def ranks_differ(rank: int, world: int) -> dict:
    from torchfuse.capture import compile, config

    with config.patch(rank_check_timeout=30.0), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = compile(fresh(lambda: ddp(RankBranch())), backend=BACKEND)
        x, y = data(rank, 0)
        nn.functional.mse_loss(m(x), y).backward()
    return {"warnings": [str(w.message) for w in seen if "RankDivergence" in type(w.message).__name__]}


def rank_missing(rank: int, world: int) -> dict:
    """Only rank 0 runs the compiled DDP forward: it reports rank 1 after the timeout."""
    from torchfuse.capture import compile, config

    model = fresh(lambda: ddp(MLP()))
    seen = []
    if rank == 0:
        with config.patch(rank_check_timeout=2.0), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with model.no_sync():
                compile(model, backend=BACKEND)(data(rank, 0)[0])
    dist.barrier()
    return {"warnings": [str(w.message) for w in seen if "RankDivergence" in type(w.message).__name__]}


def _fsdp(make, shard_blocks: bool, compile_what: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchfuse.capture import compile

    model = fresh(make)
    model = model.to(_device())
    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    if compile_what == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = compile(block, backend=BACKEND)
    if shard_blocks:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if compile_what == "model":
        return compile(model, backend=BACKEND), model
    return model, model


def _full(params) -> list[torch.Tensor]:
    return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]


def fsdp(rank: int, world: int) -> dict:
    out = {}
    eager, _ = _fsdp(Stack, True, "none")
    ref = [(loss, _full(ps)) for loss, ps in train(eager, list(eager.parameters()), features=16)]
    for what in ("blocks", "model"):
        runner, model = _fsdp(Stack, True, what)
        got = [(loss, _full(ps)) for loss, ps in train(runner, list(model.parameters()), features=16)]
        same(got, ref, f"fully_shard per block, {what} compiled")
        compiled = runner if what == "model" else model.blocks[0]
        out[what] = graph_count(compiled._compiled)
    return out


CASES = {f.__name__: f for f in (ddp_both_ways, ddp_gpt2, ddp_overlap, ddp_no_split, ddp_no_sync,
                                 ddp_unused, ddp_static_graph, ddp_inductor, ranks_differ,
                                 rank_missing, fsdp)}


def main() -> None:
    cases, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(DIST_BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    results = {}
    try:
        for case in cases.split(","):  # one launch, several cases: the start-up is paid once
            try:
                results[case] = CASES[case](rank, world)
            except Exception:
                results[case] = {"error": traceback.format_exc()}
                print(results[case]["error"], file=sys.stderr, flush=True)
            dist.barrier()
        Path(out, f"result{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
