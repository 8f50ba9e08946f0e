"""Fake tensors and an ATen recorder: how Graphs are built by running torch code.

Capture (bytecode interpretation) and autograd (the joint graph) both need the same thing:
run ordinary torch code on tensors that carry only metadata, and write down every ATen op
the dispatcher sees. They cannot import each other, so this lives in the format package.

* `FakeTensor` is a wrapper tensor subclass that claims a real device (``cuda``,
  ``cpu``) and dtype/shape/strides, but holds only a ``meta`` tensor. No data, no kernels.
* `Recorder` is a dispatch mode. Every ATen op called while it is active is run on
  the meta tensors (so output metadata comes from torch's own meta kernels) and appended to
  a `GraphBuilder` as a [`Node`][torchfuse.graph.schema.Node].

Example::

    rec = Recorder()
    with rec:
        x = rec.input(torch.empty(4, 8), name="x")
        y = (x + 1).relu().sum(1)
    rec.output(y)
    graph = rec.builder.build()   # aten.add.Tensor, aten.relu.default, aten.sum.dim_IntList

In-place ops keep the Python identity of the mutated tensor and give its new contents a new
value name, so the graph stays in SSA form while recording mutation faithfully.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torchfuse.graph import schema as S
from torchfuse.graph.compat import OPSETS, opset_needed
from torchfuse.graph.layouts import restride, storage_extent
from torchfuse.graph.ops import device_name, encode_arg, meta_of, op_name

ATEN_OPSET = OPSETS["aten"]
"""Opset number written for ``aten`` in graphs this version produces."""


class DataDependentError(RuntimeError):
    """An op whose result depends on tensor *values* (``.item()``, ``nonzero``, ``if t:``)."""


# Ops that only read metadata and return Python values: never recorded.
_METADATA_OPS = {
    "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
    "aten.sym_storage_offset.default", "aten.is_contiguous.default",
    "aten.is_contiguous.memory_format", "aten.is_strides_like_format.default",
    "aten.is_non_overlapping_and_dense.default", "aten.size.default", "aten.stride.default",
    "aten.dim.default", "aten.numel.default",
}
_DATA_DEPENDENT_OPS = {
    "aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
    "aten.unique.default", "aten._unique2.default", "aten.item.default",
    "aten.equal.default", "aten.is_nonzero.default", "aten.allclose.default",
}


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def no_user_saved_tensor_hooks() -> contextlib.AbstractContextManager:
    """Keep the caller's ``torch.autograd.graph.saved_tensors_hooks`` (activation offloading,
    ``save_on_cpu``) away from fake tensors: an identity pair, pushed innermost, packs what
    autograd saves while capture or the joint graph runs ops on fakes. The compiled call's
    real saved tensors still go through the caller's hooks."""
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def outside_dispatch() -> contextlib.AbstractContextManager:
    """No ``__torch_dispatch__`` runs inside (no mode, no tensor subclass): for making the
    meta tensors behind fakes while a recorder or pass mode is active, whose factory calls
    would otherwise be recorded. A C++ guard, about 2 µs against 12 for popping the mode stack
    (``_disable_current_modes``), paid for every fake a pass makes. Not for code that runs ops
    on fakes or needs torch's Python dispatcher (symbolic sizes)."""
    return torch._C._DisableTorchDispatch()


class FakeTensor(torch.Tensor):
    """A tensor with metadata but no data: a ``meta`` tensor that reports a real device."""

    _elem: torch.Tensor
    fake_device: torch.device

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device | str, requires_grad: bool = False):
        assert elem.device.type == "meta", elem.device
        device = torch.device(device)
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=device, requires_grad=requires_grad,
        )
        r._elem = elem
        r.fake_device = device
        return r

    def __repr__(self) -> str:  # never touch data
        return f"FakeTensor({tuple(self.shape)}, {self.dtype}, device={self.fake_device})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Outside a Recorder: propagate metadata only.
        return _run_on_meta(func, args, kwargs or {})[0]

    @staticmethod
    def like(t: torch.Tensor, requires_grad: bool | None = None) -> FakeTensor:
        """A fake with the same metadata as ``t`` (real, meta or fake)."""
        with outside_dispatch():
            return FakeTensor._like(t, requires_grad)

    @staticmethod
    def _like(t: torch.Tensor, requires_grad: bool | None) -> FakeTensor:
        elem = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        if t.storage_offset():
            base = torch.empty(storage_extent(t.shape, t.stride(), t.storage_offset()), dtype=t.dtype,
                               device="meta")
            elem = base.as_strided(t.shape, t.stride(), t.storage_offset())
        rg = t.requires_grad if requires_grad is None else requires_grad
        return FakeTensor(elem, _fake_device(t), requires_grad=rg)


