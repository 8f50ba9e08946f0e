"""Launch handles kept between processes (`torchfuse.runtime.handle_cache`) and the kernels
made only when used (`torchfuse.runtime.kernels.LazyKernel`), on the CPU.

The round trip compiles a real sm_90 binary in a child process (a stub driver names the
target, as in the compile workers' tests) and reads it back the way a warm start does: from
Triton's cache, by the hash and file name the first process kept. The GPU side (a warm start
that launches without warming anything up) is in ``test_gpu.py``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import runtime_programs as P
import torch
from torchfuse.graph import trace
from torchfuse.inductor import compile_graph
from torchfuse.runtime import handle_cache
from torchfuse.runtime import kernels as K

triton = pytest.importorskip("triton")


def _kernel():
    graph, _ = trace(lambda a: torch.relu(a * 2.0 + 1.0).sum(dim=1), torch.randn(4, 8))
    (kernel,) = compile_graph(graph, options={"cache": False, "cpu_backend": "triton"}).kernels
    return kernel


def test_a_lazy_kernel_is_written_at_once_and_imported_when_first_used(tmp_path, monkeypatch):
    monkeypatch.setattr(K, "_shared", {})
    monkeypatch.setattr(K, "_modules", {})
    monkeypatch.setattr(K, "_lazy", {})
    kernel = _kernel()
    before = dict(K.share_stats)
    lazy = K.load_kernel(kernel, tmp_path, lazy=True)
    assert isinstance(lazy, K.LazyKernel) and "(made)" not in repr(lazy)
    assert (tmp_path / "kernels" / f"k_{K.kernel_hash(kernel)}.py").read_text() == kernel.source, \
        "the source is on disk (the compile workers read it) before anything imports it"
    assert K.share_stats["imported"] == before["imported"], "nothing imported yet"
    assert K.load_kernel(kernel, tmp_path, lazy=True) is lazy, "one stand-in per kernel code"
    names = lazy.arg_names  # anything asked of it makes the function
    assert K.share_stats["imported"] == before["imported"] + 1 and "(made)" in repr(lazy)
    fn = K.resolved(lazy)
    assert fn is K.load_kernel(kernel, tmp_path), "the very function a plain load gives"
    assert names == fn.arg_names and K.resolved(fn) is fn
    with pytest.raises(AttributeError):
        lazy.__deepcopy__  # noqa: B018  -- probes for special names do not make the function


def test_a_lazy_kernel_that_fails_to_import_raises_when_used(tmp_path, monkeypatch):
    monkeypatch.setattr(K, "_lazy", {})
    kernel = _kernel()
    broken = type(kernel)(**{**{f: getattr(kernel, f) for f in kernel.__struct_fields__},
                             "source": kernel.source.replace("def ", "def  broken(", 1)})
    lazy = K.load_kernel(broken, tmp_path, lazy=True, trust_code=True)
    with pytest.raises(K.KernelCompileError, match="failed to import"):
        lazy.arg_names  # noqa: B018


class _Fake:
    """A compiled kernel as far as `describe` looks."""

    def __init__(self, constants=None, signature=None, group=None):
        self.hash = "ab" * 32
        self.metadata_group = group if group is not None else {"k.json": "/x/k.json", "k.cubin": "/x/k.cubin"}
        fn = type("Fn", (), {"arg_names": ["x", "n", "BLOCK"]})()
        self.src = type("Src", (), {"name": "k", "fn": fn,
                                    "signature": signature or {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                    "constants": constants if constants is not None else {(2,): 128}})()


def test_describe_keeps_what_the_launcher_reads_and_refuses_what_json_cannot_hold():
    doc = handle_cache.describe(_Fake())
    src = handle_cache._Source(json.loads(json.dumps(doc)))
    assert (src.name, src.signature, src.constants, src.fn.arg_names) == (
        "k", {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {(2,): 128}, ["x", "n", "BLOCK"])
    from torchfuse.runtime import launchers

    assert launchers.signature_key(src) == launchers.signature_key(_Fake().src)
    assert handle_cache.describe(_Fake(constants={(2,): torch.float32})) is None
    assert handle_cache.describe(_Fake(signature={"x": ("*fp32", "i32")})) is None
    assert handle_cache.describe(_Fake(group={"k.cubin": "/x/k.cubin"})) is None
    assert handle_cache.describe(object()) is None


def test_a_recorder_keeps_each_key_once_and_nothing_it_cannot_describe(tmp_path, monkeypatch):
    monkeypatch.setattr(handle_cache, "context", lambda: {"device": "test"})
    monkeypatch.setattr(handle_cache, "_usable", lambda: True)
    rec = handle_cache.Recorder(tmp_path, "call")
    rec.remember((4, 8, True), [_Fake(), _Fake()])
    rec.remember((4, 8, True), [object()])  # the same key again: kept as it was
    rec.remember((16, 8, False), [object()])  # a launch it cannot describe: not kept
    raw = json.loads((tmp_path / "call.handles.json").read_text())
    assert raw["context"] == {"device": "test"} and list(raw["keys"]) == ["[4, 8, true]"]
    assert [d["hash"] for d in raw["keys"]["[4, 8, true]"]] == ["ab" * 32] * 2
    monkeypatch.setattr(handle_cache, "MAX_KEYS", 1)
    handle_cache.Recorder(tmp_path, "call").remember((32, 8, True), [_Fake()])
    assert list(json.loads((tmp_path / "call.handles.json").read_text())["keys"]) == ["[4, 8, true]"]


_ROUND_TRIP = """
import json, sys, importlib.util
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from torchfuse.runtime import compile_workers as cw, handle_cache, launchers
from pathlib import Path

