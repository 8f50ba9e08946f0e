"""Module hooks that run in Python around a compiled ``forward``.

A module's forward hooks are normally traced with its forward, into one graph
(`torchfuse.capture.calls.call_module`). Hooks that belong to the distributed engine cannot be:
FSDP2's ``fully_shard`` registers a forward pre-hook that all-gathers the module's parameters
(turning its DTensor shards into whole tensors) and a post-hook that frees them again, and
registers a backward pass of its own. `call_with_hooks` calls a module as
``nn.Module.__call__`` does (global and module hooks, with and without kwargs, in order), but
with a compiled ``forward``: the hooks run in Python at the module's boundary, the forward in
between is one captured graph over the unsharded parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture.distributed import is_distributed_runtime


def distributed_hooks(mod: torch.nn.Module) -> bool:
    """Whether the module's forward hooks include torch.distributed's own (FSDP2's): its call
    then runs its hooks in Python, around a forward compiled on its own."""
    hooks = [*mod._forward_pre_hooks.values(), *mod._forward_hooks.values()]
    return any(is_distributed_runtime(h) for h in hooks)


def call_with_hooks(mod: torch.nn.Module, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``mod(*args, **kwargs)`` with ``forward`` in place of ``mod.forward``: forward
    pre-hooks, then ``forward``, then forward hooks, as ``nn.Module.__call__`` runs them.
    Backward hooks are not run here (`has_backward_hooks` modules take the traced path)."""
    glob = torch.nn.modules.module
    for hook_id, hook in (*glob._global_forward_pre_hooks.items(), *mod._forward_pre_hooks.items()):
        if hook_id in mod._forward_pre_hooks_with_kwargs:
            res = hook(mod, args, kwargs)
            if res is not None:
                if not (isinstance(res, tuple) and len(res) == 2):
                    raise RuntimeError("forward pre-hook must return None or a tuple of "
                                       f"(new_args, new_kwargs), but got {res}.")
                args, kwargs = res
        else:
            res = hook(mod, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
    result = forward(*args, **kwargs)
    with_kwargs = getattr(glob, "_global_forward_hooks_with_kwargs", {})
    for hook_id, hook in (*glob._global_forward_hooks.items(), *mod._forward_hooks.items()):
        if hook_id in mod._forward_hooks_with_kwargs or hook_id in with_kwargs:
            res = hook(mod, args, kwargs, result)
        else:
            res = hook(mod, args, result)
        if res is not None:
            result = res
    return result


def has_backward_hooks(mod: torch.nn.Module) -> bool:
    glob = torch.nn.modules.module
    return bool(mod._backward_hooks or getattr(mod, "_backward_pre_hooks", None) or
                getattr(glob, "_global_backward_hooks", None) or
                getattr(glob, "_global_backward_pre_hooks", None))


def python_hooks(mod: torch.nn.Module) -> bool:
    """Whether a call of ``mod`` runs its hooks with `call_with_hooks`."""
    return distributed_hooks(mod) and not has_backward_hooks(mod)


__all__ = ["call_with_hooks", "distributed_hooks", "python_hooks"]
