"""gc_paused: the collector off inside, the previous state back after, on errors too."""

import gc
import threading

import pytest
from torchfuse.graph.collector import gc_paused


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_inside_and_back_on_after():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_reentrant():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block must not turn it back on
    assert gc.isenabled()


def test_back_on_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with gc_paused():
            with gc_paused():
                raise ZeroDivisionError
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_as_decorator():
    seen = []

    @gc_paused()
    def f(fail: bool) -> None:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("x")

    f(False)
    with pytest.raises(ValueError):
        f(True)
    assert seen == [False, False]
    assert gc.isenabled()


def test_overlapping_pauses_of_two_threads():
    # A enters, B enters, A leaves (B still inside: off), B leaves (on again)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with gc_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with gc_paused():
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = gc.isenabled()

    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert seen == {"b after a left": False}
    assert gc.isenabled()
