"""User ``@triton.jit`` kernels inside compiled functions, end to end.

A launch ``kernel[grid](...)`` is captured as one ``torchfuse.triton_kernel.default`` node plus a
write-back of each tensor the kernel writes; every backend runs it and leaves the user's tensors
as eager does; inductor launches it as a Program kernel and fuses the pointwise work around it;
a saved graph holding it runs with the format package alone. CPU, Triton's interpreter, tiny
tensors; everything compared with eager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torchfuse.capture as tfc
import torchfuse.graph as tfg
import triton
import triton.language as tl
from torchfuse.graph import schema as S
from torchfuse.graph.torchfuse_ops import TRITON_KERNEL

BACKENDS = ["eager", "aot_eager", "inductor"]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scale_inplace(x_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, x.to(tl.float32) * scale, mask=mask)


@triton.jit
def _store_twice(ptr, offs, v, mask):
    tl.store(ptr + offs, v * 2, mask=mask)


@triton.jit
def double_via_helper(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _store_twice(dst_ptr, offs, tl.load(src_ptr + offs, mask=mask), mask)


@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])
@triton.jit
def tuned_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


KERNEL = add_kernel


# ----------------------------------------------------------------------------- the functions


def add_into_new(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, BLOCK=8)
    return out * 2


def scale_argument(x, s):
    scale_inplace[(2,)](x, x.numel(), s, BLOCK=8)
    return x + 1


def fused_around(x):
    y = x * 2 + 1
    scale_inplace[(2,)](y, y.numel(), 3.0, BLOCK=8)
    return (y.relu() + 3).sum(-1)


def add_into_argument(x, y, out):
    add_kernel[(2,)](x * 2 + 1, y, out, out.numel(), BLOCK=8)
    return (out.relu() + 3).sum(-1)


def two_launches(x, y):
    out = torch.empty_like(x)
    add_kernel[(2,)](x, y, out, 13, BLOCK=8)
    scale_inplace[(2,)](out, 13, 0.5, BLOCK=8)
    double_via_helper[(2,)](out, y, 13, BLOCK=8)
    return out, y


def inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def clones(ts):
    return [t.clone() for t in ts]


class Recording:
    """A backend that keeps the graphs it is given and runs them on the reference interpreter."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph, example_inputs):
        self.graphs.append(graph)
        return lambda *a: tfg.run(graph, *a)


def kernel_nodes(graph):
    return [n for n in graph.nodes if n.op == TRITON_KERNEL]


# ----------------------------------------------------------------------------- capture


def test_written_pointers_are_found_from_the_source():
    from torchfuse.capture.triton_kernels import written_params

    assert "out_ptr" in written_params(add_kernel.fn)
    assert not {"x_ptr", "y_ptr"} & written_params(add_kernel.fn)
    # a loaded value's method (x.to) is data, not a write through x_ptr
    assert "x_ptr" in written_params(scale_inplace.fn)
    # a pointer handed to a helper kernel counts as written
    assert "dst_ptr" in written_params(double_via_helper.fn)
    assert "src_ptr" not in written_params(double_via_helper.fn)


def test_one_node_per_launch_and_write_backs():
    rec = Recording()
    x, y = inputs((13,), (13,))
    tfc.compile(two_launches, backend=rec, fullgraph=True)(x.clone(), y.clone())
    (graph,) = rec.graphs
    nodes = kernel_nodes(graph)
    assert len(nodes) == 3
    entries = [json.loads(n.args[0].value)["entry"] for n in nodes]
    assert entries == ["add_kernel", "scale_inplace", "double_via_helper"]
    # each kernel writes one pointer: one output and one copy_ back into the user's tensor
    assert [len(n.outputs) for n in nodes] == [1, 1, 1]
    assert [n.op for n in graph.nodes].count("aten.copy_.default") == 3
    spec = json.loads(nodes[0].args[0].value)
    assert spec["args"][3] == {"name": "n", "value": 13}
    assert spec["args"][4] == {"name": "BLOCK", "constexpr": 8}
    assert spec["grid"] == [2]
    assert "def _store_twice" in json.loads(nodes[2].args[0].value)["source"]  # helper carried along