def fake_from_meta(meta: S.TensorMeta, symbols: dict[str, int] | None = None, *,
                   requires_grad: bool | None = None, env: Any = None) -> FakeTensor:
    """A fake tensor with the metadata of a value-table entry. Symbolic sizes, strides and
    offsets are evaluated with ``symbols`` (e.g. the symbols' hints), or, given a
    [`SizeEnv`][torchfuse.graph.symbolic.SizeEnv] as ``env``, kept symbolic (``SymInt``)."""
    from torchfuse.graph.expr import evaluate
    from torchfuse.graph.ops import to_dtype

    if env is not None:
        sizes = [env.parse(s) for s in meta.sizes]
        strides = [env.parse(s) for s in meta.strides]
        offset = env.parse(meta.storage_offset)
    else:
        sizes = [evaluate(s, symbols or {}) for s in meta.sizes]
        strides = [evaluate(s, symbols or {}) for s in meta.strides]
        offset = evaluate(meta.storage_offset, symbols or {})
    dtype = to_dtype(meta.dtype)
    quiet = _disable_current_modes() if env is not None else outside_dispatch()
    with quiet, _python_dispatcher(env is not None):
        if offset is not None and not (isinstance(offset, int) and offset == 0):
            base = torch.empty(storage_extent(sizes, strides, offset), dtype=dtype, device="meta")
            elem = base.as_strided(sizes, strides, offset)
        else:
            elem = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        rg = meta.requires_grad if requires_grad is None else requires_grad
        return FakeTensor(elem, meta.device, requires_grad=rg)


def symbolic_fake(example: torch.Tensor, sizes: Sequence[Any], *,
                  requires_grad: bool | None = None) -> FakeTensor | None:
    """A fake like ``example`` but with ``sizes`` (ints and ``SymInt``s); strides follow the
    sizes the way ``example``'s follow its own (dense tensors only). None when ``example`` is
    not dense, so its strides cannot be written in terms of its sizes."""
    shape, stride = list(example.shape), list(example.stride())
    order = sorted(range(len(shape)), key=lambda d: (stride[d], shape[d]))  # innermost first
    expected, new_strides, sym_expected = 1, [0] * len(shape), 1
    for d in order:
        if shape[d] != 1 and stride[d] != expected:
            return None
        new_strides[d] = sym_expected
        expected *= shape[d]
        sym_expected = sym_expected * sizes[d]
    rg = example.requires_grad if requires_grad is None else requires_grad
    with _disable_current_modes(), _python_dispatcher(True):
        elem = torch.empty_strided(sizes, new_strides, dtype=example.dtype, device="meta")
        return FakeTensor(elem, _fake_device(example), requires_grad=rg)


def _python_dispatcher(on: bool) -> contextlib.AbstractContextManager:
    # Meta kernels written in Python compute with symbolic sizes only under torch's Python
    # dispatcher; without symbols it is left off (it costs time on every op).
    return torch._C._EnablePythonDispatcher() if on else contextlib.nullcontext()


def is_symbolic(t: torch.Tensor) -> bool:
    """True when some size, stride or the offset of ``t`` is a ``SymInt``."""
    return any(isinstance(s, torch.SymInt) for s in t.shape) or any(
        isinstance(s, torch.SymInt) for s in t.stride()) or isinstance(t.storage_offset(), torch.SymInt)


def _fake_device(t: torch.Tensor) -> torch.device:
    return t.fake_device if isinstance(t, FakeTensor) else t.device


_DEVICE_KWARGS = ("device",)


def _out_device(func, args: Sequence[Any], kwargs: dict[str, Any]) -> torch.device:
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    devices = [_fake_device(a) for a in _flat_tensors(args, kwargs)]
    for d in devices:  # a cpu 0-dim tensor mixed with cuda tensors: the result is on cuda
        if d.type != "cpu":
            return d
    return devices[0] if devices else torch.device("cpu")


def _flat_tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _flat_scalars(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[Any]:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, list | tuple):
            yield from a
        else:
            yield a


