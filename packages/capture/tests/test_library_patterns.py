"""Python patterns of real libraries (``transformers`` and friends), each on its own: captured
in graphs, with eager's values, and no frame sent to eager without a warning."""

from __future__ import annotations

import warnings

import library_code as lib
import pytest
import torch
from torchfuse.capture import compile, explain, export
from torchfuse.capture.compiler import EagerFallbackWarning
from torchfuse.capture.errors import ExportError


def test_break_under_try_in_a_callee_compiles_the_callee_as_its_own_frame():
    x = torch.randn(8)

    def f(x):
        return lib.body(x * 2) - 1

    c = compile(f, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        got = c(x)
    torch.testing.assert_close(got, f(x))
    # the ops of ``body`` run in graphs: the wrapper's frame runs in Python (a try block),
    # the call in it is captured as a frame of its own, resumed after the break in it
    ops = [n.op for r in c.results if r.graph is not None for n in r.graph.nodes]
    assert "aten.relu.default" in ops and "aten.sin.default" in ops
    torch.testing.assert_close(c(x), f(x))  # the cached entries: same answer
    (reason,) = explain(f)(x).break_reasons  # explain names the calls that led to the break
    assert reason.function == "graph_break" and len(reason.stack) == 3
    assert reason.stack[0].startswith(__file__) and "wrapper" in reason.stack[1]
    assert "called from (outermost first)" in str(reason)


def test_breaks_log_shows_the_call_stack(monkeypatch, capsys):
    from torchfuse.graph import observe

    monkeypatch.setenv("TORCHFUSE_LOGS", "breaks")
    observe.reload_config()
    try:
        compile(lambda x: lib.body(x), backend="eager")(torch.randn(3))
    finally:
        monkeypatch.delenv("TORCHFUSE_LOGS")
        observe.reload_config()
    text = capsys.readouterr().err
    assert "print() inside a compiled function" in text
    assert "called from (outermost first)" in text and "library_code.py" in text
    assert "compiled as a frame of its own" in text


def test_a_frame_running_eagerly_with_all_it_calls_warns_once():
    def f(x):
        y = x + 1
        try:
            print("a break right in the try block")
        finally:
            pass
        return y * 2

    c = compile(f, backend="eager")
    x = torch.randn(4)
    with pytest.warns(EagerFallbackWarning, match="runs eagerly"):
        torch.testing.assert_close(c(x), f(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        c(x)  # once per function


def test_dict_subclass_registry_read_with_super_get():
    lin = torch.nn.Linear(4, 4)
    lib.REGISTRY[lin] = {"scale": 2.0}

    def f(x):
        scale = lib.REGISTRY.get(lin).get("scale", 1.0)
        return lin(x) * scale

    x = torch.randn(2, 4)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    c = compile(f, backend="eager")
    torch.testing.assert_close(c(x), f(x))
    lib.REGISTRY[lin] = {"scale": 5.0}  # the registry changed: guarded, captured again
    torch.testing.assert_close(c(x), f(x))


def test_sequence_mixin_iteration_and_raise_from_none():
    def f(x):
        for i in lib.Layers(3):
            x = x * i
        return x + float(lib.from_env("TORCHFUSE_SURELY_UNSET_VARIABLE", "1.5"))

    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))


def test_raise_from_sets_the_cause():
    def f(x):
        try:
            {}["missing"]
        except KeyError as e:
            try:
                raise ValueError("bad") from e
            except ValueError as v:
                ok = v.__cause__ is e and v.__suppress_context__
        return x + 1 if ok else x - 1

    x = torch.randn(2)
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))


def test_deepcopy_of_a_config_with_aliases():
    cfg = lib.Config(4, 2)

    def f(x):
        other = lib.copy_config(cfg)
        return x * other.hidden_size + cfg.width + other.layers + (1 if hasattr(other, "extra") else 0)

    x = torch.randn(2)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    c = compile(f, backend="eager")
    torch.testing.assert_close(c(x), f(x))
    assert cfg.hidden_size == 4 and cfg.extra == {"a": 1}  # the original is untouched
    cfg.hidden_size = 7  # read through the copy: guarded on the original
    torch.testing.assert_close(c(x), f(x))


