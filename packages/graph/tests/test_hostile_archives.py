"""Hostile archives: loading, verifying, printing and running a Graph never runs code from it.

Every test builds its archive by hand in a temporary folder and asserts the specific error;
where code would run, a marker file that the payload would create must not exist afterwards.
The attacks are those of issue 18 (and a few more found on the way); the trust model is in
``docs/format.md``.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile

import msgspec
import pytest
import torch
from torchfuse.graph import (
    ArchiveError,
    ArchiveLimits,
    FormatVersionError,
    InputError,
    InterpreterError,
    VerificationError,
    bind_weights,
    load,
    load_archive,
    run,
    save,
    trace,
    verify,
)
from torchfuse.graph import schema as S
from torchfuse.graph.archive import _content_hash
from torchfuse.graph.expr import ExprError, evaluate
from torchfuse.graph.fixtures import fixture_path
from torchfuse.graph.ops import UnknownOpError, resolve_op
from torchfuse.graph.printer import guard_to_python, guards_to_python, load_python, to_python
from torchfuse.graph.user_kernels import UserKernelError
from torchfuse.graph.user_kernels import launch as launch_user_kernel


@pytest.fixture
def marker(tmp_path):
    """A path the payloads would create; asserted absent by every test that uses it."""
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "code from the archive ran"


def _payload(marker) -> str:
    return f"open({str(marker)!r}, 'w').write('x')"


def _graph_with(node: S.Node, *, symbols=(), guards=()) -> S.Graph:
    """``x -> node(x) -> out`` with a 4-element float32 value table."""
    meta = S.TensorMeta(dtype="float32", sizes=(4,), strides=(1,))
    return S.Graph(name="g", inputs=(S.GraphInput(name="x"),),
                   outputs=(S.GraphOutput(value=S.TensorRef(name=node.outputs[0])),),
                   nodes=(node,), values={"x": meta, node.outputs[0]: meta}, symbols=symbols,
                   guards=guards, opsets={"aten": 1, node.op.split(".")[0]: 1})


def _relu(**changes) -> S.Node:
    fields = {"name": "relu", "op": "aten.relu.default", "args": (S.TensorRef(name="x"),), "outputs": ("y",)}
    return S.Node(**{**fields, **changes})


def _evil_module(tmp_path, marker, monkeypatch) -> str:
    """A module on sys.path whose import creates the marker."""
    (tmp_path / "evil_mod_18.py").write_text(_payload(marker) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("evil_mod_18", None)
    return "evil_mod_18"


# ----------------------------------------------------------------------------- ops


@pytest.mark.parametrize("op", [
    "import_module.__call__.__call__", "load_library.__call__.__call__", "aten.add.__call__",
    "aten.add.op", "aten.name.default", "higher_order.cond.default", "aten.from_file.default",
    "aten.save.default", "profiler._record_function_enter.default", "aten.add", "aten..x",
    "os.system.default", "aten.add.Tensor\nimport os"])
def test_op_names_resolve_only_to_real_operators(op):
    with pytest.raises(UnknownOpError):
        resolve_op(op)


def test_run_and_verify_never_import_a_module_a_node_names(tmp_path, marker, monkeypatch):
    module = _evil_module(tmp_path, marker, monkeypatch)
    g = _graph_with(_relu(op="import_module.__call__.__call__", args=(S.Str(value=module),)))
    with pytest.raises(InterpreterError, match=r"node 'relu'.*not spelled namespace.name.overload"):
        run(g, torch.ones(4))
    with pytest.raises(VerificationError, match=r"node 'relu'.*unknown op"):
        verify(g)
    with pytest.raises(VerificationError, match="cannot print"):
        to_python(g)
    assert module not in sys.modules


def test_layout_and_memory_format_names_are_real_ones():
    g = _graph_with(_relu(op="aten.empty_like.default",
                          kwargs={"layout": S.LayoutArg(name="load")}))
    with pytest.raises(VerificationError, match="unknown layout 'load'"):
        verify(g)
    with pytest.raises(InterpreterError, match="unknown layout"):
        run(g, torch.ones(4))
    with pytest.raises(VerificationError, match="cannot print argument"):
        to_python(g)
    bad = _graph_with(_relu(op="aten.clone.default",
                            kwargs={"memory_format": S.MemoryFormatArg(name="load")}))
    with pytest.raises(VerificationError, match="unknown memory format"):
        verify(bad)


# ----------------------------------------------------------------------------- printers


def test_a_newline_in_data_never_escapes_a_comment(marker):
    evil = f"x\n{_payload(marker)}\n#"
    node = _relu(loc=S.SourceLoc(file=evil, line=1, function=evil, text=evil), module_path=evil)
    g = _graph_with(node)
    g = msgspec.structs.replace(g, inputs=(S.GraphInput(name="x", kind="parameter", target=evil),),
                                symbols=(S.Symbol(name="s9", hint=3, source=evil),),
                                values={k: msgspec.structs.replace(v, device="cpu") for k, v in g.values.items()})
    source = to_python(g)
    assert all(line.index("#") < line.index("open(") for line in source.splitlines() if "open(" in line)
    fn = load_python(source)
    torch.testing.assert_close(fn(torch.ones(4))[0], torch.ones(4))


@pytest.mark.parametrize("field, value, match", [
    ("op", "aten.relu.default(x)\nimport os\nos", "cannot print"),
    ("kwargs", {"x)\nimport os\n(": S.Int(value=1)}, "not an identifier"),
    ("args", (S.DtypeArg(name="float32; import os"),), "cannot print argument"),
    ("args", (S.SymRef(expr="__import__"),), "undeclared symbols"),
])
def test_printer_refuses_what_it_cannot_write_safely(field, value, match):
    with pytest.raises(VerificationError, match=match):
        to_python(_graph_with(_relu(**{field: value})))


def test_symbol_names_must_be_identifiers():
    g = _graph_with(_relu(), symbols=(S.Symbol(name="s0 = __import__('os')\ns1", hint=2),))
    with pytest.raises(VerificationError, match="cannot print symbol"):
        to_python(g)
    with pytest.raises(VerificationError, match="not an identifier"):
        verify(g)


def test_value_names_are_sanitized_to_ascii_identifiers(marker):
    # a value name with a payload, and one whose NFKC form is a name the printer uses ("torch")
    evil = f"y = 0; {_payload(marker)}; z"
    node = _relu(args=(S.TensorRef(name="ｔorch"),), outputs=(evil,))
    meta = S.TensorMeta(dtype="float32", sizes=(4,), strides=(1,))
    g = S.Graph(name="g\nimport os", inputs=(S.GraphInput(name="ｔorch"),),
                outputs=(S.GraphOutput(value=S.TensorRef(name=evil)),), nodes=(node,),
                values={"ｔorch": meta, evil: meta}, opsets={"aten": 1})
    out = load_python(to_python(g))(-torch.ones(4))
    torch.testing.assert_close(out[0], torch.zeros(4))


@pytest.mark.parametrize("guard", [
    S.ConstantGuard(source="L['n']", value="__import__('os').system('true')"),
    S.ConstantGuard(source="__import__('os').system('true')", value="3"),
    S.TensorGuard(source="(lambda: 0)()", dtype="float32", device="cpu", sizes=(4,)),
    S.TensorGuard(source="x", dtype="float32, __import__('os')", device="cpu", sizes=(4,)),
    S.TypeGuard(source="L[0].__class__.__subclasses__()", type_name="x"),
    S.LengthGuard(source="exec('1')", length=1),
])
def test_guards_with_code_in_them_do_not_print(guard):
    with pytest.raises(VerificationError, match="cannot print"):
        guard_to_python(guard)


def test_printed_guards_run_nothing(marker):
    evil = f"\n{_payload(marker)}\n"
    guards = (S.IdentityGuard(source="fn", description=evil, loc=S.SourceLoc(file=evil, line=1, text=evil)),
              S.ConstantGuard(source="n", value="<object at 0x1>\n" + _payload(marker)),
              S.ConstantGuard(source="tuple(L[0].keys())", value="('a', 'b')"))
    text = guards_to_python(guards)
    scope = {"fn": None, "n": 3, "L": [{"a": 1, "b": 2}]}
    assert [eval(line, scope) for line in text.splitlines() if not line.startswith("#")] == [True, True, True]


# ----------------------------------------------------------------------------- user kernels


def _user_kernel_node(source: str, entry: str = "k") -> S.Node:
    spec = json.dumps({"source": source, "entry": entry, "grid": [1], "args": [], "version": 1})
    return S.Node(name="tk", op="torchfuse.triton_kernel.default",
                  args=(S.Str(value=spec), S.ListArg(items=(S.TensorRef(name="x"),)), S.ListArg(items=())),
                  outputs=("y",))


def test_a_user_kernel_source_from_data_is_checked_before_import(marker):
    source = f"import triton\n{_payload(marker)}\n\n@triton.jit\ndef k(x):\n    pass\n"
    g = _graph_with(_user_kernel_node(source))
    with pytest.raises(VerificationError, match="top-level Expr statement"):
        verify(g, check_meta=False)
    with pytest.raises(UserKernelError, match="refusing to import"):
        launch_user_kernel(g.nodes[0].args[0].value, [torch.ones(4)], [])


# ----------------------------------------------------------------------------- archive limits


def _write(path, files: dict[str, bytes], *, hashed: bool = True, **manifest) -> None:
    """An archive directory (or ``.zip``) with exactly these members and a manifest."""
    body = {"format": "torchfuse.graph", "version": [1, 0], "kind": "graph",
            "content_hash": _content_hash(files) if hashed else "",
            "tensors": ["w"] if "tensors.safetensors" in files else [], **manifest}
    files = {**files, "manifest.json": json.dumps(body).encode()}
    if str(path).endswith(".zip"):
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        path.mkdir()
        for name, data in files.items():
            (path / name).write_bytes(data)


def _doc(graph: S.Graph | None = None) -> bytes:
    return msgspec.json.encode(graph or _graph_with(_relu()))


def test_zip_bomb_is_refused_by_declared_size_and_ratio(tmp_path):
    bomb = tmp_path / "bomb.zip"
    _write(bomb, {"document.json": _doc() + b" " * (8 << 20)})  # 8 MiB of blanks: about 8 KiB zipped
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ArchiveError, match="over the limit"):
        load(bomb, limits=ArchiveLimits(document_bytes=1 << 20))
    with pytest.raises(ArchiveError, match="zip bomb"):
        load(bomb, limits=ArchiveLimits(zip_ratio_floor=1 << 20))
    assert load(bomb).name == "g"  # within the defaults: 8 MiB is below the ratio floor


def test_zip_member_lying_about_its_size_is_damaged(tmp_path):
    good = tmp_path / "good.zip"
    _write(good, {"document.json": _doc() + b" " * 10_000})
    data = bytearray(good.read_bytes())
    entry = data.find(b"PK\x01\x02")  # central directory entries: the name is at +46, the size at +24
    while data[entry + 46:entry + 46 + len(b"document.json")] != b"document.json":
        entry = data.find(b"PK\x01\x02", entry + 4)
    data[entry + 24:entry + 28] = (100).to_bytes(4, "little")  # claims 100 bytes; inflates to more
    (tmp_path / "lying.zip").write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=r"damaged|cannot be read"):
        load(tmp_path / "lying.zip", check_hash=False)


def test_duplicate_zip_members_are_refused(tmp_path):
    path = tmp_path / "dup.zip"
    _write(path, {"document.json": _doc()})
    with pytest.warns(UserWarning), zipfile.ZipFile(path, "a") as zf:
        zf.writestr("document.json", _doc())
    with pytest.raises(ArchiveError, match=r"2 members named document\.json"):
        load(path)


def test_only_named_members_are_read(tmp_path):
    d = tmp_path / "a"
    _write(d, {"document.json": _doc()})
    os.mkfifo(d / "extra.fifo")  # reading it would block forever
    (d / "evil.py").write_text("raise SystemExit")
    assert load(d).name == "g"


def test_special_files_and_symlinks_are_refused(tmp_path):
    secret = tmp_path / "outside.json"
    secret.write_bytes(_doc())
    d = tmp_path / "a"
    _write(d, {"document.json": _doc()})
    (d / "document.json").unlink()
    (d / "document.json").symlink_to(secret)
    with pytest.raises(ArchiveError, match="symlink"):
        load(d)
    (d / "document.json").unlink()
    os.mkfifo(d / "document.json")
    with pytest.raises(ArchiveError, match="not a regular file"):
        load(d)
    fifo = tmp_path / "a.zip"
    os.mkfifo(fifo)
    with pytest.raises(ArchiveError, match="neither a directory nor a regular file"):
        load(fifo)


def test_a_missing_content_hash_is_an_error_unless_opted_out(tmp_path):
    _write(tmp_path / "a", {"document.json": _doc()}, hashed=False)
    with pytest.raises(ArchiveError, match="no content_hash"):
        load(tmp_path / "a")
    assert load(tmp_path / "a", check_hash=False).name == "g"


def test_the_manifest_and_the_tensors_must_agree(tmp_path):
    from safetensors.torch import save as st_save

    _write(tmp_path / "a", {"document.json": _doc(), "tensors.safetensors": st_save({"v": torch.ones(1)})})
    with pytest.raises(ArchiveError, match="holds \\['v'\\], the manifest names \\['w'\\]"):
        load(tmp_path / "a")
    _write(tmp_path / "b", {"document.json": _doc()}, tensors=["w"])
    with pytest.raises(ArchiveError, match=r"tensors\.safetensors is missing"):
        load(tmp_path / "b", check_hash=False)


def test_deeply_nested_documents_are_refused(tmp_path):
    arg: S.Argument = S.Int(value=1)
    for _ in range(40):
        arg = S.ListArg(items=(arg,))
    _write(tmp_path / "a", {"document.json": _doc(_graph_with(_relu(args=(S.TensorRef(name="x"), arg))))})
    with pytest.raises(ArchiveError, match="nest 40 deep"):
        load(tmp_path / "a")
    text = b'{"type":"int","value":1}'
    for _ in range(5000):
        text = b'{"type":"list","items":[' + text + b"]}"
    _write(tmp_path / "b", {"document.json": b'{"nodes":[{"name":"n","op":"aten.relu.default","args":['
                                             + text + b"]}]}"})
    with pytest.raises(ArchiveError, match="nests too deeply"):
        load(tmp_path / "b")


def test_kind_mismatch_is_a_clear_error():
    with pytest.raises(ArchiveError, match="holds a program, not a graph"):
        load(fixture_path("program_add_relu"), kind="graph")


@pytest.mark.parametrize("expr", ["s0//(s0-s0)", "(" * 100 + "1" + ")" * 100, "+".join(["s0"] * 400),
                                  "9" * 50, "s0\n+1", "s0 % 0"])
def test_hostile_expressions_raise_expr_error(expr):
    with pytest.raises(ExprError):
        evaluate(expr, {"s0": 3})


# ----------------------------------------------------------------------------- stored weights


def _bias_graph():
    lin = torch.nn.Linear(3, 2)
    g, _ = trace(lambda x, w, b: torch.nn.functional.linear(x, w, b), torch.randn(4, 3), lin.weight, lin.bias)
    kinds = ("user_input", "parameter", "parameter")
    inputs = tuple(msgspec.structs.replace(i, kind=k, target=t)
                   for i, k, t in zip(g.inputs, kinds, (None, "weight", "bias"), strict=True))
    return msgspec.structs.replace(g, inputs=inputs), lin


def test_stored_weights_must_have_the_declared_shape_and_dtype(tmp_path):
    g, lin = _bias_graph()
    save(g, tmp_path / "bad_shape", tensors={"weight": lin.weight, "bias": torch.zeros(1)})
    with pytest.raises(ArchiveError, match=r"stored tensor 'bias'.*shape \[1\], the graph declares \[2\]"):
        load_archive(tmp_path / "bad_shape")
    save(g, tmp_path / "bad_dtype", tensors={"weight": lin.weight.double(), "bias": lin.bias})
    with pytest.raises(ArchiveError, match="dtype float64, the graph declares float32"):
        load_archive(tmp_path / "bad_dtype")
    save(g, tmp_path / "missing", tensors={"weight": lin.weight})
    arc = load_archive(tmp_path / "missing")
    with pytest.raises(ArchiveError, match=r"no stored tensor for parameter input .* \(target 'bias'\)"):
        bind_weights(arc.document, arc.tensors)


def test_stored_weights_take_the_declared_layout(tmp_path):
    g, lin = _bias_graph()
    w = g.inputs[1].name
    g = msgspec.structs.replace(g, values={**g.values, w: msgspec.structs.replace(g.values[w], strides=(1, 2))})
    save(g, tmp_path / "a", tensors={"weight": lin.weight, "bias": lin.bias})
    weights = bind_weights(*(lambda a: (a.document, a.tensors))(load_archive(tmp_path / "a")))
    assert weights[w].stride() == (1, 2) and torch.equal(weights[w], lin.weight)


# ----------------------------------------------------------------------------- inputs


def test_run_checks_rank_dtype_and_sizes():
    g, _ = trace(lambda x: x * 2, torch.randn(4, 3))
    with pytest.raises(InputError, match=r"input 0 \('arg0'\): expected dtype float32, got torch.float64") as e:
        run(g, torch.randn(4, 3, dtype=torch.float64))
    assert e.value.index == 0
    with pytest.raises(InputError, match=r"expected 2 dimensions \(4, 3\), got shape \(12,\)"):
        run(g, torch.randn(12))
    with pytest.raises(InputError, match=r"expected shape \(4, 3\) = \(4, 3\), got \(2, 3\)"):
        run(g, torch.randn(2, 3))
    with pytest.raises(InputError, match="takes 1 inputs"):
        run(g)
    with pytest.raises(InputError, match="expected a tensor, got list"):
        run(g, [[1.0]])


def test_run_checks_symbol_ranges_and_symbol_guards():
    graph = load(fixture_path("symbolic_sizes"))
    s0 = graph.symbols[0]
    guard = S.SymbolGuard(expr="2 < s0", loc=S.SourceLoc(file="f.py", line=3, text="if x.shape[0] > 2:"))
    g = msgspec.structs.replace(graph, guards=(*graph.guards, guard))
    n = s0.min
    inputs = [torch.randn(*[evaluate(e, {"s0": n}) for e in g.values[i.name].sizes]) for i in g.inputs]
    with pytest.raises(InputError, match=r"captured for 2 < s0 \(from f.py:3: if x.shape\[0\] > 2:\).*s0 = 2"):
        run(g, *inputs)


def test_a_hostile_symbol_source_does_not_crash_binding():
    g, _ = trace(lambda x: x * 2, torch.randn(4))
    g = msgspec.structs.replace(g, symbols=(S.Symbol(name="s0", hint=4, source="input:99.size(0)"),
                                            S.Symbol(name="s1", hint=4, source="input:0.size(7)")))
    torch.testing.assert_close(run(g, torch.ones(4))[0], torch.full((4,), 2.0))


# ----------------------------------------------------------------------------- fuzzing


_ERRORS = (ArchiveError, FormatVersionError)  # and nothing else


def _load_any(path) -> None:
    try:
        doc = load(path, limits=ArchiveLimits(document_bytes=1 << 22, tensors_bytes=1 << 24, total_bytes=1 << 25))
    except _ERRORS:
        return
    if isinstance(doc, S.Graph):  # what loaded must verify or fail verification, and print or refuse
        try:
            verify(doc)
            to_python(doc)
        except (VerificationError, UnknownOpError):
            pass


@pytest.mark.parametrize("name", ["pointwise_chain", "matmul_weights", "program_add_relu", "symbolic_sizes"])
def test_fuzz_mutated_fixtures_raise_only_documented_errors(name, tmp_path):
    import random

    rng = random.Random(18)
    src = fixture_path(name)
    save(load_archive(src).document, tmp_path / "a.zip", tensors=load_archive(src).tensors)
    blob = (tmp_path / "a.zip").read_bytes()
    doc = json.loads((src / "document.json").read_text())
    for i in range(60):
        path = tmp_path / f"m{i}.zip"
        kind = i % 4
        if kind == 0:  # truncate
            path.write_bytes(blob[:rng.randrange(len(blob))])
        elif kind == 1:  # flip bytes
            data = bytearray(blob)
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
        else:  # drop a field or swap a type somewhere in the document, then re-hash
            mutated = json.loads(json.dumps(doc))
            _mutate(mutated, rng, drop=kind == 2)
            d = tmp_path / f"d{i}"
            _write(d, {"document.json": json.dumps(mutated).encode()},
                   kind="program" if name.startswith("program") else "graph")
            path = d
        _load_any(path)


def _mutate(node, rng, drop: bool) -> None:
    """Drop a key, or replace a value by one of another type, at a random place."""
    containers = []

    def walk(x):
        if isinstance(x, dict | list) and x:
            containers.append(x)
            for v in (x.values() if isinstance(x, dict) else x):
                walk(v)

    walk(node)
    target = rng.choice(containers)
    key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
    if drop:
        del target[key]
    else:
        target[key] = rng.choice([None, 0, -1, 2**40, "x", "s0//0", [], {}, 1.5, True, "aten.save.default"])


def test_fuzz_with_hypothesis(tmp_path_factory):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    src = fixture_path("symbolic_sizes")
    doc = (src / "document.json").read_bytes()

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(st.data())
    def check(data):
        out = bytearray(doc)
        for _ in range(data.draw(st.integers(1, 6))):
            pos = data.draw(st.integers(0, len(out) - 1))
            out[pos] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(len(out) // 2, len(out)))
        d = tmp_path_factory.mktemp("h")
        (d / "a").mkdir()
        _write_into(d / "a", bytes(out[:cut]))
        _load_any(d / "a")

    check()


def _write_into(d, document: bytes) -> None:
    files = {"document.json": document}
    body = {"format": "torchfuse.graph", "version": [1, 0], "kind": "graph", "content_hash": _content_hash(files)}
    (d / "document.json").write_bytes(document)
    (d / "manifest.json").write_text(json.dumps(body))


def test_to_fx_writes_no_keyword_or_location_from_data(marker):
    from torchfuse.graph import to_fx

    evil_kw = f"x=0, _={_payload(marker)}, y"
    with pytest.raises(VerificationError, match="not an identifier"):
        to_fx(_graph_with(_relu(kwargs={evil_kw: S.Int(value=1)})))
    with pytest.raises(VerificationError, match="not an identifier"):
        verify(_graph_with(_relu(kwargs={evil_kw: S.Int(value=1)})))
    evil = f"f\n{_payload(marker)}\n"
    gm = to_fx(_graph_with(_relu(loc=S.SourceLoc(file=evil, line=1, function=evil, text=evil))))
    torch.testing.assert_close(gm(-torch.ones(4))[0], torch.zeros(4))
