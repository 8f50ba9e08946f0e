"""The torchvision rows of ``benchmarks/models.py``: ResNet-18/50, MobileNetV3-small,
ConvNeXt-tiny, ViT-B/16 and Swin-T, random weights (``weights=None``), 1000 classes.

Full size: the library's builders as they are, batch 32 × 3 × 224 × 224. ``--small``: the
same classes with a few narrow blocks, batch 2 × 3 × 32 × 32 (Swin: 64 × 64), so a CPU run
takes seconds. Stochastic depth and dropout are off (compiled results are checked against
eager).

Each model is wrapped in `Classifier`, whose ``forward(pixel_values, labels=None)`` returns
``{"logits": ..., "loss": ...}`` like a ``transformers`` model, so that the rest of
``models.py`` (one step, the checks, explain) treats both kinds the same way: a training
step's loss is the cross-entropy of the logits, computed inside the compiled call.
(``models.py`` imports this module only when a torchvision row runs, after its environment
setup.)
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SMALL_CLASSES = 10


def ensure_importable() -> str:
    """PyPI's torchvision wheel next to a CPU-only torch (``scripts/torchvision_compat.py``):
    before anything imports torchvision, ``transformers`` included."""
    path = ROOT / "scripts" / "torchvision_compat.py"
    spec = importlib.util.spec_from_file_location("torchvision_compat", path)
    if spec is None or spec.loader is None:
        return "absent"
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # it keeps the schemas' library object alive
        spec.loader.exec_module(module)
    return module.install()


def _full(name: str) -> Any:
    import torchvision.models as m

    if name == "swin_t":
        # swin_t() passes its own stochastic_depth_prob (0.2) to the builder, so another one in
        # its kwargs is a TypeError: build Swin-T's configuration directly, without it
        return m.SwinTransformer(patch_size=[4, 4], embed_dim=96, depths=[2, 2, 6, 2],
                                 num_heads=[3, 6, 12, 24], window_size=[7, 7], stochastic_depth_prob=0.0)
    kwargs: dict[str, Any] = {"weights": None}
    if name == "convnext_tiny":
        kwargs["stochastic_depth_prob"] = 0.0
    if name == "mobilenet_v3_small":
        kwargs["dropout"] = 0.0
    return getattr(m, name)(**kwargs)


def _small(name: str) -> Any:
    import torchvision.models as m

    n = SMALL_CLASSES
    if name == "resnet18":
        return m.ResNet(m.resnet.BasicBlock, [1, 1, 1, 1], num_classes=n)
    if name == "resnet50":
        return m.ResNet(m.resnet.Bottleneck, [1, 1, 1, 1], num_classes=n)
    if name == "mobilenet_v3_small":
        return m.mobilenet_v3_small(num_classes=n, dropout=0.0, width_mult=0.25)
    if name == "convnext_tiny":
        cfg = m.convnext.CNBlockConfig
        return m.ConvNeXt([cfg(16, 32, 2), cfg(32, None, 1)], stochastic_depth_prob=0.0, num_classes=n)
    if name == "vit_b_16":
        return m.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32,
                                   mlp_dim=64, num_classes=n)
    if name == "swin_t":
        return m.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                 window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=n)
    raise KeyError(name)


def image_size(name: str, scale: str) -> int:
    if scale == "full":
        return 224
    return 64 if name == "swin_t" else 32


def build(name: str, scale: str, device: Any) -> tuple[Any, dict[str, Any]]:
    """The wrapped model on ``device`` (fp32, seed 0) and what to record about it."""
    torch.manual_seed(0)
    with torch.device(device):
        net = _full(name) if scale == "full" else _small(name)
    model = Classifier(net, image_size(name, scale), 1000 if scale == "full" else SMALL_CLASSES).to(device)
    import torchvision

    info = {"attn_implementation": None, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "config_notes": [f"torchvision {torchvision.__version__}"]}
    return model, info


class Classifier(torch.nn.Module):
    """A torchvision classifier with a ``transformers``-like call (see the module doc)."""

    def __init__(self, net: torch.nn.Module, size: int, classes: int) -> None:
        super().__init__()
        self.net = net
        self.config = types.SimpleNamespace(image_size=size, num_labels=classes, num_channels=3)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(pixel_values)
        if labels is None:
            return {"logits": logits}
        return {"loss": F.cross_entropy(logits.float(), labels), "logits": logits}
