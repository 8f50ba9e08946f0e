"""What the kernel writers of every target share (`codegen` for Triton, `cpp_codegen` for
C++): the temporaries they name, a kernel's pointer parameters, its index expressions and its
name. Each target adds how it declares values, loops and reductions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.kernel_groups import RI, XI, KernelGroup

SCALAR, ROWS, FULL = 0, 1, 2
"""How a value varies inside a kernel: not at all, per row (x), per element (x and r)."""


@dataclass
class Tmp:
    """A value of the kernel being written: its name (or text), its shape, its dtype."""

    name: str
    shape: int
    dtype: str


class KernelWriterBase:
    """The state and the helpers every target's kernel writer starts from."""

    PREFIX = "kernel"
    """The first word of a kernel's name (``triton``, ``cpp``)."""
    INDENT = "    "
    print_index: Callable[..., str] = staticmethod(ir.print_index)
    """An index expression in the target's syntax: ``print_index(expr, names)``."""

    def __init__(self, group: KernelGroup, prog: ir.LoopProgram, config: InductorConfig) -> None:
        self.g = group
        self.prog = prog
        self.config = config
        self.members = {n.name: n for n in group.nodes}
        self.params: dict[str, str] = {}  # buffer -> pointer param
        self.lines: list[str] = []
        self.indent = 1
        self.row_values: dict[str, Tmp] = {}
        self.helpers: set[str] = set()
        self.count = 0
        self.size_syms: set[sympy.Symbol] = set()
        self.bounds = {XI: group.xnumel, RI: group.rnumel}
        self.loop_at: int | None = None

    def line(self, text: str) -> None:
        self.lines.append(self.INDENT * self.indent + text)

    def ptr(self, buf: str, out: bool) -> str:
        if buf not in self.params:
            k = sum(1 for p in self.params.values() if p.startswith("out" if out else "in"))
            self.params[buf] = f"{'out' if out else 'in'}_ptr{k}"
        return self.params[buf]

    def index(self, e: sympy.Expr, placement, extra: dict | None = None) -> tuple[str, int]:
        """``e`` in the kernel's variables, printed, and its shape; the size symbols it reads
        become kernel arguments."""
        e = ir.simplify_index(ir.substitute(e, placement.varmap), self.bounds)
        names = {XI: "xindex", RI: "rindex", **(extra or {})}
        free = ir.free_symbols(e)
        for s in free:
            if s not in names and not s.name.startswith("ind"):
                self.size_syms.add(s)
        shape = FULL if RI in free else ROWS if XI in free else SCALAR
        return self.print_index(e, names), shape

    def name(self) -> str:
        origins = sorted({o for n in self.g.nodes for o in getattr(n, "origins", ())})
        fused = "_".join(origins[:8]) or "kernel"
        return f"{self.PREFIX}_{self.g.kind.value}_fused_{fused}_{self.g.index}"


__all__ = ["FULL", "ROWS", "SCALAR", "KernelWriterBase", "Tmp"]
