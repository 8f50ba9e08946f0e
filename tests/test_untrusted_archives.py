"""Exported archives from a stranger: ``Exported.load`` and ``Exported.run`` check what they get.

The graph-level attacks are in ``packages/graph/tests/test_hostile_archives.py`` and the
Program ones in ``packages/runtime/tests/test_hostile_programs.py``; these are the ones that
need capture's ``export``.
"""

from __future__ import annotations

import json

import pytest
import torch
from torchfuse.capture import export
from torchfuse.capture.export import Exported
from torchfuse.graph import ArchiveError, InputError
from torchfuse.graph.fixtures import fixture_path


def _branchy(x):
    if x.shape[0] > 2:  # folded away at export: the graph holds only this branch
        return x * 2
    return x - 1


def test_run_refuses_inputs_the_graph_was_not_captured_for(tmp_path):
    exported = export(_branchy, torch.randn(4, 3))
    exported.save(tmp_path / "a.zip")
    loaded = Exported.load(tmp_path / "a.zip")
    x = torch.randn(4, 3)
    torch.testing.assert_close(loaded.run(x), x * 2)
    with pytest.raises(InputError, match=r"expected shape \(4, 3\) = \(4, 3\), got \(2, 3\)"):
        loaded.run(torch.randn(2, 3))  # eager takes the other branch: never a silent wrong answer
    with pytest.raises(InputError, match="expected 2 dimensions"):
        loaded.run(torch.randn(12))
    with pytest.raises(InputError, match=r"expected dtype float32, got torch\.float64"):
        loaded.run(torch.randn(4, 3, dtype=torch.float64))


def test_load_checks_the_stored_weights(tmp_path):
    model = torch.nn.Linear(3, 2)
    export(model, torch.randn(4, 3)).save(tmp_path / "m")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    x = torch.randn(4, 3)
    torch.testing.assert_close(Exported.load(tmp_path / "m").run(x), model(x))
    from safetensors.torch import load_file, save_file
    from torchfuse.graph.archive import _content_hash

    tensors = load_file(tmp_path / "m" / "tensors.safetensors")
    bias = next(k for k, v in tensors.items() if v.shape == (2,))

    def rewrite(new: dict[str, torch.Tensor]) -> None:
        save_file(new, tmp_path / "m" / "tensors.safetensors")
        files = {n: (tmp_path / "m" / n).read_bytes() for n in ("document.json", "tensors.safetensors")}
        (tmp_path / "m" / "manifest.json").write_text(json.dumps(
            {**manifest, "content_hash": _content_hash(files), "tensors": sorted(new)}))

    rewrite({**tensors, bias: torch.zeros(1)})  # broadcast silently before
    with pytest.raises(ArchiveError, match=r"shape \[1\], the graph declares \[2\]"):
        Exported.load(tmp_path / "m")
    rewrite({k: v for k, v in tensors.items() if k != bias})  # a bare KeyError before
    with pytest.raises(ArchiveError, match="no stored tensor for parameter input"):
        Exported.load(tmp_path / "m")


def test_load_of_a_program_archive_is_a_clear_error():
    with pytest.raises(TypeError, match="holds a Program, not an exported Graph"):
        Exported.load(fixture_path("program_add_relu"))