driver.set_active(cw._StubDriver(GPUTarget("cuda", 90, 32)))
path, folder = sys.argv[1], Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("rt_kernel", path)
module = importlib.util.module_from_spec(spec); sys.modules["rt_kernel"] = module; spec.loader.exec_module(module)
import torch
fn = getattr(module, sys.argv[3])
args = json.loads(sys.argv[4])
args = [getattr(torch, a[6:]) if isinstance(a, str) and a.startswith("torch.") else a for a in args]
compiled = fn.warmup(*args, grid=(1,))
handle_cache.context = lambda: {"device": "sm90-stub"}
handle_cache.Recorder(folder, "call").remember((4, True), [compiled, compiled])
out = {}
kept = handle_cache.load(folder, "call")
(key, (a, b)), = kept.items()
out["key"] = list(key)
out["same_object"] = a is b
out["cubin"] = a.asm["cubin"] == compiled.asm["cubin"]
out["metadata"] = a.metadata == compiled.metadata and a.packed_metadata == compiled.packed_metadata
out["hash"] = a.hash == compiled.hash
out["signature_key"] = launchers.signature_key(a.src) == launchers.signature_key(compiled.src)
out["no_text_ir"] = sorted(a.asm)
handle_cache.context = lambda: {"device": "another"}
out["other_context"] = handle_cache.load(folder, "call")
handle_cache.context = lambda: {"device": "sm90-stub"}
for p in compiled.metadata_group.values():
    if p.endswith(".cubin"):
        Path(p).unlink()
