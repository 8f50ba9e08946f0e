"""Triton matmul templates with fused epilogues (``mode="max-autotune"``).

`apply_mm_templates` is a graph pass that runs on the decomposed ATen graph before
lowering: each static-shape ``mm``/``addmm``/``bmm`` and the pointwise ops that consume it
become one ``torchfuse.triton_kernel`` launch of a generated tiled-matmul kernel whose
epilogue computes those ops on the accumulator tile. Per shape, the template is kept only
when it beats the extern (cuBLAS) path on the device, a decision cached on disk.

Modules: `.epilogue` (which pointwise ops fuse, and the epilogue IR),
`.matmul` (which matmuls match, the kernel source and launch description),
`.choose` (benchmarking and the decision cache), `.rewrite` (the pass).
"""

from torchfuse.inductor.templates.choose import (
    POLICIES,
    Candidate,
    Decision,
    DecisionCache,
    apply_mm_templates,
    cuda_bench,
)
from torchfuse.inductor.templates.matmul import DEFAULT_CONFIGS, Matmul, MMConfig
from torchfuse.inductor.templates.rewrite import find_matmuls

__all__ = [
    "DEFAULT_CONFIGS", "POLICIES", "Candidate", "Decision", "DecisionCache", "MMConfig", "Matmul",
    "apply_mm_templates", "cuda_bench", "find_matmuls",
]
