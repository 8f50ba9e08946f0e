"""The ``inductor`` backend: ``inductor(graph, example_inputs) -> callable(*inputs) -> list``.

With grad mode on and an input that requires grad, the graph goes through
``torchfuse.autograd.aot`` (joint graph, partition) and each half is compiled here;
otherwise the graph is compiled directly. Either way each compiled graph is a Program run by
``torchfuse.runtime``. Programs and autograd plans are cached on disk
(`torchfuse.inductor.cache`), so a second process compiling the same graphs loads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchfuse.autograd import aot  # at import, not at the first training call (networkx: ~0.3 s)
from torchfuse.graph import observe
from torchfuse.graph import schema as S
from torchfuse.graph.interpreter import device_types, no_autocast
from torchfuse.graph.torchfuse_ops import records_grad
from torchfuse.inductor.compile import compile_graph
from torchfuse.inductor.config import config as default_config
from torchfuse.inductor.layout import layout_pass


def compiler(
    graph: S.Graph,
    example_inputs: Sequence[Any] | None = None,
    *,
    mode: str = "default",
    options: dict | None = None,
    functionalize: bool = False,
) -> Callable[..., list]:
    """Compile one graph and load it with the runtime: ``compiler(graph, inputs)(*inputs)``.
    ``functionalize``: as `compile_graph`'s (the graph may write into its intermediates).

    A graph's ops already carry autocast's dtypes, so compiling (decompositions re-run the
    graph on fakes, autotuning runs candidates) and calling a Program with extern steps happen
    with autocast off: an autocast enclosing the call would cast an extern ``mm`` again.
    """
    from torchfuse.runtime import load
    from torchfuse.runtime.compile_workers import start_early

    types = device_types(graph)
    with no_autocast(types):
        # a GPU graph compiled now (not read from the cache) will have Triton kernels to
        # compile: the runtime's compile workers start, and set their compilers up, meanwhile
        program = compile_graph(graph, example_inputs, mode=mode, options=options,
                                functionalize=functionalize, on_miss=start_early if "cuda" in types else None)
        runtime_mode = "reduce-overhead" if mode == "reduce-overhead" else "default"
        t0 = time.perf_counter()
        # C++ kernels compiled here (or read from the user's own compile cache) are vouched
        # for by compile_graph (`torchfuse.runtime.cpp.vouch`): no trust_code needed
        fn = load(program, mode=runtime_mode)
        observe.record_time("runtime.load", time.perf_counter() - t0)

    if any(isinstance(step, S.ExternStep) for step in program.steps):
        def run(*inputs: Any) -> list:
            with no_autocast(types):
                return list(fn(*inputs))
    else:  # Triton and C++ kernels compute in the dtypes of their buffers, whatever autocast says
        def run(*inputs: Any) -> list:
            return list(fn(*inputs))

    run.program = program  # type: ignore[attr-defined]
    # the autograd glue starts a backward's kernel compiles while the forward runs
    run.precompile_async = fn.precompile_async  # type: ignore[attr-defined]
    return run


def _needs_grad(graph: S.Graph, example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    ) and records_grad(graph)


def inductor(
    graph: S.Graph, example_inputs: Sequence[Any], *, mode: str = "default", options: dict | None = None
) -> Callable[..., list]:
    """The torchfuse default backend (entry point ``torchfuse.backends: inductor``)."""

    from torchfuse.inductor.user_kernels import mutates_inputs

    if _needs_grad(graph, example_inputs) or mutates_inputs(graph):  # aot writes mutated inputs back
        # channels-last before the joint graph: the saved activations and the backward's
        # convolutions are channels-last too; the layout is decided here, once, so the halves
        # are compiled with the rewrite off (a forward half alone looks like an inference graph)
        graph = layout_pass(graph, default_config.with_options(options).channels_last,
                            training=_needs_grad(graph, example_inputs))
        half_options = {**(options or {}), "channels_last": "never"}

        def comp(g: S.Graph, inputs: Sequence[Any]) -> Callable[..., list]:
            return compiler(g, inputs, mode=mode, options=half_options)

        plan_cache = None
        if default_config.with_options(options).cache:
            from torchfuse.inductor.cache import PlanCache

            plan_cache = PlanCache()  # joint graph + partition, kept on disk like the Programs
        # our compiler reads sizes from the graph, not the examples: the backward can be
        # compiled with the forward, and its kernels built while the forward runs
        fn = aot(graph, comp, comp, cache=plan_cache, compile_backward_early=True)

        def run_aot(*inputs: Any) -> list:
            out = fn(*inputs)
            return list(out) if isinstance(out, list | tuple) else [out]

        return run_aot
    # a graph that writes into its intermediates (``s = x.new_zeros(...); s[:, 1:] = ...``,
    # transformers' ``shift_tokens_right``) is functionalized first: the lowering takes
    # functional graphs only (unfunctionalized, a write through a view was lost and the result
    # was the zeros). `compile_graph` does it on a cache miss only, the Program being cached
    # under the graph as captured: a warm start skips functionalization too
    return compiler(graph, example_inputs, mode=mode, options=options, functionalize=True)
