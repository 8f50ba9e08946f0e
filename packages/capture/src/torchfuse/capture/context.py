"""The state of one capture: recorder, guards, graph inputs, side effects.

One `Capture` exists per frame being compiled (inlined calls share it). It turns
outside values into Vars (`Capture.wrap`, with the guards that reading them needs) and
runs torch calls on fake tensors under the recorder (`Capture.call_torch`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import inspect
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torchfuse.capture import config as C
from torchfuse.capture import variables as V
from torchfuse.capture.dtype_rules import CheckingRecorder
from torchfuse.capture.dynamic import DynamicPolicy, is_float_scalar, symbolic_dims
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.guards import GuardSet, SymbolBinding, watch
from torchfuse.capture.source import (
    AttrSource,
    DictItemSource,
    DictValueSource,
    FreshModuleSource,
    GlobalSource,
    ItemSource,
    LocalSource,
    ModuleAttrSource,
    ModuleStateSource,
    Source,
    qualified_name,
    under_fresh_module,
)
from torchfuse.graph import schema as S
from torchfuse.graph.meta_memo import MEMO
from torchfuse.graph.symbolic import SizeEnv, SpecializationError
from torchfuse.graph.tracing import DataDependentError, FakeTensor, GraphBuilder


class _Captures(threading.local):
    """The captures in progress, per thread: two threads capture at once without meeting."""

    def __init__(self) -> None:
        self.stack: list[Capture] = []


_CAPTURES = _Captures()


def current() -> Capture:
    """The capture in progress (inside the interpreter) on this thread."""
    stack = _CAPTURES.stack
    if not stack:
        raise RuntimeError("no capture in progress")
    return stack[-1]


@dataclasses.dataclass(slots=True)
class InputSlot:
    """Where the value of one graph input comes from on each call."""

    name: str
    kind: str
    source: Source | None
    constant: torch.Tensor | None = None


class Capture:
    """Everything one compiled frame accumulates."""

    def __init__(self, name: str, f_globals: dict[str, Any], closure: tuple[Any, ...] | None,
                 dynamic: DynamicPolicy | None = None) -> None:
        self.rec = CheckingRecorder(GraphBuilder(name))
        self.outer_rec: CheckingRecorder | None = None
        """The graph's own recorder while `rec` records a region into a Graph of its own
        (`torchfuse.capture.checkpoint`): tensors read from outside become its inputs."""
        self.size_env = SizeEnv(loc_fn=lambda: self.loc)
        """The size symbols of this graph; guards and specialization errors name ``self.loc``."""
        self.rec.builder.size_env = self.size_env
        # a model's layers repeat their ops: each meta kernel runs once per argument metadata
        # (and, kept on disk, once per cache directory and torch version)
        self.rec.meta_memo = MEMO.use_disk(C.config.meta_memo_disk) if C.config.meta_memo else None
        self.dynamic = dynamic or DynamicPolicy()
        self.symbol_reads: dict[str, str] = {}
        """Symbol name -> the Python expression reading it on a call (``L[0].size(1)``)."""
        self.dynamic_dims: dict[tuple[str, int], str] = {}
        """(source expression, dim) -> the symbol made for it."""
        self.scalar_symbols: dict[str, str] = {}
        """Int arguments made symbols: source expression (``L[1]``) -> symbol name."""
        self.f_globals = f_globals
        self.closure = closure or ()
        self.loc: S.SourceLoc | None = None
        self.guards = GuardSet(lambda: self.loc)
        self.inputs: list[InputSlot] = []
        self.tensor_vars: dict[int, V.TensorVar] = {}
        self.object_vars: dict[int, V.Var] = {}
        self._keep: list[Any] = []
        self.side_effects: list[Any] = []
        self.mutated: dict[int, V.Var] = {}
        self.module_path: str | None = None
        self.uses_modules = False
        self.open_autocasts: list[torch.autocast] = []
        """Autocast regions entered by the captured code and not yet left (closed, innermost
        first, when capture stops early: autocast state and its cast cache must not leak)."""
        self.fresh_locals: set[int] = set()
        """Arguments made anew by every call (a ``**kwargs`` dict): their mutation is unseen
        outside the function, so it is no side effect."""
        self.global_overrides: dict[tuple[int, str], V.Var] = {}
        """Globals assigned during capture: later reads in the same frame see the new value."""
        self.input_tensors: list[tuple[Source, torch.Tensor]] = []
        """The user-input tensors, in wrapping order (for the storage-overlap guard)."""
        self.overlap: list[tuple[str, str]] = []
        """Input pairs sharing memory in a graph that writes in place (see convert)."""
        self.subclassed = False
        """A tensor subclass was met: results of torch calls on it take its type."""
        self.entry_grad = True
        """Grad mode when the call began."""
        self.grad_entry = False
        """See [`grad_entry`][torchfuse.capture.convert.CaptureResult.grad_entry]."""
        self.made_leaves: dict[int, torch.Tensor] = {}
        """Fakes of tensors made in the function and then made to require grad there
        (``t.requires_grad = True``), by id (held, so no id is reused): an output whose
        gradient reaches only these cannot be returned from the graph as eager returns it
        (`OutputBuilder`)."""
        self.random_draws = 0
        """Python random draws made graph inputs so far (`torchfuse.capture.pyrandom`)."""
        self.break_draws: set[int] = set()
        """The draws (by order) whose value Python needs: a graph break at each."""
        self.random_generators: list[Any] = []
        """The generators those draws come from."""
        self.codes: set[Any] = set()
        """Every code object interpreted (the function and what it inlined)."""

    def close_contexts(self) -> None:
        while self.open_autocasts:
            self.open_autocasts.pop().__exit__(None, None, None)

    @contextlib.contextmanager
    def active(self) -> Iterator[Capture]:
        stack = _CAPTURES.stack
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    # ----------------------------------------------------------------- torch calls
    def call_torch(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
                   what: str = "") -> Any:
        """Call ``fn`` on fakes under the recorder, at the current source location."""
        try:
            # torch's Python meta kernels see symbolic sizes only under the Python dispatcher
            with self.rec, self.rec.location(self.loc, self.module_path), \
                    self.size_env.tracing() if self.size_env.symbols else contextlib.nullcontext():
                out = fn(*args, **kwargs)
        except SpecializationError:
            raise  # a mark_dynamic size made constant: the user's error, not a graph break
        except DataDependentError as e:
            raise Unsupported(f"data-dependent operation {what or _name(fn)}: {e}", self.loc,
                              "keep values on tensors (use torch.where instead of if/else on "
                              "a tensor, avoid .item()/.tolist())") from e
        except Unsupported:
            raise
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            raise Unsupported(f"{what or _name(fn)} failed on fake tensors: "
                              f"{type(e).__name__}: {e}", self.loc) from e
        if torch.is_grad_enabled() and _library_op(fn):
            failure = _backward_failure(out, args, kwargs)
            if failure is not None:
                op = getattr(fn, "_opoverload", fn)
                raise Unsupported(f"{op}: its registered backward cannot be traced on "
                                  f"fake tensors ({type(failure).__name__}: {failure})", self.loc,
                                  "it runs in Python with its own backward; under torch.no_grad() "
                                  "it stays in the graph")
        cls = self._subclass_of(fn, args, kwargs)
        if cls is not None:
            self._mark_subclass(out, cls)
        return out

    def _subclass_of(self, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> type | None:
        """The tensor subclass (without overrides: see `check_subclass`) that eager's
        default ``Tensor.__torch_function__`` converts the results of this call to."""
        if not self.subclassed:
            return None
        for a in itertools.chain((getattr(fn, "__self__", None),), args, kwargs.values()):
            for t in a if isinstance(a, list | tuple) else (a,):
                var = self.tensor_vars.get(id(t)) if isinstance(t, torch.Tensor) else None
                if var is not None and var.py_type is not torch.Tensor and \
                        not issubclass(var.py_type, torch.nn.Parameter):
                    return var.py_type
        return None

    def _mark_subclass(self, out: Any, cls: type) -> None:
        for o in out if isinstance(out, list | tuple) else (out,):
            if isinstance(o, torch.Tensor) and id(o) not in self.tensor_vars:
                self.tensor_vars[id(o)] = V.TensorVar(o, None, cls)
                self._keep.append(o)

    def add_node(self, op: str, args: list[S.Argument]) -> None:
        """Record a node with no outputs (grad-mode switches)."""
        self.rec.builder.add_node(op, args, {}, [], loc=self.loc, module_path=self.module_path)

    # ----------------------------------------------------------------- wrapping outside values
    def wrap(self, value: Any, source: Source | None) -> V.Var:
        """A Var for a value read from outside the frame, guarding what it must."""
        if isinstance(value, torch.Tensor):
            return self.wrap_tensor(value, source)
        if V.is_constant(value) or is_float_scalar(value):  # np.float32 is no float subclass
            return V.ConstVar(value, source)
        known = self.object_vars.get(id(value))
        if known is not None:
            if source is not None and known.source is not None and source != known.source:
                self.guards.alias(source, known.source)
            return known
        var = self._wrap_object(value, source)
        self.object_vars[id(value)] = var
        self._keep.append(value)
        return var

    def _wrap_object(self, value: Any, source: Source | None) -> V.Var:
        guards = self.guards
        if isinstance(value, torch.nn.Module):
            self.uses_modules = True
            watch(value)
            if type(source) is LocalSource and self.dynamic.fresh_module(source.expr()):
                guards.type_(source, type(value))  # a new module each call: see FreshModuleSource
                return V.ModuleVar(value, FreshModuleSource(source.index, source.name))
            if source is not None and under_fresh_module(source):  # its children are new too
                guards.type_(source, type(value))
                return V.ModuleVar(value, source)
            if source is not None and not source.is_module_state:
                guards.identity(source, value)
            elif source is not None:  # a submodule: which class it is, when modules change
                guards.type_(source, type(value))
            return V.ModuleVar(value, source)
        if type(value) in (list, tuple) or _is_namedtuple(value):
            if source is not None:
                guards.type_(source, type(value))
                guards.length(source, len(value))
            items = [self.wrap(v, ItemSource(source, i) if source else None)
                     for i, v in enumerate(value)]
            return V.ListVar(items, type(value), source)
        if type(value) is dict:
            if not all(_is_key(k) for k in value):
                raise Unsupported("dict with non-constant keys", self.loc)
            if source is not None:
                guards.type_(source, dict)
                guards.keys(source, tuple(value))
            return V.DictVar({k: self.wrap(v, _item_source(source, k, n) if source else None)
                              for n, (k, v) in enumerate(value.items())}, source)
        if _is_plain_dict_subclass(value):
            # a dict subclass written in Python (a registry, a config mapping): its items are
            # read like a dict's, what the subclass defines in Python runs interpreted
            if source is not None:
                guards.type_(source, type(value))
                guards.keys(source, tuple(dict.keys(value)))
            items = {k: self.wrap(v, _item_source(source, k, n, DictItemSource) if source else None)
                     for n, (k, v) in enumerate(dict.items(value))}
            attrs = {k: self.wrap(v, AttrSource(source, k) if source else None)
                     for k, v in vars(value).items()}
            return V.DictVar(items, source, kind=type(value), attrs=attrs)
        if type(value) in (set, frozenset) and all(V.is_constant(v) for v in value):
            if source is not None:
                # a set's contents are guarded like a frozenset's: a set in a closure or a
                # global may gain items between calls, and len/in over it fold to constants
                guards.constant(source, value if type(value) is frozenset else set(value))
            return V.SetVar([V.ConstVar(v) for v in value], source)
        if _is_user_object(value):
            if source is not None:
                guards.type_(source, type(value))
            return V.UserObjVar(value, source)
        if source is not None and _is_ndarray(value):
            # a new array each call must not recompile: its type is guarded, what is read of
            # it (shape, dtype, its values as a tensor input) is guarded where it is read
            guards.type_(source, type(value))
            return V.NdarrayVar(value, source)
        if source is not None and isinstance(value, types.MethodType):
            # a bound method is made anew by every attribute read (``obj.method`` is never the
            # same object twice): guard what it is made of, the function and the instance
            # (held by a module: with the module guards, checked when modules change)
            part = ModuleAttrSource if source.is_module_state else AttrSource
            guards.identity(part(source, "__func__"), value.__func__)
            guards.identity(part(source, "__self__"), value.__self__)
            return V.ObjVar(value, source)
        if source is not None and isinstance(value, types.BuiltinMethodType) and \
                isinstance(value.__self__, type):
            # a C classmethod (``chain.from_iterable``, ``dict.fromkeys``) is bound anew by
            # every read too: guard its class and its name
            part = ModuleAttrSource if source.is_module_state else AttrSource
            guards.identity(part(source, "__self__"), value.__self__)
            guards.constant(part(source, "__name__"), value.__name__)
            return V.ObjVar(value, source)
        if source is not None and not isinstance(value, types.ModuleType):
            guards.identity(source, value)  # on module state: checked when modules change
        return V.ObjVar(value, source)

    def wrap_tensor(self, t: torch.Tensor, source: Source | None, guarded: bool = True) -> V.TensorVar:
        """``guarded=False``: the caller guards what the input is made from (an ndarray's
        metadata, `torchfuse.capture.arrays`), and its sizes stay static."""
        known = self.tensor_vars.get(id(t))
        if known is not None:
            if source is not None and known.source is not None and source != known.source:
                self.guards.alias(source, known.source)  # the same tensor under two names
            return known
        if isinstance(t, FakeTensor):
            raise Unsupported("a fake tensor escaped into a Python object", self.loc)
        check_subclass(type(t), self.loc)
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            self.subclassed = True
        rec = self.outer_rec or self.rec  # a region lifts the graph's inputs it reads
        if source is None:  # found inside an object we could not trace to a source
            name = rec.name_of(t)
            self.inputs.append(InputSlot(name, "constant", None, t))
            var = V.TensorVar(self._fake_for_constant(t), None, type(t))
            self.tensor_vars[id(t)] = var
            return var
        if source.is_module_state:
            self.uses_modules = True
            kind = "buffer" if isinstance(source, ModuleStateSource) and source.table == "_buffers" \
                else "parameter" if isinstance(t, torch.nn.Parameter) else "buffer"
            target = qualified_name(source)
            hint = target.replace(".", "_") or "param"
        elif isinstance(source_root(source), LocalSource):
            kind, target, hint = "user_input", None, _arg_hint(source)
        else:
            kind, target, hint = "constant", source.expr(), _arg_hint(source)
        sizes, bindings = self._input_sizes(source, t) if kind == "user_input" and guarded else (None, None)
        fake = rec.input(t, name=hint, kind=kind, target=target, sizes=sizes)  # type: ignore[arg-type]
        if guarded:
            self.guards.tensor(source, t, fake, bindings)
        name = rec.names[id(fake)]
        rec.bind(t, name)  # torch code that sees the real tensor (nn.Linear) finds it too
        self.inputs.append(InputSlot(name, kind, source))
        if kind == "user_input" and guarded:
            self.input_tensors.append((source, t))
        var = V.TensorVar(fake, source, type(t))
        self.tensor_vars[id(t)] = var
        self.tensor_vars[id(fake)] = var
        self._keep.append(t)
        return var

    def _input_sizes(self, source: Source, t: torch.Tensor) -> tuple[list[Any] | None, dict | None]:
        """The sizes an input tensor is captured with: symbols for the dims the dynamic
        policy asks for (when they can be symbolic), ints for the rest."""
        src = source.expr()
        dims = symbolic_dims(t, self.dynamic.dims(src, t))
        if not dims:
            return None, None
        k = len((self.outer_rec or self.rec).builder.inputs)  # the graph input this tensor is about to become
        sizes: list[Any] = []
        bindings: dict[int, SymbolBinding] = {}
        for d, n in enumerate(t.shape):
            req = dims.get(d)
            if req is None:
                sizes.append(int(n))
                continue
            sym = self.size_env.symbol(int(n), source=f"input:{k}.size({d})", min=req.min or 2,
                                       max=req.max, strict=req.strict)
            info = self.size_env.symbols[sym.node.expr.name]
            bindings[d] = SymbolBinding(info.name, info.min, info.max)
            self.symbol_reads[info.name] = f"{src}.size({d})"
            self.dynamic_dims[(src, d)] = info.name
            sizes.append(sym)
        return sizes, bindings

    def _fake_for_constant(self, t: torch.Tensor) -> FakeTensor:
        rec = self.outer_rec or self.rec
        fake = FakeTensor.like(t)
        rec.bind(fake, rec.name_of(t))
        return fake

    def sync_constants(self) -> None:
        """Constant tensors the recorder met by itself (``torch.tensor([...])``) become slots."""
        have = {s.name for s in self.inputs}
        for name, t in self.rec.constants.items():
            if name not in have:
                self.inputs.append(InputSlot(name, "constant", None, t))
        # the slots feed the graph positionally: put them in the graph's input order (a
        # constant the recorder met mid-capture sits between earlier and later inputs)
        order = {inp.name: n for n, inp in enumerate(self.rec.builder.inputs)}
        self.inputs.sort(key=lambda slot: order.get(slot.name, len(order)))


def check_subclass(cls: type, loc: S.SourceLoc | None) -> None:
    """A tensor subclass that overrides ``__torch_function__`` or ``__torch_dispatch__`` is a
    graph break: capture does not run the override, and ignoring it would compute something
    else than eager. Subclasses that only add Python methods or attributes are captured (the
    results of torch calls on them take their type, as eager's default conversion does)."""
    if cls is torch.Tensor or cls is FakeTensor:
        return
    tf = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
    if tf not in (_DEFAULT_TORCH_FUNCTION, torch._C._disabled_torch_function_impl):
        what = "__torch_function__"
    elif cls.__torch_dispatch__ is not torch._C._disabled_torch_dispatch_impl:
        what = "__torch_dispatch__"
    else:
        return
    raise Unsupported(f"tensor subclass {cls.__qualname__} overrides {what}, which capture does not "
                      f"trace through", loc,
                      "the function runs in Python where such a tensor is met; compile the code "
                      "that runs on plain tensors (inside the override) instead")


_DEFAULT_TORCH_FUNCTION = torch.Tensor.__torch_function__.__func__


def _is_ndarray(value: Any) -> bool:
    import sys

    np = sys.modules.get("numpy")  # never imported for this: no array exists without it
    return np is not None and type(value) is np.ndarray


def source_root(source: Source) -> Source:
    """The local, global or closure cell a source expression starts from."""
    while hasattr(source, "base"):
        source = source.base  # type: ignore[attr-defined]
    return source


def _arg_hint(source: Source) -> str:
    if isinstance(source, LocalSource):
        return source.name
    if isinstance(source, GlobalSource):
        return source.name
    if isinstance(source, ItemSource):
        return f"{_arg_hint(source.base)}_{source.key}"
    text = source.expr()
    for old, new in (("L[", "arg"), ("G[", ""), ("]", ""), ("'", ""), (".", "_"), ("[", "_")):
        text = text.replace(old, new)
    return text or "arg"


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _is_user_object(value: Any) -> bool:
    cls = type(value)
    if isinstance(value, type | types.FunctionType | types.BuiltinFunctionType | types.MethodType
                  | types.ModuleType):
        return False
    mod = getattr(cls, "__module__", "") or ""
    if isinstance(value, functools.partial):
        return False
    if mod == "builtins" or mod.startswith("torch") or inspect.isroutine(value):
        return False
    return hasattr(value, "__dict__")


_DICT_READERS = ("__iter__", "keys", "__len__", "__getattribute__", "__getattr__")
"""What guards on a dict subclass's contents call: a subclass that redefines one is an object."""


def _is_plain_dict_subclass(value: Any) -> bool:
    """A subclass of ``dict`` (or ``OrderedDict``) defined in Python, with constant keys, whose
    key listing and attribute reads are dict's and object's own: guards read its keys and
    items as a dict's (`DictItemSource`), and what the subclass defines in Python
    (``__getitem__`` of a model output, say) is interpreted."""
    from torchfuse.capture.values import HEAPTYPE

    cls = type(value)
    if not isinstance(value, dict) or cls is dict or not hasattr(value, "__dict__"):
        return False
    for klass in cls.__mro__[:cls.__mro__.index(dict)]:
        if klass is collections.OrderedDict:
            continue
        if not klass.__flags__ & HEAPTYPE:
            return False  # defaultdict and the like behave otherwise
        if any(name in klass.__dict__ for name in _DICT_READERS):
            return False
    return all(_is_key(k) for k in dict.keys(value))


def _item_source(source: Source, key: Any, position: int, kind: type = ItemSource) -> Source:
    """Where a dict's item is read from on each call: by key, or by position when the key
    has no literal form."""
    return kind(source, key) if V.is_constant(key) else DictValueSource(source, position)


def _is_key(key: Any) -> bool:
    """A dict key capture can hold: a constant, or an object hashed and compared by identity
    (a class, ``typing.Union``: registries keyed by type)."""
    cls = type(key)
    return V.is_constant(key) or (cls.__eq__ in (object.__eq__, type.__eq__) and
                                  cls.__hash__ in (object.__hash__, type.__hash__))


_CORE_NAMESPACES = frozenset({"aten", "prims", "torchfuse"})


def _library_op(fn: Any) -> bool:
    """An operator a library registered (``torch.library.custom_op``, called through the
    function it returns or through ``torch.ops``), not one of ATen's."""
    fn = getattr(fn, "_opoverload", fn)  # the CustomOpDef that custom_op returns
    if isinstance(fn, torch._ops.OpOverload):
        return fn.namespace not in _CORE_NAMESPACES
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return fn._qualified_op_name.split("::")[0] not in _CORE_NAMESPACES
    return False


def _backward_failure(out: Any, args: list[Any], kwargs: dict[str, Any]) -> Exception | None:
    """What a library operator's backward raises when run on the fakes of this call (None
    when it runs, or nothing needs a gradient). The joint graph runs it on fakes the same
    way; one that needs data (transformers 5.17's ``grouped_mm_fallback`` calls
    ``offs.tolist()``) fails there, after capture, so it is found here and made a break."""
    outs = [o for o in (out if isinstance(out, list | tuple) else (out,))
            if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    inputs = [t for a in [*args, *kwargs.values()] for t in (a if isinstance(a, list | tuple) else (a,))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not inputs:
        return None
    try:
        torch.autograd.grad(outs, inputs, [torch.zeros_like(o) for o in outs], allow_unused=True)
    except Exception as e:  # whatever the library's Python raises on a tensor without data
        return e
    return None
