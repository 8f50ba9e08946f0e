"""Graphs and guards as readable, runnable Python.

`to_python` prints a Graph as a function with one line per node::

    import torch

    def f(x, y):
        # f.py:3 in f: return (x + y).relu()
        add = torch.ops.aten.add.Tensor(x, y)  # f32[4, 8]
        relu = torch.ops.aten.relu.default(add)  # f32[4, 8]
        return [relu]

Executing the text (with ``torch`` importable) defines a function that computes what
[`run`][torchfuse.graph.interpreter.run] computes. Size symbols are bound at the top from
their sources (``s0 = x.size(0)``), so symbolic arguments print as expressions over them.

`guard_to_python` prints one guard as a Python expression that evaluates to ``True``
when the guard holds; helpers it calls (``check_tensor``, ``check_type``) are defined here and
collected in `GUARD_HELPERS` for ``exec``.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import free_symbols
from torchfuse.graph.expr import to_python as expr_to_python
from torchfuse.graph.interpreter import num_saved
from torchfuse.graph.ops import UnknownOpError, split_op_name, to_dtype, to_layout, to_memory_format
from torchfuse.graph.verify import SYMBOL_SOURCE, VerificationError, is_identifier

_SHORT_DTYPES = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8",
    "complex64": "c64", "complex128": "c128",
}
_RESERVED = {"torch", "math", "_", "flatten_result", "subgraphs"}
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")  # ASCII only: NFKC would fold other letters onto ASCII


def comment_text(text: object) -> str:
    """``text`` as it may stand in a ``#`` comment: as it is when it is printable on one line,
    else its ``repr`` (so a newline from data never ends the comment and starts code)."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def describe_meta(meta: S.TensorMeta) -> str:
    """``f32[4, 8]``, with the device when it is not the CPU and strides when not contiguous."""
    text = f"{_SHORT_DTYPES.get(meta.dtype, meta.dtype)}[{', '.join(str(s) for s in meta.sizes)}]"
    if _contiguous_strides(meta.sizes) != tuple(meta.strides):
        text += f" strides=({', '.join(str(s) for s in meta.strides)})"
    if meta.storage_offset != 0:
        text += f" offset={meta.storage_offset}"
    if meta.device != "cpu":
        text += f" {meta.device}"
    return text


def _contiguous_strides(sizes: Sequence[S.Expr]) -> tuple[S.Expr, ...]:
    out: list[S.Expr] = []
    acc: S.Expr = 1
    for size in reversed(sizes):
        out.append(acc)
        if isinstance(acc, int) and isinstance(size, int):
            acc = acc * size
        else:
            acc = f"{_paren(size)}*{_paren(acc)}" if acc != 1 else str(size)
    return tuple(reversed(out))


def _paren(e: S.Expr) -> str:
    return str(e) if isinstance(e, int) or re.fullmatch(r"\w+", e) else f"({e})"


class _Names:
    """Python identifiers for value names (kept as they are when already valid)."""

    def __init__(self) -> None:
        self.map: dict[str, str] = {}
        self.taken: set[str] = set(_RESERVED)

    def __call__(self, name: str) -> str:
        if name not in self.map:
            base = _NOT_IDENT.sub("_", name) or "v"
            if base[0].isdigit() or keyword.iskeyword(base) or hasattr(builtins, base):
                base = "v_" + base
            ident, i = base, 0
            while ident in self.taken:
                i += 1
                ident = f"{base}_{i}"
            self.taken.add(ident)
            self.map[name] = ident
        return self.map[name]


def _arg(a: S.Argument, names: Callable[[str], str]) -> str:
    if isinstance(a, S.TensorRef):
        return names(a.name)
    if isinstance(a, S.SymRef):
        return expr_to_python(a.expr)
    if isinstance(a, S.Float):
        return f"float({a.value!r})" if isinstance(a.value, str) else repr(a.value)
    if isinstance(a, S.Int | S.Bool | S.Str):
        return repr(a.value)
    if isinstance(a, S.NoneArg):
        return "None"
    if isinstance(a, S.DtypeArg | S.LayoutArg | S.MemoryFormatArg):
        check = to_dtype if isinstance(a, S.DtypeArg) else (
            to_layout if isinstance(a, S.LayoutArg) else to_memory_format)
        try:
            check(a.name)  # only real names reach the text: never torch.<anything>
        except ValueError as e:
            raise VerificationError(f"cannot print argument {a!r}: {e}") from None
        return f"torch.{a.name}"
    if isinstance(a, S.DeviceArg):
        return f"torch.device({a.name!r})"
    if isinstance(a, S.ListArg):
        return "[" + ", ".join(_arg(x, names) for x in a.items) + "]"
    if isinstance(a, S.SubgraphRef):
        return f"subgraphs[{a.name!r}]"
    raise TypeError(f"cannot print argument {a!r}")


