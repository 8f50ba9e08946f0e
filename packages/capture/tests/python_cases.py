"""Conformance records for Python as it is written: constants, globals and closures,
containers, control flow, calls, comprehensions and generators. Same record shape as
``capture_cases`` and registered into its table, so ``test_conformance`` runs them."""

from __future__ import annotations

import functools

import torch
from capture_cases import CASES, X34, Case, case

# ============================================================ Python: constants, globals, closures

SCALE = 3.0
OFFSETS = (1, 2, 3)
GLOBAL_T = torch.arange(4.0)


@case(X34)
def p_global_const(x): return x * SCALE


@case(X34)
def p_global_tuple(x): return x + OFFSETS[1] + sum(OFFSETS)


@case(X34)
def p_global_tensor(x): return x + GLOBAL_T


def _make_closure():
    k = 5
    t = torch.ones(4)

    def inner(x):
        return x * k + t
    return inner


p_closure = _make_closure()
p_closure.__name__ = "p_closure"
CASES.append(Case(p_closure, X34))


@case(X34)
def p_nested_closure(x):
    a = 2

    def inner(y):
        return y * a
    a = 3
    return inner(x)


@case(X34)
def p_nonlocal(x):
    n = 0

    def bump():
        nonlocal n
        n += 1
    bump()
    bump()
    return x * n


@case(X34)
def p_locals_reassign(x):
    y = x
    y = y + 1
    z = y
    return z * 2


@case(X34)
def p_const_arith(x):
    a = 3
    b = a * 2 + 1
    c = b // 2 ** 2 - (a % 2)
    return x * c + float(b) / 7


@case(X34)
def p_bool_ops(x):
    a = True and 3
    b = None or 4
    c = not False
    return x * a + b * c


@case(X34)
def p_chained_compare(x): return x * (1 < 2 < 3) + (3 > 2 > 5)


@case(X34)
def p_string_ops(x):
    s = "ab" + "cd"
    return x * len(s.upper()) if s.startswith("ab") else x


@case(X34)
def p_fstring(x):
    n = x.shape[0]
    s = f"rows={n:03d} {n!r} {'x'}"
    return x * len(s)


@case(X34)
def p_walrus(x):
    if (n := x.shape[1]) > 2:
        return x * n
    return x


@case(X34)
def p_none_check(x, y=None):
    if y is None:
        y = x
    return x + y


@case(X34)
def p_isinstance_tensor(x):
    if isinstance(x, torch.Tensor):
        return x + 1
    return x


@case(lambda: (torch.randn(3, 4), 2))
def p_int_arg(x, n): return x * n


@case(lambda: (torch.randn(3, 4), 0.5))
def p_float_arg(x, s): return x * s + s ** 2


@case(lambda: (torch.randn(3, 4), "relu"))
def p_str_arg(x, act): return getattr(torch, act)(x)


@case(lambda: (torch.randn(3, 4), True))
def p_bool_arg(x, flag): return x + 1 if flag else x - 1


@case(X34)
def p_import_inside(x):
    import math as m
    return x * m.pi


@case(X34)
def p_from_import(x):
    from math import e
    return x * e


# ============================================================ containers


@case(lambda: ([torch.randn(3), torch.randn(3)],))
def c_list_arg(xs): return xs[0] + xs[1]


@case(lambda: ((torch.randn(3), torch.randn(3)),))
def c_tuple_arg(xs):
    a, b = xs
    return a * b


@case(lambda: ({"a": torch.randn(3), "b": torch.randn(3)},))
def c_dict_arg(d): return d["a"] + d["b"]


@case(X34)
def c_list_build(x):
    out = []
    for i in range(3):
        out.append(x * i)
    return out


@case(X34)
def c_list_methods(x):
    xs = [x, x + 1]
    xs.extend([x + 2])
    xs.insert(0, x - 1)
    last = xs.pop()
    xs.reverse()
    return xs, last, len(xs)


@case(X34)
def c_list_index_count(x):
    xs = [1, 2, 3, 2]
    return x * xs.index(3) + xs.count(2)


