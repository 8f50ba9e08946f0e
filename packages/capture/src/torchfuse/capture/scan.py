"""``associative_scan(combine_fn, xs, dim, reverse=False, combine_mode=...)`` (torch's
higher-order op in ``torch._higher_order_ops.associative_scan``), as capture meets it.

Libraries call it only while a compiler traces them: transformers' Mamba-family models take
their parallel scan when ``is_torchdynamo_compiling()`` holds, as it does under capture, and
their step-by-step loop otherwise. Called on fakes, torch would run the Python ``combine_fn``
behind capture's back, so the call was a graph break in every layer.

Capture writes the scan into the graph itself, from ``combine_fn`` interpreted like any
function: ``⌈log2 n⌉`` rounds over the whole scanned length ``n`` (Hillis and Steele's
inclusive scan). Round ``k`` combines each element with the partial result ``2**k`` before
it, ``combine_fn(earlier, later)``, and keeps the first ``2**k`` as they are. For an
associative ``combine_fn`` (the op's contract) this is the inclusive scan; the rounding of
floating-point results may differ from torch's eager order in the last bits, as any two
scan orders do. ``reverse`` scans the flipped inputs and flips the results back, as torch
does. The ops are ordinary graph ops, so autograd differentiates them.

What capture leaves to Python (a break, where torch's own checks raise what they raise): a
``dim``, ``reverse`` or ``combine_mode`` that is not a constant, or not one torch accepts;
``combine_mode="pointwise"`` on tensors not on CUDA or XPU (torch raises); ``xs`` that is
not a tensor or a flat tuple or list of them; leaves of different lengths along ``dim``, or
of length 0; a ``combine_fn`` whose results differ in number, shape or dtype from its
inputs. The scanned length is specialized (a guard): the number of rounds depends on it.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.custom_function import Interpreter
from torchfuse.capture.dynamic import concrete
from torchfuse.capture.errors import Unsupported

_MODULE = "torch._higher_order_ops.associative_scan"


def is_scan(value: Any) -> bool:
    """Whether ``value`` is torch's ``associative_scan`` (known by its home, not imported:
    the module pulls in compiler code)."""
    return getattr(value, "__module__", None) == _MODULE and \
        getattr(value, "__name__", None) == "associative_scan"


def apply(value: Any, args: list[V.Var], kwargs: dict[str, V.Var], interp: Interpreter) -> V.Var | None:
    """The scan's result Var when ``value`` is ``associative_scan`` (None when it is not)."""
    if not is_scan(value):
        return None
    ctx = current()
    try:
        bound = _signature(value).bind(*args, **kwargs)
    except TypeError:
        raise Unsupported("associative_scan with arguments it does not take", ctx.loc) from None
    combine, xs = bound.arguments["combine_fn"], bound.arguments["xs"]
    dim, reverse, mode = (_constant(bound.arguments.get(k), d) for k, d in
                          (("dim", None), ("reverse", False), ("combine_mode", "pointwise")))
    leaves = xs.items if type(xs) is V.ListVar else [xs]
    fakes = [v.fake for v in leaves if isinstance(v, V.TensorVar)]
    if not leaves or len(fakes) != len(leaves) or type(dim) is not int or type(reverse) is not bool or \
            mode not in ("pointwise", "generic"):
        raise Unsupported("associative_scan with arguments capture does not model", ctx.loc)
    if mode == "pointwise" and any(f.device.type not in ("cuda", "xpu") for f in fakes):
        raise Unsupported("associative_scan(combine_mode='pointwise') on tensors not on CUDA or XPU",
                          ctx.loc)
    if any(not -f.dim() <= dim < f.dim() for f in fakes):
        raise Unsupported("associative_scan over a dimension its inputs do not have", ctx.loc)
    lengths = {concrete(f.shape[dim]) for f in fakes}
    if len(lengths) != 1 or 0 in lengths:
        raise Unsupported("associative_scan over inputs of different or zero lengths", ctx.loc)
    n = lengths.pop()

    def torch_op(fn: Any, *a: Any, **kw: Any) -> V.Var:
        wrap = [x if isinstance(x, V.Var) else V.ConstVar(x) for x in a]
        return interp.call(ctx.wrap(fn, None), wrap, {k: V.ConstVar(v) for k, v in kw.items()})

    def pack(items: list[V.Var]) -> V.Var:
        return V.ListVar(items, xs.kind) if type(xs) is V.ListVar else items[0]

    cur = [torch_op(torch.flip, v, [dim]) for v in leaves] if reverse else list(leaves)
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        step = 2 ** k
        earlier = [torch_op(torch.narrow, v, dim, 0, n - step) for v in cur]
        later = [torch_op(torch.narrow, v, dim, step, n - step) for v in cur]
        out = interp.call(combine, [pack(earlier), pack(later)], {})
        combined = out.items if type(out) is V.ListVar else [out]
        if len(combined) != len(cur) or not all(
                isinstance(c, V.TensorVar) and c.fake.shape == e.fake.shape and c.fake.dtype == e.fake.dtype
                for c, e in zip(combined, later, strict=False)):
            raise Unsupported("associative_scan's combine_fn returns results unlike its inputs", ctx.loc)
        cur = [torch_op(torch.cat, V.ListVar([torch_op(torch.narrow, v, dim, 0, step), c], list), dim)
               for v, c in zip(cur, combined, strict=True)]
    if reverse:
        cur = [torch_op(torch.flip, v, [dim]) for v in cur]
    elif n == 1:  # torch hands back new tensors, never the inputs themselves
        cur = [torch_op(torch.clone, v) for v in cur]
    return pack(cur)


def _constant(var: V.Var | None, default: Any) -> Any:
    if var is None:
        return default
    return var.python() if isinstance(var, V.ConstVar) else _NOT_CONSTANT  # guarded


_NOT_CONSTANT = object()


@functools.cache
def _signature(value: Any) -> inspect.Signature:
    return inspect.signature(value)
