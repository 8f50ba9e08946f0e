"""The torchfuse format: typed, immutable records for Graph and Program.

Every package of torchfuse reads and writes these records and nothing else. They are
``msgspec.Struct`` classes: frozen (edit with `msgspec.structs.replace`), typed when
decoded, tagged where a field holds one of several kinds, and turned into JSON Schema by
``torchfuse.graph.versioning``.

Expressions (sizes, strides, offsets, grids, guard relations) are plain strings in a small
grammar documented in [`torchfuse.graph.expr`][torchfuse.graph.expr], or plain ``int`` when they are constant,
so that a reader needs no sympy to load a file.

Adding a field *with a default* is a minor version bump; removing or re-typing a field is a
major bump (see ``docs/format.md``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

Expr = int | str
"""A size, stride or offset: a constant ``int`` or an expression string such as ``"s0*4"``."""

_FROZEN = {"frozen": True, "kw_only": True, "forbid_unknown_fields": False}


# ----------------------------------------------------------------------------- locations


class SourceLoc(msgspec.Struct, **_FROZEN):
    """Where in the user's code something came from."""

    file: str
    line: int
    col: int | None = None
    function: str | None = None
    text: str | None = None
    """The source line itself, stripped, when it was available at capture time."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        if self.function:
            where += f" in {self.function}"
        return where


# ----------------------------------------------------------------------------- tensor metadata


class TensorMeta(msgspec.Struct, **_FROZEN):
    """Metadata of one tensor value: what a meta tensor knows, with symbolic sizes."""

    dtype: str
    """A torch dtype name without the ``torch.`` prefix: ``float32``, ``bfloat16``, ``int64`` …"""
    sizes: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    storage_offset: Expr = 0
    device: str = "cpu"
    """``cpu``, ``cuda``, ``cuda:1`` …"""
    requires_grad: bool = False


class Symbol(msgspec.Struct, **_FROZEN):
    """A size symbol (``s0``, ``s1`` …) with its inclusive range and the value seen first."""

    name: str
    min: int = 0
    max: int | None = None
    """``None`` means unbounded."""
    hint: int | None = None
    """The value seen when the graph was captured; used to choose kernel strategies."""
    source: str | None = None
    """Where the value comes from, e.g. ``input:0.size(1)``."""


# ----------------------------------------------------------------------------- node arguments


class TensorRef(msgspec.Struct, tag="tensor", **_FROZEN):
    """A reference to a value in the graph's value table."""

    name: str


class SymRef(msgspec.Struct, tag="sym", **_FROZEN):
    """A symbolic integer expression (``"s0*2"``)."""

    expr: str


class Int(msgspec.Struct, tag="int", **_FROZEN):
    value: int


class Float(msgspec.Struct, tag="float", **_FROZEN):
    """A float; non-finite values are written ``"inf"``, ``"-inf"`` or ``"nan"`` (JSON has none)."""

    value: float | Literal["inf", "-inf", "nan"]


class Bool(msgspec.Struct, tag="bool", **_FROZEN):
    value: bool


class Str(msgspec.Struct, tag="str", **_FROZEN):
    value: str


class NoneArg(msgspec.Struct, tag="none", **_FROZEN):
    pass


class DtypeArg(msgspec.Struct, tag="dtype", **_FROZEN):
    name: str


class DeviceArg(msgspec.Struct, tag="device", **_FROZEN):
    name: str


class LayoutArg(msgspec.Struct, tag="layout", **_FROZEN):
    name: str


class MemoryFormatArg(msgspec.Struct, tag="memory_format", **_FROZEN):
    name: str


class ListArg(msgspec.Struct, tag="list", **_FROZEN):
    items: tuple[Argument, ...]


class SubgraphRef(msgspec.Struct, tag="subgraph", **_FROZEN):
    """A reference to another Graph document in the same archive (for control-flow ops)."""

    name: str


Argument = (
    TensorRef
    | SymRef
    | Int
    | Float
    | Bool
    | Str
    | NoneArg
    | DtypeArg
    | DeviceArg
    | LayoutArg
    | MemoryFormatArg
    | ListArg
    | SubgraphRef
)


# ----------------------------------------------------------------------------- graph


