"""Threads: N threads x M calls of one compiled function, with different shapes.

Capture state is per thread, a function's cache takes one capture at a time (a thread that
waited uses the entry another made), and the runtime's launch path may be called from several
threads (on the CPU, Triton's interpreter runs one launch at a time). See docs/semantics.md."""

from __future__ import annotations

import threading

import pytest
import torch
from semantics_helpers import compiled

THREADS = 4
CALLS = 3


def body(x, y):
    return (x * y).sin() + x.sum(-1, keepdim=True)


@pytest.mark.parametrize("dynamic", [False, None])
def test_threads_compile_and_call(backend, dynamic):
    f = compiled(body, backend, dynamic=dynamic)
    shapes = [(2, 3), (4, 3), (2, 5), (3, 3)]
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            start.wait()
            for m in range(CALLS):
                shape = shapes[(k + m) % len(shapes)]
                x, y = torch.randn(shape), torch.randn(shape)
                torch.testing.assert_close(f(x, y), body(x, y))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    checks = [e.result.checks.source for e in f.entries]
    assert len(checks) == len(set(checks)), "two entries with the same guards"
    if dynamic is False:
        assert len(f.entries) == len(shapes)
