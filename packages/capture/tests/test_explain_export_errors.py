"""explain(), export(), and the errors users see."""

from __future__ import annotations

import pytest
import torch
from capture_gpt2 import GPT2
from capture_helpers import assert_same
from torchfuse.capture import (
    BackendNotFound,
    Exported,
    ExportError,
    GraphBreakInFullgraph,
    compile,
    explain,
    export,
    list_backends,
    mark_dynamic,
)
from torchfuse.capture.compiler import dynamic_requests
from torchfuse.graph import load, run
from torchfuse.graph import schema as S


def f_breaks(x):
    y = x * 2
    print("this line breaks the graph")
    return y + 1


def f_item(x):
    return x * x.sum().item()


def test_explain_counts_and_reasons():
    def f(x, n):
        return (x * n).relu().sum(0)

    e = explain(f)(torch.randn(3, 4), 2)
    assert e.graph_count == 1 and e.graph_break_count == 0
    assert e.ops_per_graph == [["aten.mul.Tensor", "aten.relu.default", "aten.sum.dim_IntList"]]
    assert e.op_count == 3
    assert e.compile_time_s > 0
    kinds = {type(g).__name__ for g in e.guards}
    assert {"TensorGuard", "ConstantGuard", "GlobalStateGuard"} <= kinds
    text = str(e)
    assert "Graph count: 1" in text and "aten.relu.default" in text and "L[1] == 2" in text


def test_explain_reports_break_location():
    e = explain(f_breaks)(torch.randn(2))
    assert e.graph_count == 2 and e.graph_break_count == 1  # capture resumes after the print
    b = e.break_reasons[0]
    assert "print" in b.reason
    assert b.filename == __file__ and b.text == 'print("this line breaks the graph")'
    assert b.lineno == f_breaks.__code__.co_firstlineno + 2
    assert "this line breaks the graph" in str(e)


def test_fullgraph_raises_with_line():
    cf = compile(f_item, backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakInFullgraph) as info:
        cf(torch.randn(3))
    msg = str(info.value)
    assert "item" in msg and f"{__file__}:{f_item.__code__.co_firstlineno + 1}" in msg
    assert "fix" in msg


def test_if_on_tensor_break_names_data_dependence():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    e = explain(f)(torch.randn(3))
    assert "data-dependent" in e.break_reasons[0].reason
    assert e.break_reasons[0].text == "if x.sum() > 0:"


def test_export_runs_and_saves(tmp_path):
    torch.manual_seed(0)
    m = GPT2().eval()
    idx = torch.randint(0, 64, (2, 8))
    ex = export(m, idx)
    assert isinstance(ex, Exported)
    # exported weights are plain tensors (no autograd): compare values
    torch.testing.assert_close(ex.run(idx), m(idx))
    idx2 = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(ex.run(idx2), m(idx2))
    path = tmp_path / "gpt2.zip"
    ex.save(path)
    graph = load(path)
    assert isinstance(graph, S.Graph)
    loaded = Exported.load(path)
    flat = [idx2 if i.kind == "user_input" else loaded.tensors[i.name] for i in graph.inputs]
    torch.testing.assert_close(run(graph, *flat)[0], m(idx2))
    torch.testing.assert_close(loaded.run(idx2), m(idx2))
    assert "in_spec" in graph.meta and "out_spec" in graph.meta
    assert {i.kind for i in graph.inputs} == {"user_input", "parameter", "buffer"}


def test_export_structured_outputs():
    def f(x, y):
        return {"sum": x + y, "parts": (x * 2, None, 3)}

    x, y = torch.randn(2), torch.randn(2)
    ex = export(f, x, y)
    assert_same(ex.run(x, y), f(x, y))


def test_export_error_lists_breaks():
    with pytest.raises(ExportError) as info:
        export(f_breaks, torch.randn(2))
    msg = str(info.value)
    assert "print" in msg and f"{__file__}:{f_breaks.__code__.co_firstlineno + 2}" in msg


