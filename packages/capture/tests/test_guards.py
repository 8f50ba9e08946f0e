"""Guards, the cache and recompiles: what changes recompile, what does not, and the limit."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import RecompileLimitExceeded, compile, config
from torchfuse.graph import schema as S

FACTOR = 2.0


def _kinds(cf):
    return [type(g).__name__ for g in cf.entries[-1].result.graph.guards]


def test_dtype_change_recompiles():
    cf = compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3)
    assert_same(cf(x), x * 2)
    xd = x.double()
    assert_same(cf(xd), xd * 2)
    assert len(cf.entries) == 2 and cf.recompiles == 1
    assert_same(cf(x), x * 2)  # the first entry still serves float32
    assert len(cf.entries) == 2


def test_shape_change_recompiles():
    cf = compile(lambda x: x.sum(0), backend="eager")
    for shape in [(3, 4), (5, 4), (3, 4)]:
        x = torch.randn(*shape)
        assert_same(cf(x), x.sum(0))
    assert len(cf.entries) == 2


def test_stride_change_recompiles():
    cf = compile(lambda x: x + 1, backend="eager")
    x = torch.randn(4, 4)
    cf(x)
    xt = x.t()
    assert_same(cf(xt), xt + 1)
    assert len(cf.entries) == 2


def test_requires_grad_change_recompiles():
    cf = compile(lambda x: x * 3, backend="eager")
    x = torch.randn(3)
    cf(x)
    xr = x.clone().requires_grad_()
    out = cf(xr)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(xr.grad, torch.full((3,), 3.0))
    assert len(cf.entries) == 2


def test_constant_argument_change_recompiles():
    def f(x, n):
        return x * n

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    assert_same(cf(x, 2), x * 2)
    assert_same(cf(x, 2), x * 2)
    assert len(cf.entries) == 1
    assert_same(cf(x, 3), x * 3)
    assert len(cf.entries) == 2
    guards = cf.entries[0].result.graph.guards
    assert any(isinstance(g, S.ConstantGuard) and g.source == "L[1]" and g.value == "2" for g in guards)


def test_unused_constant_argument_is_not_guarded():
    def f(x, unused):
        return x + 1

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    cf(x, 1)
    cf(x, 2)
    assert len(cf.entries) == 1


def test_bool_vs_int_constant_distinguished():
    def f(x, k):
        return x * k

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    assert_same(cf(x, 1), x * 1)
    assert_same(cf(x, True), x * True)
    assert len(cf.entries) == 2


def test_global_change_recompiles():
    global FACTOR

    def f(x):
        return x * FACTOR

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    try:
        assert_same(cf(x), x * 2.0)
        FACTOR = 5.0
        assert_same(cf(x), x * 5.0)
        assert len(cf.entries) == 2
    finally:
        FACTOR = 2.0


def test_grad_mode_change_recompiles():
    cf = compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3, requires_grad=True)
    assert cf(x).requires_grad
    with torch.no_grad():
        out = cf(x)
    assert not out.requires_grad
    assert len(cf.entries) == 2
    assert "GlobalStateGuard" in _kinds(cf)


def test_list_length_change_recompiles():
    def f(xs):
        return sum(xs)

    cf = compile(f, backend="eager")
    a = [torch.ones(2), torch.ones(2)]
    assert_same(cf(a), sum(a))
    b = [*a, torch.ones(2)]
    assert_same(cf(b), sum(b))
    assert len(cf.entries) == 2
    assert "LengthGuard" in _kinds(cf)


def test_parameter_update_without_recompile():
    lin = nn.Linear(3, 2)
    cm = compile(lin, backend="eager")
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    x = torch.randn(4, 3)
    for _ in range(3):
        out = cm(x)
        assert_same(out, lin(x))
        out.sum().backward()
        opt.step()
        opt.zero_grad()
    assert len(cm._compiled.entries) == 1 and cm._compiled.recompiles == 0


def test_parameter_reassignment_is_seen():
    lin = nn.Linear(3, 2)
    cm = compile(lin, backend="eager")
    x = torch.randn(4, 3)
    cm(x)
    lin.weight = nn.Parameter(torch.zeros(2, 3))
    assert_same(cm(x), lin(x))
    lin.weight = nn.Parameter(torch.zeros(5, 3))  # new shapes: the module guard fails
    lin.bias = nn.Parameter(torch.ones(5))
    assert_same(cm(x), lin(x))
    assert len(cm._compiled.entries) == 2


def test_train_eval_switch_recompiles():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.9))
    cm = compile(m, backend="eager")
    x = torch.randn(8, 4)
    m.eval()
    assert_same(cm(x), m(x))
    m.train()
    torch.manual_seed(0)
    out = cm(x)
    assert (out == 0).float().mean() > 0.5  # dropout active in training mode
    assert len(cm._compiled.entries) == 2
    m.eval()
    assert_same(cm(x), m(x))
    assert len(cm._compiled.entries) == 2


def test_recompile_limit_falls_back_to_eager_and_warns():
    def f(x, n):
        return x + n

    cf = compile(f, backend="eager", dynamic=False)  # ints stay constants: one entry each
    x = torch.randn(2)
    with config.patch(recompile_limit=3), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(6):
            assert_same(cf(x, n), x + n)
    assert len(cf.entries) == 3
    msgs = [str(m.message) for m in w if "recompile limit" in str(m.message)]
    assert len(msgs) == 1
    assert "f" in msgs[0] and "L[1] == 2" in msgs[0]


def _break_then_scale(x, n):
    y = x + 1
    print("a graph break")  # the limit is then hit by the resume function
    return y * n


class _Scale(nn.Module):
    def forward(self, x, n):
        return x * n


@pytest.mark.parametrize("fn", [lambda x, n: x + n, _break_then_scale, _Scale()],
                         ids=["function", "function_with_break", "module"])
def test_recompile_limit_warning_points_at_the_callers_line(fn):
    cf = compile(fn, backend="eager")
    x = torch.randn(2)
    with config.patch(recompile_limit=2), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(4):
            call_line = sys._getframe().f_lineno + 1
            assert_same(cf(x, n), fn(x, n))
    hits = [m for m in w if "recompile limit" in str(m.message)]
    assert len(hits) == 1
    assert (hits[0].filename, hits[0].lineno) == (__file__, call_line)


def test_recompile_limit_can_raise():
    cf = compile(lambda x, n: x + n, backend="eager")
    x = torch.randn(2)
    with config.patch(recompile_limit=1, raise_on_recompile_limit=True):
        cf(x, 0)
        with pytest.raises(RecompileLimitExceeded, match="recompile limit"):
            cf(x, 1)


def test_recompile_is_logged_with_the_failing_guard(recompile_log):
    cf = compile(lambda x: x + 1, backend="eager")
    cf(torch.randn(2))
    cf(torch.randn(3))
    records = recompile_log
    assert any("L[0]" in r and "size=[2]" in r for r in records), records


def test_guards_carry_source_lines():
    def f(x, n):
        return x * n

    cf = compile(f, backend="eager")
    cf(torch.randn(2), 3)
    g = next(g for g in cf.entries[0].result.graph.guards if isinstance(g, S.ConstantGuard))
    assert g.loc is not None and g.loc.text == "return x * n"


def test_module_identity_guard():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)

    def f(m, x):
        return m(x)

    cf = compile(f, backend="eager")
    x = torch.randn(1, 2)
    assert_same(cf(a, x), a(x))
    assert_same(cf(b, x), b(x))
    assert len(cf.entries) == 2


def test_guard_check_code_does_not_grow_with_parameters():
    """Per-call checks cover the inputs; module state is checked only when it changed."""
    big = nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)])
    cm = compile(big, backend="eager")
    cm(torch.randn(1, 4))
    src = cm._compiled.entries[0].result.checks.source
    fast = src.split("def check_modules")[0]
    assert fast.count("_parameters") == 0
    assert src.count("_parameters") == 40


def test_version_counter_skips_module_checks(monkeypatch):
    lin = nn.Linear(2, 2)
    cm = compile(lin, backend="eager")
    x = torch.randn(1, 2)
    cm(x)
    entry = cm._compiled.entries[0]
    calls = []
    orig = entry.revalidate
    monkeypatch.setattr(entry, "revalidate", lambda *a: calls.append(1) or orig(*a))
    cm(x)
    assert calls == []
    lin.some_attribute = 1  # any module write moves the version
    cm(x)
    assert calls == [1]


def test_module_checks_compile_when_first_needed():
    """The module guards (one per parameter and attribute) are compiled only when a module
    write asks for them, and then hold as before: a changed shape recompiles."""
    lin = nn.Linear(3, 2)
    cm = compile(lin, backend="eager")
    x = torch.randn(4, 3)
    cm(x)
    cm(x)
    check = cm._compiled.entries[0].module_check
    assert check.fn is None  # nothing changed: never compiled
    lin.weight = nn.Parameter(torch.zeros(2, 3))  # same metadata: the entry still holds
    assert_same(cm(x), lin(x))
    assert check.fn is not None and len(cm._compiled.entries) == 1
    lin.weight = nn.Parameter(torch.zeros(2, 3, dtype=torch.float64))
    lin.bias = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    assert_same(cm(x.double()), lin(x.double()))
    assert len(cm._compiled.entries) == 2


def test_break_entry_and_its_resume_function_are_cached():
    def f(x):
        print("side")
        return x + 1

    cf = compile(f, backend="eager")
    cf(torch.randn(2))
    cf(torch.randn(2))
    assert len(cf.entries) == 1 and cf.entries[0].result.plan is not None
    (resume,) = cf.resumes.values()
    assert len(resume.entries) == 1 and resume.recompiles == 0


def test_autocast_region_matches_eager():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y.float() + 1, y.dtype

    cf = compile(f, backend="eager")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    out, dt = cf(x, w)
    ref, rdt = f(x, w)
    assert dt == rdt == torch.bfloat16
    torch.testing.assert_close(out, ref)
    assert not cf.entries[0].eager


def test_autocast_state_is_guarded():
    cf = compile(lambda x, w: x @ w, backend="eager")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert cf(x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cf(x, w)
        ref = x @ w
    assert out.dtype == ref.dtype == torch.bfloat16
    assert len(cf.entries) == 2
    with torch.autocast("cpu", dtype=torch.float16):  # the dtype too, not only on/off
        out = cf(x, w)
        ref = x @ w
    assert out.dtype == ref.dtype == torch.float16
    assert len(cf.entries) == 3


def test_the_autocast_records_of_the_format_check_what_the_guard_checks():
    """A graph's GlobalStateGuard records say autocast is on and to which dtype; the format's
    own check (`printer.check_global_state`) holds under the capture's autocast only."""
    from torchfuse.graph.printer import check_global_state

    cf = compile(lambda x, w: x @ w, backend="eager")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cf(x, w)
    records = {g.name: g.value for g in cf.entries[0].result.graph.guards if isinstance(g, S.GlobalStateGuard)}
    assert records["autocast_enabled(cpu, cuda)"] == "(True, False)"
    assert records["autocast_dtype(cpu, cuda)"] == "('bfloat16', None)"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert all(check_global_state(k, v) for k, v in records.items())
    with torch.autocast("cpu", dtype=torch.float16):
        assert not check_global_state("autocast_dtype(cpu, cuda)", records["autocast_dtype(cpu, cuda)"])


