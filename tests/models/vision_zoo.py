"""Small ``torchvision`` models for the models suite: random weights, no downloads.

Each entry builds a real torchvision class: the library's own builder where the model is
already cheap on the CPU (``resnet18``, ``mobilenet_v3_small``), else the
same class with a small configuration of the named architecture (fewer blocks, narrower
stages; the blocks themselves unchanged: ConvNeXt's depthwise 7x7 convolution and layer norm
over channels-last data, Swin's shifted windows with roll, pad and window partition, ViT's
class token and encoder). Inputs are 2 images of 3 x 32 x 32 (Swin: 3 x 64 x 64, so that
its last stage still has windows to shift), 10 classes. Stochastic depth and dropout are
off, so that compiled and eager training steps compute the same thing.

Not here: ``efficientnet_b0`` (its last stages see 1 x 1 pixels of a 32 x 32 image, so its
training-mode batch norms normalize 2 values per channel, an ill-conditioned computation
whose result differs from eager's by 5% under any change of summation order; at 64 x 64 it
is the suite's slowest model).

``torchvision`` is imported by the caller (after the root ``conftest.py`` made it
importable, see ``scripts/torchvision_compat.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

CLASSES = 10


@dataclasses.dataclass(frozen=True)
class VisionCase:
    name: str
    build: Callable[[Any], torch.nn.Module]
    """``build(torchvision.models)`` -> the model (random weights)."""
    size: int = 32


def _resnet50ish(m: Any) -> torch.nn.Module:
    # resnet50's bottleneck blocks, one per stage
    return m.ResNet(m.resnet.Bottleneck, [1, 1, 1, 1], num_classes=CLASSES)


def _convnext(m: Any) -> torch.nn.Module:
    cfg = m.convnext.CNBlockConfig
    return m.ConvNeXt([cfg(16, 32, 2), cfg(32, None, 1)], stochastic_depth_prob=0.0, num_classes=CLASSES)


def _vit(m: Any) -> torch.nn.Module:
    # vit_b_16's class at 2 layers of width 32 (16x16 patches of a 32x32 image: 4 tokens + class)
    return m.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32,
                               mlp_dim=64, num_classes=CLASSES)


def _swin(m: Any) -> torch.nn.Module:
    # swin_t's class and blocks (v1), 2 stages; window 4 over 16x16 then 8x8 patches
    return m.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                             window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=CLASSES)


def _densenet(m: Any) -> torch.nn.Module:
    return m.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=CLASSES)


CASES: tuple[VisionCase, ...] = (
    # 64 x 64: at 32 the last stage is 1 x 1, so its training batch norms normalize 2 values
    # per channel, whose input gradient is rounding noise (eager's float32 gradients are
    # 40-90% off its float64 ones there): only a bit-identical batch norm matched it
    VisionCase("resnet18", lambda m: m.resnet18(num_classes=CLASSES), size=64),
    VisionCase("mobilenet_v3_small", lambda m: m.mobilenet_v3_small(num_classes=CLASSES, dropout=0.0), size=64),
    VisionCase("convnext", _convnext),
    VisionCase("vit", _vit),
    VisionCase("swin", _swin, size=64),
    VisionCase("resnet50ish", _resnet50ish),
    VisionCase("densenet", _densenet),
)


def build(case: VisionCase, models: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return case.build(models)


def images(case: VisionCase) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, case.size, case.size, generator=g)
