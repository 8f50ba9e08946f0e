"""The verifiers pass on fixtures and traced graphs and name the node at fault otherwise."""

import msgspec
import pytest
import torch
from torchfuse.graph import Graph, Program, trace
from torchfuse.graph import schema as S
from torchfuse.graph.fixtures import fixture_names, load_fixture
from torchfuse.graph.verify import VerificationError, verify, verify_program

replace = msgspec.structs.replace


def _graph():
    def f(x, w):
        h = torch.nn.functional.layer_norm(x, (8,))
        a, b = h.split(2)
        y = x.clone()
        y.add_(1)
        return (a @ w).relu(), b.sum(0), y[1:, ::2].t()

    return trace(f, torch.randn(4, 8), torch.randn(8, 3))[0]


def _node(g, op):
    return next(n for n in g.nodes if n.op == op)


def _swap_node(g, old, new):
    return replace(g, nodes=tuple(new if n is old else n for n in g.nodes))


@pytest.mark.parametrize("name", fixture_names())
def test_fixtures_verify(name):
    doc = load_fixture(name)[0]
    (verify_program if isinstance(doc, Program) else verify)(doc)


def test_traced_graphs_verify():
    verify(_graph())
    verify(trace(lambda x: (x.float() * 2).to(torch.bfloat16).mean(0), torch.arange(12).view(3, 4))[0])


def test_undefined_reference_names_the_node():
    g = _graph()
    mm = _node(g, "aten.mm.default")
    bad = _swap_node(g, mm, replace(mm, args=(S.TensorRef(name="nowhere"), mm.args[1])))
    with pytest.raises(VerificationError, match=r"node 'mm' \[aten.mm.default\]: value 'nowhere' is not defined") as e:
        verify(bad)
    assert e.value.where == "mm"


def test_use_before_def_names_the_node():
    g = _graph()
    nodes = list(g.nodes)
    i = next(k for k, n in enumerate(nodes) if n.op == "aten.relu.default")
    nodes[i - 1], nodes[i] = nodes[i], nodes[i - 1]  # relu before the mm it reads
    with pytest.raises(VerificationError, match=r"node 'relu' .*'mm' is used before it is defined"):
        verify(replace(g, nodes=tuple(nodes)))


def test_wrong_dtype_in_value_table_names_the_node():
    g = _graph()
    relu = _node(g, "aten.relu.default").outputs[0]
    values = {**g.values, relu: replace(g.values[relu], dtype="float16")}
    with pytest.raises(VerificationError, match=r"node 'relu' .*dtype float16 in the value table, the op gives float32"):
        verify(replace(g, values=values))


@pytest.mark.parametrize("field, value, match", [
    ("sizes", (2, 4), "sizes"), ("strides", (1, 2), "strides"), ("storage_offset", 3, "storage offset"),
    ("device", "cuda", "cuda"),
])
def test_wrong_metadata_names_the_node(field, value, match):
    g = _graph()
    mm = _node(g, "aten.mm.default").outputs[0]
    values = {**g.values, mm: replace(g.values[mm], **{field: value})}
    with pytest.raises(VerificationError, match=rf"node 'mm' .*{match}"):
        verify(replace(g, values=values))
    verify(replace(g, values=values), check_meta=False)  # structure alone is fine


def test_unknown_op_names_the_node():
    g = _graph()
    relu = _node(g, "aten.relu.default")
    with pytest.raises(VerificationError, match=r"node 'relu' \[aten.relu_but_faster.default\]: unknown op"):
        verify(_swap_node(g, relu, replace(relu, op="aten.relu_but_faster.default")))


def test_op_namespace_must_be_in_opsets():
    g = _graph()
    with pytest.raises(VerificationError, match="opsets"):
        verify(replace(g, opsets={}))


def test_value_table_consistency():
    g = _graph()
    with pytest.raises(VerificationError, match="'ghost' is defined by no input or node"):
        verify(replace(g, values={**g.values, "ghost": g.values["mm"]}))
    values = dict(g.values)
    del values["relu"]
    with pytest.raises(VerificationError, match=r"node 'relu'.*no entry in the value table"):
        verify(replace(g, values=values))
    relu = _node(g, "aten.relu.default")
    with pytest.raises(VerificationError, match=r"'mm' is defined twice"):
        verify(_swap_node(g, relu, replace(relu, outputs=("mm",))))


def test_outputs_must_refer_to_existing_values():
    g = _graph()
    with pytest.raises(VerificationError, match=r"output 0: value 'zz' is not defined"):
        verify(replace(g, outputs=(S.GraphOutput(value=S.TensorRef(name="zz")),)))
    out = replace(g.outputs[0], aliases_input="not_an_input")
    with pytest.raises(VerificationError, match="aliases_input"):
        verify(replace(g, outputs=(out,)))


def test_symbols_must_be_declared():
    g = load_fixture("symbolic_sizes")[0]
    with pytest.raises(VerificationError, match=r"undeclared symbols \['s0'\]"):
        verify(replace(g, symbols=()))
    bad = replace(g.symbols[0], source="input:7.size(0)")
    with pytest.raises(VerificationError, match="malformed source"):
        verify(replace(g, symbols=(bad,)))


