"""torchfuse-graph: the format every torchfuse package reads and writes.

Records (``Graph``, ``Program`` and their parts) live in :mod:`torchfuse.graph.schema`;
archives in :mod:`torchfuse.graph.archive`; the reference interpreter in
:mod:`torchfuse.graph.interpreter`; fake tensors and the ATen recorder in
:mod:`torchfuse.graph.tracing`; the expression grammar in :mod:`torchfuse.graph.expr`;
verifiers in :mod:`torchfuse.graph.verify`; the Python printer in
:mod:`torchfuse.graph.printer`; torch.fx interop in :mod:`torchfuse.graph.fx_interop`;
versions, the schema gate and upgraders in :mod:`torchfuse.graph.versioning`; golden
fixtures in :mod:`torchfuse.graph.fixtures`.
"""

from torchfuse.graph import torchfuse_ops as _torchfuse_ops  # noqa: F401  (registers the torchfuse opset)
from torchfuse.graph.__about__ import __version__
from torchfuse.graph.archive import Archive, ArchiveError, load, load_archive, save
from torchfuse.graph.compat import FORMAT_VERSION, FormatVersionError
from torchfuse.graph.fx_interop import from_fx, to_fx
from torchfuse.graph.interpreter import Interpreter, InterpreterError, run
from torchfuse.graph.printer import guard_to_python, guards_to_python, to_python
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
from torchfuse.graph.tracing import (
    DataDependentError,
    FakeTensor,
    GraphBuilder,
    Recorder,
    fake_from_meta,
    trace,
)
from torchfuse.graph.verify import VerificationError, verify, verify_program

__all__ = [
    "FORMAT_VERSION",
    "Archive",
    "ArchiveError",
    "Buffer",
    "DataDependentError",
    "FakeTensor",
    "FormatVersionError",
    "Graph",
    "GraphBuilder",
    "GraphInput",
    "GraphOutput",
    "Interpreter",
    "InterpreterError",
    "Kernel",
    "Node",
    "Program",
    "Recorder",
    "SourceLoc",
    "Symbol",
    "TensorMeta",
    "VerificationError",
    "__version__",
    "fake_from_meta",
    "from_fx",
    "guard_to_python",
    "guards_to_python",
    "load",
    "load_archive",
    "run",
    "save",
    "to_fx",
    "to_python",
    "trace",
    "verify",
    "verify_program",
]
