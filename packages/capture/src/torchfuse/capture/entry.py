"""One compiled entry of a function: what runs when its guards hold.

An `Entry` holds one `CaptureResult` with its generated functions: ``gather`` (the flat
graph inputs, read through their sources on every call: arguments, module parameters and
buffers fetched once per module version, constants, the carriers of scalar symbols),
the side-effect replay and the rebuild of the return value, or the `BreakRunner` that
continues after a graph break. The cache of entries, the misses and recompiles live in
`torchfuse.capture.compiler`.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torchfuse.capture.guards import module_version
from torchfuse.capture.output import compile_side_effects, compile_spec
from torchfuse.capture.resume import BreakRunner

if TYPE_CHECKING:
    from torchfuse.capture.context import InputSlot
    from torchfuse.capture.convert import CaptureResult


class Entry:
    """One compiled specialization of a function (or of a resume function)."""

    def __init__(self, result: CaptureResult, compiled: Callable[..., list[Any]] | None,
                 owner: Any = None) -> None:
        self.result = result
        self.compiled = compiled
        self.fast = result.checks.fast
        self.module_check = result.checks.module
        self.version = module_version[0]
        self.eager = result.error is not None and result.plan is None
        self.params: list[Any] = []
        self.breaker: BreakRunner | None = None
        self.routed: types.CodeType | None = None
        """For an eager entry whose break was inside a call: the frame's code with that call
        routed through capture (`codegen.routed_eager_code`)."""
        if not self.eager:
            ns = dict(result.checks.namespace)
            self.gather, self.fetch_params = _gather_functions(result.inputs, ns)
            self.replay = compile_side_effects(result.side_effects, ns)
            if result.plan is not None:
                self.breaker = BreakRunner(result.plan, ns, owner)
                self.single = False
            else:
                self.rebuild = compile_spec(result.out_spec, ns)
                self.single = result.out_spec[0] == "t" and self.replay is None

    def revalidate(self, L: Any, G: Any, C_: Any) -> bool:
        """Module attributes changed somewhere: check this entry's module guards again."""
        if not self.module_check(L, G, C_):
            return False
        if not self.eager:
            self.params = self.fetch_params(L, G, C_)
        self.version = module_version[0]
        return True

    def run(self, L: Any, G: Any, C_: Any) -> Any:
        if self.breaker is not None:
            grad = torch.is_grad_enabled()
            try:
                outs = self.compiled(*self.gather(L, G, C_, self.params))
            except BaseException:
                torch.set_grad_enabled(grad)
                raise
            torch.set_grad_enabled(self.result.plan.grad_enabled)
            if self.replay is not None:
                self.replay(outs, L, G, C_)
            return self.breaker(outs, L, G, C_)
        outs = self.compiled(*self.gather(L, G, C_, self.params))
        if self.single:
            return outs[self.result.out_spec[1]]
        if self.replay is not None:
            self.replay(outs, L, G, C_)
        return self.rebuild(outs, L, G, C_)


def _gather_functions(slots: list[InputSlot], ns: dict[str, Any]) -> tuple[Callable, Callable]:
    """``gather(L, G, C, P)`` -> flat graph inputs; ``fetch(L, G, C)`` -> module tensors P."""
    items: list[str] = []
    module_exprs: list[str] = []
    for n, slot in enumerate(slots):
        if slot.source is None:
            ns[f"_c{n}"] = slot.constant
            items.append(f"_c{n}")
        elif slot.source.is_module_state:
            items.append(f"P[{len(module_exprs)}]")
            module_exprs.append(slot.source.expr())
        else:
            items.append(slot.source.expr())
    src = (f"def gather(L, G, C, P):\n    return ({''.join(i + ', ' for i in items)})\n"
           f"def fetch(L, G, C):\n    return [{', '.join(module_exprs)}]\n")
    exec(builtins.compile(src, "<torchfuse inputs>", "exec"), ns)
    return ns["gather"], ns["fetch"]



def counts_as_graph(result: CaptureResult) -> bool:
    """A graph with ops counts; so does a whole function captured without a break, even
    with no ops. An empty piece around a break does not (nothing runs there)."""
    if result.graph is None:
        return False
    return bool(result.graph.nodes) or (result.error is None and not result.part)


__all__ = ["Entry", "counts_as_graph"]
