"""The examples shown in ``docs/autograd.md``, printed from real runs.

``python packages/autograd/tests/autograd_docs_examples.py`` prints every block; the test
``test_docs.py`` checks that the page shows exactly this output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchfuse.autograd import aot, functionalize, interpreter_compiler, partition
from torchfuse.graph import trace
from torchfuse.graph.printer import describe_graph


def _functionalize_example() -> tuple[str, str]:
    def update(x, y):
        x[1].add_(y)
        return x * 2

    graph, _ = trace(update, torch.randn(4, 4), torch.randn(4), name="update")
    return describe_graph(graph), describe_graph(functionalize(graph))


def _running_stat_example() -> tuple[str, str]:
    def step(x, running):
        running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x - running

    graph, _ = trace(step, torch.randn(8, 4), torch.randn(4), name="step")
    return describe_graph(graph), describe_graph(functionalize(graph))


def block(x, w):
    h = torch.tanh(x @ w)
    return (h * F.silu(h)).sum()


def _partition_example() -> dict[str, str]:
    x, w = torch.randn(8, 16), torch.randn(16, 16, requires_grad=True)
    graph, _ = trace(block, x, w, name="block")
    fn = aot(graph, interpreter_compiler)
    fn(x, w)[0].backward()
    stages = {s.name: s.value for s in fn.stages}
    cut = fn.plan((False, True), training=True).partition
    every = partition(stages["cse"], strategy="save_all")
    return {
        "captured": describe_graph(graph),
        "joint": describe_graph(stages["joint_graph"]),
        "joint_decomposed": describe_graph(stages["cse"]),
        "forward": describe_graph(stages["partition.forward"]),
        "backward": describe_graph(stages["partition.backward"]),
        "saved": "\n".join([f"min_cut  saves {cut.saved_bytes} bytes: {list(cut.saved)}",
                            f"save_all saves {every.saved_bytes} bytes: {list(every.saved)}",
                            f"recomputed in the backward: {list(cut.recomputed)}"]),
        "stages": "\n".join(s.name for s in fn.stages),
    }


def _bytes_table() -> str:
    from test_partition import saved_bytes_table

    lines = ["| chain (64x32 float32) | save_all bytes | min_cut bytes | nodes recomputed |",
             "|---|---|---|---|"]
    lines += [f"| `{n}` | {a} | {b} | {r} |" for n, a, b, r in saved_bytes_table()]
    return "\n".join(lines)


def examples() -> dict[str, str]:
    """Every block of the page, by name."""
    torch.manual_seed(0)
    before, after = _functionalize_example()
    rs_before, rs_after = _running_stat_example()
    out = {"functionalize_before": before, "functionalize_after": after,
           "running_before": rs_before, "running_after": rs_after}
    out.update(_partition_example())
    out["bytes_table"] = _bytes_table()
    return out


if __name__ == "__main__":
    for name, text in examples().items():
        print(f"--- {name}\n{text}\n")
