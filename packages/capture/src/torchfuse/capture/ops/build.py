"""Building and taking apart containers, subscripts, slices and strings."""

from __future__ import annotations

from torchfuse.capture import operators as O
from torchfuse.capture import variables as V
from torchfuse.capture.dynamic import concrete
from torchfuse.capture.errors import Unsupported, UserException


def build_tuple(frame, inst) -> None:
    frame.push(V.ListVar(frame.popn(inst.arg), tuple))


def build_list(frame, inst) -> None:
    frame.push(V.ListVar(frame.popn(inst.arg), list))


def build_set(frame, inst) -> None:
    frame.push(V.SetVar(frame.popn(inst.arg)))


def build_map(frame, inst) -> None:
    flat = frame.popn(2 * inst.arg)
    frame.push(V.DictVar({flat[i].python(): flat[i + 1] for i in range(0, len(flat), 2)}))


def build_const_key_map(frame, inst) -> None:
    keys = frame.pop().python()
    values = frame.popn(inst.arg)
    frame.push(V.DictVar(dict(zip(keys, values, strict=True))))


def build_slice(frame, inst) -> None:
    parts = [p.python() for p in frame.popn(inst.arg)]
    frame.push(V.ConstVar(slice(*parts)))


def build_string(frame, inst) -> None:
    frame.push(V.ConstVar("".join(p.python() for p in frame.popn(inst.arg))))


def format_value(frame, inst) -> None:
    flags = inst.arg
    spec = frame.pop().python() if flags & 0x04 else ""
    value = frame.pop()
    if isinstance(value, V.TensorVar):
        raise Unsupported("formatting a tensor as text reads its values")
    py = concrete(value.python())  # text needs the number: a symbolic size is specialized
    conv = flags & 0x03
    py = {0: lambda x: x, 1: str, 2: repr, 3: ascii}[conv](py)
    frame.push(V.ConstVar(format(py, spec)))


def list_append(frame, inst) -> None:
    v = frame.pop()
    target = frame.stack[-inst.arg]
    O.mutate(target)
    target.items.append(v)


def set_add(frame, inst) -> None:
    v = frame.pop()
    frame.stack[-inst.arg].add(v)


def map_add(frame, inst) -> None:
    value = frame.pop()
    key = frame.pop()
    frame.stack[-inst.arg].items[key.python()] = value


def list_extend(frame, inst) -> None:
    v = frame.pop()
    frame.stack[-inst.arg].items.extend(O.iterate(v))


def set_update(frame, inst) -> None:
    v = frame.pop()
    for item in O.iterate(v):
        frame.stack[-inst.arg].add(item)


def dict_update(frame, inst) -> None:
    v = frame.pop()
    if not isinstance(v, V.DictVar):
        raise Unsupported(f"** of {v.describe()}")
    frame.stack[-inst.arg].items.update(v.items)


def list_to_tuple(frame, inst) -> None:
    frame.push(V.ListVar(frame.pop().items, tuple))


def unpack_sequence(frame, inst) -> None:
    items = O.iterate(frame.pop())
    if len(items) != inst.arg:
        raise UserException(ValueError(f"expected {inst.arg} values to unpack, got {len(items)}"))
    frame.stack.extend(reversed(items))


def unpack_ex(frame, inst) -> None:
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = O.iterate(frame.pop())
    if len(items) < before + after:
        raise UserException(ValueError("not enough values to unpack"))
    middle = items[before:len(items) - after]
    tail = items[len(items) - after:] if after else []
    frame.stack.extend(reversed(tail))
    frame.push(V.ListVar(middle, list))
    frame.stack.extend(reversed(items[:before]))


def binary_subscr(frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    frame.push(O.getitem(obj, key))


def store_subscr(frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    value = frame.pop()
    O.setitem(obj, key, value)


def delete_subscr(frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    O.delitem(obj, key)


def binary_slice(frame, inst) -> None:
    end = frame.pop()
    start = frame.pop()
    obj = frame.pop()
    frame.push(O.getitem(obj, V.ConstVar(slice(start.python(), end.python()))))


def store_slice(frame, inst) -> None:
    end = frame.pop()
    start = frame.pop()
    obj = frame.pop()
    value = frame.pop()
    O.setitem(obj, V.ConstVar(slice(start.python(), end.python())), value)


HANDLERS = {
    "BUILD_TUPLE": build_tuple, "BUILD_LIST": build_list, "BUILD_SET": build_set,
    "BUILD_MAP": build_map, "BUILD_CONST_KEY_MAP": build_const_key_map,
    "BUILD_SLICE": build_slice, "BUILD_STRING": build_string, "FORMAT_VALUE": format_value,
    "LIST_APPEND": list_append, "SET_ADD": set_add, "MAP_ADD": map_add,
    "LIST_EXTEND": list_extend, "SET_UPDATE": set_update, "DICT_UPDATE": dict_update,
    "DICT_MERGE": dict_update, "LIST_TO_TUPLE": list_to_tuple,
    "UNPACK_SEQUENCE": unpack_sequence, "UNPACK_EX": unpack_ex,
    "BINARY_SUBSCR": binary_subscr, "STORE_SUBSCR": store_subscr,
    "DELETE_SUBSCR": delete_subscr, "BINARY_SLICE": binary_slice, "STORE_SLICE": store_slice,
}
