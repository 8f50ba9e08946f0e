"""``python -m torchfuse_example_extern``: print the Program this backend makes for a small
function, then run it and compare with eager PyTorch."""

from __future__ import annotations

import torch
from torchfuse.graph import trace

from torchfuse_example_extern import codegen, explain_program, extern


def demo(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.relu(x @ w)
    return h.sum(dim=1), x


def main() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    graph, _ = trace(demo, x, w, name="demo")
    print(explain_program(codegen(graph)))
    out = extern(graph, [x, w])(x, w)
    for got, want in zip(out, demo(x, w), strict=True):
        torch.testing.assert_close(got, want)
    print("matches eager")


if __name__ == "__main__":
    main()
