"""Backends: what turns a captured Graph into something callable.

A backend is ``backend(graph, example_inputs) -> callable(*flat_inputs) -> list``; one that
also takes ``mode=`` and/or ``options=`` keywords receives what was given to ``compile``. Named
backends are found through the entry-point group ``torchfuse.backends``; this package
registers ``eager`` (the reference interpreter). ``inductor`` comes from torchfuse-inductor.

A name that two installed distributions register is an error naming both
([`AmbiguousBackend`][torchfuse.capture.errors.AmbiguousBackend]); choose one explicitly by its
entry-point value, ``"package.module:function"``, which is imported directly. The default
backend of [`compile`][torchfuse.capture.compile] is ``config.default_backend``
(``TORCHFUSE_BACKEND``, else ``inductor``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import torch
from torchfuse.capture.errors import AmbiguousBackend, BackendNotFound
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import Interpreter

Backend = Callable[[S.Graph, Sequence[torch.Tensor]], Callable[..., list[Any]]]


def eager(graph: S.Graph, example_inputs: Sequence[torch.Tensor]) -> Callable[..., list[Any]]:
    """The ``eager`` backend: run each graph with the reference interpreter, no compilation.

    Useful to tell a capture problem from a compiler problem: if a function is right under
    ``backend="eager"`` and wrong under ``"inductor"``, capture is not to blame.

    Args:
        graph: The captured graph.
        example_inputs: The flat inputs of the call that captured it (unused).

    Returns:
        A callable taking the graph's flat inputs and returning the list of its outputs.
    """
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
    """The backend names installed packages register, sorted.

    Returns:
        The names under the ``torchfuse.backends`` entry-point group, each once (a name two
        distributions register is listed once; looking it up raises
        [`AmbiguousBackend`][torchfuse.capture.errors.AmbiguousBackend]).

    Examples:
        >>> import torchfuse.capture
        >>> "eager" in torchfuse.capture.list_backends()
        True
    """
    return sorted({ep.name for ep in entry_points(group="torchfuse.backends")})


_FOUND: dict[str, Backend] = {}
"""Backends already found by name. Scanning the entry points reads every installed
distribution's metadata (20-40 ms with a few hundred installed), which a process should pay once,
not on each compiled function's first call. Only hits are kept: a backend installed later is
still found."""


def _registrations(name: str) -> list[EntryPoint]:
    """The entry points registering ``name``, one per distinct target (an editable install seen
    twice on ``sys.path`` is one registration)."""
    seen: dict[str, EntryPoint] = {}
    for ep in entry_points(group="torchfuse.backends"):
        if ep.name == name:
            seen.setdefault(ep.value, ep)
    return list(seen.values())


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "an unknown distribution"


def _import_target(target: str) -> Backend:
    """The callable named by ``"package.module:attribute"``."""
    module_name, _, attribute = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise BackendNotFound(f"cannot import the backend {target!r}: {type(e).__name__}: {e}") from e
    if not callable(obj):
        raise BackendNotFound(f"the backend {target!r} is a {type(obj).__name__}, not a callable")
    return obj


def lookup_backend(backend: str | Backend, *, origin: str | None = None) -> Backend:
    """The backend callable for a name.

    Args:
        backend: A name registered under the ``torchfuse.backends`` entry-point group
            (``"eager"``, ``"aot_eager"``, ``"inductor"``, ``"cudagraphs"``, or a third-party
            name), an entry-point value ``"package.module:function"`` (imported directly, which
            is how to choose between two packages registering one name), or a callable,
            returned as it is.
        origin: Where the name came from, for the error message (``compile`` passes
            ``"TORCHFUSE_BACKEND"`` when the default came from the environment).

    Returns:
        The backend, a callable
        ``backend(graph, example_inputs) -> callable(*flat_inputs) -> list``.

    Raises:
        BackendNotFound: No installed package registers the name (the message lists the
            names that exist), or a ``module:function`` value does not import.
        AmbiguousBackend: Two installed distributions register the name; the message names both.

    Examples:
        >>> from torchfuse.capture import eager, lookup_backend
        >>> lookup_backend("eager") is eager
        True
    """
    if callable(backend):
        return backend
    found = _FOUND.get(backend)
    if found is not None:
        return found
    if ":" in backend:
        _FOUND[backend] = _import_target(backend)
        return _FOUND[backend]
    registered = _registrations(backend)
    if len(registered) > 1:
        owners = ", ".join(f"{_distribution(ep)} ({ep.value})" for ep in registered)
        raise AmbiguousBackend(f"the torchfuse backend name {backend!r} is registered by "
                               f"{len(registered)} installed packages: {owners}; choose one "
                               f"explicitly by its entry-point value, e.g. "
                               f"backend={registered[0].value!r}")
    if registered:
        _FOUND[backend] = registered[0].load()
        return _FOUND[backend]
    hint = " (install torchfuse-inductor for the default backend)" if backend == "inductor" else ""
    source = f" (from {origin})" if origin else ""
    raise BackendNotFound(f"no torchfuse backend named {backend!r}{source}{hint}; "
                          f"available: {', '.join(list_backends()) or 'none'}")
