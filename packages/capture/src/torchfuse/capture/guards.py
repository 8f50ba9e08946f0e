"""Guards: the conditions under which a captured graph may be reused, and their check code.

Each guard is a format record ([`torchfuse.graph.schema`][torchfuse.graph.schema]: ``TensorGuard``,
``ConstantGuard`` …) tied to the source line that caused it, plus one Python condition over
``L`` (the call's arguments), ``G`` (globals) and ``C`` (closure cells). The conditions are
joined into one generated function per compiled entry, ``exec``-ed once.

Guards fall in two groups so that checking costs what the *inputs* cost, not what the model
has: ``fast`` guards (argument tensors, constants, globals, grad mode) run on every call;
``module`` guards (attributes, parameters and buffers of ``nn.Module`` s) run only when
`module_version` moved, i.e. when some module attribute was assigned since the last
check (``m.eval()``, ``m.weight = …``). In-place updates of parameters do not move it, and
need not: parameters are graph inputs, read fresh on every call.

A tensor with symbolic sizes (`torchfuse.capture.dynamic`) is guarded on its static
sizes only (``None`` in the record for a symbolic one); its condition binds each size
symbol to a local of the check function and checks the symbol's range, e.g.
``2 <= (s0 := _z2[0])``, and its strides as expressions over those symbols. The graph's
symbol guards (``s0 == s1``, ``s0 > 4``) come after every tensor guard, so every symbol they
read is bound.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture.source import Source
from torchfuse.graph import schema as S
from torchfuse.graph.expr import to_python as expr_to_python
from torchfuse.graph.ops import device_name, dtype_name
from torchfuse.graph.symbolic import size_text

# ----------------------------------------------------------------------------- module version

module_version = [0]
"""Bumped whenever an attribute of a watched ``nn.Module`` is set, deleted, or registered."""

WATCHED = "_torchfuse_watched"
"""The flag in a module's ``__dict__`` that capture sets on every module it reads: only these
modules' writes move `module_version`. A module made and changed at run time (the
``ModuleList`` a slice ``self.layers[:n]`` builds on every call) moves nothing, so code that
does it in a loop neither revalidates our module guards each call nor, traced by another
compiler, sees a global counter change on every call."""

_patched = False


def watch(module: torch.nn.Module) -> None:
    """Have writes to ``module``'s attributes move `module_version`."""
    module.__dict__[WATCHED] = True


def watch_module_attributes() -> None:
    """Make writes to watched ``nn.Module`` s bump `module_version` (installed once).

    Wraps ``__setattr__``, ``__delattr__``, ``register_parameter``, ``register_buffer`` and
    ``register_module`` on ``torch.nn.Module``; each wrapper adds one flag test and, for a
    watched module (`watch`), one integer increment.
    """
    global _patched
    if _patched:
        return
    _patched = True
    cls = torch.nn.Module
    for name in ("__setattr__", "__delattr__", "register_parameter", "register_buffer",
                 "register_module", "add_module"):
        orig = getattr(cls, name)

        def wrapper(self: Any, *args: Any, __orig: Callable[..., Any] = orig, **kwargs: Any) -> Any:
            if self.__dict__.get(WATCHED):
                module_version[0] += 1
            return __orig(self, *args, **kwargs)

        functools.update_wrapper(wrapper, orig)
        setattr(cls, name, wrapper)
    # Hooks live in per-module dicts: adding one goes through ``register_*hook``, removing
    # one through its handle; both move the version so module guards on hooks are checked.
    for name in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                 "register_backward_hook", "register_full_backward_pre_hook"):
        orig = getattr(cls, name, None)
        if orig is None:
            continue

        def hook_wrapper(self: Any, *args: Any, __orig: Callable[..., Any] = orig, **kwargs: Any) -> Any:
            if self.__dict__.get(WATCHED):
                module_version[0] += 1
            return __orig(self, *args, **kwargs)

        functools.update_wrapper(hook_wrapper, orig)
        setattr(cls, name, hook_wrapper)
    handle_cls = torch.utils.hooks.RemovableHandle
    orig_remove = handle_cls.remove

    def remove(self: Any) -> None:
        module_version[0] += 1
        orig_remove(self)

    functools.update_wrapper(remove, orig_remove)
    handle_cls.remove = remove  # type: ignore[method-assign]


def _config() -> Any:
    from torchfuse.capture.config import config

    return config


# ----------------------------------------------------------------------------- guard set