InputKind = Literal["user_input", "parameter", "buffer", "constant", "tangent"]
OutputKind = Literal["user_output", "loss", "gradient", "mutated_input", "saved_value"]


class GraphInput(msgspec.Struct, **_FROZEN):
    """One input of a Graph: a user input, a parameter, buffer or constant, or a tangent."""

    name: str
    """The value name (key in ``Graph.values``)."""
    kind: InputKind = "user_input"
    target: str | None = None
    """For parameters, buffers and constants: the fully qualified name (``layers.0.weight``)."""


class GraphOutput(msgspec.Struct, **_FROZEN):
    """One output of a Graph and its role: user output, loss, gradient, mutated input or saved value."""

    value: Argument
    """Usually a `TensorRef`; a `SymRef` or scalar for non-tensor outputs."""
    kind: OutputKind = "user_output"
    target: str | None = None
    """For ``mutated_input``: the input name whose new value this is; for ``gradient``: the
    input name it is the gradient of."""
    aliases_input: str | None = None
    """Set when this output is a view of (or is) an input."""


class Node(msgspec.Struct, **_FROZEN):
    """One operator call.

    ``op`` is ``namespace.name.overload`` (``aten.add.Tensor``, ``aten.sum.dim_IntList``);
    an op without an overload name uses ``default``. ``args`` are positional in schema order;
    ``kwargs`` hold keyword-only arguments. ``outputs`` name the values it defines, in the
    order the op returns them; an output that the op returns as ``None`` is ``""``.
    """

    name: str
    op: str
    args: tuple[Argument, ...] = ()
    kwargs: dict[str, Argument] = {}
    outputs: tuple[str, ...] = ()
    loc: SourceLoc | None = None
    module_path: str | None = None


# ----------------------------------------------------------------------------- guards


class TensorGuard(msgspec.Struct, tag="tensor_match", **_FROZEN):
    """dtype, device, requires_grad, and sizes/strides (``None`` entries are not checked)."""

    source: str
    dtype: str
    device: str
    sizes: tuple[Expr | None, ...]
    strides: tuple[Expr | None, ...] | None = None
    requires_grad: bool = False
    loc: SourceLoc | None = None


class ConstantGuard(msgspec.Struct, tag="constant", **_FROZEN):
    """``source == value``; ``value`` is the Python ``repr`` of a literal."""

    source: str
    value: str
    loc: SourceLoc | None = None


class TypeGuard(msgspec.Struct, tag="type", **_FROZEN):
    """``type(source)`` is the named class (``module.qualname``)."""

    source: str
    type_name: str
    loc: SourceLoc | None = None


class IdentityGuard(msgspec.Struct, tag="identity", **_FROZEN):
    """``source is`` the object seen at capture (checked by ``id`` in memory; the description
    is what a reader sees)."""

    source: str
    description: str
    loc: SourceLoc | None = None


class LengthGuard(msgspec.Struct, tag="length", **_FROZEN):
    source: str
    length: int
    loc: SourceLoc | None = None


class GlobalStateGuard(msgspec.Struct, tag="global_state", **_FROZEN):
    """Process state such as ``grad_enabled`` or ``autocast_cuda``."""

    name: str
    value: str
    loc: SourceLoc | None = None


class SymbolGuard(msgspec.Struct, tag="symbol", **_FROZEN):
    """A relation over size symbols that must hold, e.g. ``"s0 == s1"`` or ``"s0 % 8 == 0"``,
    or a range ``"2 <= s0"``."""

    expr: str
    loc: SourceLoc | None = None


Guard = (
    TensorGuard
    | ConstantGuard
    | TypeGuard
    | IdentityGuard
    | LengthGuard
    | GlobalStateGuard
    | SymbolGuard
)


class Graph(msgspec.Struct, **_FROZEN):
    """A functional or non-functional dataflow graph of ATen-level operator calls."""

    name: str = "graph"
    inputs: tuple[GraphInput, ...] = ()
    outputs: tuple[GraphOutput, ...] = ()
    nodes: tuple[Node, ...] = ()
    values: dict[str, TensorMeta] = {}
    symbols: tuple[Symbol, ...] = ()
    guards: tuple[Guard, ...] = ()
    opsets: dict[str, int] = {}
    meta: dict[str, str] = {}
    """Free-form annotations (producer notes, pytree specs as JSON strings, …)."""


