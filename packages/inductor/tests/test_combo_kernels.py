"""Combo kernels (`torchfuse.inductor.combo`): independent small pointwise Triton kernels in
one launch. Values against eager (Triton's interpreter), launch counts on and off, the
off-switches, and the dependencies and memory plan a combo must respect."""

from __future__ import annotations

import ast

import pytest
import torch
from inductor_helpers import BF16_TOL, assert_matches, compile_fn, run_output_code, run_runtime
from torchfuse.graph import schema as S
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph, compile_graph_stages
from torchfuse.inductor.combo import MAX_MEMBERS, combos_apply, verify_combos
from torchfuse.inductor.config import InductorConfig, from_environment
from torchfuse.inductor.scheduler import Schedule, ScheduleVerifyError

pytestmark = pytest.mark.triton_cpu  # combos are Triton kernels: run by the interpreter here

OFF = {"combo_kernels": False}


@pytest.fixture(autouse=True)
def _combos_on(monkeypatch):
    """Combo kernels are off by default (until timed on a GPU): these tests turn them on as
    ``TORCHFUSE_COMBO_KERNELS=1`` would, for every compile, the inductor backend's included."""
    import dataclasses

    from torchfuse.inductor import compile as compile_module

    monkeypatch.setattr(compile_module, "default_config",
                        dataclasses.replace(compile_module.default_config, combo_kernels=True))


def launches(program: S.Program) -> int:
    return sum(isinstance(s, S.LaunchStep) for s in program.steps)


def combos(program: S.Program) -> list[S.Kernel]:
    return [k for k in program.kernels if k.meta.get("kind") == "combo"]


def check_storage(program: S.Program) -> None:
    """Every launch's buffers have storages of their own, and a storage is reused only after
    its buffer was freed (what the plan must keep true around a combo's frees)."""
    storage: dict[str, str] = {name: name for name in program.inputs}
    freed: set[str] = set()
    for step in program.steps:
        if isinstance(step, S.AllocStep):
            if step.reuse is not None:
                assert step.reuse in freed, f"{step.buffer} reuses {step.reuse}, which is still alive"
                freed.discard(step.reuse)
            storage[step.buffer] = storage[step.reuse] if step.reuse else step.buffer
        elif isinstance(step, S.FreeStep):
            freed.add(step.buffer)
        elif isinstance(step, S.LaunchStep):
            names = [a.name for a in step.args if isinstance(a, S.TensorRef)]
            assert not set(names) & freed, f"{step.kernel} reads a freed buffer"
            written = {storage.get(n, n) for n in names}
            # a buffer passed twice (two members read it) is one storage: fine; two buffers
            # on one storage are not
            assert len(written) == len(set(names)), f"{step.kernel}: buffers share a storage"


def independent(x, y, z, w):
    """Five outputs from four inputs, no output reads another: a float32 kernel, a bf16 one,
    a transposed store (a tiled member), a tanh (a module-level helper), an integer one."""
    return (x.sin() + 1, (y * 2).cos(), z.float().exp().to(torch.bfloat16),
            torch.where(w > 0, w, w * 0.1).t().contiguous(), torch.maximum(y, y.new_tensor(0.5)).tanh(),
            (x * 3).to(torch.int32))


def independent_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(8, 16, generator=g), torch.randn(100, generator=g),
            torch.randn(3, 5, 7, generator=g).to(torch.bfloat16), torch.randn(64, 48, generator=g))


def test_independent_kernels_are_one_launch_with_eager_values():
    inputs = independent_inputs()
    program = compile_fn(independent, *inputs)
    alone = compile_fn(independent, *inputs, options=OFF)
    assert launches(alone) >= 4 and not combos(alone)
    assert launches(program) == 1 and len(combos(program)) == 1
    assert_matches(run_runtime(program, list(inputs)), independent(*inputs), **BF16_TOL)
    assert_matches(run_output_code(program, list(inputs)), independent(*inputs), **BF16_TOL)
    check_storage(program)


def test_combo_source_is_plain_triton():
    """One ``tl.program_id(0)``, no nested functions, a branch per member over its own range of
    programs, each member's block sizes constexpr parameters of their own."""
    program = compile_fn(independent, *independent_inputs())
    (kernel,) = combos(program)
    tree = ast.parse(kernel.source)
    (entry,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == kernel.entry]
    assert not [n for n in ast.walk(entry) if isinstance(n, ast.FunctionDef) and n is not entry]
    assert kernel.source.count("tl.program_id(0)") == 1
    assert "def _tanh(" in kernel.source  # the members' helpers, once, at module level
    members = kernel.meta["members"].split(",")
    assert kernel.source.count("pid < ") == len(members)
    constexprs = [a.arg for a in entry.args.args if a.annotation is not None]
    assert sorted(constexprs) == sorted(kernel.configs[0].meta)
    assert {c.split("_")[0] for c in constexprs} == {f"k{i}" for i in range(len(members))}
    total = kernel.grid[0]
    ends = [int(line.split("pid < ")[1].rstrip(":")) for line in kernel.source.splitlines() if "pid < " in line]
    assert ends == sorted(ends) and ends[-1] == total


def test_off_switch_and_environment():
    inputs = independent_inputs()
    assert not combos(compile_fn(independent, *inputs, options=OFF))
    assert from_environment({"TORCHFUSE_COMBO_KERNELS": "0"}).combo_kernels is False
    assert from_environment({}).combo_kernels is False
    assert from_environment({"TORCHFUSE_COMBO_KERNELS": "1"}).combo_kernels is True
    assert combos_apply(_prog_stub(), InductorConfig(combo_kernels=False)) == "combo_kernels=False"


