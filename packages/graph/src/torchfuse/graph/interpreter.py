"""The reference interpreter: the living definition of what a Graph means.

``run(graph, *inputs)`` calls each node's ATen op eagerly, in order, and returns the graph's
outputs as a list. Every other consumer of a Graph (inductor, the runtime, autograd's
retracing) is tested against it.

`Interpreter` is overridable, node by node, like ``torch.fx.Interpreter``: autograd
re-runs graphs on fake tensors through it, and tests can intercept single ops.

A Graph runs with **autocast off**. Capture records autocast's work as it happened: every cast
autocast inserted is a ``_to_copy`` node, and every op carries the dtype autocast gave it
(ops inside ``torch.autocast(enabled=False)`` regions or inside composite kernels, which
autocast leaves alone in eager, stay as they ran). Re-running those ops under an autocast that
is still enabled around the call would cast them a second time, and differently from eager
(an fp32 ``bmm`` of rotary embeddings would become bf16), so `Interpreter.run` and every
pass or compiled function that runs a Graph's ops does it inside `no_autocast`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.ops import decode_arg, flatten_result, resolve_op


class InterpreterError(RuntimeError):
    """A node failed while the graph ran; the message names the node and its source line."""


class InputError(InterpreterError, ValueError):
    """Inputs that do not fit the graph: wrong count, a non-tensor, or a dtype, rank or size
    other than the value table records, a size symbol out of its range, or a symbol guard
    capture recorded (a branch it folded away) that does not hold. ``index`` is the position
    of the offending input (``None`` for a count mismatch or a guard) and ``name`` its value
    name. Messages follow the runtime's ``InputError``."""

    def __init__(self, message: str, *, index: int | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.name = name


_SOURCE = re.compile(r"input:([0-9]{1,9})\.size\(([0-9]{1,9})\)")


def _source(sym: S.Symbol, n_inputs: int) -> tuple[int, int] | None:
    m = _SOURCE.fullmatch(sym.source or "")
    return (int(m.group(1)), int(m.group(2))) if m and int(m.group(1)) < n_inputs else None


def bind_symbols(symbols: Sequence[S.Symbol], inputs: Sequence[Any], *,
                 symbolic: bool = False) -> dict[str, Any]:
    """Values of size symbols whose ``source`` is ``input:<i>.size(<d>)``, else their hints.
    ``symbolic``: a size that is a ``SymInt`` (a fake's) is bound as it is, not made an int
    (which would specialize it)."""
    env: dict[str, Any] = {}
    for sym in symbols:
        src = _source(sym, len(inputs))
        shape = getattr(inputs[src[0]], "shape", ()) if src else ()
        if src and src[1] < len(shape):
            env[sym.name] = shape[src[1]] if symbolic else int(shape[src[1]])
        elif sym.hint is not None:
            env[sym.name] = sym.hint
    return env


def _describe(sizes: Sequence[S.Expr]) -> str:
    return "(" + ", ".join(str(e) for e in sizes) + ")"


def check_inputs(graph: S.Graph, inputs: Sequence[Any]) -> dict[str, int]:
    """Check ``inputs`` against what ``graph`` was captured for and return the size symbols'
    values (`bind_symbols`); raise `InputError` naming the input otherwise.

    Checked: the count; each input is a tensor of the value table's dtype and rank, with the
    sizes the table records (expressions evaluated with the symbols bound from the inputs);
    each symbol within its range; and every ``SymbolGuard`` of the graph. Strides and devices
    are not checked (the interpreter runs any layout), nor sizes that are ``SymInt`` (fake
    tensors), nor the saved values a backward graph receives from its forward.
    """
    from torchfuse.graph.expr import ExprError, free_symbols
    from torchfuse.graph.ops import dtype_name

    n = len(graph.inputs)
    if len(inputs) != n:
        names = ", ".join(i.name for i in graph.inputs)
        raise InputError(f"graph {graph.name!r} takes {n} inputs ({names}), got {len(inputs)}")
    saved = num_saved(graph)
    for i, (inp, value) in enumerate(zip(graph.inputs, inputs, strict=True)):
        meta = graph.values.get(inp.name) if i >= saved else None
        what = f"graph {graph.name!r}: input {i} ({inp.name!r})"
        if meta is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise InputError(f"{what}: expected a tensor, got {type(value).__name__}", index=i, name=inp.name)
        if dtype_name(value.dtype) != meta.dtype:
            raise InputError(f"{what}: expected dtype {meta.dtype}, got {value.dtype}", index=i,
                             name=inp.name)
        if value.dim() != len(meta.sizes):
            raise InputError(f"{what}: expected {len(meta.sizes)} dimensions {_describe(meta.sizes)}, got "
                             f"shape {tuple(value.shape)}", index=i, name=inp.name)
    env = bind_symbols(graph.symbols, inputs)
    concrete = env
    for sym in graph.symbols:
        value = concrete.get(sym.name)
        if value is not None and (value < sym.min or (sym.max is not None and value > sym.max)):
            hi = "inf" if sym.max is None else sym.max
            raise InputError(f"graph {graph.name!r}: size symbol {sym.name} (from {sym.source}) is {value}, "
                             f"outside its range [{sym.min}, {hi}]")
    for i, (inp, value) in enumerate(zip(graph.inputs, inputs, strict=True)):
        meta = graph.values.get(inp.name) if i >= saved else None
        if meta is None:
            continue
        for d, (size, got) in enumerate(zip(meta.sizes, value.shape, strict=True)):
            if isinstance(got, torch.SymInt):
                continue
            try:
                want = evaluate(size, concrete)
            except ExprError:
                continue  # a symbol no input binds and without a hint
            if want != got:
                want_all = [_try_eval(e, concrete) for e in meta.sizes]
                raise InputError(
                    f"graph {graph.name!r}: input {i} ({inp.name!r}): expected shape {_describe(meta.sizes)}"
                    f" = {tuple(want_all)}, got {tuple(value.shape)} (dim {d})", index=i, name=inp.name)
    for guard in graph.guards:
        if not isinstance(guard, S.SymbolGuard):
            continue
        try:
            if not free_symbols(guard.expr) <= concrete.keys() or evaluate(guard.expr, concrete):
                continue
        except ExprError:
            continue
        where = f" (from {guard.loc}: {guard.loc.text})" if guard.loc and guard.loc.text else (
            f" (from {guard.loc})" if guard.loc else "")
        values = ", ".join(f"{s} = {concrete[s]}" for s in sorted(free_symbols(guard.expr)))
        raise InputError(f"graph {graph.name!r}: the graph was captured for {guard.expr}{where}, "
                         f"which these inputs break ({values})")
    return env


def num_saved(graph: S.Graph) -> int:
    """The leading inputs of a backward graph that another graph computed and saved (autograd
    writes their count in ``meta["autograd.num_saved"]``): not checked, as they are what the
    forward's kernels returned, which may differ from the meta kernels' sizes (eval-mode
    ``native_batch_norm`` saves empty statistics on the CPU)."""
    try:
        return max(0, int(graph.meta.get("autograd.num_saved", "0")))
    except ValueError:
        return 0


def _try_eval(expr: S.Expr, env: dict[str, int]) -> S.Expr:
    from torchfuse.graph.expr import ExprError

    try:
        return evaluate(expr, env)
    except ExprError:
        return expr


def _autocast_types() -> tuple[str, ...]:
    names = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu", "privateuseone")
    found = []
    for name in names:
        try:
            if torch.amp.is_autocast_available(name):
                torch.is_autocast_enabled(name)
                found.append(name)
        except (RuntimeError, ValueError, TypeError, AttributeError):
            continue
    return tuple(found)


AUTOCAST_DEVICE_TYPES: tuple[str, ...] = _autocast_types()
"""Device types this torch build has an autocast state for (``cpu``, ``cuda``, ...)."""


def device_types(graph: S.Graph) -> tuple[str, ...]:
    """The device types (``"cpu"``, ``"cuda"``) of ``graph``'s values, sorted: the ones whose
    autocast state can change what its ops compute."""
    return tuple(sorted({torch.device(m.device).type for m in graph.values.values()} or {"cpu"}))


class _AutocastOff:
    """Turns autocast off for ``types`` on entry and back on at exit."""

    __slots__ = ("_types",)

    def __init__(self, types: list[str]) -> None:
        self._types = types

    def __enter__(self) -> None:
        for d in self._types:
            torch.set_autocast_enabled(d, False)

    def __exit__(self, *exc: object) -> None:
        for d in self._types:
            torch.set_autocast_enabled(d, True)


_NOTHING_TO_DO = contextlib.nullcontext()


def no_autocast(device_types: Iterable[str] | None = None) -> contextlib.AbstractContextManager:
    """A context manager with autocast disabled, for the device types given (default: all),
    while a Graph's ops run; the state is restored on exit.

    The device types are read when it is made (``with no_autocast(): ...``). It costs one
    ``torch.is_autocast_enabled`` per device type when autocast is off, and only flips the
    enabled flag when it is on, so the nesting level and the cast cache of the enclosing
    ``torch.autocast`` are left alone.
    """
    types = AUTOCAST_DEVICE_TYPES if device_types is None else device_types
    on = [d for d in types if torch.is_autocast_enabled(d)]
    return _AutocastOff(on) if on else _NOTHING_TO_DO


class Interpreter:
    """Runs a Graph node by node, with autocast off (see the module doc). Override
    `call_node` to change how ops run."""

    def __init__(self, graph: S.Graph) -> None:
        self.graph = graph

    def call_node(self, node: S.Node, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return resolve_op(node.op)(*args, **kwargs)

    def run(self, *inputs: Any) -> list[Any]:
        g = self.graph
        self.symbols = check_inputs(g, inputs)
        env: dict[str, Any] = {inp.name: v for inp, v in zip(g.inputs, inputs, strict=True)}
        with no_autocast():
            return self._run_nodes(env)

    def _run_nodes(self, env: dict[str, Any]) -> list[Any]:
        g = self.graph
        for node in g.nodes:
            try:
                args = [decode_arg(a, env, self.symbols) for a in node.args]
                kwargs = {k: decode_arg(a, env, self.symbols) for k, a in node.kwargs.items()}
                result = self.call_node(node, args, kwargs)
            except Exception as e:
                where = f" (from {node.loc}: {node.loc.text})" if node.loc and node.loc.text else (
                    f" (from {node.loc})" if node.loc else "")
                raise InterpreterError(f"node {node.name!r} [{node.op}] failed{where}: {e}") from e
            flat = flatten_result(result)
            if len(node.outputs) > len(flat):
                raise InterpreterError(
                    f"node {node.name!r} [{node.op}] returned {len(flat)} values, "
                    f"graph expects {len(node.outputs)}"
                )
            for name, value in zip(node.outputs, flat[: len(node.outputs)], strict=True):
                if name:
                    env[name] = value
        return [self.output_value(o.value, env) for o in g.outputs]

    def output_value(self, value: S.Argument, env: dict[str, Any]) -> Any:
        if isinstance(value, S.SymRef):
            return evaluate(value.expr, self.symbols)
        return decode_arg(value, env, self.symbols)


def run(graph: S.Graph, *inputs: Any) -> list[Any]:
    """Run ``graph`` eagerly on ``inputs`` with the reference interpreter.

    The interpreter is the living definition of what a Graph means: each node's op is called
    on real tensors in order, size symbols are bound from the inputs' sizes, and every other
    consumer of the format is tested against it.

    Args:
        graph: The graph to run.
        *inputs: One value per graph input, in order (user inputs, then parameters, buffers
            and constants).

    Returns:
        The list of outputs, one per graph output.

    Raises:
        InterpreterError: A node failed; the message names the node, its op and its source
            line.

    Examples:
        >>> import torch
        >>> from torchfuse.graph import run, trace
        >>> graph, _ = trace(lambda x, y: x + y, torch.ones(2), torch.ones(2))
        >>> run(graph, torch.ones(2), torch.ones(2))
        [tensor([2., 2.])]
    """
    return Interpreter(graph).run(*inputs)
