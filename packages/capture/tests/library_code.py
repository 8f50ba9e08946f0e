"""Library-style code for test_library_patterns.py, in a module of its own: its globals are
not the test module's (a function resumed after a break must see *these*)."""

from __future__ import annotations

import collections.abc
import copy
import functools
import os

import torch

SCALE = 3.0


class Registry(dict):
    """A dict subclass keyed by class name, read through ``super().get``."""

    def __setitem__(self, obj, value):
        super().__setitem__(type(obj).__name__, value)

    def get(self, obj):
        return super().get(type(obj).__name__) or {}


REGISTRY = Registry()


class Layers(collections.abc.Sequence):
    """``collections.abc.Sequence`` over ``__len__``/``__getitem__``: iterated through the
    mixin's own ``__iter__``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return i + 1


class Config:
    """A config with aliases, as ``transformers`` configs have (``__getattribute__`` and
    ``__setattr__`` map an alias to the real name)."""

    aliases = {"width": "hidden_size"}

    def __init__(self, hidden_size, layers):
        self.hidden_size = hidden_size
        self.layers = layers
        self.extra = {"a": 1}

    def __getattribute__(self, key):
        if key != "aliases" and key in super().__getattribute__("aliases"):
            key = super().__getattribute__("aliases")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("aliases"):
            key = super().__getattribute__("aliases")[key]
        super().__setattr__(key, value)


def from_env(name, default):
    """``Mapping.get`` on ``os.environ``: a ``KeyError(...) from None`` raised and caught."""
    return os.environ.get(name, default)


def graph_break(x):
    print("inside library code")  # a graph break deep in a call
    return x * SCALE


def wrapped(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:  # a break under this try cannot resume here: this frame runs in Python
            out = func(*args, **kwargs)
        finally:
            pass
        return out
    return wrapper


@wrapped
def body(x):
    y = torch.relu(x) + 1
    y = graph_break(y)  # resumed inside body, whose globals are this module's
    return torch.sin(y) * SCALE


def copy_config(cfg):
    other = copy.deepcopy(cfg)
    other.width = other.width * 2  # through the alias
    del other.extra
    return other


FACTOR = 2.0


def scaled(x):
    """Reads a global of this module: a caller's guard must go through this module."""
    return x * FACTOR


def round(v, ndigits=None):
    return 42


def break_then_global(x):
    y = x + 1
    n = y.sum().item()  # a graph break inside library code
    return y * SCALE + n


def break_then_len(x):
    y = x * 2
    n = y.sum().item()
    return y + round(n) + len([1, 2])  # round is this module's, len the builtin


def outer_calls_break(x):
    return break_then_global(x * 3) + FACTOR
