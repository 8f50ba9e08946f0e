"""Converting between torch objects and format records: op names, dtypes, arguments, metadata.

Shared by the interpreter, the tracer and every package that turns a Graph back into torch
calls, so that there is exactly one spelling of each conversion.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S


class UnknownOpError(LookupError):
    """An op name that does not resolve to a registered operator torchfuse may call: not
    registered with torch (is its library imported?), malformed, or refused (see
    `resolve_op`)."""


_DTYPES: dict[str, torch.dtype] = {
    **{k: v for k, v in vars(torch).items() if isinstance(v, torch.dtype) and not k.startswith("_")},
    **{str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)},
}
_LAYOUTS: dict[str, torch.layout] = {
    k: v for k, v in vars(torch).items() if isinstance(v, torch.layout) and not k.startswith("_")}
_MEMORY_FORMATS: dict[str, torch.memory_format] = {
    k: v for k, v in vars(torch).items() if isinstance(v, torch.memory_format) and not k.startswith("_")}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    """``torch.float32`` for ``"float32"``; only real dtype names (never another attribute)."""
    dt = _DTYPES.get(name) if isinstance(name, str) else None
    if dt is None:
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def to_layout(name: str) -> torch.layout:
    """``torch.strided`` for ``"strided"``; only real layout names."""
    layout = _LAYOUTS.get(name) if isinstance(name, str) else None
    if layout is None:
        raise ValueError(f"unknown layout {name!r} (expected one of {sorted(_LAYOUTS)})")
    return layout


def to_memory_format(name: str) -> torch.memory_format:
    """``torch.contiguous_format`` for ``"contiguous_format"``; only real memory format names."""
    fmt = _MEMORY_FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(f"unknown memory format {name!r} (expected one of {sorted(_MEMORY_FORMATS)})")
    return fmt


def device_name(device: torch.device | str) -> str:
    return str(torch.device(device))


def op_name(op: torch._ops.OpOverload) -> str:
    """``aten.add.Tensor`` for ``torch.ops.aten.add.Tensor``."""
    ns, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    return f"{ns}.{name}.{overload or 'default'}"


_OP_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# attributes of torch.ops (and of its namespaces and packets) that are not operators
_NOT_OPERATORS = frozenset({
    "import_module", "load_library", "loaded_libraries", "higher_order", "name", "op", "overloads",
    "op_overloads"}) | frozenset(dir(type(torch.ops)))

INTERNAL_NAMESPACES: frozenset[str] = frozenset({
    "debugprims", "debug_mode_ops", "export", "inductor", "inductor_prims", "prim", "profiler",
    "static_runtime", "symm_mem", "_test"})
"""torch's own op namespaces that hold debugging, profiling and compiler-internal ops, never
operators of a program: `resolve_op` refuses them."""

DENIED_OPS: frozenset[str] = frozenset({
    "aten.from_file.default", "aten.from_file.out", "aten.save.default"})
"""ATen ops that read or write files named by their arguments: a graph from an archive could
use them to read or overwrite any file the process can, so `resolve_op` refuses them."""

_resolved: dict[str, torch._ops.OpOverload] = {}


def split_op_name(name: str) -> tuple[str, str, str]:
    """``("aten", "add", "Tensor")`` for ``"aten.add.Tensor"``, checking the spelling: three
    identifiers; the namespace and overload no dunder, the namespace not an attribute of
    ``torch.ops`` that is not an op namespace (``load_library``, ``import_module``); the name
    a dunder only for an op the dispatcher has (``aten.__lshift__.Scalar``). What
    `resolve_op` and the printer (which writes ``torch.ops.<name>``) require of every
    op name."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_OP_PART.fullmatch(p) for p in parts) or (
            parts[0].startswith("__") or parts[2].startswith("_")):
        raise UnknownOpError(
            f"op {name!r} is not spelled namespace.name.overload (three identifiers, no dunder)")
    ns, opname, overload = parts
    if ns in _NOT_OPERATORS or opname in _NOT_OPERATORS or overload in _NOT_OPERATORS:
        raise UnknownOpError(f"op {name!r} does not name an operator")
    if opname.startswith("__") and not _registered(ns, opname, overload):
        raise UnknownOpError(f"op {name!r} does not name an operator")
    return ns, opname, overload


def _registered(ns: str, opname: str, overload: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{ns}::{opname}", "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True


def resolve_op(name: str) -> torch._ops.OpOverload:
    """``torch.ops.aten.add.Tensor`` for ``"aten.add.Tensor"``: the one way every package turns
    an op name from a Graph or Program into something it calls.

    Only real operators come back: the name is checked by `split_op_name`; its namespace
    must not be one of `INTERNAL_NAMESPACES`, nor the op one of `DENIED_OPS`; the
    dispatcher must already know the op (nothing is imported or loaded to find it, so a custom
    op resolves once its library was imported by the caller); and the object found must be an
    ``OpOverload`` of exactly that name. Anything else raises `UnknownOpError`.
    """
    op = _resolved.get(name)
    if op is not None:
        return op
    ns, opname, overload = split_op_name(name)
    if ns in INTERNAL_NAMESPACES:
        raise UnknownOpError(f"op {name!r}: namespace {ns!r} holds torch-internal ops, not program operators")
    if name in DENIED_OPS:
        raise UnknownOpError(f"op {name!r} reads or writes files; torchfuse never calls it")
    qualified = f"{ns}::{opname}"
    if not _registered(ns, opname, overload):
        raise UnknownOpError(f"op {name!r} is not registered with torch")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    except (AttributeError, RuntimeError) as e:
        raise UnknownOpError(f"op {name!r} is not registered with torch") from e
    want = qualified if overload == "default" else f"{qualified}.{overload}"
    if not isinstance(op, torch._ops.OpOverload) or op.name() != want:
        raise UnknownOpError(f"op {name!r} does not resolve to an operator")
    _resolved[name] = op
    return op


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
        return to_layout(arg.name)
    if isinstance(arg, S.MemoryFormatArg):
        return to_memory_format(arg.name)
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
