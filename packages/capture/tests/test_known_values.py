"""Values known at capture: tensors made from constants alone answer Python's questions
(``if t.all():``, ``t.item()``) as eager does, without a break; anything that depends on an
input, a random draw or uninitialized memory stays unknown and breaks as before."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchfuse.capture import compile, explain


def _ops(c) -> list[str]:
    return [n.op for r in c.results if r.graph is not None for n in r.graph.nodes]


def check(f, *args, breaks: int):
    c = compile(f, backend="eager")
    torch.testing.assert_close(c(*args), f(*args))
    report = explain(f)(*args)
    assert report.graph_break_count == breaks, report
    return c


def test_branch_on_a_mask_made_from_constants_is_decided_at_capture():
    def f(x):
        n = x.shape[0]
        mask = torch.arange(n)[:, None] >= torch.arange(n)[None, :]  # causal: not all True
        if mask.all():
            return x * 2
        if (torch.arange(n) >= 0).all():  # all True
            return x.masked_fill(~mask, 0.0) + 1
        return x

    check(f, torch.randn(5, 5), breaks=0)


def test_item_tolist_and_int_of_known_values():
    def f(x):
        k = torch.tensor(3) + torch.ones([], dtype=torch.long)  # 4
        idx = torch.arange(4) * 2
        return x[: k.item()] * idx.tolist()[-1] + int(k)

    check(f, torch.randn(6), breaks=0)


def test_tensors_made_from_python_lists_are_known():
    # transformers 5.17's Funnel: positions made with new_tensor([...]) and torch.cat, then
    # torch.arange over 0-d tensors of them (its bounds read the values): a break per call
    def f(x):
        pos = torch.arange(0, x.shape[0], dtype=torch.int64).to(torch.float32)
        first = pos.new_tensor([-1])
        pooled = torch.cat([first, pos[1:-1][::2], torch.tensor([100.0, 200.0])], 0)
        rel = torch.arange(pooled[0] - pos[0] + 3, pooled[0] - pos[-1] - 1, -2, dtype=torch.long)
        return x[: rel.shape[0]] * 2, rel, pooled[-2:]

    check(f, torch.randn(16), breaks=0)


def test_input_dependent_values_still_break():
    def f(x):
        if (x > 0).all():
            return x + 1
        return x - 1

    check(f, torch.randn(4).abs() + 0.1, breaks=1)


def test_random_and_uninitialized_values_are_not_known():
    def f(x):
        if (torch.rand(3) < 0.5).all():  # a random draw is not a constant (< 2.0 would be: see below)
            x = x + 1
        if torch.empty(2).numel() == 2:  # sizes are known; the contents of empty are not asked
            x = x * 2
        return x

    x = torch.randn(3)
    c = compile(f, backend="eager")
    for seed in range(8):  # the same draws in both; seed 3 draws all three under 0.5
        torch.manual_seed(seed)
        got = c(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(got, f(x))
    assert explain(f)(x).graph_break_count == 1


def test_in_place_write_with_unknown_data_forgets_the_value_and_its_views():
    def f(x):
        a = torch.zeros(4)
        v = a[:2]
        v.add_(x[:2])  # a's first half now depends on the input
        if a.any():
            return x + 1
        return x - 1

    check(f, torch.randn(4), breaks=1)


def test_in_place_write_with_known_data_is_seen_through_views():
    def f(x):
        a = torch.zeros(4)
        a[:2].fill_(1.0)
        if a.sum().item() == 2.0:
            return x + a
        return x - a

    check(f, torch.randn(4), breaks=0)


def test_attention_mask_that_masks_nothing_is_dropped():
    q = torch.randn(2, 3, 6, 8)

    def f(q, m):
        keep = torch.ones(6, 6, dtype=torch.bool)  # known: masks nothing
        return F.scaled_dot_product_attention(q, q, q, attn_mask=keep) + \
            F.scaled_dot_product_attention(q, q, q, attn_mask=m)  # an input mask: kept

    m = torch.ones(6, 6, dtype=torch.bool)
    m[0, 3:] = False
    c = check(f, q, m, breaks=0)
    calls = [n for r in c.results if r.graph is not None for n in r.graph.nodes
             if "scaled_dot_product" in n.op]
    assert len(calls) == 2
    # the first call has no mask argument; the second one reads the input mask
    masks = [n.kwargs.get("attn_mask") for n in calls]
    assert masks[0] is None and masks[1] is not None, masks


def test_known_causal_mask_becomes_is_causal():
    q = torch.randn(2, 3, 6, 8)

    def f(q):
        n = q.shape[-2]
        causal = torch.arange(n)[:, None] >= torch.arange(n)[None, :]  # known: tril
        return F.scaled_dot_product_attention(q, q, q, attn_mask=causal[None, None])

    c = check(f, q, breaks=0)
    (call,) = [n for r in c.results if r.graph is not None for n in r.graph.nodes
               if "scaled_dot_product" in n.op]
    # the CPU kernel: (q, k, v, dropout_p, is_causal), no mask argument
    assert call.op == "aten._scaled_dot_product_flash_attention_for_cpu.default", call.op
    assert len(call.args) == 5 and call.args[4].value is True and "attn_mask" not in call.kwargs


def test_a_causal_mask_made_at_the_batchs_size_becomes_is_causal():
    """``transformers`` makes its mask from aranges over batch, head, query and key, a fresh
    ``(batch, 1, q, kv)`` bool: 2 MiB for 8 x 512 x 512, which a 1 MiB limit lost (the graph
    then kept a mask that eager drops)."""
    from torchfuse.capture import known

    q = torch.randn(8, 1, 512, 4)

    def f(q):
        b, n = q.shape[0], q.shape[-2]
        batch, head, rows, cols = torch.arange(b), torch.arange(1), torch.arange(n), torch.arange(n)
        mask = (rows[None, None, :, None] >= cols[None, None, None, :]) & (batch[:, None, None, None] >= 0) \
            & (head[None, :, None, None] >= 0)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    assert 8 * 512 * 512 > known.MAX_BYTES and 8 * 512 * 512 <= known.MAX_EXACT_BYTES
    c = check(f, q, breaks=0)
    (call,) = [n for r in c.results if r.graph is not None for n in r.graph.nodes
               if "scaled_dot_product" in n.op]
    assert len(call.args) == 5 and call.args[4].value is True and "attn_mask" not in call.kwargs


def test_a_float_result_over_the_limit_is_not_known():
    from torchfuse.capture import known

    n = int((known.MAX_BYTES // 4) ** 0.5) + 1  # a float32 n x n just over the limit

    def f(x):
        big = torch.zeros(n, n)  # known only if kept: too big
        if (big == 0).all():
            return x + 1
        return x - 1

    check(f, torch.randn(3), breaks=1)


def test_symbolic_sizes_are_not_known():
    def f(x):
        if (torch.arange(x.shape[0]) < 100).all():
            return x + 1
        return x - 1

    c = compile(f, backend="eager", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n)
        torch.testing.assert_close(c(x), f(x))


def _layerdrop(x, p):
    """LayerDrop as transformers wrote it before 5.2x: a draw per layer, compared in Python."""
    for _ in range(3):
        r = torch.rand([])
        if r < p:
            continue
        x = x * 2
    return x


def test_a_draw_compared_where_its_range_decides_does_not_break():
    for p, expected in ((0.0, 8.0), (-1.0, 8.0), (2.0, 1.0)):
        torch.manual_seed(0)
        c = check(_layerdrop, torch.ones(3), p, breaks=0)
        assert _ops(c).count("aten.rand.default") == 3  # the draws stay: the RNG advances as in eager
        assert c(torch.ones(3), p).tolist() == [expected] * 3


def test_a_draw_its_range_does_not_decide_still_breaks():
    for p in (0.5, 1.0):  # 1.0: a low-precision draw can round up to 1.0
        torch.manual_seed(0)
        c = compile(_layerdrop, backend="eager")
        out = c(torch.ones(3), p)
        torch.manual_seed(0)
        torch.testing.assert_close(out, _layerdrop(torch.ones(3), p))
        assert explain(_layerdrop)(torch.ones(3), p).graph_break_count >= 1


def test_ranges_follow_views_and_casts_and_are_forgotten_on_writes():
    def decided(x):
        r = torch.rand(2, 3).t().to(torch.bfloat16).reshape(-1)
        if (r >= 0.0).all() and not (r > 1.0).any():
            return x + 1
        return x

    check(decided, torch.ones(3), breaks=0)

    def written(x):
        r = torch.rand([])
        r.add_(-5.0)  # outside [0, 1] now
        if r < 0.0:
            return x + 1
        return x

    check(written, torch.ones(3), breaks=1)

    def not_a_draw(x):
        if x.sum() < 0.0:  # an input's values have no known range
            return x + 1
        return x

    check(not_a_draw, torch.ones(3), breaks=1)
