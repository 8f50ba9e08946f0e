"""Python's ``random`` in a compiled function: a float draw is a graph input, drawn per call.

A call of a float-valued method of a ``random.Random`` — the module functions
(``random.random()``, ``random.uniform(0.5, 1.5)``, ``random.gauss(0, 1)`` …, methods of the
module's hidden instance) or a user's instance (``rng = random.Random(0)`` read from outside)
— with constant arguments is not run while capturing. It becomes a 0-d ``float64`` graph
input whose value the entry's input gathering draws on every call, in program order, from
that very generator::

    def f(x):
        return x * random.random()
    # graph:  f(x, random_0) -> [mul(x, random_0)]
    # gather: (L[0], torch.full((), R4(), dtype=torch.float64))   # R4 is random.random

so the value is never baked in as a constant, ``random.seed(n)`` before a call reproduces
eager's numbers, and the generator advances as eager advances it. The draw is a
[`RandomDrawVar`][torchfuse.capture.pyrandom.RandomDrawVar]: arithmetic and comparisons with
tensors use its input, as for a float argument (`torchfuse.capture.operators`).

When Python needs the value itself (``if random.random() < p:``, ``random.random() * 2``,
returning it), capture stops and starts over with a graph break *at the draw*
(`DrawNeeded`): the draw then runs in Python and what follows resumes with the float as an
argument of its resume function.

An integer draw — ``randint(a, b)``, ``randrange(...)``, ``getrandbits(k)``, or ``choice``
of a constant sequence of ints — is drawn the same way, into a 0-d ``int64`` input (an
[`IntDrawVar`][torchfuse.capture.pyrandom.IntDrawVar]; ``choice`` of floats is a float
draw)::

    def f(x):
        return x * random.randint(1, 5)
    # graph:  f(x, random_0) -> [mul(x, random_0)]
    # gather: (L[0], torch.full((), R4(1, 5), dtype=torch.int64))   # R4 is random.randint

Tensor arithmetic (``+ - * / // %``) and comparisons use the input, cast where a Python int
would give another dtype; anything else that needs the int (``range(n)``, a size, Python
arithmetic) breaks at the draw, as for floats. ``shuffle`` and ``sample`` are still calls
capture does not model, i.e. graph breaks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import types
from collections.abc import Iterator
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.dynamic import contains_symbolic
from torchfuse.capture.errors import Unsupported
from torchfuse.capture.source import FloatCarrierSource, IntCarrierSource, Source

FLOAT_METHODS = frozenset({
    "random", "uniform", "triangular", "normalvariate", "gauss", "lognormvariate",
    "expovariate", "vonmisesvariate", "gammavariate", "betavariate", "paretovariate",
    "weibullvariate",
})
"""``random.Random`` methods whose result is a float computed from the generator alone."""

INT_METHODS = frozenset({"randint", "randrange", "getrandbits", "choice"})
"""``random.Random`` methods drawn per call as ints (``choice``: of a constant sequence of
ints, or of floats, then a float draw)."""


class DrawNeeded(Unsupported):
    """Raised when Python needs the value of the ``ordinal``-th draw of a capture: the
    capture starts over with a break at that draw (`convert._capture`)."""

    def __init__(self, ordinal: int, loc: Any) -> None:
        super().__init__("the value of a Python random draw is needed in Python", loc)
        self.ordinal = ordinal


class _Draw:
    """What float and int draws share: the ``ordinal``-th draw of the capture, a graph input
    ``carrier``; reading its value is not possible while capturing (``python()`` and
    ``value`` raise `DrawNeeded`)."""

    def __init__(self, ordinal: int, carrier: Any, what: str) -> None:
        V.Var.__init__(self)  # type: ignore[arg-type]
        self.ordinal = ordinal
        self.carrier = carrier
        self.what = what
        self.source = None

    @property
    def value(self) -> Any:
        from torchfuse.capture.context import current

        raise DrawNeeded(self.ordinal, current().loc)

    @value.setter
    def value(self, _: Any) -> None:  # ConstVar.__init__ would set it
        pass

    def python(self) -> Any:
        return self.value


class RandomDrawVar(_Draw, V.FloatArgVar):
    """A float drawn from a Python generator, a graph input (see the module docstring)."""

    py_float = True  # a Python float for arithmetic (torchfuse.capture.floats)

    def python_type(self) -> type:
        return float

    def describe(self) -> str:
        return f"{self.what} (a Python random draw, a graph input)"


class IntDrawVar(_Draw, V.ConstVar):
    """An int drawn from a Python generator, a 0-d int64 graph input ``carrier`` (see the
    module docstring). Tensor operators use the carrier (`torchfuse.capture.operators`);
    reading the value raises `DrawNeeded`, as for a float draw."""

    int_carrier = True  # tensor operators use the carrier (torchfuse.capture.operators)

    def python_type(self) -> type:
        return int

    def describe(self) -> str:
        return f"{self.what} (a Python random int draw, a graph input)"


@dataclasses.dataclass(frozen=True, slots=True)
class RandomDrawSource(Source):
    """One draw made on each call: ``R4(0.5, 1.5)``, where ``R4`` (in the checks'
    namespace) is the bound method of the generator, e.g. ``random.uniform``."""

    name: str
    args: str

    def expr(self) -> str:
        return f"{self.name}({self.args})"


def _generator_method(value: Any, args: list[V.Var]) -> tuple[Any, str, Source | None] | None:
    """``(generator, method name, generator's source)`` when ``value`` is a float method of
    a ``random.Random`` bound to an instance (``random.random``, a bound ``rng.uniform``), or
    the class's method called with an instance read from outside first (``rng.random()`` on
    a global ``rng``: the draw then reads ``rng`` through its source on each call)."""
    name = getattr(value, "__name__", None)
    if name not in FLOAT_METHODS and name not in INT_METHODS:
        return None
    owner = getattr(value, "__self__", None)
    source = None
    if not isinstance(owner, random.Random):
        first = args[0] if args else None
        obj = getattr(first, "value", None) if isinstance(first, V.UserObjVar | V.ObjVar) else None
        if not isinstance(obj, random.Random) or getattr(type(obj), name, None) is not value:
            return None
        owner, source = obj, first.source
        value = getattr(obj, name)
    if isinstance(value, types.MethodType):  # uniform, gauss …: Random's own Python methods
        if getattr(random.Random, name, None) is not value.__func__:
            return None  # a subclass overrides it: interpreted as any method is
    elif getattr(type(owner), name) is not getattr(random.Random, name):
        return None  # a subclass written in Python replaced the primitive (random, getrandbits)
    if name in INT_METHODS and (type(owner).random is not random.Random.random or
                                type(owner).getrandbits is not random.Random.getrandbits):
        return None  # randint … call the primitives: a Python override may do anything
    return owner, name, source


def _constant(v: V.Var) -> Any:
    """The Python value of a constant argument (guarded), or ``_NOT`` when it varies; a
    sequence of constants (``choice([1, 2, 3])``) is a tuple."""
    if isinstance(v, V.ListVar):
        items = [_constant(i) for i in v.items]
        return _NOT if any(i is _NOT for i in items) else tuple(items)
    if not isinstance(v, V.ConstVar) or isinstance(v, V.FloatArgVar | IntDrawVar):
        return _NOT
    value = v.python()
    return _NOT if contains_symbolic(value) else value


_NOT = object()


def _result_kind(owner: Any, method: str, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """``"float"`` or ``"int"``: what the draw gives, found by drawing on a copy of the
    generator (an error eager would raise, or any other result, is ``None``: the call is
    then interpreted as any call is)."""
    if method in FLOAT_METHODS:
        return "float"
    try:
        trial = random.Random()
        trial.setstate(owner.getstate())
        got = getattr(trial, method)(*args, **kwargs)
    except Exception:  # a bad argument; SystemRandom has no state
        return None
    if method == "choice":
        kinds = {type(v) for v in args[0]} if len(args) == 1 and isinstance(args[0], tuple | list) else set()
        return {frozenset({int}): "int", frozenset({float}): "float"}.get(frozenset(kinds))
    return "int" if type(got) is int else None


def draw(value: Any, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var | None:
    """The draw ``value(*args, **kwargs)`` as a graph input, or ``None`` when ``value`` is
    not a float method of a generator. Arguments must be constants (each is guarded)."""
    found = _generator_method(value, args)
    if found is None:
        return None
    from torchfuse.capture.context import InputSlot, current

    ctx = current()
    owner, method, owner_source = found
    if getattr(value, "__self__", None) is not owner:  # Random.random(rng): rng is args[0]
        args = args[1:]
        value = getattr(owner, method)
    consts = [_constant(a) for a in args]
    kw = {k: _constant(v) for k, v in kwargs.items()}
    if any(c is _NOT for c in [*consts, *kw.values()]):
        raise Unsupported(f"random.{method}() of values known only when the graph runs", ctx.loc)
    kind = _result_kind(owner, method, consts, kw)
    if kind is None:
        return None
    ordinal = ctx.random_draws
    ctx.random_draws += 1
    if ordinal in ctx.break_draws:
        raise Unsupported(f"random.{method}() whose value Python needs (drawn in Python)", ctx.loc)
    text = ", ".join([*(repr(a) for a in consts), *(f"{k}={v!r}" for k, v in kw.items())])
    # through the generator's source when it has one (a global ``rng`` may be replaced)
    callee = f"{owner_source.expr()}.{method}" if owner_source is not None else ctx.guards._obj(value, "R")
    source = RandomDrawSource(callee, text)
    device = next((str(t.device) for _, t in ctx.input_tensors if t.device.type != "cpu"), None)
    dtype, carrier_source = ((torch.float64, FloatCarrierSource) if kind == "float"
                             else (torch.int64, IntCarrierSource))
    carrier = torch.zeros((), dtype=dtype, device=device)  # a stand-in: never drawn now
    fake = ctx.rec.input(carrier, name=f"random_{ordinal}", kind="user_input")
    ctx.inputs.append(InputSlot(ctx.rec.names[id(fake)], "user_input", carrier_source(source, device)))
    ctx._keep.append(carrier)
    ctx.random_generators.append(owner)
    return (RandomDrawVar if kind == "float" else IntDrawVar)(ordinal, fake, f"random.{method}({text})")


@contextlib.contextmanager
def states_kept(generators: list[Any]) -> Iterator[None]:
    """Gathering example inputs for a backend draws from ``generators``: put them back as
    they were, so that the call that follows draws what eager would."""
    saved = [(g, g.getstate()) for g in dict.fromkeys(generators)]
    try:
        yield
    finally:
        for g, state in saved:
            g.setstate(state)


__all__ = ["FLOAT_METHODS", "INT_METHODS", "DrawNeeded", "IntDrawVar", "RandomDrawSource", "RandomDrawVar",
           "draw", "states_kept"]
