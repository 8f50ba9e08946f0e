"""Version policy: the schema gate, newer/older documents, unknown fields, upgraders."""

import copy
import inspect
import json

import msgspec
import pytest
import torch
from torchfuse.graph import archive, compat, versioning
from torchfuse.graph import schema as S
from torchfuse.graph.archive import ArchiveError, load, load_archive, save
from torchfuse.graph.versioning import (
    FORMAT_VERSION,
    FormatVersionError,
    SchemaGateError,
    check_schema,
    committed_schema,
    generate_schema,
    required_bump,
    schema_changes,
)


def test_committed_schema_matches_the_records():
    """Fails when schema.py changed without a bump; the message says which bump and how."""
    check_schema()


def test_committed_schema_checksum_and_version():
    committed, recorded = committed_schema()
    assert recorded[0] == FORMAT_VERSION[0] and not recorded > FORMAT_VERSION and not recorded < FORMAT_VERSION
    assert "Graph" in committed["$defs"] and "Program" in committed["$defs"]


def _mutated(fn):
    schema = copy.deepcopy(generate_schema())
    fn(schema["$defs"])
    return schema


def test_gate_fails_on_a_new_optional_field_without_minor_bump():
    new = _mutated(lambda d: d["Node"]["properties"].update(stream={"type": "integer", "default": 0}))
    old = generate_schema()
    assert required_bump(old, new) == "minor"
    with pytest.raises(SchemaGateError, match=r"needs a MINOR version bump: set FORMAT_VERSION = \(1, 1\)"):
        check_schema(old, (1, 0), new, (1, 0))
    with pytest.raises(SchemaGateError, match="out of date"):  # bumped, but not regenerated yet
        check_schema(old, (1, 0), new, (1, 1))


def test_gate_new_union_member_is_minor():
    def add_member(defs):
        defs["Node"]["properties"]["args"]["items"]["anyOf"].append({"$ref": "#/$defs/Complex"})
        defs["Complex"] = {"type": "object", "properties": {"re": {"type": "number"}}, "required": ["re"]}

    assert required_bump(generate_schema(), _mutated(add_member)) == "minor"


@pytest.mark.parametrize("change, what", [
    (lambda d: d["TensorMeta"]["properties"].pop("device"), "field removed"),
    (lambda d: d["TensorMeta"]["properties"].update(dtype={"type": "integer"}), "changed"),
    (lambda d: (d["Node"]["properties"].update(stream={"type": "integer"}),
                d["Node"]["required"].append("stream")), "new required field"),
    (lambda d: d["Symbol"]["properties"]["min"].update(default=1), "default changed"),
    (lambda d: d.pop("CopyStep"), "record removed"),
])
def test_gate_breaking_changes_need_a_major_bump(change, what):
    old, new = generate_schema(), _mutated(change)
    assert required_bump(old, new) == "major"
    assert any(what in msg for bump, msg in schema_changes(old, new) if bump == "major")
    with pytest.raises(SchemaGateError, match=r"needs a MAJOR version bump: set FORMAT_VERSION = \(2, 0\)"):
        check_schema(old, (1, 0), new, (1, 1))
    check_schema(new, (2, 0), new, (2, 0))  # after the bump and --write, the gate passes


def test_documentation_only_changes_need_no_bump():
    new = _mutated(lambda d: d["Node"].update(description="reworded"))
    assert required_bump(generate_schema(), new) == "none"
    with pytest.raises(SchemaGateError, match="out of date"):
        check_schema(generate_schema(), FORMAT_VERSION, new, FORMAT_VERSION)


def test_write_refuses_without_bump(tmp_path, monkeypatch):
    schema_path, sum_path = tmp_path / "s.json", tmp_path / "s.sha256.json"
    monkeypatch.setattr(versioning, "SCHEMA_PATH", schema_path)
    monkeypatch.setattr(versioning, "CHECKSUM_PATH", sum_path)
    versioning.write_schema()
    _committed, recorded = versioning.committed_schema()
    assert recorded == FORMAT_VERSION
    stale = _mutated(lambda d: d["Node"]["properties"].pop("module_path"))
    schema_path.write_text(json.dumps(stale))
    sum_path.write_text(json.dumps({"version": list(FORMAT_VERSION), "sha256": versioning.schema_sha256(stale)}))
    # the live records have a field the committed schema lacks: a minor bump is required
    with pytest.raises(SchemaGateError, match="MINOR"):
        versioning.write_schema()
    sum_path.write_text(json.dumps({"version": list(FORMAT_VERSION), "sha256": "0" * 64}))
    with pytest.raises(SchemaGateError, match="does not match the sha256"):
        versioning.committed_schema()


def test_every_struct_ignores_unknown_fields():
    structs = [obj for mod in (S, archive) for obj in vars(mod).values()
               if inspect.isclass(obj) and issubclass(obj, msgspec.Struct) and obj is not msgspec.Struct]
    assert len(structs) > 30
    for cls in structs:
        assert cls.__struct_config__.forbid_unknown_fields is False, cls


