"""The stdlib's C-implemented iterator constructors and containers, modelled on Vars.

These classes have a ``__new__`` of their own, so `torchfuse.capture.calls.construct` cannot
make them as user objects; instead each constructor here builds what capture already models:

* ``itertools`` constructors over finite iterables run *for real on the lists of Vars* the
  arguments iterate to, and yield an ``IteratorVar`` of their items (tuples become tuple
  ``ListVar`` s). ``itertools.product([a, b], [c])`` is ``iter([(a, c), (b, c)])``, with
  ``a``, ``b``, ``c`` the Vars themselves: nothing is recorded, loops over it unroll.
  ``islice`` over a live iterator pulls only the items it yields, as Python's does.
* ``collections.namedtuple(...)`` with constant arguments makes its class for real.
* ``collections.deque`` is a `DequeVar`: a list of Vars and its ``maxlen``.
* ``collections.OrderedDict``, ``defaultdict`` and ``Counter`` are a `DictVar` whose ``kind``
  is that class; a ``defaultdict`` keeps its ``default_factory`` among the DictVar's ``attrs``
  and a missing key calls it (`missing_item`); ``Counter``'s Python methods are interpreted
  on the DictVar (its ``__missing__`` gives 0), ``_count_elements`` is modelled.

The endless iterators (``count``, ``cycle``, ``repeat`` without ``times``) are *lazy*
``IteratorVar`` s: each item is made when it is pulled (``next``, a ``for`` that breaks out,
``zip``/``map``/``enumerate``/``islice`` over them, which are lazy too), so nothing runs
ahead of Python. Consuming one whole (``list(count())``) is a graph break. ``starmap`` is lazy
as well: ``f(*row)`` runs when its item is pulled. ``groupby`` runs the real one lazily over
the Vars with constant keys (`_groupby`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dynamic import contains_symbolic
from torchfuse.capture.errors import Unsupported, UserException

Handler = Callable[[list[V.Var], dict[str, V.Var]], V.Var]


@dataclasses.dataclass(frozen=True, slots=True)
class Core:
    """What these models need of the interpreter, handed in by it: the interpreter imports
    this module, never the reverse (no import cycle through the stdlib models)."""

    iterate: Callable[[V.Var], list[V.Var]]
    pull: Callable[[V.Var], Iterator[V.Var]]
    binary: Callable[[str, V.Var, V.Var], V.Var]
    mutate: Callable[[V.Var], None]
    call: Callable[[V.Var, list[V.Var], dict[str, V.Var]], V.Var]
    make_dict: Handler
    list_method: Callable[[V.ListVar, str, list[V.Var], dict[str, V.Var]], V.Var]


def _const(v: V.Var | None, default: Any = None) -> Any:
    return default if v is None else v.python()


def _as_var(item: Any) -> V.Var:
    """An item the real itertools produced from lists of Vars: a Var, or a tuple of them."""
    if isinstance(item, tuple):
        return V.ListVar([_as_var(i) for i in item], tuple)
    return item if isinstance(item, V.Var) else V.ConstVar(item)


def _run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> V.Var:
    try:
        items = list(fn(*args, **kwargs))
    except (TypeError, ValueError) as e:  # eager's own error for bad arguments
        raise UserException(e, current().loc) from e
    return V.IteratorVar([_as_var(i) for i in items])


def _chain(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return V.IteratorVar([v for a in args for v in core.iterate(a)])


def _chain_from_iterable(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return V.IteratorVar([v for a in core.iterate(args[0]) for v in core.iterate(a)])


def _product(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    return _run(itertools.product, *[core.iterate(a) for a in args], repeat=_const(kwargs.get("repeat"), 1))


def _choose(fn: Callable[..., Any]) -> Handler:
    """``combinations``/``permutations``/``combinations_with_replacement``: (iterable, r)."""
    def handler(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        r = args[1] if len(args) > 1 else kwargs.get("r")
        rest = () if r is None and fn is itertools.permutations else (_const(r),)
        return _run(fn, core.iterate(args[0]), *rest)
    return handler


def _islice(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    bounds = [_const(a) for a in args[1:]]
    src = args[0]
    window = slice(*bounds) if len(bounds) > 1 else slice(bounds[0] if bounds else None)
    stop = window.stop
    if isinstance(src, V.IteratorVar) and stop is not None:
        # a live iterator gives up only the items up to ``stop``: the rest stay in it
        taken = []
        while len(taken) < stop and (v := src.next()) is not None:
            taken.append(v)
        return _run(itertools.islice, taken, *bounds)
    return _run(itertools.islice, core.iterate(src), *bounds)


def _zip_longest(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    fill = kwargs.get("fillvalue", V.ConstVar(None))
    return _run(itertools.zip_longest, *[core.iterate(a) for a in args], fillvalue=fill)


def _repeat(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    times = args[1] if len(args) > 1 else kwargs.get("times")
    obj = args[0] if args else kwargs["object"]
    if times is None:
        return V.IteratorVar([], iter(lambda: obj, None), bounded=False)
    return V.IteratorVar([obj] * max(0, _const(times)))


def _number(v: V.Var, what: str) -> None:
    if isinstance(v, V.ConstVar) and not isinstance(v.value, int | float | complex):
        raise UserException(TypeError(f"a number is required, not {type(v.value).__name__} ({what})"),
                            current().loc)


def _count(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``count(start, step)``: ``start``, then each item plus ``step`` (as CPython adds them,
    so a float step accumulates as in eager); Vars of any kind, made as they are pulled."""
    start = args[0] if args else kwargs.get("start", V.ConstVar(0))
    step = args[1] if len(args) > 1 else kwargs.get("step", V.ConstVar(1))
    _number(start, "start")
    _number(step, "step")

    def gen() -> Any:
        v = start
        while True:
            yield v
            v = core.binary("+", v, step)
    return V.IteratorVar([], gen(), bounded=False)