def test_the_default_dtype_is_guarded():
    """``torch.ones(n)`` takes the default dtype: changing it recompiles, as eager's result
    changes dtype."""
    cf = compile(lambda x: x + torch.ones(x.shape[0]), backend="eager")
    x = torch.randn(3)
    assert cf(x).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out, ref = cf(x), x + torch.ones(3)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == ref.dtype == torch.float64
    assert len(cf.entries) == 2


def test_parameter_metadata_check_can_be_turned_off():
    lin = nn.Linear(2, 2)
    with config.patch(check_parameter_metadata=False):
        cm = compile(lin, backend="eager")
        cm(torch.randn(1, 2))
    src = cm._compiled.entries[0].result.checks.source
    assert "_parameters" not in src


def test_aliased_arguments_are_guarded():
    def f(a, b):
        a.add_(1)
        return a + b

    cf = compile(f, backend="eager")
    x = torch.zeros(2)
    assert_same(cf(x, x), torch.full((2,), 2.0))
    y, z = torch.zeros(2), torch.zeros(2)
    assert_same(cf(y, z), torch.ones(2))  # distinct tensors: the alias guard fails
    assert len(cf.entries) == 2
    w = torch.zeros(3)
    assert_same(cf(w, torch.zeros(3)), torch.ones(3))


