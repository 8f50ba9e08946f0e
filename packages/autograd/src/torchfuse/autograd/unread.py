"""Arguments an op is given but never reads, dropped from the joint graph before the partition.

The partition saves, for the backward, every forward value a backward node takes. A
derivative formula may pass a value the kernel then ignores: in training mode,
``native_batch_norm_backward`` is given the running mean and variance, but reads the batch
statistics (``save_mean``, ``save_invstd``) instead. Saved, the running statistics cost a
tensor each per call, and more: they are inputs the forward writes back (functionalization
made the update an output copied into the buffer), so the saved value must be a copy taken
before the write. Dropped, nothing is saved for them.

Before (``train=True``, argument 7)::

    grads = aten.native_batch_norm_backward.default(g, x, w, running_mean, running_var,
                                                    mean, rstd, True, 1e-05, [True, True, True])

after::

    grads = aten.native_batch_norm_backward.default(g, x, w, None, None,
                                                    mean, rstd, True, 1e-05, [True, True, True])

Each rule is (op, which arguments, when): the arguments become ``None`` (the schema has them
optional) when the predicate holds for the node's arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from torchfuse.graph import schema as S


def _training(args: tuple[S.Argument, ...]) -> bool:
    # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
    #                            save_mean, save_invstd, train, eps, output_mask)
    return len(args) > 7 and isinstance(args[7], S.Bool) and args[7].value


UNREAD: dict[str, tuple[tuple[int, ...], Callable[[tuple[S.Argument, ...]], bool]]] = {
    "aten.native_batch_norm_backward.default": ((3, 4), _training),
}
"""op -> (optional arguments it does not read, predicate on the node's arguments)."""


def drop_unread_arguments(graph: S.Graph) -> S.Graph:
    """``graph`` with the arguments of `UNREAD` replaced by ``None`` where their rule holds.

    Values that no node reads any more stay defined; the partition saves only what the
    backward reads, so they are no longer saved.
    """
    nodes = []
    changed = False
    for node in graph.nodes:
        rule = UNREAD.get(node.op)
        if rule is not None and rule[1](node.args):
            args = list(node.args)
            for i in rule[0]:
                if i < len(args) and not isinstance(args[i], S.NoneArg):
                    args[i] = S.NoneArg()
                    changed = True
            node = msgspec.structs.replace(node, args=tuple(args))
        nodes.append(node)
    return msgspec.structs.replace(graph, nodes=tuple(nodes)) if changed else graph
