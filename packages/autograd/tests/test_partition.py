"""Partitioning: min-cut saves fewer bytes than save-all on pointwise chains, never recomputes
matmuls or random ops, honours the memory budget, and stays correct."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchfuse.autograd import aot, decompose, interpreter_compiler, joint_graph, partition
from torchfuse.autograd.opclass import NEVER_RECOMPUTE, OpClass, classify
from torchfuse.graph import trace


def chain_pointwise(x):
    return x.sin().cos().exp().tanh().sigmoid()


def chain_gelu_mul(x, y):
    return F.silu(F.gelu(x) * y) * 2


def chain_softmax_scale(x):
    return (x * 0.5).softmax(-1).log1p()


def chain_layer_norm_act(x, w, b):
    return F.gelu(F.layer_norm(x, (32,), w, b)).sigmoid()


def chain_rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CHAINS = [
    ("sin.cos.exp.tanh.sigmoid", chain_pointwise, [(64, 32)]),
    ("gelu*y.silu", chain_gelu_mul, [(64, 32), (64, 32)]),
    ("softmax.log1p", chain_softmax_scale, [(64, 32)]),
    ("layer_norm.gelu.sigmoid", chain_layer_norm_act, [(64, 32), (32,), (32,)]),
    ("rms_norm", chain_rms_norm, [(64, 32), (32,)]),
]


def _joint(fn, shapes, requires_grad=None):
    examples = [torch.randn(s) for s in shapes]
    graph, consts = trace(fn, *examples)
    flags = requires_grad or [True] * len(examples)
    flags = list(flags) + [False] * len(consts)
    return decompose(joint_graph(graph, flags)), examples, list(consts.values())


def saved_bytes_table() -> list[tuple[str, int, int, int]]:
    """(name, save_all bytes, min_cut bytes, recomputed node count) for each chain."""
    rows = []
    for name, fn, shapes in CHAINS:
        joint, _, _ = _joint(fn, shapes)
        every = partition(joint, strategy="save_all")
        cut = partition(joint, strategy="min_cut")
        rows.append((name, every.saved_bytes, cut.saved_bytes, len(cut.recomputed)))
    return rows


def test_min_cut_saves_fewer_bytes_than_save_all_on_pointwise_chains():
    rows = saved_bytes_table()
    print("\n| chain | save_all bytes | min_cut bytes | recomputed nodes |")
    print("|---|---|---|---|")
    for name, every, cut, rec in rows:
        print(f"| {name} | {every} | {cut} | {rec} |")
    for name, every, cut, _ in rows:
        assert cut < every, name


@pytest.mark.parametrize("strategy", ["min_cut", "save_all"])
@pytest.mark.parametrize("name,fn,shapes", CHAINS, ids=[c[0] for c in CHAINS])
def test_partitioned_chain_matches_eager(name, fn, shapes, strategy):
    torch.manual_seed(0)
    xs = [torch.randn(s, requires_grad=True) for s in shapes]
    graph, consts = trace(fn, *xs)
    f = aot(graph, interpreter_compiler, strategy=strategy)
    out = f(*xs, *consts.values())[0]
    ref = fn(*[x.detach().requires_grad_() for x in xs])
    torch.testing.assert_close(out, ref)
    cot = torch.randn_like(ref)
    got = torch.autograd.grad(out, xs, cot)
    refs = [x.detach().requires_grad_() for x in xs]
    expected = torch.autograd.grad(fn(*refs), refs, cot)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def mlp(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1))
    return F.linear(h, w2, b2).softmax(-1).sum()


def test_matmuls_are_never_recomputed():
    joint, _, _ = _joint(mlp, [(8, 16), (32, 16), (32,), (4, 32), (4,)])
    p = partition(joint)
    fwd_names = {n.name for n in p.forward.nodes}
    recomputed_classes = {classify(n.op) for n in p.backward.nodes if n.name in set(p.recomputed)}
    assert not recomputed_classes & NEVER_RECOMPUTE
    assert p.recomputed, "the gelu should be recomputed rather than saved"
    for n in p.backward.nodes:
        if classify(n.op) is OpClass.MATMUL:
            # only the gradient matmuls: none of them is a forward node
            assert n.name not in fwd_names and n.name not in p.recomputed
    joint_mm = sum(classify(n.op) is OpClass.MATMUL for n in joint.nodes)
    fwd_mm = sum(classify(n.op) is OpClass.MATMUL for n in p.forward.nodes)
    bwd_mm = sum(classify(n.op) is OpClass.MATMUL for n in p.backward.nodes)
    assert fwd_mm + bwd_mm == joint_mm


def dropout_chain(x):
    return F.dropout(x.sin(), 0.5, training=True).cos()


def test_random_ops_are_never_recomputed_and_grads_use_the_forward_mask():
    joint, _, _ = _joint(dropout_chain, [(16, 16)])
    assert any(classify(n.op) is OpClass.RANDOM for n in joint.nodes)
    for strategy in ("min_cut", "save_all"):
        p = partition(joint, strategy=strategy)
        assert not any(classify(n.op) is OpClass.RANDOM for n in p.backward.nodes)
    p = partition(joint, memory_budget=0.0)
    assert not any(classify(n.op) is OpClass.RANDOM for n in p.backward.nodes)

    x = torch.randn(16, 16, requires_grad=True)
    graph, _ = trace(lambda x: F.dropout(x.sin(), 0.5, training=True), x)
    out = aot(graph, interpreter_compiler)(x)[0]
    (gx,) = torch.autograd.grad(out.sum(), x)
    kept = (out != 0).float()
    torch.testing.assert_close(gx, x.detach().cos() * kept * 2)


def gather_chain(w, idx):
    e = F.embedding(idx, w)
    return e.exp().mul(e.exp()).sum()


def test_memory_budget_trades_recompute_for_bytes():
    w = torch.randn(10, 16, requires_grad=True)
    idx = torch.randint(0, 10, (200,))
    graph, _ = trace(gather_chain, w, idx)
    joint = decompose(joint_graph(graph, [True, False]))
    full = partition(joint, memory_budget=1.0)
    low = partition(joint, memory_budget=0.1)
    assert low.saved_bytes < full.saved_bytes
    assert any(classify(n.op) is OpClass.INDEXING
               for n in low.backward.nodes if n.name in low.recomputed)
    for budget in (1.0, 0.1):
        f = aot(graph, interpreter_compiler, memory_budget=budget)
        wg = w.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(wg, idx)[0], wg)
        we = w.detach().requires_grad_()
        (e,) = torch.autograd.grad(gather_chain(we, idx), we)
        torch.testing.assert_close(g, e)


def test_forward_and_backward_graph_interfaces():
    joint, _, _ = _joint(chain_gelu_mul, [(4, 4), (4, 4)])
    p = partition(joint)
    n_saved = len(p.saved)
    assert [o.kind for o in p.forward.outputs] == ["user_output"] + ["saved_value"] * n_saved
    assert [o.target for o in p.forward.outputs[1:]] == [name for name, _ in p.saved]
    assert [i.name for i in p.backward.inputs[:n_saved]] == [name for name, _ in p.saved]
    assert [i.kind for i in p.backward.inputs[n_saved:]] == ["tangent"]
    assert [(o.kind, o.target) for o in p.backward.outputs] == [("gradient", "arg0"), ("gradient", "arg1")]
    assert all(b == 4 * 4 * 4 for _, b in p.saved)


def test_unknown_strategy_is_an_error():
    joint, _, _ = _joint(chain_pointwise, [(4,)])
    with pytest.raises(ValueError, match="unknown partition strategy"):
        partition(joint, strategy="greedy")  # type: ignore[arg-type]
