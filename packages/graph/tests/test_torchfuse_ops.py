"""The ``torchfuse`` opset is registered by the format package alone."""

import subprocess
import sys
import textwrap

import torch
from torchfuse.graph import run
from torchfuse.graph import schema as S
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED
from torchfuse.graph.tracing import GraphBuilder, Recorder


def _no_grad_region_graph() -> S.Graph:
    rec = Recorder(GraphBuilder("region"))
    with rec:
        x = rec.input(torch.randn(3), name="x", requires_grad=True)
        rec.builder.add_node(SET_GRAD_ENABLED, [S.Bool(value=False)], {}, [])
        y = x * 2
        rec.builder.add_node(SET_GRAD_ENABLED, [S.Bool(value=True)], {}, [])
        z = x * 3
    rec.output(y)
    rec.output(z)
    return rec.builder.build()


def test_grad_mode_switch_runs_like_eager():
    x = torch.randn(3, requires_grad=True)
    y, z = run(_no_grad_region_graph(), x)
    assert not y.requires_grad
    assert z.requires_grad
    torch.testing.assert_close(y, x.detach() * 2)
    assert torch.is_grad_enabled()


def test_opset_needs_no_other_torchfuse_package():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[:2] in (["torchfuse", "capture"], ["torchfuse", "autograd"],
                                           ["torchfuse", "inductor"], ["torchfuse", "runtime"]):
                    raise ImportError(name + " is blocked in this test")
        sys.meta_path.insert(0, Block())
        import torch, torchfuse.graph
        from torchfuse.graph.ops import resolve_op
        op = resolve_op("torchfuse.set_grad_enabled.default")
        op(False); assert not torch.is_grad_enabled(); op(True)
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"


def test_numbers_returned_beside_tensors_are_recorded_as_unnamed_outputs():
    # The flash-attention kernel's meta function returns max_q/max_k as ints (from shapes).
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    rec = Recorder(GraphBuilder("attn"))
    with rec:
        q = rec.input(torch.empty(2, 4, 16, 8, dtype=torch.bfloat16), name="q")
        out = op(q, q, q)
    ints = [o for o in out if isinstance(o, int) and not isinstance(o, bool)]
    assert ints == [16, 16]
    (node,) = [n for n in rec.builder.nodes if n.op == "aten._scaled_dot_product_flash_attention.default"]
    assert [bool(n) for n in node.outputs] == [isinstance(o, torch.Tensor) for o in out]
