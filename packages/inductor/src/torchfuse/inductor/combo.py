"""Combo kernels (horizontal fusion): independent small pointwise Triton kernels of one
Program launched as one kernel.

A vision model's forward is many small kernels that share no reads (a bias cast here, a
mask there, the pointwise tails of parallel branches); on a GPU each launch costs host time
(~8 us), and with small tensors the host is the bottleneck. Two passes:

* `plan_combos` (after the schedule) picks the members: pointwise kernels with a static
  domain of at most ``combo_kernels_max_numel`` elements, none reading what another member
  writes, contiguous in the schedule or moved up to the first member without crossing a
  kernel that writes what they read (and without crossing an extern call that touches
  their buffers). At most `MAX_MEMBERS` members and about `MAX_POINTERS` pointers; a member
  moves up across at most `WINDOW` kernels. The members become adjacent groups of the
  Schedule (renumbered), listed in ``Schedule.combos``; `verify_combos` checks the result.
* `combo_kernels` (after codegen) writes one ``@triton.jit`` function per combo from the
  members' own kernels: each member keeps its body, its names prefixed ``k<i>_``, its block
  sizes constexpr parameters of their own; the grid is the sum of the members' grids and a
  chain of ``if pid < end:`` branches runs member ``i`` with its local program id.

Before (two launches)::

    triton_poi_fused_sin_0[(1,)](arg0, buf0, 100, XBLOCK=128)
    triton_poi_fused_cos_1[(2,)](arg1, buf1, 200, XBLOCK=128)

After (one)::

    @triton.jit
    def triton_combo_fused_cos_sin_0(
        k0_in_ptr0, k0_out_ptr0, k0_xnumel,
        k1_in_ptr0, k1_out_ptr0, k1_xnumel,
        k0_XBLOCK: tl.constexpr, k1_XBLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if pid < 1:
            # triton_poi_fused_sin_0: 1 program
            k0_xoffset = pid * k0_XBLOCK
            ...
        elif pid < 3:
            # triton_poi_fused_cos_1: 2 programs
            k1_xoffset = (pid - 1) * k1_XBLOCK
            ...

    triton_combo_fused_cos_sin_0[(3,)](arg0, buf0, 100, arg1, buf1, 200, k0_XBLOCK=128, k1_XBLOCK=128)

Memory: the launch plan (`torchfuse.inductor.plan`) treats a combo as one step: every
member's outputs are allocated before it and the buffers its members read last are freed
after it, so a member's outputs live from the combo's position on (up to `WINDOW` kernels
earlier than alone) and its inputs until the whole combo ran. Members are bounded in number
and in size, which bounds that growth.

Not for the C++ kernels of the CPU (one shared object per Program: no launch to save), nor
for Programs with symbolic sizes (a member's grid must be a number).
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
from dataclasses import dataclass

import msgspec
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.inductor import ir
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.kernel_groups import GroupKind, KernelGroup, Schedule
from torchfuse.inductor.scheduler import ScheduleVerifyError, verify_schedule
from torchfuse.inductor.triton_ops import HELPERS, helper_source

log = logging.getLogger("torchfuse.inductor.schedule")

MAX_MEMBERS = 32
"""The most kernels one combo holds (compile time and register pressure grow with it)."""
MAX_POINTERS = 200
"""The most pointer arguments of one combo kernel."""
WINDOW = 4
"""How many kernels a member may be moved up across to join a combo (how much longer its
outputs live). Measured with `benchmarks/combo_launches.py` (launches, plans' peak MiB):
Swin-T batch 1 bf16 99 launches, 25.3 MiB at 4; 100 and 28.6 MiB (+13%) at 8 and more;
GPT-2 tiny training 31 at 4, 29 at 8; MobileNetV3-small the same at 2 to 16."""


# -------------------------------------------------------------------------- choosing members


def _group_io(g: KernelGroup) -> tuple[set[str], set[str]]:
    """(buffers ``g`` reads from outside itself, buffers it writes)."""
    written = {w for n in g.nodes for w in ir.writes(n)}
    read = {b for n in g.nodes for b in ir.reads(n)} - written
    return read, written


def _candidate(g: KernelGroup, cfg: InductorConfig) -> bool:
    return (g.kind == GroupKind.POINTWISE and g.xnumel.is_Integer
            and 0 < int(g.xnumel) <= cfg.combo_kernels_max_numel)


def _label(g: KernelGroup) -> str:
    return g.nodes[0].name if len(g.nodes) == 1 else f"{g.nodes[0].name}..{g.nodes[-1].name}"


def combos_apply(prog: ir.LoopProgram, cfg: InductorConfig) -> str | None:
    """Why combo kernels are off for ``prog`` under ``cfg``, or None when they apply."""
    if not cfg.combo_kernels:
        return "combo_kernels=False"
    if cfg.cpu_backend == "cpp" and prog.device.split(":")[0] == "cpu":
        return "C++ kernels (one shared object, no launches to save)"
    if prog.symbols or any(not ir.product(b.sizes).is_Integer for b in prog.buffers.values()):
        return "symbolic sizes (a member's grid must be a number)"
    return None


def plan_combos(s: Schedule, prog: ir.LoopProgram, cfg: InductorConfig) -> Schedule:
    """``s`` with small independent pointwise kernels gathered into combos (see the module
    doc): members adjacent, groups renumbered in their new order, ``combos`` set. Returns
    ``s`` itself when nothing combines."""
    off = combos_apply(prog, cfg)
    if off is not None:
        return dataclasses.replace(s, decisions=(*s.decisions, f"combo kernels: off ({off})"))
    groups = s.groups
    io = [_group_io(g) for g in groups]
    taken = [False] * len(groups)
    order: list[int] = []
    combos: list[tuple[int, ...]] = []
    notes: list[str] = []
    for p, first in enumerate(groups):
        if taken[p]:
            continue
        taken[p] = True
        order.append(p)
        if not _candidate(first, cfg):
            continue
        members = [p]
        pointers = len(io[p][0] | io[p][1])
        member_writes = set(io[p][1])
        between_writes: set[str] = set()  # written by kernels that stay between the members
        extern_touches: set[str] = set()  # read or written by extern calls in between
        crossed = 0  # kernels that stay between the members (a member moves up across them)
        for q in range(p + 1, len(groups)):
            if taken[q]:  # moved into an earlier combo: it runs before ``p`` now
                continue
            if crossed > WINDOW:
                break
            g, (reads, writes) = groups[q], io[q]
            why = None
            if not _candidate(g, cfg):
                pass
            elif reads & member_writes:
                why = f"reads {sorted(reads & member_writes)[0]}, written by a member"
            elif reads & between_writes:
                why = f"reads {sorted(reads & between_writes)[0]}, written after the combo starts"
            elif (reads | writes) & extern_touches:
                why = f"shares {sorted((reads | writes) & extern_touches)[0]} with an extern call in between"
            elif pointers + len(reads | writes) > MAX_POINTERS:
                why = f"the combo would pass more than {MAX_POINTERS} pointers"
            else:
                members.append(q)
                taken[q] = True
                pointers += len(reads | writes)
                member_writes |= writes
                if len(members) == MAX_MEMBERS:
                    break
                continue
            if why is not None:
                notes.append(f"{_label(g)} not combined with {_label(first)}: {why}")
            crossed += g.kind != GroupKind.VIEW  # a view costs nothing to move across
            between_writes |= writes
            if g.kind == GroupKind.EXTERN:
                extern_touches |= reads | writes
        if len(members) > 1:
            order += members[1:]
            combos.append(tuple(members))
    if not combos:
        return dataclasses.replace(s, decisions=(*s.decisions, *notes))
    position = {old: new for new, old in enumerate(order)}
    new_groups = tuple(dataclasses.replace(groups[old], index=new) for new, old in enumerate(order))
    new_combos = tuple(tuple(position[m] for m in c) for c in combos)
    said = [f"combo {k}: {len(c)} pointwise kernels in one launch: {', '.join(_label(groups[m]) for m in c)}"
            for k, c in enumerate(combos)]
    return verify_combos(Schedule(new_groups, (*s.decisions, *notes, *said), new_combos), prog)


def verify_combos(s: Schedule, prog: ir.LoopProgram) -> Schedule:
    """Check a schedule's combos; returns it unchanged. The order is a valid schedule
    (`verify_schedule`: every read after its write); each combo is a run of adjacent
    static pointwise kernels, at most `MAX_MEMBERS`, none reading what another writes, and
    no kernel is in two combos."""
    verify_schedule(s, prog)
    seen: set[int] = set()
    for c in s.combos:
        if not 2 <= len(c) <= MAX_MEMBERS or list(c) != list(range(c[0], c[0] + len(c))):
            raise ScheduleVerifyError(f"combo {c} is not a run of 2 to {MAX_MEMBERS} adjacent kernels")
        if seen & set(c):
            raise ScheduleVerifyError(f"kernels {sorted(seen & set(c))} are in two combos")
        seen |= set(c)
        io = {i: _group_io(s.groups[i]) for i in c}
        for i in c:
            g = s.groups[i]
            if g.index != i or g.kind != GroupKind.POINTWISE or not g.xnumel.is_Integer:
                raise ScheduleVerifyError(f"combo {c}: kernel {i} is not a static pointwise kernel")
            for j in c:
                if i != j and io[i][0] & io[j][1]:
                    raise ScheduleVerifyError(
                        f"combo {c}: kernel {i} reads {sorted(io[i][0] & io[j][1])}, written by kernel {j}")
    return s


# ------------------------------------------------------------------------- writing the kernel


@dataclass(frozen=True, slots=True)
class _Member:
    kernel: S.Kernel
    config: S.LaunchConfig
    function: ast.FunctionDef
    helpers: frozenset[str]
    """The module-level helpers it calls (`triton_ops.HELPERS`, by name)."""
    programs: int
    body: tuple[str, ...]
    """The lines of the entry function's body, as generated."""
    names: frozenset[str]
    """Its parameters and the names it assigns: the ones a combo prefixes."""


def _is_program_id(node: ast.AST, axis: int | None = None) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("program_id", "num_programs")
            and (axis is None or (node.func.attr == "program_id" and len(node.args) == 1
                                  and isinstance(node.args[0], ast.Constant) and node.args[0].value == axis)))