# ----------------------------------------------------------------------------- program


class Buffer(msgspec.Struct, **_FROZEN):
    """A tensor a Program allocates: dtype, sizes and strides (symbolic expressions), device."""

    name: str
    dtype: str
    sizes: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    device: str = "cuda"
    storage_offset: Expr = 0


class KernelParam(msgspec.Struct, **_FROZEN):
    """One runtime argument of a kernel: a pointer (with its element dtype) or a scalar."""

    name: str
    kind: Literal["ptr", "i32", "i64", "fp32"]
    dtype: str | None = None


class LaunchConfig(msgspec.Struct, **_FROZEN):
    """One candidate: the constexpr block sizes plus warps and stages."""

    meta: dict[str, int] = {}
    num_warps: int = 4
    num_stages: int = 1


class Kernel(msgspec.Struct, **_FROZEN):
    """A kernel of a Program: its source module, signature, constexprs, candidate launch
    configs and grid."""

    name: str
    source: str
    """A complete Python module defining the kernel (with its imports)."""
    entry: str = ""
    """The function name inside ``source``; defaults to ``name``."""
    language: Literal["triton", "cpp"] = "triton"
    """``triton``: ``source`` is a Python module of ``@triton.jit`` functions. ``cpp`` (format
    1.1): ``source`` is C++ defining ``extern "C" void <entry>(...)``, its parameters the
    signature's pointers and 64-bit integers; a Program's C++ kernels are compiled together
    into one shared object, and running them needs ``trust_code=True`` (C++ cannot be
    validated like a Triton source)."""
    signature: tuple[KernelParam, ...] = ()
    constexprs: dict[str, int | float | bool | str] = {}
    configs: tuple[LaunchConfig, ...] = ()
    grid: tuple[Expr, ...] = ()
    """Grid expressions; may use size symbols and the names in a config's ``meta``."""
    meta: dict[str, str] = {}


class AllocStep(msgspec.Struct, tag="alloc", **_FROZEN):
    buffer: str
    reuse: str | None = None
    """Storage of a freed buffer of the same byte size that this one may take over."""


class LaunchStep(msgspec.Struct, tag="launch", **_FROZEN):
    kernel: str
    args: tuple[Argument, ...]
    """Pointers as `TensorRef` to buffers or inputs; scalars as `SymRef`/literals."""
    grid: tuple[Expr, ...] = ()
    """Overrides ``Kernel.grid`` when non-empty."""


class ExternStep(msgspec.Struct, tag="extern", **_FROZEN):
    """Call an ATen (or custom) op; outputs become new buffers named ``outputs``."""

    op: str
    args: tuple[Argument, ...] = ()
    kwargs: dict[str, Argument] = {}
    outputs: tuple[str, ...] = ()


class ViewStep(msgspec.Struct, tag="view", **_FROZEN):
    """``output = base.as_strided(sizes, strides, storage_offset)``."""

    output: str
    base: str
    sizes: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    storage_offset: Expr = 0


class FreeStep(msgspec.Struct, tag="free", **_FROZEN):
    buffer: str


class CopyStep(msgspec.Struct, tag="copy", **_FROZEN):
    """``dst.copy_(src)``: writes a mutated input back."""

    dst: str
    src: str


Step = AllocStep | LaunchStep | ExternStep | ViewStep | FreeStep | CopyStep


class Program(msgspec.Struct, **_FROZEN):
    """A launch plan: kernels, buffers, and the steps that run them."""

    name: str = "program"
    inputs: tuple[str, ...] = ()
    """Buffer names bound to the call's positional inputs, in order."""
    outputs: tuple[Argument, ...] = ()
    """What the call returns: buffer refs (``TensorRef``) or scalars."""
    buffers: tuple[Buffer, ...] = ()
    """Every buffer, inputs included: inputs' entries are what the Program expects."""
    kernels: tuple[Kernel, ...] = ()
    steps: tuple[Step, ...] = ()
    symbols: tuple[Symbol, ...] = ()
    """Size symbols; each ``source`` is ``input:<i>.size(<d>)`` so the runtime can bind it."""
    device: str = "cuda"
    """The device type the Program was compiled for."""
    opsets: dict[str, int] = {}
    meta: dict[str, str] = {}