@case(X34)
def c_list_slicing(x):
    xs = [x, x * 2, x * 3, x * 4]
    return xs[1:3], xs[::-1], xs[-1]


@case(X34)
def c_list_concat(x): return [x] + [x + 1], (x,) + (x * 2,), [x] * 2  # noqa: RUF005


@case(X34)
def c_dict_build(x):
    d = {"a": x, "b": x * 2}
    d["c"] = x * 3
    return d


@case(X34)
def c_dict_methods(x):
    d = {"a": 1, "b": 2}
    d.update(c=3)
    total = sum(d.values())
    keys = list(d.keys())
    return x * total, keys, d.get("z", 7), d.pop("a")


@case(X34)
def c_dict_items(x):
    d = {"a": x, "b": x + 1}
    return {k: v * 2 for k, v in d.items()}


@case(X34)
def c_dict_merge(x):
    a = {"p": 1}
    b = {**a, "q": 2}
    return x * b["q"] + b["p"], a | b


@case(X34)
def c_set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    return x * len(s) + (2 in s) + len(s | {9})


@case(X34)
def c_tuple_unpack_star(x):
    a, *b, c = [1, 2, 3, 4, 5]
    return x * a + sum(b) + c


@case(X34)
def c_nested_structures(x): return {"out": [x, (x + 1, {"deep": x * 2})], "n": 3}


@case(X34)
def c_contains(x):
    names = ["relu", "gelu"]
    return x.relu() if "relu" in names else x


@case(X34)
def c_del_item(x):
    d = {"a": 1, "b": 2}
    del d["a"]
    xs = [1, 2, 3]
    del xs[0]
    return x * len(d) + xs[0]


@case(X34)
def c_list_sort(x):
    xs = [3, 1, 2]
    xs.sort()
    return x * xs[0] + sorted([5, 4], reverse=True)[0]


@case(X34)
def c_list_comprehension_filter(x):
    xs = [i for i in range(6) if i % 2 == 0]
    return x * sum(xs)


@case(X34)
def c_list_of_tensors_sum(x): return sum([x, x, x])


@case(X34)
def c_enumerate_tensors(x):
    parts = x.unbind(0)
    return [p * i for i, p in enumerate(parts)]


@case(X34)
def c_zip(x):
    ws = [1.0, 2.0, 3.0]
    return [w * r for w, r in zip(ws, x, strict=True)]


@case(lambda: ([torch.randn(3) for _ in range(3)],))
def c_list_arg_iter(xs): return torch.stack([x * 2 for x in xs])


@case(X34)
def c_dict_iteration_order(x):
    d = {"z": 1, "a": 2}
    return [k for k in d], x


@case(X34)
def c_string_join(x):
    s = "-".join(["a", "b"])
    return x * len(s)


@case(X34)
def c_tuple_compare(x): return x * ((1, 2) < (1, 3)) + ((1, 2) == (1, 2))


# ============================================================ control flow


@case(X34)
def cf_for_range(x):
    for i in range(4):
        x = x + i
    return x


@case(X34)
def cf_while(x):
    i = 0
    while i < 3:
        x = x * 2
        i += 1
    return x


@case(X34)
def cf_break_continue(x):
    for i in range(10):
        if i == 1:
            continue
        if i > 4:
            break
        x = x + i
    return x


@case(X34)
def cf_for_else(x):
    for i in range(3):
        if i == 10:
            break
    else:
        x = x + 100
    return x