def _member(kernel: S.Kernel) -> _Member | str:
    """``kernel`` parsed as a combo member, or why it cannot be one. A member's body is
    straight-line code (assignments to one name, calls), which `_body_lines` renames line by
    line."""
    if kernel.language != "triton" or kernel.meta.get("kind") != GroupKind.POINTWISE.value:
        return "not a Triton pointwise kernel"
    if len(kernel.configs) != 1:
        return f"{len(kernel.configs)} launch configs to tune"
    config = kernel.configs[0]
    if any(p.kind != "ptr" and p.name not in ("xnumel", "numel") for p in kernel.signature):
        return "size arguments besides its element count"
    env = {**{k: v for k, v in kernel.constexprs.items() if isinstance(v, int)}, **config.meta}
    try:
        grid = [evaluate(g, env) for g in kernel.grid]
    except Exception as e:
        return f"grid {kernel.grid} is not a number ({e})"
    if any(int(g) != 1 for g in grid[1:]):
        return f"a {len(grid)}-d grid"
    module = ast.parse(kernel.source)
    functions = {f.name: f for f in module.body if isinstance(f, ast.FunctionDef)}
    fn = functions.pop(kernel.entry or kernel.name, None)
    if fn is None:
        return "no entry function"
    fixed = {**kernel.constexprs, **config.meta}
    runtime = [a.arg for a in fn.args.args if a.arg not in fixed]
    if runtime != [p.name for p in kernel.signature] or fn.args.defaults or fn.args.vararg:
        return "its parameters are not its signature followed by its block sizes"
    others = [n for n in module.body if not isinstance(n, ast.FunctionDef | ast.Import | ast.ImportFrom)]
    if not set(functions) <= set(HELPERS) or others:
        return "module-level code besides our helpers"
    names = {a.arg for a in fn.args.args}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            names.add(stmt.targets[0].id)
        elif not isinstance(stmt, ast.Expr):
            return f"a {type(stmt).__name__} statement (not straight-line code)"
    texts = set()
    for n in ast.walk(fn):
        if _is_program_id(n) and not _is_program_id(n, 0):
            return "reads program ids other than axis 0"
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            texts.add(n.value)
    if texts & names:
        return "a string constant that names one of its variables"
    lines = kernel.source.splitlines()[fn.body[0].lineno - 1 : fn.end_lineno]
    return _Member(kernel, config, fn, frozenset(functions), int(grid[0]), tuple(lines), frozenset(names))