out["binary_gone"] = handle_cache.load(folder, "call")
print(json.dumps(out))
"""


@P.compiles_for_sm90
def test_a_kept_binary_reads_back_from_tritons_cache_as_the_one_compiled(tmp_path):
    import subprocess

    kernel = _kernel()
    path = tmp_path / "k.py"
    path.write_text(kernel.source)
    from torchfuse.runtime.codegen import launch_values

    cfg = kernel.configs[0]
    values = launch_values(kernel, cfg, K.load_kernel(kernel, tmp_path), ["torch.float32", "torch.float32", 4, 8])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    out = subprocess.run([sys.executable, "-c", _ROUND_TRIP, str(path), str(tmp_path / "calls"),
                          K.entry_name(kernel), json.dumps(values)],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["key"] == [4, True] and got["same_object"], got
    assert got["cubin"] and got["metadata"] and got["hash"] and got["signature_key"], got
    assert "ptx" not in got["no_text_ir"] and "cubin" in got["no_text_ir"], got
    assert got["other_context"] is None, "kept under another device or Triton: not used"
    assert got["binary_gone"] is None, "a binary Triton's cache lost: the whole file unused"


def test_handle_key_is_the_fast_paths_key():
    """`codegen.handle_key` computes what the generated ``_key`` expression does."""
    from torchfuse.runtime import codegen

    program = P.mixed_program("cuda")
    names = codegen._Names()
    sym_names = {s.name: names.bind_local(s.name) for s in program.symbols
                 if s.name in codegen.used_symbols(program)}
    for i in program.inputs:
        names.bind_local(i)
    expr = codegen._key_src(program, sym_names, names)
    base = torch.zeros(64)
    for inputs in ([base[:8], base[8:16], base[16:24]], [base[:8], base[1:9], base[16:24]]):
        env = {"s0": 4, "s1": 24}
        local = {sym_names[s]: v for s, v in env.items() if s in sym_names}
        local.update({names[i]: t for i, t in zip(program.inputs, inputs, strict=True)})
        assert codegen.handle_key(program, env, inputs) == eval(expr, {}, local)
    assert codegen.handle_key(program, env, inputs)[-1] is False, "the second set has a misaligned input"
    assert codegen.handle_key(program, env, [base, base, 3]) is None


def _with_launch_on(program, new_steps, new_buffers):
    """``program`` plus ``new_steps`` (and their buffers), then a launch reading "v1"."""
    from torchfuse.graph import schema as S

    launch = S.LaunchStep(kernel="add_kernel", args=(S.TensorRef(name="v1"), S.TensorRef(name="v1"),
                                                     S.TensorRef(name="buf3"), S.SymRef(expr="s0")))
    fields = {f: getattr(program, f) for f in program.__struct_fields__}
    return type(program)(**{**fields, "buffers": (*program.buffers, *new_buffers),
                            "steps": (*program.steps, *new_steps, launch)})


@pytest.mark.parametrize("offset", [0, 4, 1, 2, "s0"])
def test_tuned_handles_are_kept_where_every_launch_is_aligned_on_every_call(offset):
    from torchfuse.graph import schema as S

    assert handle_cache.launches_aligned(P.scale_program("cuda"))
    mixed = P.mixed_program("cuda")
    assert handle_cache.launches_aligned(mixed)
    aligned = offset in (0, 4)  # float32: 0 and 16 bytes in; 4 and 8 bytes, or a symbol's worth, may not be
    buf = S.Buffer(name="v1", dtype="float32", sizes=("s0",), strides=(1,), device="cuda", storage_offset=offset)
    # a ViewStep of a buffer the Program allocated
    view = S.ViewStep(output="v1", base="buf3", sizes=("s0",), strides=(1,), storage_offset=offset)
    assert handle_cache.launches_aligned(_with_launch_on(mixed, [view], [buf])) is aligned
    # an extern op returning a view of such a buffer (ConvNeXt's as_strided before a launch)
    strided = S.ExternStep(op="aten.as_strided.default", outputs=("v1",),
                           args=(S.TensorRef(name="buf3"), S.ListArg(items=(S.SymRef(expr="s0"),)),
                                 S.ListArg(items=(S.Int(value=1),)), S.SymRef(expr=str(offset))))
    assert handle_cache.launches_aligned(_with_launch_on(mixed, [strided], [buf])) is aligned
    # the same of an input: where its storage starts is not in the handle key
    of_input = S.ExternStep(op="aten.as_strided.default", outputs=("v1",),
                            args=(S.TensorRef(name="x"), *strided.args[1:]))
    assert not handle_cache.launches_aligned(_with_launch_on(mixed, [of_input], [buf]))
    view_of_input = S.ViewStep(output="v1", base="x", sizes=("s0",), strides=(1,), storage_offset=offset)
    assert not handle_cache.launches_aligned(_with_launch_on(mixed, [view_of_input], [buf]))


def test_an_extern_ops_new_tensors_are_its_own_and_its_views_alias_an_argument():
    from torchfuse.graph import schema as S

    def step(op, *args):
        return S.ExternStep(op=op, args=tuple(S.TensorRef(name=a) for a in args), outputs=("o",))

    assert handle_cache._aliased_argument(step("aten.mm.default", "a", "b")) is None
    assert handle_cache._aliased_argument(step("aten.native_layer_norm.default", "a")) is None
    assert handle_cache._aliased_argument(step("aten.split.Tensor", "a")) == "a"
    assert handle_cache._aliased_argument(step("aten.permute.default", "a")) == "a"
    assert handle_cache._aliased_argument(step("aten.add_.Tensor", "a", "b")) == "a"
    assert handle_cache._aliased_argument(step("aten.no_such_op.default", "a")) == ""


def test_keep_tuned_records_the_winners_binaries_in_launch_order_once():
    made = []

    class Warm:
        def __init__(self, name):
            self.name = name

        def warmup(self, *args, grid, **kwargs):
            made.append((self.name, args, kwargs))
            return f"compiled {self.name} {args[0]}"

    jobs = [K.WarmupJob("a", Warm("a"), (1,), (("num_warps", 4),)),
            K.WarmupJob("b", Warm("b"), (2,), ()), K.WarmupJob("a", Warm("a"), (3,), ())]
    recorded = []
    handles: dict = {}

    fake = type("Fn", (), {"__globals__": {"_record": lambda key, compiled: recorded.append((key, compiled)),
                                           "_handles": handles}})()
    handle_cache.keep_tuned(fake, jobs, (4, 24, True))
    assert recorded == [((4, 24, True), ("compiled a 1", "compiled b 2", "compiled a 3"))]
    assert made[0] == ("a", (1,), {"num_warps": 4})
    handles[(4, 24, True)] = ()
    handle_cache.keep_tuned(fake, jobs, (4, 24, True))  # recorded already
    handle_cache.keep_tuned(fake, jobs, None)  # no fast path for these inputs
    assert len(recorded) == 1


def test_the_switch_turns_keeping_and_reading_off(tmp_path, monkeypatch):
    import dataclasses

    import torchfuse.runtime.config as rconfig

    assert rconfig.from_environment({}).handle_cache
    assert not rconfig.from_environment({"TORCHFUSE_HANDLE_CACHE": "0"}).handle_cache
    monkeypatch.setattr(handle_cache, "context", lambda: {"device": "test"})
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, handle_cache=False))
    handle_cache.Recorder(tmp_path, "call").remember((4, True), [_Fake()])
    assert not (tmp_path / "call.handles.json").exists()
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, handle_cache=True))
    handle_cache.Recorder(tmp_path, "call").remember((4, True), [_Fake()])
    assert (tmp_path / "call.handles.json").exists()
    binary = object()
    monkeypatch.setattr(handle_cache, "_compiled", lambda doc: binary)  # Triton's cache, as if it held it
    assert handle_cache.load(tmp_path, "call") == {(4, True): [binary]}
    monkeypatch.setattr(rconfig, "config", dataclasses.replace(rconfig.config, handle_cache=False))
    assert handle_cache.load(tmp_path, "call") is None


def test_a_kept_entry_names_a_binary_only_by_a_hash_and_a_plain_file_name():
    doc = handle_cache.describe(_Fake())
    for bad in ({"hash": "../" + "ab" * 31}, {"group": "../../etc/k.json"}, {"group": "k.cubin"}):
        assert handle_cache._compiled({**doc, **bad}) is None, bad
