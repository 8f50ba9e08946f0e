"""Padding unaligned half-precision matmuls: the rewrite, its conditions, and eager agreement."""

from __future__ import annotations

import pytest
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import run
from torchfuse.graph.tracing import trace
from torchfuse.graph.verify import verify
from torchfuse.inductor.pad_mm import needs_padding, pad_matmuls

CPU = ("cpu",)  # the rewrite targets CUDA; tests let it apply to CPU graphs


def _ops(graph):
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("case", ["n", "k", "transposed_b", "column_major_a"])
def test_padded_matmul_matches_eager(case):
    torch.manual_seed(0)
    a = torch.randn(24, 40, dtype=torch.float16)
    b = torch.randn(40, 1001, dtype=torch.float16)
    fn = lambda a, b: (a @ b).float().relu()
    if case == "k":
        a, b = torch.randn(24, 37, dtype=torch.float16), torch.randn(37, 64, dtype=torch.float16)
    elif case == "transposed_b":  # x @ w.t() with K unaligned and N unaligned
        a, b = torch.randn(24, 37, dtype=torch.float16), torch.randn(1001, 37, dtype=torch.float16)
        fn = lambda a, w: (a @ w.t()).float()
    elif case == "column_major_a":  # dlogits.t() @ h in a backward: M unaligned, a column-major
        a, b = torch.randn(40, 1001, dtype=torch.float16), torch.randn(40, 64, dtype=torch.float16)
        fn = lambda g, h: (g.t() @ h).float()
    graph, _ = trace(fn, a, b)
    assert needs_padding(graph, CPU, min_flops=1)
    padded = pad_matmuls(graph, device_types=CPU, min_flops=1)
    verify(padded)
    assert "aten.constant_pad_nd.default" in _ops(padded)
    assert _ops(padded).count("aten.mm.default") == 1
    mm = next(n for n in padded.nodes if n.op == "aten.mm.default")
    a_meta, b_meta = (padded.values[x.name] for x in mm.args)
    out_meta = padded.values[mm.outputs[0]]
    # every leading dimension of the matmul the graph now runs is a multiple of 8 elements
    for meta in (a_meta, b_meta, out_meta):
        lead = max(meta.strides)
        assert lead % 8 == 0, (case, meta)
    # and each padded operand kept its memory order (a column-major one padded as its
    # transpose): a row-major copy would make its producer read across rows
    for meta, given in zip((a_meta, b_meta), (a, b.t() if case == "transposed_b" else b), strict=True):
        if case == "column_major_a" and meta is a_meta:
            given = a.t()
        was_column_major = given.stride(0) == 1 and given.shape[0] > 1
        assert (meta.strides[0] == 1) == was_column_major, (case, meta, given.stride())
    want = fn(a.float(), b.float())
    (got,) = run(padded, a, b)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert got.shape == want.shape
    if case in ("n", "transposed_b", "column_major_a"):  # the result is a view of the padded product
        assert "aten.slice.Tensor" in _ops(padded)


def test_aligned_small_float32_and_other_devices_are_left_alone():
    a, b = torch.randn(24, 40, dtype=torch.float16), torch.randn(40, 64, dtype=torch.float16)
    graph, _ = trace(lambda a, b: a @ b, a, b)
    assert not needs_padding(graph, CPU, min_flops=1)  # aligned
    odd = trace(lambda a, b: a @ b, a, torch.randn(40, 1001, dtype=torch.float16))[0]
    assert not needs_padding(odd)  # a CPU graph: the default applies to CUDA only
    assert not needs_padding(odd, CPU)  # too small for the default threshold
    assert pad_matmuls(odd) is odd
    f32 = trace(lambda a, b: a @ b, a.float(), torch.randn(40, 1001))[0]
    assert not needs_padding(f32, CPU, min_flops=1)


def test_symbolic_sizes_are_left_alone():
    a, b = torch.randn(24, 40, dtype=torch.float16), torch.randn(40, 1001, dtype=torch.float16)
    graph, _ = trace(lambda a, b: a @ b, a, b, dynamic={0: [0]})
    assert not needs_padding(graph, CPU, min_flops=1)


def test_forward_half_of_training_keeps_the_layouts_the_backward_expects():
    """Outputs of a forward graph feed a backward compiled for their recorded strides: a
    padded product that is such an output is copied back to that layout."""
    import msgspec

    a, b = torch.randn(24, 40, dtype=torch.float16), torch.randn(40, 1001, dtype=torch.float16)
    graph, _ = trace(lambda a, b: a @ b, a, b)
    saved = msgspec.structs.replace(graph, outputs=(*graph.outputs, msgspec.structs.replace(
        graph.outputs[0], kind="saved_value")))
    padded = pad_matmuls(saved, device_types=CPU, min_flops=1)
    verify(padded)
    for before, after in zip(saved.outputs, padded.outputs, strict=True):
        assert padded.values[after.value.name].strides == saved.values[before.value.name].strides
    assert "aten.clone.default" in _ops(padded)
    got = run(padded, a, b)
    for g in got:
        assert g.is_contiguous()
        torch.testing.assert_close(g, (a.float() @ b.float()).half(), rtol=2e-2, atol=2e-2)
    # an inference graph's output stays a view of the padded product
    plain = pad_matmuls(graph, device_types=CPU, min_flops=1)
    assert "aten.clone.default" not in _ops(plain)
    assert plain.values[plain.outputs[0].value.name].strides == (1008, 1)