def test_unknown_backend_lists_available():
    assert "eager" in list_backends()
    with pytest.raises(BackendNotFound, match="eager"):
        compile(lambda x: x, backend="nope")


def test_default_backend_missing_is_clear():
    if "inductor" in list_backends():
        pytest.skip("torchfuse-inductor is installed")
    cf = compile(lambda x: x + 1)
    with pytest.raises(BackendNotFound, match=r"available: .*eager"):
        cf(torch.randn(2))


def test_custom_backend_callable_gets_graph_and_examples():
    seen = {}

    def backend(graph, example_inputs):
        seen["graph"] = graph
        seen["examples"] = example_inputs
        return lambda *flat: run(graph, *flat)

    cf = compile(lambda x, y: x @ y, backend=backend)
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    assert_same(cf(x, y), x @ y)
    assert [n.op for n in seen["graph"].nodes] == ["aten.mm.default"]
    assert seen["examples"][0] is x and seen["examples"][1] is y


def test_mark_dynamic_is_recorded():
    x = torch.randn(4, 3)
    mark_dynamic(x, 0, min=2, max=64)
    assert dynamic_requests(x) == {0: (2, 64)}
    cf = compile(lambda t: t * 2, backend="eager")
    assert_same(cf(x), x * 2)


def test_nodes_carry_user_source_lines():
    def f(x):
        y = x.sin()
        return y * 2

    e = explain(f)(torch.randn(2))
    locs = [n.loc for n in e.graphs[0].nodes]
    assert [loc.text for loc in locs] == ["y = x.sin()", "return y * 2"]
    assert all(loc.file == __file__ and loc.function.endswith("f") for loc in locs)


def test_grad_mode_region_in_graph():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x

    e = explain(f)(torch.randn(2, requires_grad=True))
    ops = e.ops_per_graph[0]
    assert ops.count("torchfuse.set_grad_enabled.default") == 2


def test_graph_break_runs_eagerly_with_same_result(capsys):
    cf = compile(f_breaks, backend="eager")
    x = torch.randn(2)
    assert_same(cf(x), x * 2 + 1)
    assert "this line breaks the graph" in capsys.readouterr().out


def _inner_breaks(t):
    u = t + 1
    return u.tolist()


def test_break_state_keeps_stack_and_locals_of_each_frame():
    from torchfuse.capture.convert import capture, make_binder

    def outer(x):
        y = x * 2
        return _inner_breaks(y) + [1]  # noqa: RUF005

    x = torch.randn(3)
    result = capture(outer, make_binder(outer)(x), "outer")
    err = result.error
    assert err is not None and "tolist" in err.reason
    inner, outer_state = err.break_chain
    assert inner.frame.code is _inner_breaks.__code__ and outer_state.frame.code is outer.__code__
    assert inner.instruction.opname == "CALL" and outer_state.instruction.opname == "CALL"
    assert set(inner.locals) == {"t", "u"} and set(outer_state.locals) == {"x", "y"}
    assert err.break_state is inner
    assert inner.stack[-1].describe() == "method tolist of tensor (3,) float32"


def test_uncaught_exception_is_raised_by_eager_run():
    def f(x, d):
        return x * d["missing"]

    cf = compile(f, backend="eager")
    with pytest.raises(KeyError, match="missing"):
        cf(torch.ones(2), {"a": 1})
    e = explain(f)(torch.ones(2), {"a": 1})
    assert e.break_reasons[0].reason.startswith("KeyError")


def test_exception_caught_inside_capture_is_one_graph():
    def f(x, cfg):
        try:
            scale = cfg["scale"]
        except KeyError:
            scale = 2.0
        return x * scale

    cf = compile(f, backend="eager", fullgraph=True)
    assert_same(cf(torch.ones(2), {}), torch.full((2,), 2.0))
    assert_same(cf(torch.ones(2), {"scale": 3.0}), torch.full((2,), 3.0))
