"""The collector is paused while a frame is captured and compiled, and restored after it."""

import gc

import pytest
import torch
import torchfuse.capture as tf
from torchfuse.capture.backends import eager


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_during_the_backend_call_and_on_again_after():
    seen = []

    def backend(graph, example_inputs):
        seen.append(gc.isenabled())
        return eager(graph, example_inputs)

    f = tf.compile(lambda x: x.sin() + 1, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x.sin() + 1)
    assert seen == [False]
    assert gc.isenabled()


class _BackendBroke(RuntimeError):
    pass


def test_on_again_after_a_compile_that_raised():
    def backend(graph, example_inputs):
        assert not gc.isenabled()
        raise _BackendBroke("no")

    f = tf.compile(lambda x: x.cos() * 2, backend=backend)
    with pytest.raises(_BackendBroke):
        f(torch.randn(3))
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    f = tf.compile(lambda x: x + 1, backend="eager")
    f(torch.randn(2))
    assert not gc.isenabled()
