"""Graph-break scenarios: each a small function that breaks, its arguments, and the number of
graphs capture makes of its first call: a break resumes, the pieces around it are graphs;
a loop whose body breaks adds a graph per piece of the body, plus a recapture for each value
of a Python int the body specializes on; a function called at the break is captured on its
own and adds its graphs.

``test_breaks.py`` runs every record compiled and eagerly and compares return values,
mutated arguments and printed output.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

BREAKS: list[Case] = []


@dataclasses.dataclass
class Case:
    fn: object
    make: object
    graphs: int | tuple[int, int]
    """Graphs of the first call; ``(on 3.11, on 3.12)`` where their bytecode differs."""
    name: str

    @property
    def expected_graphs(self) -> int:
        if isinstance(self.graphs, tuple):
            return self.graphs[sys.version_info >= (3, 12)]
        return self.graphs


def case(make, graphs: int, name: str | None = None):
    def deco(fn):
        BREAKS.append(Case(fn, make, graphs, name or fn.__name__))
        return fn
    return deco


def X():
    return (torch.randn(3, 4),)


def XY():
    return torch.randn(3, 4), torch.randn(3, 4)


def POS():
    return (torch.rand(3, 4) + 0.5,)


def NEG():
    return (-torch.rand(3, 4) - 0.5,)


def print_and_return(v):
    print("value seen:", tuple(v.shape))
    return v


def helper_print(x):
    y = x * 2
    print("in helper")
    return y + 1


def helper_two(x):
    return helper_print(x).relu() * 3


def helper_three(x):
    return helper_two(x) - 1


def helper_item(x):
    return x * x.sum().item()


class Recorder:
    """A user context manager with visible effects on enter and exit."""

    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


@dataclasses.dataclass
class Holder:
    v: int = 0


COUNTER = 0

# ============================================================ basic breaks


@case(X, 2)
def print_middle(x):
    y = x.sin() * 2
    print("middle")
    return y.cos() + 1


@case(X, 1)
def print_first(x):
    print("first")
    return x * 2


@case(X, 1)
def print_last(x):
    y = x * 2
    print("last")
    return y


@case(X, 1)
def print_tensor(x):
    y = x.round()
    print(y)
    return y


@case(X, 1)
def print_kwargs(x):
    print("a", tuple(x.shape), sep="-", end="!\n")
    return x + 1


@case(X, 2)
def item_mul(x):
    return x * x.sum().item()


@case(X, 1)
def tolist_sum(x):
    values = x.round().tolist()
    return sum(sum(r) for r in values)


@case(X, 2)
def numpy_roundtrip(x):
    import numpy as np

    a = (x * 2).numpy()  # traced; np.cumsum is not: the break hands it over as an ndarray
    b = torch.from_numpy(np.cumsum(a) + 1)
    return b - x.flatten()


@case(X, 2)
def int_of_tensor(x):
    n = int(x.abs().sum()) % 3 + 1
    return x.repeat(n, 1)


@case(X, 2)
def unsupported_builtin(x):
    y = x * 2
    pid = os.getpid()
    return y + (pid > 0)


@case(X, 2)
def fstring_item(x):
    s = x.sum()
    print(f"total {s.item():.3f}")
    return s * 2


@case(X, 1)
def nonzero_dd(x):
    return torch.nonzero(x > 0)


@case(X, 4)
def several_breaks(x):
    a = x + 1
    print("one")
    b = a * 2
    print("two")
    c = b - 3
    print("three")
    return c.sum()


@case(XY, 3)
def item_twice(x, y):
    a = x.sum().item()
    b = y.mean().item()
    return x * a + y * b


# ============================================================ data-dependent branches


@case(POS, 2, "if_taken")
@case(NEG, 2, "if_not_taken")
def dd_if(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@case(POS, 2, "if_else_join_pos")
@case(NEG, 2, "if_else_join_neg")
def dd_if_else_join(x):
    y = x * 2
    if y.mean() > 0:
        z = y + 1
    else:
        z = y - 1
    return z * 3


@case(POS, 2, "ternary_pos")
@case(NEG, 2, "ternary_neg")
def dd_ternary(x):
    return (x + 1) if x.max() > 0 else (x - 1)


@case(XY, 3)
def dd_and(x, y):
    if x.sum() > -100 and y.sum() < 100:
        return x + y
    return x - y


@case(X, 2)
def dd_assert(x):
    assert x.abs().sum() >= 0, "never"
    return x * 2


@case(POS, (2, 3))
def dd_while(x):
    while x.sum() < 100:
        x = x * 2
    return x


@case(POS, 2)
def dd_while_true_break(x):
    n = 0
    while True:
        x = x * 3
        n += 1
        if x.sum() > 50:
            break
    return x, n


@case(X, 5)
def dd_if_in_loop(x):
    out = x
    for i in range(3):
        if out.sum() > 0:
            out = out - i
        else:
            out = out + i
    return out


# ============================================================ inside calls


@case(X, 3)
def one_deep(x):
    return helper_print(x) * 2


@case(X, 4)
def two_deep(x):
    return helper_two(x) + 1


@case(X, 5)
def three_deep(x):
    return helper_three(x) / 2


@case(X, 3)
def item_in_helper(x):
    return helper_item(x + 1)


@case(XY, 1)
def live_stack_call(x, y):
    return x + print_and_return(y)


@case(XY, 2)
def live_stack_deep(x, y):
    return (x * 2) - (y + print_and_return(x))


@case(XY, 2)
def call_in_argument(x, y):
    return torch.cat([x * 2, print_and_return(y) + 1, x - y])


@case(X, 2)
def call_in_kwargs(x):
    return torch.clamp(x * 2, min=float(x.min()), max=1.0)


@case(X, 1)
def dict_with_break(x):
    return {"a": x * 2, "b": print_and_return(x), "c": 3}


@case(X, 3)
def lambda_break(x):
    f = lambda v: print_and_return(v) + 1
    return f(x * 2) * 3


@case(X, 4)
def helper_twice(x):
    return helper_print(x) + helper_print(x * 2)


# ============================================================ loops


@case(X, 5)
def for_range(x):
    for i in range(3):
        x = x * 2
        print("step", i)
        x = x + i
    return x


@case(lambda: ([torch.randn(2) for _ in range(3)],), 6)
def for_list_of_tensors(xs):
    total = torch.zeros(2)
    for t in xs:
        total = total + t
        print("added")
        total = total * 2
    return total


@case(X, 5)
def for_enumerate(x):
    acc = []
    for i, row in enumerate(x):
        print("row", i)
        acc.append(row * i)
    return torch.stack(acc)


@case(X, 3)
def while_counter(x):
    i = 0
    while i < 3:
        x = x + 1
        print("i =", i)
        i += 1
    return x


@case(X, 2)
def for_with_break(x):
    for i in range(10):
        x = x * 2
        print("iter", i)
        if i == 2:
            break
    return x


@case(X, 2)
def for_with_continue(x):
    for i in range(4):
        if i % 2:
            continue
        x = x + i
        print("even", i)
    return x


@case(X, 4)
def nested_loops(x):
    for i in range(2):
        for j in range(2):
            x = x * (i + j + 1)
            print(i, j)
    return x


@case(X, 3)
def loop_calls_helper(x):
    for _ in range(2):
        x = helper_print(x) * 0.5
    return x


@case(X, (1, 4))
def comprehension_break(x):
    ys = [print_and_return(x * i) for i in range(3)]
    return torch.stack(ys).sum(0)


@case(X, 3)
def item_in_loop(x):
    s = 0.0
    for row in x[:2]:
        s += row.sum().item()
    return x * s


# ============================================================ with blocks


@case(lambda: (torch.randn(3, requires_grad=True),), 2)
def no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        print("no grad", torch.is_grad_enabled())
        z = y + 1
    return z, x * 3


@case(lambda: (torch.randn(3, requires_grad=True),), 2)
def enable_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            print("grad on", torch.is_grad_enabled())
            c = b + 1
        d = a + 1
    return c, d, torch.is_grad_enabled()


@case(lambda: (torch.randn(3, requires_grad=True),), 2)
def set_grad_enabled_break(x):
    with torch.set_grad_enabled(False):
        y = x + 1
        print("mode", torch.is_grad_enabled())
        z = y * 2
    return z


@case(lambda: (torch.randn(3), []), 2)
def user_context_break(x, log):
    with Recorder(log):
        y = x * 2
        print("inside", log)
        y = y + 1
    return y, log


@case(lambda: (torch.randn(3, requires_grad=True),), 3)
def no_grad_in_loop(x):
    out = x
    for i in range(2):
        with torch.no_grad():
            out = out * 2
            print("loop", i)
        out = out + 1
    return out


# ============================================================ try blocks: the frame runs eagerly


@case(X, 0)
def try_finally_break(x):
    try:
        y = x * 2
        print("in try")
    finally:
        y = x + 1
    return y


@case(X, 0)
def try_except_break(x):
    try:
        y = x * x.sum().item()
    except ValueError:
        y = x
    return y


@case(X, 2)
def break_after_try(x):
    try:
        y = x * 2
    finally:
        z = 3
    print("after the try")
    return y + z


# ============================================================ side effects before the break


@case(lambda: (torch.randn(3), [1, 2]), 1)
def list_append_then_print(x, lst):
    lst.append(len(lst))
    print("list now", lst)
    return x * len(lst), lst


@case(X, 1)
def global_write_then_print(x):
    global COUNTER
    COUNTER = 7
    print("counter", COUNTER)
    return x + COUNTER


@case(lambda: (torch.randn(3), Holder()), 1)
def attr_write_then_print(x, h):
    h.v = 5
    print("attr", h.v)
    return x * h.v, h.v


@case(lambda: (torch.randn(3), {}), 2)
def dict_write_then_item(x, d):
    d["sum"] = 1
    d["scaled"] = (x * 2).sum().item()
    return x + d["sum"], d


@case(lambda: (torch.randn(3),), 2)
def inplace_then_print(x):
    y = x.clone()
    y.mul_(2)
    print("inplace")
    y.add_(1)
    return y


# ============================================================ closures and cells


@case(X, 2)
def closure_read_after_break(x):
    scale = x.mean()

    def inner(v):
        return v * scale

    print("made inner")
    return inner(x) + 1


@case(X, 2)
def closure_made_after_break(x):
    y = x * 2
    print("then a closure")
    k = 3

    def inner(v):
        return v + k

    return inner(y)


@case(X, 3)
def nonlocal_write_after_break(x):
    total = x * 0

    def add(v):
        nonlocal total
        total = total + v

    add(x)
    print("half")
    add(x * 2)
    return total


OUTER_SCALE = 2.5


def make_closure_fn():
    factor = torch.tensor(2.0)

    def fn(x):
        y = x * factor
        print("closure fn")
        return y + factor
    return fn


CLOSURE_FN = make_closure_fn()


@case(X, 3)
def free_vars_across_break(x):
    return CLOSURE_FN(x) * OUTER_SCALE


@case(X, 1)
def cell_in_comprehension(x):
    k = 2
    print("k", k)
    return sum(x * k * i for i in range(3)) + 1


# ============================================================ odd shapes of functions


@case(lambda: (torch.randn(3), torch.randn(3), torch.randn(3)), 2)
def star_args(*xs):
    s = xs[0] + xs[1]
    print("n =", len(xs))
    return s * xs[2]


@case(lambda: (torch.randn(3),), 1)
def defaults_break(x, scale=3, shift=None):
    y = x * scale
    print("defaults", scale, shift)
    return y if shift is None else y + shift


@case(X, 2)
def unbound_local_at_break(x):
    y = x + 1
    print("z not yet bound")
    z = y * 2
    return z


@case(X, 1)
def return_mixed(x):
    y = x * 2
    print("mixed")
    return y, 3, "s", None, [y, (1, 2)]


@case(X, 2)
def tensor_python_value(x):
    vals = x[0].tolist()
    y = x * 2
    return y + vals[0], len(vals)


class WithProperties:
    def __eq__(self, other):
        return type(other) is type(self)

    __hash__ = object.__hash__

    @property
    def scale(self):
        print("reading scale")
        return 2

    @property
    def op(self):
        print("reading op")
        return torch.sin


@case(lambda: (torch.randn(3), WithProperties()), 1)
def property_breaks(x, p):
    return p.op(x * p.scale) + 1


def append_and_print(lst, x):
    lst.append(x * 2)
    print("appended", len(lst))
    return x


@case(X, 2)
def local_list_mutated_by_breaking_call(x):
    acc = []
    y = append_and_print(acc, x)
    return y * len(acc), acc


@case(X, 1)
def shared_list_identity(x):
    a = [x]
    b = a
    print("same list", a is b)
    b.append(x * 2)
    return torch.stack(a), a is b


@case(X, 2)
def unpack_break(x):
    a, b, c = x.sum(1).tolist()
    return x * a + b - c
