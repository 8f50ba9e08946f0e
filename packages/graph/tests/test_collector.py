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


@pytest.fixture
def gc_pause_env(monkeypatch):
    """Set ``TORCHFUSE_GC_PAUSE`` and re-read the config; the config is read back after."""
    from torchfuse.graph import observe

    def set_to(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("TORCHFUSE_GC_PAUSE", raising=False)
        else:
            monkeypatch.setenv("TORCHFUSE_GC_PAUSE", value)
        observe.reload_config()

    yield set_to
    monkeypatch.delenv("TORCHFUSE_GC_PAUSE", raising=False)
    observe.reload_config()


@pytest.mark.parametrize(("value", "pauses"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_gc_pause_switch(gc_pause_env, value, pauses):
    from torchfuse.graph import observe

    gc_pause_env(value)
    assert observe.config.gc_pause is pauses
    with gc_paused():
        with gc_paused():
            assert gc.isenabled() is not pauses
        assert gc.isenabled() is not pauses
    assert gc.isenabled()


def test_gc_pause_off_leaves_a_disabled_collector_disabled(gc_pause_env):
    gc_pause_env("0")
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_gc_pause_off_leaves_the_users_switch_alone(gc_pause_env):
    # the user turns the collector off inside an unpaused compile: it stays off after
    gc_pause_env("0")
    with gc_paused():
        gc.disable()
    assert not gc.isenabled()
