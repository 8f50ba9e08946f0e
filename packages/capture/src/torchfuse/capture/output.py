"""Finishing a capture: graph outputs, the output structure, and side effects to replay.

The return value is flattened into a *spec* (nested tuples, below) whose tensor leaves are
graph outputs. Side effects (mutations of lists/dicts that outlive the frame, attribute
writes, global writes) become replay operations over the same outputs, run after the graph
in program order.

Spec grammar::

    ("t", i)                       the graph's i-th output
    ("np", i, scalar)              the graph's i-th output as an ndarray (a traced numpy array),
                                   or as a numpy scalar (``np.float32``) when ``scalar``
    ("tv", i, expr, detach, cls)   the graph's i-th output as eager returns it: the caller's own
                                   object ``expr`` when the function returns an input (``x.add_(1);
                                   return x``), detached when capture saw it not requiring grad
                                   (made in a ``no_grad`` region), as tensor subclass ``cls``
    ("c", value)                   a Python constant
    ("s", expr)                    an object from the caller's world, by source expression
    ("e", expr)                    a size computed from the call's inputs (``L[0].size(0)*2``):
                                   symbolic sizes are never baked in as constants
    ("seq", cls, [spec, ...])      list / tuple / namedtuple / structseq
    ("dict", cls, keys, [spec])    dict
    ("obj", cls, {name: spec})     an instance of a user class created inside the frame
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import Capture
from torchfuse.capture.dynamic import concrete, contains_symbolic, read_expr
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.source import LocalSource
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED

Spec = tuple


class OutputBuilder:
    """Turns Vars into specs, adding graph outputs for their tensors."""

    tensor_fixups = True
    """Whether tensor leaves may be ``"tv"`` specs (values live at a break stay plain)."""

    def __init__(self, ctx: Capture) -> None:
        self.ctx = ctx
        self.index: dict[int, int] = {}
        self.count = 0
        self.grad_regions = any(n.op == SET_GRAD_ENABLED for n in ctx.rec.builder.nodes)

    def spec(self, var: V.Var) -> Spec:
        if isinstance(var, V.TracedArrayVar):  # an ndarray again at the graph's edge
            key = id(var.fake)
            if key not in self.index:
                self.ctx.rec.output(var.fake)
                self.index[key] = self.count
                self.count += 1
            return ("np", self.index[key], var.scalar)
        if isinstance(var, V.TensorVar):
            key = id(var.fake)
            if key not in self.index:
                if self.ctx.made_leaves and var.fake.requires_grad and _grad_only_from_made_leaves(
                        var.fake, self.ctx.made_leaves):
                    raise Unsupported("a result requires grad only through a tensor the function made "
                                      "require grad (eager gives it a gradient; the graph cannot)",
                                      self.ctx.loc)
                self.ctx.rec.output(var.fake)
                self.index[key] = self.count
                self.count += 1
            return self._tensor_spec(var, self.index[key])
        if isinstance(var, V.ConstVar):
            if var.source is not None and not rewritten(var.source.expr(), _targets(self.ctx.side_effects)):
                return ("s", var.source.expr())  # the caller's value, read again: no guard baked in
            if var.source is not None:  # a write replayed before it is read changed its place
                return ("c", var.python())
            if isinstance(var, V.FloatArgVar):  # computed from varying numbers: guards them
                return ("c", var.python())
            if contains_symbolic(var.value):
                return self.size_spec(var.value)
            return ("c", var.value)
        if var.source is not None and (isinstance(var, V.DictVar | V.SetVar) or
                                       (isinstance(var, V.ListVar) and not var.is_tuple)):
            return ("s", var.source.expr())  # the caller's own (possibly mutated) container
        if isinstance(var, V.ListVar):
            from torchfuse.capture.stdlib import rebuild_sequence_kind

            return ("seq", rebuild_sequence_kind(var), [self.spec(i) for i in var.items])
        if isinstance(var, V.DictVar):
            from torchfuse.capture.stdlib import rebuild_kind

            return ("dict", rebuild_kind(var), list(var.items), [self.spec(v) for v in var.items.values()])
        if isinstance(var, V.SetVar):
            return ("c", var.python())
        if isinstance(var, V.UserObjVar) and var.is_new:
            return ("obj", type(var.value), {k: self.spec(v) for k, v in var.overrides.items()})
        if var.source is not None:
            return ("s", var.source.expr())
        if isinstance(var, V.ObjVar):
            return ("c", var.value)
        if isinstance(var, V.ModuleVar):
            return ("c", var.value)
        raise Unsupported(f"returning {var.describe()} from a compiled function", self.ctx.loc)

    def _tensor_spec(self, var: V.TensorVar, i: int) -> Spec:
        if not self.tensor_fixups:
            return ("t", i)
        # an input (or parameter, or global tensor) returned as it is: eager returns that very
        # object, mutated in place or not, so the caller's identity checks and ``_base`` hold
        same = var.source.expr() if var.source is not None else None
        # backends decide requires_grad from the grad mode at entry; inside a grad-mode region
        # capture's fakes know better (autograd ran on them)
        detach = same is None and self.grad_regions and not var.fake.requires_grad
        cls = var.py_type if same is None and var.py_type is not torch.Tensor and \
            not issubclass(var.py_type, torch.nn.Parameter) else None
        if same is None and not detach and cls is None:
            return ("t", i)
        return ("tv", i, same, detach, cls)

    def size_spec(self, value: Any) -> Spec:
        """A value holding symbolic sizes: each ``SymInt`` computed from the inputs on every
        call; a ``SymBool``/``SymFloat`` (or a value with no spec, a slice) specialized."""
        if isinstance(value, torch.SymInt) and contains_symbolic(value):
            return ("e", read_expr(value, self.ctx.symbol_reads))
        if type(value) in (tuple, list, torch.Size):
            return ("seq", type(value), [self.size_spec(v) for v in value])
        return ("c", concrete(value))

    def side_effects(self) -> list[tuple]:
        """The replay ops of the side effects, in order; `effect_notes` says, per op,
        what it changes, where, and whether it leaves things as they were at capture time."""
        ops: list[tuple] = []
        self.effect_notes: list[EffectNote] = []
        last_write = {(id(e[1]), e[2]): n for n, e in enumerate(self.ctx.side_effects) if e[0] == "setattr"}
        written: set[str] = set()  # attributes an earlier replayed write has changed
        candidates: list[tuple[int, int, tuple[int, str], str]] = []  # (op, effect, key, place)
        op_of: dict[int, int] = {}  # effect index -> its op's index
        for n, effect in enumerate(self.ctx.side_effects):
            op_of[n] = len(ops)
            kind, loc = effect[0], effect[-1]
            if kind == "contents":
                var = effect[1]
                if isinstance(var.source, LocalSource) and var.source.index in self.ctx.fresh_locals:
                    continue  # a **kwargs dict: made anew by each call, unseen outside
                ops.append(("contents", var.source.expr(), self.spec(_fresh_copy(var))))
                self.effect_notes.append(EffectNote(f"contents of {var.source.expr()}", loc, False))
            elif kind == "setattr":
                _, obj, name, value, _ = effect
                if last_write[(id(obj), name)] != n and _plain_attribute(obj, name):
                    candidates.append((len(ops), n, (id(obj), name), f"{obj.source.expr()}.{name}"))
                ops.append(("setattr", obj.source.expr(), name, self._effect_value(value, written),
                            _plain_store(obj)))
                written.add(f"{obj.source.expr()}.{name}")
                same = last_write[(id(obj), name)] != n or _unchanged(obj, name, value)
                self.effect_notes.append(EffectNote(f"{obj.source.expr()}.{name} = {value.describe()}",
                                                    loc, same))
            elif kind == "setglobal":
                _, name, value, _ = effect
                ops.append(("setglobal", name, self._effect_value(value, written)))
                written.add(f"G[{name!r}]")
                self.effect_notes.append(EffectNote(f"global {name} = {value.describe()}", loc, False))
        drop = _replaced_writes(self.ctx.side_effects, ops, op_of, candidates, last_write)
        self.effect_notes = [note for i, note in enumerate(self.effect_notes) if i not in drop]
        return [op for i, op in enumerate(ops) if i not in drop]


    def _effect_value(self, value: V.Var, written: set[str]) -> Spec:
        """A written value's spec. A constant read from outside is normally read again at
        replay (no guard); when an earlier replayed write changed where it is read from
        (``token = self.var; self.var = new; ...; self.var = token``), it is the value read
        at capture, guarded, since at replay time that place already holds the new value."""
        if isinstance(value, V.ConstVar) and value.source is not None:
            if rewritten(value.source.expr(), written):
                return ("c", value.python())
            return ("s", value.source.expr())
        return self.spec(value)


def _grad_only_from_made_leaves(fake: torch.Tensor, made: Mapping[int, torch.Tensor]) -> bool:
    """Whether every leaf ``fake``'s gradient reaches is a tensor made to require grad inside
    the function (or ``fake`` is one): autograd recorded the fakes' history, so walk it."""
    if fake.grad_fn is None:
        return id(fake) in made
    todo, seen = [fake.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # AccumulateGrad
        if leaf is not None and id(leaf) not in made:
            return False
        todo.extend(n for n, _ in node.next_functions)
    return True


def _targets(effects: list[tuple]) -> set[str]:
    """Where the side effects write: ``G['S'].a`` for an attribute, ``G['n']`` for a global,
    the container's source for its contents."""
    out: set[str] = set()
    for e in effects:
        if e[0] == "setattr" and e[1].source is not None:
            out.add(f"{e[1].source.expr()}.{e[2]}")
        elif e[0] == "setglobal":
            out.add(f"G[{e[1]!r}]")
        elif e[0] == "contents" and e[1].source is not None:
            out.add(e[1].source.expr())
    return out


def rewritten(src: str, targets: set[str]) -> bool:
    """Whether the value read through ``src`` lives where one of ``targets`` is written."""
    return any(src == w or src.startswith((w + ".", w + "[")) for w in targets)


def _reads(spec: Any) -> list[str]:
    """The source expressions a replay op or spec reads (its ``("s", expr)`` parts)."""
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "s" and isinstance(spec[1], str):
        return [spec[1]]
    if isinstance(spec, tuple | list):
        return [r for part in spec for r in _reads(part)]
    return []


def _plain_attribute(obj: V.Var, name: str) -> bool:
    """Whether a write of ``obj.<name>`` is a plain store: an object read through a source,
    whose class has no ``__setattr__`` of its own and no descriptor for the name."""
    real = getattr(obj, "value", None)
    cls = type(real)
    if real is None or obj.source is None or cls.__setattr__ is not object.__setattr__:
        return False
    raw = inspect.getattr_static(cls, name, None)
    return raw is None or not hasattr(type(raw), "__set__")  # a property, a slot, a descriptor


def _replaced_writes(effects: list[tuple], ops: list[tuple], op_of: dict[int, int],
                     candidates: list[tuple[int, int, tuple[int, str], str]],
                     last_write: dict[tuple[int, str], int]) -> set[int]:
    """The ops of the attribute writes left out of the replay: a write a later write to the
    same attribute of the same object replaces (a context variable set and reset around a
    call: only the reset is replayed), when its store runs no code (`_plain_attribute`) and
    between it and that last write no effect changes what the object's source reads through
    or writes under the attribute (a later ``obj.name.x = …`` needs the value the attribute
    had then) and no op reads the attribute at replay (`_reads`). Per attribute, the last
    effect and op that would forbid it are found once, scanning back from its last write: a
    write after both is left out (each write scanning its own window cost 168 ms of capture
    for 64 set/reset pairs)."""
    if not candidates:
        return set()
    where = [_effect_place(e) for e in effects]  # (target read, place written), once each
    reads: dict[int, list[str]] = {}
    bounds: dict[tuple[int, str], tuple[int, int]] = {}
    drop: set[int] = set()
    for i, n, key, place in candidates:
        if key not in bounds:
            last, base = last_write[key], effects[n][1].source.expr()
            bad_effect = next((k for k in range(last, -1, -1) if where[k] is None or
                               rewritten(base, {where[k][1]}) or
                               (where[k][0] is not None and rewritten(where[k][0], {place}))), -1)
            bad_op = -1
            for j in range(op_of[last], -1, -1):
                if j not in reads:
                    reads[j] = _reads(ops[j])
                if any(rewritten(r, {place}) for r in reads[j]):
                    bad_op = j
                    break
            bounds[key] = (bad_effect, bad_op)
        bad_effect, bad_op = bounds[key]
        if bad_effect <= n and bad_op <= i:
            drop.add(i)
    return drop


def _effect_place(e: tuple) -> tuple[str | None, str] | None:
    """What an effect's target reads through and the place it writes (``G['n']`` for a
    global); ``None`` for a write to something of no source."""
    if e[0] == "setglobal":
        return None, f"G[{e[1]!r}]"
    target = e[1].source
    if target is None:
        return None
    return target.expr(), f"{target.expr()}.{e[2]}" if e[0] == "setattr" else target.expr()


def _plain_store(obj: Any) -> bool:
    """Whether an attribute write is replayed as ``object.__setattr__``: on a user object whose
    class has its own ``__setattr__`` in Python, capture interpreted that method, and what it
    recorded are the stores it made (a frozen dataclass's ``object.__setattr__`` calls)."""
    return isinstance(obj, V.UserObjVar) and isinstance(
        inspect.getattr_static(type(obj.value), "__setattr__", None), types.FunctionType)


@dataclasses.dataclass(frozen=True)
class EffectNote:
    """One side effect: what it changes, where the code does it, and ``noop``: whether, for
    the values seen at capture, replaying it changes nothing (a later write to the same
    attribute, or the final value is the one the attribute had)."""

    what: str
    loc: Any
    noop: bool


def _unchanged(obj: V.Var, name: str, value: V.Var) -> bool:
    real = getattr(obj, "value", None)
    state = getattr(real, "__dict__", None)
    if not isinstance(value, V.ConstVar) or not isinstance(state, dict) or name not in state:
        return False
    before = state[name]
    return V.is_constant(before) and type(before) is type(value.value) and before == value.value


def _fresh_copy(var: V.Var) -> V.Var:
    """The final contents of a mutated container, as a new (source-less) container."""
    if isinstance(var, V.ListVar):
        return V.ListVar(var.items, var.kind)
    if isinstance(var, V.DictVar):
        return V.DictVar(var.items, kind=var.kind)
    if isinstance(var, V.SetVar):
        return V.SetVar(list(var.items.values()))
    return var


def compile_spec(spec: Spec, namespace: dict[str, Any]) -> Callable[[list[Any], Any, Any, Any], Any]:
    """A function ``(outputs, L, G, C) -> value`` that rebuilds ``spec`` (generated once)."""
    consts: list[Any] = []

    def expr(s: Spec) -> str:
        tag = s[0]
        if tag == "t":
            return f"O[{s[1]}]"
        if tag == "np":
            return f"O[{s[1]}].numpy()" + ("[()]" if s[2] else "")
        if tag == "tv":
            if s[2] is not None:
                return s[2]
            out = f"_detach(O[{s[1]}])" if s[3] else f"O[{s[1]}]"
            if s[4] is not None:
                consts.append(s[4])
                out = f"_as_subclass({out}, _K[{len(consts) - 1}])"
            return out
        if tag == "c":
            if s[1] is None or isinstance(s[1], bool | int | str):
                return repr(s[1])
            consts.append(s[1])
            return f"_K[{len(consts) - 1}]"
        if tag in ("s", "e"):
            return s[1] if tag == "s" else f"({s[1]})"
        if tag == "seq":
            items = ", ".join(expr(i) for i in s[2])
            if s[1] is tuple:
                return f"({items}{',' if len(s[2]) == 1 else ''})"
            if s[1] is list:
                return f"[{items}]"
            consts.append(s[1])
            if hasattr(s[1], "_make"):
                return f"_K[{len(consts) - 1}]._make(({items}{',' if len(s[2]) == 1 else ''}))"
            if V.is_tuple_subclass(s[1]):  # made as tuple.__new__ made it, not by calling it again
                consts[-1] = functools.partial(tuple.__new__, s[1])
            return f"_K[{len(consts) - 1}](({items}{',' if len(s[2]) == 1 else ''}))"
        if tag == "dict":
            consts.append(s[2])
            kidx = len(consts) - 1
            pairs = ", ".join(f"_K[{kidx}][{n}]: {expr(v)}" for n, v in enumerate(s[3]))
            if s[1] is not dict:  # a dict subclass (a dataclass record: keyword construction)
                consts.append(s[1])
                return f"_mapping(_K[{len(consts) - 1}], {{{pairs}}})"
            return "{" + pairs + "}"
        if tag == "obj":
            consts.append(s[1])
            cidx = len(consts) - 1
            attrs = ", ".join(f"{k!r}: {expr(v)}" for k, v in s[2].items())
            return f"_new(_K[{cidx}], {{{attrs}}})"
        raise AssertionError(s)

    body = expr(spec)
    src = f"def rebuild(O, L, G, C):\n    return {body}\n"
    ns = dict(namespace)
    ns["_K"] = consts
    ns["_new"] = new_object
    ns["_detach"] = _detach
    ns["_as_subclass"] = _as_subclass
    ns["_mapping"] = _new_mapping
    exec(compile(src, "<torchfuse rebuild>", "exec"), ns)
    return ns["rebuild"]


def _detach(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.requires_grad else t


def _as_subclass(t: torch.Tensor, cls: type) -> torch.Tensor:
    return t if type(t) is cls else t.as_subclass(cls)


def _new_mapping(cls: type, items: dict[Any, Any]) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return cls(**items)
    return cls(items)


def new_object(cls: type, attrs: dict[str, Any]) -> Any:
    """An instance of ``cls`` with these attributes, made without calling ``__init__``."""
    obj = object.__new__(cls)
    if hasattr(obj, "__dict__"):
        obj.__dict__.update(attrs)
    else:  # a class with __slots__: its attributes are slot descriptors
        for k, v in attrs.items():
            object.__setattr__(obj, k, v)
    return obj


def compile_side_effects(ops: list[tuple], namespace: dict[str, Any]) -> Callable[..., None] | None:
    """A function ``(outputs, L, G, C) -> None`` that replays side effects in order."""
    if not ops:
        return None
    lines = ["def replay(O, L, G, C):"]
    ns = dict(namespace)
    for n, op in enumerate(ops):
        if op[0] == "contents":
            fn = compile_spec(op[2], namespace)
            ns[f"_v{n}"] = fn
            lines.append(f"    _replace_contents({op[1]}, _v{n}(O, L, G, C))")
        elif op[0] == "setattr":
            ns[f"_v{n}"] = compile_spec(op[3], namespace)
            store = "object.__setattr__" if op[4] else "setattr"
            lines.append(f"    {store}({op[1]}, {op[2]!r}, _v{n}(O, L, G, C))")
        elif op[0] == "setglobal":
            ns[f"_v{n}"] = compile_spec(op[2], namespace)
            lines.append(f"    G[{op[1]!r}] = _v{n}(O, L, G, C)")
    ns["_replace_contents"] = _replace_contents
    exec(compile("\n".join(lines) + "\n", "<torchfuse side effects>", "exec"), ns)
    return ns["replay"]


def _replace_contents(target: Any, new: Any) -> None:
    if isinstance(target, list):
        target[:] = new
    elif isinstance(target, dict):
        target.clear()
        target.update(new)
    elif isinstance(target, set):
        target.clear()
        target.update(new)
    else:  # pragma: no cover - only containers are tracked
        raise TypeError(type(target))


def spec_to_json(spec: Spec) -> str:
    """The output structure as JSON (for export); only plain data is allowed."""
    def conv(s: Spec) -> Any:
        tag = s[0]
        if tag in ("t", "tv"):
            return {"tensor": s[1]}
        if tag == "c":
            v = s[1]
            if v is None or isinstance(v, bool | int | float | str):
                return {"const": v}
            if isinstance(v, torch.dtype | torch.device):
                return {"const": str(v)}
            raise Unsupported(f"cannot export a constant output of type {type(v).__name__}")
        if tag == "seq":
            name = "tuple" if s[1] is tuple else "list" if s[1] is list else s[1].__qualname__
            return {"seq": name, "items": [conv(i) for i in s[2]]}
        if tag == "dict":
            return {"dict": [[k, conv(v)] for k, v in zip(s[2], s[3], strict=True)]}
        if tag == "obj":  # an object made in the function (a cache): its attributes, as data
            return {"dict": [[k, conv(v)] for k, v in s[2].items()],
                    "object": f"{s[1].__module__}.{s[1].__qualname__}"}
        raise Unsupported(f"cannot export an output of kind {tag!r}")
    return json.dumps(conv(spec))