@dataclasses.dataclass(frozen=True, slots=True)
class SymbolBinding:
    """A symbolic dim of an input tensor: the symbol its size binds and the symbol's range."""

    name: str
    min: int
    max: int | None


@dataclasses.dataclass(slots=True)
class GuardEntry:
    record: S.Guard
    condition: str
    module_group: bool
    source: Source | None = None
    """Where the guarded value is read from (for tensor guards: automatic dynamic)."""
    symbols: dict[int, SymbolBinding] | None = None
    """A tensor guard's symbolic dims (for saying which range failed)."""


def global_state() -> tuple[bool, tuple[Any, ...]]:
    """What the ``GlobalStateGuard`` s check: grad mode and autocast per device type."""
    return torch.is_grad_enabled(), autocast_state()


def autocast_state() -> tuple[Any, ...]:
    """Per device type (cpu, cuda): ``False`` when autocast is off, else the dtype it casts
    to (a graph captured under bf16 autocast holds bf16 casts: fp16 autocast recompiles)."""
    # Written out, not a generator over the device types: every guarded call runs this.
    return (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda"))


def storage_groups(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    """Per tensor, the index of the first one sharing its storage (empty storages share none)."""
    first: dict[tuple[int, torch.device], int] = {}
    out = []
    for i, t in enumerate(tensors):
        st = t.untyped_storage()
        if st.nbytes() == 0:
            out.append(i)
            continue
        out.append(first.setdefault((st.data_ptr(), t.device), i))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMeta:
    """What a tensor guard checks of a tensor: its class (``nn.Parameter`` for any parameter),
    dtype, device, sizes, strides and ``requires_grad``."""

    cls: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        cls = torch.nn.Parameter if isinstance(t, torch.nn.Parameter) else type(t)
        dev = t.fake_device if hasattr(t, "fake_device") else t.device
        return TensorMeta(cls, t.dtype, dev, tuple(int(n) for n in t.shape),
                          tuple(int(n) for n in t.stride()), bool(t.requires_grad))

    def matches(self, t: Any) -> bool:
        """Whether ``t`` is a tensor with this metadata (the guard's condition, in Python)."""
        return type(t) is self.cls and t.dtype is self.dtype and t.device == self.device and \
            t.shape == self.shape and t.stride() == self.strides and t.requires_grad is self.requires_grad


class GuardSet:
    """Guards collected while capturing one frame."""

    def __init__(self, loc_of: Callable[[], S.SourceLoc | None]) -> None:
        self.entries: list[GuardEntry] = []
        self.namespace: dict[str, Any] = {"torch": torch, "sys": sys, "_autocast_state": autocast_state,
                                          "_grad": torch.is_grad_enabled,
                                          "_default_dtype": torch.get_default_dtype,
                                          "_storage_groups": storage_groups}
        self._seen: set[tuple[str, str]] = set()
        self._loc_of = loc_of
        self._names: dict[int, str] = {}
        self._by_value: dict[tuple[type, Any], str] = {}
        self.log: list[tuple[Any, ...]] = []
        """Every guard asked for, in order, as ``(method, *arguments)``: replaying it on a new
        set makes the same conditions over the same namespace names. What a later process
        needs to rebuild this entry's checks from data (`torchfuse.capture.entry_cache`);
        ``("dynamic",)`` marks a guard over size symbols, which that cache does not keep."""

    def _obj(self, obj: Any, prefix: str = "K") -> str:
        name = self._names.get(id(obj))
        if name is None:
            name = f"{prefix}{len(self.namespace)}"
            self.namespace[name] = obj
            self._names[id(obj)] = name
        return name

    def _value(self, obj: Any, prefix: str = "K") -> str:
        """The namespace name of a constant or device, shared by every equal one (an
        identity-keyed name would depend on which equal objects Python happened to share,
        and a set rebuilt from `log` could not name them the same)."""
        try:
            key = (type(obj), obj)
            name = self._by_value.get(key)
        except TypeError:  # unhashable: by identity
            return self._obj(obj, prefix)
        if name is None:
            name = self._by_value[key] = self._obj(obj, prefix)
        return name

    def _add(self, key: tuple[str, str], record: S.Guard, condition: str, module_group: bool,
             source: Source | None = None, symbols: dict[int, SymbolBinding] | None = None) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        self.entries.append(GuardEntry(record, condition, module_group, source, symbols))

    # -- kinds
    def tensor(self, source: Source, t: torch.Tensor | TensorMeta, fake: torch.Tensor | None = None,
               symbols: dict[int, SymbolBinding] | None = None) -> None:
        """``t`` read through ``source`` has this dtype, device, layout and requires_grad.

        ``symbols`` are its symbolic dims: each binds its size symbol (a local of the check
        function, read by the symbol guards after it) and checks the symbol's range; the
        strides are then checked as the expressions ``fake`` (the input's symbolic fake)
        has for them. ``t`` may be a `TensorMeta` (a guard rebuilt from a record)."""
        src = source.expr()
        m = t if isinstance(t, TensorMeta) else TensorMeta.of(t)
        symbols = symbols or {}
        self.log.append(("dynamic",) if symbols else ("tensor", source, m))
        if symbols:
            assert fake is not None
            strides: tuple[S.Expr, ...] = tuple(size_text(s) for s in fake.stride())
        else:
            strides = m.strides
        # a symbolic dim is written as its symbol: the check binds it (and checks its range)
        sizes = tuple(symbols[d].name if d in symbols else s for d, s in enumerate(m.shape))
        rec = S.TensorGuard(source=src, dtype=dtype_name(m.dtype), device=device_name(m.device), sizes=sizes,
                            strides=strides, requires_grad=m.requires_grad, loc=self._loc_of())
        v = f"_t{len(self.entries)}"
        if source.is_module_state and not _config().check_parameter_metadata:
            self._add(("tensor", src), rec, "True", True, source)
            return
        head = (f"type({v} := {src}) is {self._obj(m.cls, 'T')} and {v}.dtype is {self._obj(m.dtype, 'D')}"
                f" and {v}.device == {self._value(m.device, 'V')}")
        if not symbols:
            shape = f" and {v}.shape == {m.shape!r}"
        else:
            z = f"_z{len(self.entries)}"
            parts = [f"len({z} := {v}.shape) == {len(m.shape)}"]
            for d, n in enumerate(m.shape):
                b = symbols.get(d)
                if b is None:
                    parts.append(f"{z}[{d}] == {n}")
                else:  # bind the symbol, then its range
                    hi = f" <= {b.max}" if b.max is not None else ""
                    parts.append(f"{b.min} <= ({b.name} := {z}[{d}]){hi}")
            shape = " and " + " and ".join(parts)
        stride_text = "(" + "".join(f"{expr_to_python(e)}, " for e in strides) + ")"
        cond = (f"{head}{shape}"
                f" and {v}.stride() == {stride_text}"
                f" and {v}.requires_grad is {m.requires_grad}")
        self._add(("tensor", src), rec, cond, source.is_module_state, source, symbols or None)

    def size_value(self, source: Source, cls: type, text: str) -> None:
        """An argument holding sizes equals these size expressions (``L[2] == s0``,
        ``L[3] == (s0, 16)``); the symbols are bound by the tensor guards before it."""
        self.log.append(("dynamic",))
        src = source.expr()
        rec = S.ConstantGuard(source=src, value=text, loc=self._loc_of())
        self._add(("constant", src), rec, f"type({src}) is {self._obj(cls, 'T')} and {src} == {text}",
                  source.is_module_state, source)

    def scalar_symbol(self, source: Source, binding: SymbolBinding) -> None:
        """An int argument captured as a size symbol: it is an ``int`` in the symbol's range,
        and the check binds the symbol to it (``2 <= (s0 := L[1])``) for the symbol guards."""
        self.log.append(("dynamic",))
        src = source.expr()
        rec = S.ConstantGuard(source=src, value=binding.name, loc=self._loc_of())
        hi = f" <= {binding.max}" if binding.max is not None else ""
        self._add(("constant", src), rec,
                  f"type({src}) is {self._obj(int, 'T')} and {binding.min} <= ({binding.name} := {src}){hi}",
                  source.is_module_state, source)

    def symbol(self, record: S.SymbolGuard) -> None:
        """A relation over size symbols, checked after every tensor guard has bound them."""
        self.log.append(("dynamic",))
        self._add(("symbol", record.expr), record, expr_to_python(record.expr), False)

    def constant(self, source: Source, value: Any) -> None:
        self.log.append(("constant", source, value))
        src = source.expr()
        rec = S.ConstantGuard(source=src, value=repr(value), loc=self._loc_of())
        cond = f"type({src}) is {self._obj(type(value), 'T')} and {src} == {self._value(value)}"
        self._add(("constant", src), rec, cond, source.is_module_state, source)

    def keys(self, source: Source, keys: tuple[Any, ...]) -> None:
        self.log.append(("keys", source, keys))
        src = source.expr()
        rec = S.ConstantGuard(source=f"tuple({src}.keys())", value=repr(keys), loc=self._loc_of())
        self._add(("keys", src), rec, f"tuple({src}.keys()) == {self._value(keys)}",
                  source.is_module_state)

    def type_(self, source: Source, cls: type) -> None:
        self.log.append(("type_", source, cls))
        src = source.expr()
        rec = S.TypeGuard(source=src, type_name=f"{cls.__module__}.{cls.__qualname__}",
                          loc=self._loc_of())
        self._add(("type", src), rec, f"type({src}) is {self._obj(cls, 'T')}", source.is_module_state)

    def identity(self, source: Source, obj: Any) -> None:
        self.log.append(("identity", source, obj))
        src = source.expr()
        desc = getattr(obj, "__qualname__", None) or f"{type(obj).__name__} at {id(obj):#x}"
        rec = S.IdentityGuard(source=src, description=str(desc), loc=self._loc_of())
        self._add(("id", src), rec, f"{src} is {self._obj(obj, 'O')}", source.is_module_state, source)

    def alias(self, source: Source, same_as: Source) -> None:
        """``source`` is the very object already read through ``same_as``."""
        self.log.append(("alias", source, same_as))
        src, other = source.expr(), same_as.expr()
        rec = S.IdentityGuard(source=src, description=f"the same object as {other}",
                              loc=self._loc_of())
        self._add(("alias", src), rec, f"{src} is {other}",
                  source.is_module_state or same_as.is_module_state)

    def distinct(self, sources: list[Source]) -> None:
        """Tensors read through different sources are different objects (no aliasing)."""
        self.log.append(("distinct", tuple(sources)))
        exprs = [s.expr() for s in sources]
        rec = S.ConstantGuard(source=f"len({{id(t) for t in ({', '.join(exprs)})}})",
                              value=str(len(exprs)), loc=self._loc_of())
        cond = f"len({{{', '.join(f'id({e})' for e in exprs)}}}) == {len(exprs)}"
        self._add(("distinct", ",".join(exprs)), rec, cond, False)

    def storage(self, sources: list[Source], groups: tuple[int, ...]) -> None:
        """Which of these tensors share memory: ``groups[i]`` is the first input whose storage
        input ``i`` shares (itself when none). Taken only by graphs that write in place."""
        self.log.append(("storage", tuple(sources), groups))
        exprs = ", ".join(s.expr() for s in sources)
        rec = S.ConstantGuard(source=f"storage_groups(({exprs},))", value=repr(groups),
                              loc=self._loc_of())
        self._add(("storage", exprs), rec, f"_storage_groups(({exprs},)) == {groups!r}", False)

    def length(self, source: Source, n: int) -> None:
        self.log.append(("length", source, n))
        src = source.expr()
        rec = S.LengthGuard(source=src, length=n, loc=self._loc_of())
        self._add(("len", src), rec, f"len({src}) == {n}", source.is_module_state)

    def defaults(self, fn: Any) -> None:
        """The compiled function's ``__defaults__`` and ``__kwdefaults__`` are the objects its
        arguments were bound with (replacing them misses, and the miss binds the new ones)."""
        self.log.append(("defaults", fn))
        f = self._obj(fn, "F")
        rec = S.IdentityGuard(source="fn.__defaults__", loc=self._loc_of(),
                              description=f"the defaults {fn.__defaults__!r} / {fn.__kwdefaults__!r}")
        self._add(("defaults", ""), rec, f"{f}.__defaults__ is {self._obj(fn.__defaults__, 'D')} and "
                  f"{f}.__kwdefaults__ is {self._obj(fn.__kwdefaults__, 'D')}", False)

    def grad_mode(self, enabled: bool) -> None:
        self.log.append(("grad_mode", enabled))
        rec = S.GlobalStateGuard(name="grad_enabled", value=repr(enabled), loc=self._loc_of())
        self._add(("global", "grad"), rec, f"_grad() is {enabled}", False)

    def default_dtype(self, dtype: torch.dtype) -> None:
        """``torch.get_default_dtype()``: what a factory call without a dtype (``torch.ones(n)``)
        made in the graph."""
        self.log.append(("default_dtype", dtype))
        rec = S.GlobalStateGuard(name="default_dtype", value=dtype_name(dtype), loc=self._loc_of())
        self._add(("global", "default_dtype"), rec, f"_default_dtype() is {self._obj(dtype, 'D')}", False)

    def autocast(self, state: tuple[Any, ...]) -> None:
        """Autocast per device type as `autocast_state` gives it: off, or the dtype it casts to.
        Two format records (whether it is on; to which dtype), one condition."""
        self.log.append(("autocast", state))
        on = tuple(s is not False for s in state)
        rec = S.GlobalStateGuard(name="autocast_enabled(cpu, cuda)", value=repr(on), loc=self._loc_of())
        self._add(("global", "autocast"), rec, f"_autocast_state() == {state!r}", False)
        if any(s is not False for s in state):
            dtypes = tuple(dtype_name(s) if s is not False else None for s in state)
            rec = S.GlobalStateGuard(name="autocast_dtype(cpu, cuda)", value=repr(dtypes), loc=self._loc_of())
            self._add(("global", "autocast_dtype"), rec, "True", False)  # in the condition above

    # -- output
    def records(self) -> tuple[S.Guard, ...]:
        return tuple(e.record for e in self.entries)

    def build(self) -> CheckFunctions:
        checks = CheckFunctions.build([e for e in self.entries if not e.module_group],
                                      [e for e in self.entries if e.module_group], self.namespace)
        checks.log = self.log
        return checks


def _check_source(name: str, conditions: list[str]) -> str:
    body = " and \\\n            ".join(f"({c})" for c in conditions) or "True"
    return (f"def {name}(L, G, C):\n"
            f"    try:\n"
            f"        return {body}\n"
            f"    except Exception:\n"
            f"        return False\n")


def _exec_check(name: str, src: str, namespace: dict[str, Any]) -> Any:
    ns = dict(namespace)
    exec(compile(src, f"<torchfuse guards {name}>", "exec"), ns)
    return ns[name]


def _compile_check(name: str, conditions: list[str], namespace: dict[str, Any]) -> tuple[str, Any]:
    src = _check_source(name, conditions)
    return src, _exec_check(name, src, namespace)


class _CompiledOnFirstCall:
    """A check function compiled when first called. The module guards run only after some
    module attribute changed (`module_version`), which many programs never do, and a model's
    are hundreds of conditions (one per parameter and attribute read): compiling them was
    a quarter of a warm start's capture of ResNet-18 (24 of 105 ms on the CPU)."""

    def __init__(self, name: str, src: str, namespace: dict[str, Any]) -> None:
        self.name, self.src, self.namespace = name, src, dict(namespace)
        self.fn: Callable[[Any, Any, Any], bool] | None = None

    def __call__(self, L: Any, G: Any, C: Any) -> bool:
        if self.fn is None:
            self.fn = _exec_check(self.name, self.src, self.namespace)
        return self.fn(L, G, C)


@dataclasses.dataclass
class CheckFunctions:
    """The generated checks of one compiled entry."""

    fast: Callable[[Any, Any, Any], bool]
    module: Callable[[Any, Any, Any], bool]
    source: str
    entries: list[GuardEntry]
    namespace: dict[str, Any]
    log: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    """The guards asked for, as `GuardSet.log` keeps them."""

    @staticmethod
    def build(fast: list[GuardEntry], module: list[GuardEntry], ns: dict[str, Any]) -> CheckFunctions:
        fsrc, ffn = _compile_check("check_inputs", [e.condition for e in fast], ns)
        msrc = _check_source("check_modules", [e.condition for e in module])
        mfn = _CompiledOnFirstCall("check_modules", msrc, ns)
        return CheckFunctions(ffn, mfn, fsrc + "\n" + msrc, fast + module, ns)

    def first_failure(self, L: Any, G: Any, C: Any) -> GuardEntry | None:
        """The first guard that does not hold (slow; for the recompile log). The guards run
        in order in one function, as in the check itself: symbol guards need the symbols
        the tensor guards before them bound."""
        lines = ["def first(L, G, C):", "    i = 0", "    try:"]
        for i, e in enumerate(self.entries):
            lines += [f"        i = {i}", f"        if not ({e.condition}):", f"            return {i}"]
        lines += ["    except Exception:", "        return i", "    return -1"]
        ns = dict(self.namespace)
        exec(compile("\n".join(lines) + "\n", "<torchfuse guards first_failure>", "exec"), ns)
        index = ns["first"](L, G, C)
        return None if index < 0 else self.entries[index]

