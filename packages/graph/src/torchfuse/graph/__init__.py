"""torchfuse-graph: the format every torchfuse package reads and writes.

Records (``Graph``, ``Program`` and their parts) live in :mod:`torchfuse.graph.schema`;
archives in :mod:`torchfuse.graph.archive`; the reference interpreter in
:mod:`torchfuse.graph.interpreter`; fake tensors and the ATen recorder in
:mod:`torchfuse.graph.tracing`; the expression grammar in :mod:`torchfuse.graph.expr`.
"""

from torchfuse.graph.__about__ import __version__
from torchfuse.graph.archive import Archive, ArchiveError, load, load_archive, save
from torchfuse.graph.interpreter import Interpreter, InterpreterError, run
from torchfuse.graph.schema import (
    Buffer,
    Graph,
    GraphInput,
    GraphOutput,
    Kernel,
    Node,
    Program,
    SourceLoc,
    Symbol,
    TensorMeta,
)
from torchfuse.graph.tracing import DataDependentError, FakeTensor, GraphBuilder, Recorder, trace
from torchfuse.graph.versioning import FORMAT_VERSION, FormatVersionError

__all__ = [
    "FORMAT_VERSION", "Archive", "ArchiveError", "Buffer", "DataDependentError", "FakeTensor",
    "FormatVersionError", "Graph", "GraphBuilder", "GraphInput", "GraphOutput", "Interpreter",
    "InterpreterError", "Kernel", "Node", "Program", "Recorder", "SourceLoc", "Symbol",
    "TensorMeta", "__version__", "load", "load_archive", "run", "save", "trace",
]