def _targets(node: S.Node, names: _Names) -> tuple[str, str]:
    """(left-hand side, wrapper) so that ``lhs = wrapper(call)`` binds the node's outputs."""
    if not node.outputs:
        return "", ""
    outs = [names(o) if o else "_" for o in node.outputs]
    try:
        from torchfuse.graph.ops import resolve_op

        returns = resolve_op(node.op)._schema.returns
    except Exception:  # printing must not fail on an op torch does not know
        returns = []
    plain = [str(r.type) for r in returns]
    lhs = ", ".join(outs) if len(outs) > 1 else outs[0] + ","
    if len(outs) == 1 and plain == ["Tensor"]:
        return outs[0], ""
    if all(t == "Tensor" for t in plain) and len(plain) == len(outs):
        return lhs, ""
    if plain == ["List[Tensor]"]:  # the recorded list length is the node's output count
        return lhs, ""
    # mixed tensor / tensor-list returns: flatten the way the interpreter does
    return lhs, f"flatten_result({{}})[:{len(outs)}]"


def _loc_comment(loc: S.SourceLoc) -> str:
    text = str(loc)
    if loc.text:
        text += f": {loc.text}"
    return "# " + comment_text(text)


def to_python(graph: S.Graph, *, name: str | None = None) -> str:
    """The graph as the source of a module defining ``def <name>(<inputs>)``.

    Each node is one line calling ``torch.ops.<op>`` with a trailing ``# f32[4, 8]`` comment;
    a source-location comment precedes each run of nodes from the same line of user code.
    The function returns a list, like [`run`][torchfuse.graph.interpreter.run].
    """
    names = _Names()
    names.taken |= {sym.name for sym in graph.symbols}  # symbols are bound as plain names
    fn = _NOT_IDENT.sub("_", name or graph.name) or "graph"
    if fn[0].isdigit() or keyword.iskeyword(fn):
        fn = "graph_" + fn
    params = [names(i.name) for i in graph.inputs]
    body: list[str] = []
    saved = num_saved(graph)  # a backward graph's leading inputs: what its forward saved
    for i, inp in enumerate(graph.inputs):
        meta = graph.values.get(inp.name)
        kind = "saved by the forward" if i < saved else inp.kind
        note = kind + (f" {inp.target}" if inp.target else "")
        if meta is not None:
            note += f": {describe_meta(meta)}"
        body.append("# " + comment_text(f"input {i} {params[i]}: {note}"))
    for sym in graph.symbols:
        if not is_identifier(sym.name) or sym.name in _RESERVED or hasattr(builtins, sym.name):
            raise VerificationError(f"graph {graph.name!r}: cannot print symbol {sym.name!r}: not an "
                                    "identifier "
                                    "of its own")
        m = SYMBOL_SOURCE.fullmatch(sym.source or "")
        if m and int(m.group(1)) < len(params):
            body.append(f"{sym.name} = {params[int(m.group(1))]}.size({m.group(2)})")
        elif sym.hint is not None:
            body.append(f"{sym.name} = {sym.hint}  # " + comment_text(f"hint; source: {sym.source}"))
    uses_flatten = False
    last_loc: S.SourceLoc | None = None
    for node in graph.nodes:
        if node.loc is not None and node.loc != last_loc:
            body.append(_loc_comment(node.loc))
        last_loc = node.loc
        try:
            split_op_name(node.op)  # three identifiers, no dunder: torch.ops.<op> names an op
        except UnknownOpError as e:
            raise VerificationError(f"graph {graph.name!r}, node {node.name!r}: cannot print: {e}",
                                    node.name) from None
        bad = [k for k in node.kwargs if not is_identifier(k)]
        if bad:
            raise VerificationError(f"graph {graph.name!r}, node {node.name!r}: keyword {bad[0]!r} is not "
                                    "an identifier", node.name)
        undeclared = _undeclared(node, {s.name for s in graph.symbols})
        if undeclared:
            raise VerificationError(f"graph {graph.name!r}, node {node.name!r}: expressions use undeclared "
                                    f"symbols {sorted(undeclared)}", node.name)
        args = [_arg(a, names) for a in node.args]
        args += [f"{k}={_arg(v, names)}" for k, v in node.kwargs.items()]
        call = f"torch.ops.{node.op}({', '.join(args)})"
        lhs, wrap = _targets(node, names)
        if wrap:
            uses_flatten = True
            call = wrap.format(call)
        line = f"{lhs} = {call}" if lhs else call
        metas = [describe_meta(graph.values[o]) if o in graph.values else "None"
                 for o in node.outputs]
        comment = ", ".join(metas)
        if node.module_path:
            comment += f"  ({node.module_path})"
        body.append(f"{line}  # {comment_text(comment)}" if comment else line)
    outs = [_arg(o.value, names) for o in graph.outputs]
    body.append(f"return [{', '.join(outs)}]")
    header = ["import torch"]
    if uses_flatten:
        header.append("from torchfuse.graph.ops import flatten_result")
    lines = [*header, "", "", f"def {fn}({', '.join(params)}):"]
    lines += ["    " + b for b in body]
    return "\n".join(lines) + "\n"


