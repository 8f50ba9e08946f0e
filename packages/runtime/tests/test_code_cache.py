"""The code cache: a second process's compile of the same generated source is a file read."""

from __future__ import annotations

import marshal
import subprocess
import sys

import pytest
from torchfuse.runtime import code_cache
from torchfuse.runtime.code_cache import code_path, compile_cached

SOURCE = "def f(x):\n    return x * 3 + 1\n"


def _run(code):
    ns = {}
    exec(code, ns)
    return ns["f"]


def test_the_second_compile_reads_the_code_object_the_first_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(code_cache, "stats", {"hits": 0, "misses": 0})
    first = compile_cached(SOURCE, "<gen:a>", tmp_path)
    assert code_path(SOURCE, "<gen:a>", tmp_path).is_file()
    second = compile_cached(SOURCE, "<gen:a>", tmp_path)
    assert code_cache.stats == {"hits": 1, "misses": 1}
    assert second is not first and second == first
    assert _run(second)(2) == 7 and second.co_filename == "<gen:a>"


def test_another_name_or_another_source_is_another_entry(tmp_path):
    compile_cached(SOURCE, "<gen:a>", tmp_path)
    other = SOURCE.replace("3", "5")
    assert _run(compile_cached(other, "<gen:a>", tmp_path))(2) == 11
    assert compile_cached(SOURCE, "<gen:b>", tmp_path).co_filename == "<gen:b>"
    assert len(list(tmp_path.iterdir())) == 3


@pytest.mark.parametrize("content", [b"", b"\x00garbage", marshal.dumps(42)])
def test_an_unreadable_or_foreign_entry_is_compiled_over(tmp_path, content):
    path = code_path(SOURCE, "<gen:a>", tmp_path)
    path.write_bytes(content)
    assert _run(compile_cached(SOURCE, "<gen:a>", tmp_path))(1) == 4
    assert marshal.loads(path.read_bytes()) == compile(SOURCE, "<gen:a>", "exec"), "rewritten"


def test_an_entry_under_another_file_name_is_not_taken(tmp_path):
    path = code_path(SOURCE, "<gen:a>", tmp_path)
    path.write_bytes(marshal.dumps(compile("def f(x):\n    return 0\n", "<elsewhere>", "exec")))
    assert _run(compile_cached(SOURCE, "<gen:a>", tmp_path))(1) == 4


def test_a_syntax_error_is_raised_and_nothing_is_written(tmp_path):
    with pytest.raises(SyntaxError):
        compile_cached("def f(:\n", "<gen:bad>", tmp_path)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_an_unwritable_folder_only_costs_the_compile(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert _run(compile_cached(SOURCE, "<gen:a>", blocked / "code"))(0) == 1


def test_a_fresh_process_reads_what_this_one_wrote(tmp_path):
    compile_cached(SOURCE, "<gen:a>", tmp_path)
    probe = ("import sys; from torchfuse.runtime import code_cache as c; from pathlib import Path; "
             f"code = c.compile_cached({SOURCE!r}, '<gen:a>', Path(sys.argv[1])); "
             "ns = {}; exec(code, ns); print(ns['f'](2), c.stats['hits'], c.stats['misses'])")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["7", "1", "0"]


def test_a_kernel_module_imported_again_takes_its_bytecode_from_the_cache(tmp_path, monkeypatch):
    import torch
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import kernels as rk

    graph, _ = trace(lambda a: torch.relu(a * 2.0 + 1.0), torch.randn(8))
    (kernel,) = [k for k in compile_graph(graph, options={"cache": False, "cpu_backend": "triton"}).kernels
                 if k.language == "triton"]
    monkeypatch.setattr(code_cache, "stats", {"hits": 0, "misses": 0})
    for _ in range(2):  # as two processes would: nothing imported in memory yet
        monkeypatch.setattr(rk, "_modules", {})
        monkeypatch.setattr(rk, "_shared", {})
        fn = rk.load_kernel(kernel, tmp_path)
    assert code_cache.stats == {"hits": 1, "misses": 1}
    assert rk.param_names(fn)[0] == kernel.signature[0].name
    assert list((tmp_path / "code").glob("*.code"))


def test_a_call_function_is_found_whatever_was_generated_before_it(monkeypatch):
    """A cold first call that tuned generated a tuning variant first; the warm start tunes
    nothing: the final function must still be the same cache entry."""
    import torch
    from torchfuse.graph import trace
    from torchfuse.inductor import compile_graph
    from torchfuse.runtime import load

    graph, _ = trace(lambda a: torch.relu(a * 2.0 + 1.0), torch.randn(8))
    program = compile_graph(graph, options={"cache": False})
    x = torch.randn(8)
    monkeypatch.setattr(code_cache, "stats", {"hits": 0, "misses": 0})
    cold = load(program, device="cpu")
    cold.stats.generated = 2  # as after a tuning variant
    torch.testing.assert_close(cold(x)[0], torch.relu(x * 2.0 + 1.0))
    warm = load(program, device="cpu")
    torch.testing.assert_close(warm(x)[0], torch.relu(x * 2.0 + 1.0))
    assert code_cache.stats == {"hits": 1, "misses": 1}