def test_symbolic_meta_compared_at_the_hint():
    g = load_fixture("symbolic_sizes")[0]
    view = _node(g, "aten.view.default")
    values = {**g.values, view.outputs[0]: replace(g.values[view.outputs[0]], sizes=("s0*4",))}
    with pytest.raises(VerificationError, match=r"node 'view'.*sizes \['s0\*4'\].*\[32\]"):
        verify(replace(g, values=values))


# ----------------------------------------------------------------------------- program


def _program() -> Program:
    return load_fixture("program_add_relu")[0]


def _with_step(p, i, step):
    steps = list(p.steps)
    steps[i] = step
    return replace(p, steps=tuple(steps))


def test_launch_arg_count_must_match_signature():
    p = _program()
    launch = p.steps[1]
    bad = _with_step(p, 1, replace(launch, args=launch.args[:3]))
    with pytest.raises(VerificationError, match=r"step 1 \(launch triton_poi_fused_add_relu_0\): passes 3 arguments"):
        verify_program(bad)


def test_program_references_must_exist():
    p = _program()
    with pytest.raises(VerificationError, match="kernel 'nope' is not declared"):
        verify_program(_with_step(p, 1, replace(p.steps[1], kernel="nope")))
    with pytest.raises(VerificationError, match=r"step 2 .*buffer 'buf9' is not declared"):
        verify_program(_with_step(p, 2, replace(p.steps[2], args=(S.TensorRef(name="buf9"), p.steps[2].args[1]))))
    with pytest.raises(VerificationError, match="used before it is allocated"):
        verify_program(replace(p, steps=p.steps[1:]))
    freed = replace(p, steps=(*p.steps[:2], S.FreeStep(buffer="buf0"), *p.steps[2:]))
    with pytest.raises(VerificationError, match="used after it was freed"):
        verify_program(freed)


def test_program_grid_and_symbols():
    p = _program()
    k = replace(p.kernels[0], grid=("(s0*8 + YBLOCK - 1) // YBLOCK",))
    with pytest.raises(VerificationError, match=r"kernel 'triton_poi_fused_add_relu_0'.*undeclared names \['YBLOCK'\]"):
        verify_program(replace(p, kernels=(k,)))
    k = replace(p.kernels[0], grid=("(s0 +",))
    with pytest.raises(VerificationError, match="grid"):
        verify_program(replace(p, kernels=(k,)))
    for src in ("input:0.shape[0]", "input:5.size(0)", "input:0.size(4)"):
        with pytest.raises(VerificationError, match="symbol 's0'"):
            verify_program(replace(p, symbols=(replace(p.symbols[0], source=src),)))


def test_program_kernel_source_and_scalar_args():
    p = _program()
    k = replace(p.kernels[0], source="import triton\n\n@triton.jit\ndef other(x):\n    pass\n")
    with pytest.raises(VerificationError, match=r"defines no @triton\.jit function"):
        verify_program(replace(p, kernels=(k,)))
    launch = p.steps[1]
    bad = _with_step(p, 1, replace(launch, args=(*launch.args[:3], S.TensorRef(name="x"))))
    with pytest.raises(VerificationError, match="'xnumel' is a i32 scalar"):
        verify_program(bad)


def test_graph_and_program_are_distinct_documents():
    assert isinstance(_program(), Program) and not isinstance(_program(), Graph)


def test_a_graph_declares_the_smallest_opsets_its_ops_need():
    from torchfuse.graph.compat import OPSETS, opsets_for
    from torchfuse.graph.tracing import GraphBuilder

    b = GraphBuilder("g")
    b.add_node("torchfuse.set_grad_enabled.default", [S.Bool(value=False)], {}, [None])
    assert b.opsets == {"torchfuse": 1}  # an older reader can still read it
    b.add_node("torchfuse.after.default", [], {}, [None])
    assert b.opsets == {"torchfuse": 2} == {"torchfuse": OPSETS["torchfuse"]}
    assert opsets_for(["aten.mm.default", "mylib.op.default", "torchfuse.checkpoint.default"], {"aten": 1}) == {
        "aten": 1, "mylib": 1, "torchfuse": 2}


def _with_torchfuse_op(op: str, opset: int) -> S.Graph:
    g = _graph()
    node = S.Node(name="flag", op=op, args=(S.Bool(value=True),), kwargs={}, outputs=("",))
    return replace(g, nodes=(node, *g.nodes), opsets={**g.opsets, "torchfuse": opset})


def test_an_op_newer_than_the_declared_opset_is_rejected():
    verify(_with_torchfuse_op("torchfuse.set_grad_enabled.default", 1))
    with pytest.raises(VerificationError, match=r"'torchfuse.checkpoint.default' is in torchfuse opset 2, "
                                                r"but the document declares torchfuse opset 1"):
        verify(_with_torchfuse_op("torchfuse.checkpoint.default", 1), check_meta=False)


@pytest.mark.parametrize("opset", [99, "2"])
def test_an_opset_newer_than_this_reader_is_a_clear_error(opset):
    with pytest.raises(VerificationError, match="knows torchfuse opsets up to 2; upgrade torchfuse-graph"):
        verify(_with_torchfuse_op("torchfuse.set_grad_enabled.default", opset))
