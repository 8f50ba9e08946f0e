"""The cache-directory rules every package shares (`torchfuse.graph.caches`)."""

from __future__ import annotations

import pytest
from torchfuse.graph.caches import cache_root, write_atomic


def test_the_cache_root_follows_the_variables(tmp_path):
    assert cache_root({"TORCHFUSE_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "torchfuse"


def test_write_atomic_makes_the_folders_and_leaves_only_the_file(tmp_path):
    path = tmp_path / "a" / "b" / "entry.json"
    write_atomic(path, "first")
    write_atomic(path, b"second")
    assert path.read_text() == "second"
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_a_failed_write_raises_and_leaves_nothing_behind(tmp_path):
    blocked = tmp_path / "entry"
    blocked.mkdir()  # os.replace cannot put a file where a folder is
    (blocked / "inside").write_text("x")
    with pytest.raises(OSError):
        write_atomic(blocked, "data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]
