"""Helpers for the capture tests: comparing values with eager PyTorch."""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any

import torch

CASE_MODULES = ("capture_cases", "python_cases", "object_cases")
"""The conformance table's modules (`capture_cases` and the two split from it): an object of
a class defined there is compared by its ``__dict__``."""


def assert_same(a: Any, b: Any, path: str = "out") -> None:
    """Structural equality with eager: types, tensor values/dtypes/shapes/requires_grad."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{path}: {type(a)} vs tensor"
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} vs {b.shape}"
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad"
        torch.testing.assert_close(a.detach(), b.detach(), equal_nan=True, msg=lambda m: f"{path}: {m}")
        return
    if isinstance(b, list | tuple | collections.deque):
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert getattr(a, "maxlen", None) == getattr(b, "maxlen", None), f"{path}: maxlen"
        assert len(a) == len(b), f"{path}: len {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
        return
    if isinstance(b, dict):
        assert type(a) is type(b) and list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        assert getattr(a, "default_factory", None) is getattr(b, "default_factory", None), path
        for k in b:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
        return
    if dataclasses.is_dataclass(b):
        assert type(a) is type(b)
        for f in dataclasses.fields(b):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
        return
    if hasattr(b, "__dict__") and not isinstance(b, type) and type(b).__module__ in CASE_MODULES:
        assert type(a) is type(b)
        assert_same(vars(a), vars(b), f"{path}.__dict__")
        return
    if type(b).__name__ == "ndarray" or type(b).__module__ == "numpy":  # also np.float32
        import numpy as np

        assert type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b), f"{path}: {a!r} vs {b!r}"
        if a.dtype.kind in "fc":  # computed by torch instead of numpy: the last bits may differ
            assert np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True), f"{path}: {a!r} vs {b!r}"
        else:
            assert (a == b).all() or ((a != a) == (b != b)).all(), f"{path}: {a!r} vs {b!r}"
        return
    if isinstance(b, float) and b != b:
        assert a != a
        return
    assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def clone_args(args: Any) -> Any:
    return copy.deepcopy(args)