def _undeclared(node: S.Node, symbols: set[str]) -> set[str]:
    out: set[str] = set()
    stack = [*node.args, *node.kwargs.values()]
    while stack:
        a = stack.pop()
        if isinstance(a, S.SymRef):
            out |= free_symbols(a.expr) - symbols
        elif isinstance(a, S.ListArg):
            stack += a.items
    return out


def describe_output(output: S.GraphOutput) -> str:
    """``user_output``, ``mutated_input arg0``, with ``, aliases <input>`` when it aliases one."""
    tag = output.kind if output.target is None else f"{output.kind} {output.target}"
    return tag + (f", aliases {output.aliases_input}" if output.aliases_input else "")


def _long_meta(meta: S.TensorMeta | None) -> str:
    return "" if meta is None else f"{meta.dtype}[{', '.join(str(s) for s in meta.sizes)}]"


def describe_graph(graph: S.Graph) -> str:
    """The graph as compact text, one line per node, each output tagged with its kind (for
    documentation and as the fallback of logs; `to_python` is the runnable form)::

        def update(arg0: float32[4, 4], arg1: float32[4]):
            add = aten.add.Tensor(arg0, arg1)  # float32[4, 4]
            return (
                add,  # user_output
            )
    """
    def arg(a: S.Argument) -> str:
        # value names as they are; a size expression as stored, unvalidated, since this
        # text is also what logs fall back to when a graph does not print as Python
        return a.expr if isinstance(a, S.SymRef) else _arg(a, str)

    ins = ", ".join(f"{i.name}: {_long_meta(graph.values.get(i.name))}" for i in graph.inputs)
    lines = [f"def {graph.name}({ins}):"]
    for n in graph.nodes:
        args = [arg(a) for a in n.args] + [f"{k}={arg(a)}" for k, a in n.kwargs.items()]
        lhs = ", ".join(o or "_" for o in n.outputs) or "_"
        metas = ", ".join(_long_meta(graph.values.get(o)) for o in n.outputs if o)
        lines.append(f"    {lhs} = {n.op}({', '.join(args)})  # {metas}")
    lines.append("    return (")
    lines += [f"        {arg(o.value)},  # {describe_output(o)}" for o in graph.outputs]
    lines.append("    )")
    return "\n".join(lines)


