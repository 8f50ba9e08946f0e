"""Conformance records for Python's object model as it is written (issue 20): ``hasattr`` on
any object, live dict views, the stdlib containers and constructors. Same record shape as
``capture_cases`` and registered into its table, so ``test_conformance`` runs them."""

from __future__ import annotations

import collections
import functools
import itertools
import typing

import torch
from capture_cases import X34, case

# ============================================================ hasattr / getattr on any object


@case(X34)
def obj_hasattr_partial(x):
    p = functools.partial(torch.add, alpha=2)
    k = 2 if hasattr(p, "func") and hasattr(p, "keywords") else 3
    return p(x, x) * k * (5 if hasattr(p, "no_such") else 7)


@case(X34)
def obj_partial_attributes(x):
    p = functools.partial(torch.mul, x)
    return p.func(*p.args, len(p.keywords) + 2)


@case(X34)
def obj_hasattr_dict_duck_typing(x):
    d = {"a": x}
    if hasattr(d, "to"):  # a tensor or a module would move; a dict does not
        return d.to(torch.float64)
    return d["a"] + 1


@case(X34)
def obj_hasattr_containers(x):
    found = [hasattr([x], "append"), hasattr((x,), "append"), hasattr({1}, "add"),
             hasattr([x], "shape"), hasattr({}, "items"), hasattr({}, "device")]
    return x * sum(2 ** i for i, f in enumerate(found) if f)


@case(X34)
def obj_getattr_default_on_list(x):
    xs = [x, x]
    return getattr(xs, "shape", len(xs)) * x


# ============================================================ dict views are live


@case(X34)
def dict_views_see_later_stores(x):
    d = {1: 2}
    keys, values, items = d.keys(), d.values(), d.items()
    d[4] = x
    return x * (10 if 4 in keys else 1) + len(values) + len(items)


@case(X34)
def dict_values_after_pop(x):
    d = {"a": x, "b": x * 2}
    values = d.values()
    d.pop("a")
    return sum(values) + len(values)


@case(X34)
def dict_items_iterated_after_update(x):
    d = {"a": 1}
    items = d.items()
    d.update(b=2, c=3)
    return x * sum(v for _, v in items) + len(list(d.keys()))


@case(X34)
def dict_keys_set_operators(x):
    d, e = {"a": 1, "b": 2}, {"b": 3, "c": 4}
    both = d.keys() & e.keys()  # a set, as Python's views make it
    d["c"] = 5  # views are live; the set made above is not
    return (x * len(both), both, d.keys() | e.keys(), d.keys() - ["a"], e.keys() ^ d.keys(),
            {"b", "z"} & d.keys(), d.items() & {("a", 1), ("b", 9)})


@case(X34)
def dict_keys_compared_as_sets(x):
    d = {"a": 1, "b": 2}
    k = 2 if d.keys() == {"b", "a"} else 3
    k += 10 if d.keys() <= {"a", "b", "c"} else 20
    k += 100 if d.keys() != {"a"} and not d.keys() > {"a", "b"} else 200
    return x * k, d.keys() == ["a", "b"], d.items() == {("a", 1), ("b", 2)}


class _Kernel:
    kernel_layer_name = "silu"

    def forward(self, x):
        return x * 2


_KERNELS = (_Kernel(),)


@case(X34)
def obj_getattr_class_only_names(x):
    # a class has __name__ (its metaclass's descriptor), an instance does not (the
    # kernels package's use_kernelized_func reads it this way)
    fn = _KERNELS[0]
    name = getattr(fn, "__name__", None) or getattr(fn, "kernel_layer_name", None)
    return fn.forward(x), name, hasattr(fn, "__qualname__"), hasattr(_Kernel, "__name__"), \
        getattr(fn, "__module__", None)


