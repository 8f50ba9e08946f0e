"""Inductor's configuration: one typed record, read from the environment once.

Environment variables (all optional):

* ``TORCHFUSE_LOGS`` -- comma-separated log names; inductor uses ``schedule`` (fusion
  decisions) and ``output_code`` (the generated module).
* ``TORCHFUSE_DEBUG=1`` -- write the debug artifacts of every compiled graph under
  ``TORCHFUSE_DEBUG_DIR`` (default ``torchfuse_debug``).
* ``TORCHFUSE_UPDATE_SNAPSHOTS=1`` -- snapshot tests rewrite their golden files.
* ``TORCHFUSE_PAD_MM=0`` -- leave unaligned half-precision matmuls unpadded.
* ``TORCHFUSE_MM_TEMPLATES=auto|always|never`` -- the Triton matmul template under
  ``mode="max-autotune"`` (default ``auto``: benchmarked against cuBLAS per shape).
* ``TORCHFUSE_CPU_BACKEND=auto|cpp|triton`` -- the kernels of a CPU graph (`cpu_kernels`):
  C++ with OpenMP (`torchfuse.inductor.cpp_codegen`), Triton (run by its interpreter), or
  ``auto`` (the default): Triton when ``TRITON_INTERPRET=1``, else C++.
* ``TORCHFUSE_CHANNELS_LAST=auto|always|never`` -- run convolution graphs channels-last
  (`torchfuse.inductor.layout`; default ``auto``: CUDA inference graphs with a 2-d
  convolution of at least 64 output channels and no grouped one).
* ``TORCHFUSE_BATCH_NORM_TRAINING=auto|aten|decompose`` -- training batch norms as ATen calls
  or as our reductions (`torchfuse.inductor.decompositions.BATCH_NORM_TRAINING`); ``auto`` (the
  default): our reductions in CUDA graphs, ATen's kernels on the CPU.
* ``TORCHFUSE_COMBO_KERNELS=1`` -- launch independent small pointwise Triton kernels as combo
  kernels (`torchfuse.inductor.combo`; default off until timed on a GPU).
* ``TRITON_INTERPRET`` -- read, not owned: whether Triton runs its kernels on the CPU.
* ``TORCHFUSE_COMPILE_CACHE=0`` -- do not read or write the on-disk caches of compiled
  Programs and autograd plans (`torchfuse.inductor.cache`; default on). Where they live
  is the runtime's ``TORCHFUSE_CACHE_DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

CPU_BACKENDS = ("auto", "cpp", "triton")
"""The values of ``cpu_backend``."""
CHANNELS_LAST = ("auto", "always", "never")
"""The values of ``channels_last``."""
BATCH_NORM_TRAINING = ("auto", "aten", "decompose")
"""The values of ``batch_norm_training``."""


@dataclass(frozen=True, slots=True)
class InductorConfig:
    """Settings of the inductor package; ``compile(..., options={...})`` overrides fields by name."""

    persistent_rnumel_max: int = 16384
    """Reductions whose row is at most this long keep the whole row in registers."""
    long_kernel_lines: int = 100
    """A persistent reduction whose body is longer than this many lines holds at most 16 values
    a thread per tile (else 32), taking more warps instead: Triton's compile time grows with
    both (see `KernelWriter.configs`)."""
    looped_rblock: int = 2048
    """Chunk length of looped reductions (first candidate config)."""
    max_fusion_size: int = 64
    """Cap on the number of IR nodes in one kernel."""
    max_kernel_reductions: int = 16
    """Cap on the reductions in one kernel. Triton's compile time grows with them (each row
    reduction across warps is a shared-memory exchange), and a kernel compiles on one core: a
    training backward's layer-norm statistics recomputed along the residual stream fused into
    one kernel of 28 reductions (GPT-2) or 48 (ViT-B/16 weight gradients), the longest compile
    of its cold first call. Splitting costs one store and load of the value at the split."""
    max_loop_phases: int = 3
    """A looped reduction kernel may pass over its rows at most this many times."""
    max_recompute_ops: int = 8
    """A value read by several ops is recomputed by each when it costs at most this many ops."""
    max_inline_ops: int = 64
    """A value whose expression grows past this many ops is computed into a buffer."""
    split_max_outputs: int = 32
    """Reductions with at most this many outputs …"""
    split_min_rnumel: int = 65536
    """… and at least this many elements per output are split in two kernels."""
    split_target: int = 256
    """Preferred number of partial results of a split reduction."""
    outer_split_programs: int = 1024
    """A reduction over leading dims is split into row chunks until it has about this many
    programs (column tiles x chunks) …"""
    outer_split_min_chunk: int = 256
    """… keeping at least this many rows per chunk."""
    merge_small_numel: int = 1 << 20
    """Reduction kernels over the same small domain are merged even when they share no
    reads (e.g. the two second stages of split weight/bias gradients): one launch, not two."""
    pointwise_small_numel: int = 1 << 16
    """Pointwise kernels over at most this many elements take XBLOCK 128 (one element per
    thread): launch-bound, and the fastest to compile."""
    pointwise_large_numel: int = 1 << 22
    """… from this many elements on, XBLOCK 2048 with 4 warps (16 elements per thread);
    in between, 1024 with 4 warps."""
    pointwise_rows: int = 0
    """Experimental, off (0) by default, not yet measured on a GPU: a pointwise kernel over
    rows at least this long whose length is not a power of two is written as tiles of rows by
    row chunks (the looped form of a reduction kernel, without a reduction), so no element
    divides its flat index by the row length. GPT-2's dlogits kernel (rows of 50264) spends
    most of its instructions on those divisions. ``TORCHFUSE_POINTWISE_ROWS=<length>``."""
    combo_kernels: bool = False
    """Launch independent small pointwise Triton kernels of a Program as one combo kernel
    (horizontal fusion, [`torchfuse.inductor.combo`][torchfuse.inductor.combo]): one launch
    instead of up to 32. Triton kernels only (GPU, or the CPU under ``TRITON_INTERPRET=1``),
    static sizes only. Off by default until it is timed on a GPU (launch counts are measured,
    host and kernel time are not); ``TORCHFUSE_COMBO_KERNELS=1`` turns it on."""
    combo_kernels_max_numel: int = 1 << 20
    """A pointwise kernel over more elements than this is never a combo member."""
    memory_order: bool = True
    """Order ready kernels so that the one freeing the most memory runs first."""
    decompose: bool = True
    pad_mm: bool = True
    """Pad float16/bfloat16 CUDA matmuls whose leading dimensions are not 16-byte aligned
    ([`torchfuse.inductor.pad_mm`][torchfuse.inductor.pad_mm])."""
    conv_rewrites: bool = True
    """Fold inference batch norms into the convolutions before them, write the others as
    pointwise ops, and keep a float16/bfloat16 bias inside its extern matmul
    ([`torchfuse.inductor.conv`][torchfuse.inductor.conv]). ``TORCHFUSE_CONV_REWRITES=0``."""
    channels_last: str = "auto"
    """Channels-last per graph ([`torchfuse.inductor.layout`][torchfuse.inductor.layout]): the
    graph's 2-d convolutions (and the kernels between them) run on NHWC data, converted once at
    the graph's edges; outputs keep eager's strides. ``"auto"`` (the default): CUDA inference
    graphs with a 2-d convolution of at least 64 output channels and no grouped one;
    ``"always"``: any graph with a 2-d convolution (training ones too; the CPU tests);
    ``"never"``. See docs/inductor.md, "Channels-last per graph", for the measurements behind
    ``"auto"``. ``TORCHFUSE_CHANNELS_LAST``."""
    batch_norm_training: str = "auto"
    """Training batch norms: ``"decompose"`` (our per-channel reductions and pointwise ops,
    `BATCH_NORM_TRAINING`, fused with the activation and residual add around them), ``"aten"``
    (ATen's kernels, cuDNN's on a GPU, the activation and residual add fused after them), or
    ``"auto"`` (the default): ``"decompose"`` for a graph on a CUDA device, ``"aten"`` for one
    on the CPU, where ATen's batch norm is the faster (docs/inductor.md, "Training batch
    norms"). ``TORCHFUSE_BATCH_NORM_TRAINING``."""
    mm_templates: str = "auto"
    """``mode="max-autotune"`` only: ``"auto"`` (the Triton matmul template against cuBLAS,
    benchmarked per shape and cached in ``<cache dir>/mm_choices.json``), ``"always"`` (the
    template, first config, no benchmark), ``"never"``."""
    cpu_backend: str = "auto"
    """Kernels of a graph on the CPU: ``"cpp"`` (C++/OpenMP, built with the system compiler into
    one shared object per Program; see [`torchfuse.inductor.cpp_codegen`][torchfuse.inductor.cpp_codegen]),
    ``"triton"`` (run by Triton's interpreter, which needs ``TRITON_INTERPRET=1``), or ``"auto"``:
    ``"triton"`` when ``TRITON_INTERPRET=1`` asked for Triton's interpreter, else ``"cpp"``
    ([`cpu_kernels`][torchfuse.inductor.config.cpu_kernels]). Graphs on a GPU always get Triton."""
    triton_interpret: bool = False
    """Whether ``TRITON_INTERPRET`` was on when the config was read (what ``"auto"`` looks at)."""
    logs: frozenset[str] = field(default_factory=frozenset)
    debug: bool = False
    debug_dir: str = "torchfuse_debug"
    update_snapshots: bool = False
    cache: bool = True
    """Reuse Programs and autograd plans compiled earlier, by any process (on-disk caches)."""

    def __post_init__(self) -> None:
        if self.cpu_backend not in CPU_BACKENDS:
            choices = ", ".join(map(repr, CPU_BACKENDS))
            raise ValueError(f"cpu_backend={self.cpu_backend!r}: use one of {choices}")
        if self.batch_norm_training not in BATCH_NORM_TRAINING:
            choices = ", ".join(map(repr, BATCH_NORM_TRAINING))
            raise ValueError(f"batch_norm_training={self.batch_norm_training!r}: use one of {choices}")
        if self.channels_last not in CHANNELS_LAST:
            choices = ", ".join(map(repr, CHANNELS_LAST))
            raise ValueError(f"channels_last={self.channels_last!r}: use one of {choices}")

    def with_options(self, options: dict | None) -> InductorConfig:
        return replace(self, **(options or {}))


