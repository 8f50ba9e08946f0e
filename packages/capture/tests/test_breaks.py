"""Graph breaks that resume: every scenario of ``break_cases`` compared with eager (return
values, mutated arguments, printed output), with its graph count; then explain, logs,
fullgraph, export, caching and the speed-relevant structure of a resumed call."""

from __future__ import annotations

import logging
import warnings

import break_cases as B
import pytest
import torch
from break_cases import BREAKS
from capture_helpers import assert_same
from torchfuse.capture import ExportError, GraphBreakInFullgraph, compile, explain, export
from torchfuse.graph import observe


def _run(fn, args, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args)
    return out, capsys.readouterr().out


def _args(case, seed: int):
    torch.manual_seed(seed)
    return case.make()


@pytest.mark.parametrize("case", BREAKS, ids=[c.name for c in BREAKS])
def test_break_matches_eager(case, capsys):
    cf = compile(case.fn, backend="eager")
    graphs = None
    for seed in (0, 1):
        eager_args, compiled_args = _args(case, seed), _args(case, seed)
        B.COUNTER = 0
        expected, eager_printed = _run(case.fn, eager_args, capsys)
        B.COUNTER = 0
        got, printed = _run(cf, compiled_args, capsys)
        assert_same(got, expected)
        assert_same(compiled_args, eager_args, "arguments after the call")
        assert printed == eager_printed
        if graphs is None:
            graphs = cf.graph_count()
    assert graphs == case.expected_graphs, [str(r.error).splitlines()[0] for r in cf.results if r.error]
    assert cf.recompiles == 0


def test_table_is_large_enough():
    assert len(BREAKS) >= 60
    assert len({c.name for c in BREAKS}) == len(BREAKS)


def test_gradients_flow_through_a_break():
    w = torch.randn(4, requires_grad=True)

    def f(x):
        y = (x * w).sin()
        print("between")
        return (y * w).sum()

    x = torch.randn(3, 4)
    cf = compile(f, backend="eager")
    with_break = cf(x)
    (g_compiled,) = torch.autograd.grad(with_break, w)
    (g_eager,) = torch.autograd.grad(f(x), w)
    torch.testing.assert_close(g_compiled, g_eager)


def test_exception_at_break_exits_with_blocks():
    def f(x):
        with torch.no_grad():
            y = x * 2
            z = y + B.Holder()  # TypeError raised by the instruction run in Python
        return z

    cf = compile(f, backend="eager")
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(TypeError):
        f(x)
    with pytest.raises(TypeError):
        cf(x)
    assert torch.is_grad_enabled()


def test_resume_functions_are_cached_and_reused():
    cf = compile(B.for_range, backend="eager")
    x = torch.randn(3, 4)
    cf(x)
    first = len(cf.results)
    torch.testing.assert_close(cf(x), B.for_range(x))
    assert len(cf.results) == first  # the second call captures nothing new


def test_data_dependent_branch_captures_each_side_once():
    cf = compile(B.dd_if, backend="eager")
    pos, neg = torch.rand(3) + 1, -torch.rand(3) - 1
    for _ in range(2):
        torch.testing.assert_close(cf(pos), pos + 1)
        torch.testing.assert_close(cf(neg), neg - 1)
    assert len(cf.resumes) == 2 and cf.recompiles == 0


def test_break_in_loop_resumes_inside_the_body():
    e = explain(B.for_range)(torch.randn(3, 4))
    # before the loop, the body's two pieces, and the piece after the print again for
    # i = 1 and 2 (``x + i`` specializes on the Python int); the loop itself runs in Python
    assert e.graph_count == 5
    (b,) = e.break_reasons  # the loop going on in Python is not reported as a break
    assert b.text == 'print("step", i)' and b.fallback is None
    cf = compile(B.for_range, backend="eager")
    cf(torch.randn(3, 4))
    offsets = {rf.code.co_name for rf in cf.resumes.values()}
    assert len(offsets) == 3  # after the print, at the loop body, after the loop


def test_explain_lists_every_break_with_location():
    e = explain(B.several_breaks)(torch.randn(2))
    assert e.graph_count == 4 and e.graph_break_count == 3
    texts = [b.text for b in e.break_reasons]
    assert texts == ['print("one")', 'print("two")', 'print("three")']
    first = B.several_breaks.__code__.co_firstlineno
    assert [b.lineno for b in e.break_reasons] == [first + 3, first + 5, first + 7]
    assert all(b.filename == B.__file__ and b.function == "several_breaks" for b in e.break_reasons)
    assert 'print("three")' in str(e)


def test_explain_says_when_a_frame_runs_eagerly():
    e = explain(B.try_finally_break)(torch.randn(2))
    assert e.graph_count == 0
    (b,) = e.break_reasons
    assert "inside a try block" in b.fallback
    assert "the frame runs eagerly" in str(e)


def test_explain_break_inside_a_call_names_the_inner_line():
    e = explain(B.two_deep)(torch.randn(2))
    assert [b.text for b in e.break_reasons] == ['print("in helper")']
    assert e.break_reasons[0].function == "helper_print"


def test_fullgraph_names_the_first_break():
    cf = compile(B.several_breaks, backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakInFullgraph) as info:
        cf(torch.randn(2))
    assert f"{B.__file__}:{B.several_breaks.__code__.co_firstlineno + 3}" in str(info.value)