@case(X34)
def cf_nested_loops(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
    return x


@case(X34)
def cf_if_elif(x):
    mode = "b"
    if mode == "a":
        return x
    elif mode == "b":
        return x * 2
    else:
        return x * 3


@case(X34)
def cf_ternary(x): return x.relu() if x.dim() == 2 else x


@case(X34)
def cf_try_except(x):
    try:
        y = x + 1
    except RuntimeError:
        y = x
    return y


@case(X34)
def cf_try_finally(x):
    try:
        y = x * 2
    finally:
        z = 3
    return y + z


@case(X34)
def cf_assert(x):
    assert x.dim() == 2, "needs a matrix"
    return x + 1


@case(X34)
def cf_with_no_grad(x):
    with torch.no_grad():
        y = x * 2
    return y + 1


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def cf_no_grad_requires(x):
    with torch.no_grad():
        y = x * 2
    return y, x * 3


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def cf_enable_grad_nested(x):
    with torch.no_grad():
        a = x + 1
        with torch.enable_grad():
            b = x + 2
    return a, b


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def cf_set_grad_enabled(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y


@case(X34)
def cf_loop_over_list(x):
    for f in [torch.sin, torch.cos, torch.tanh]:
        x = f(x)
    return x


@case(X34)
def cf_loop_tensor_rows(x):
    acc = 0
    for row in x:
        acc = acc + row
    return acc


@case(X34)
def cf_return_in_loop(x):
    for i in range(5):
        if i == 2:
            return x * i
    return x


@case(X34)
def cf_while_true_break(x):
    n = 0
    while True:
        n += 1
        if n >= 3:
            break
    return x * n


@case(X34)
def cf_match_like(x):
    kind = 2
    table = {1: torch.sin, 2: torch.cos}
    return table[kind](x)


@case(X34)
def cf_is_not(x):
    y = None
    if y is not None:
        return y
    return x


# ============================================================ calls


def _helper(x, y=2, *, z=3):
    return x * y + z


def _varargs(*xs, **kw):
    out = xs[0]
    for v in xs[1:]:
        out = out + v
    return out * kw.get("scale", 1)


@case(X34)
def call_defaults(x): return _helper(x), _helper(x, 3), _helper(x, z=4), _helper(y=1, x=x)


@case(X34)
def call_varargs(x): return _varargs(x, x, x), _varargs(x, scale=2)


@case(X34)
def call_star_args(x):
    args = (x, x + 1)
    kwargs = {"scale": 3}
    return _varargs(*args, **kwargs)


@case(X34)
def call_lambda(x):
    f = lambda t, k=2: t * k
    return f(x), f(x, 3)


@case(X34)
def call_partial(x):
    g = functools.partial(_helper, y=5)
    return g(x)


@case(X34)
def call_nested_def(x):
    def sq(t):
        return t * t

    def outer(t):
        return sq(t) + 1
    return outer(x)


@case(X34)
def call_recursion(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(4)


@case(X34)
def call_higher_order(x):
    def apply(f, v):
        return f(v)
    return apply(torch.relu, x), apply(lambda t: t + 1, x)


@case(X34)
def call_kwargs_only(x): return torch.sum(x, dim=1, keepdim=True)


@case(X34)
def call_map_filter(x):
    vals = list(map(lambda i: i * 2, [1, 2, 3]))
    odd = list(filter(lambda i: i % 2, [1, 2, 3]))
    return x * sum(vals) + len(odd)


PARTIAL_GLOBAL = functools.partial(torch.add, alpha=2)


@case(X34)
def call_global_partial(x): return PARTIAL_GLOBAL(x, x)


@case(X34)
def call_method_of_global_fn(x): return torch.Tensor.add(x, 1)


@case(X34)
def call_positional_only(x):
    def f(a, /, b):
        return a - b
    return f(x, 1)


# ============================================================ comprehensions / generators


@case(X34)
def g_listcomp(x): return [x * i for i in range(3)]


@case(X34)
def g_dictcomp(x): return {f"k{i}": x + i for i in range(2)}


@case(X34)
def g_setcomp(x): return x * len({i % 2 for i in range(5)})


@case(X34)
def g_genexpr_sum(x): return sum(x * i for i in range(4))


@case(X34)
def g_genexpr_tuple(x): return tuple(x + i for i in range(2))


@case(X34)
def g_nested_comp(x): return [[x * i * j for j in range(2)] for i in range(2)]


@case(X34)
def g_comp_closure(x):
    k = 3
    return [x * k for _ in range(2)]


@case(X34)
def g_any_all_gen(x): return x * any(i > 2 for i in range(4)) + all(i < 10 for i in range(3))


@case(X34)
def g_generator_function(x):
    def gen(n):
        for i in range(n):
            yield x * i
    return list(gen(3))


@case(X34)
def g_comp_over_shape(x): return [s * 2 for s in x.shape]