@case(X34)
def stdlib_starmap_lazy(x):
    calls = []

    def mul(a, b):
        calls.append(a)
        return a * b

    it = itertools.starmap(mul, [(x, 2), (x, 3), (x, 4)])
    first = next(it)  # only the first row has run, as in Python
    n = len(calls)
    return first, n, list(it), len(calls)


@case(X34)
def stdlib_itemgetter_attrgetter(x):
    import operator

    rows = [(2, "b", x), (1, "a", x * 2)]
    by_name = sorted(rows, key=operator.itemgetter(1))
    pick = operator.itemgetter(0, 2)
    shape = operator.attrgetter("shape")(x)
    return by_name[0][2], pick(rows[1]), shape, max(rows, key=operator.itemgetter(0))[1]


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def grad_decorator_on_nested_function(x):
    @torch.no_grad()
    def frozen(t):
        return t * 2

    @torch.enable_grad()
    def tracked(t):
        return t + 1

    with torch.no_grad():
        inside = tracked(x)
    return frozen(x), inside, x * 3


# ============================================================ hasattr / getattr on tensors


def _grad_input():
    return (torch.randn(3, 4, requires_grad=True),)


@case(X34)
def tensor_hasattr_grad_fn(x):
    k = 2 if hasattr(x, "grad_fn") and not hasattr(x, "no_such_attribute") else 3
    return x * k + (1 if x.grad_fn is None else 0), getattr(x, "missing", None) is None


@case(_grad_input)
def tensor_hasattr_with_grad(x):
    y = x * 2
    with torch.no_grad():
        z = y + 1
    return y + (5 if hasattr(y, "grad_fn") else 7), z * (2 if z.grad_fn is None else 3)


# ============================================================ stdlib containers and itertools


@case(X34)
def std_ordered_dict_built_and_returned(x):
    d = collections.OrderedDict()
    d["b"] = x
    d["a"] = x * 2
    d.move_to_end("b")
    return d, list(d), d.popitem(last=False)[0]


@case(X34)
def std_ordered_dict_from_pairs(x):
    d = collections.OrderedDict([("a", x), ("b", 1)], c=2)
    return d["a"] * (d["b"] + d["c"]) + len(d.copy())


@case(X34)
def std_defaultdict_missing_is_stored(x):
    groups = collections.defaultdict(list)
    for i, name in enumerate(["a", "b", "a"]):
        groups[name].append(x * i)
    counts = collections.defaultdict(int)
    counts["z"] += 2
    return sum(groups["a"]), len(groups), counts["z"] + counts["never"], len(counts)


@case(X34)
def std_defaultdict_setdefault_and_return(x):
    d = collections.defaultdict(int)
    d.setdefault("a", 3)
    d["b"] = 4
    return x * d["a"] + d["b"], d


@case(X34)
def std_dict_fromkeys(x):
    d = collections.OrderedDict.fromkeys(["a", "b"], 2)
    e = dict.fromkeys("xy")
    return x * sum(d.values()) + len(e)


@case(X34)
def std_itertools_product_combinations(x):
    total = sum(a * b for a, b in itertools.product([1, 2], [3, 4]))
    pairs = list(itertools.combinations([x, x * 2, x * 3], 2))
    perms = len(list(itertools.permutations(range(3))))
    return x * total + sum(a * b for a, b in pairs) + perms


@case(X34)
def std_itertools_chain(x):
    layers = [[x, x + 1], [x * 2]]
    return sum(itertools.chain(*layers)) + sum(itertools.chain.from_iterable(layers))


@case(X34)
def std_itertools_islice_live_iterator(x):
    it = iter([1, 2, 3, 4, 5])
    head = list(itertools.islice(it, 2))
    return x * sum(head) + next(it) + sum(itertools.islice(range(10), 2, 8, 3))


@case(X34)
def std_itertools_accumulate_pairwise_zip_longest(x):
    running = list(itertools.accumulate([x, x, x]))
    steps = sum(b - a for a, b in itertools.pairwise([1, 4, 9]))
    padded = list(itertools.zip_longest([1, 2, 3], [x], fillvalue=0))
    return running[-1] * steps + len(padded) + sum(itertools.repeat(2, 3))


