"""The ``torchfuse`` opset: the few non-ATen ops the format itself defines.

Every Graph may contain them, so every reader needs them registered with torch: importing
``torchfuse.graph`` does it:

Each op came in an opset (1, unless said): a graph declares ``"torchfuse": n`` for the
newest it uses, and a reader that knows fewer rejects it with a clear error.

``torchfuse.set_grad_enabled.default(bool enabled) -> ()``
    Switches grad mode. Capture writes a pair of them around a ``with torch.no_grad():``
    region inside a compiled function, so that the reference interpreter and every backend
    run the region with the grad mode eager would.

``torchfuse.triton_kernel.default(str kernel, Tensor[] tensors, int[] mutated) -> Tensor[]``
    One launch of a user ``@triton.jit`` kernel (described by the JSON text ``kernel``, see
    `torchfuse.graph.user_kernels`). Functional: returns a new tensor per index in
    ``mutated`` holding what the kernel wrote there. Not differentiable: its outputs never
    require grad, as a Triton kernel's writes carry no gradient in eager either.

``torchfuse.custom_grad.default(str backward, Tensor[] inputs, Tensor[] outputs, Tensor[] saved) -> Tensor[]``
    (opset 2) A custom ``torch.autograd.Function``'s derivative: new tensors equal to ``outputs``,
    whose gradient runs the backward Graph held (as JSON) in ``backward`` and reaches
    ``inputs`` (see `torchfuse.graph.custom_grad`).

``torchfuse.checkpoint.default(str region, Tensor[] inputs) -> Tensor[]`` (opset 2)
    An activation-checkpointed region: the region Graph held (as JSON) in ``region`` run on
    ``inputs``, and run again in backward instead of keeping its activations (see
    `torchfuse.graph.checkpoint_region`).

``torchfuse.after.default(Tensor x, Tensor[] deps) -> Tensor`` (opset 2)
    ``x`` again (a copy; inductor makes it ``x`` itself), read after ``deps``: a checkpoint's
    recompute reads its inputs through it, so that its ops depend on a gradient.
"""

from __future__ import annotations

import torch
from torchfuse.graph import checkpoint_region, custom_grad, user_kernels
from torchfuse.graph.compat import OPSETS

TORCHFUSE_OPSET = OPSETS["torchfuse"]
"""The newest ``torchfuse`` opset (`torchfuse.graph.compat.OP_SINCE` says which op came in
which; a document declares the smallest opset its ops need)."""

SET_GRAD_ENABLED = "torchfuse.set_grad_enabled.default"
TRITON_KERNEL = "torchfuse.triton_kernel.default"
CUSTOM_GRAD = "torchfuse.custom_grad.default"
CHECKPOINT = "torchfuse.checkpoint.default"

_lib = torch.library.Library("torchfuse", "FRAGMENT")
_lib.define("set_grad_enabled(bool enabled) -> ()")


def _set_grad_enabled(enabled: bool) -> None:
    torch._C._set_grad_enabled(enabled)


for _key in ("CompositeExplicitAutograd", "Meta"):
    _lib.impl("set_grad_enabled", _set_grad_enabled, _key)


_lib.define("triton_kernel(str kernel, Tensor[] tensors, int[] mutated) -> Tensor[]")


def _triton_kernel_no_grad(kernel: str, tensors: list[torch.Tensor],
                           mutated: list[int]) -> list[torch.Tensor]:
    # below autograd: the outputs carry no grad_fn and do not require grad
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.torchfuse.triton_kernel.default(kernel, tensors, mutated)


_lib.impl("triton_kernel", user_kernels.launch, "CompositeExplicitAutograd")
_lib.impl("triton_kernel", user_kernels.meta, "Meta")
_lib.impl("triton_kernel", _triton_kernel_no_grad, "Autograd")

_lib.define("custom_grad(str backward, Tensor[] inputs, Tensor[] outputs, Tensor[] saved) -> Tensor[]")
_lib.impl("custom_grad", custom_grad.forward, "CompositeExplicitAutograd")
_lib.impl("custom_grad", custom_grad.forward, "Meta")
_lib.impl("custom_grad", custom_grad.with_grad, "Autograd")

_lib.define("checkpoint(str region, Tensor[] inputs) -> Tensor[]")
_lib.impl("checkpoint", checkpoint_region.run_region, "CompositeExplicitAutograd")
_lib.impl("checkpoint", checkpoint_region.region_meta, "Meta")
_lib.impl("checkpoint", checkpoint_region.with_grad, "Autograd")

_lib.define("after(Tensor x, Tensor[] deps) -> Tensor")
_lib.impl("after", checkpoint_region.after_no_grad, "CompositeExplicitAutograd")
_lib.impl("after", checkpoint_region.after_no_grad, "Meta")
_lib.impl("after", lambda x, deps: checkpoint_region.after(x, list(deps)), "Autograd")


def records_grad(graph, grad_enabled_at_entry: bool = True) -> bool:
    """Whether any op of ``graph`` runs with grad mode on, following its
    ``set_grad_enabled`` nodes from the mode at entry.

    A function whose whole body sits in ``with torch.no_grad():`` is captured as a graph that
    switches grad off first: it needs no backward even when it is called with grad mode on
    and inputs (or parameters) that require grad.
    """
    enabled = grad_enabled_at_entry
    for node in graph.nodes:
        if node.op == SET_GRAD_ENABLED:
            enabled = bool(node.args[0].value)
        elif enabled:
            return True
    return False
