"""What a schedule is: kernels as groups of loop-IR nodes, their domains, and where each node sits.

`torchfuse.inductor.scheduler` builds a `Schedule`; the code generators (Triton and C++),
tiling, combo kernels and the launch plan read it. A kernel iterates over a domain
``(xnumel, rnumel)`` with index variables `XI` and `RI`; each node has a `Role` in it and a
`Placement` (its loop-variable substitution and loop phase).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy
from torchfuse.inductor import ir

XI = sympy.Symbol("xindex", integer=True, nonnegative=True)
RI = sympy.Symbol("rindex", integer=True, nonnegative=True)


class Role(enum.Enum):
    FULL = "full"
    ROW = "row"
    REDUCE = "reduce"


class GroupKind(enum.Enum):
    POINTWISE = "poi"
    PERSISTENT = "per"
    LOOPED = "red"
    EXTERN = "extern"
    VIEW = "view"


KERNEL_KINDS = frozenset({GroupKind.POINTWISE, GroupKind.PERSISTENT, GroupKind.LOOPED})


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a node sits in its kernel: role, loop-variable substitution, loop phase."""

    role: Role
    varmap: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    phase: int = 0
    """For FULL/REDUCE: which pass over the row computes it; for ROW: after which pass (-1:
    before the first)."""
    online_with: str | None = None
    """For ``sum(exp(v - max(v)))``: the max reduction it is computed with in one pass
    (online softmax: the running sum is rescaled whenever the running max grows)."""


@dataclass(frozen=True, slots=True)
class KernelGroup:
    index: int
    kind: GroupKind
    nodes: tuple[ir.Node, ...]
    xnumel: sympy.Expr = sympy.S.One
    rnumel: sympy.Expr = sympy.S.One
    placements: tuple[tuple[str, Placement], ...] = ()
    stores: frozenset[str] = frozenset()
    """Buffers the kernel writes to memory (the others live only in registers)."""
    phases: int = 1
    outer: bool = False
    """A reduction over a strided (leading) dim: launched with wide ``XBLOCK`` tiles."""
    fits: int = 0
    """A looped reduction over a symbolic row length: rows of at most ``fits`` elements (the
    hint's power of two) take a persistent path in the same kernel, longer rows the loop.
    0: no such path."""
    by_name: Mapping[str, Placement] = field(init=False, repr=False, compare=False)
    """`placements` by node name (built once)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", dict(self.placements))

    def placement(self, name: str) -> Placement:
        return self.by_name[name]


@dataclass(frozen=True, slots=True)
class Schedule:
    groups: tuple[KernelGroup, ...]
    """In execution order."""
    decisions: tuple[str, ...] = ()
    """Why each node joined its kernel, or why it did not join a kernel it could have shared
    reads with (``fusion.txt``, and the ``schedule`` log channel)."""
    combos: tuple[tuple[int, ...], ...] = ()
    """Runs of adjacent pointwise groups launched as one combo kernel, by group index
    (`torchfuse.inductor.combo`; empty until its ``plan_combos`` pass)."""


__all__ = ["KERNEL_KINDS", "RI", "XI", "GroupKind", "KernelGroup", "Placement", "Role", "Schedule"]
