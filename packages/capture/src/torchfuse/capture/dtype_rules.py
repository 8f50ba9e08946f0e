"""Dtype rules eager enforces and meta kernels do not: capture checks them before recording.

Capture runs every op on fake tensors, i.e. on torch's meta kernels. Those compute result
dtypes but skip some of the checks the CPU/CUDA kernels make: ``int64 - bool``,
``float & int``, ``int_tensor.mul_(1.5)`` and friends go through a meta kernel and would be
compiled, where eager raises. Each rule here raises (a ``RuntimeError`` naming eager's
message); capture turns that into a graph break, and the code then runs in Python, where
eager raises its own error, of its own type, at the user's line::

    def f(a, b):          # a: int64, b: bool
        return a - b      # eager and compiled: RuntimeError: Subtraction, the `-` operator ...

The table is keyed by the op's overload packet (``aten.sub`` covers ``sub.Tensor``,
``sub.Scalar``, ``sub_.Tensor`` is ``aten.sub_``); each rule sees the op and its arguments
(meta or fake tensors, Python scalars).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture.known import KnownRecorder

Rule = Callable[[Any, tuple, dict], None]


class EagerRejects(RuntimeError):
    """An op eager would reject for its dtypes (the message is eager's)."""


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, list | tuple):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _operands(args: tuple) -> list[Any]:
    return [a for a in args[:2] if isinstance(a, torch.Tensor | bool | int | float | complex)]


def _is_bool(a: Any) -> bool:
    return a.dtype is torch.bool if isinstance(a, torch.Tensor) else isinstance(a, bool)


def _is_inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _no_bool_subtraction(op: Any, args: tuple, kwargs: dict) -> None:
    if any(_is_bool(a) for a in _operands(args)):
        raise EagerRejects("Subtraction, the `-` operator, with a bool tensor is not supported. If "
                           "you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")


def _alpha(op: Any, args: tuple, kwargs: dict) -> None:
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else None)
    ts = [a for a in _operands(args) if isinstance(a, torch.Tensor)]
    if isinstance(alpha, bool) and ts and not all(t.dtype is torch.bool for t in ts):
        raise EagerRejects("Boolean alpha only supported for Boolean results.")


def _integral_only(what: str) -> Rule:
    def rule(op: Any, args: tuple, kwargs: dict) -> None:
        for t in _tensors(args, kwargs):
            if _is_inexact(t.dtype):
                raise EagerRejects(f"\"{what}\" not implemented for '{_name(t.dtype)}'")
    return rule


def _not_for(what: str, predicate: Callable[[torch.dtype], bool]) -> Rule:
    def rule(op: Any, args: tuple, kwargs: dict) -> None:
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is not None and predicate(t.dtype):
            raise EagerRejects(f"\"{what}\" not implemented for '{_name(t.dtype)}'")
    return rule


def _same_dtype(what: str) -> Rule:
    def rule(op: Any, args: tuple, kwargs: dict) -> None:
        ts = [t for t in _tensors(args, kwargs) if t.dim() >= 1]
        if len({t.dtype for t in ts}) > 1:
            raise EagerRejects(f"{what}: expected both operands to have the same dtype, but got: "
                               f"{', '.join(_name(t.dtype) for t in ts)}")
    return rule


def _index_put(op: Any, args: tuple, kwargs: dict) -> None:
    self_, values = args[0], args[2] if len(args) > 2 else kwargs.get("values")
    if isinstance(values, torch.Tensor) and values.dtype is not self_.dtype:
        raise EagerRejects("Index put requires the source and destination dtypes match, got "
                           f"{_name(self_.dtype)} for the destination and {_name(values.dtype)} "
                           "for the source.")


def _negative_int_power(op: Any, args: tuple, kwargs: dict) -> None:
    base, exp = args[0], args[1] if len(args) > 1 else None
    if isinstance(base, torch.Tensor) and not _is_inexact(base.dtype) and base.dtype is not torch.bool \
            and isinstance(exp, int) and not isinstance(exp, bool) and exp < 0:
        raise EagerRejects("Integers to negative integer powers are not allowed.")


def _castable_in_place(op: Any, args: tuple, kwargs: dict) -> None:
    """``self.op_(other)``: eager computes in the promoted dtype and must cast it back."""
    self_ = args[0]
    others = [a for a in args[1:2] if isinstance(a, torch.Tensor | bool | int | float | complex)]
    if not isinstance(self_, torch.Tensor) or not others:
        return
    result = torch.result_type(self_, others[0])
    if not torch.can_cast(result, self_.dtype):
        raise EagerRejects(f"result type {_name(result)} can't be cast to the desired output type "
                           f"{_name(self_.dtype)}")


def _name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool"}.get(dtype, str(dtype).removeprefix("torch."))


def _both(*rules: Rule) -> Rule:
    def rule(op: Any, args: tuple, kwargs: dict) -> None:
        for r in rules:
            r(op, args, kwargs)
    return rule


RULES: dict[str, Rule] = {
    "sub": _both(_no_bool_subtraction, _alpha), "sub_": _both(_no_bool_subtraction, _alpha),
    "rsub": _both(_no_bool_subtraction, _alpha),
    "add": _alpha, "add_": _both(_alpha, _castable_in_place),
    "mul_": _castable_in_place,
    "bitwise_and": _integral_only("bitwise_and"), "bitwise_and_": _integral_only("bitwise_and"),
    "bitwise_or": _integral_only("bitwise_or"), "bitwise_or_": _integral_only("bitwise_or"),
    "bitwise_xor": _integral_only("bitwise_xor"), "bitwise_xor_": _integral_only("bitwise_xor"),
    "__lshift__": _integral_only("lshift"), "__rshift__": _integral_only("rshift"),
    "bitwise_left_shift": _integral_only("lshift"), "bitwise_right_shift": _integral_only("rshift"),
    "gcd": _integral_only("gcd"), "lcm": _integral_only("lcm"),
    "remainder": _not_for("remainder", lambda d: d is torch.bool),
    "abs": _not_for("abs", lambda d: d is torch.bool),
    "lerp": _not_for("lerp", lambda d: not _is_inexact(d)),
    "_softmax": _not_for("softmax", lambda d: not _is_inexact(d)),
    "_log_softmax": _not_for("log_softmax", lambda d: not _is_inexact(d)),
    "mm": _same_dtype("mm"), "bmm": _same_dtype("bmm"), "addmm": _same_dtype("addmm"),
    "index_put": _index_put, "index_put_": _index_put, "_index_put_impl_": _index_put,
    "pow": _negative_int_power,
}


class CheckingRecorder(KnownRecorder):
    """The capture recorder: `RULES` first, then the op is recorded as usual (with the
    values of tensors made from constants alone computed beside the fakes, see
    `torchfuse.capture.known`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rule = RULES.get(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else None
        if rule is not None:
            rule(func, args, kwargs or {})
        return super().__torch_dispatch__(func, types, args, kwargs)