def test_distinct_arguments_then_aliased_recompiles():
    def f(a, b):
        a.add_(1)
        return a + b

    cf = compile(f, backend="eager")
    assert_same(cf(torch.zeros(2), torch.zeros(2)), torch.ones(2))
    x = torch.zeros(2)
    assert_same(cf(x, x), torch.full((2,), 2.0))
    assert len(cf.entries) == 2


class Scaled:
    factor = 2

    def __init__(self):
        self.k = 1


def test_class_attribute_change_recompiles():
    def f(x, s):
        return x * s.factor + s.k

    cf = compile(f, backend="eager")
    s, x = Scaled(), torch.ones(2)
    assert_same(cf(x, s), x * 2 + 1)
    Scaled.factor = 5
    try:
        assert_same(cf(x, s), x * 5 + 1)
    finally:
        Scaled.factor = 2
    assert len(cf.entries) == 2


def test_graph_and_guards_channels_log(monkeypatch):
    from torchfuse.graph import observe

    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.getMessage()))

    monkeypatch.setenv("TORCHFUSE_LOGS", "graph,guards,breaks")
    observe.reload_config()
    h = H()
    loggers = [logging.getLogger(f"torchfuse.{c}") for c in ("graph", "guards", "breaks")]
    for lg in loggers:
        lg.addHandler(h)
    try:
        compile(lambda x: x.exp(), backend="eager")(torch.randn(2))

        def brk(x):
            return x.tolist()

        compile(brk, backend="eager")(torch.randn(2))
    finally:
        for lg in loggers:
            lg.removeHandler(h)
        monkeypatch.delenv("TORCHFUSE_LOGS")
        observe.reload_config()
    names = {n for n, _ in records}
    assert names == {"torchfuse.graph", "torchfuse.guards", "torchfuse.breaks"}
    text = "\n".join(m for _, m in records)
    assert "aten.exp.default" in text and "L[0]: Tensor(dtype=float32" in text and "tolist" in text