def test_export_lists_every_break():
    with pytest.raises(ExportError) as info:
        export(B.several_breaks, torch.randn(2))
    msg = str(info.value)
    assert "3 graph break(s)" in msg
    first = B.several_breaks.__code__.co_firstlineno
    for line in (first + 3, first + 5, first + 7):
        assert f"{B.__file__}:{line}" in msg


def test_breaks_log_each_break_once(monkeypatch):
    records: list[str] = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    monkeypatch.setenv("TORCHFUSE_LOGS", "breaks")
    observe.reload_config()
    h = H()
    logger = logging.getLogger("torchfuse.breaks")
    logger.addHandler(h)
    try:
        cf = compile(B.for_range, backend="eager")
        cf(torch.randn(2))
        cf(torch.randn(2))
        compile(B.try_finally_break, backend="eager")(torch.randn(2))
    finally:
        logger.removeHandler(h)
        monkeypatch.delenv("TORCHFUSE_LOGS")
        observe.reload_config()
    prints = [m for m in records if "print()" in m and "for_range" in m]
    assert len(prints) == 1, records
    assert "resuming after it" in prints[0]
    assert f"{B.__file__}:{B.for_range.__code__.co_firstlineno + 4}" in prints[0]
    assert len(records) == len(set(records))
    (eager,) = [m for m in records if "try_finally_break" in m]
    assert "running the frame eagerly" in eager and "inside a try block" in eager


def test_user_function_called_at_a_break_is_compiled_on_its_own():
    cf = compile(B.one_deep, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), B.one_deep(x))
    assert B.helper_print in cf.callees
    inner = cf.callees[B.helper_print]
    assert len(inner.entries) == 1 and inner.entries[0].result.plan is not None


def test_resumed_code_keeps_user_tracebacks():
    def f(x):
        y = x * 2
        print("before the error")
        return y + {}["missing"]

    cf = compile(f, backend="eager")
    with pytest.raises(KeyError) as info:
        cf(torch.randn(2))
    last = info.traceback[-1]  # the instruction ran alone in Python, at the user's line
    assert last.name.startswith("torchfuse_step_f")
    assert last.lineno + 1 == f.__code__.co_firstlineno + 3  # pytest counts lines from 0


def test_args_not_deep_copied_by_break():
    lst = [torch.ones(2)]

    def f(x, xs):
        xs.append(x * 2)
        print("len", len(xs))
        return xs[-1] + 1

    cf = compile(f, backend="eager")
    out = cf(torch.ones(2), lst)
    assert len(lst) == 2 and torch.equal(out, torch.full((2,), 3.0))



class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x).relu()
        print("hidden", tuple(h.shape))
        return self.b(h).sum()


def test_module_forward_with_break_matches_eager_with_gradients(capsys):
    torch.manual_seed(0)
    net = _Net()
    cm = compile(net, backend="eager")
    x = torch.randn(3, 4)
    out = cm(x)
    grads = torch.autograd.grad(out, list(net.parameters()))
    printed = capsys.readouterr().out
    ref = net(x)
    ref_grads = torch.autograd.grad(ref, list(net.parameters()))
    assert capsys.readouterr().out == printed == "hidden (3, 8)\n"
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    assert cm._compiled.graph_count() == 2


def test_new_shape_recompiles_each_piece():
    cf = compile(B.print_middle, backend="eager")
    a, b = torch.randn(3, 4), torch.randn(5, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(cf(a), B.print_middle(a))
        torch.testing.assert_close(cf(b), B.print_middle(b))
        torch.testing.assert_close(cf(a), B.print_middle(a))
    assert cf.recompiles == 1
    (rf,) = cf.resumes.values()
    assert len(rf.entries) == 2 and rf.recompiles == 1


def test_constant_arguments_are_read_again_not_baked_in():
    def f(x, n):
        y = x * 2
        print("n is", n)
        return y, n, {"n": n}

    cf = compile(f, backend="eager")
    for n in (1, 2, 3):
        out = cf(torch.ones(2), n)
        assert out[1] == n and out[2] == {"n": n}
    assert cf.recompiles == 0


def test_export_keeps_constant_outputs_by_value():
    def f(x, n):
        return x * 2, n, (n, "a")

    ex = export(f, torch.ones(2), 3)
    got = ex.run(torch.ones(2))
    assert got[1:] == (3, (3, "a"))
    torch.testing.assert_close(got[0], torch.full((2,), 2.0))


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x).tanh()
        print("inner module")
        return h * 2

    def helper(self, x):
        y = x + 1
        print("inner helper")
        return y.sin()


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        y = self.inner(x) + 1
        f = self.inner.helper
        return f(y) * 3


def test_break_in_submodule_and_bound_method_compiles_them_on_their_own(capsys):
    torch.manual_seed(0)
    m = _Outer()
    cm = compile(m, backend="eager")
    x = torch.randn(2, 4)
    got = cm(x)
    printed = capsys.readouterr().out
    torch.testing.assert_close(got, m(x))
    assert capsys.readouterr().out == printed
    cf = cm._compiled
    assert {_Inner.forward, _Inner.helper} <= set(cf.callees)
    # outer forward: the pieces after each call (2); each called function: 2 around its print
    assert cf.graph_count() == 6
    for inner in (cf.callees[_Inner.forward], cf.callees[_Inner.helper]):
        assert len(inner.entries) == 1 and inner.entries[0].result.plan is not None
