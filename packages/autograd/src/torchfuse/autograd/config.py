"""Configuration of torchfuse-autograd, read once from the environment.

``TORCHFUSE_LOGS`` is the one logging switch of torchfuse (comma-separated names, like
``TORCH_LOGS``). This package owns the name ``aot``: when present, the joint, forward and
backward graphs are logged on the ``torchfuse.autograd`` logger at INFO level. A leading ``+``
(``+aot``) logs at DEBUG level as well.

``TORCHFUSE_DEBUG`` (``1``, ``true``, ``yes``) turns on the graph verifier after every pass.

``TORCHFUSE_META_MEMO=0`` makes every pass run every meta kernel again (see
`torchfuse.graph.meta_memo`). ``TORCHFUSE_META_MEMO_DISK=0`` keeps that memo in memory: by
default its answers for ATen ops are kept in ``<cache dir>/meta_memo/`` (one file per torch
version, `torchfuse.graph.meta_memo_store`), so a new process runs no meta kernel an earlier
one ran.

``TORCHFUSE_COMPILE_FORWARD_FIRST=1`` changes the order in which a training step's halves are
compiled when the backward is compiled early (`torchfuse.autograd.aot`'s
``compile_backward_early``, which the inductor backend sets): the forward is lowered first and
its kernels' compiles are started before the backward is lowered, instead of the backward first.
Off by default until a GPU run has measured both orders.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of the autograd package (all derived from the environment at import)."""

    log_aot: bool = False
    """Log joint/forward/backward graphs (``TORCHFUSE_LOGS`` contains ``aot``)."""
    log_level: int = logging.INFO
    verify_passes: bool = False
    """Run ``torchfuse.graph.verify`` on every graph a pass produces (``TORCHFUSE_DEBUG``)."""
    meta_memo: bool = True
    """Answer a pass's meta-kernel calls from `torchfuse.graph.meta_memo` when the same op
    met arguments of the same metadata before (``TORCHFUSE_META_MEMO=0``: off)."""
    meta_memo_disk: bool = True
    """Keep that memo in the cache directory across processes
    (``TORCHFUSE_META_MEMO_DISK=0``: in memory only)."""
    forward_first: bool = False
    """With ``compile_backward_early``: lower the forward and start its compiles before
    lowering the backward (``TORCHFUSE_COMPILE_FORWARD_FIRST=1``)."""


def _on(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A switch: on by default unless set to 0/false/no/off, or off unless set to 1/true/yes/on."""
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    return value not in {"0", "false", "no", "off"} if default else value in {"1", "true", "yes", "on"}


def from_environment(environ: dict[str, str] | None = None) -> Config:
    """The config described by ``environ`` (defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    names = {n.strip() for n in env.get("TORCHFUSE_LOGS", "").split(",") if n.strip()}
    return Config(
        log_aot=bool(names & {"aot", "+aot", "all"}),
        log_level=logging.DEBUG if "+aot" in names else logging.INFO,
        verify_passes=_on(env, "TORCHFUSE_DEBUG", False),
        meta_memo=_on(env, "TORCHFUSE_META_MEMO", True),
        meta_memo_disk=_on(env, "TORCHFUSE_META_MEMO_DISK", True),
        forward_first=_on(env, "TORCHFUSE_COMPILE_FORWARD_FIRST", False),
    )


config: Config = from_environment()
"""The active configuration; tests may replace it with `dataclasses.replace`."""
