"""Generated call functions kept between processes: their source and a recipe for their globals.

A warm start generates each Program's call function again (`torchfuse.runtime.codegen.generate`:
straight-line Python written launch by launch), although the source is the same from process
to process: 44 ms for ResNet-18 training's two call functions on the CPU machine, and the GPU
hosts run this Python 2-3x slower. ``<cache>/calls/<key>.json`` keeps what `generate`
returned, named by everything it reads (the Program, the chosen configs, the device type, the
fast path and its launcher layout, the kernels tuned and the symbols tuned for): the source,
the entry points, the launch count, the tuning slots and a *recipe* per global, how to make the
object again in this process (``["dtype", "float32"]``, ``["kernel", name]``,
``["op", "aten.mm.default"]``, ``["helper", "_retype"]`` ...). A call function whose globals
cannot all be described, or whose recipe does not give back the very same objects, is not kept.

The folder is inside the cache directory's trust boundary, as ``code/`` is (its sources are
executed); a Program archive's own content never comes from here.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torchfuse.graph.caches import write_atomic
from torchfuse.graph.ops import dtype_name, resolve_op, to_dtype, to_layout, to_memory_format
from torchfuse.runtime import codegen
from torchfuse.runtime.config import logger

VERSION = 1
"""Bumped when this file's format changes. The key also holds the hash of the generator's own
source, so an edited `codegen` never reads what an older one wrote, and torch's version (the
generated code follows the ops' schemas)."""


@functools.lru_cache(maxsize=1)
def _generator() -> str:
    """The hash of `torchfuse.runtime.codegen`'s source and torch's version."""
    h = hashlib.sha256(Path(codegen.__file__).read_bytes())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


stats = {"hits": 0, "misses": 0}
"""Call functions read from the cache, and generated (this process)."""


def call_key(program_digest: str, **inputs: Any) -> str:
    """The file name of a call function: ``program_digest`` (the Program's own hash) and the
    other arguments of `codegen.generate`, given as JSON-able keywords."""
    text = json.dumps({"version": VERSION, "generator": _generator(), "program": program_digest, **inputs},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _name(value: Any) -> str:
    return str(value).removeprefix("torch.")


def recipe_of(gen: codegen.Generated, kernels: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """How to make each of ``gen``'s globals again, or None when one cannot be described."""
    kernel_of = {id(fn): name for name, fn in kernels.items()}
    helper_of = {id(v): name for name, v in codegen.HELPERS.items()}
    out: dict[str, list[str]] = {}
    for name, value in gen.globals.items():
        if name in gen.ops:
            out[name] = ["op", gen.ops[name]]
        elif isinstance(value, torch.dtype):
            out[name] = ["dtype", dtype_name(value)]
        elif isinstance(value, torch.device):
            out[name] = ["device", str(value)]
        elif isinstance(value, torch.layout):
            out[name] = ["layout", _name(value)]
        elif isinstance(value, torch.memory_format):
            out[name] = ["memory_format", _name(value)]
        elif id(value) in kernel_of:
            out[name] = ["kernel", kernel_of[id(value)]]
        elif id(value) in helper_of:
            out[name] = ["helper", helper_of[id(value)]]
        else:
            return None
    return out


def rebuild(recipe: Mapping[str, list[str]], kernels: Mapping[str, Any]) -> dict[str, Any]:
    """The globals ``recipe`` describes, made in this process (KeyError/ValueError: unknown)."""
    make = {"dtype": to_dtype, "device": torch.device, "layout": to_layout,
            "memory_format": to_memory_format, "kernel": kernels.__getitem__,
            "helper": codegen.HELPERS.__getitem__,
            "op": lambda qualified: codegen.bound_op(resolve_op(qualified))}
    return {name: make[kind](what) for name, (kind, what) in recipe.items()}


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] if isinstance(a[k], torch.device) else a[k] is b[k] for k in a)


def load(folder: Path, key: str, kernels: Mapping[str, Any]) -> codegen.Generated | None:
    """The call function kept under ``key``, its globals made again; None when there is none
    (or it cannot be read back: then it is generated again and written over)."""
    path = folder / f"{key}.json"
    try:
        raw = json.loads(path.read_text())
        gen = codegen.Generated(
            source=raw["source"], globals=rebuild(raw["recipe"], kernels), entry=raw["entry"],
            fast_entry=raw["fast_entry"], launches=int(raw["launches"]),
            tune_slots={int(k): int(v) for k, v in raw["tune_slots"].items()}, ops=dict(raw["ops"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        logger.debug("call cache: %s is unusable (%s); generating again", path, e)
        return None
    stats["hits"] += 1
    return gen


def store(folder: Path, key: str, gen: codegen.Generated, kernels: Mapping[str, Any]) -> bool:
    """Keep ``gen`` under ``key`` when its recipe gives back its very globals; whether kept."""
    stats["misses"] += 1
    recipe = recipe_of(gen, kernels)
    try:
        if recipe is None or not _same(rebuild(recipe, kernels), gen.globals):
            logger.debug("call cache: a global of %s has no recipe; not kept", key)
            return False
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        logger.debug("call cache: recipe of %s does not rebuild (%s); not kept", key, e)
        return False
    doc = {"source": gen.source, "recipe": recipe, "entry": gen.entry, "fast_entry": gen.fast_entry,
           "launches": gen.launches, "tune_slots": {str(k): v for k, v in gen.tune_slots.items()},
           "ops": gen.ops}
    try:
        write_atomic(folder / f"{key}.json", json.dumps(doc))
    except OSError as e:  # a read-only cache: the next process generates again
        logger.debug("call cache: cannot write %s (%s)", key, e)
        return False
    return True