def cpu_kernels(cfg: InductorConfig) -> tuple[str, str]:
    """The language of a CPU graph's kernels under ``cfg`` (``"cpp"`` or ``"triton"``), and
    why, in words (what the debug files and the ``schedule`` log say)::

        cpu_backend="cpp" or "triton"         -> that one            ("cpu_backend='cpp'")
        "auto" and TRITON_INTERPRET=1         -> "triton"            (the interpreter was asked for)
        "auto"                                -> "cpp"               (the CPU default)

    Nothing falls back: without a C++ compiler, loading the Program raises
    ``torchfuse.runtime.cpp.CompilerNotFoundError``, which says how to install one.
    """
    if cfg.cpu_backend != "auto":
        return cfg.cpu_backend, f"cpu_backend={cfg.cpu_backend!r}"
    if cfg.triton_interpret:
        return "triton", "cpu_backend='auto' and TRITON_INTERPRET=1"
    return "cpp", "cpu_backend='auto': the CPU default, TRITON_INTERPRET being off"


def _on(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def from_environment(env: dict[str, str] | None = None) -> InductorConfig:
    env = dict(os.environ) if env is None else env
    logs = frozenset(x.strip() for x in env.get("TORCHFUSE_LOGS", "").split(",") if x.strip())
    return InductorConfig(
        logs=logs,
        debug=env.get("TORCHFUSE_DEBUG", "") not in ("", "0"),
        debug_dir=env.get("TORCHFUSE_DEBUG_DIR", "torchfuse_debug"),
        update_snapshots=env.get("TORCHFUSE_UPDATE_SNAPSHOTS", "") not in ("", "0"),
        cache=env.get("TORCHFUSE_COMPILE_CACHE", "1").strip().lower() not in ("0", "false", "no", "off"),
        pad_mm=env.get("TORCHFUSE_PAD_MM", "1").strip().lower() not in ("0", "false", "no", "off"),
        conv_rewrites=env.get("TORCHFUSE_CONV_REWRITES", "1").strip().lower() not in ("0", "false", "no",
                                                                                    "off"),
        channels_last=env.get("TORCHFUSE_CHANNELS_LAST", "auto").strip().lower() or "auto",
        batch_norm_training=env.get("TORCHFUSE_BATCH_NORM_TRAINING", "auto").strip().lower() or "auto",
        mm_templates=env.get("TORCHFUSE_MM_TEMPLATES", "auto").strip().lower() or "auto",
        cpu_backend=env.get("TORCHFUSE_CPU_BACKEND", "auto").strip().lower() or "auto",
        triton_interpret=_on(env.get("TRITON_INTERPRET", "")),
        combo_kernels=_on(env.get("TORCHFUSE_COMBO_KERNELS", "0")),
        pointwise_rows=max(0, int(env.get("TORCHFUSE_POINTWISE_ROWS", "0") or 0)),
    )


config = from_environment()
"""The process-wide default, read at import."""
