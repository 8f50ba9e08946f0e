"""torchfuse-runtime: loads a Program and runs it.

``load(program_or_path)`` returns a `CompiledProgram`, callable on the Program's flat
inputs. The Program is validated first (names that reach generated code are identifiers, ops
resolve to real operators, buffer sizes evaluate) and every kernel source must have the form
`torchfuse.graph.kernel_source` accepts, unless ``trust_code=True``. Kernels are imported
from a content-addressed cache directory and compiled by Triton (whose own cache keeps the
binaries), autotuned on the GPU after the first call or, under ``max-autotune``, before it
returns (winners kept on disk; `wait_for_background`), and launched by a generated Python
call function. ``mode="reduce-overhead"`` replays calls as CUDA graphs. Nothing here imports
torchfuse.capture, torchfuse.autograd or torchfuse.inductor: an archive runs with
torchfuse-graph and torchfuse-runtime alone.
"""

from torchfuse.runtime.__about__ import __version__
from torchfuse.runtime.background import wait_for_background
from torchfuse.runtime.config import Config
from torchfuse.runtime.errors import (
    CorruptArchiveError,
    DeviceMismatchError,
    InputError,
    InterpreterRequiredError,
    InvalidProgramError,
    KernelCompileError,
    RuntimeLoadError,
    UntrustedCodeError,
)
from torchfuse.runtime.kernels import CompileStats
from torchfuse.runtime.program import CompiledProgram, load

__all__ = [
    "CompileStats", "CompiledProgram", "Config", "CorruptArchiveError", "DeviceMismatchError",
    "InputError", "InterpreterRequiredError", "InvalidProgramError", "KernelCompileError",
    "RuntimeLoadError", "UntrustedCodeError", "__version__", "load", "wait_for_background",
]
