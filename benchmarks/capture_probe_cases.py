"""The cases of `capture_probe.py` (issue 20): about three small functions per item of the
capture-fidelity issue, each registered with ``@probe(item, ...)`` in `PROBES` with how to make
its arguments for call ``i`` and what the capture of it must give (graphs, breaks, recompiles).
Run them with ``python benchmarks/capture_probe.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import operator
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "capture" / "tests"))
import library_code  # noqa: E402  (functions of another module, for globals/resume cases)


@dataclasses.dataclass
class Probe:
    item: str
    fn: Any
    make: Any  # call index -> args tuple
    calls: int = 3
    recompiles: int = 0
    graphs: int = 1
    breaks: int = 0
    reset: Any = None  # call index -> None, run before eager's call and before the compiled one

    @property
    def name(self) -> str:
        return self.fn.__name__


PROBES: list[Probe] = []


def probe(item: str, make=None, calls: int = 3, recompiles: int = 0, graphs: int = 1, breaks: int = 0):
    def deco(fn):
        PROBES.append(Probe(item, fn, make or (lambda i: (torch.randn(3, 4),)), calls, recompiles, graphs,
                            breaks))
        return fn
    return deco


# ============================================================ hasattr / getattr on any object


class Plain:
    def __init__(self):
        self.a = 2

    def __eq__(self, other):  # the probe compares the inputs after the call
        return type(other) is Plain and vars(self) == vars(other)


@probe("hasattr/getattr")
def ha_containers(x):
    out = x
    for obj in ([1], (1,), {"a": 1}, {1}):
        out = out + (1 if hasattr(obj, "to") else 0) + (2 if hasattr(obj, "append") else 0)
    return out


@probe("hasattr/getattr", make=lambda i: (torch.randn(3), Plain()))
def ha_user_object(x, p):
    return x * getattr(p, "a", 5) + getattr(p, "missing", 7) + hasattr(p, "__init__")


@probe("hasattr/getattr")
def ha_partial_and_tensor(x):
    p = functools.partial(torch.add, alpha=2)
    return (x + hasattr(x, "grad_fn") + hasattr(x, "nope"), len(p.args), p.keywords["alpha"],
            getattr(x, "shape")[0], hasattr(torch.nn.functional, "silu"))  # noqa: B009


# ============================================================ live dict views


@probe("dict views")
def dv_keys_live(x):
    d = {1: x, 2: x * 2}
    keys = d.keys()
    d[4] = x + 4
    return (4 in keys, len(keys), sorted(keys))


@probe("dict views")
def dv_values_items_live(x):
    d = {"a": x}
    vals, items = d.values(), d.items()
    d["b"] = x * 3
    del d["a"]
    return [v + 1 for v in vals], [(k, v.sum()) for k, v in items]


@probe("dict views")
def dv_view_ops(x):
    d = {"a": 1, "b": 2}
    e = {"b": 3, "c": 4}
    return (x + len(d.keys() & e.keys()), d.keys() | e.keys(), d.keys() - ["a"], ("a", 1) in d.items(),
            d.keys() == {"a", "b"}, d.keys() <= {"a", "b", "z"}, d.items() ^ {("a", 1)}, {"b"} & d.keys())


# ============================================================ user classes


class WithNew:
    def __new__(cls, k):
        obj = super().__new__(cls)
        obj.k = k * 2
        return obj

    def __init__(self, k):
        self.j = k


class Meta(type):
    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.made_by_meta = True
        return obj


class WithMeta(metaclass=Meta):
    def __init__(self, v):
        self.v = v


class Registry:
    subclasses: list = []

    def __init_subclass__(cls, scale=1, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.scale = scale
        Registry.subclasses.append(cls.__name__)


class Triple(Registry, scale=3):
    pass


@dataclasses.dataclass
class DC:
    a: int
    b: float = 2.5
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class FDC:
    a: int
    b: int = 3


@probe("user classes")
def uc_new(x):
    o = WithNew(3)
    return x * o.k + o.j


@probe("user classes")
def uc_metaclass(x):
    o = WithMeta(4)
    return x + o.v, o.made_by_meta


@probe("user classes")
def uc_init_subclass_and_dataclass(x):
    d = DC(2)
    d.tags.append(1)
    f = FDC(1)
    return x * Triple.scale + d.a * d.b, len(d.tags), f == FDC(1, 3), dataclasses.replace(f, b=5).b, \
        dataclasses.asdict(d)


# ============================================================ stdlib containers and itertools


@probe("stdlib/itertools")
def it_product_chain_combinations(x):
    out = x
    for a, b in itertools.product(range(2), range(3)):
        out = out + a * b
    for c in itertools.chain([1, 2], (3,)):
        out = out * c
    return out, list(itertools.combinations(range(4), 2)), list(itertools.islice(range(10), 2, 8, 2))


@probe("stdlib/itertools")
def it_deque_ordereddict(x):
    q = collections.deque([x, x + 1], maxlen=3)
    q.appendleft(x - 1)
    q.append(x * 2)
    od = collections.OrderedDict(a=1, b=2, c=3)
    od.move_to_end("a")
    k, v = od.popitem(last=False)
    return q, list(od), k, v


@probe("stdlib/itertools")
def it_defaultdict_fromkeys(x):
    dd = collections.defaultdict(list)
    dd["a"].append(x)
    dd.setdefault("b", []).append(x + 1)
    fk = dict.fromkeys(["p", "q"], 0)
    od = collections.OrderedDict.fromkeys("xy", 1)
    flat = list(itertools.chain.from_iterable([[1, 2], [3]]))
    return dd, fk, od, x * sum(flat)


# ============================================================ functools


@functools.lru_cache(maxsize=None)  # noqa: UP033  (the wrapper lru_cache makes)
def _cached_scale(n):
    return n * 3


def _deco(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args) + 1
    return wrapper


@_deco
def _wrapped_double(x):
    return x * 2


@probe("functools")
def ft_partial(x):
    p = functools.partial(torch.clamp, min=-0.5)
    q = functools.partial(lambda a, b, c: a * b + c, x, 2)
    return p(x, max=0.5), q(3)


@probe("functools")
def ft_wraps(x):
    return _wrapped_double(x), _wrapped_double.__name__, _wrapped_double.__wrapped__(x)


@probe("functools")
def ft_lru_cache(x):
    @functools.lru_cache(maxsize=2)
    def sq(n):
        return x * n

    a = sq(2)
    b = sq(2)
    return a + b + _cached_scale(4), a is b, sq.cache_info().hits


# ============================================================ guards: closures, defaults, globals


def _make_closure_cases():
    scale = [2.0]
    flags = {"on": True}
    count = 3

    def gd_closure_list(x):
        return x * scale[0] + count

    def gd_closure_dict(x):
        return x + 1 if flags["on"] else x - 1

    def gd_defaults(x, k=2, *, j=3):
        return x * k + j

    def mutate(i):
        if i == 2:
            scale[0] = 5.0
            flags["on"] = False
            gd_defaults.__defaults__ = (7,)
            gd_defaults.__kwdefaults__ = {"j": -1}
        return (torch.randn(3, 4),)

    for fn in (gd_closure_list, gd_closure_dict, gd_defaults):
        PROBES.append(Probe("guards: closures/defaults/globals", fn, mutate, calls=4, recompiles=1))


_make_closure_cases()


def _other_module_global(i):
    library_code.FACTOR = 2.0 if i < 2 else 4.0
    return (torch.randn(3, 4),)


@probe("guards: closures/defaults/globals", make=_other_module_global, calls=4, recompiles=1)
def gd_other_module_global(x):
    return library_code.scaled(x)


# ============================================================ resuming inside library code


# TorchDynamo's counts: the caller's piece before the call is empty; the float .item() returns
# is a constant first, then an input (one recompile)
@probe("resume in library code", graphs=3, breaks=2, recompiles=1)
def rs_library_break(x):
    return library_code.break_then_global(x) + 1


@probe("resume in library code", graphs=3, breaks=2)
def rs_library_builtins(x):
    return library_code.break_then_len(x) * 2


@probe("resume in library code", graphs=5, breaks=3, recompiles=1)
def rs_library_nested(x):
    return library_code.outer_calls_break(x) - 1


# ============================================================ numpy on tensors


@probe("numpy traced")
def np_meshgrid(x):
    a, b = np.meshgrid(np.arange(3), np.arange(2))
    return x[:2, :3] + torch.from_numpy(a + b)


@probe("numpy traced")
def np_mean_of_numpy(x):
    return torch.from_numpy(np.mean(x.numpy()) * np.ones(3))


@probe("numpy traced")
def np_result_at_edge(x):
    a = x.numpy()
    return np.exp(a) + 1, np.sum(a, axis=0)


# ============================================================ RNG


@probe("RNG")
def rng_torch_rand(x):
    return x + torch.rand(3, 4), torch.randn(2)


@probe("RNG")
def rng_dropout(x):
    return torch.nn.functional.dropout(x, 0.5, True), torch.randint(0, 10, (3,))


@probe("RNG")
def rng_python_random(x):
    return x * random.random()


@probe("RNG")
def rng_python_uniform_twice(x):
    return x * random.uniform(0.5, 1.5) + random.random()


# the value is needed in Python: a break at the draw; the resume function branches on the
# float, a new value each call (TorchDynamo: the same, 1 graph, 2 recompiles)
@probe("RNG")
def rng_python_random_arith(x):
    lo, hi = 0.5, 2.0
    return x * (lo + (hi - lo) * random.random()), -random.random() + x


@probe("RNG", graphs=1, breaks=1, recompiles=2)
def rng_python_random_branch(x):
    if random.random() > 0.5:
        return x * 2
    return x - 1


@probe("RNG")
def rng_python_random_method(x):
    return x + _RNG.random() * x.sum()


_RNG = random.Random(0)


# ============================================================ numbers that vary stay symbols


def _ints(i):
    return torch.randn(3, 4), 3 + i


def _floats(i):
    return torch.randn(3, 4), 0.25 + i


def _np_floats(i):
    return torch.randn(3, 4), np.float64(0.25 + i)


def _np_float32s(i):
    return torch.randn(3, 4), np.float32(0.5 + i)


@probe("varying numbers", make=_ints, calls=4, recompiles=1)
def vn_int(x, n):
    return x * n + n


@probe("varying numbers", make=_floats, calls=4, recompiles=1)
def vn_float(x, f):
    return x * f - f


@probe("varying numbers", make=_np_floats, calls=4, recompiles=1)
def vn_np_float64(x, f):
    return x * f + 1


@probe("varying numbers", make=_np_float32s, calls=4, recompiles=1)
def vn_np_float32(x, f):
    return x * f


@probe("varying numbers", make=_floats, calls=4, recompiles=1)
def vn_float_python_arith(x, f):
    return x * (f * 2) + (1 - f), x / (f + 1e-6), -f * x


@probe("varying numbers", make=_ints, calls=4, recompiles=1)
def vn_int_as_float(x, n):
    return x * float(n) + n / 2


@probe("varying numbers", make=lambda i: (torch.randn(3, 4), 0.5 + i, 2 + i), calls=4, recompiles=1)
def vn_float_and_int(x, f, n):
    return x * f * n + f * n


# ============================================================ Python number methods


@probe("number methods", make=_ints, calls=4, recompiles=2)
def nm_bit_length(x, n):
    return x * n.bit_length()


@probe("number methods", make=_floats, calls=4, recompiles=2)
def nm_float_methods(x, f):
    return x + f.conjugate() + (1 if f.is_integer() else 0)


@probe("number methods")
def nm_const_methods(x):
    return x * (5).bit_length() + (2.0).is_integer() + (3).conjugate() + (1.5).as_integer_ratio()[1]


# ============================================================ max/min over tensors


@probe("max/min", make=lambda i: (torch.randn(()), torch.randn(())))
def mm_two_scalars(a, b):
    return max(a, b), min(a, b)


@probe("max/min", make=lambda i: (torch.randn(1), torch.randn(1)))
def mm_three(a, b):
    return max(a, b, a * 2), min([a, b])


@probe("max/min")
def mm_tensor_and_number(x):
    return max(x.sum(), torch.tensor(0.0)), min(x.shape), max(x.shape[0], 2)


# ============================================================ no_grad object made each call


@probe("no_grad per call", make=lambda i: (torch.randn(3, 4, requires_grad=True),))
def ng_object_each_call(x):
    ctx = torch.no_grad()
    with ctx:
        y = x * 2
    return y, x * 3


@probe("no_grad per call", make=lambda i: (torch.randn(3, 4, requires_grad=True),))
def ng_set_grad_enabled_var(x):
    mode = torch.set_grad_enabled(False)
    with mode:
        y = x + 1
    return y, y.requires_grad


@probe("no_grad per call", make=lambda i: (torch.randn(3, 4, requires_grad=True),))
def ng_enable_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 3
    return y, z


# ============================================================ a module made in the function


@probe("module made inside", calls=4, recompiles=1)
def md_stateless(x):
    return nn.ReLU()(x), nn.Softmax(dim=-1)(x)


# a break at the constructor (it runs in Python, drawing the init from the generator as eager
# does), then the resume function: one recompile, then the module is type-guarded
# (TorchDynamo traces the constructor: one graph, no break)
@probe("module made inside", calls=4, recompiles=1, breaks=1)
def md_linear(x):
    return nn.Linear(4, 2)(x)


@probe("module made inside", calls=4, recompiles=2, breaks=2)  # one per resume function
def md_sequential(x):
    m = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    return m(x)


# ============================================================ zip(strict=True)


@probe("zip strict")
def zs_equal(x):
    return [a * b for a, b in zip(x, [1, 2, 3], strict=True)]


@probe("zip strict")
def zs_unequal_caught(x):
    try:
        list(zip([1, 2], [3], strict=True))
    except ValueError as e:
        return x + 1, str(e)
    return x


@probe("zip strict")
def zs_tensor_rows(x):
    return sum(r * w for r, w in zip(x.unbind(0), (0.5, 1.5, 2.0), strict=True))


# ============================================================ torch.tensor over a symbolic bool


def _sized(i):
    return (torch.randn(5 + i, 4),)


@probe("torch.tensor symbolic bool", make=_sized, calls=4, recompiles=1)
def tb_size_compare(x):
    return x + torch.tensor(x.shape[0] > 4)


@probe("torch.tensor symbolic bool", make=_sized, calls=4, recompiles=1)
def tb_size_eq(x):
    return torch.tensor([x.shape[0] == x.shape[1], x.shape[0] > 2]), x.sum()


@probe("torch.tensor symbolic bool", make=lambda i: (torch.randn(3, 4), 3 + i), calls=4, recompiles=1)
def tb_int_compare(x, n):
    return x * torch.tensor(n > 2, dtype=torch.float32), torch.tensor([n, n * 2, 3], dtype=torch.float32)


# ============================================================ second batch: variants of the items


class _Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        extra = getattr(self, "missing_layer", None)
        return self.lin(x) if extra is None else extra(x), hasattr(self, "lin"), hasattr(self.lin, "bias")


_BLK = _Blk()


@probe("hasattr/getattr")
def hb_module_attrs(x):
    return _BLK(x)


@probe("dict views")
def hb_views_iterate(x):
    d = {"a": x, "b": x * 2}
    out = [d[k] + 1 for k in d.keys()]
    return out, list(reversed(d.keys())), list(d.items())[0][0], len(d.values())  # noqa: RUF015


@dataclasses.dataclass
class _Post:
    a: int
    b: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.b = self.a * 2


class _Slots:
    __slots__ = ("p", "q")

    def __init__(self, p):
        self.p = p
        self.q = p + 1


@probe("user classes")
def hb_post_init_slots_fields(x):
    o, s = _Post(3), _Slots(2)
    return x * o.b + s.q, [f.name for f in dataclasses.fields(o)], dataclasses.astuple(o)


@probe("stdlib/itertools")
def hb_accumulate_zip_longest_counter(x):
    acc = list(itertools.accumulate([1, 2, 3]))
    zl = list(itertools.zip_longest([1, 2], [3], fillvalue=0))
    return x * acc[-1], zl, sorted([(1, "b"), (0, "a")], key=operator.itemgetter(1))


@probe("stdlib/itertools")
def hb_counter(x):  # a Counter made in the function: a DictVar of kind Counter, methods interpreted
    c = collections.Counter("abca")
    return x * c["a"], c.most_common(1)


@probe("stdlib/itertools")
def hb_counter_ops(x):
    c = collections.Counter(["a", "b", "a"])
    c.update("bz")
    c["q"] += 1
    return x * (c + collections.Counter(a=1))["a"], sorted(c.elements()), c.total()


@probe("stdlib/itertools")
def hb_groupby(x):
    runs = [(k, len(list(g))) for k, g in itertools.groupby("aabccc")]
    return x * runs[-1][1], runs, [list(g) for _, g in itertools.groupby([1, 3, 2], key=lambda v: v % 2)]


@probe("stdlib/itertools")
def hb_chainmap_starmap(x):
    cm = collections.ChainMap({"a": 1}, {"a": 2, "b": 3})
    return x + cm["a"] + cm["b"], list(itertools.starmap(lambda a, b: a * b, [(1, 2), (3, 4)]))


@probe("functools")
def hb_reduce_partial_method(x):
    total = functools.reduce(lambda a, b: a + b, [x, x * 2, x * 3])
    p = functools.partial(x.add, alpha=2)
    return total, p(1.0)


class _Cached:
    def __init__(self, v):
        self.v = v

    @functools.cached_property
    def double(self):
        return self.v * 2


@probe("functools")
def hb_cached_property(x):
    c = _Cached(3)
    return x * c.double + c.double


def _make_counter_case():
    state = {"n": 1}

    def hb_closure_dict_mutated(x):
        state["n"] += 1  # a mutation of a closure's container, replayed after the graph
        return x * state["n"]

    def reset(i):  # eager's call and the compiled one each start from the same state
        state["n"] = 1 + i

    PROBES.append(Probe("guards: closures/defaults/globals", hb_closure_dict_mutated,
                        lambda i: (torch.randn(3, 4),), calls=3, recompiles=2, reset=reset))


_make_counter_case()


@probe("numpy traced")
def hb_numpy_more(x):
    a = x.numpy()
    return np.clip(a, -0.5, 0.5) * np.pi, np.linspace(0, 1, 5), np.abs(a).max(axis=1)


@probe("RNG")
def hb_torch_rng_more(x):
    return torch.bernoulli(torch.full((3, 4), 0.5)), torch.randperm(5), torch.normal(0.0, 1.0, (2,))


@probe("RNG")
def hb_python_random_int(x):  # an int draw: a graph input drawn per call (TorchDynamo: a break)
    return x * random.randint(1, 5)


@probe("RNG")
def hb_python_random_choice_randrange(x):
    return x + random.choice([1, 2, 3]), x > random.randrange(0, 10, 2), x * random.choice((0.5, 2.0))


@probe("varying numbers", make=_floats, calls=4, recompiles=1)
def hb_float_math(x, f):
    return x * math.sqrt(f + 1) + math.exp(f)


@probe("number methods", make=_ints, calls=4, recompiles=1)
def hb_int_ops(x, n):
    return x * (n // 2) + n % 3, -n, abs(n)


@probe("max/min", make=lambda i: (torch.randn(3), 2 + i), calls=3, recompiles=1)
def hb_max_numbers(x, n):
    return x * max(n, 3) + min(n, 10), max([x.shape[0], n])


@probe("no_grad per call", make=lambda i: (torch.randn(3, 4, requires_grad=True),))
def hb_inference_mode_and_decorator(x):
    @torch.no_grad()
    def inner(t):
        return t * 2
    return inner(x), x + 1


@probe("zip strict")
def hb_zip_strict_dict(x):
    d = dict(zip(["a", "b"], [x, x * 2], strict=True))
    return d, list(zip(range(3), "abc", strict=True))


@probe("torch.tensor symbolic bool", make=_sized, calls=4, recompiles=1)
def hb_tensor_of_shape(x):
    return torch.tensor(x.shape), torch.tensor(x.shape[0] > 3), x.new_tensor([x.shape[0]])
