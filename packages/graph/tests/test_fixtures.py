"""Golden fixtures: frozen, loadable, verified, and (for graphs) reproduced by the interpreter."""

import hashlib
import importlib.util

import pytest
import torch
from torchfuse.graph import Graph, Program, run
from torchfuse.graph import schema as S
from torchfuse.graph.expr import evaluate
from torchfuse.graph.fixtures import (
    CURRENT,
    FIXTURES_DIR,
    fixture_names,
    fixture_path,
    fixture_versions,
    load_fixture,
)
from torchfuse.graph.fixtures.make import FIXTURES
from torchfuse.graph.interpreter import bind_symbols
from torchfuse.graph.ops import decode_arg, resolve_op, to_dtype
from torchfuse.graph.verify import verify, verify_program

NAMES = fixture_names()
GRAPHS = [n for n in NAMES if isinstance(load_fixture(n)[0], Graph)]
PROGRAMS = [n for n in NAMES if isinstance(load_fixture(n)[0], Program)]


def _close(got, want):
    got = torch.as_tensor(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)


def test_fixture_set_is_complete_and_shipped_in_the_package():
    assert CURRENT in fixture_versions()
    assert set(NAMES) == set(FIXTURES)  # every generator has its frozen archive
    assert len(GRAPHS) >= 5 and len(PROGRAMS) >= 1
    assert FIXTURES_DIR.parent.name == "graph"  # inside the torchfuse.graph package


def test_fixtures_are_frozen_not_regenerated(tmp_path):
    from torchfuse.graph.fixtures.make import main

    assert main(["--out", str(FIXTURES_DIR / CURRENT)]) == 1  # refuses to overwrite
    digest = {n: hashlib.sha256((fixture_path(n) / "document.json").read_bytes()).hexdigest() for n in NAMES}
    assert len(set(digest.values())) == len(NAMES)


@pytest.mark.parametrize("name", GRAPHS)
def test_graph_fixture_runs_and_matches_eager(name):
    graph, inputs, expected, _ = load_fixture(name)
    verify(graph)
    got = run(graph, *inputs)
    assert len(got) == len(expected)
    for g, w in zip(got, expected, strict=True):
        _close(g, w)


def test_weights_are_taken_from_the_archive_by_target():
    graph, inputs, _, tensors = load_fixture("matmul_weights")
    params = [i for i in graph.inputs if i.kind == "parameter"]
    assert {p.target for p in params} == set(tensors) == {"fc1.weight", "fc1.bias", "fc2.weight"}
    for i, inp in enumerate(graph.inputs):
        if inp.kind == "parameter":
            assert inputs[i] is tensors[inp.target]


def test_symbolic_fixture_has_symbols_and_runs_at_another_size():
    graph, inputs, _expected, _ = load_fixture("symbolic_sizes")
    assert graph.symbols[0] == S.Symbol(name="s0", min=2, hint=4, source="input:0.size(0)")
    assert graph.values[graph.inputs[0].name].sizes == ("s0", 8)
    assert inputs[0].shape[0] != graph.symbols[0].hint
    x = torch.randn(9, 8)
    out = run(graph, x, inputs[1])
    torch.testing.assert_close(out[1], ((x + inputs[1]) * 0.5).sum(1))
    assert out[3] == (9 + 3) // 4


def test_load_fixture_returns_fresh_tensors():
    _, a, _, _ = load_fixture("pointwise_chain")
    a[0].zero_()
    _, b, _, _ = load_fixture("pointwise_chain")
    assert b[0].abs().sum() > 0


def test_unknown_fixture():
    with pytest.raises(KeyError, match="pointwise_chain"):
        fixture_path("nope")


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_fixture_verifies(name):
    program, inputs, expected, _ = load_fixture(name)
    verify_program(program)
    assert len(inputs) == len(program.inputs) and len(expected) == len(program.outputs)
    for kernel in program.kernels:
        if kernel.language == "cpp":  # format 1.1; run by the runtime's tests (it needs a compiler)
            assert f'extern "C" void {kernel.entry}(' in kernel.source
        else:
            assert "import triton" in kernel.source and "@triton.jit" in kernel.source


def _execute(program, inputs):
    """A minimal executor of the launch convention, only to check the fixture's expected
    values (the runtime package owns the real one)."""
    import triton  # noqa: F401  (the kernel source imports it)

    env = dict(zip(program.inputs, inputs, strict=True))
    symbols = bind_symbols(program.symbols, inputs)
    buffers = {b.name: b for b in program.buffers}
    kernels = {}
    for k in program.kernels:
        namespace = {}
        exec(compile(k.source, f"<{k.name}>", "exec"), namespace)
        kernels[k.name] = (k, namespace[k.entry or k.name])
    for step in program.steps:
        if isinstance(step, S.AllocStep):
            b = buffers[step.buffer]
            env[b.name] = torch.empty_strided([evaluate(s, symbols) for s in b.sizes],
                                              [evaluate(s, symbols) for s in b.strides],
                                              dtype=to_dtype(b.dtype), device=b.device)
        elif isinstance(step, S.LaunchStep):
            kernel, fn = kernels[step.kernel]
            config = kernel.configs[0]
            scope = {**symbols, **config.meta}
            grid = tuple(evaluate(g, scope) for g in (step.grid or kernel.grid))
            args = [decode_arg(a, env, symbols) for a in step.args]
            fn[grid](*args, **kernel.constexprs, **config.meta, num_warps=config.num_warps,
                     num_stages=config.num_stages)
        elif isinstance(step, S.ExternStep):
            out = resolve_op(step.op)(*[decode_arg(a, env, symbols) for a in step.args],
                                      **{k: decode_arg(v, env, symbols) for k, v in step.kwargs.items()})
            for n, v in zip(step.outputs, out if isinstance(out, tuple | list) else [out], strict=True):
                env[n] = v
        elif isinstance(step, S.ViewStep):
            env[step.output] = env[step.base].as_strided(
                [evaluate(s, symbols) for s in step.sizes], [evaluate(s, symbols) for s in step.strides],
                evaluate(step.storage_offset, symbols))
        elif isinstance(step, S.CopyStep):
            env[step.dst].copy_(env[step.src])
        elif isinstance(step, S.FreeStep):
            del env[step.buffer]
    return [decode_arg(o, env, symbols) for o in program.outputs]


TRITON_PROGRAMS = [n for n in PROGRAMS if all(k.language == "triton" for k in load_fixture(n)[0].kernels)]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("name", TRITON_PROGRAMS)
def test_program_fixture_expected_values_follow_the_launch_convention(name):
    program, inputs, expected, _ = load_fixture(name)
    for got, want in zip(_execute(program, inputs), expected, strict=True):
        torch.testing.assert_close(got, want)
