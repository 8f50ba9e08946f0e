"""torchfuse-autograd: functionalization, joint forward/backward graphs, decompositions,
min-cut partitioning, and the ``torch.autograd.Function`` glue (AOT autograd).

Public API: `functionalize`, `joint_graph`, `decompose`
(with `DEFAULT_TABLE`), `partition` (returning a `Partition`), `aot`,
the backend `aot_eager`, and `eliminate_common_subexpressions` (also run by
passes after the joint graph, such as the inductor's matmul padding).
"""

from torchfuse.autograd.__about__ import __version__
from torchfuse.autograd.backend import aot_eager, interpreter_compiler
from torchfuse.autograd.common import AutogradError, eliminate_common_subexpressions
from torchfuse.autograd.decompositions import DEFAULT_TABLE, DecompositionError, decompose
from torchfuse.autograd.functionalize import FunctionalizeError, functionalize
from torchfuse.autograd.glue import AotFunction, Compiler, DoubleBackwardError, aot
from torchfuse.autograd.joint import joint_graph
from torchfuse.autograd.opclass import OpClass, classify
from torchfuse.autograd.partition import Partition, PartitionError, partition

__all__ = [
    "DEFAULT_TABLE", "AotFunction", "AutogradError", "Compiler", "DecompositionError",
    "DoubleBackwardError", "FunctionalizeError", "OpClass", "Partition", "PartitionError",
    "__version__", "aot", "aot_eager", "classify", "decompose", "eliminate_common_subexpressions",
    "functionalize", "interpreter_compiler", "joint_graph", "partition",
]
