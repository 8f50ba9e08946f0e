"""Modules made inside a compiled function (``nn.CrossEntropyLoss()``, a library's
activation built on every lookup), as capture meets their construction.

A module made per call must not carry any of the graph's state: it is built for real and
used as a module made before the call only when it holds no tensor. A torch module is built
natively from constant arguments (a trial build, the global generator left as it was).
Another module class has its ``__init__`` interpreted on a new object, so its reads are
guarded and its side effects replayed like any function's; when that stored only constants
and functions, the module is built for real from them. Anything else is a break that says
to make the module in ``__init__``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.custom_function import Interpreter
from torchfuse.capture.errors import Unsupported


def construct(cls: type, args: list[V.Var], kwargs: dict[str, V.Var], interp: Interpreter) -> V.Var:
    """A module made in the function (``CrossEntropyLoss()``, ``nn.GELU()``, a library's
    activation class): built for real when it holds no tensors, so that nothing of the
    graph's state lives in it; any other module must be made in ``__init__``.

    A torch module is built natively from constant arguments. Another class's ``__init__``
    is interpreted (`_interpret_init`), and the module is built for real from what
    it stored when that is only constants and functions."""
    ctx = current()
    if not cls.__module__.startswith("torch") and type(cls) is type and \
            inspect.getattr_static(cls, "__new__") is object.__new__:
        loc = ctx.loc
        try:
            built = _interpret_init(cls, args, kwargs, interp)
        except Unsupported as e:  # a break inside __init__ is a break at the construction
            raise Unsupported(f"creating module {cls.__name__} inside a compiled function "
                              f"({e.reason})", loc, "create modules in __init__") from None
        if built is not None:
            return built
    if cls.__module__.startswith("torch.nn.modules") and \
            all(isinstance(a, V.ConstVar) for a in [*args, *kwargs.values()]):
        # a trial build: a module with parameters initializes them from the global generator,
        # which must be left as it was, since Python then builds it again after the break
        cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):
            mod = cls(*[a.python() for a in args], **{k: v.python() for k, v in kwargs.items()})
        if not any(True for _ in mod.parameters()) and all(b is None for b in mod._buffers.values()) \
                and not any(True for _ in mod.children()):
            return V.ModuleVar(mod, None)
    raise Unsupported(f"creating module {cls.__name__} inside a compiled function", ctx.loc,
                      "create modules in __init__")


def _interpret_init(cls: type, args: list[V.Var], kwargs: dict[str, V.Var],
                    interp: Interpreter) -> V.Var | None:
    """``cls(*args, **kwargs)`` of a module class written outside torch: its ``__init__`` is
    interpreted on a new object, ``nn.Module.__init__`` included. When that left the
    module's own tables empty (no parameter, buffer, submodule or hook) and stored only
    constants and functions, the module is built for real (``nn.Module.__init__`` natively,
    then those attributes) and used as a module made before the call. None otherwise."""
    module = object.__new__(cls)
    var = V.ModuleVar(module, None, is_new=True)
    init = inspect.getattr_static(cls, "__init__")
    interp.call(V.BoundMethodVar(V.ObjVar(init), var), args, kwargs)
    var.is_new = False
    torch.nn.Module.__init__(module)
    tables = set(module.__dict__) - {"training"}
    if not tables <= set(var.overrides):
        return None  # nn.Module.__init__ was not called
    stored: dict[str, Any] = {}
    for name, value in var.overrides.items():
        if name in tables:
            fresh = module.__dict__[name]
            if isinstance(value, V.ConstVar) and value.value == fresh:
                continue
            if not isinstance(value, V.DictVar | V.SetVar) or value.items:
                return None  # a parameter, buffer, submodule or hook
        elif isinstance(value, V.ConstVar | V.FunctionVar) or _plain_function(value):
            stored[name] = value.python()
        else:
            return None
    for name, value in stored.items():
        setattr(module, name, value)
    return V.ModuleVar(module, None)


def _plain_function(var: V.Var) -> bool:
    """An outside callable that is not a module or a tensor (``torch.tanh``, ``F.silu``)."""
    return isinstance(var, V.ObjVar) and callable(var.value) and \
        not isinstance(var.value, torch.nn.Module | torch.Tensor)
