"""A CPU tensor inside a GPU graph (``torch.rand([])`` for a layer-drop test) is computed by
ATen, never by a Triton kernel, which cannot read CPU memory."""

from __future__ import annotations

import msgspec
import torch
from torchfuse.graph.tracing import trace
from torchfuse.inductor.config import config
from torchfuse.inductor.lowering import Lowering


def _on(graph, device_of):
    values = {k: msgspec.structs.replace(v, device=device_of(k)) for k, v in graph.values.items()}
    return msgspec.structs.replace(graph, values=values)


def test_cpu_nodes_of_a_gpu_graph_are_extern_calls():
    def f(x):
        p = torch.rand([])
        return x * 2, p < 0.5

    g, _ = trace(f, torch.randn(4, 4))
    cpu = {o for n in g.nodes if n.op.startswith(("aten.rand", "aten.detach", "aten.lt")) for o in n.outputs}
    lowering = Lowering(_on(g, lambda name: "cpu" if name in cpu else "cuda"), config)
    lowering.run()
    off = [f for f in lowering.fallbacks if "CPU tensor in a GPU graph" in f]
    assert [f.split(":")[0] for f in off] == [n.name for n in g.nodes if n.outputs[0] in cpu]
    assert not any(n.op.startswith("aten.mul") for n in g.nodes if n.outputs[0] in cpu)
    assert not any("mul" in f for f in lowering.fallbacks)  # the GPU op is still a kernel


def test_a_cpu_graph_is_untouched():
    g, _ = trace(lambda x: (x * 2, torch.rand([]) < 0.5), torch.randn(4, 4))
    lowering = Lowering(g, config)
    lowering.run()
    assert not any("CPU tensor" in f for f in lowering.fallbacks)


def test_a_cpu_input_of_a_gpu_program_stays_a_cpu_buffer():
    from torchfuse.inductor.compile import compile_graph

    g, _ = trace(lambda x, p: (x * 2, p < 0.5), torch.randn(4, 4), torch.rand([]))
    cpu = {g.inputs[1].name} | {o for n in g.nodes if n.op.startswith("aten.lt") for o in n.outputs}
    program = compile_graph(_on(g, lambda name: "cpu" if name in cpu else "cuda"),
                            [torch.randn(4, 4), torch.rand([])])
    devices = {b.name: b.device for b in program.buffers}
    assert devices[g.inputs[0].name] == "cuda" and devices[g.inputs[1].name] == "cpu"
    extern = next(s for s in program.steps if type(s).__name__ == "ExternStep")
    assert extern.op.startswith("aten.lt") and devices[extern.outputs[0]] == "cpu"