def _prog_stub():
    from torchfuse.inductor import ir

    return ir.LoopProgram("p", (), {}, (), (), (), "cuda:0")


def test_cpp_kernels_get_no_combos():
    inputs = independent_inputs()
    program = compile_fn(independent, *inputs, options={"cpu_backend": "cpp"})
    assert not combos(program)
    assert "combo kernels: off (C++ kernels" in program.meta["fusion.txt"]


def dependent(x):
    a = x + 1  # an output, stored
    b = a.t().contiguous() * 2  # reads a at transposed points: a kernel of its own
    c = b.t().contiguous().sin()  # and again
    return a, b, c


def test_dependent_kernels_are_never_combined():
    x = torch.randn(16, 24)
    program = compile_fn(dependent, x)
    assert launches(program) == 3 and not combos(program)
    assert_matches(run_runtime(program, [x]), dependent(x))


def moved_up(x, y):
    a = x.sin()  # member
    m = a @ a  # an extern call after it
    b = (m + 1).exp()  # reads the matmul: cannot run before it
    c = y.cos()  # independent: moved next to a (or a next to it)
    return b, c


def test_a_member_moves_up_across_unrelated_steps_but_not_past_its_producer():
    x, y = torch.randn(10, 10), torch.randn(7, 9)
    program = compile_fn(moved_up, x, y)
    (kernel,) = combos(program)
    members = kernel.meta["members"].split(",")
    assert len(members) == 2 and not [m for m in members if "exp" in m]
    assert launches(program) == 2  # the combo, then the kernel after the matmul
    assert "written after the combo starts" in program.meta["fusion.txt"]
    assert_matches(run_runtime(program, [x, y]), moved_up(x, y), atol=1e-5, rtol=1e-5)
    check_storage(program)


def test_verify_combos_rejects_a_combo_of_dependent_kernels():
    x = torch.randn(16, 24)
    result = compile_graph_stages(trace(dependent, x)[0])
    stages = {st.name: st.value for st in result.stages}
    sched, prog = stages["combo"], stages["dead_code"]
    kernels = [g.index for g in sched.groups[:2]]
    with pytest.raises(ScheduleVerifyError, match="written by kernel"):
        verify_combos(Schedule(sched.groups, sched.decisions, (tuple(kernels),)), prog)


def many(*xs):
    return tuple(x * (i + 1) for i, x in enumerate(xs))


def test_members_are_capped_per_combo():
    n = MAX_MEMBERS + 8
    xs = [torch.randn(5 + i) for i in range(n)]
    program = compile_fn(many, *xs)
    sizes = [len(k.meta["members"].split(",")) for k in combos(program)]
    assert max(sizes) == MAX_MEMBERS and sum(sizes) == n
    assert launches(program) == len(sizes)
    assert_matches(run_runtime(program, xs), many(*xs))


def test_inputs_read_last_by_a_member_are_freed_after_the_combo():
    """``h`` (a computed buffer) is read last by one member while another writes a buffer of
    the same size: that one must not take ``h``'s storage, which the combo still reads."""

    def fn(x, y):
        h = x.softmax(-1)  # a reduction kernel: h is a buffer
        return (h * 2).t().contiguous(), (y + 1).t().contiguous()

    x, y = torch.randn(12, 20), torch.randn(12, 20)
    program = compile_fn(fn, x, y)
    assert combos(program)
    check_storage(program)
    assert_matches(run_runtime(program, [x, y]), fn(x, y), atol=1e-5, rtol=1e-5)


def test_dynamic_shapes_skip():
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    fn = lambda x, y: (x.sin(), y.cos())
    graph, _ = trace(fn, x, y, dynamic={0: [0], 1: [0]})
    program = compile_graph(graph)
    assert not combos(program) and launches(program) == 2
    assert "combo kernels: off (symbolic sizes" in program.meta["fusion.txt"]
    assert_matches(run_runtime(program, [x, y]), fn(x, y))


def test_training_step_values_with_combos(monkeypatch):
    """Forward and backward through the inductor backend: the two parameters' gradients are
    independent pointwise kernels of the backward (one combo); gradients as eager's."""
    from torchfuse.capture import compile as tf_compile
    from torchfuse.inductor import compile as compile_module

    made = []
    real = compile_module.combo_kernels

    def recording(*args):
        out = real(*args)
        made.extend(out.values())
        return out

    monkeypatch.setattr(compile_module, "combo_kernels", recording)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 7, generator=g, requires_grad=True)
    b = torch.randn(9, generator=g, requires_grad=True)

    def step(a, b):
        return a.sin().sum() * 2 + b.cos().pow(2).sum()

    ref = step(a, b)
    ref_grads = torch.autograd.grad(ref, (a, b))
    out = tf_compile(step)(a, b)
    grads = torch.autograd.grad(out, (a, b))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert made


def test_a_member_with_configs_to_tune_is_launched_alone():
    """A tiled transpose over more than ``pointwise_small_numel`` elements has two launch
    configs to tune: it leaves its combo, the two others still share one launch."""

    def fn(x, y, z):
        return x.t().contiguous() + 1, y.sin(), z.cos()

    x, y, z = torch.randn(512, 256), torch.randn(30), torch.randn(40)
    result = compile_graph_stages(trace(fn, x, y, z)[0])
    (planned,) = {st.name: st.value for st in result.stages}["combo"].combos
    assert len(planned) == 3
    program = result.program
    (kernel,) = combos(program)
    assert len(kernel.meta["members"].split(",")) == 2
    assert launches(program) == 2
    assert_matches(run_runtime(program, [x, y, z]), fn(x, y, z))
    check_storage(program)