def _cycle(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``cycle(iterable)``: the first round pulls from the iterable (lazily, as Python does),
    saving what it yields; later rounds repeat the saved Vars."""
    src = core.pull(args[0])

    def gen() -> Any:
        saved = []
        for v in src:
            saved.append(v)
            yield v
        while saved:
            yield from saved
    return V.IteratorVar([], gen(), bounded=False)


def _accumulate(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    func = args[1] if len(args) > 1 else kwargs.get("func")
    initial = kwargs.get("initial")
    acc: list[V.Var] = [] if initial is None else [initial]
    for v in core.iterate(args[0]):
        if not acc:
            acc.append(v)
        elif func is None:
            acc.append(core.binary("+", acc[-1], v))
        else:
            acc.append(core.call(func, [acc[-1], v], {}))
    return V.IteratorVar(acc)


def _starmap(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``starmap(f, rows)``: lazy, as Python's: ``f(*row)`` is called when an item is pulled."""
    if kwargs or len(args) != 2:
        raise Unsupported("itertools.starmap with these arguments", current().loc)
    func, rows = args[0], core.pull(args[1])

    def gen() -> Iterator[V.Var]:
        for row in rows:
            yield core.call(func, core.iterate(row), {})
    return V.IteratorVar([], gen())


class _GroupKey:
    """A key of ``groupby`` as the real ``itertools.groupby`` sees it: equal when the constant
    keys are; ``var`` is what the user's code gets back."""

    __slots__ = ("value", "var")

    def __init__(self, var: V.Var) -> None:
        if not isinstance(var, V.ConstVar) or isinstance(var, V.FloatArgVar) or contains_symbolic(var.value):
            raise Unsupported("itertools.groupby with keys that are not constants", current().loc)
        self.var, self.value = var, var.python()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _GroupKey) and bool(self.value == other.value)

    __hash__ = None  # type: ignore[assignment]


