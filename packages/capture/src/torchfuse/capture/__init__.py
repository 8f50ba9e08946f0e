"""torchfuse-capture: bytecode capture with guards, recompiles, explain and export.

``compile(fn)`` interprets ``fn``'s bytecode symbolically on its first call, records the
torch operations as a [`torchfuse.graph.Graph`][torchfuse.graph.Graph] with the guards under which it may be
reused, and runs the graph through a backend on later calls. See ``docs/capture.md``.
"""

from torchfuse.capture import config as _config_module
from torchfuse.capture import grad_op as _grad_op  # noqa: F401  (registers torchfuse.set_grad_enabled)
from torchfuse.capture.__about__ import __version__
from torchfuse.capture.backends import eager, list_backends, lookup_backend
from torchfuse.capture.compiler import CompiledFunction, CompiledModule, compile, mark_dynamic, reset
from torchfuse.capture.distributed import RankDivergence, RankDivergenceWarning
from torchfuse.capture.errors import (
    AmbiguousBackend,
    BackendNotFound,
    CaptureError,
    DynamicShapeError,
    ExportError,
    GraphBreakInFullgraph,
    RecompileLimitExceeded,
    Unsupported,
)
from torchfuse.capture.explain import Explanation, explain
from torchfuse.capture.export import Exported, export

config = _config_module.config
"""The live [`CaptureConfig`][torchfuse.capture.config.CaptureConfig]."""

__all__ = [
    "AmbiguousBackend",
    "BackendNotFound",
    "CaptureError",
    "CompiledFunction",
    "CompiledModule",
    "DynamicShapeError",
    "Explanation",
    "ExportError",
    "Exported",
    "GraphBreakInFullgraph",
    "RankDivergence",
    "RankDivergenceWarning",
    "RecompileLimitExceeded",
    "Unsupported",
    "__version__",
    "compile",
    "config",
    "eager",
    "explain",
    "export",
    "list_backends",
    "lookup_backend",
    "mark_dynamic",
    "reset",
]
