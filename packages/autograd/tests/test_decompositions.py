"""Every entry of ``DEFAULT_TABLE`` against eager PyTorch on random inputs: the rule called
directly, and the op recorded into a graph, decomposed, and run by the reference interpreter."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torchfuse.autograd import DEFAULT_TABLE as _DEFAULT
from torchfuse.autograd import DecompositionError, decompose
from torchfuse.autograd.decompositions import EMBEDDING_AS_INDEX_PUT
from torchfuse.graph import run, trace
from torchfuse.graph.ops import resolve_op

DEFAULT_TABLE = {**_DEFAULT, **EMBEDDING_AS_INDEX_PUT}
"""The default rules and the explicit overrides: each is tested against eager."""

aten = torch.ops.aten
Sample = tuple[tuple, dict]


def _r(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


def _softmax_samples(op, backward: bool) -> Callable[[], list[Sample]]:
    def make():
        x = _r(3, 5)
        out = []
        for dim in (-1, 0):
            if not backward:
                out.append(((x, dim, False), {}))
            else:
                y = op(x, dim, False)
                out.append(((_r(3, 5), y, dim, torch.float32), {}))
        return out
    return make


def _layer_norm_backward():
    x, w, b, g = _r(4, 5), _r(5), _r(5), _r(4, 5)
    _, mean, rstd = aten.native_layer_norm(x, [5], w, b, 1e-5)
    x3, w3, g3 = _r(2, 3, 4), _r(3, 4), _r(2, 3, 4)
    _, mean3, rstd3 = aten.native_layer_norm(x3, [3, 4], w3, None, 1e-5)
    return [
        ((g, x, [5], mean, rstd, w, b, [True, True, True]), {}),
        ((g, x, [5], mean, rstd, None, None, [True, False, False]), {}),
        ((g3, x3, [3, 4], mean3, rstd3, w3, None, [True, True, False]), {}),
        ((g, x, [5], mean, rstd, w, b, [False, True, True]), {}),
    ]


def _nll_forward():
    logp = _r(6, 4).log_softmax(-1)
    t = torch.randint(0, 4, (6,))
    t_ignore = t.clone()
    t_ignore[0] = -100
    w = torch.rand(4) + 0.5
    return [
        ((logp, t, None, 1, -100), {}),
        ((logp, t, w, 1, -100), {}),
        ((logp, t_ignore, w, 2, -100), {}),
        ((logp, t_ignore, None, 0, -100), {}),
        ((logp[0], t[0], None, 1, -100), {}),
    ]


def _nll_backward():
    out = []
    for (logp, t, w, red, ig), _ in _nll_forward():
        loss, total = aten.nll_loss_forward(logp, t, w, red, ig)
        out.append(((torch.randn_like(loss), logp, t, w, red, ig, total), {}))
    return out


def _embedding_backward():
    idx = torch.randint(0, 6, (3, 4))
    g = _r(3, 4, 5)
    return [((g, idx, 6, -1, False), {}), ((g, idx, 6, 2, False), {}),
            ((g, idx, 6, -1, True), {}), ((_r(7, 2), torch.randint(0, 3, (7,)), 3, 0, True), {})]


RECORDS: dict[str, Callable[[], list[Sample]]] = {
    "aten.silu.default": lambda: [((_r(3, 4),), {})],
    "aten.silu_backward.default": lambda: [((_r(3, 4), _r(3, 4)), {})],
    "aten.gelu.default": lambda: [((_r(3, 4),), {}), ((_r(3, 4),), {"approximate": "tanh"})],
    "aten.gelu_backward.default": lambda: [((_r(3, 4), _r(3, 4)), {}),
                                           ((_r(3, 4), _r(3, 4)), {"approximate": "tanh"})],
    "aten.threshold_backward.default": lambda: [((_r(3, 4), _r(3, 4), 0.0), {}),
                                                ((_r(3, 4), _r(3, 4), 0.5), {})],
    "aten.sigmoid_backward.default": lambda: [((_r(3, 4), torch.sigmoid(_r(3, 4))), {})],
    "aten.tanh_backward.default": lambda: [((_r(3, 4), torch.tanh(_r(3, 4))), {})],
    "aten._softmax.default": _softmax_samples(aten._softmax, False),
    "aten._softmax_backward_data.default": _softmax_samples(aten._softmax, True),
    "aten._log_softmax.default": _softmax_samples(aten._log_softmax, False),
    "aten._log_softmax_backward_data.default": _softmax_samples(aten._log_softmax, True),
    "aten.native_layer_norm.default": lambda: [
        ((_r(4, 5), [5], _r(5), _r(5), 1e-5), {}),
        ((_r(4, 5), [5], None, None, 1e-5), {}),
        ((_r(2, 3, 4), [3, 4], _r(3, 4), None, 1e-6), {}),
    ],
    "aten.native_layer_norm_backward.default": _layer_norm_backward,
    "aten.var_mean.correction": lambda: [
        ((_r(3, 4), [1]), {"correction": 0, "keepdim": True}),
        ((_r(3, 4),), {}),
        ((_r(2, 3, 4), [0, 2]), {"correction": 1}),
    ],
    "aten.nll_loss_forward.default": _nll_forward,
    "aten.nll_loss_backward.default": _nll_backward,
    "aten.mse_loss.default": lambda: [((_r(3, 4), _r(3, 4), r), {}) for r in (0, 1, 2)],
    "aten.mse_loss_backward.default": lambda: [((_r(), _r(3, 4), _r(3, 4), 1), {}),
                                               ((_r(), _r(3, 4), _r(3, 4), 2), {}),
                                               ((_r(3, 4), _r(3, 4), _r(3, 4), 0), {})],
    "aten.addmm.default": lambda: [((_r(5), _r(3, 4), _r(4, 5)), {}),
                                   ((_r(3, 5), _r(3, 4), _r(4, 5)), {"beta": 0.5, "alpha": 2.0}),
                                   ((_r(3, 5), _r(3, 4), _r(4, 5)), {"beta": 0})],
    "aten.t.default": lambda: [((_r(3, 4),), {}), ((_r(4),), {})],
    "aten.rsub.Tensor": lambda: [((_r(3, 4), _r(4)), {}), ((_r(3, 4), _r(3, 4)), {"alpha": 2})],
    "aten.rsub.Scalar": lambda: [((_r(3, 4), 2.0), {}), ((_r(3, 4), 1), {"alpha": 3})],
    "aten.embedding_dense_backward.default": _embedding_backward,
    "aten.native_dropout_backward.default": lambda: [((_r(3, 4), torch.rand(3, 4) > 0.3, 1 / 0.7), {})],
}


def _close(got, expected, name):
    if isinstance(expected, tuple | list):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _close(g, e, name)
        return
    if expected is None:
        assert got is None, name
        return
    torch.testing.assert_close(got, expected, msg=lambda m: f"{name}: {m}")


def _samples(name):
    torch.manual_seed(0)
    return RECORDS[name]()


def test_every_table_entry_has_a_record():
    assert set(DEFAULT_TABLE) == set(RECORDS), set(DEFAULT_TABLE) ^ set(RECORDS)


@pytest.mark.parametrize("name", sorted(DEFAULT_TABLE))
def test_rule_matches_eager(name):
    op, rule = resolve_op(name), DEFAULT_TABLE[name]
    for args, kwargs in _samples(name):
        _close(rule(*args, **kwargs), op(*args, **kwargs), name)


@pytest.mark.parametrize("name", sorted(DEFAULT_TABLE))
def test_decomposed_graph_matches_eager(name):
    op = resolve_op(name)
    for args, kwargs in _samples(name):
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

        def call(*tensors, args=args, kwargs=kwargs, tensor_pos=tensor_pos):
            full = list(args)
            for i, t in zip(tensor_pos, tensors, strict=True):
                full[i] = t
            return op(*full, **kwargs)

        tensors = [args[i] for i in tensor_pos]
        graph, consts = trace(call, *tensors, name=name.replace(".", "_"))
        assert name in {n.op for n in graph.nodes}, "the sample does not reach the op"
        dec = decompose(graph, DEFAULT_TABLE)
        assert not {n.op for n in dec.nodes} & set(DEFAULT_TABLE), [n.op for n in dec.nodes]
        got = run(dec, *tensors, *consts.values())
        expected = op(*args, **kwargs)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        _close(got, expected, name)


def test_custom_table_and_op_keys():
    table = {aten.sin.default: lambda x: torch.cos(x - torch.pi / 2)}
    graph, _ = trace(lambda x: torch.sin(x) * 2, _r(4))
    dec = decompose(graph, table)
    ops = [n.op for n in dec.nodes]
    assert "aten.sin.default" not in ops and "aten.cos.default" in ops
    x = _r(4)
    torch.testing.assert_close(run(dec, x)[0], torch.sin(x) * 2)


def test_rule_that_never_converges_is_an_error():
    graph, _ = trace(lambda x: torch.sin(x), _r(4))
    with pytest.raises(DecompositionError, match="did not converge"):
        decompose(graph, {"aten.sin.default": lambda x: torch.sin(x)}, max_rounds=3)


def test_failing_rule_names_the_node():
    graph, _ = trace(lambda x: torch.sin(x), _r(4))

    def bad(x):
        raise ValueError("boom")

    with pytest.raises(DecompositionError, match=r"node 'sin' \[aten.sin.default\].*boom"):
        decompose(graph, {"aten.sin.default": bad})


def test_rule_results_keep_the_memory_order_eager_returns():
    """``native_layer_norm`` returns a dense tensor whatever its input's order; its pointwise
    rule would keep a permuted input's order, and the ``view`` after it, which eager accepts,
    would fail (Whisper's encoder: conv, permute, layer norm, linear)."""
    def f(x, w, b):
        y = torch.nn.functional.layer_norm(x.permute(0, 2, 1), (6,), w, b)
        return y.view(8, 6)

    x, w, b = _r(2, 6, 4), _r(6), _r(6)
    graph, consts = trace(f, x, w, b)
    dec = decompose(graph)
    assert "aten.native_layer_norm.default" not in {n.op for n in dec.nodes}
    torch.testing.assert_close(run(dec, x, w, b, *consts.values())[0], f(x, w, b))