def test_loss_module_made_in_the_function():
    def f(x, y):
        return torch.nn.CrossEntropyLoss(reduction="sum")(x, y)

    x, y = torch.randn(4, 5), torch.tensor([1, 0, 4, 2])
    e = explain(f)(x, y)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    torch.testing.assert_close(compile(f, backend="eager")(x, y), f(x, y))


def test_scalar_tensor_made_in_the_function_is_no_graph_input():
    def f(x):
        return torch.minimum(x, torch.tensor(0.5)) + torch.tensor([], dtype=x.dtype).sum()

    x = torch.randn(5)
    e = explain(f)(x)
    assert [i.kind for i in e.graphs[0].inputs] == ["user_input"]
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))


def test_export_ignores_bookkeeping_set_and_reset_in_the_call():
    class Collector:
        def __init__(self):
            self.active = None

    state = Collector()

    def f(x, **kwargs):
        kwargs.pop("unused", None)  # a fresh **kwargs dict: no side effect either
        state.active = []
        y = x * 2
        state.active = None
        return y

    x = torch.randn(3)
    torch.testing.assert_close(export(f, x, unused=1).run(x), f(x))

    def g(x):
        state.active = []  # left changed: a side effect, reported where it is done
        return x * 2

    with pytest.raises(ExportError, match=r"\.active = list of 0\) cannot be exported\n.*test_library_patterns.py:"):
        export(g, x)


def test_autocast_casts_cached_during_capture_never_reach_python():
    lin = torch.nn.Linear(4, 4)

    def f(x):
        try:
            y = lib.body(lin(x))
        finally:
            pass
        return lin(x).float() + y  # eager code in the caller's autocast region, after capture

    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = compile(f, backend="eager")(x)
            want = f(x)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, want)


def test_modules_made_at_run_time_do_not_move_the_module_version():
    from torchfuse.capture.guards import module_version

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(3)])
            self.depth = 2

        def forward(self, x):
            for layer in self.layers[: self.depth]:  # a new ModuleList on every call
                x = layer(x)
            return x

    net = Net()
    x = torch.randn(2, 3)
    c = compile(net, backend="eager")
    torch.testing.assert_close(c(x), net(x))
    before = module_version[0]
    net(x)  # eager: the slice builds and fills a ModuleList nobody captured
    assert module_version[0] == before
    net.depth = 3  # a module capture read: its write moves the version, the guard sees it
    assert module_version[0] > before
    torch.testing.assert_close(c(x), net(x))


def test_truth_of_an_object_through_its_own_bool_or_len():
    class Cache:
        def __init__(self, n):
            self.layers = [None] * n

        def __len__(self):
            return len(self.layers)

    class Flag:
        def __bool__(self):
            return False

    def f(x, cache, flag):
        return (x + 1 if cache else x - 1) * (2 if flag else 3)

    x = torch.randn(2)
    for cache in (Cache(0), Cache(2)):
        e = explain(f)(x, cache, Flag())
        assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
        torch.testing.assert_close(compile(f, backend="eager")(x, cache, Flag()), f(x, cache, Flag()))


def test_resume_inside_the_stdlib_uses_its_globals():
    """``collections.namedtuple`` breaks on ``sys.intern``; resumed, the rest of it reads
    ``collections``' own globals (``_iskeyword``, ``_sys``), never the caller's."""
    import collections

    def f(x):
        y = x + 1
        Pair = collections.namedtuple("Pair", ["a", "b"], defaults=[2], module=__name__)
        p = Pair(y)
        return p.a * p.b, Pair._fields

    c = compile(f, backend="eager")
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            got, fields = c(x)
            torch.testing.assert_close(got, (x + 1) * 2)
            assert fields == ("a", "b")