@case(X34)
def std_zip_strict_raises_value_error(x):
    try:
        pairs = list(zip([x, x], [1], strict=True))
    except ValueError:
        pairs = [(x, 5)]
    return sum(a * b for a, b in zip([x], [3], strict=True)) + pairs[0][1]


@case(X34)
def std_deque_both_ends(x):
    q = collections.deque([1, 2], maxlen=3)
    q.append(3)
    q.appendleft(0)  # full: drops from the right
    q.rotate(1)
    window = collections.deque(maxlen=2)
    for t in (x, x * 2, x * 3):
        window.append(t)
    return x * sum(q) + len(q) + q.popleft() + q.maxlen, sum(window), window


@case(X34)
def std_deque_as_a_queue(x):
    todo = collections.deque([x])
    out = []
    while todo:
        t = todo.popleft()
        out.append(t)
        if len(out) < 3:
            todo.extend([t + 1])
    return out


@case(X34)
def std_itertools_count_next_and_zip(x):
    c = itertools.count(1)
    out = x * next(c)
    for i, t in zip(c, [x, x * 2]):  # zip pulls count a third time before the list ends
        out = out + t * i
    return out + next(c), next(itertools.count(2.5, 0.5))


@case(X34)
def std_itertools_count_of_a_tensor(x):
    steps = itertools.count(x.sum(), x.mean())  # items made by adding, as count adds them
    return [next(steps) for _ in range(3)], list(itertools.islice(itertools.count(), 2, 5))


@case(X34)
def std_itertools_cycle_and_repeat(x):
    signs = itertools.cycle([1.0, -1.0])
    alternating = sum(s * t for s, t in zip(signs, [x, x * 2, x * 3]))
    return alternating, next(signs), list(zip(itertools.repeat(x), "ab"))


@case(X34)
def std_itertools_cycle_pulls_a_live_iterator_lazily(x):
    it = iter([x, x + 1, x + 2])
    c = itertools.cycle(it)
    first = next(c)
    return first, next(it), next(c), next(c), next(c)  # the cycle saw only what it pulled


@case(X34)
def std_enumerate_map_over_count(x):
    scaled = map(lambda i, t: t * i, itertools.count(1), [x, x])
    return [(i, v) for i, v in enumerate(scaled, 10)]


@case(X34)
def std_itertools_count_in_a_for_that_breaks_out(x):
    for i in itertools.count():
        x = x + i
        if i == 3:
            break
    return x


# ============================================================ builtins over tensors


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def builtin_max_min_of_scalar_tensors(x, y):
    a, b = x.sum(), y.sum()
    return max(a, b) * 2 + min(a, b, x.mean()), max([a, b]), min(x[0, :1], y[0, :1])


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def builtin_max_nan_as_python_compares(x, y):
    nan = x.sum() * float("nan")
    return max(nan, y.sum()), max(y.sum(), nan), min(nan, y.sum())


# ============================================================ numpy arrays at the graph's edge


def _with_array(*shape):
    return lambda: (torch.randn(*shape), torch.randn(*shape).numpy())


@case(_with_array(3, 4))
def np_from_numpy_is_an_input(x, a):
    return x + torch.from_numpy(a) * a.shape[0] + a.ndim


@case(_with_array(3, 4))
def np_from_numpy_shares_memory(x, a):
    t = torch.from_numpy(a)
    t.add_(1)  # the caller's array changes too, as in eager
    return x * t


@case(_with_array(3, 4))
def np_as_tensor_cast_and_copy(x, a):
    copied = torch.tensor(a)
    copied.mul_(0)  # a copy: the array keeps its values
    return torch.as_tensor(a, dtype=torch.float64) + copied.double() + len(a), a.dtype.name


# ============================================================ numpy traced as torch ops


def _np():
    import numpy as np

    return np