def _to_meta(x: Any) -> Any:
    if isinstance(x, FakeTensor):
        return x._elem
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return x
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def map_args(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn`` over the leaves of an op's arguments: lists, tuples and dicts rebuilt, anything
    else a leaf. ATen arguments hold no other container, and torch's general ``tree_map``
    (a registry lookup and a spec per node) was a tenth of the capture of a transformer."""
    kind = type(x)
    if kind is list or kind is tuple:
        return kind(map_args(fn, v) for v in x)
    if kind is dict:
        return {k: map_args(fn, v) for k, v in x.items()}
    return fn(x)


def flat_args(x: Any, out: list[Any] | None = None) -> list[Any]:
    """The leaves of an op's arguments, in order (what `map_args` maps)."""
    out = [] if out is None else out
    kind = type(x)
    if kind is list or kind is tuple:
        for v in x:
            flat_args(v, out)
    elif kind is dict:
        for v in x.values():
            flat_args(v, out)
    else:
        out.append(x)
    return out


def _run_on_meta(func, args, kwargs) -> tuple[Any, torch.device]:
    name = op_name(func)
    if name in _DATA_DEPENDENT_OPS:
        raise DataDependentError(f"{name} needs tensor values, which are unknown while tracing")
    device = _out_device(func, args, kwargs)
    margs = map_args(_to_meta, args)
    mkwargs = map_args(_to_meta, kwargs)
    if "device" in mkwargs:
        mkwargs["device"] = torch.device("meta")
    symbolic = any(is_symbolic(t) for t in _flat_tensors(margs, mkwargs)) or any(
        isinstance(a, torch.SymInt) for a in _flat_scalars(margs, mkwargs))
    try:
        with _python_dispatcher(symbolic):
            out = restride(name, margs, func(*margs, **mkwargs))  # eager's layout where the meta's differs
    except NotImplementedError as e:
        raise DataDependentError(f"{name} has no meta kernel: {e}") from e
    except RuntimeError as e:
        if "data-dependent" in str(e) or ("meta" in str(e).lower() and "not" in str(e)):
            raise DataDependentError(f"{name}: {e}") from e
        raise

    # In-place and out= ops return (one of) their inputs: keep the Python identity.
    aliased = _mutated_returns(func, args, kwargs)

    def wrap(i_out: tuple[int, Any]) -> Any:
        i, o = i_out
        if i in aliased:
            return aliased[i]
        if isinstance(o, torch.Tensor):
            if o.device.type != "meta":
                # an op of Python numbers only (``torch.div(16, 4, rounding_mode="trunc")``,
                # LED's attention): ATen wrapped them and ran its CPU kernel
                o = o.to("meta")
            return FakeTensor(o, device)
        return o

    if isinstance(out, tuple | list):
        wrapped = type(out)(wrap((i, o)) for i, o in enumerate(out))
        return wrapped, device
    return wrap((0, out)), device


def _mutated_returns(func, args, kwargs) -> dict[int, torch.Tensor]:
    """Return index -> the input tensor object an in-place/out= op returns."""
    pairs = _written_returns(func)
    if not pairs:  # most ops: no written argument comes back
        return {}
    out: dict[int, torch.Tensor] = {}
    for i, position, name, kwarg_only in pairs:
        val = args[position] if position < len(args) and not kwarg_only else kwargs.get(name)
        if isinstance(val, torch.Tensor):
            out[i] = val
    return out


@functools.lru_cache(maxsize=4096)
def _written_returns(func) -> tuple[tuple[int, int, str, bool], ...]:
    """(return index, argument position, argument name, keyword-only) for each return of
    ``func`` that is an argument it writes (its schema's alias sets), read once per op."""
    schema = func._schema
    written: dict[str, tuple[int, str, bool]] = {}
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        for s in info.before_set:
            written[s] = (i, a.name, a.kwarg_only)
    out = []
    for i, r in enumerate(schema.returns):
        if r.alias_info is not None and r.alias_info.is_write:
            for s in r.alias_info.before_set:
                if s in written:
                    out.append((i, *written[s]))
    return tuple(out)


def mutated_arguments(op: torch._ops.OpOverload) -> list[int]:
    """Positions of the arguments an op writes to (from its schema's alias annotations)."""
    return [i for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def is_view_op(op: torch._ops.OpOverload) -> bool:
    """True when the op's first output aliases an input without writing to it."""
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


# ----------------------------------------------------------------------------- builder


@functools.lru_cache(maxsize=4096)
def _stem(hint: str) -> str:
    base = re.sub(r"\W", "_", hint).strip("_") or "v"
    return "v" + base if base[0].isdigit() else base


class GraphBuilder:
    """Appends inputs, nodes and outputs and hands out unique, readable value names."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[S.GraphInput] = []
        self.outputs: list[S.GraphOutput] = []
        self.nodes: list[S.Node] = []
        self.values: dict[str, S.TensorMeta] = {}
        self.symbols: list[S.Symbol] = []
        self.guards: list[S.Guard] = []
        self.meta: dict[str, str] = {}
        self.opsets: dict[str, int] = {}
        self.size_env: Any = None
        """A [`SizeEnv`][torchfuse.graph.symbolic.SizeEnv] when tracing with symbolic sizes: its
        symbols and guards are written into the graph by `build`."""
        self._taken: set[str] = set()
        self._next: dict[str, int] = {}
        """stem -> the first suffix that may still be free (every lower one is taken)"""

    def fresh(self, hint: str) -> str:
        """A new value name from ``hint``: its stem (non-word characters made ``_``, a leading
        digit prefixed with ``v``) if free, else the first free of ``stem_1``, ``stem_2``, ...

        Names are never released, so the first free suffix of a stem only grows: the search
        starts where the last one of that stem ended, not at the stem (from the stem, a graph
        of a thousand ``mul`` probed half a million names)."""
        stem = _stem(hint)
        i = self._next.get(stem, 0)
        name = f"{stem}_{i}" if i else stem
        while name in self._taken:
            i += 1
            name = f"{stem}_{i}"
        self._next[stem] = i + 1
        self._taken.add(name)
        return name

    def add_input(self, meta: S.TensorMeta, *, name: str = "arg", kind: S.InputKind = "user_input",
                  target: str | None = None) -> str:
        vname = self.fresh(name)
        self.values[vname] = meta
        self.inputs.append(S.GraphInput(name=vname, kind=kind, target=target))
        return vname

    def add_node(self, op: str, args: Sequence[S.Argument], kwargs: dict[str, S.Argument],
                 out_metas: Sequence[S.TensorMeta | None], *, loc: S.SourceLoc | None = None,
                 module_path: str | None = None, hint: str | None = None) -> list[str]:
        ns = op.split(".", 1)[0]
        self.opsets[ns] = max(self.opsets.get(ns, 1), opset_needed(op))
        base = hint or op.split(".")[1]
        outs: list[str] = []
        for meta in out_metas:
            if meta is None:
                outs.append("")
                continue
            vname = self.fresh(base)
            self.values[vname] = meta
            outs.append(vname)
        node_name = next((o for o in outs if o), None) or self.fresh(base)
        self.nodes.append(S.Node(name=node_name, op=op, args=tuple(args), kwargs=dict(kwargs),
                                 outputs=tuple(outs), loc=loc, module_path=module_path))
        return outs

    def add_output(self, value: S.Argument, *, kind: S.OutputKind = "user_output",
                   target: str | None = None, aliases_input: str | None = None) -> None:
        self.outputs.append(S.GraphOutput(value=value, kind=kind, target=target,
                                          aliases_input=aliases_input))

    def build(self) -> S.Graph:
        symbols, guards = tuple(self.symbols), tuple(self.guards)
        values = dict(self.values)
        if self.size_env is not None:
            symbols = self.size_env.records()
            values = {k: self.size_env.canonical_meta(m) for k, m in values.items()}
            known = set(guards)
            guards += tuple(g for g in self.size_env.guard_records() if g not in known)
        return S.Graph(
            name=self.name, inputs=tuple(self.inputs), outputs=tuple(self.outputs),
            nodes=tuple(self.nodes), values=values, symbols=symbols,
            guards=guards, opsets=dict(self.opsets), meta=dict(self.meta),
        )


# ----------------------------------------------------------------------------- recorder


class Recorder(TorchDispatchMode):
    """A dispatch mode that runs ATen ops on fake tensors and records them into a builder.

    Tensors that are not fakes of this recorder (a real tensor from a global, say) are
    turned into graph inputs through `on_constant`, which by default adds an input of
    kind ``constant`` and remembers the tensor in `constants`.

    ``meta_memo`` (None by default; a `torchfuse.graph.meta_memo.MetaMemo`) answers an op
    whose outputs are new tensors from the metadata an earlier call with arguments of the
    same metadata got, instead of running its meta kernel again: the node recorded is the
    same. Never for arguments with symbolic sizes (the size environment decides those).
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a dispatch mode's __torch_dispatch__ in a "disable dynamo" decorator
        # that imports torch's bytecode compiler at its first call: 1-4 s of every process's first
        # capture, for a frame Dynamo never sees (no torch.compile runs our recorder). This
        # is the hook torch documents for opting out of that wrapping.
        return False

    def __init__(self, builder: GraphBuilder | None = None) -> None:
        super().__init__()
        self.builder = builder or GraphBuilder()
        self.meta_memo: Any = None
        self.names: dict[int, str] = {}
        self._keep: list[torch.Tensor] = []  # ids stay valid while we hold the objects
        self.constants: dict[str, torch.Tensor] = {}
        self.loc: S.SourceLoc | None = None
        self.module_path: str | None = None

    # -- naming
    def name_of(self, t: torch.Tensor) -> str:
        name = self.names.get(id(t))
        if name is None:
            name = self.on_constant(t)
        return name

    def bind(self, t: torch.Tensor, name: str) -> None:
        if id(t) not in self.names:
            self._keep.append(t)
        self.names[id(t)] = name

    def on_constant(self, t: torch.Tensor) -> str:
        if isinstance(t, FakeTensor):
            raise RuntimeError(f"fake tensor {t!r} does not belong to this recorder")
        name = self.builder.add_input(meta_of(t), name="const", kind="constant",
                                      target=f"constant{len(self.constants)}")
        self.constants[name] = t
        self.bind(t, name)
        return name

    # -- public helpers
    def input(self, example: torch.Tensor, *, name: str = "arg", kind: S.InputKind = "user_input",
              target: str | None = None, requires_grad: bool | None = None,
              sizes: Sequence[Any] | None = None) -> FakeTensor:
        """A fake for ``example`` bound to a new graph input. ``sizes`` (ints and ``SymInt``s
        of the builder's `size_env`) makes some of its sizes symbolic."""
        fake = None
        if sizes is not None and any(isinstance(n, torch.SymInt) for n in sizes):
            fake = symbolic_fake(example, sizes, requires_grad=requires_grad)
            if fake is None:
                raise ValueError(f"input {name!r}: sizes of a non-dense tensor cannot be symbolic")
        if fake is None:
            fake = FakeTensor.like(example, requires_grad=requires_grad)
        meta = meta_of(fake, device=device_name(_fake_device(example)))
        self.bind(fake, self.builder.add_input(meta, name=name, kind=kind, target=target))
        return fake

    def output(self, value: Any, *, kind: S.OutputKind = "user_output", target: str | None = None) -> None:
        self.builder.add_output(encode_arg(value, self.name_of), kind=kind, target=target)

    @contextlib.contextmanager
    def location(self, loc: S.SourceLoc | None, module_path: str | None = None):
        """Tag nodes recorded inside the block with a source location."""
        prev = self.loc, self.module_path
        self.loc, self.module_path = loc, module_path
        try:
            yield
        finally:
            self.loc, self.module_path = prev

    # -- the mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        if name in _METADATA_OPS or name.startswith("prim."):
            return _run_on_meta(func, args, kwargs)[0]
        if name == "aten.lift_fresh.default" and _is_real_scalar(args[0]):
            # ``torch.tensor(3)`` made while tracing: its value is part of the program, not an
            # input (a CPU scalar then also computes beside CUDA tensors, as in eager)
            t = args[0]
            return self.__torch_dispatch__(torch.ops.aten.scalar_tensor.default, types, (t.item(),),
                                           {"dtype": t.dtype, "device": t.device})
        if name == "aten.lift_fresh.default" and _is_real_empty(args[0]):  # ``torch.tensor([])``
            t = args[0]
            return self.__torch_dispatch__(torch.ops.aten.empty.memory_format, types, (list(t.shape),),
                                           {"dtype": t.dtype, "device": t.device})
        # name inputs before running, so constants become inputs in argument order
        enc_args = [encode_arg(a, self.name_of) for a in args]
        enc_kwargs = {k: encode_arg(v, self.name_of) for k, v in kwargs.items()}
        memo = self.meta_memo
        # real tensors (parameters) are graph inputs here, recorded as fakes are
        key = memo.key(func, args, kwargs, _never_special, real_tensors=True) if memo is not None else None
        entry = memo.get(key) if key is not None else None
        if entry is not None:  # what the meta kernel answered for arguments of this metadata
            fakes = entry.fakes()
            names = self.builder.add_node(name, enc_args, enc_kwargs, entry.metas, loc=self.loc,
                                          module_path=self.module_path)
            for o, n in zip(fakes, names, strict=True):
                self.bind(o, n)
            return fakes[0] if entry.container is None else entry.container(fakes)
        out, _ = _run_on_meta(func, args, kwargs)
        flat = out if isinstance(out, tuple | list) else [out]
        metas: list[S.TensorMeta | None] = []
        for o in flat:
            metas.append(meta_of(o, device=device_name(_fake_device(o)))
                         if isinstance(o, torch.Tensor) else None)
        if key is not None:
            memo.put(key, out, metas)
        # Plain numbers beside the tensors (the flash/cudnn attention kernels return max_q and
        # max_k) come from the meta kernel, i.e. from shapes, not data: the graph does not
        # name them ("" outputs) and a later op that takes them gets the literal. Symbolic
        # numbers or other objects would need the data, so they stop the trace.
        if any(o is not None and not isinstance(o, torch.Tensor | bool | int | float | torch.SymInt)
               for o in flat):
            raise DataDependentError(f"{name} returns a Python value that depends on data")
        names = self.builder.add_node(name, enc_args, enc_kwargs, metas, loc=self.loc,
                                      module_path=self.module_path)
        for o, n in zip(flat, names, strict=True):
            if n:
                self.bind(o, n)
        return out


def _never_special(name: str) -> bool:
    return False  # the ops a memo must not answer were handled before it is asked


def _is_real_scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.dim() == 0 and \
        not t.requires_grad and not t.is_complex() and t.device.type != "meta"


def _is_real_empty(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.numel() == 0 and \
        not t.requires_grad and t.is_contiguous() and t.device.type != "meta"


def trace(
    fn: Callable[..., Any], *examples: torch.Tensor, name: str = "graph",
    dynamic: Mapping[int, Sequence[int]] | None = None,
) -> tuple[S.Graph, dict[str, torch.Tensor]]:
    """Record ``fn`` (plain torch code, no Python control flow on values) as a Graph.

    ``fn`` runs once on fake tensors; every ATen op it reaches is recorded. Useful for tests,
    fixtures and building graphs by hand; [`torchfuse.capture.compile`][torchfuse.capture.compile]
    is the general tool (it reads bytecode, so Python control flow, guards and graph breaks work).

    Args:
        fn: The function; it takes one tensor per example and returns a tensor or a tuple or
            list of them.
        *examples: Example tensors: their dtypes, sizes and devices are recorded, not values.
        name: The graph's name.
        dynamic: Maps an example's position to the dims whose sizes become symbols (``s0``,
            ``s1``, … with sources ``input:<i>.size(<d>)``); relations the code depends on
            become the graph's guards.

    Returns:
        The graph, and the constant tensors it captured, by input name.

    Raises:
        DataDependentError: ``fn`` needs a tensor's value (``if x.sum() > 0``, ``.item()``).

    Examples:
        >>> import torch
        >>> from torchfuse.graph import trace
        >>> graph, constants = trace(lambda x, y: (x + y).relu(), torch.randn(2, 3), torch.randn(2, 3))
        >>> [(n.name, n.op) for n in graph.nodes]
        [('add', 'aten.add.Tensor'), ('relu', 'aten.relu.default')]
    """
    rec = Recorder(GraphBuilder(name))
    env = None
    if dynamic:
        from torchfuse.graph.symbolic import SizeEnv

        env = rec.builder.size_env = SizeEnv()
    with rec, _python_dispatcher(env is not None):
        fakes = []
        for i, e in enumerate(examples):
            sizes = None
            if env is not None and i in dynamic:
                sizes = [env.symbol(n, source=f"input:{i}.size({d})") if d in dynamic[i] else n
                         for d, n in enumerate(e.shape)]
            fakes.append(rec.input(e, name=f"arg{i}", sizes=sizes))
        result = fn(*fakes)
    for r in result if isinstance(result, tuple | list) else [result]:
        rec.output(r)
    return rec.builder.build(), rec.constants