def test_explain_shows_one_node_for_the_kernel():
    x, y = inputs((13,), (13,))
    ex = tfc.explain(add_into_new)(x, y)
    assert ex.graph_count == 1 and ex.graph_break_count == 0
    assert ex.ops_per_graph[0].count(TRITON_KERNEL) == 1


def test_grid_callable_sees_bound_arguments():
    rec = Recording()
    x, y = inputs((13,), (13,))
    tfc.compile(add_into_new, backend=rec, fullgraph=True)(x, y)
    (node,) = kernel_nodes(rec.graphs[0])
    assert json.loads(node.args[0].value)["grid"] == [2]  # cdiv(13, 8)


# ----------------------------------------------------------------------------- backends


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_match_eager(backend):
    x, y = inputs((13,), (13,))
    got = tfc.compile(add_into_new, backend=backend)(x, y)
    torch.testing.assert_close(got, add_into_new(x, y))
    got2 = tfc.compile(fused_around, backend=backend)(x)
    torch.testing.assert_close(got2, fused_around(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutated_argument_is_written_back(backend):
    (x,) = inputs((13,))
    xe, xc = x.clone(), x.clone()
    expect = scale_argument(xe, 2.5)
    got = tfc.compile(scale_argument, backend=backend)(xc, 2.5)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(xc, xe)  # the function's input holds what the kernel wrote


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_argument_and_several_launches(backend):
    x, y, out = inputs((13,), (13,), (13,))
    ae, ac = clones([x, y, out]), clones([x, y, out])
    expect = add_into_argument(*ae)
    got = tfc.compile(add_into_argument, backend=backend)(*ac)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(ac[2], ae[2])
    be, bc = clones([x, y]), clones([x, y])
    expect2 = two_launches(*be)
    got2 = tfc.compile(two_launches, backend=backend)(*bc)
    for g, e in zip([*got2, bc[1]], [*expect2, be[1]], strict=True):
        torch.testing.assert_close(g, e)


LAUNCHER = add_kernel[(2,)]


def test_launcher_made_outside_is_captured():
    def f(x, y):
        out = torch.empty_like(x)
        LAUNCHER(x, y, out, 13, BLOCK=8)
        return out

    rec = Recording()
    x, y = inputs((13,), (13,))
    got = tfc.compile(f, backend=rec, fullgraph=True)(x, y)
    assert len(kernel_nodes(rec.graphs[0])) == 1
    torch.testing.assert_close(got, x + y)


def test_replacing_the_kernel_recompiles():
    global KERNEL

    def f(x, y):
        out = torch.empty_like(x)
        KERNEL[(2,)](x, y, out, 13, BLOCK=8)
        return out

    x, y = inputs((13,), (13,))
    g = tfc.compile(f, backend="eager")
    torch.testing.assert_close(g(x, y), x + y)
    try:
        KERNEL = sub_kernel  # the identity guard on the kernel object fails
        torch.testing.assert_close(g(x, y), x - y)
    finally:
        KERNEL = add_kernel


def test_autotuned_kernel_is_a_graph_break():
    def f(x, y):
        out = torch.empty_like(x)
        tuned_add[(1,)](x, y, out, 13)
        return out

    x, y = inputs((13,), (13,))
    ex = tfc.explain(f)(x, y)
    assert ex.graph_break_count >= 1
    assert "autotuned" in ex.break_reasons[0].reason
    torch.testing.assert_close(tfc.compile(f, backend="eager")(x, y), x + y)


# ----------------------------------------------------------------------------- inductor


def test_inductor_launches_the_user_kernel_and_fuses_around_it():
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import load

    rec = Recording()
    (x,) = inputs((2, 13))
    tfc.compile(fused_around, backend=rec, fullgraph=True)(x)
    program = compile_graph(rec.graphs[0])
    user = [k for k in program.kernels if k.meta.get("origin") == "user"]
    generated = [k for k in program.kernels if k.meta.get("origin") != "user"]
    assert [k.entry for k in user] == ["scale_inplace"]
    assert [p.kind for p in user[0].signature] == ["ptr", "i32", "fp32"]
    assert user[0].constexprs == {"BLOCK": 8}
    # x * 2 + 1 before the kernel, relu + 3 + sum after it: one generated kernel each
    assert len(generated) == 2, [k.name for k in generated]
    launches = [s.kernel for s in program.steps if isinstance(s, S.LaunchStep)]
    assert launches == [generated[0].name, user[0].name, generated[1].name]
    # y dies at the launch: the kernel writes into it in place, no clone
    assert not any(isinstance(s, S.CopyStep) for s in program.steps)
    assert not any(isinstance(s, S.ExternStep) for s in program.steps)
    torch.testing.assert_close(load(program)(x)[0], fused_around(x))


def test_inductor_clones_an_input_the_kernel_writes():
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import load

    rec = Recording()
    (x,) = inputs((13,))
    tfc.compile(scale_argument, backend=rec, fullgraph=True)(x.clone(), 2.0)
    program = compile_graph(rec.graphs[0])
    copies = [s for s in program.steps if isinstance(s, S.CopyStep)]
    assert [c.src for c in copies] == [program.inputs[0]]  # the input itself is never written
    xc = x.clone()
    outs = load(program)(xc)
    torch.testing.assert_close(xc, x)
    torch.testing.assert_close(outs[0], x * 2.0 + 1)


# ----------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_other_inputs_get_gradients(backend):
    def f(x, w):
        y = x * 2
        scale_inplace[(2,)](y, y.numel(), 3.0, BLOCK=8)
        return (y * w).sum()

    x, w = inputs((13,), (13,))
    we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    expect = f(x, we)
    expect.backward()
    got = tfc.compile(f, backend=backend)(x, wc)
    got.backward()
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(wc.grad, we.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_no_gradient_flows_through_a_kernel(backend):
    def f(x, w):
        out = torch.empty_like(x)
        add_kernel[(2,)](x, x, out, 13, BLOCK=8)
        return (out * w).sum() + (x * x).sum()

    x, w = inputs((13,), (13,))
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    expect = f(xe, we)
    expect.backward()
    got = tfc.compile(f, backend=backend)(xc, wc)
    got.backward()
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(xc.grad, xe.grad)  # 2x only: nothing through the kernel's write
    torch.testing.assert_close(wc.grad, we.grad)


def test_op_outputs_do_not_require_grad():
    x = torch.randn(13, requires_grad=True)
    spec = json.loads(_spec_of(add_into_new, x.detach(), x.detach()))
    (out,) = torch.ops.torchfuse.triton_kernel.default(
        json.dumps(spec), [x, x, torch.empty(13)], [2])
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, 2 * x.detach())


def _spec_of(fn, *args):
    rec = Recording()
    tfc.compile(fn, backend=rec, fullgraph=True)(*args)
    return kernel_nodes(rec.graphs[0])[0].args[0].value


# ----------------------------------------------------------------------------- the format alone

_BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[:2] in (["torchfuse", p] for p in ("capture", "autograd", "inductor", "runtime")):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import json, torch, torchfuse.graph as tfg
    graph = tfg.load(sys.argv[1])
    x = torch.arange(13, dtype=torch.float32)
    y = torch.full((13,), 0.5)
    outs = tfg.run(graph, x, y)
    assert not any(m.startswith(("torchfuse.capture", "torchfuse.inductor")) for m in sys.modules)
    print(json.dumps([o.tolist() for o in outs]))
""")


def test_saved_graph_runs_with_the_format_package_alone(tmp_path):
    rec = Recording()
    x = torch.arange(13, dtype=torch.float32)
    y = torch.full((13,), 0.5)
    tfc.compile(two_launches, backend=rec, fullgraph=True)(x.clone(), y.clone())
    path = tmp_path / "kernel_graph.zip"
    tfg.save(rec.graphs[0], path)
    loaded = tfg.load(path)
    assert loaded == rec.graphs[0]
    script = tmp_path / "run_alone.py"
    script.write_text(_BLOCKED)
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = [torch.tensor(v) for v in json.loads(proc.stdout.strip().splitlines()[-1])]
    expect = two_launches(x.clone(), y.clone())
    assert len(got) == len(expect)
    for g, e in zip(got, expect, strict=True):
        torch.testing.assert_close(g, e)
