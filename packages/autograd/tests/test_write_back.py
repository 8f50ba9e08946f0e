"""What a training call costs besides its compiled halves: the running statistics of a batch
norm are not saved for the backward (`unread.drop_unread_arguments`), no zeros are made for
gradients the backward does not read, and mutated inputs are written back by one
``_foreach_copy_``. Each checked against eager: values, gradients, running statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torchfuse.autograd import aot, interpreter_compiler
from torchfuse.autograd.glue import _foreach_safe, _write_back
from torchfuse.autograd.unread import drop_unread_arguments
from torchfuse.graph import schema as S
from torchfuse.graph import trace

aten = torch.ops.aten


class _Count(TorchDispatchMode):
    """Counts the ATen ops called (top level: what the glue and the interpreter call)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _block(x, w, b, rm, rv, nbt, cw):
    y = F.conv2d(x, cw, padding=1)
    nbt.add_(1)
    y = F.batch_norm(y, rm, rv, w, b, training=True, momentum=0.1)
    return y.relu().sum(), y.amax()


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 5, generator=g)
    w = torch.randn(4, generator=g).requires_grad_()
    b = torch.randn(4, generator=g).requires_grad_()
    rm, rv = torch.randn(4, generator=g), torch.rand(4, generator=g) + 0.5
    nbt = torch.tensor(3)
    cw = torch.randn(4, 3, 3, 3, generator=g).requires_grad_()
    return [x, w, b, rm, rv, nbt, cw]


def _clone(inputs):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]


def test_batch_norm_training_matches_eager_without_saving_or_copying_running_stats():
    inputs = _inputs()
    graph, consts = trace(_block, *inputs)
    fn = aot(graph, interpreter_compiler)
    ours, eager = _clone(inputs), _clone(inputs)
    with _Count() as fwd:
        loss, top = fn(*ours, *consts.values())
    want, want_top = _block(*eager)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(top, want_top)
    for got, exp in zip(ours[3:6], eager[3:6], strict=True):  # running stats, batch count
        torch.testing.assert_close(got, exp, rtol=0, atol=0)
    with _Count() as bwd:
        loss.backward()
    want.backward()
    for got, exp in zip(ours, eager, strict=True):
        if exp.requires_grad:
            torch.testing.assert_close(got.grad, exp.grad)

    (plan,) = [p for plans in fn._plans.values() for p in plans]
    assert plan.partition is not None
    bn = [n for n in plan.partition.backward.nodes if n.op == "aten.native_batch_norm_backward.default"]
    assert len(bn) == 1 and all(isinstance(a, S.NoneArg) for a in bn[0].args[3:5])
    names = [i.name for i in plan.functional.inputs]
    saved = {name for name, _ in plan.partition.saved}
    assert not saved & {names[3], names[4]}, f"running statistics saved: {saved}"
    # no copy of a saved value taken before the write-back; one copy per dtype for the write-backs
    assert "clone" not in fwd.ops
    assert fwd.ops.count("_foreach_copy_") == 2 and "copy_" not in fwd.ops  # float32, int64
    # neither ``amax`` nor the running statistics are in the loss: autograd makes no zeros
    # for them; the glue makes the one tensor of zeros the backward reads (amax's tangent)
    assert "zeros" not in bwd.ops and bwd.ops.count("zero_") == 1, bwd.ops


def test_unused_differentiable_output_gets_zeros_where_the_backward_reads_it():
    def f(x):
        return x.sin().sum(), (x * 2).cos()

    x = torch.randn(5)
    graph, _ = trace(f, x.requires_grad_())
    fn = aot(graph, interpreter_compiler)
    for use_second in (False, True):
        ours, want = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        a, b = fn(ours)
        ea, eb = f(want)
        # without the second output autograd passes None for its gradient, and the glue
        # makes the zeros the backward graph reads
        (a + b.sum() if use_second else a).backward()
        (ea + eb.sum() if use_second else ea).backward()
        torch.testing.assert_close(ours.grad, want.grad)


