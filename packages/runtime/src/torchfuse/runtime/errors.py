"""Errors the runtime raises to its users. Every message names what was wrong and what was expected."""

from __future__ import annotations


class RuntimeLoadError(RuntimeError):
    """Base class of every error raised by torchfuse-runtime."""


class CorruptArchiveError(RuntimeLoadError):
    """A path that is not a loadable Program archive (missing, damaged, or holding a Graph)."""


class InvalidProgramError(RuntimeLoadError):
    """A Program whose steps are inconsistent (an unknown buffer, kernel, or symbol source)."""


class UntrustedCodeError(InvalidProgramError):
    """A kernel source outside the form the runtime imports without trust (see
    `torchfuse.graph.kernel_source`); ``load(..., trust_code=True)`` imports it anyway."""


class InputError(RuntimeLoadError, ValueError):
    """Inputs that do not match the Program: wrong count, dtype, device, rank, size or stride.

    ``index`` is the position of the offending input (``None`` for a count mismatch) and
    ``name`` the Program buffer it binds to.
    """

    def __init__(self, message: str, *, index: int | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.name = name


class DeviceMismatchError(InputError):
    """Inputs on a device type the Program was not loaded for (e.g. CPU tensors, cuda Program)."""


class InterpreterRequiredError(RuntimeLoadError):
    """CPU inputs, but Triton was imported without ``TRITON_INTERPRET=1``."""


class KernelCompileError(RuntimeLoadError):
    """A kernel's source failed to import or compile; the message names the kernel."""
