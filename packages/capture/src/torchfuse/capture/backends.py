"""Backends: what turns a captured Graph into something callable.

A backend is ``backend(graph, example_inputs) -> callable(*flat_inputs) -> list``; one that
also takes ``mode=`` and/or ``options=`` keywords receives what was given to ``compile``. Named
backends are found through the entry-point group ``torchfuse.backends``; this package
registers ``eager`` (the reference interpreter). ``inductor`` comes from torchfuse-inductor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

import torch
from torchfuse.capture.errors import BackendNotFound
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import Interpreter

Backend = Callable[[S.Graph, Sequence[torch.Tensor]], Callable[..., list[Any]]]


def eager(graph: S.Graph, example_inputs: Sequence[torch.Tensor]) -> Callable[..., list[Any]]:
    """Run the graph with :func:`torchfuse.graph.run`'s interpreter (no compilation)."""
    interp = Interpreter(graph)
    return interp.run


def backend_parameters(backend: Backend) -> frozenset[str] | None:
    """The keyword parameters a backend accepts (``None``: any, it takes ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(backend).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                          inspect.Parameter.POSITIONAL_OR_KEYWORD))


def list_backends() -> list[str]:
    """Names registered under the ``torchfuse.backends`` entry-point group, sorted."""
    return sorted({ep.name for ep in entry_points(group="torchfuse.backends")})


_FOUND: dict[str, Backend] = {}
"""Backends already found by name. Scanning the entry points reads every installed
distribution's metadata (20-40 ms with a few hundred installed), which a process should pay once,
not on each compiled function's first call. Only hits are kept: a backend installed later is
still found."""


def lookup_backend(backend: str | Backend) -> Backend:
    """The backend callable for a name (or the callable itself)."""
    if callable(backend):
        return backend
    found = _FOUND.get(backend)
    if found is not None:
        return found
    for ep in entry_points(group="torchfuse.backends"):
        if ep.name == backend:
            _FOUND[backend] = ep.load()
            return _FOUND[backend]
    hint = " (install torchfuse-inductor for the default backend)" if backend == "inductor" else ""
    raise BackendNotFound(f"no torchfuse backend named {backend!r}{hint}; "
                          f"available: {', '.join(list_backends()) or 'none'}")
