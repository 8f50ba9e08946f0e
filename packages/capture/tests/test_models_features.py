"""Interpreter features that real model code (HuggingFace-style libraries) relies on, each
checked on its own against eager, without depending on any such library."""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import logging
import warnings
import weakref
from collections import OrderedDict
from typing import Any

import pytest
import torch
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import compile, explain

# ----------------------------------------------------------------------------- decorators


def _kwarg_defaults(func: Any) -> Any:
    """A decorator with a ``(self, *args, **kwargs)`` wrapper, as libraries write them."""

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("scale", self.scale)
        return func(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = 2.0

    @_kwarg_defaults
    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin(x) * scale


def test_decorated_forward_binds_wrapper_signature():
    m = Decorated()
    x = torch.randn(2, 4)
    e = explain(m)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    # the tensor reaches the frame through *args: it is still a per-call user input
    assert [i.kind for i in e.graphs[0].inputs if i.kind == "user_input"] == ["user_input"]
    c = compile(m, backend="eager")
    assert_same(c(x), m(x))
    x2 = torch.randn(2, 4)
    assert_same(c(x2), m(x2))
    assert_same(c(x, scale=3.0), m(x, scale=3.0))


def _claims_signature(fn):
    """A ``*args, **kwargs`` wrapper that carries ``fn``'s signature (transformers'
    ``use_kernel_forward_from_hub`` functions are made so)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper.__signature__ = inspect.signature(fn)
    return wrapper


@_claims_signature
def _conv_like(x: torch.Tensor, k: int, scale: float = 1.0, **kwargs) -> torch.Tensor:
    return x * k * scale


def test_a_wrapper_claiming_another_signature_binds_by_its_code():
    """The binder follows the code Python runs (``*args, **kwargs``), not ``__signature__``:
    built from the claimed signature it named ``args`` it did not have (a NameError on Mamba)."""
    x = torch.randn(3)
    c = compile(_conv_like, backend="eager")
    assert_same(c(x, 2), _conv_like(x, 2))
    assert_same(c(x, k=3, scale=0.5), _conv_like(x, k=3, scale=0.5))
    with pytest.raises(TypeError):  # the wrapped function's own error, raised inside
        c(x)
    with pytest.raises(TypeError):
        _conv_like(x)


def test_the_binder_keeps_every_kind_of_parameter():
    from torchfuse.capture.convert import code_signature, make_binder

    def f(a, b=2, /, c=3, *rest, d, e=5, **extra):
        return a

    assert str(code_signature(f)) == "(a, b=2, /, c=3, *rest, d, e=5, **extra)"
    assert make_binder(f)(1, d=4) == (1, 2, 3, 4, 5, (), {})
    assert make_binder(f)(1, 7, 8, 9, d=4, z=0) == (1, 7, 8, 4, 5, (9,), {"z": 0})
    with pytest.raises(TypeError):
        make_binder(f)(1)  # d is missing: the same error as calling f


# ----------------------------------------------------------------------------- introspection


class Registry(nn.Module):
    table = {"Registry": 3.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factor = self.table.get(self.__class__.__name__, 1.0)
        return x * factor + len(str(self.__class__))


def test_class_attribute_of_instance():
    m = Registry()
    x = torch.randn(3)
    e = explain(m)(x)
    assert e.graph_break_count == 0
    assert_same(compile(m, backend="eager")(x), m(x))


def _mode_flags() -> tuple[bool, bool, bool]:
    return (torch.compiler.is_compiling(), torch.jit.is_tracing(), torch.jit.is_scripting())


def test_compiling_flags_are_truthful():
    def f(x):
        compiling, tracing, scripting = _mode_flags()
        if compiling:
            x = x + 1
        if tracing or scripting:
            x = x * 100
        return x

    x = torch.randn(3)
    assert _mode_flags() == (False, False, False)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    torch.testing.assert_close(compile(f, backend="eager")(x), x + 1)


# ----------------------------------------------------------------------------- config objects


class AliasConfig:
    """A config whose attribute names have aliases resolved in ``__getattribute__``."""

    attribute_map = {"num_layers": "n_layer", "hidden": "n_embd"}

    def __init__(self, n_layer: int, n_embd: int) -> None:
        self.n_layer = n_layer
        self.n_embd = n_embd
        self.flag = True

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    @property
    def double(self) -> int:
        return 2 * self.n_embd

    def scaled(self, v: int) -> int:
        return v * self.n_layer


def test_config_with_custom_getattribute_is_read_and_guarded():
    cfg = AliasConfig(2, 4)

    def f(x):
        out = x * cfg.num_layers + cfg.hidden + cfg.double + cfg.scaled(1)
        if getattr(cfg, "missing", None) is None and cfg.flag:
            out = out - 1
        return out

    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    text = str(e)
    assert "num_layers == 2" in text  # the attribute read is guarded under its own name
    c = compile(f, backend="eager")
    assert_same(c(x), f(x))
    cfg.n_layer = 5  # read through the alias: the guard sees the change and recaptures
    assert_same(c(x), f(x))


# ----------------------------------------------------------------------------- containers


class Interface:
    """A mapping-like registry with a Python ``__getitem__`` (not a dict subclass)."""

    def __init__(self) -> None:
        self._mapping = {"double": lambda t: t * 2, "square": lambda t: t * t}

    def __getitem__(self, key: str) -> Any:
        return self._mapping[key]


FUNCS = Interface()


def test_subscript_of_object_with_getitem():
    def f(x):
        return FUNCS["double"](x) + FUNCS["square"](x)

    x = torch.randn(4)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


class LayerBase(abc.ABC):
    @abc.abstractmethod
    def update(self, t: torch.Tensor) -> torch.Tensor: ...


class GrowingLayer(LayerBase):
    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.initialized = False

    def update(self, t: torch.Tensor) -> torch.Tensor:
        if not self.initialized:
            self.keys = torch.tensor([], dtype=t.dtype, device=t.device)
            self.initialized = True
        self.keys = torch.cat([self.keys, t], dim=-2)
        return self.keys


W = torch.randn(3, 4)


def test_abc_object_made_inside_and_returned():
    def f(x):
        layer = GrowingLayer()
        y = layer.update(x)
        y = layer.update(y * W)  # a constant tensor made mid-capture, then a global
        return y.sum(), layer

    x = torch.randn(2, 3, 4)
    assert explain(f)(x).graph_break_count == 0
    got, layer = compile(f, backend="eager")(x)
    want, ref = f(x)
    assert_same(got, want)
    assert type(layer) is GrowingLayer and layer.initialized
    assert_same(layer.keys, ref.keys)


@dataclasses.dataclass
class Record(OrderedDict):
    """A dataclass that is also an ordered dict of its non-None fields (a model output)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    extra: tuple[torch.Tensor, ...] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self[k] for k in self.keys())