_ASSIGN = re.compile(r"(\s*)(\w+)(\s*=(?!=).*)")
_PROGRAM_ID = re.compile(r"\btl\.program_id\(0\)")


def _body_lines(m: _Member, k: int, start: int) -> list[str]:
    """``m``'s body inside the combo, as generated but four spaces deeper: its names prefixed
    ``k<k>_`` (not attributes, not keyword arguments), ``tl.program_id(0)`` its local program
    id ``pid - start``."""
    prefix = f"k{k}_"
    word = re.compile(r"(?<![\w.])(" + "|".join(sorted(m.names, key=len, reverse=True)) + r")\b(?!\s*=(?!=))")
    pid = f"(pid - {start})" if start else "pid"
    out = []
    for line in m.body:
        head, rest = "", line
        assign = _ASSIGN.match(line)
        if assign and assign.group(2) in m.names:  # the target, which the keyword rule would skip
            head, rest = assign.group(1) + prefix + assign.group(2), assign.group(3)
        # names first: the program id's text names the combo's own ``pid``
        rest = _PROGRAM_ID.sub(pid, word.sub(lambda w: prefix + w.group(1), rest))
        out.append("    " + head + rest)
    return out


def _combo_name(origins: set[str], first: int) -> str:
    return f"triton_combo_fused_{'_'.join(sorted(origins)[:8]) or 'kernels'}_{first}"