def _make_scaler(k):
    def scale(x, bias=1):
        return x * k + bias
    return scale


SCALER = _make_scaler(2)


def test_helper_closure_and_defaults_are_guarded():
    global SCALER

    def f(x):
        return SCALER(x)

    cf = compile(f, backend="eager")
    x = torch.ones(2)
    try:
        assert_same(cf(x), x * 2 + 1)
        SCALER.__closure__[0].cell_contents = 5
        assert_same(cf(x), x * 5 + 1)
        SCALER.__defaults__ = (7,)
        assert_same(cf(x), x * 5 + 7)
        assert len(cf.entries) == 3
    finally:
        SCALER = _make_scaler(2)


def _closure_over(s):
    def f(x):
        return x * len(s) + (1 if 3 in s else 0)
    return f


def test_closure_set_contents_are_guarded():
    s = {1}
    cf = compile(_closure_over(s), backend="eager")
    x = torch.ones(2)
    assert_same(cf(x), x * 1)
    s.add(2)
    assert_same(cf(x), x * 2)
    s.add(3)
    assert_same(cf(x), x * 3 + 1)
    assert len(cf.entries) == 3


def test_method_defaults_are_guarded():
    class Scale(nn.Module):
        def forward(self, x, k=2, *, bias=0):
            return x * k + bias

    m = Scale()
    cf = compile(lambda x: m(x) + m.forward(x), backend="eager")
    x = torch.ones(2)
    assert_same(cf(x), x * 4)
    Scale.forward.__defaults__ = (5,)
    assert_same(cf(x), x * 10)
    Scale.forward.__kwdefaults__ = {"bias": 1}
    assert_same(cf(x), x * 10 + 2)
    assert len(cf.entries) == 3


class GlobalScale(nn.Module):
    def forward(self, x, k=2):
        return x * k


def test_method_defaults_of_a_global_class_are_one_guard():
    """Many instances of one module class: its defaults are guarded once, on the class."""
    seq = nn.Sequential(*(GlobalScale() for _ in range(4)))
    cf = compile(lambda x: seq(x), backend="eager")
    x = torch.ones(2)
    assert_same(cf(x), x * 16)
    conds = [g for g in cf.entries[0].result.graph.guards if "__defaults__" in getattr(g, "source", "")]
    assert len(conds) == 1, conds
    try:
        GlobalScale.forward.__defaults__ = (3,)
        assert_same(cf(x), x * 81)
    finally:
        GlobalScale.forward.__defaults__ = (2,)


def test_new_ndarray_each_call_reuses_the_entry():
    np = pytest.importorskip("numpy")
    from torchfuse.capture import explain

    def f(x, a):
        return x + torch.from_numpy(a) * len(a)

    cf = compile(f, backend="eager")
    x = torch.ones(3)
    for k in range(3):
        a = np.full(3, float(k), dtype=np.float32)
        assert_same(cf(x, a), f(x, a))
    assert len(cf.entries) == 1
    a4 = np.ones(4, dtype=np.float32)
    assert_same(cf(torch.ones(4), a4), f(torch.ones(4), a4))  # a new shape: recompiles
    assert len(cf.entries) == 2
    text = str(explain(f)(x, np.ones(3, dtype=np.float32)))
    assert "L[1].shape == (3,)" in text and "from_numpy" not in text, text
