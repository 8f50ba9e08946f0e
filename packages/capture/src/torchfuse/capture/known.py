"""Values known while capturing: tensors computed from constants alone.

Capture runs ops on fake tensors, which have no data. Some tensors a model makes, though,
depend on no input at all: an attention mask built from ``torch.arange`` over the sequence
length, a position index, a ``torch.full`` of ``finfo.min``. Their values follow from the
program and from sizes that the guards fix, so they are the same on every call the graph
serves. `KnownValues` computes them beside the fakes, on small real CPU tensors, so that
capture can answer questions eager answers by looking at data:

- ``bool(t)``, ``t.item()``, ``t.all()`` used in Python control flow (``if mask.all():``): the
  answer is taken from the known value instead of breaking the graph;
- an attention mask that masks nothing is dropped before ``scaled_dot_product_attention``
  picks its kernel, as ``transformers`` drops it when it can look at the mask in eager mode.
  Eager then runs flash attention; with the mask kept, the GPU can only pick the
  memory-efficient kernel or the math fallback (BERT's training step on an H200).

A value is known when the op makes it from no tensors at all (``arange``, ``ones``, ``full``,
``scalar_tensor``, and ``torch.tensor([...])`` or ``new_tensor([...])`` of Python values, whose
``lift_fresh`` sees the real tensor torch made from them; never ``empty`` or a random draw) or
from tensors that are all known, the
op is deterministic, no size is symbolic, and each fresh result holds at most `MAX_BYTES`
(floating point) or `MAX_EXACT_BYTES` (boolean and integer: masks, indices). Views of a
known tensor are views of its real value, so an in-place write through one is seen through
the others, as on the device. An in-place op with an unknown
input forgets the known values of every tensor that shares memory with what it writes. Values are
computed on the CPU with autocast off; integer and boolean results are exact, and float
results can differ from the device's in the last bits, which only matters for a Python branch
that compares a computed float at the edge.

Tensors that come from outside the function (inputs, parameters, buffers, globals) are never
known: their contents can change between calls without a guard noticing.

A random draw is never known, but its *range* is: ``torch.rand`` and ``rand_like`` give values
in [0, 1) (taken as [0, 1]: a draw rounded to a low-precision dtype can reach 1.0). A
comparison of such a draw with a number that the range decides (``torch.rand([]) < 0.0`` is
false whatever was drawn, ``<= 1.0`` true) is then known: a tensor of that answer. This is
LayerDrop as ``transformers`` wrote it before 5.2x (OPT, BART, Whisper and their kin, in
training): ``if torch.rand([]) < self.layerdrop: continue`` with ``layerdrop == 0.0`` broke
the graph at every layer. The draw itself stays in the graph; a range is forgotten when its
tensor's memory is written to, and a draw the range does not decide (``layerdrop = 0.1``)
still breaks the graph, as it must.
"""

from __future__ import annotations

from typing import Any

import torch
from torchfuse.graph.interpreter import no_autocast
from torchfuse.graph.ops import op_name
from torchfuse.graph.tracing import FakeTensor, GraphBuilder, Recorder, flat_args, is_symbolic, map_args

MAX_BYTES = 1 << 20
"""The largest fresh floating-point result (in bytes) kept beside the fakes."""

MAX_EXACT_BYTES = 16 << 20
"""The largest fresh boolean or integer result kept: attention masks and indices, whose
values are exact and which the mask checks read. A causal mask is made at the batch's size
(``transformers``: ``(batch, 1, q, kv)``; GPT-2's 8 x 512 x 512 is 2 MiB) and was lost at
1 MiB: the graph then kept the mask that eager drops (2026-12-07, seventh session)."""


def _limit(dtype: torch.dtype) -> int:
    """The largest fresh result of ``dtype`` kept: `MAX_BYTES` or `MAX_EXACT_BYTES`."""
    return MAX_BYTES if dtype.is_floating_point or dtype.is_complex else MAX_EXACT_BYTES

_NEVER = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "exponential",
          "poisson", "cauchy", "geometric", "log_normal", "random", "empty", "_local_scalar_dense",
          "set_", "resize")
"""Name fragments of ops whose results are not a function of their inputs' values (random
draws, uninitialized memory) or that change storage."""

SCALAR_QUERIES = frozenset({"aten._local_scalar_dense.default", "aten.item.default",
                            "aten.is_nonzero.default", "aten.equal.default",
                            "aten.allclose.default"})