def test_dataclass_mapping_built_read_and_returned():
    def f(x):
        out = Record(logits=x * 2, extra=(x, x + 1))
        first = out[0]
        return Record(loss=first.sum(), logits=out.logits + out["logits"], extra=out.extra)

    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    got, want = compile(f, backend="eager")(x), f(x)
    assert type(got) is Record and list(got.keys()) == list(want.keys())
    for k in want:
        assert_same(got[k], want[k])
    assert_same(got.loss, want.loss) and assert_same(got.extra, want.extra)
    assert got.to_tuple()[0] is got.loss


def test_dataclass_mapping_with_missing_fields():
    def f(x):
        return Record(logits=x.relu())

    x = torch.randn(3)
    got, want = compile(f, backend="eager")(x), f(x)
    assert type(got) is Record and list(got) == ["logits"] and got.loss is None
    assert_same(got.logits, want.logits)


# ----------------------------------------------------------------------------- inputs


def test_constant_tensor_made_mid_capture_keeps_input_order():
    b1, b2 = torch.randn(3, 4), torch.randn(2, 3, 4)

    def f(x):
        empty = torch.tensor([], dtype=x.dtype)  # a constant met between two globals
        y = torch.cat([empty, x * b1], dim=-2)
        return y * b2

    x = torch.randn(2, 3, 4)
    c = compile(f, backend="eager")
    assert_same(c(x), f(x))
    x2 = torch.randn(2, 3, 4)
    assert_same(c(x2), f(x2))


# ----------------------------------------------------------------------------- side effects


_log = logging.getLogger("torchfuse.test.models")


def test_logging_and_warnings_do_not_break():
    def f(x):
        _log.warning("about to scale")
        _log.info("info %s", 3)
        warnings.warn("deprecated path", DeprecationWarning, stacklevel=2)
        return x * 3

    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(compile(f, backend="eager")(x), x * 3)


def test_autocast_state_does_not_leak_from_failed_capture():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print("breaks here")
            return y

    x = torch.randn(4, 4)
    explain(f)(x)
    assert not torch.is_autocast_enabled("cpu")
    c = compile(f, backend="eager")
    got = c(x)
    assert not torch.is_autocast_enabled("cpu")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, f(x))


def test_weakref_call_resolves_to_known_object():
    m = nn.Linear(3, 3)
    ref = weakref.ref(m.weight)

    def f(x):
        w = ref()
        if w is m.weight:
            return x @ w.t()
        return x

    x = torch.randn(2, 3)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autocast_inside_matches_eager(dtype):
    lin = nn.Linear(8, 8)

    def f(x):
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            return lin(x).softmax(-1)

    x = torch.randn(4, 8)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


def test_dataclass_mapping_item_and_attribute_writes():
    @dataclasses.dataclass
    class Out(OrderedDict):
        a: torch.Tensor | None = None
        b: tuple[torch.Tensor, ...] | None = None

        def __post_init__(self) -> None:
            for f in dataclasses.fields(self):
                if getattr(self, f.name) is not None:
                    self[f.name] = getattr(self, f.name)

        def __setitem__(self, key: str, value: Any) -> None:
            super().__setitem__(key, value)
            super().__setattr__(key, value)

        def __setattr__(self, name: str, value: Any) -> None:
            if name in self.keys() and value is not None:
                super().__setitem__(name, value)
            super().__setattr__(name, value)

    def f(x):
        out = Out(a=x + 1)
        out["b"] = (x * 2, x * 3)  # item write: the attribute follows
        out.a = out.a * 10  # attribute write: the item follows
        return out, out.b[1], out["a"]

    x = torch.randn(3)
    assert explain(f)(x).graph_break_count == 0
    (got, b1, a), (want, wb1, wa) = compile(f, backend="eager")(x), f(x)
    assert type(got) is Out and list(got) == list(want) == ["a", "b"]
    assert_same(got.a, want.a) and assert_same(got["b"], want["b"])
    assert_same(b1, wb1) and assert_same(a, wa)