def _write_raw(path, manifest, document):
    path.mkdir()
    doc_bytes = json.dumps(document).encode()
    manifest = dict(manifest, content_hash=archive._content_hash({"document.json": doc_bytes}))
    (path / "document.json").write_bytes(doc_bytes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _simple_graph():
    from torchfuse.graph import trace

    return trace(lambda x: x.relu(), torch.randn(3))[0]


def test_newer_minor_with_unknown_fields_loads(tmp_path):
    g = _simple_graph()
    raw = json.loads(archive.to_json(g))
    raw["future_field"] = {"anything": [1, 2]}
    raw["nodes"][0]["stream"] = 3
    raw["values"][g.inputs[0].name]["layout_hint"] = "channels_last"
    manifest = {"format": "torchfuse.graph", "version": [1, FORMAT_VERSION[1] + 7], "kind": "graph",
                "producer": "future", "new_manifest_field": True}
    _write_raw(tmp_path / "a", manifest, raw)
    assert load(tmp_path / "a") == g


def test_newer_major_fails_naming_both_versions(tmp_path):
    g = _simple_graph()
    manifest = {"format": "torchfuse.graph", "version": [FORMAT_VERSION[0] + 1, 2], "kind": "graph"}
    _write_raw(tmp_path / "a", manifest, json.loads(archive.to_json(g)))
    with pytest.raises(FormatVersionError, match=rf"format version {FORMAT_VERSION[0] + 1}\.2.*"
                                                 rf"understands major version {FORMAT_VERSION[0]}"):
        load(tmp_path / "a")


def test_versions_are_never_compared_with_equality():
    import ast
    import pathlib

    import torchfuse.graph as pkg

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(o, ast.Eq | ast.NotEq) for o in node.ops):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                assert not names & {"FORMAT_VERSION", "version", "recorded", "current"}, (path, ast.unparse(node))


# ----------------------------------------------------------------------------- upgraders
# A fake "major 0" format: Node.op was called "target" and TensorMeta.shape held the sizes.


def _upgrade_0_to_1(raw, kind):
    assert kind == "graph"
    for node in raw.get("nodes", []):
        node["op"] = node.pop("target")
    for meta in raw.get("values", {}).values():
        meta["sizes"] = meta.pop("shape")
    return raw


def _major0_document(g):
    raw = json.loads(archive.to_json(g))
    for node in raw["nodes"]:
        node["target"] = node.pop("op")
    for meta in raw["values"].values():
        meta["shape"] = meta.pop("sizes")
    return raw


def test_old_major_without_upgrader_is_rejected(tmp_path):
    g = _simple_graph()
    _write_raw(tmp_path / "a", {"format": "torchfuse.graph", "version": [0, 3], "kind": "graph"},
               _major0_document(g))
    with pytest.raises(FormatVersionError, match="no upgrader from major 0 to 1"):
        load(tmp_path / "a")


def test_old_major_loads_through_registered_upgrader(tmp_path, monkeypatch):
    monkeypatch.setitem(compat.UPGRADERS, 0, _upgrade_0_to_1)
    g = _simple_graph()
    _write_raw(tmp_path / "a", {"format": "torchfuse.graph", "version": [0, 3], "kind": "graph"},
               _major0_document(g))
    loaded = load_archive(tmp_path / "a")
    assert loaded.document == g
    assert loaded.manifest.version == (0, 3)  # the manifest is reported as read
    # re-saving writes the current version
    save(loaded.document, tmp_path / "b")
    assert load_archive(tmp_path / "b").manifest.version == FORMAT_VERSION


def test_upgrader_chain_runs_in_order(monkeypatch):
    calls = []
    monkeypatch.setattr(compat, "FORMAT_VERSION", (3, 0))
    for m in range(3):
        monkeypatch.setitem(compat.UPGRADERS, m, lambda raw, kind, m=m: calls.append(m) or {**raw, f"v{m + 1}": 1})
    assert compat.upgrade({}, (0, 5)) == {"v1": 1, "v2": 1, "v3": 1}
    assert calls == [0, 1, 2]
    monkeypatch.delitem(compat.UPGRADERS, 1)
    with pytest.raises(FormatVersionError, match="no upgrader from major 1 to 2"):
        compat.upgrade({}, (0, 0))


def test_invalid_upgraded_document_is_an_archive_error(tmp_path, monkeypatch):
    monkeypatch.setitem(compat.UPGRADERS, 0, lambda raw, kind: raw)  # forgets to rename
    _write_raw(tmp_path / "a", {"format": "torchfuse.graph", "version": [0, 1], "kind": "graph"},
               _major0_document(_simple_graph()))
    with pytest.raises(ArchiveError, match="upgraded graph document is invalid"):
        load(tmp_path / "a")


def test_module_entry_point_checks(capsys):
    assert versioning.main([]) == 0
    assert "up to date" in capsys.readouterr().out