"""Ops that read data into a Python value: answered from known values."""


_UNIT_DRAWS = frozenset({"aten.rand.default", "aten.rand_like.default", "aten.rand.generator"})
"""Random draws with values in [0, 1] (see the module doc)."""

_SAME_VALUES = frozenset({
    "aten.detach.default", "aten.alias.default", "aten.clone.default", "aten.lift_fresh.default",
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
    "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default",
    "aten.t.default", "aten.transpose.int", "aten.permute.default", "aten._to_copy.default",
    "aten.contiguous.default"})
"""Ops whose (floating-point) result holds values of their first argument: a range carries over."""

_DECIDED: dict[str, Any] = {
    # comparison -> (lo, hi, c) -> its answer for every value in [lo, hi], or None
    "lt": lambda lo, hi, c: True if hi < c else False if lo >= c else None,
    "le": lambda lo, hi, c: True if hi <= c else False if lo > c else None,
    "gt": lambda lo, hi, c: True if lo > c else False if hi <= c else None,
    "ge": lambda lo, hi, c: True if lo >= c else False if hi < c else None,
}
"""``x op c`` decided by the range of ``x`` alone."""


def _deterministic(name: str) -> bool:
    base = name.split(".")[1] if "." in name else name
    return not any(word in base for word in _NEVER)


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The tensors an op writes to (from its schema's alias annotations)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            val = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
            out += [val] if isinstance(val, torch.Tensor) else []
    return out


_LIFTS = frozenset({"aten.lift_fresh.default", "aten.lift_fresh_copy.default"})


def _fresh_literal(args: Any) -> bool:
    """``args`` of a lift: one real CPU tensor, which torch made from Python values during
    the call (a tensor from outside the frame is a fake by the time an op sees it)."""
    return len(args) == 1 and type(args[0]) is torch.Tensor and args[0].device.type == "cpu"


def _storage_key(t: torch.Tensor) -> int:
    elem = t._elem if isinstance(t, FakeTensor) else t
    return elem.untyped_storage()._cdata


class KnownValues:
    """Real CPU values of the fakes that are computed from constants alone."""

    def __init__(self) -> None:
        self._values: dict[int, tuple[FakeTensor, torch.Tensor]] = {}
        self._ranges: dict[int, tuple[FakeTensor, float, float]] = {}
        """Fakes of random draws -> the (lo, hi) their values lie in (see the module doc)."""

    def get(self, t: Any) -> torch.Tensor | None:
        """The real value of fake ``t``, when it is known."""
        entry = self._values.get(id(t)) if isinstance(t, FakeTensor) else None
        return entry[1] if entry is not None and entry[0] is t else None

    def _real_args(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
        flat = flat_args((args, kwargs))
        for a in flat:
            if isinstance(a, torch.SymInt | torch.SymFloat):
                return None
            if isinstance(a, torch.Tensor) and (not isinstance(a, FakeTensor) or self.get(a) is None):
                return None  # an input, parameter or buffer: its contents are not the program's

        def real(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                return self.get(x)
            if isinstance(x, torch.device):
                return torch.device("cpu")
            return x

        rargs, rkwargs = map_args(real, args), map_args(real, kwargs)
        if "device" in rkwargs:
            rkwargs["device"] = torch.device("cpu")
        rkwargs.pop("pin_memory", None)
        return rargs, rkwargs

    def query(self, func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """``(True, answer)`` for a data-reading op (`SCALAR_QUERIES`) on known values."""
        real = self._real_args(args, kwargs)
        if real is None:
            return False, None
        with no_autocast():
            return True, func(*real[0], **real[1])

    def after(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """Called with each recorded op and its fake result: compute the real result when
        every input is known."""
        written = _written(func, args, kwargs)
        name = op_name(func)
        if name in _LIFTS and isinstance(out, FakeTensor) and _fresh_literal(args):
            # torch.tensor([...]) / new_tensor([...]): torch made the real tensor from Python
            # values of the frame, which capture guards; it is the program's constant
            if args[0].untyped_storage().nbytes() <= _limit(args[0].dtype) and args[0].shape == out.shape:
                self._values[id(out)] = (out, args[0].clone())
            return
        real = self._real_args(args, kwargs) if _deterministic(name) else None
        fakes = [o for o in (out if isinstance(out, tuple | list) else [out]) if isinstance(o, torch.Tensor)]
        if real is None and self._by_range(name, args, out):
            return
        if real is None or any(is_symbolic(o) for o in fakes):
            self._forget(written)
            return
        try:
            with no_autocast():
                result = func(*real[0], **real[1])
        except Exception:  # a value we cannot compute is simply not known
            self._forget(written)
            return
        results = result if isinstance(result, tuple | list) else [result]
        outs = out if isinstance(out, tuple | list) else [out]
        pairs = [(f, r) for f, r in zip(outs, results, strict=False)
                 if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor)]
        for fake, value in pairs:
            if value.untyped_storage().nbytes() > _limit(value.dtype) or value.shape != fake.shape:
                continue
            self._values[id(fake)] = (fake, value)

    def _by_range(self, name: str, args: Any, out: Any) -> bool:
        """A draw of `_UNIT_DRAWS` gets its range; a comparison of a ranged draw with a number
        that the range decides gets a known value. True when ``out`` was handled here."""
        if not self._ranges and name not in _UNIT_DRAWS:
            return False  # the common case, every op of a capture without a draw: one lookup
        if not isinstance(out, FakeTensor) or is_symbolic(out):
            return False
        if name in _UNIT_DRAWS and out.dtype.is_floating_point:
            self._ranges[id(out)] = (out, 0.0, 1.0)
            return True
        if name in _SAME_VALUES and args and out.dtype.is_floating_point:
            source = self._ranges.get(id(args[0])) if isinstance(args[0], FakeTensor) else None
            if source is not None and source[0] is args[0]:
                self._ranges[id(out)] = (out, source[1], source[2])
                return True
            return False
        op, _, overload = name.removeprefix("aten.").partition(".")
        if op not in _DECIDED or overload != "Scalar" or len(args) != 2:
            return False
        x, c = args
        entry = self._ranges.get(id(x)) if isinstance(x, FakeTensor) else None
        if entry is None or entry[0] is not x or type(c) not in (int, float) or c != c:
            return False
        answer = _DECIDED[op](entry[1], entry[2], c)
        if answer is None or out.numel() * out.element_size() > _limit(out.dtype):
            return False
        self._values[id(out)] = (out, torch.full(tuple(out.shape), answer, dtype=out.dtype))
        return True

    def _forget(self, written: list[Any]) -> None:
        """Written with data we do not know: every known tensor sharing memory with a
        written one is forgotten (views share their base's storage), and so is the range of
        every draw sharing memory with one."""
        if not written or not (self._values or self._ranges):
            return
        keys = {_storage_key(t) for t in written}
        self._values = {k: v for k, v in self._values.items() if _storage_key(v[0]) not in keys}
        self._ranges = {k: v for k, v in self._ranges.items() if _storage_key(v[0]) not in keys}


class KnownRecorder(Recorder):
    """A recorder that computes known values beside the fakes (in `known`) and
    answers data reads on them (`SCALAR_QUERIES`) from those values."""

    def __init__(self, builder: GraphBuilder | None = None) -> None:
        super().__init__(builder)
        self.known = KnownValues()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if op_name(func) in SCALAR_QUERIES:
            answered, value = self.known.query(func, args, kwargs)
            if answered:
                return value
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.known.after(func, args, kwargs, out)
        return out


def noop_mask(mask: Any, known: KnownValues) -> bool:
    """True when ``mask`` (an ``attn_mask``) is known to mask nothing: all ``True`` for a
    boolean mask, all zeros for an additive one."""
    value = known.get(mask)
    if value is None:
        return False
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and bool((value == 0).all())


def causal_mask(mask: Any, known: KnownValues) -> bool:
    """True when ``mask`` is a boolean ``attn_mask`` known to be the causal one:
    ``ones(L, S).tril()`` over its last two dims (what ``is_causal=True`` means, top-left
    aligned), the same for every batch and head."""
    value = known.get(mask)
    if value is None or value.dtype != torch.bool or value.dim() < 2:
        return False
    rows, cols = value.shape[-2:]
    return bool((value == torch.ones(rows, cols, dtype=torch.bool).tril()).all())


__all__ = ["MAX_BYTES", "MAX_EXACT_BYTES", "SCALAR_QUERIES", "KnownRecorder", "KnownValues", "causal_mask",
           "noop_mask"]