@case(X34)
def np_traced_mean_times_ones(x):
    np = _np()
    return torch.from_numpy(np.mean(x.numpy()) * np.ones(3))  # float32 scalar * float64 array


@case(X34)
def np_traced_linspace_clip(x):
    np = _np()
    a = x.numpy()
    grid = np.linspace(0, 1, 5)  # numpy's own values
    return np.clip(a, -0.5, 0.5) * np.pi, grid, np.clip(a.astype(np.int64), 0, None), grid.dtype


@case(X34)
def np_traced_meshgrid_arange(x):
    np = _np()
    a, b = np.meshgrid(np.arange(3), np.arange(2))  # int64 grids, "xy" indexing
    return x.sum() + torch.from_numpy(a + b), a.shape, b.dtype


@case(X34)
def np_traced_ufuncs_and_reductions(x):
    np = _np()
    a = x.numpy()
    e = np.exp(a) + np.sum(a, axis=0) - np.maximum(a, 0.5)
    return torch.from_numpy(e), a.sum(), a.max(axis=1, keepdims=True), np.sqrt(np.arange(4))


@case(X34)
def np_traced_attributes_and_methods(x):
    a = (x * 2).numpy()
    b = a.T.reshape(2, 6).astype("float64")
    return torch.from_numpy(b.copy()), a.shape, a.ndim, a.dtype, a.size, len(a), b[0, 1:3]


@case(X34)
def np_traced_dtype_rules(x):
    np = _np()
    i = np.arange(6).reshape(2, 3)  # int64
    return i / 2, i // 4, i * 1.5, np.exp(i), (x.int().numpy() + 1).dtype, np.zeros((2,), "int32") + 1


@case(X34)
def np_traced_shares_memory_with_the_tensor(x):
    y = x.clone()
    a = y.numpy()
    a *= 2  # writes y, as in eager
    return y, np_where_mask(a)


def np_where_mask(a):
    np = _np()
    return np.where(a > 0, a, 0.0)


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4).numpy()))
def np_traced_array_argument(x, a):
    np = _np()
    return x + torch.from_numpy(np.tanh(a) * a.T.T), np.mean(a, axis=1)


@case(X34)
def np_traced_returned_as_ndarray(x):
    np = _np()
    a = x.numpy()
    return np.concatenate([a, a * 2]), np.stack([a[0], a[1]], axis=1), (a > 0).sum()


# ============================================================ functions made in the function


@case(X34)
def fn_functools_wraps_inner_function(x):
    def inner(t):
        """Add one."""
        return t + 1

    @functools.wraps(inner)
    def outer(t):
        return inner(t) * 2

    outer.calls = 1
    return outer(x), outer.__name__, outer.__doc__, outer.__wrapped__ is inner, outer.calls


@case(X34)
def fn_attributes_of_a_lambda(x):
    f = lambda t: t * 3
    return f(x), f.__name__, f.__module__, f.__defaults__, hasattr(f, "no_such"), f.__dict__


@case(X34)
def fn_lru_cache_made_in_the_function(x):
    calls = []

    @functools.lru_cache(maxsize=2)
    def scale(n):
        calls.append(n)
        return [n * 2]  # a hit returns this very list

    a, b = scale(1), scale(1)
    scale(2), scale(3), scale(1)  # maxsize 2: 1 was evicted by 3, computed again
    return x * a[0], a is b, calls, scale.cache_info(), scale.__name__, scale.__wrapped__(5)


@case(X34)
def fn_cache_keys_and_clear(x):
    @functools.cache
    def double(t, k=1):
        return t * 2 * k

    first = double(x)
    same = double(x) is first  # a tensor is a key by identity
    double(x, k=3), double(1), double(1.0), double(True)  # 1 alone is its own key; 1.0 == True
    info = double.cache_info()
    double.cache_clear()
    typed = functools.lru_cache(typed=True)(lambda n: n)
    typed(1), typed(1.0)
    return first, same, info, double.cache_info(), typed.cache_info(), callable(double)


