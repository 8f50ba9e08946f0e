"""torchfuse-inductor: lowering to a loop IR, scheduling and fusion, Triton codegen.

``compile_graph(graph) -> Program`` turns a functional Graph into Triton kernels plus a launch
plan (the format's [`Program`][torchfuse.graph.Program]), which ``torchfuse.runtime`` runs.
``inductor(graph, example_inputs)`` is the backend (autograd + compile + runtime).
Debug artifacts (``ir_pre_fusion.txt``, ``ir_post_fusion.txt``, ``output_code.py``, per-pass
timings) are kept in ``Program.meta``; `write_debug` writes them to a directory.
"""

from torchfuse.inductor.__about__ import __version__
from torchfuse.inductor.backend import compiler, inductor
from torchfuse.inductor.compile import (
    DEBUG_FILES,
    PASSES,
    CompileResult,
    Stage,
    compile_graph,
    compile_graph_stages,
    write_debug,
)
from torchfuse.inductor.config import InductorConfig
from torchfuse.inductor.decompositions import DECOMPOSITIONS
from torchfuse.inductor.lowering import LoweringError

__all__ = [
    "DEBUG_FILES",
    "DECOMPOSITIONS",
    "PASSES",
    "CompileResult",
    "InductorConfig",
    "LoweringError",
    "Stage",
    "__version__",
    "compile_graph",
    "compile_graph_stages",
    "compiler",
    "inductor",
    "write_debug",
]
