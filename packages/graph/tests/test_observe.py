"""The debug folder's names and the stage timings table (``torchfuse.graph.observe``)."""

from __future__ import annotations

import json

from torchfuse.graph import observe


class Owner:
    """Stands for a compiled function (anything weakly referenceable)."""


def test_entry_folders_are_never_handed_out_twice(monkeypatch):
    monkeypatch.delenv("TORCHFUSE_DEBUG", raising=False)
    observe.reload_config()
    a, b = Owner(), Owner()
    assert observe.entry_folder(a, "f") == "f/entry_0"
    assert observe.entry_folder(a, "f") == "f/entry_1"  # a recompile
    assert observe.entry_folder(b, "f") == "f_2/entry_0"  # another function of the same name
    assert observe.entry_folder(a, "f") == "f/entry_2"
    assert observe.entry_folder(Owner(), "<lambda>") == "lambda/entry_0"
    assert observe.entry_folder(Owner(), "f_2") == "f_2_2/entry_0"  # taken by b's folder
    assert observe.entry_folder(Owner(), "<>") == "graph/entry_0"


def test_timings_go_to_json_and_text_per_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_DEBUG", "1")
    monkeypatch.setenv("TORCHFUSE_DEBUG_DIR", str(tmp_path))
    observe.reload_config()
    try:
        with observe.compiling("f/entry_0"):
            observe.record_time("capture", 0.5)
            observe.record_time("inductor.schedule", 0.25)
            observe.record_time("inductor.schedule", 0.25)
        with observe.compiling("f/entry_0", role="backward"):
            observe.record_time("inductor.codegen", 0.125)
        with observe.compiling("f/entry_1"):
            observe.record_time("capture", 2.0)
    finally:
        monkeypatch.delenv("TORCHFUSE_DEBUG")
        observe.reload_config()
    (run,) = tmp_path.iterdir()
    first = json.loads((run / "f/entry_0/timings.json").read_text())
    assert first == {"stages_s": {"capture": 0.5, "inductor.schedule": 0.5,
                                  "backward.inductor.codegen": 0.125}, "total_s": 1.125}
    text = (run / "f/entry_0/timings.txt").read_text()
    assert text.splitlines()[0].split() == ["stage", "ms"]
    assert "inductor.schedule" in text and "backward.inductor" in text
    assert text.splitlines()[-1].split() == ["total", "1125.00"]
    second = json.loads((run / "f/entry_1/timings.json").read_text())
    assert second["stages_s"] == {"capture": 2.0}


def test_format_timings_groups_by_package():
    text = observe.format_timings({"capture": 0.001, "aot.joint": 0.002, "aot.partition": 0.003})
    lines = text.splitlines()
    assert lines[1].split() == ["capture", "1.00"]
    assert ["aot", "5.00"] in [line.split() for line in lines]
    assert lines[-1].split() == ["total", "6.00"]


def test_collect_without_artifacts_keeps_timings_and_renders_nothing(monkeypatch):
    monkeypatch.delenv("TORCHFUSE_DEBUG", raising=False)
    monkeypatch.delenv("TORCHFUSE_LOGS", raising=False)
    observe.reload_config()
    assert not observe.keeps_timings()
    with observe.collect(artifacts=False) as sink:
        assert observe.keeps_timings() and not observe.wants_artifacts()
        with observe.compiling("g/entry_0"):
            observe.record_time("capture", 0.25)
            observe.record_count("inductor.cache.program_hits")
            observe.emit("graph.py", "print('not kept')")
        assert observe.timings_of("g/entry_0") == ({"capture": 0.25}, {"inductor.cache.program_hits": 1})
    assert sink.artifacts == [] and not observe.keeps_timings()
    with observe.collect() as full:
        assert observe.wants_artifacts()
        with observe.compiling("g/entry_0"):
            observe.emit("graph.py", "x = 1")
    assert full.get("graph.py") == "x = 1"
    observe.reload_config()
