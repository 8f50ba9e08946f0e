"""The distributed cases on the GPU machine, under NCCL: DDP with world size 1 on one GPU
(in this process), and the two-rank DDP and FSDP2 cases when two GPUs are present. Run with
``pytest -m gpu tests/distributed``."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch

pytestmark = pytest.mark.gpu

NCCL = {"TORCHFUSE_TEST_DIST_BACKEND": "nccl"}
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def test_ddp_world_size_one_nccl():
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchfuse.capture import compile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=120))
    try:
        torch.cuda.set_device(0)

        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                 nn.Linear(256, 8)).cuda()

        def steps(module):
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            g = torch.Generator(device="cuda").manual_seed(0)
            out = []
            for _ in range(3):
                x = torch.randn(16, 64, device="cuda", generator=g)
                loss = module(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                out.append((loss.item(), [p.detach().clone() for p in module.parameters()]))
            return out

        ref = steps(DDP(make(), device_ids=[0], bucket_cap_mb=0.1))
        for name, module in (("compile(DDP(m))", compile(DDP(make(), device_ids=[0], bucket_cap_mb=0.1))),
                             ("DDP(compile(m))", DDP(compile(make()), device_ids=[0], bucket_cap_mb=0.1))):
            got = steps(module)
            for (lc, pc), (le, pe) in zip(got, ref, strict=True):
                torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5, msg=name)
                for a, b in zip(pc, pe, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    finally:
        dist.destroy_process_group()


@two_gpus
@pytest.mark.parametrize("case", ["ddp_both_ways", "ddp_gpt2", "ddp_overlap", "ddp_no_sync",
                                  "ddp_unused", "ddp_static_graph", "ddp_inductor", "fsdp"])
def test_two_ranks_nccl(run_ranks, case):
    results = run_ranks(case, env=NCCL)
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, "\n".join(errors)