def combine(members: list[_Member], name: str) -> S.Kernel | None:
    """One combo kernel named ``name`` running ``members`` in order; None when they are fewer
    than two, or past `MAX_MEMBERS` or `MAX_POINTERS`."""
    if len(members) < 2 or len(members) > MAX_MEMBERS:
        return None
    if sum(p.kind == "ptr" for m in members for p in m.kernel.signature) > MAX_POINTERS:
        return None
    params: list[S.KernelParam] = []
    constexprs: dict[str, object] = {}
    meta: dict[str, int] = {}
    head: list[str] = []  # one line of runtime parameters per member
    tail: list[str] = []  # the block sizes, after them
    body: list[str] = ["    pid = tl.program_id(0)"]
    helpers: set[str] = set()
    start = 0
    for k, m in enumerate(members):
        p = f"k{k}_"
        params += [msgspec.structs.replace(q, name=p + q.name) for q in m.kernel.signature]
        head.append(", ".join(p + q.name for q in m.kernel.signature))
        constexprs |= {p + c: v for c, v in m.kernel.constexprs.items()}
        meta |= {p + c: v for c, v in m.config.meta.items()}
        tail += [f"{p}{a.arg}: tl.constexpr" for a in m.function.args.args
                 if a.arg in m.kernel.constexprs or a.arg in m.config.meta]
        helpers |= m.helpers
        end = start + m.programs
        plural = "" if m.programs == 1 else "s"
        body += [f"    {'if' if k == 0 else 'elif'} pid < {end}:",
                 f"        # {m.kernel.name}: {m.programs} program{plural}", *_body_lines(m, k, start)]
        start = end
    # helpers are module-level @triton.jit functions of our own table: their source again
    src = ["import triton", "import triton.language as tl", *helper_source(helpers)]
    blocks = [", ".join(tail[i : i + 4]) for i in range(0, len(tail), 4)]
    src += ["", "", "@triton.jit", f"def {name}(", *(f"    {line}," for line in head + blocks), "):"]
    src += [*body, ""]
    config = S.LaunchConfig(meta=meta, num_warps=max(m.config.num_warps for m in members),
                            num_stages=max(m.config.num_stages for m in members))
    return S.Kernel(
        name=name,
        source="\n".join(src),
        entry=name,
        signature=tuple(params),
        constexprs=constexprs,
        configs=(config,),
        grid=(start, 1, 1),
        meta={
            "kind": "combo",
            "members": ",".join(m.kernel.name for m in members),
            "nodes": ",".join(m.kernel.meta.get("nodes", "") for m in members),
        },
    )


def combo_kernels(s: Schedule, kernels: dict[int, S.Kernel]) -> dict[tuple[int, ...], S.Kernel]:
    """The combo kernel of each of ``s.combos`` (keyed by the group indices it runs); a
    member whose kernel cannot be one (`_member`) is left out of its combo and launched on
    its own, which is valid anywhere in the combo's run of groups (members are independent)."""
    out: dict[tuple[int, ...], S.Kernel] = {}
    for c in s.combos:
        members = {i: _member(kernels[i]) for i in c}
        for i, why in members.items():
            if isinstance(why, str):
                log.info("%s left out of its combo, launched alone: %s", kernels[i].name, why)
        ok = tuple(i for i in c if isinstance(members[i], _Member))
        if len(ok) < 2:
            continue
        origins = {o for i in ok for n in s.groups[i].nodes for o in getattr(n, "origins", ())}
        kernel = combine([members[i] for i in ok], _combo_name(origins, ok[0]))  # type: ignore[misc]
        if kernel is not None:
            out[ok] = kernel
    return out


__all__ = ["MAX_MEMBERS", "MAX_POINTERS", "WINDOW", "combine", "combo_kernels", "combos_apply", "plan_combos",
           "verify_combos"]
