"""Side effects on objects that outlive the frame are replayed after the graph, in order."""

from __future__ import annotations

import pytest
import torch
from capture_helpers import assert_same
from torchfuse.capture import compile

LOG: list = []
STATE = {"count": 0}
COUNTER = 0


class Box:
    def __init__(self):
        self.value = None
        self.n = 0


def test_append_to_argument_list():
    def f(x, acc):
        acc.append(x * 2)
        acc.append(3)
        return x + 1

    cf = compile(f, backend="eager")
    x = torch.randn(3)
    a, b = [], []
    assert_same(cf(x, a), f(x, b))
    assert_same(a, b)
    assert len(cf.entries) == 1 and not cf.entries[0].eager


def test_global_list_and_dict_mutation():
    def f(x):
        LOG.append(x.sum())
        STATE["count"] = STATE["count"] + 1
        return x

    cf = compile(f, backend="eager")
    LOG.clear()
    STATE["count"] = 0
    x = torch.ones(2)
    cf(x)
    cf(x)
    assert len(LOG) == 2 and STATE["count"] == 2
    torch.testing.assert_close(LOG[0], torch.tensor(2.0))


def test_global_write():
    global COUNTER

    def f(x):
        global COUNTER
        COUNTER = COUNTER + 1
        return x * COUNTER

    cf = compile(f, backend="eager")
    COUNTER = 0
    x = torch.ones(2)
    assert_same(cf(x), x * 1)
    assert COUNTER == 1
    assert_same(cf(x), x * 2)  # COUNTER changed: guard fails, recompiles
    assert COUNTER == 2


def test_object_attribute_write():
    def f(x, box):
        box.value = x * 3
        box.n = box.n + 1
        return box.value + 1

    cf = compile(f, backend="eager")
    box = Box()
    x = torch.ones(2)
    out = cf(x, box)
    assert_same(out, x * 3 + 1)
    assert_same(box.value, x * 3)
    assert box.n == 1


def test_dict_argument_setitem_and_returned_alias():
    def f(d, x):
        d["y"] = x + 1
        d.pop("drop")
        return d

    cf = compile(f, backend="eager")
    d = {"drop": 1, "keep": 2}
    out = cf(d, torch.zeros(2))
    assert out is d
    assert list(d) == ["keep", "y"]


def test_in_place_input_mutation_visible():
    def f(x, y):
        x.mul_(2)
        y[0] = 7.0
        return x + y

    cf = compile(f, backend="eager")
    x, y = torch.ones(3), torch.zeros(3)
    xe, ye = x.clone(), y.clone()
    assert_same(cf(x, y), f(xe, ye))
    assert_same((x, y), (xe, ye))


def test_order_of_side_effects():
    events = []

    def f(x, a, b):
        a.append(1)
        b.append(2)
        a.append(3)
        return x

    cf = compile(f, backend="eager")
    a, b = events, []
    cf(torch.ones(1), a, b)
    assert a == [1, 3] and b == [2]


# ============================================================ values read before their place is written


class _Holder:
    def __init__(self):
        self.a = 1
        self.items = [10, 20]


_HELD = _Holder()


def _swap_and_restore(x):
    token = _HELD.a  # a set/reset pair, as kernels' CompileableContextVar does
    _HELD.a = {"k": 2}
    y = x * _HELD.a["k"]
    _HELD.a = token
    return y


def _old_value_returned(x):
    old, first = _HELD.a, _HELD.items[0]
    _HELD.a = 5
    _HELD.items[0] = 99
    return x + 1, old, first


@pytest.mark.parametrize("fn", [_swap_and_restore, _old_value_returned], ids=["restore", "return"])
def test_a_value_read_before_its_place_is_written_is_the_old_value(fn):
    cf = compile(fn, backend="eager")
    for _ in range(2):
        _HELD.a, _HELD.items = 1, [10, 20]
        x = torch.randn(3)
        want = fn(x)
        after_eager = (_HELD.a, list(_HELD.items))
        _HELD.a, _HELD.items = 1, [10, 20]
        assert_same(cf(x), want)
        assert (_HELD.a, list(_HELD.items)) == after_eager
    assert cf.graph_count() == 1


def test_a_set_and_reset_pair_exports():
    from torchfuse.capture import export

    _HELD.a = 1
    exported = export(_swap_and_restore, torch.randn(3))
    assert_same(exported.run(torch.ones(3)), torch.full((3,), 2.0))
    assert _HELD.a == 1


def test_a_write_a_later_one_replaces_is_not_replayed():
    """A set/reset pair replays only the reset: the value in between (here a dict, in
    transformers' hub kernels a table of functions) is neither written again nor kept in the
    replay, and the object ends as eager leaves it."""
    cf = compile(_swap_and_restore, backend="eager")
    _HELD.a = 1
    x = torch.randn(3)
    assert_same(cf(x), x * 2)
    assert _HELD.a == 1
    ops = cf.entries[0].result.side_effects
    assert [op[:3] for op in ops] == [("setattr", "G['_HELD']", "a")] and ops[0][3] == ("c", 1)


_BOXES = (Box(), Box())


def _writes_between(x):
    _HELD.a = _BOXES[0]
    _HELD.a.n = 3  # replayed through the box's own source, not through _HELD.a
    _HELD.items = [1]
    _HELD.items = [2]  # the first of these two is replaced, nothing reads it
    _HELD.a = _BOXES[1]
    return x + 1


def test_replaced_writes_leave_the_objects_as_eager_does():
    cf = compile(_writes_between, backend="eager")
    for compiled in (False, True):
        _HELD.a, _HELD.items = 1, [10, 20]
        _BOXES[0].n = _BOXES[1].n = 0
        x = torch.randn(3)
        assert_same((cf if compiled else _writes_between)(x), x + 1)
        assert _HELD.a is _BOXES[1] and _HELD.items == [2] and (_BOXES[0].n, _BOXES[1].n) == (3, 0)
    names = [op[2] for op in cf.entries[0].result.side_effects if op[0] == "setattr"]
    assert names.count("items") == 1 and names.count("a") == 1 and names.count("n") == 1