def _groupby(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``groupby(iterable, key=None)``: the real ``itertools.groupby`` run lazily over the
    Vars, comparing constant keys (the user's ``key`` is called as items are pulled), so a
    group is cut short by advancing past it exactly as in Python. Each row is the tuple
    ``(key, iterator of the group's Vars)``."""
    if len(args) not in (1, 2) or set(kwargs) - {"key"} or (len(args) == 2 and kwargs):
        raise Unsupported("itertools.groupby with these arguments", current().loc)
    key = args[1] if len(args) == 2 else kwargs.get("key", V.ConstVar(None))
    plain = isinstance(key, V.ConstVar) and key.value is None

    def keyfunc(item: V.Var) -> _GroupKey:
        return _GroupKey(item if plain else core.call(key, [item], {}))

    groups = itertools.groupby(core.pull(args[0]), keyfunc)

    def gen() -> Iterator[V.Var]:
        for k, group in groups:
            yield V.ListVar([k.var, V.IteratorVar([], iter(group))], tuple)
    return V.IteratorVar([], gen())


# ----------------------------------------------------------------------------- collections


def _ordered_dict(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    plain = core.make_dict(args, kwargs)
    return V.DictVar(plain.items, kind=collections.OrderedDict)


def _defaultdict(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    factory = args[0] if args else V.ConstVar(None)
    plain = core.make_dict(list(args[1:]), kwargs)
    return V.DictVar(plain.items, kind=collections.defaultdict, attrs={"default_factory": factory})


def _counter(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``Counter(iterable_or_mapping, **counts)``: a `DictVar` of kind ``Counter``, whose
    Python methods (``most_common``, ``update``, ``__missing__`` …) are then interpreted on
    it. Made here because ``Counter.__init__`` goes through ``super().__init__()`` and the C
    helper ``_count_elements``."""
    if len(args) > 1:
        raise UserException(TypeError(f"expected at most 1 argument, got {len(args)}"), current().loc)
    var = V.DictVar({}, kind=collections.Counter)
    if args and not (isinstance(args[0], V.ConstVar) and args[0].value is None):
        src = args[0]
        if isinstance(src, V.DictVar) or (isinstance(src, V.ConstVar) and isinstance(src.value, dict)):
            var.items.update(core.make_dict([src], {}).items)  # an empty Counter's update copies
        else:
            _count_elements(core, [var, src], {})
    for k, v in kwargs.items():
        var.items[k] = v if k not in var.items else core.binary("+", v, var.items[k])
    return var


def _count_elements(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``collections._count_elements(mapping, iterable)`` (C): ``mapping[e] = mapping.get(e,
    0) + 1`` for each element, on a dict Var with constant keys."""
    if kwargs or len(args) != 2 or not isinstance(args[0], V.DictVar):
        raise Unsupported("collections._count_elements of these arguments", current().loc)
    mapping = args[0]
    core.mutate(mapping)
    for e in core.iterate(args[1]):
        if not isinstance(e, V.ConstVar) or isinstance(e, V.FloatArgVar):
            raise Unsupported("counting elements that are not constants", current().loc)
        key = e.python()
        mapping.items[key] = core.binary("+", mapping.items.get(key, V.ConstVar(0)), V.ConstVar(1))
    return V.ConstVar(None)


def _fromkeys(kind: type) -> Handler:
    """``dict.fromkeys(iterable, value=None)`` (and the subclasses'): every key bound to the
    very same value, as the classmethod does; a defaultdict gets no factory."""
    def make(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        if not args or len(args) > 2 or set(kwargs) - {"value"}:
            raise Unsupported(f"{kind.__name__}.fromkeys with these arguments", current().loc)
        value = args[1] if len(args) > 1 else kwargs.get("value", V.ConstVar(None))
        items: dict[Any, V.Var] = {}
        for k in core.iterate(args[0]):
            if not isinstance(k, V.ConstVar):
                raise Unsupported(f"{kind.__name__}.fromkeys with a non-constant key", current().loc)
            items[k.python()] = value
        if kind is dict:
            return V.DictVar(items)
        attrs = {"default_factory": V.ConstVar(None)} if kind is collections.defaultdict else None
        return V.DictVar(items, kind=kind, attrs=attrs)
    return make


def is_defaultdict(var: V.DictVar) -> bool:
    return issubclass(var.kind, collections.defaultdict) and bool(var.attrs) and \
        "default_factory" in var.attrs


def missing_item(core: Core, var: V.DictVar, key: Any) -> V.Var:
    """``d[key]`` of a defaultdict without ``key``: the factory's value, stored (as
    ``__missing__`` does); a KeyError without a factory."""
    factory = var.attrs["default_factory"]
    if isinstance(factory, V.ConstVar) and factory.value is None:
        raise UserException(KeyError(key), current().loc)
    value = core.call(factory, [], {})
    core.mutate(var)
    var.items[key] = value
    return value


def rebuild_kind(var: V.DictVar) -> Any:
    """What rebuilds the mapping at the graph's edge from its items: the class, or for a
    defaultdict the class bound to its factory (``defaultdict(list)(items)``)."""
    if not is_defaultdict(var):
        return var.kind
    factory = var.attrs["default_factory"]
    try:
        value = factory.python()
    except Unsupported as e:
        raise Unsupported("a defaultdict whose factory was made in the function leaves the graph",
                          current().loc) from e
    return functools.partial(var.kind, value)


def _deque(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    items = core.iterate(args[0]) if args else []
    maxlen = _const(args[1] if len(args) > 1 else kwargs.get("maxlen"))
    if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 0):
        raise UserException(ValueError("maxlen must be non-negative"), current().loc)
    return V.DequeVar(items, maxlen)


def deque_method(core: Core, obj: V.DequeVar, name: str, args: list[V.Var],
                 kwargs: dict[str, V.Var]) -> V.Var:
    """A deque's methods: a list's, plus the left end; ``maxlen`` drops from the other end."""
    items = obj.items
    if name in ("popleft", "pop") and not items:
        raise UserException(IndexError(f"{name} from an empty deque"), current().loc)
    if name == "popleft":
        core.mutate(obj)
        return items.pop(0)
    if name == "pop" and args:
        raise UserException(TypeError("deque.pop() takes no arguments"), current().loc)
    if name in ("appendleft", "extendleft"):
        core.mutate(obj)
        new = [args[0]] if name == "appendleft" else core.iterate(args[0])
        for v in new:
            items.insert(0, v)
        if obj.maxlen is not None:
            del items[obj.maxlen:]
        return V.ConstVar(None)
    if name == "rotate":
        core.mutate(obj)
        n = _const(args[0], 1) if args else 1
        if items:
            n %= len(items)
            items[:] = items[len(items) - n:] + items[:len(items) - n]
        return V.ConstVar(None)
    if name == "copy":
        return V.DequeVar(list(items), obj.maxlen)
    out = core.list_method(obj, name, args, kwargs)
    if obj.maxlen is not None and len(items) > obj.maxlen:  # append/extend/insert at the right
        del items[:len(items) - obj.maxlen]
    return out


def rebuild_sequence_kind(var: V.ListVar) -> Any:
    """What rebuilds a sequence at the graph's edge: its class, a deque with its maxlen."""
    if isinstance(var, V.DequeVar) and var.maxlen is not None:
        return functools.partial(collections.deque, maxlen=var.maxlen)
    return var.kind


# ----------------------------------------------------------------------------- functools


def _lru_cache_wrapper(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``functools._lru_cache_wrapper(func, maxsize, typed, CacheInfo)``, which
    ``lru_cache``'s Python code calls (then ``update_wrapper`` copies the metadata)."""
    if len(args) != 4 or kwargs:
        raise Unsupported("functools._lru_cache_wrapper with these arguments", current().loc)
    maxsize = _const(args[1])
    return V.CachedFunctionVar(args[0], None if maxsize is None else max(0, maxsize), bool(_const(args[2])))


def _cache_key(v: V.Var, typed: bool) -> Any:
    """What ``functools._make_key`` hashes: constants by value (with their type when typed),
    tuples by their items, any other object by identity."""
    if isinstance(v, V.ConstVar):
        value = v.python()
        try:
            hash(value)
        except TypeError as e:
            raise UserException(e, current().loc) from e
        return (value, type(value)) if typed else value
    if isinstance(v, V.ListVar) and v.is_tuple:
        return ("tuple", tuple(_cache_key(i, typed) for i in v.items))
    if isinstance(v, V.ListVar | V.DictVar | V.SetVar):  # a list, deque, dict or set
        raise UserException(TypeError(f"unhashable type: {v.python_type().__name__!r}"), current().loc)
    return ("id", id(v))


def cached_call(core: Core, fn: V.CachedFunctionVar, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """A call of an lru_cache wrapper made in the frame: a hit returns the very Var the first
    call returned (the same object, as eager's cache returns it); a miss calls the function
    and stores its result, evicting the least recently used past ``maxsize``."""
    key: Any = (tuple(_cache_key(a, fn.typed) for a in args),
                tuple((k, _cache_key(v, fn.typed)) for k, v in kwargs.items()))
    if not fn.typed and not kwargs and len(args) == 1 and isinstance(args[0], V.ConstVar) and \
            type(args[0].value) in (int, str):
        key = ("fast", args[0].value)  # _make_key's fast path: f(1) and f(1.0) are two keys
    if key in fn.cache:
        fn.hits += 1
        fn.cache.move_to_end(key)
        return fn.cache[key]
    fn.misses += 1
    result = core.call(fn.func, args, kwargs)
    if fn.maxsize != 0:
        fn.cache[key] = result
        if fn.maxsize is not None and len(fn.cache) > fn.maxsize:
            fn.cache.popitem(last=False)
    return result


def cached_method(fn: V.CachedFunctionVar, name: str, args: list[V.Var]) -> V.Var:
    """``cache_info()`` and ``cache_clear()`` of a wrapper made in the frame."""
    if name == "cache_info" and not args:
        return V.ConstVar(functools._CacheInfo(fn.hits, fn.misses, fn.maxsize, len(fn.cache)))
    if name == "cache_clear" and not args:
        fn.cache.clear()
        fn.hits = fn.misses = 0
        return V.ConstVar(None)
    raise Unsupported(f"{name}() of {fn.describe()}", current().loc)


def _namedtuple(core: Core, args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    """``collections.namedtuple(...)`` from constants, called in the function: the class is
    made for real, once per capture (Python makes a new one per call; nothing the graph or
    the guards hold depends on which one it is). Its instances are tuple subclasses, which
    capture models (their ``__new__`` is interpreted)."""
    if not all(isinstance(a, V.ConstVar | V.ListVar) for a in [*args, *kwargs.values()]):
        raise Unsupported("collections.namedtuple() from non-constant arguments", current().loc)
    vals = [a.python() for a in args]
    kw = {k: v.python() for k, v in kwargs.items()}
    kw.setdefault("module", current().f_globals.get("__name__"))  # as the caller's frame
    try:
        return V.ObjVar(collections.namedtuple(*vals, **kw))
    except Exception as e:  # what eager raises (a bad field name)
        raise UserException(e, current().loc) from e


_HANDLERS: dict[Any, Callable[..., V.Var]] = {
    collections.namedtuple: _namedtuple,
    itertools.chain: _chain,
    itertools.chain.from_iterable: _chain_from_iterable,
    itertools.product: _product,
    itertools.combinations: _choose(itertools.combinations),
    itertools.combinations_with_replacement: _choose(itertools.combinations_with_replacement),
    itertools.permutations: _choose(itertools.permutations),
    itertools.islice: _islice,
    itertools.zip_longest: _zip_longest,
    itertools.repeat: _repeat,
    itertools.count: _count,
    itertools.cycle: _cycle,
    itertools.accumulate: _accumulate,
    itertools.starmap: _starmap,
    itertools.groupby: _groupby,
    collections.OrderedDict: _ordered_dict,
    collections.defaultdict: _defaultdict,
    collections.deque: _deque,
    collections.Counter: _counter,
    collections._count_elements: _count_elements,
    dict.fromkeys: _fromkeys(dict),
    collections.OrderedDict.fromkeys: _fromkeys(collections.OrderedDict),
    collections.defaultdict.fromkeys: _fromkeys(collections.defaultdict),
    itertools.pairwise: lambda core, a, k: _run(itertools.pairwise, core.iterate(a[0])),
    functools._lru_cache_wrapper: _lru_cache_wrapper,
}


def handlers(core: Core) -> dict[Any, Handler]:
    """The constructors above as builtin-table handlers ``(args, kwargs) -> Var``."""
    return {fn: functools.partial(h, core) for fn, h in _HANDLERS.items()}


__all__ = [
    "Core",
    "cached_call",
    "cached_method",
    "deque_method",
    "handlers",
    "is_defaultdict",
    "missing_item",
    "rebuild_kind",
    "rebuild_sequence_kind",
]
