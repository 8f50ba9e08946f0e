"""Converting between torch objects and format records: op names, dtypes, arguments, metadata.

Shared by the interpreter, the tracer and every package that turns a Graph back into torch
calls, so that there is exactly one spelling of each conversion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S


class UnknownOpError(LookupError):
    """An op name that is not registered with torch (is its library imported?)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def device_name(device: torch.device | str) -> str:
    return str(torch.device(device))


def op_name(op: torch._ops.OpOverload) -> str:
    """``aten.add.Tensor`` for ``torch.ops.aten.add.Tensor``."""
    ns, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    return f"{ns}.{name}.{overload or 'default'}"


def resolve_op(name: str) -> torch._ops.OpOverload:
    """``torch.ops.aten.add.Tensor`` for ``"aten.add.Tensor"``."""
    try:
        ns, opname, overload = name.split(".")
        return getattr(getattr(getattr(torch.ops, ns), opname), overload)
    except (ValueError, AttributeError, RuntimeError) as e:
        raise UnknownOpError(f"op {name!r} is not registered with torch") from e


def meta_of(t: torch.Tensor, *, device: str | None = None) -> S.TensorMeta:
    """Format metadata of a (real, meta or fake) tensor."""
    return S.TensorMeta(
        dtype=dtype_name(t.dtype),
        sizes=tuple(_size(s) for s in t.shape),
        strides=tuple(_size(s) for s in t.stride()),
        storage_offset=_size(t.storage_offset()),
        device=device or device_name(t.device),
        requires_grad=bool(t.requires_grad),
    )


def _size(s: Any) -> S.Expr:
    if isinstance(s, int):
        return s
    from torchfuse.graph.symbolic import size_text

    return size_text(s)


def encode_arg(value: Any, tensor_name: Callable[[torch.Tensor], str]) -> S.Argument:
    """A Python/torch value as a format argument; tensors are named by ``tensor_name``."""
    if isinstance(value, torch.Tensor):
        return S.TensorRef(name=tensor_name(value))
    if value is None:
        return S.NoneArg()
    if isinstance(value, bool):
        return S.Bool(value=value)
    if isinstance(value, int):
        return S.Int(value=value)
    if isinstance(value, float):
        if math.isfinite(value):
            return S.Float(value=value)
        return S.Float(value="nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        return S.Str(value=value)
    if isinstance(value, torch.dtype):
        return S.DtypeArg(name=dtype_name(value))
    if isinstance(value, torch.device):
        return S.DeviceArg(name=device_name(value))
    if isinstance(value, torch.layout):
        return S.LayoutArg(name=str(value).removeprefix("torch."))
    if isinstance(value, torch.memory_format):
        return S.MemoryFormatArg(name=str(value).removeprefix("torch."))
    if isinstance(value, list | tuple):
        return S.ListArg(items=tuple(encode_arg(v, tensor_name) for v in value))
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        from torchfuse.graph.symbolic import node_of

        node = node_of(value)
        if node is None:
            raise TypeError("symbolic torch scalars from another tracer are not part of the format")
        if isinstance(value, torch.SymInt):
            text = node.env.text(node.expr)
            return S.Int(value=text) if isinstance(text, int) else S.SymRef(expr=text)
        # the format has no float or bool expressions: the value specializes
        hint = node.guard_float() if isinstance(value, torch.SymFloat) else node.guard_bool()
        return encode_arg(hint, tensor_name)
    raise TypeError(f"cannot encode argument of type {type(value).__name__}: {value!r}")


def decode_arg(
    arg: S.Argument,
    env: Mapping[str, Any],
    symbols: Mapping[str, int] | None = None,
) -> Any:
    """A format argument as a Python/torch value; tensors looked up in ``env``."""
    from torchfuse.graph.expr import evaluate

    if isinstance(arg, S.TensorRef):
        return env[arg.name]
    if isinstance(arg, S.Int | S.Bool | S.Str):
        return arg.value
    if isinstance(arg, S.Float):
        return float(arg.value)
    if isinstance(arg, S.NoneArg):
        return None
    if isinstance(arg, S.ListArg):
        return [decode_arg(a, env, symbols) for a in arg.items]
    if isinstance(arg, S.SymRef):
        return evaluate(arg.expr, symbols or {})
    if isinstance(arg, S.DtypeArg):
        return to_dtype(arg.name)
    if isinstance(arg, S.DeviceArg):
        return torch.device(arg.name)
    if isinstance(arg, S.LayoutArg):
        return getattr(torch, arg.name)
    if isinstance(arg, S.MemoryFormatArg):
        return getattr(torch, arg.name)
    raise TypeError(f"cannot decode argument {arg!r}")


def flatten_result(result: Any) -> list[Any]:
    """An op's return value as a flat list (tuples and lists of tensors flattened)."""
    if isinstance(result, tuple | list):
        out: list[Any] = []
        for r in result:
            out.extend(r if isinstance(r, tuple | list) else [r])
        return out
    return [result]


def tensor_refs(args: Sequence[S.Argument]) -> list[str]:
    """Names of all tensors an argument list mentions, nested lists included."""
    out: list[str] = []
    for a in args:
        if isinstance(a, S.TensorRef):
            out.append(a.name)
        elif isinstance(a, S.ListArg):
            out.extend(tensor_refs(a.items))
    return out


def rename_arg(arg: S.Argument, rename: Mapping[str, str]) -> S.Argument:
    """``arg`` with the tensors it names (nested lists included) renamed by ``rename``."""
    if isinstance(arg, S.TensorRef) and arg.name in rename:
        return S.TensorRef(name=rename[arg.name])
    if isinstance(arg, S.ListArg):
        return S.ListArg(items=tuple(rename_arg(a, rename) for a in arg.items))
    return arg


def node_inputs(node: S.Node) -> list[str]:
    """Value names a node reads, in argument order."""
    return tensor_refs(list(node.args) + list(node.kwargs.values()))
