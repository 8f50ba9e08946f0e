"""Configuration of torchfuse-autograd, read once from the environment.

``TORCHFUSE_LOGS`` is the one logging switch of torchfuse (comma-separated names, like
``TORCH_LOGS``). This package owns the name ``aot``: when present, the joint, forward and
backward graphs are logged on the ``torchfuse.autograd`` logger at INFO level. A leading ``+``
(``+aot``) logs at DEBUG level as well.

``TORCHFUSE_DEBUG`` (``1``, ``true``, ``yes``) turns on the graph verifier after every pass.

``TORCHFUSE_META_MEMO=0`` makes every pass run every meta kernel again (see
`torchfuse.graph.meta_memo`).
"""

from __future__ import annotations

import logging
import os
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


def _parse_logs(text: str, debug: bool, memo: bool = True) -> Config:
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "+aot" in names:
        return Config(log_aot=True, log_level=logging.DEBUG, verify_passes=debug, meta_memo=memo)
    return Config(log_aot="aot" in names or "all" in names, verify_passes=debug, meta_memo=memo)


def from_environment(environ: dict[str, str] | None = None) -> Config:
    """The config described by ``environ`` (defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    debug = env.get("TORCHFUSE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}
    memo = env.get("TORCHFUSE_META_MEMO", "1").strip().lower() not in {"0", "false", "no", "off"}
    return _parse_logs(env.get("TORCHFUSE_LOGS", ""), debug, memo)


config: Config = from_environment()
"""The active configuration; tests may replace it with `dataclasses.replace`."""
