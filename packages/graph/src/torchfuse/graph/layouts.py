"""Memory formats of fake tensors where torch's meta kernels and its device kernels disagree.

A Graph records the strides of every value, and the compiled code indexes buffers with them,
so they must be the strides eager's kernels produce. Torch's meta kernel of ``convolution``
returns a contiguous tensor whatever its inputs, while ATen's convolutions (cuDNN on CUDA,
oneDNN on the CPU) return a channels-last one when the input or the weight is channels-last::

    x: f32[2, 8, 5, 5] strides (200, 1, 40, 8)     (channels-last)
    convolution(x, w)   meta: (400, 25, 5, 1)    eager: (400, 1, 80, 16)

`restride` puts such outputs in eager's memory format; tracing (`torchfuse.graph.tracing`)
applies it to every op it runs on meta tensors, so capture, the joint graph and every retrace
agree with eager. Symbolic sizes or strides are left to the meta kernel.

It also holds the small layout arithmetic the stages share: `dense_strides`, `is_dense`,
`channels_last_strides`, and `storage_extent` (how much storage a view reaches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def dense_strides(sizes: Sequence[int], order: Sequence[int] | None = None) -> tuple[int, ...]:
    """Strides laying ``sizes`` out densely with the dims in ``order``, fastest first
    (None: the last dim fastest, i.e. contiguous)."""
    order = tuple(order) if order is not None else tuple(reversed(range(len(sizes))))
    strides, step = [0] * len(sizes), 1
    for d in order:
        strides[d] = step
        step *= max(int(sizes[d]), 1)
    return tuple(strides)


def is_dense(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a layout covers its storage exactly once, in some order of its dims (dims of
    size 0 or 1 ignored)."""
    step = 1
    for st, n in sorted((st, n) for n, st in zip(sizes, strides, strict=True) if n > 1):
        if st != step:
            return False
        step *= n
    return True


def storage_extent(sizes: Sequence[Any], strides: Sequence[Any], offset: Any = 0) -> Any:
    """Elements of storage a view reaches, counted from the storage's start: ``offset + 1 +
    sum((n - 1) * stride)``, or ``offset`` for an empty view (a size of 0 reaches no element,
    whatever its stride). Strides are non-negative, as everywhere in a Graph.

    Works on ints, ``SymInt``s and sympy expressions alike. A size that is not a concrete int
    is taken to be non-empty: size symbols are at least 2."""
    if any(_is_zero(n) for n in sizes):
        return offset
    return offset + 1 + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True))


def _is_zero(n: Any) -> bool:
    if isinstance(n, int):
        return n == 0
    return getattr(n, "is_zero", None) is True  # a sympy number; a symbol or SymInt is not zero


def channels_last_strides(sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Dense strides of a 4-d (channels-last) or 5-d (channels-last-3d) tensor with the
    channels (dim 1) fastest, or None for other ranks."""
    if len(sizes) not in (4, 5):
        return None
    return dense_strides(sizes, [1, *range(len(sizes) - 1, 1, -1), 0])  # C, W, H, (D,) N


def strides_like_channels_last(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a 4-d or 5-d layout is channels-last as ATen's ``suggest_memory_format`` sees
    it (c10's rule: the channels fastest, then the spatial dims from the last, then the
    batch; a tensor whose spatial dims are all 1 is contiguous, not channels-last)."""
    if len(sizes) not in (4, 5) or strides[1] == 0:
        return False
    least = 0
    for d in [1, *range(len(sizes) - 1, 1, -1), 0]:
        if sizes[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:
            return False
        least = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return True


def _concrete(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(x, int) for x in (*t.shape, *t.stride()))


def _is_channels_last(t: Any) -> bool:
    return _concrete(t) and strides_like_channels_last(tuple(t.shape), t.stride())


def _convolution(args: Sequence[Any], out: Any) -> tuple[int, ...] | None:
    """cuDNN's and oneDNN's rule: channels-last out when the input or the weight is."""
    x, w = args[0], args[1]
    if _concrete(out) and (_is_channels_last(x) or _is_channels_last(w)):
        return channels_last_strides(tuple(out.shape))
    return None


RULES: dict[str, Callable[[Sequence[Any], Any], tuple[int, ...] | None]] = {
    "aten.convolution.default": _convolution,
}
"""op -> rule(args, meta output) giving eager's strides for the output (None: the meta's)."""


def restride(name: str, args: Sequence[Any], out: Any) -> Any:
    """``out`` (a meta kernel's result for op ``name``) with eager's strides where `RULES`
    says they differ; ``out`` itself otherwise."""
    rule = RULES.get(name)
    if rule is None:
        return out
    strides = rule(args, out)
    if strides is None or tuple(out.stride()) == strides:
        return out
    return torch.empty_strided(tuple(out.shape), strides, dtype=out.dtype, device=out.device)
