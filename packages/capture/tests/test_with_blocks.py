"""``with`` blocks: profiler/tracing ranges are transparent to capture, and a block resumes
after a graph break inside it or on its own ``BEFORE_WITH`` (an unmodelled context manager,
whose ``__enter__``/``__exit__`` then run in Python, once each, in order)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torchfuse.capture import compile, explain


def _ranges(x):
    with torch.autograd.profiler.record_function("outer"):
        y = x.sin()
        with torch.profiler.record_function("inner"):
            y = y * 2
        y = y + 1
    return y.cos()


def _range_with_break(x):
    with torch.profiler.record_function("outer"):
        y = x.sin()
        print("a graph break inside the range")
        y = y * 2
    return y.cos()


def test_profiler_ranges_are_transparent():
    x = torch.randn(5)
    e = explain(_ranges)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
    torch.testing.assert_close(compile(_ranges, backend="eager")(x), _ranges(x))


def test_break_inside_a_range_resumes_in_it(capsys):
    x = torch.randn(5)
    e = explain(_range_with_break)(x)
    assert e.graph_count == 2 and e.graph_break_count == 1, str(e)
    assert all(b.fallback is None for b in e.break_reasons)
    f = compile(_range_with_break, backend="aot_eager")
    xr = x.clone().requires_grad_()
    f(xr).sum().backward()
    xe = x.clone().requires_grad_()
    _range_with_break(xe).sum().backward()
    torch.testing.assert_close(xr.grad, xe.grad)


@pytest.mark.skipif(not hasattr(torch.cuda, "nvtx"), reason="no torch.cuda.nvtx")
def test_nvtx_range_is_transparent():
    def f(x):
        with torch.cuda.nvtx.range("step"):
            return x.sin() * 2
    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)


def test_ranges_still_work_in_a_profile():
    x = torch.randn(5)
    f = compile(_range_with_break, backend="eager")
    with torch.profiler.profile() as prof:
        out = f(x)
    torch.testing.assert_close(out, _range_with_break(x))
    assert prof.key_averages() is not None  # no range left open or closed twice


def test_unmodelled_context_manager_resumes_and_runs_once_per_call():
    events = []

    @contextlib.contextmanager
    def tracked(tag):
        events.append(("enter", tag))
        try:
            yield 3
        finally:
            events.append(("exit", tag))

    class Opaque:  # a C-like manager: capture cannot look into it
        __slots__ = ()

        def __enter__(self):
            events.append("opaque enter")
            return 2

        def __exit__(self, *exc):
            events.append("opaque exit")

    def f(x, box):
        y = x.sin()
        with tracked("a") as k:
            y = y * k
            with box as j:
                y = y + j
            y = y.cos()
        return y * 2

    x = torch.randn(4)
    want = f(x, Opaque())
    events.clear()
    cf = compile(f, backend="eager")
    for _ in range(2):
        events.clear()
        torch.testing.assert_close(cf(x, Opaque()), want)
        assert events == [("enter", "a"), "opaque enter", "opaque exit", ("exit", "a")]
    assert cf.graph_count() >= 2


def test_exception_in_a_resumed_block_reaches_its_exit():
    seen = []

    class Opaque:
        __slots__ = ()

        def __enter__(self):
            return None

        def __exit__(self, typ, value, tb):
            seen.append(typ)

    def f(x, box):
        with box:
            y = x.sin()
            raise_inside(y)
            return y

    def raise_inside(y):
        print("break")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        compile(f, backend="eager")(torch.randn(2), Opaque())
    assert seen == [ValueError]


class _Tracked:
    """A user context manager capture interprets (its methods are Python)."""

    def __init__(self, seen):
        self.seen = seen

    def __enter__(self):
        self.seen.append("enter")
        return self

    def __exit__(self, typ, value, tb):
        self.seen.append(typ)


class _Slotted:
    __slots__ = ("log",)

    def __enter__(self):
        return None

    def __exit__(self, typ, value, tb):
        return None


def test_exception_at_a_break_reaches_an_interpreted_exit():
    seen = []

    def raise_inside(y):
        print("break")
        raise ValueError("boom")

    def f(x):
        with _Tracked(seen):
            y = x.sin()
            raise_inside(y)
            return y

    with pytest.raises(ValueError, match="boom"):
        compile(f, backend="eager")(torch.randn(2))
    assert seen == ["enter", ValueError]


def test_object_with_slots_made_in_the_frame_survives_a_break():
    def f(x):
        box = _Slotted()
        box.log = 3
        with box:
            y = x.sin()
            print("break")
        return y * box.log

    x = torch.randn(3)
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))


def test_contextlib_classes_are_interpreted_not_broken_on():
    """``nullcontext`` and ``suppress`` are plain classes of contextlib (transformers 5.17's
    ``maybe_autocast`` returns a nullcontext outside autocast): one graph, eager's values."""

    def f(x):
        with contextlib.nullcontext(x) as y:
            z = y * 2
        with contextlib.suppress(KeyError):  # nothing raised in it (an exception is not captured)
            z = z + 1
        return z.sin()

    x = torch.randn(4)
    report = explain(f)(x)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))


def test_a_contextmanager_generator_still_runs_in_python():
    log = []

    @contextlib.contextmanager
    def scope():
        log.append("enter")
        yield
        log.append("exit")

    def f(x):
        with scope():
            x = x + 1
        return x * 2

    x = torch.randn(3)
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))
    assert log == ["enter", "exit"] * 2
    assert explain(f)(x).graph_break_count >= 1


def test_contextlib_classes_that_touch_process_state_still_run_in_python(tmp_path):
    import os

    seen = []

    def f(x):
        with contextlib.chdir(tmp_path):
            seen.append(os.getcwd())
            x = x + 1
        return x * 2

    before = os.getcwd()
    x = torch.randn(3)
    torch.testing.assert_close(compile(f, backend="eager")(x), f(x))
    assert os.getcwd() == before and seen == [str(tmp_path)] * 2
    reasons = [r.reason for r in explain(f)(x).break_reasons]
    assert any("chdir (contextlib" in r for r in reasons), reasons
