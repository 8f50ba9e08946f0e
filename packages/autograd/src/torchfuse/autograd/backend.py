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
    """The ``aot_eager`` backend: the joint graph and its partition, each half interpreted.

    Runs everything AOT autograd does (functionalization, the joint forward/backward graph,
    decompositions, the min-cut partition) and then runs the forward and backward graphs
    with the reference interpreter. Right under ``aot_eager`` and wrong under ``inductor``:
    the bug is in inductor or the runtime.

    Args:
        graph: The captured graph.
        example_inputs: The flat inputs of the call that captured it.

    Returns:
        A callable on the graph's flat inputs returning the list of its outputs,
        differentiable through ``torch.autograd``.

    Examples:
        >>> import torch
        >>> from torchfuse.capture import compile
        >>> f = compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager")
        >>> x = torch.randn(3, requires_grad=True)
        >>> f(x).backward()
        >>> torch.allclose(x.grad, 2 * x.cos())
        True
    """
    return aot(graph, interpreter_compiler, interpreter_compiler)