def load_python(source: str, name: str | None = None) -> Any:
    """``exec`` the output of `to_python` and return the function it defines."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<torchfuse graph>", "exec"), namespace)
    if name is None:
        name = next(k for k, v in reversed(namespace.items()) if callable(v) and k != "flatten_result")
    return namespace[name]


# ----------------------------------------------------------------------------- guards


def check_tensor(t: Any, *, dtype: torch.dtype, device: str | None = None,
                 sizes: Sequence[int | None] | None = None, strides: Sequence[int | None] | None = None,
                 requires_grad: bool | None = None) -> bool:
    """True when ``t`` is a tensor with this dtype, device, sizes and strides (``None``
    entries are not checked)."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype:
        return False
    if device is not None and t.device != torch.device(device):
        return False
    if requires_grad is not None and t.requires_grad != requires_grad:
        return False
    for want, got in ((sizes, t.shape), (strides, t.stride())):
        if want is None:
            continue
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got, strict=True)):
            return False
    return True


def check_type(obj: Any, type_name: str) -> bool:
    """True when ``type(obj)`` is the class named ``module.qualname``."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}" == type_name


def check_global_state(name: str, value: str) -> bool:
    """True when the named piece of process state has the recorded value."""
    probes = {
        "grad_enabled": torch.is_grad_enabled,
        "inference_mode": torch.is_inference_mode_enabled,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "default_dtype": lambda: str(torch.get_default_dtype()).removeprefix("torch."),
    }
    probe = probes.get(name)
    m = re.fullmatch(r"autocast_enabled\((.*)\)", name)
    if probe is None and m:  # e.g. "autocast_enabled(cpu, cuda)" -> "(False, False)"
        devices = [d.strip() for d in m.group(1).split(",") if d.strip()]
        probe = lambda: str(tuple(torch.is_autocast_enabled(d) for d in devices))
    m = re.fullmatch(r"autocast_dtype\((.*)\)", name)
    if probe is None and m:  # "autocast_dtype(cpu, cuda)" -> "('bfloat16', None)" (None: off)
        on = [d.strip() for d in m.group(1).split(",") if d.strip()]
        probe = lambda: str(tuple(str(torch.get_autocast_dtype(d)).removeprefix("torch.")
                                  if torch.is_autocast_enabled(d) else None for d in on))
    if probe is None:
        raise KeyError(f"unknown global state {name!r}")
    return str(probe()) == value


GUARD_HELPERS: dict[str, Any] = {
    "torch": torch, "check_tensor": check_tensor, "check_type": check_type,
    "check_global_state": check_global_state,
}
"""The names `guard_to_python` output refers to, for ``eval``/``exec``."""


def _tuple(items: Sequence[Any]) -> str:
    parts = ["None" if e is None else expr_to_python(e) for e in items]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


_GUARD_NODES = (
    ast.Expression, ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple,
    ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare, ast.SetComp,
    ast.GeneratorExp, ast.ListComp, ast.comprehension, ast.Starred, ast.Call, ast.expr_context,
    ast.operator, ast.boolop, ast.cmpop, ast.unaryop)
GUARD_CALLS = frozenset({"type", "tuple", "list", "len", "id", "storage_groups"})
"""Functions a guard's source or value may call by name."""
GUARD_METHODS = frozenset({"keys", "values", "items", "__getitem__"})
"""Methods a guard's source may call (``tuple(L[0].keys())``, ``dict.__getitem__(d, 'k')``)."""


def _check_guard_expr(text: str, what: str) -> None:
    """Raise `VerificationError` unless ``text`` is an expression that reads objects
    (names, attributes, items, literals, operators, comprehensions) and calls nothing but
    `GUARD_CALLS` and `GUARD_METHODS`: what capture writes as a guard's source.
    A printed guard from a document then runs no code of the document's choosing."""
    try:
        tree = ast.parse(text, mode="eval") if isinstance(text, str) and len(text) < 10_000 else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    if tree is None:
        raise VerificationError(f"cannot print a guard whose {what} {text!r} is not a Python expression")
    for node in ast.walk(tree):
        if not isinstance(node, _GUARD_NODES):
            raise VerificationError(f"cannot print a guard whose {what} {text!r} has a "
                                    f"{type(node).__name__} in it")
        if isinstance(node, ast.Call):
            fn = node.func
            ok = (isinstance(fn, ast.Name) and fn.id in GUARD_CALLS) or (
                isinstance(fn, ast.Attribute) and fn.attr in GUARD_METHODS)
            if not ok or node.keywords:
                raise VerificationError(f"cannot print a guard whose {what} {text!r} calls "
                                        f"{ast.unparse(fn)}")


