"""Make PyPI's ``torchvision`` wheel importable next to a CPU-only torch build.

PyPI's ``torchvision`` wheel for Linux is built against the CUDA build of torch. Next to the
CPU build of the same torch release its C++ library (``torchvision/_C.so``) fails to load;
torchvision tolerates that (its operators then raise a clear error when called), except
that ``torchvision/_meta_registrations.py`` registers fake kernels for ``torchvision::nms``
and ``torchvision::qnms`` without checking, and the import fails with
``RuntimeError: operator torchvision::nms does not exist``. Since ``transformers`` imports
torchvision whenever it is installed, ``import transformers`` fails with it.

`install` defines the schemas of those two operators, and nothing else, when (and only
when) torchvision is installed and its C++ library does not load. torchvision's own import
then goes through; the vision models (convolutions, pooling, normalization: all ATen) need
none of its C++ operators, and calling one raises torchvision's own "Couldn't load custom
C++ ops" error (the schemas have no kernel). With a torchvision whose library loads (the
GPU machine's), `install` changes nothing.

The repository's root ``conftest.py`` calls it before any test imports ``transformers`` or
``torchvision``, and ``benchmarks/models.py`` before it imports either. See
``docs/models.md`` ("torchvision in development").
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

SCHEMAS = {
    # torchvision/csrc/ops/nms.cpp and qnms (quantized); the fake kernels registered at import
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_LIBRARY: torch.library.Library | None = None  # kept alive: dropping it removes the schemas


def _library_path() -> Path | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(root.glob("_C.*so")) + sorted(root.glob("_C.*pyd"))
    return found[0] if found else root / "_C.so"


def install() -> str:
    """Define the missing ``torchvision::`` schemas if needed; says what it found:
    ``"absent"`` (torchvision is not installed), ``"native"`` (its C++ library loads, or
    torchvision was imported already) or ``"shimmed"`` (the schemas were defined here)."""
    global _LIBRARY
    if "torchvision" in sys.modules or _LIBRARY is not None:
        return "shimmed" if _LIBRARY is not None else "native"
    path = _library_path()
    if path is None:
        return "absent"
    try:
        # what torchvision/extension.py does first; loading a library twice is a no-op
        torch.ops.load_library(str(path))
    except (ImportError, OSError):
        pass
    if all(hasattr(torch.ops.torchvision, name) for name in SCHEMAS):
        return "native"
    _LIBRARY = torch.library.Library("torchvision", "DEF")
    for name, schema in SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            _LIBRARY.define(schema)
    return "shimmed"


if __name__ == "__main__":  # python scripts/torchvision_compat.py: what this environment needs
    print(install())