def test_input_reached_only_through_unused_outputs_gets_none_as_in_eager():
    # a head the loss does not use (a pooler beside the hidden states): eager leaves its
    # weight's .grad None, and an optimizer skips it; zeros would be weight-decayed
    def f(x, w_body, w_head, w_both):
        h = (x @ w_body) * w_both
        return h, (h @ w_head).tanh() * w_both, x.sum() * 0 + w_head.sum()

    xs = [torch.randn(3, 4), torch.randn(4, 4), torch.randn(4, 4), torch.randn(4)]
    graph, _ = trace(f, *(t.requires_grad_() for t in xs))
    fn = aot(graph, interpreter_compiler)
    for used in ((0,), (1,), (2,), (0, 2), (0, 1, 2)):
        ours = [t.detach().clone().requires_grad_() for t in xs]
        want = [t.detach().clone().requires_grad_() for t in xs]
        got_out, want_out = fn(*ours), f(*want)
        sum(got_out[i].sum() for i in used).backward()
        sum(want_out[i].sum() for i in used).backward()
        for a, b in zip(ours, want, strict=True):
            assert (a.grad is None) == (b.grad is None), (used, a.grad, b.grad)
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad)


def test_drop_unread_leaves_evaluation_mode_batch_norm_backward_alone():
    def arg(name: str) -> S.TensorRef:
        return S.TensorRef(name=name)

    node = S.Node(name="bnb", op="aten.native_batch_norm_backward.default",
                  args=(arg("g"), arg("x"), arg("w"), arg("rm"), arg("rv"), arg("m"), arg("r"),
                        S.Bool(value=False), S.Float(value=1e-5),
                        S.ListArg(items=(S.Bool(value=True),) * 3)),
                  outputs=("a", "b", "c"))
    graph = S.Graph(name="g", nodes=(node,))
    assert drop_unread_arguments(graph) is graph  # eval mode reads the running statistics
    train = S.Graph(name="g", nodes=(S.Node(name="bnb", op=node.op,
                                            args=(*node.args[:7], S.Bool(value=True), *node.args[8:]),
                                            outputs=node.outputs),))
    dropped = drop_unread_arguments(train).nodes[0].args
    assert dropped[3] == S.NoneArg() and dropped[4] == S.NoneArg() and dropped[5] == arg("m")


def _mutating_graph(n: int) -> S.Graph:
    inputs = tuple(S.GraphInput(name=f"t{i}", kind="buffer") for i in range(n))
    outputs = tuple(S.GraphOutput(value=S.TensorRef(name=f"v{i}"), kind="mutated_input", target=f"t{i}")
                    for i in range(n))
    return S.Graph(name="g", inputs=inputs, outputs=outputs)


def test_write_back_one_by_one_when_targets_overlap_in_order():
    base = torch.zeros(6)
    # two targets over the same memory: the second write wins, as with copies in order
    targets = [base[:4], base[:3]]
    values = [torch.full((4,), 1.0), torch.full((3,), 2.0)]
    assert not _foreach_safe(targets, values)
    g = _mutating_graph(2)
    _write_back(g, 0, {"t0": 0, "t1": 1}, targets, values)
    assert base.tolist() == [2.0, 2.0, 2.0, 1.0, 0.0, 0.0]


def test_write_back_checks_for_foreach():
    a, b = torch.zeros(3), torch.zeros(2, dtype=torch.float64)
    assert _foreach_safe([a, b], [torch.ones(3), torch.ones(2, dtype=torch.float64)])
    assert not _foreach_safe([a, b], [torch.ones(3), torch.ones(2)])  # a dtype to convert
    assert not _foreach_safe([a, b], [torch.ones(3), b])  # a value that is a target
    # a value that already is its target (written in place) is skipped; a target that records
    # autograd history is written by its own copy_, recorded by autograd
    leaf = torch.zeros(3, requires_grad=True)
    target = leaf * 1
    src = torch.ones(3, requires_grad=True)
    _write_back(_mutating_graph(2), 0, {"t0": 0, "t1": 1}, [a, target], [a, src * 3])
    assert a.tolist() == [0.0, 0.0, 0.0] and target.tolist() == [3.0, 3.0, 3.0]
    target.sum().backward()
    assert src.grad.tolist() == [3.0, 3.0, 3.0] and leaf.grad.tolist() == [0.0, 0.0, 0.0]
