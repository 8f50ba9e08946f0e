"""Where capture gets the op it writes for grad-mode switches inside a graph.

The op belongs to the format's ``torchfuse`` opset, so it is defined (and registered with
``torch.library``) by `torchfuse.graph.torchfuse_ops`; any reader of a Graph has it.
"""

from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED

__all__ = ["SET_GRAD_ENABLED"]
