"""Conformance records for builtins, ``math`` and ``operator``, user classes, ``nn.Module``s
read from globals, the expected graph breaks (resumed) and the rest (slices, devices, finfo,
objects). Same record shape as ``capture_cases`` and registered into its table, so
``test_conformance`` runs them."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from capture_cases import X34, XY, case
from torch import nn

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
