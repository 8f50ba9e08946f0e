"""The conformance table: small functions, how to make their arguments, how many graphs.

Each record is (fn, args factory, expected graph count). The ``brk_*`` records graph-break:
capture resumes after the break, so their count is the number of graphs with ops around it
(``0``: nothing but the break), and they must still return what eager returns.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Case:
    fn: object
    make: object
    graphs: int = 1
    breaks: int | None = None  # graph breaks; unset: none when the case is one graph

    @property
    def name(self) -> str:
        return self.fn.__name__


CASES: list[Case] = []


def case(make, graphs: int = 1, breaks: int | None = None):
    def deco(fn):
        CASES.append(Case(fn, make, graphs, 0 if breaks is None and graphs == 1 else breaks))
        return fn
    return deco


def T(*shape, dtype=torch.float32):
    return lambda: (torch.randn(*shape).to(dtype),)


def TT(*shape):
    return lambda: (torch.randn(*shape), torch.randn(*shape))


def TI(*shape):
    return lambda: (torch.randn(*shape), 3)


X34 = T(3, 4)
XY = TT(3, 4)

# ============================================================ torch functions / methods / operators


@case(X34)
def t_add_const(x): return x + 1


@case(XY)
def t_add(x, y): return x + y


@case(XY)
def t_sub_mul_div(x, y): return (x - y) * y / (x.abs() + 1)


@case(XY)
def t_pow(x, y): return x ** 2 + 2 ** y.clamp(-1, 1)


@case(XY)
def t_floordiv_mod(x, y): return x // (y.abs() + 1), x % 2


@case(lambda: (torch.randn(3, 4), torch.randn(4, 5)))
def t_matmul(x, w): return x @ w


@case(X34)
def t_neg_pos(x): return -x, +x


@case(lambda: (torch.randint(0, 10, (3, 4)),))
def t_bitwise(x): return x & 3, x | 4, x ^ 1, ~x, x << 1, x >> 1


@case(XY)
def t_compare(x, y): return x < y, x <= y, x == y, x != y, x > 0, x >= 0.5


@case(XY)
def t_rsub_rdiv(x, y): return 1 - x, 2 / (y.abs() + 1), 3 * x


@case(X34)
def t_unary_methods(x): return x.sin(), x.cos(), x.exp(), x.tanh(), x.sigmoid(), x.relu()


@case(X34)
def t_unary_funcs(x): return torch.sin(x), torch.abs(x), torch.sqrt(x.abs()), torch.log1p(x.abs())


@case(X34)
def t_reductions(x): return x.sum(), x.mean(1), x.max(), x.amax(0), x.std(), x.var(1, keepdim=True)


@case(X34)
def t_max_dim(x): return x.max(dim=1)


@case(X34)
def t_max_dim_fields(x):
    r = torch.max(x, 1)
    return r.values * 2, r.indices


@case(X34)
def t_argmax(x): return x.argmax(1), torch.argmin(x, dim=0)


@case(X34)
def t_softmax(x): return x.softmax(-1), torch.log_softmax(x, dim=1)


@case(X34)
def t_cumsum(x): return x.cumsum(1), torch.cumprod(x, 0)


@case(XY)
def t_where(x, y): return torch.where(x > 0, x, y)


@case(XY)
def t_maximum(x, y): return torch.maximum(x, y), torch.minimum(x, y)


@case(XY)
def t_cat_stack(x, y): return torch.cat([x, y], 0), torch.stack((x, y), dim=1)


@case(X34)
def t_split_chunk(x): return x.split(2, dim=1), x.chunk(3, 0)


@case(X34)
def t_unbind(x): return x.unbind(0)


@case(X34)
def t_clamp(x): return x.clamp(min=-0.5, max=0.5), x.clamp_min(0), torch.clamp(x, -1, 1)


@case(XY)
def t_lerp_addcmul(x, y): return torch.lerp(x, y, 0.3), torch.addcmul(x, x, y, value=0.5)


@case(lambda: (torch.randn(2, 3, 4), torch.randn(2, 4, 5)))
def t_bmm(a, b): return torch.bmm(a, b), torch.einsum("bij,bjk->bik", a, b)


@case(X34)
def t_to_dtype(x): return x.to(torch.float64), x.half().float(), x.to(dtype=torch.int32)


@case(X34)
def t_type_as(x): return x.type_as(torch.ones(1, dtype=torch.float64))


@case(XY)
def t_method_chain(x, y): return x.add(y, alpha=2).mul(0.5).sub_(1).abs()


@case(X34)
def t_norm(x): return x.norm(), torch.linalg.vector_norm(x, dim=1)


@case(X34)
def t_topk(x): return torch.topk(x, 2, dim=1)


@case(X34)
def t_sort(x): return torch.sort(x, dim=1, descending=True)


@case(X34)
def t_any_all(x): return (x > 0).any(), (x > -10).all(dim=1)


@case(X34)
def t_logical(x): return torch.logical_and(x > 0, x < 1), torch.logical_not(x > 0)


@case(X34)
def t_isnan(x): return torch.isnan(x), torch.isfinite(x / 0)


@case(XY)
def t_dist(x, y): return torch.cdist(x, y)


@case(X34)
def t_tril(x): return torch.tril(x), x.triu(1)


@case(X34)
def t_flip_roll(x): return torch.flip(x, [0]), torch.roll(x, 1, 1)


@case(X34)
def t_outer(x): return torch.outer(x[0], x[1])


@case(lambda: (torch.randn(3, 4), torch.tensor([0, 2])))
def t_index_select(x, i): return x.index_select(0, i), x[i], torch.gather(x, 1, i.view(2, 1).expand(2, 3))


@case(lambda: (torch.randn(3, 4),))
def t_bool_mask_where(x): return torch.where(x > 0, x, torch.zeros_like(x)).sum(1)


@case(X34)
def t_rounding(x): return torch.round(x * 3), x.floor(), x.ceil(), x.trunc(), x.frac()


@case(X34)
def t_sign(x): return x.sign(), torch.sgn(x), x.reciprocal()


@case(X34)
def t_pow_method(x): return x.pow(3), x.square(), x.rsqrt().nan_to_num()


@case(X34)
def t_erf(x): return torch.erf(x), torch.special.expm1(x)


@case(X34)
def t_prod(x): return x.prod(1), torch.prod(x)


@case(X34)
def t_mean_keepdim(x): return x.mean(dim=(0, 1), keepdim=True)


@case(XY)
def t_eq_method(x, y): return x.eq(y), x.gt(0), x.le(y)


@case(X34)
def t_masked_fill(x): return x.masked_fill(x > 0, 0.0)


@case(X34)
def t_diff_ops(x): return torch.diff(x, dim=1)


@case(XY)
def t_atan2(x, y): return torch.atan2(x, y), torch.hypot(x, y)


@case(lambda: (torch.randn(3, 4), torch.randn(4)))
def t_broadcast(x, b): return x + b, x * b[None, :]


@case(X34)
def t_scalar_tensor_ops(x): return x + torch.tensor(2.0), x * torch.tensor([1.0, 2.0, 3.0, 4.0])


@case(X34)
def t_detach(x): return x.detach() + 1


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def t_requires_grad_out(x): return (x * 2).sum(1)


@case(lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)))
def t_mixed_grad(x, y): return x * y, y + 1


@case(lambda: (torch.randn(4, 4),))
def t_linalg(x): return torch.matmul(x, x.T), torch.mm(x, x.t())


@case(lambda: (torch.randn(2, 3, 8, 8),))
def t_conv_pool(x): return F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1)


@case(lambda: (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)))
def t_conv2d(x, w): return F.conv2d(x, w, padding=1)


@case(lambda: (torch.randint(0, 5, (3,)),))
def t_one_hot(i): return F.one_hot(i, 5)


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def t_losses(x, y): return F.mse_loss(x, y), F.l1_loss(x, y, reduction="sum"), F.smooth_l1_loss(x, y)


@case(lambda: (torch.randn(3, 5), torch.tensor([1, 0, 4])))
def t_cross_entropy(x, t): return F.cross_entropy(x, t), F.nll_loss(F.log_softmax(x, 1), t)


# ============================================================ attributes and shapes


@case(X34)
def s_shape(x): return x.view(x.shape[0] * x.shape[1])


@case(X34)
def s_size_call(x): return x.reshape(x.size(1), x.size()[0])


@case(X34)
def s_dim_numel(x): return x * x.dim() + x.numel()


@case(X34)
def s_ndim(x): return x.sum(x.ndim - 1)


@case(X34)
def s_dtype_device(x): return torch.zeros(2, dtype=x.dtype, device=x.device)


@case(X34)
def s_T(x): return x.T, x.mT


@case(X34)
def s_shape_unpack(x):
    a, b = x.shape
    return x.reshape(b, a) * a


@case(X34)
def s_shape_arith(x): return x.new_zeros(x.shape[0] // 2 + 1, x.shape[-1] % 3)


@case(X34)
def s_size_neg(x): return x.size(-1) * x


@case(X34)
def s_shape_compare(x):
    if x.shape[0] > 2:
        return x + 1
    return x - 1


@case(X34)
def s_shape_tuple_ops(x): return x.view(*x.shape[:1], -1, 2)


@case(X34)
def s_is_floating(x): return x * 2 if x.is_floating_point() else x


@case(X34)
def s_dtype_compare(x): return x.float() if x.dtype == torch.float16 else x * 3


@case(X34)
def s_len_tensor(x): return x[: len(x) - 1]


@case(X34)
def s_stride(x): return x * x.stride(0) + x.is_contiguous()


@case(X34)
def s_requires_grad_attr(x): return x + (1 if x.requires_grad else 2)


@case(X34)
def s_shape_math(x): return x * math.sqrt(x.shape[-1])


@case(X34)
def s_shape_in_list(x): return x.permute(*[1, 0]).contiguous().view([x.shape[1] * x.shape[0]])


@case(X34)
def s_element_size(x): return x * x.element_size()


@case(X34)
def s_size_slice(x): return torch.ones(x.size()[1:])


# ============================================================ in-place and views


@case(X34)
def i_add_(x):
    x.add_(1)
    return x


@case(X34)
def i_mul_(x):
    y = x * 2
    y.mul_(3)
    return y


@case(XY)
def i_inplace_operator(x, y):
    x += y
    x *= 2
    return x


@case(X34)
def i_setitem(x):
    x[0] = 0
    return x


@case(X34)
def i_setitem_slice(x):
    x[:, 1:3] = 5.0
    return x * 1


@case(X34)
def i_view_mutation(x):
    v = x.view(12)
    v[0] = 100.0
    return x


@case(X34)
def i_transpose_contig(x): return x.transpose(0, 1).contiguous()


@case(X34)
def i_slicing(x): return x[1:], x[:, ::2], x[..., -1], x[None, 0, 1:3]


@case(X34)
def i_unsqueeze_expand(x): return x.unsqueeze(0).expand(2, 3, 4), x[:, None].squeeze(1)


@case(X34)
def i_flatten_view(x): return x.flatten(), x.view(-1, 2), x.reshape(2, 6)


@case(X34)
def i_narrow_select(x): return x.narrow(1, 1, 2), x.select(0, 1)


@case(X34)
def i_zero_fill(x):
    y = x.clone()
    y.zero_()
    x.fill_(2.0)
    return y, x


@case(X34)
def i_clamp_(x):
    x.clamp_(min=0)
    return x.relu_()


@case(X34)
def i_copy_(x):
    y = torch.empty_like(x)
    y.copy_(x * 2)
    return y


@case(XY)
def i_index_put(x, y):
    x[x > 0] = 0.0
    return x


@case(X34)
def i_ellipsis(x): return x[..., 1:], x[0, ...]


# ============================================================ factories


@case(X34)
def f_zeros_ones(x): return torch.zeros(3, 4) + x, torch.ones_like(x), torch.full((2,), 7.0)


@case(X34)
def f_arange(x): return x + torch.arange(4), torch.arange(0, 6, 2)


@case(X34)
def f_linspace(x): return torch.linspace(0, 1, 4) * x


@case(X34)
def f_eye(x): return x @ torch.eye(4)


@case(X34)
def f_empty_fill(x): return torch.empty(3, 4).fill_(1.5) * x


@case(X34)
def f_tensor_literal(x): return x + torch.tensor([1.0, 2.0, 3.0, 4.0])


@case(X34)
def f_new_methods(x): return x.new_ones(2), x.new_full((2, 2), 3.0), x.new_tensor([1.0])


@case(X34)
def f_zeros_like_dtype(x): return torch.zeros_like(x, dtype=torch.int64)


@case(X34)
def f_triu_ones(x): return torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)


@case(X34)
def f_full_like(x): return torch.full_like(x, 2) * x


# ============================================================ torch.nn.functional


@case(X34)
def n_activations(x): return F.relu(x), F.gelu(x), F.silu(x), F.leaky_relu(x, 0.1), F.elu(x)


@case(X34)
def n_gelu_tanh(x): return F.gelu(x, approximate="tanh")


@case(X34)
def n_softmax(x): return F.softmax(x, dim=-1), F.log_softmax(x, -1)


@case(lambda: (torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)))
def n_linear(x, w, b): return F.linear(x, w, b)


@case(lambda: (torch.randn(3, 4), torch.ones(4), torch.zeros(4)))
def n_layer_norm(x, w, b): return F.layer_norm(x, (4,), w, b)


@case(X34)
def n_normalize(x): return F.normalize(x, dim=1)


@case(X34)
def n_dropout_eval(x): return F.dropout(x, 0.5, training=False)


@case(lambda: (torch.randint(0, 10, (2, 3)), torch.randn(10, 4)))
def n_embedding(i, w): return F.embedding(i, w)


@case(lambda: (torch.randn(2, 3, 4),))
def n_pad(x): return F.pad(x, (1, 2)), F.pad(x, (1, 1, 1, 1), value=1.0)


@case(X34)
def n_hardtanh(x): return F.hardtanh(x), F.softplus(x), F.tanh(x), F.sigmoid(x)


@case(lambda: (torch.randn(2, 2, 4, 8),) * 3)
def n_sdpa(q, k, v): return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@case(lambda: (torch.randn(2, 4, 6),))
def n_group_norm(x): return F.group_norm(x, 2)


@case(lambda: (torch.randn(2, 3, 4, 4),))
def n_interpolate(x): return F.interpolate(x, scale_factor=2, mode="nearest")


@case(lambda: (torch.randn(3, 4), torch.rand(3, 4)))
def n_bce(x, t): return F.binary_cross_entropy_with_logits(x, t)


@case(X34)
def n_glu(x): return F.glu(x, dim=-1)


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


# ============================================================ builtins


@case(X34)
def b_len_list(x): return x * len([1, 2, 3])


@case(X34)
def b_min_max(x): return x * min(3, 5) + max([1, 7, 2]) + max(x.shape)


@case(X34)
def b_abs(x): return abs(x), abs(-3)


@case(X34)
def b_sum_start(x): return sum([1, 2], 10) * x


@case(X34)
def b_sorted_key(x): return x * sorted([3, 1, 2], key=lambda v: -v)[0]


@case(X34)
def b_reversed(x): return [x * i for i in reversed(range(3))]


@case(X34)
def b_range_args(x): return x * len(range(1, 10, 3)) + list(range(3))[-1]


@case(X34)
def b_int_float_bool(x): return x * int(2.7) + float(3) + bool(0) + int("4")


@case(X34)
def b_round_divmod(x):
    q, r = divmod(17, 5)
    return x * round(2.567, 1) + q + r + pow(2, 3)


@case(X34)
def b_getattr_hasattr(x):
    f = x.relu
    return f() if hasattr(x, "relu") else x, getattr(torch, "nope", None) is None


@case(X34)
def b_isinstance_tuple(x): return x * isinstance(3, (int, float)) + isinstance("a", int)


@case(X34)
def b_type(x): return x * (int is int) + (type(x) is torch.Tensor)


@case(X34)
def b_str_repr(x): return x * len(str(12)) + len(repr("ab"))


@case(X34)
def b_iter_next(x):
    it = iter([1, 2, 3])
    next(it)
    return x * next(it)


@case(X34)
def b_callable(x): return x * callable(torch.relu) + callable(3)


@case(X34)
def b_enumerate_start(x): return [x * i for i, _ in enumerate("ab", start=1)]


@case(X34)
def b_all_any_list(x): return x * all([True, 1]) + any([0, 0])


@case(X34)
def b_zip_dict(x): return dict(zip(["a", "b"], [x, x + 1]))


@case(X34)
def b_list_tuple_ctor(x): return list((x, x)), tuple([x]), tuple(range(2))


@case(X34)
def b_max_key(x): return x * max([(1, "a"), (3, "b")], key=lambda p: p[0])[0]


# ============================================================ math / operator


@case(X34)
def m_math(x): return x * math.sqrt(16) + math.log(math.e) + math.floor(2.5) + math.ceil(0.1)


@case(X34)
def m_math_consts(x): return x * math.pi / math.inf + math.cos(0)


@case(XY)
def m_operator(x, y): return operator.add(x, y), operator.mul(x, 2), operator.neg(y)


@case(X34)
def m_operator_getitem(x): return operator.getitem(x, 0), operator.itemgetter(1)([x, x * 2]) if False else x


@case(X34)
def m_operator_const(x): return x * operator.add(2, 3) + operator.truediv(1, 4)


@case(X34)
def m_math_prod_isclose(x): return x * math.prod([1, 2, 3]) + math.isclose(1.0, 1.0)


@case(X34)
def m_reduce(x): return functools.reduce(operator.add, [x, x, x])


# ============================================================ classes

Point = collections.namedtuple("Point", ["x", "y"])


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    shift: int = 1


class Scaler:
    factor = 3

    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k + self.factor

    @staticmethod
    def static(x):
        return x - 1

    @classmethod
    def build(cls, k):
        return cls(k)

    @property
    def double(self):
        return self.k * 2


class Base:
    def f(self, x):
        return x + 1


class Derived(Base):
    def f(self, x):
        return super().f(x) * 2


@case(X34)
def k_namedtuple(x):
    p = Point(x, x * 2)
    return p.x + p.y, p[0], p


@case(X34)
def k_typed_namedtuple(x):
    p = Pair(a=x, b=x + 1)
    return p.a * p.b, p


@case(X34)
def k_dataclass(x):
    c = Config(scale=3.0)
    return x * c.scale + c.shift


@case(X34)
def k_dataclass_return(x): return Config(scale=1.5, shift=x.shape[0])


@case(X34)
def k_user_class(x):
    s = Scaler(2)
    return s.apply(x), Scaler.static(x), s.double * x


@case(X34)
def k_classmethod(x): return Scaler.build(4).apply(x)


@case(X34)
def k_super(x): return Derived().f(x)


GLOBAL_SCALER = Scaler(5)


@case(X34)
def k_global_object(x): return GLOBAL_SCALER.apply(x) + GLOBAL_SCALER.k


@case(X34)
def k_class_attr(x): return x * Scaler.factor


@case(X34)
def k_object_attr_write(x):
    s = Scaler(1)
    s.k = 7
    return s.apply(x)


@case(lambda: (torch.randn(3, 4), Point(1, 2)))
def k_namedtuple_arg(x, p): return x * p.x + p.y


@case(lambda: (Pair(torch.randn(3), torch.randn(3)),))
def k_namedtuple_tensor_arg(p): return p.a - p.b


@case(X34)
def k_namedtuple_methods(x):
    p = Point(1, 2)
    q = p._replace(y=5)
    return x * q.y + p._asdict()["x"]


class Callable_:
    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        return x * self.w


@case(X34)
def k_callable_object(x): return Callable_(3)(x)


# ============================================================ nn.Module (from globals)

torch.manual_seed(0)
LIN = nn.Linear(4, 5)
SEQ = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
LN = nn.LayerNorm(4)
EMB = nn.Embedding(10, 4)
MLIST = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
MDICT = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()})
DROP_EVAL = nn.Dropout(0.5).eval()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.register_buffer("bias2", torch.ones(4))
        self.scale = 0.5

    def forward(self, x):
        return self.norm(self.fc(x) * self.scale + self.bias2) + x


BLOCK = Block()


@case(X34)
def mod_linear(x): return LIN(x)


@case(X34)
def mod_sequential(x): return SEQ(x)


@case(X34)
def mod_layernorm(x): return LN(x)


@case(lambda: (torch.randint(0, 10, (2, 3)),))
def mod_embedding(i): return EMB(i)


@case(X34)
def mod_modulelist_iter(x):
    for m in MLIST:
        x = m(x).relu()
    return x


@case(X34)
def mod_modulelist_index(x): return MLIST[1](x) + MLIST[-1](x) + len(MLIST)


@case(X34)
def mod_moduledict(x): return MDICT["b"](MDICT["a"](x)), [k for k in MDICT]


@case(X34)
def mod_user_block(x): return BLOCK(x)


@case(X34)
def mod_weight_access(x): return x @ LIN.weight.T + LIN.bias


@case(X34)
def mod_dropout_eval(x): return DROP_EVAL(x)


@case(X34)
def mod_training_flag(x): return x * 2 if BLOCK.training else x


@case(X34)
def mod_parameters_loop(x): return x.sum() + sum(p.sum() for p in [LIN.weight, LIN.bias])


@case(X34)
def mod_sequential_index(x): return SEQ[0](x), SEQ[-1](SEQ[1](SEQ[0](x)))


@case(X34)
def mod_functional_on_param(x): return F.linear(x, LIN.weight, LIN.bias).softmax(-1)


# ============================================================ expected graph breaks (resumed)


@case(X34, graphs=1, breaks=1)
def brk_print(x):
    print("hello from a compiled function")
    return x + 1


@case(X34, graphs=2)
def brk_item(x): return x * x.sum().item()


@case(X34, graphs=0)
def brk_tolist(x): return x.tolist()


@case(X34, graphs=2)
def brk_if_tensor(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@case(X34, graphs=1, breaks=1)
def brk_nonzero(x): return torch.nonzero(x > 0)


@case(X34, graphs=0)  # after the break, from_numpy of the array is a graph input: no ops
def brk_numpy(x):
    import numpy as np

    return torch.from_numpy(np.cumsum(x.numpy()))  # x.numpy() is traced, cumsum is not


@case(X34, graphs=2)
def brk_int_tensor(x): return x * int(x.sum())


@case(X34)
def cf_raise_caught(x):
    if x.dim() == 2:
        raise_if = True
        if raise_if:
            try:
                raise ValueError("boom")
            except ValueError:
                pass
    return x


# ============================================================ more (slices, devices, finfo, objects)


@case(X34)
def x_store_slice_list(x):
    xs = [1, 2, 3, 4]
    xs[1:3] = [9]
    return x * sum(xs), xs


@case(X34)
def x_store_slice_tensor(x):
    y = x.clone()
    y[1:3] = 0.0
    return y


@case(X34)
def x_device_type(x): return x * 2 if x.device.type == "cpu" else x


@case(X34)
def x_finfo(x): return x.clamp(min=torch.finfo(x.dtype).min / 2)


@case(X34)
def x_shape_numel(x): return x.reshape(x.shape.numel())


@case(X34)
def x_super_two_arg(x): return super(Derived, Derived()).f(x)


class Holder:
    def __init__(self):
        self.w = torch.ones(4)
        self.scale = 2


@case(lambda: (torch.randn(3, 4), Holder()))
def x_object_arg_tensor_attr(x, h): return x * h.w * h.scale


MODULE_ARG = nn.Linear(4, 2)


@case(lambda: (torch.randn(3, 4), MODULE_ARG))
def x_module_arg(x, m): return m(x), m.weight.shape


@case(X34)
def x_dtype_itemsize(x): return x * x.dtype.itemsize + x.dtype.is_floating_point


@case(X34)
def x_chained_methods_on_shape(x): return x.view(-1, *x.shape[1:]).sum(dim=tuple(range(1, x.dim())))


@case(X34)
def x_tensor_list_comp_stack(x): return torch.stack([r.sum() for r in x.unbind(0)])


@case(X34)
def x_getattr_module_fn(x): return getattr(F, "relu")(x)  # noqa: B009


@case(X34)
def x_nested_tuple_unpack(x):
    (a, b), c = (1, 2), 3
    return x * a + b * c


@case(X34)
def x_bool_short_circuit(x):
    flag = x.dim() == 2 and x.shape[0] > 1
    return x + 1 if flag else x


@case(X34)
def x_tensor_in_tuple_contains(x):
    xs = (x, x + 1)
    return len([t for t in xs if t is x])


@torch.no_grad()
def _no_grad_helper(t):
    return t * 2


@torch.autocast("cpu", dtype=torch.bfloat16)
def _autocast_helper(a):
    return a @ a.T


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def x_no_grad_decorated_helper(x): return _no_grad_helper(x) + x, _no_grad_helper(x)


@case(X34)
def x_autocast_decorated_helper(x): return _autocast_helper(x).float()


@case(lambda: (torch.randn(3, 4, requires_grad=True),))
def x_inference_mode_off(x):
    with torch.inference_mode(False):
        return x * 2


@case(X34)
def x_moduledict_items(x):
    outs = {}
    for name, m in MDICT.items():
        outs[name] = m(x)
    return outs, [type(m).__name__ for m in MDICT.values()], list(MDICT.keys())


@case(X34)
def x_modulelist_slice(x):
    for m in MLIST[1:]:
        x = m(x)
    return x


@case(X34)
def x_sequential_slice_call(x): return SEQ[:2](x)


@case(X34)
def x_enumerate_zip_modules(x):
    outs = []
    for i, (a, b) in enumerate(zip(MLIST, MLIST[::-1], strict=True)):
        outs.append(a(x) * i + b(x))
    return outs


@case(X34)
def x_module_children_names(x):
    return x * len(list(BLOCK.named_children())) if False else x * len(BLOCK._modules)


@case(X34)
def cf_except_keyerror(x):
    d = {"a": 1}
    try:
        v = d["b"]
    except KeyError as e:
        v = len(str(e))
    return x * v


@case(X34)
def cf_except_attribute_error(x):
    try:
        n = x.no_such_attribute_here
    except AttributeError:
        n = 2
    return x * n


@case(X34)
def cf_except_in_helper(x):
    def helper(i):
        if i > 1:
            raise ValueError("too big")
        return i

    total = 0
    for i in range(4):
        try:
            total += helper(i)
        except ValueError:
            total += 10
    return x * total


@case(X34)
def cf_try_except_else_finally(x):
    out = []
    try:
        out.append(1)
    except IndexError:
        out.append(2)
    else:
        out.append(3)
    finally:
        out.append(4)
    return x * sum(out)


@case(X34)
def cf_except_import_error(x):
    try:
        import no_such_module_torchfuse  # noqa: F401
        k = 1
    except ImportError:
        k = 5
    return x * k


@case(X34)
def cf_assert_caught(x):
    try:
        assert x.dim() == 3, "needs 3-d"
    except AssertionError:
        return x
    return x * 2
