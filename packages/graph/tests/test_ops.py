"""Conversions between torch objects and format records."""

import math

import pytest
import torch
from torchfuse.graph import schema as S
from torchfuse.graph.ops import (
    UnknownOpError,
    decode_arg,
    dtype_name,
    encode_arg,
    flatten_result,
    meta_of,
    node_inputs,
    op_name,
    resolve_op,
    to_dtype,
)


@pytest.mark.parametrize("op", [torch.ops.aten.add.Tensor, torch.ops.aten.relu.default,
                                torch.ops.aten.sum.dim_IntList, torch.ops.aten.native_layer_norm.default])
def test_op_name_and_resolve_op_are_inverse(op):
    name = op_name(op)
    assert name.count(".") == 2 and name.startswith("aten.")
    assert resolve_op(name) is op


def test_default_overload_is_spelled_out():
    assert op_name(torch.ops.aten.relu.default) == "aten.relu.default"


@pytest.mark.parametrize("bad", ["aten.not_an_op.default", "aten.add", "nons.add.Tensor", "aten.add.NoSuch"])
def test_resolve_unknown_op_raises(bad):
    with pytest.raises(UnknownOpError, match=r"not registered|not spelled"):
        resolve_op(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_dtype_names_round_trip(dtype):
    assert to_dtype(dtype_name(dtype)) is dtype


def test_unknown_dtype():
    with pytest.raises(ValueError):
        to_dtype("float33")
    with pytest.raises(ValueError):
        to_dtype("abs")  # an attribute of torch, but not a dtype


def test_meta_of_views():
    base = torch.randn(4, 6)
    view = base[1:, ::2].t()
    meta = meta_of(view)
    assert meta == S.TensorMeta(dtype="float32", sizes=(3, 3), strides=(2, 6), storage_offset=6,
                                device="cpu", requires_grad=False)
    assert meta_of(torch.ones(2, requires_grad=True)).requires_grad


VALUES = [None, True, False, 3, -2, 1.5, "mean", torch.float16, torch.device("cpu"), torch.strided,
          torch.channels_last, [1, 2, 3], (4, [5, None])]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_encode_decode_round_trip(value):
    arg = encode_arg(value, lambda t: "unused")
    back = decode_arg(arg, {})
    if isinstance(value, tuple):
        assert back == [4, [5, None]]
    else:
        assert back == value and type(back) is type(value)


def test_bool_is_not_encoded_as_int():
    assert isinstance(encode_arg(True, str), S.Bool)
    assert isinstance(encode_arg(1, str), S.Int)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_strings(value):
    arg = encode_arg(value, str)
    assert isinstance(arg.value, str)
    back = decode_arg(arg, {})
    assert (math.isnan(back) and math.isnan(value)) or back == value


def test_tensors_are_named_and_looked_up():
    t = torch.ones(2)
    arg = encode_arg([t, 2], lambda x: "x0")
    assert arg == S.ListArg(items=(S.TensorRef(name="x0"), S.Int(value=2)))
    assert decode_arg(arg, {"x0": t})[0] is t


def test_symref_is_evaluated_with_symbols():
    assert decode_arg(S.SymRef(expr="s0*2"), {}, {"s0": 5}) == 10


def test_unencodable_values_raise():
    with pytest.raises(TypeError):
        encode_arg(object(), str)


def test_flatten_result_and_node_inputs():
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    assert flatten_result((a, [b, c])) == [a, b, c]
    assert flatten_result(a) == [a]
    node = S.Node(name="n", op="aten.cat.default",
                  args=(S.ListArg(items=(S.TensorRef(name="x"), S.TensorRef(name="y"))), S.Int(value=0)),
                  kwargs={"out": S.TensorRef(name="z")})
    assert node_inputs(node) == ["x", "y", "z"]
