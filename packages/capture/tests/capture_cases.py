"""The conformance table: small functions, how to make their arguments, how many graphs.
This module holds the record type, the argument factories and the torch records (functions,
methods, operators, attributes, in-place ops and views, factories, ``torch.nn.functional``);
``python_cases``, ``object_cases`` and ``semantics_cases`` register theirs into the same
``CASES``, and ``test_conformance`` imports all four.

Each record is (fn, args factory, expected graph count). The ``brk_*`` records graph-break:
capture resumes after the break, so their count is the number of graphs with ops around it
(``0``: nothing but the break), and they must still return what eager returns.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


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


@case(X34)
def t_op_of_python_numbers(x):  # LED's attention: ATen runs it on wrapped numbers
    n = torch.div(16, 4, rounding_mode="trunc")
    return x * n, n