def test_one_padded_copy_serves_both_matmuls_of_an_operand():
    """GPT-2's dlogits feeds ``dlogits @ w`` (K padded) and ``dlogits.t() @ h`` (M padded): both
    read one row-major padded copy, so the kernel producing dlogits writes it once."""
    torch.manual_seed(0)
    g = torch.randn(24, 1001, dtype=torch.float16)
    w = torch.randn(1001, 64, dtype=torch.float16)
    h = torch.randn(24, 64, dtype=torch.float16)
    def fn(g, w, h):
        d = g.relu()
        return (d @ w).float(), (d.t() @ h).float()

    graph, _ = trace(fn, g, w, h)
    padded = pad_matmuls(graph, device_types=CPU, min_flops=1)
    verify(padded)
    pads = [n for n in padded.nodes if n.op == "aten.constant_pad_nd.default"]
    relu = next(n.outputs[0] for n in padded.nodes if n.op == "aten.relu.default")
    # one pad of d (read by both matmuls) and one of w; h needs none
    assert len(pads) == 2 and [p.args[0].name for p in pads].count(relu) == 1, \
        [(p.args[0].name, p.args[1]) for p in pads]
    assert padded.values[next(p.outputs[0] for p in pads if p.args[0].name == relu)].strides == (1008, 1)
    got = run(padded, g, w, h)
    for x, y in zip(got, fn(g.float(), w.float(), h.float()), strict=True):
        torch.testing.assert_close(x, y, rtol=2e-2, atol=2e-2)


def test_padded_vocabulary_training_step_matches_eager(monkeypatch):
    """A GPT-2-shaped head (``cross_entropy(h @ w.t())`` over an odd vocabulary, bf16) through
    the inductor backend with the padding allowed on the CPU: the backward pads dlogits once,
    row-major, for ``dlogits @ w`` and ``dlogits.t() @ h``, and the gradients match eager's."""
    import torch.nn.functional as F
    import torchfuse.inductor.compile as C
    from torchfuse.inductor import inductor

    monkeypatch.setattr(C, "pad_matmuls", lambda g: pad_matmuls(g, device_types=CPU, min_flops=1))
    programs = []
    original = C.compile_graph

    def keep(*args, **kwargs):
        program = original(*args, **kwargs)
        programs.append(program)
        return program

    import torchfuse.inductor.backend as B

    monkeypatch.setattr(B, "compile_graph", keep)
    torch.manual_seed(0)
    # 8 tokens (aligned, as GPT-2's 4096), a vocabulary of 61 (unaligned, as its 50257)
    h = (torch.randn(8, 16) * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(61, 16) * 0.5).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 61, (8,))

    def head(h, w, target):
        return F.cross_entropy((h @ w.t()).float(), target)

    graph, _ = trace(head, h, w, target)
    loss = inductor(graph, [h, w, target], options={"cache": False})(h, w, target)[0]
    gh, gw = torch.autograd.grad(loss, (h, w))
    want = head(h, w, target)
    wh, ww = torch.autograd.grad(want, (h, w))
    torch.testing.assert_close(loss, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gh.float(), wh.float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(gw.float(), ww.float(), rtol=5e-2, atol=5e-2)
    (backward,) = [p for p in programs if p.name.endswith("backward")]
    allocated = {st.buffer for st in backward.steps if isinstance(st, S.AllocStep)}
    buffers = {b.name: b for b in backward.buffers}
    # one padded dlogits buffer, written row-major; the transposed matmul reads a view of it
    dlogits = [n for n in allocated if tuple(buffers[n].sizes) in ((8, 64), (64, 8))]
    assert len(dlogits) == 1 and tuple(buffers[dlogits[0]].strides) == (64, 1), \
        [(n, buffers[n].sizes, buffers[n].strides) for n in dlogits]
    assert any(isinstance(st, S.ViewStep) and st.base == dlogits[0] and tuple(st.sizes) == (64, 8)
               for st in backward.steps)


def test_merging_after_padding_leaves_in_place_and_random_ops_alone():
    from torchfuse.inductor.pad_mm import _must_stay

    def node(op):
        return S.Node(name="n", op=op, args=(), kwargs={}, outputs=("o",))

    for op in ("aten.add_.Tensor", "aten.copy_.default", "aten.rand.default", "aten.bernoulli.default"):
        assert _must_stay(node(op)), op  # writes an argument, or draws random numbers
    for op in ("aten.add.Tensor", "aten.t.default", "aten.constant_pad_nd.default", "aten.view.default"):
        assert not _must_stay(node(op)), op