def guard_to_python(guard: S.Guard) -> str:
    """One guard as a Python expression, true when the guard holds.

    Args:
        guard: A guard record of a Graph (``graph.guards``).

    Returns:
        Python source of an expression over the guard's sources (``L[0]``, ``x`` …) and the
        printer's check helpers.

    Examples:
        >>> from torchfuse.graph.schema import TensorGuard
        >>> guard_to_python(TensorGuard(source="x", dtype="float32", device="cpu", sizes=(4, 8)))
        "check_tensor(x, dtype=torch.float32, device='cpu', sizes=(4, 8), requires_grad=False)"
    """
    source = getattr(guard, "source", None)
    if source is not None:
        _check_guard_expr(source, "source")
    if isinstance(guard, S.TensorGuard):
        try:
            to_dtype(guard.dtype)
        except ValueError as e:
            raise VerificationError(f"cannot print guard on {guard.source!r}: {e}") from None
        text = f"check_tensor({guard.source}, dtype=torch.{guard.dtype}, device={guard.device!r}, "
        text += f"sizes={_tuple(guard.sizes)}"
        if guard.strides is not None:
            text += f", strides={_tuple(guard.strides)}"
        return text + f", requires_grad={guard.requires_grad})"
    if isinstance(guard, S.ConstantGuard):
        try:
            ast.parse(guard.value, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            # the repr of an object that is not Python (``<Foo at 0x...>``): only describable
            text = f"{guard.source} == {guard.value} (a value without a Python form)"
            return "True  # " + comment_text(text)
        _check_guard_expr(guard.value, "value")
        return f"{guard.source} == {guard.value}"
    if isinstance(guard, S.TypeGuard):
        return f"check_type({guard.source}, {guard.type_name!r})"
    if isinstance(guard, S.IdentityGuard):
        # identity is checked by id() in memory; a printed guard can only describe the object
        return "True  # " + comment_text(f"{guard.source} is {guard.description}")
    if isinstance(guard, S.LengthGuard):
        return f"len({guard.source}) == {guard.length}"
    if isinstance(guard, S.GlobalStateGuard):
        return f"check_global_state({guard.name!r}, {guard.value!r})"
    if isinstance(guard, S.SymbolGuard):
        return expr_to_python(guard.expr)
    raise TypeError(f"cannot print guard {guard!r}")


def describe_guard(guard: S.Guard) -> str:
    """One guard as a line of readable text, for logs and ``explain`` (not runnable; see
    `guard_to_python` for that).

    >>> describe_guard(LengthGuard(source="L[0]", length=3))
    'len(L[0]) == 3'
    """
    if isinstance(guard, S.TensorGuard):
        # sizes and strides as the grammar writes them: a symbol (s0) is a size that binds
        size = ", ".join("?" if e is None else str(e) for e in guard.sizes)
        stride = ", ".join("?" if e is None else str(e) for e in guard.strides or ())
        return (f"{guard.source}: Tensor(dtype={guard.dtype}, device={guard.device}, "
                f"size=[{size}], stride=[{stride}], requires_grad={guard.requires_grad})")
    if isinstance(guard, S.TypeGuard):
        return f"type({guard.source}) is {guard.type_name}"
    if isinstance(guard, S.IdentityGuard):
        return f"{guard.source} is {guard.description}"
    if isinstance(guard, S.GlobalStateGuard):
        return f"{guard.name} == {guard.value}"
    if isinstance(guard, S.SymbolGuard):
        return guard.expr
    if isinstance(guard, S.ConstantGuard | S.LengthGuard):  # already readable as Python
        try:
            return guard_to_python(guard)
        except VerificationError:
            # readable text, never run: a value whose repr calls a constructor (``set()``,
            # ``np.float64(2.0)``) is shown as written, though `guard_to_python` refuses it
            return f"{guard.source} == {guard.value}"
    return repr(guard)


def guards_to_python(guards: Sequence[S.Guard]) -> str:
    """All guards, one per line, each preceded by its source location when known."""
    lines: list[str] = []
    for g in guards:
        if g.loc is not None:
            lines.append(_loc_comment(g.loc))
        lines.append(guard_to_python(g))
    return "\n".join(lines) + ("\n" if lines else "")
