"""The ``torchfuse.triton_kernel`` op on its own: description, eager launch, metadata, grad."""

from __future__ import annotations

import pytest
import torch
from torchfuse.graph import user_kernels as U
from torchfuse.graph.tracing import FakeTensor

SOURCE = '''import triton
import triton.language as tl


@triton.jit
def axpy(x_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + y, mask=mask)
'''


def description(n: int = 10, a: float = 2.0) -> str:
    return U.dumps({
        "source": SOURCE, "entry": "axpy", "grid": [2], "num_warps": 4, "num_stages": 3,
        "args": [{"name": "x_ptr", "tensor": 0}, {"name": "out_ptr", "tensor": 1},
                 {"name": "n", "value": n}, {"name": "a", "value": a},
                 {"name": "BLOCK", "constexpr": 8}],
    })


def test_description_is_canonical_and_versioned():
    text = description()
    assert text == U.dumps(U.loads(text))
    reordered = dict(reversed(list(U.loads(text).items())))
    assert U.dumps(reordered) == text  # key order does not matter: one text per kernel
    assert text.startswith('{"args":[{"name":"x_ptr","tensor":0},') and text.endswith('"version":1}')
    with pytest.raises(U.UserKernelError, match="newer"):
        U.loads(text.replace('"version":1', '"version":99'))
    with pytest.raises(U.UserKernelError, match="lacks"):
        U.loads('{"version":1}')


def test_eager_launch_is_functional():
    x, y = torch.randn(10), torch.randn(10)
    y_before = y.clone()
    (out,) = torch.ops.torchfuse.triton_kernel.default(description(), [x, y], [1])
    torch.testing.assert_close(out, 2.0 * x + y_before)
    torch.testing.assert_close(y, y_before)  # the input is not written: the op returns a copy
    assert out.data_ptr() != y.data_ptr()


def test_meta_keeps_the_strides_of_what_is_written():
    y = torch.empty(4, 3).t()  # non-contiguous
    fake = FakeTensor.like(y)
    (out,) = torch.ops.torchfuse.triton_kernel.default(description(12), [FakeTensor.like(y), fake], [1])
    assert out.shape == y.shape and out.stride() == y.stride()


def test_outputs_never_require_grad():
    x = torch.randn(10, requires_grad=True)
    y = torch.randn(10, requires_grad=True)
    (out,) = torch.ops.torchfuse.triton_kernel.default(description(), [x, y], [1])
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, 2.0 * x.detach() + y.detach())


def test_a_source_that_fails_to_import_is_reported():
    bad = U.dumps({"source": "import triton\nthis is not python\n", "entry": "k", "grid": [1], "args": []})
    with pytest.raises(U.UserKernelError, match="failed to import"):
        torch.ops.torchfuse.triton_kernel.default(bad, [], [])