@functools.lru_cache(maxsize=None)  # noqa: UP033  (lru_cache's own path)
def _cached_split(n: int) -> tuple[int, int]:
    return n // 2, n - n // 2


@functools.cache
def _cached_ones(n: int) -> torch.Tensor:
    return torch.ones(n)


@case(X34)
def fn_module_level_lru_cache_is_traced(x):
    rows, _ = _cached_split(12)
    return x.reshape(rows, -1).sum(1) + _cached_ones(rows), x.reshape(_cached_split(7)[::-1])


# ============================================================ __new__ and metaclasses


class _Tagging(type):
    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.tag = cls.__name__
        return obj


class _Tagged(metaclass=_Tagging):
    def __init__(self, scale):
        self.scale = scale


class _Registry(type):
    names: list = []

    def __init__(cls, name, bases, ns):
        super().__init__(name, bases, ns)
        _Registry.names.append(name)


class _Registered(metaclass=_Registry):  # a metaclass without __call__: type.__call__
    def __init__(self, k):
        self.k = k


class _Doubled:
    def __new__(cls, v):
        obj = super().__new__(cls)
        obj.v = v * 2
        return obj

    def __init__(self, v):
        self.seen = v


class _NotMine:
    def __new__(cls, v):
        return v + 1  # not an instance: __init__ is not called

    def __init__(self, v):
        raise AssertionError("never")


@case(X34)
def cls_metaclass_call_interpreted(x):
    t = _Tagged(3)
    return x * t.scale, t.tag, type(t) is _Tagged


@case(X34)
def cls_metaclass_without_call(x):
    r = _Registered(4)
    return x + r.k, isinstance(r, _Registered), "_Registered" in _Registry.names


@case(X34)
def cls_python_new_then_init(x):
    d = _Doubled(3)
    return x * d.v + d.seen, _NotMine(4)


@case(X34)
def std_fromkeys_shares_the_value(x):
    d = collections.defaultdict.fromkeys(["a", "b"], [x])
    d["a"].append(x * 2)  # one list for every key, as the classmethod binds it
    return len(d["b"]), d, dict.fromkeys(range(3)), type(d).__name__


@case(X34)
def np_traced_astype_numpy_type_and_in_place(x):
    np = _np()
    a = (x * 10).numpy().astype(np.int32) // 3
    a //= 2
    a %= 5
    b = np.ones(3, dtype=np.float32)
    b += 0.5
    return a, b, a.dtype


# ============================================================ tuple subclasses


class _Pair(tuple):
    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))

    @property
    def first(self):
        return self[0]

    def swapped(self):
        return _Pair(self[1], self[0])


class _Dims(tuple):  # torch.Size-like: ints from any iterable, with methods
    def __new__(cls, dims=()):
        return tuple.__new__(cls, [int(d) for d in dims])

    def numel(self):
        n = 1
        for d in self:
            n *= d
        return n


class _Plain(tuple):  # tuple's own __new__
    def total(self):
        return sum(self)


class _Point(typing.NamedTuple):
    x: torch.Tensor
    scale: int = 2

    def scaled(self):
        return self.x * self.scale

    @property
    def doubled_scale(self):
        return self.scale * 2


@case(X34)
def tup_subclass_with_python_new(x):
    p = _Pair(x, 3)
    q = p.swapped()
    return p.first * p[1] + len(p), isinstance(p, tuple), type(q) is _Pair, q, p + (1,)  # noqa: RUF005


@case(X34)
def tup_size_like_subclass(x):
    s = _Dims(x.shape)
    return x.reshape(s.numel()), s, _Dims(), _Plain([x, x * 2]).total(), _Plain()


@case(X34)
def tup_namedtuple_class_methods_and_properties(x):
    p = _Point(x)
    return p.scaled() + p.doubled_scale, p._replace(scale=3), p._asdict(), p
