"""Archives: round trips (object and bytes, dir and zip), no pickle, damaged archives."""

import json
import pickle
import zipfile

import pytest
import torch
from torchfuse.graph import ArchiveError, load, load_archive, save, trace
from torchfuse.graph.archive import from_json, save_bytes, to_json
from torchfuse.graph.fixtures import fixture_names, fixture_path

FIXTURES = fixture_names()


def _resave(path, out):
    arch = load_archive(path)
    producer = (arch.manifest.producer, arch.manifest.producer_version)
    return save(arch.document, out, tensors=arch.tensors, producer=producer)


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("name", FIXTURES)
def test_object_archive_object_equal(name, tmp_path):
    arch = load_archive(fixture_path(name))
    for target in (tmp_path / "d", tmp_path / "a.zip"):
        save(arch.document, target, tensors=arch.tensors)
        back = load_archive(target)
        assert back.document == arch.document
        assert back.tensors.keys() == arch.tensors.keys()
        for k, v in arch.tensors.items():
            assert torch.equal(back.tensors[k], v) and back.tensors[k].dtype == v.dtype
    assert from_json(to_json(arch.document), arch.manifest.kind) == arch.document


@pytest.mark.parametrize("name", FIXTURES)
def test_archive_archive_byte_identical(name, tmp_path):
    committed = fixture_path(name)
    _resave(committed, tmp_path / "d")
    assert _files(tmp_path / "d") == _files(committed)  # the frozen files, byte for byte
    _resave(committed, tmp_path / "a.zip")
    _resave(tmp_path / "a.zip", tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    _resave(tmp_path / "b.zip", tmp_path / "e")
    assert _files(tmp_path / "e") == _files(committed)


def test_save_bytes_equals_zip_file(tmp_path):
    g, _ = trace(lambda x: x * 2, torch.randn(3))
    save(g, tmp_path / "a.zip", tensors={"w": torch.ones(2)})
    assert save_bytes(g, {"w": torch.ones(2)}) == (tmp_path / "a.zip").read_bytes()


def test_loading_never_unpickles(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading an archive")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    for name in FIXTURES:
        load_archive(fixture_path(name))


def test_tied_weights_are_saved(tmp_path):
    g, _ = trace(lambda x: x + 1, torch.randn(3))
    w = torch.randn(4)
    save(g, tmp_path / "d", tensors={"a": w, "b": w, "c": w[:2]})
    t = load_archive(tmp_path / "d").tensors
    assert torch.equal(t["a"], w) and torch.equal(t["b"], w) and torch.equal(t["c"], w[:2])


def test_resaving_a_directory_without_tensors_drops_stale_ones(tmp_path):
    g, _ = trace(lambda x: x + 1, torch.randn(3))
    save(g, tmp_path / "d", tensors={"w": torch.ones(2)})
    save(g, tmp_path / "d")
    assert load_archive(tmp_path / "d").tensors == {}


# ----------------------------------------------------------------------------- damage


@pytest.fixture
def good_zip(tmp_path):
    return _resave(fixture_path("matmul_weights"), tmp_path / "good.zip")


def test_truncated_zip(good_zip, tmp_path):
    data = good_zip.read_bytes()
    for cut in (len(data) // 2, len(data) - 30, 10):
        bad = tmp_path / f"cut{cut}.zip"
        bad.write_bytes(data[:cut])
        with pytest.raises(ArchiveError, match="zip"):
            load(bad)


def test_corrupted_zip_member(good_zip, tmp_path):
    data = bytearray(good_zip.read_bytes())
    with zipfile.ZipFile(good_zip) as zf:
        info = zf.getinfo("tensors.safetensors")
    start = info.header_offset + 30 + len(info.filename) + 5
    data[start:start + 20] = bytes(20)
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArchiveError):
        load(bad)


def test_missing_manifest(tmp_path):
    _resave(fixture_path("reduction"), tmp_path / "d")
    (tmp_path / "d" / "manifest.json").unlink()
    with pytest.raises(ArchiveError, match=r"manifest\.json or document\.json missing"):
        load(tmp_path / "d")


def test_not_an_archive(tmp_path):
    with pytest.raises(ArchiveError, match="no archive"):
        load(tmp_path / "nothing")
    (tmp_path / "x.zip").write_text("hello")
    with pytest.raises(ArchiveError, match="neither a directory nor a readable zip"):
        load(tmp_path / "x.zip")


@pytest.mark.parametrize("damage, match", [
    (lambda d: (d / "document.json").write_text('{"name": "g", "nodes": [}'), "content hash mismatch"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json is damaged"),
    (lambda d: (d / "manifest.json").write_text("[1, 2]"), "not a JSON object"),
    (lambda d: (d / "tensors.safetensors").write_bytes(b"\x00" * 16), "content hash mismatch"),
])
def test_damaged_files(tmp_path, damage, match):
    _resave(fixture_path("matmul_weights"), tmp_path / "d")
    damage(tmp_path / "d")
    with pytest.raises(ArchiveError, match=match):
        load(tmp_path / "d")


def _drop_hash(d):
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["content_hash"] = ""
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_bad_json_and_bad_tensors_without_hash(tmp_path):
    _resave(fixture_path("matmul_weights"), tmp_path / "d")
    _drop_hash(tmp_path / "d")
    with pytest.raises(ArchiveError, match="no content_hash"):  # required unless opted out
        load(tmp_path / "d")
    (tmp_path / "d" / "tensors.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ArchiveError, match=r"tensors\.safetensors is damaged"):
        load(tmp_path / "d", check_hash=False)
    _resave(fixture_path("reduction"), tmp_path / "e")
    _drop_hash(tmp_path / "e")
    (tmp_path / "e" / "document.json").write_text('{"name": "g", "nodes": [}')
    with pytest.raises(ArchiveError, match="not valid JSON"):
        load(tmp_path / "e", check_hash=False)
    (tmp_path / "e" / "document.json").write_text('{"name": 3}')
    with pytest.raises(ArchiveError, match="invalid graph document"):
        load(tmp_path / "e", check_hash=False)
