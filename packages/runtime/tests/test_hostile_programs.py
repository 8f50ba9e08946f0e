"""Hostile Programs: loading, verifying and running one never runs code from it.

Each test writes its Program as an archive in a temporary folder, loads it with
``torchfuse.runtime.load`` and asserts the specific error; a marker file that the payload
would create must not exist afterwards. See "Trust model" in ``docs/format.md``.
"""

from __future__ import annotations

import json

import msgspec
import pytest
import runtime_programs as P
import torch
from torchfuse.graph import VerificationError, save, verify_program
from torchfuse.graph import schema as S
from torchfuse.runtime import CorruptArchiveError, InvalidProgramError, UntrustedCodeError, load

pytestmark = pytest.mark.filterwarnings("ignore:torchfuse.runtime. running Triton kernels")

replace = msgspec.structs.replace


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "code from the Program ran"


def _payload(marker) -> str:
    return f"open({str(marker)!r}, 'w').write('x')"


def _program(**kernel_changes) -> S.Program:
    prog = P.scale_program("cpu")
    return replace(prog, kernels=(replace(prog.kernels[0], **kernel_changes),))


def _archive(tmp_path, program: S.Program):
    return save(program, tmp_path / "evil.zip")


def _load_and_call(path):
    fn = load(path, device="cpu")
    return fn(torch.ones(100))


def test_a_kernel_source_is_not_imported_unless_it_has_the_accepted_form(tmp_path, marker):
    source = P.SCALE_SRC + f"\n{_payload(marker)}\n"
    path = _archive(tmp_path, _program(source=source))
    with pytest.raises(UntrustedCodeError, match=r"kernel 'scale': refusing to import its source.*top-level Expr"):
        load(path, device="cpu")
    with pytest.raises(VerificationError, match="top-level Expr statement"):
        verify_program(_program(source=source))


@pytest.mark.parametrize("body", [
    "    tl.core.builtins.exec({payload!r})",
    "    tl.load.__globals__['__builtins__']['exec']({payload!r})",
    "    triton.runtime.driver.active",
    "    x = open({marker!r}, 'w')",
    "    m = tl\n    m.core",
])
def test_kernel_bodies_reach_no_python_escape(tmp_path, marker, body):
    line = body.format(payload=_payload(marker), marker=str(marker))
    source = P.SCALE_SRC.replace("    mask = offs < n\n", f"    mask = offs < n\n{line}\n")
    with pytest.raises(UntrustedCodeError):
        _load_and_call(_archive(tmp_path, _program(source=source)))


def test_trust_code_is_the_explicit_opt_in(tmp_path, marker):
    source = P.SCALE_SRC + f"\n{_payload(marker)}\n"
    path = _archive(tmp_path, _program(source=source))
    load(path, device="cpu", trust_code=True)
    assert marker.exists()  # imported, as asked
    marker.unlink()


def test_a_kernel_name_is_never_pasted_into_the_call_function(tmp_path, marker):
    evil = f"scale\n{_payload(marker)}\n#"
    prog = _program(name=evil, entry="scale")
    prog = replace(prog, steps=(prog.steps[0], replace(prog.steps[1], kernel=evil)))
    with pytest.raises(VerificationError, match=r"kernel name .* is not an identifier"):
        verify_program(prog)
    with pytest.raises(InvalidProgramError, match=r"kernel name .* is not an identifier"):
        _load_and_call(_archive(tmp_path, prog))


@pytest.mark.parametrize("where", ["config", "constexpr"])
def test_launch_config_keys_are_identifiers(tmp_path, marker, where):
    key = f"XBLOCK=32, _={_payload(marker)}, Y"
    if where == "config":
        prog = _program(configs=(S.LaunchConfig(meta={key: 32}),))
    else:
        prog = _program(constexprs={key: 1})
    with pytest.raises(VerificationError, match="is not an identifier"):
        verify_program(prog)
    with pytest.raises(InvalidProgramError, match="is not an identifier"):
        _load_and_call(_archive(tmp_path, prog))


@pytest.mark.parametrize("size, match", [
    ("s0//(s0-s0)", "division by zero"), (-5, "expected >= 0"), ("s0 - 200", "is -100"),
    ("s0\n+ 1", "unexpected character"), ("undeclared", "unbound symbol")])
def test_buffer_sizes_must_evaluate_to_non_negative_ints(tmp_path, size, match):
    prog = P.scale_program("cpu")
    buf = replace(prog.buffers[1], sizes=(size,))
    prog = replace(prog, buffers=(prog.buffers[0], buf))
    with pytest.raises(VerificationError, match=match):
        verify_program(prog)
    with pytest.raises(InvalidProgramError, match=match):
        load(_archive(tmp_path, prog), device="cpu")


def test_extern_ops_resolve_only_to_real_operators(tmp_path, marker):
    prog = P.scale_program("cpu")
    for op in ("import_module.__call__.__call__", "aten.from_file.default"):
        step = S.ExternStep(op=op, args=(S.Str(value=str(marker)),), outputs=("buf1",))
        bad = replace(prog, steps=(*prog.steps, step),
                      buffers=(*prog.buffers, P._buf("buf1", (1,), (1,), "cpu")))
        with pytest.raises(InvalidProgramError, match="extern step"):
            load(_archive(tmp_path, bad), device="cpu")


def test_a_program_archive_without_content_hash_is_refused(tmp_path):
    path = save(P.scale_program("cpu"), tmp_path / "a")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["content_hash"] = ""
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptArchiveError, match="no content_hash"):
        load(path, device="cpu")


def test_a_valid_program_still_runs(tmp_path):
    out = _load_and_call(_archive(tmp_path, P.scale_program("cpu")))
    torch.testing.assert_close(out[0], torch.full((100,), 0.5))


def test_layout_names_are_real_ones(tmp_path):
    prog = P.scale_program("cpu")
    step = S.ExternStep(op="aten.empty_like.default", args=(S.TensorRef(name="x"),),
                        kwargs={"layout": S.LayoutArg(name="load")}, outputs=("buf1",))
    bad = replace(prog, steps=(*prog.steps, step), buffers=(*prog.buffers, P._buf("buf1", ("s0",), (1,), "cpu")))
    with pytest.raises(InvalidProgramError, match="unknown layout 'load'"):
        load(_archive(tmp_path, bad), device="cpu")
