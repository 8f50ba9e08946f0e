"""torchfuse-graph: the format every torchfuse package reads and writes.

Records (``Graph``, ``Program`` and their parts) live in [`torchfuse.graph.schema`][torchfuse.graph.schema];
archives in [`torchfuse.graph.archive`][torchfuse.graph.archive]; the reference interpreter in
[`torchfuse.graph.interpreter`][torchfuse.graph.interpreter]; fake tensors and the ATen recorder in
`torchfuse.graph.tracing`; the expression grammar in [`torchfuse.graph.expr`][torchfuse.graph.expr];
verifiers in [`torchfuse.graph.verify`][torchfuse.graph.verify]; the Python printer in
[`torchfuse.graph.printer`][torchfuse.graph.printer]; torch.fx interop in `torchfuse.graph.fx_interop`;
versions, the schema gate and upgraders in [`torchfuse.graph.versioning`][torchfuse.graph.versioning]; golden
fixtures in [`torchfuse.graph.fixtures`][torchfuse.graph.fixtures].
"""

from torchfuse.graph import torchfuse_ops as _torchfuse_ops  # noqa: F401  (registers the torchfuse opset)
from torchfuse.graph.__about__ import __version__
from torchfuse.graph.archive import (
    Archive,
    ArchiveError,
    ArchiveLimits,
    bind_weights,
    check_weights,
    load,
    load_archive,
    save,
)
from torchfuse.graph.compat import FORMAT_VERSION, FormatVersionError
from torchfuse.graph.fx_interop import from_fx, to_fx
from torchfuse.graph.interpreter import InputError, Interpreter, InterpreterError, check_inputs, run
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
    "ArchiveLimits",
    "Buffer",
    "DataDependentError",
    "FakeTensor",
    "FormatVersionError",
    "Graph",
    "GraphBuilder",
    "GraphInput",
    "GraphOutput",
    "InputError",
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
    "bind_weights",
    "check_inputs",
    "check_weights",
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