def test_hasattr_and_getattr_default_on_constants():
    def f(x, cache=None):
        if hasattr(cache, "is_sliding") and cache.is_sliding:
            return x
        return x + getattr(cache, "offset", 2)

    x = torch.randn(3)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


# ----------------------------------------------------------------------------- module hooks


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


def test_forward_hooks_are_captured():
    m = Two()
    seen: list[torch.Tensor] = []
    m.a.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.a.register_forward_hook(lambda mod, args, out: out + 1)
    m.b.register_forward_hook(lambda mod, args, out: seen.append(out))  # returns None: kept
    m.b.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] - 1,), kwargs), with_kwargs=True)
    m.b.register_forward_hook(lambda mod, args, kwargs, out: out * 3, with_kwargs=True)
    x = torch.randn(2, 4)
    e = explain(m)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    c = compile(m, backend="eager")
    got = c(x)
    want = m(x)
    assert_same(got, want)
    assert len(seen) == 3  # explain, compiled, eager
    assert_same(seen[1], seen[2])


def test_hook_added_or_removed_after_compile_is_seen():
    m = Two()
    x = torch.randn(2, 4)
    c = compile(m, backend="eager")
    assert_same(c(x), m(x))
    handle = m.b.register_forward_hook(lambda mod, args, out: out * 0)
    assert_same(c(x), m(x))
    assert c(x).abs().sum().item() == 0
    handle.remove()
    assert_same(c(x), m(x))
    assert c(x).abs().sum().item() != 0


def test_finfo_constants_fold():
    def f(x):
        lo = torch.finfo(x.dtype).min
        big = torch.iinfo(torch.int32).max
        return x.masked_fill(x < 0, lo) + (big > 0)

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5).to(dtype)
        e = explain(f)(x)
        assert e.graph_count == 1 and e.graph_break_count == 0
        assert_same(compile(f, backend="eager")(x), f(x))


class Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = AliasConfig(2, 4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.config.flag:
            y = y * self.config.num_layers
        return y


def test_config_held_by_module_change_is_seen():
    m = Configured()
    x = torch.randn(2, 4)
    c = compile(m, backend="eager")
    assert_same(c(x), m(x))
    m.config.flag = False  # no module attribute is set: the config's own guard must see it
    assert_same(c(x), m(x))
    m.config.n_layer = 7
    m.config.flag = True
    assert_same(c(x), m(x))


def _chunked(fn: Any, x: torch.Tensor) -> torch.Tensor:
    n_args = len(inspect.signature(fn).parameters)
    return fn(x) if n_args == 1 else fn(x, x)


def _unique(*fns: Any) -> int:
    return len({id(fn): fn for fn in fns})


def _two(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b


def test_signature_and_id_of_functions():
    m = Two()

    def f(x):
        return _chunked(m.forward, x) + _chunked(_two, x) * _unique(_two, _chunked, _two, m)

    x = torch.randn(2, 4)
    assert explain(f)(x).graph_break_count == 0
    assert_same(compile(f, backend="eager")(x), f(x))


class _Probe:
    calls = 0


def _compile_constant(fn):
    fn._dynamo_marked_constant = True  # what transformers' _make_compile_constant sets
    return fn


@functools.lru_cache
@_compile_constant
def _backend_available() -> bool:
    _Probe.calls += 1
    return len(vars(_Probe)) > 0  # vars() is a break when traced


@_compile_constant
def _marked_but_raises(flag: bool) -> bool:
    if flag:
        raise RuntimeError("probe failed")
    return False


def test_a_function_marked_constant_is_called_not_traced():
    def f(x):
        return x * 2 if _backend_available() else x

    x = torch.randn(3)
    e = explain(f)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, str(e)
    assert_same(compile(f, backend="eager")(x), f(x))
    assert _Probe.calls == 1  # the real function ran once; the lru_cache served the rest

    def g(x, flag):
        return x + _marked_but_raises(flag)

    with pytest.raises(RuntimeError, match="probe failed"):
        compile(g, backend="eager")(x, True)
    assert_same(compile(g, backend="eager")(x, False), g(x, False))


def test_a_function_marked_constant_with_a_tensor_argument_is_traced():
    @_compile_constant
    def scaled(t):
        return t * 3

    def f(x):
        return scaled(x) + 1

    x = torch.randn(3)
    assert_same(compile(f, backend="eager")(x), f(x))
    assert_same(compile(f, backend="eager")(x + 1), f(x + 1))  # not baked in
