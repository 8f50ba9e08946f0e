"""``export(fn, *args)``: one Graph with its weights, saved as an archive, runnable anywhere.

The exported Graph's inputs are the user tensors (flattened from the arguments, in order)
followed by parameters, buffers and constants, which travel with it as tensors by input
name. The input and output structures are kept in ``graph.meta`` as JSON
(``in_spec``/``out_spec``). Needs only torchfuse-graph and torchfuse-capture.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch
from torchfuse.capture.context import InputSlot
from torchfuse.capture.convert import capture, def_location, make_binder, varkw_index
from torchfuse.capture.errors import ExportError, Unsupported
from torchfuse.capture.output import spec_to_json
from torchfuse.graph import archive
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import run as run_graph


class Exported:
    """An exported program: one Graph plus the tensors of its non-user inputs.

    Made by [`export`][torchfuse.capture.export.export]; saved with [`save`][torchfuse.capture.Exported.save]
    and read back with [`load`][torchfuse.capture.Exported.load], which needs only
    torchfuse-graph and torchfuse-capture. Calling it is [`run`][torchfuse.capture.Exported.run].

    Attributes:
        graph: The captured [`Graph`][torchfuse.graph.Graph]: user tensors first, then
            parameters, buffers and constants; ``graph.meta`` keeps the input and output
            structures as JSON.
        tensors: The tensors of the non-user inputs, by input name (the weights).

    Examples:
        >>> import torch
        >>> from torchfuse.capture import export
        >>> exported = export(lambda x: (x * 2).relu(), torch.randn(3))
        >>> [i.kind for i in exported.graph.inputs]
        ['user_input']
        >>> x = torch.randn(3)
        >>> torch.equal(exported(x), (x * 2).relu())
        True
    """

    def __init__(self, graph: S.Graph, tensors: dict[str, torch.Tensor]) -> None:
        self.graph = graph
        self.tensors = tensors

    @property
    def in_spec(self) -> Any:
        """The structure of the export call's arguments (JSON-decoded from ``graph.meta``)."""
        return json.loads(self.graph.meta["in_spec"])

    @property
    def out_spec(self) -> Any:
        """The structure of the function's return value (JSON-decoded from ``graph.meta``)."""
        return json.loads(self.graph.meta["out_spec"])

    def save(self, path: str | Path) -> None:
        """Write the graph and its tensors as a torchfuse archive.

        Args:
            path: A directory, or a file name ending in ``.zip`` for a single-file archive.
                The archive holds ``manifest.json`` (format version, producer, content hash),
                the Graph as JSON and the tensors as safetensors; nothing is pickled.
        """
        archive.save(self.graph, path, tensors=self.tensors)

    @classmethod
    def load(cls, path: str | Path) -> Exported:
        """Read an archive written by [`save`][torchfuse.capture.Exported.save].

        Loading never executes code from the archive (see the format's trust model).

        Args:
            path: The archive's directory or ``.zip`` file.

        Returns:
            The exported program, ready to [`run`][torchfuse.capture.Exported.run].

        Raises:
            torchfuse.graph.ArchiveError: The archive is damaged, fails its content hash, is
                not a torchfuse archive, or lacks a weight, or stores one whose dtype or shape
                is not the graph's.
            torchfuse.graph.FormatVersionError: It was written by a newer major format version.
            TypeError: The archive holds a Program (a compiled result), not a Graph.
        """
        arc = archive.load_archive(path)
        if not isinstance(arc.document, S.Graph):
            raise TypeError(f"{path} holds a {type(arc.document).__name__}, not an exported Graph; "
                            "load a Program with torchfuse.runtime.load")
        return cls(arc.document, archive.bind_weights(arc.document, arc.tensors, source=str(path)))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run on new user tensors with the reference interpreter.

        Args:
            *args: The arguments, with the same structure as at export (tensors may have
                other values; sizes the graph specialized must match).
            **kwargs: Keyword arguments, matched by name with those of the export call (an
                exported module's ``model(input_ids=..., attention_mask=...)``).

        Returns:
            The function's result, rebuilt in the structure it had at export.

        Raises:
            ValueError: The number of tensors differs from the export call's, or a keyword
                argument the export call had is missing.
            torchfuse.graph.interpreter.InputError: A tensor's dtype, rank or sizes differ from
                what the graph was captured for (including a size a folded branch depended on).
        """
        user = _bind_user_inputs(self.graph.meta, args, kwargs) if kwargs else \
            _flatten_tensors(list(args))
        n_user = sum(1 for i in self.graph.inputs if i.kind == "user_input")
        if len(user) != n_user:
            raise ValueError(f"{self.graph.name} takes {n_user} tensor inputs, got {len(user)}")
        it = iter(user)
        flat = [next(it) if i.kind == "user_input" else self.tensors[i.name] for i in self.graph.inputs]
        outs = run_graph(self.graph, *flat)
        return _rebuild(self.out_spec, outs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


def _user_paths(slots: list[InputSlot], fn: types.FunctionType, bound: bool) -> str:
    """Where each user tensor input of the graph comes from, in graph order, as JSON: the
    argument (its position among the caller's positional arguments, and its name) and the
    keys below it. A call by keyword is bound by these names."""
    from torchfuse.capture.source import ItemSource, LocalSource

    code = fn.__code__
    positional = code.co_varnames[int(bound):code.co_argcount]
    slot = varkw_index(code)
    varkw = code.co_varnames[slot] if slot is not None else None
    paths = []
    for slot in slots:
        if slot.kind != "user_input":
            continue
        keys: list[Any] = []
        src = slot.source
        while isinstance(src, ItemSource):
            keys.insert(0, src.key)
            src = src.base
        if not isinstance(src, LocalSource):
            return json.dumps(None)
        name = src.name
        if name == varkw and keys:  # **kwargs: the key is the keyword
            name, keys = keys[0], keys[1:]
        pos = positional.index(name) if name in positional else None
        paths.append([name, pos, keys])
    return json.dumps(paths)


def _bind_user_inputs(meta: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    raw = meta.get("user_inputs")
    paths = json.loads(raw) if raw else None
    if paths is None:
        raise ValueError("this program was exported from a call without keyword inputs it can bind; "
                         "pass the tensors positionally")
    out = []
    for name, pos, keys in paths:
        if name in kwargs:
            value = kwargs[name]
        elif pos is not None and pos < len(args):
            value = args[pos]
        else:
            raise ValueError(f"missing argument {name!r} (the exported call had it)")
        for k in keys:
            value = value[k]
        out.append(value)
    return out


def _flatten_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _flatten_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten_tensors(v)]
    return []


def _rebuild(spec: Any, outs: list[Any]) -> Any:
    if "tensor" in spec:
        return outs[spec["tensor"]]
    if "const" in spec:
        return spec["const"]
    if "seq" in spec:
        items = [_rebuild(s, outs) for s in spec["items"]]
        return list(items) if spec["seq"] == "list" else tuple(items)
    if "dict" in spec:  # a mapping, a model output or an object made in the function
        return {k: _rebuild(v, outs) for k, v in spec["dict"]}
    raise ValueError(f"bad output spec {spec!r}")


def _in_spec(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    def conv(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return {"tensor": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
        if isinstance(v, list | tuple):
            return {"seq": type(v).__name__, "items": [conv(x) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[str(k), conv(x)] for k, x in v.items()]}
        if v is None or isinstance(v, bool | int | float | str):
            return {"const": v}
        return {"object": type(v).__qualname__}
    return json.dumps({"args": [conv(a) for a in args], "kwargs": {k: conv(v) for k, v in kwargs.items()}})


def export(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Exported:
    """Capture ``fn(*args, **kwargs)`` as one Graph with its weights.

    Unlike [`compile`][torchfuse.capture.compile], nothing may be left to Python: the whole
    call must capture as one graph with no side effect on Python objects. When the function
    graph-breaks, the error lists every break: to find those after the first, the call is run
    once through ``compile`` (capture resumes after each break), so the function's own side
    effects happen then.

    Args:
        fn: A function, a bound method or an ``nn.Module`` (its ``forward``).
        *args: Example positional arguments; their sizes are specialized in the graph.
        **kwargs: Example keyword arguments.

    Returns:
        The [`Exported`][torchfuse.capture.Exported] program, the Graph with its weights.

    Raises:
        ExportError: The call does not capture as one graph; the message names every break
            (reason, file and line) and a fix.
        TypeError: ``fn`` is not a function, method or module.

    Examples:
        >>> import torch
        >>> from torchfuse.capture import export
        >>> lin = torch.nn.Linear(4, 2)
        >>> exported = export(lin, torch.randn(3, 4))
        >>> sorted(exported.tensors)
        ['bias', 'weight']
    """
    bound_self = None
    target = fn
    if isinstance(target, torch.nn.Module):
        bound_self, target = target, type(target).forward
    elif isinstance(target, types.MethodType):
        bound_self, target = target.__self__, target.__func__
    if not isinstance(target, types.FunctionType):
        raise TypeError(f"export() takes a function or module, not {type(fn).__name__}")
    call_args = (bound_self, *args) if bound_self is not None else args
    L = make_binder(target)(*call_args, **kwargs)
    result = capture(target, L, target.__qualname__)
    if result.error is not None:
        raise ExportError(target.__qualname__, _all_breaks(target, bound_self, args, kwargs, result))
    # A side effect that, for the values seen now, leaves every object as it was (a library's
    # own bookkeeping set and reset in one call) is irrelevant to the exported graph; any other
    # one cannot be exported, and each is reported where the code does it.
    kept = [note for note in result.effect_notes if not note.noop]
    if kept:
        raise ExportError(target.__qualname__, [Unsupported(
            f"a side effect on a Python object ({note.what}) cannot be exported", note.loc)
            for note in kept])
    try:
        out_spec = spec_to_json(_constants_by_value(result.out_spec, L, target))
    except Unsupported as e:
        if e.loc is None:
            e.loc = def_location(target)
        raise ExportError(target.__qualname__, [e]) from e
    graph = result.graph
    assert graph is not None
    tensors = _weights(result.inputs, L, target)
    graph = msgspec.structs.replace(graph, meta={**graph.meta, "in_spec": _in_spec(args, kwargs),
                                                 "out_spec": out_spec,
                                                 "user_inputs": _user_paths(result.inputs, target,
                                                                            bound_self is not None),
                                                 "producer": "torchfuse-capture export"})
    return Exported(graph, tensors)


def _constants_by_value(spec: Any, L: tuple[Any, ...], fn: types.FunctionType) -> Any:
    """Constant arguments returned as they are (``("s", "L[1]")``) become their export-time
    values: an exported program has no caller to read them from."""
    import sys

    from torchfuse.capture.variables import is_constant

    tag = spec[0]
    if tag == "s":
        value = eval(spec[1], {"L": L, "G": fn.__globals__, "C": fn.__closure__, "sys": sys})
        return ("c", value) if is_constant(value) else spec
    if tag == "seq":
        return ("seq", spec[1], [_constants_by_value(s, L, fn) for s in spec[2]])
    if tag == "dict":
        return ("dict", spec[1], spec[2], [_constants_by_value(s, L, fn) for s in spec[3]])
    if tag == "obj":
        return ("obj", spec[1], {k: _constants_by_value(s, L, fn) for k, s in spec[2].items()})
    return spec


def _all_breaks(target: types.FunctionType, bound_self: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any], first: Any) -> list[Unsupported]:
    """Every graph break of the call (capture resumes after each, so running it finds them
    all); the first one alone when running it fails."""
    from torchfuse.capture.explain import collect

    try:
        results = collect(target, bound_self, args, kwargs)
    except Exception:
        return [first.error]
    seen: set[tuple] = set()
    out: list[Unsupported] = []
    from torchfuse.capture.resume import is_user_break

    for r in results:
        e = r.error
        if not is_user_break(r):
            continue
        key = (e.reason, e.loc.file if e.loc else None, e.loc.line if e.loc else None)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out or [first.error]


def _weights(slots: list[InputSlot], L: tuple[Any, ...], fn: types.FunctionType) -> dict[str, torch.Tensor]:
    from torchfuse.capture.compiler import _gather_functions

    ns: dict[str, Any] = {"sys": __import__("sys")}
    gather, fetch = _gather_functions(slots, ns)
    flat = gather(L, fn.__globals__, fn.__closure__, fetch(L, fn.__globals__, fn.__closure__))
    return {slot.name: t.detach().contiguous().clone() if not t.is_contiguous() else t.detach()
            for slot, t in zip(slots, flat, strict=True) if slot.kind != "user_input"}
