"""The library warm-up's jobs (`torchfuse.runtime.library_warmup`): which extern calls a first
GPU call hands to its background thread, and that calling them builds the right tensors. The
thread itself needs CUDA (`test_gpu.py`)."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import runtime_programs as P
import torch
import torch.nn.functional as F
import torchfuse.runtime.config as rconfig
from torchfuse.runtime import library_warmup, load

CONV = P.CONV


def test_jobs_are_the_distinct_convolutions_with_their_layouts():
    (job,) = library_warmup.jobs(P.conv_program("cpu"), {"s0": 5})
    assert job.op == CONV
    x, w, bias, stride, padding, *_ = job.args
    assert stride == ("list", (("value", 1), ("value", 1)))
    assert x == ("tensor", (5, 4, 8, 8), (256, 1, 32, 4), "float32")  # symbols evaluated, channels-last kept
    assert w == ("tensor", (6, 4, 3, 3), (36, 9, 3, 1), "float32")
    assert bias == ("value", None) and padding == ("list", (("value", 1), ("value", 1)))
    # x spans 5 * 256 floats, w 216, the output 5 * 384
    assert job.nbytes == 4 * (5 * 256 + 216 + 5 * 384)
    # the conv by the constant `c` (not a buffer) and the mm are not warmed up
    assert library_warmup.jobs(P.conv_program("cpu"), {"s0": 5}) == [job]


def test_a_job_over_the_byte_limit_is_left_out(monkeypatch):
    (job,) = library_warmup.jobs(P.conv_program("cpu"), {"s0": 5})
    monkeypatch.setattr(library_warmup, "MAX_BYTES", job.nbytes - 1)
    assert library_warmup.jobs(P.conv_program("cpu"), {"s0": 5}) == []


def test_run_calls_each_job_on_tensors_of_its_sizes_strides_and_dtype(monkeypatch):
    work = library_warmup.jobs(P.conv_program("cpu"), {"s0": 3})
    assert library_warmup.run(work, torch.device("cpu")) == 1  # a real convolution, on the CPU
    seen = []
    monkeypatch.setattr(library_warmup, "resolve_op", lambda op: lambda *a: seen.append((op, a)))
    library_warmup.run(work, torch.device("cpu"))
    ((op, (x, w, bias, stride, padding, dilation, transposed, out_pad, groups)),) = seen
    assert stride == dilation == [1, 1] and out_pad == [0, 0]
    assert op == CONV and x.shape == (3, 4, 8, 8) and x.stride() == (256, 1, 32, 4)
    assert x.is_contiguous(memory_format=torch.channels_last) and w.dtype == torch.float32
    assert bias is None and padding == [1, 1] and transposed is False and groups == 1


def test_the_setting_is_on_by_default_and_read_from_the_environment():
    assert rconfig.from_environment({}).library_warmup is True
    assert rconfig.from_environment({"TORCHFUSE_LIBRARY_WARMUP": "0"}).library_warmup is False


def test_background_busy_counts_work_queued_or_running():
    """`background.busy`, which keeps the warm-up from starting beside a backward's compiles."""
    import threading

    from torchfuse.runtime import background

    background.wait_for_background()
    assert not background.busy()
    release = threading.Event()
    first, second = background.submit(release.wait), background.submit(lambda: None)
    assert background.busy()  # one running, one queued
    release.set()
    first.result(), second.result()
    background.wait_for_background()
    assert not background.busy()


def test_a_cpu_program_starts_no_warmup_even_when_asked(monkeypatch):
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, library_warmup=True))
    started = []
    monkeypatch.setattr(library_warmup, "start", lambda *a: started.append(a) or 1)
    program = msgspec.structs.replace(P.conv_program("cpu"), steps=P.conv_program("cpu").steps[:2] + P.conv_program("cpu").steps[3:])
    fn = load(program, device="cpu")
    x = torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last)
    w, m = torch.randn(6, 4, 3, 3), torch.randn(3, 3)
    y0, y1, mm = fn(x, w, m)
    torch.testing.assert_close(y0, F.conv2d(x, w, padding=1))
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(mm, m @ m)
    assert started == [] and fn.stats.library_warmups == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_jobs_keep_the_buffer_dtype(dtype):
    program = P.conv_program("cpu")
    program = msgspec.structs.replace(program, buffers=tuple(
        msgspec.structs.replace(b, dtype=dtype) if b.name in ("x", "w", "y0") else b for b in program.buffers))
    (job,) = library_warmup.jobs(program, {"s0": 1})
    assert job.args[0][3] == dtype and job.nbytes == 2 * (256 + 216 + 384)
