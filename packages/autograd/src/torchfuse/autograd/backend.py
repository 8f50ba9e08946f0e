"""The ``aot_eager`` backend: autograd's joint graph and partition, both halves run by the
reference interpreter. Registered under the ``torchfuse.backends`` entry-point group."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from torchfuse.autograd.glue import Compiled, aot
from torchfuse.graph import run
from torchfuse.graph import schema as S


def interpreter_compiler(graph: S.Graph, example_inputs: Sequence[Any]) -> Compiled:
    """A compiler that does not compile: the graph runs on the reference interpreter."""
    return functools.partial(run, graph)


def aot_eager(graph: S.Graph, example_inputs: Sequence[Any]) -> Callable[..., list[Any]]:
    """Backend ``aot_eager(graph, example_inputs) -> callable(*inputs) -> list``."""
    return aot(graph, interpreter_compiler, interpreter_compiler)
