"""The meta-kernel memo on disk (`torchfuse.graph.meta_memo_store`): a fresh memo reading the
file answers what the saving one learned, with equal entries; a file that is not ours (corrupt,
another version, malformed answers, too large) is ignored with one warning and replaced; a
cache directory that cannot be written costs nothing but the file."""

from __future__ import annotations

import atexit
import warnings

import msgspec
import pytest
import torch
from torchfuse.graph import meta_memo_store as store_mod
from torchfuse.graph import tracing
from torchfuse.graph.meta_memo import MetaMemo
from torchfuse.graph.meta_memo_store import MemoStore, default_directory
from torchfuse.graph.tracing import GraphBuilder, Recorder

W = torch.randn(8)  # a real tensor: recorded as a constant input, keyed by its metadata


def _program(x, y):
    """Calls whose keys hold every kind of argument the file spells."""
    a = torch.ops.aten.add.Tensor(x, y, alpha=2)                       # an int kwarg
    b = a * 2 + a * 2.5 + a * True                                     # int, float, bool scalars
    c = torch.cat([b, x], dim=0)                                       # a list of tensors
    d = torch.nn.functional.gelu(c, approximate="tanh")                # a str
    e = torch.clamp(d, None, 1.0)                                      # None
    f = e.to(torch.float64)                                            # a dtype
    g = torch.empty_like(x.reshape(4, 2, 2, 2), memory_format=torch.channels_last)  # a memory format
    h = torch.zeros((2, 3), dtype=torch.int32, layout=torch.strided, device="cpu")  # layout, device
    var, mean = torch.var_mean(f, dim=[1], correction=1, keepdim=True)  # a tuple of outputs
    return var, mean, g, h, d * W                                      # a real tensor


def _examples():
    return torch.zeros(4, 8), torch.zeros(4, 8)


def _trace(memo: MetaMemo | None, fn=_program, examples=None):
    examples = examples or _examples()
    rec = Recorder(GraphBuilder("g"))
    rec.meta_memo = memo
    with rec:
        fakes = [rec.input(e, name=f"arg{i}") for i, e in enumerate(examples)]
        result = fn(*fakes)
    for r in result:
        rec.output(r)
    return rec.builder.build()


def _same(a, b) -> bool:
    return (a.metas, a.devices, a.container) == (b.metas, b.devices, b.container)


@pytest.fixture
def ran(monkeypatch):
    """The ops whose meta kernels run, by name."""
    names: list[str] = []
    real = tracing._run_on_meta

    def counting(func, args, kwargs):
        names.append(str(func))
        return real(func, args, kwargs)

    monkeypatch.setattr(tracing, "_run_on_meta", counting)
    return names


def test_round_trip(tmp_path, ran):
    first = MetaMemo(store=MemoStore(tmp_path))
    graph = _trace(first)
    assert first.misses > 5
    assert first.save() == len(first._entries)
    assert first.save() == 0, "nothing new since"

    second = MetaMemo(store=MemoStore(tmp_path))
    for key, entry in first._entries.items():
        got = second.get(key)
        assert got is not None and _same(got, entry), key[0]
    assert second.disk_hits == second.hits == len(first._entries)

    # a fresh process: every call the first one answered is answered from the file, and the
    # graph is the one every meta kernel makes
    third = MetaMemo(store=MemoStore(tmp_path))
    ran.clear()
    again = _trace(third)
    assert third.misses == 0 and third.disk_hits == len(first._entries)
    memoized = {str(k[0]) for k in first._entries}
    assert not memoized & set(ran), "a meta kernel ran for a call the file answers"
    plain = _trace(None)
    for field in ("inputs", "outputs", "nodes", "values"):
        assert getattr(again, field) == getattr(plain, field) == getattr(graph, field), field


def test_saving_merges_with_what_another_process_wrote(tmp_path):
    one, two = MetaMemo(store=MemoStore(tmp_path)), MetaMemo(store=MemoStore(tmp_path))
    _trace(one)
    _trace(two, lambda x: [x.sin()], [torch.randn(3)])
    n = one.save()
    assert two.save() == n + 1
    fresh = MetaMemo(store=MemoStore(tmp_path))
    for key in (*one._entries, *two._entries):
        assert fresh.get(key) is not None


def test_capacity_keeps_the_newest(tmp_path):
    memo = MetaMemo(capacity=4, store=MemoStore(tmp_path))
    for n in range(1, 7):
        _trace(memo, lambda x: [x.sin()], [torch.randn(n)])
        memo.save()
    records = MemoStore(tmp_path).read()
    assert [r.args[0].sizes for r in records] == [(3,), (4,), (5,), (6,)]


def _warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _saved(tmp_path, **versions) -> MemoStore:
    memo = MetaMemo(store=MemoStore(tmp_path, **versions))
    _trace(memo)
    memo.save()
    return memo.store  # type: ignore[return-value]


def _deep(store: MemoStore, depth: int) -> bytes:
    """A file whose one record's argument is a list nested ``depth`` deep."""
    enc = msgspec.msgpack.encode
    seq = b"\x93\xa1s\xc2\x91" * depth + b"\x93\xa1s\xc2\x90"  # ["s", false, [...]]
    out = enc(store_mod._Out("float32", (3,), (1,), "cpu", False))
    record = b"\x95" + enc("aten.sin.default") + b"\x91" + seq + b"\x90\x91" + out + enc("")
    return b"\x92" + enc(store.header()) + b"\x91" + record


@pytest.mark.parametrize("data", [b"", b"\x00garbage\xff" * 10, b"\x92\x01\x02", b"\x91" * 100_000,
                                  "deep"])
def test_a_corrupt_file_is_ignored_with_one_warning_and_replaced(tmp_path, data):
    store = MemoStore(tmp_path)
    if data == "deep":
        data = _deep(store, 100_000)  # past any recursion limit
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(data)
    memo = MetaMemo(store=store)
    graph, messages = _warnings(lambda: _trace(memo))
    assert len(messages) == 1 and str(store.path) in messages[0]
    assert memo.disk_hits == 0
    assert graph.nodes == _trace(None).nodes
    assert memo.save() > 0  # replaced
    fresh = MetaMemo(store=MemoStore(tmp_path))
    _, messages = _warnings(lambda: _trace(fresh))
    assert not messages and fresh.misses == 0


def test_a_file_of_another_version_inside_is_ignored_with_a_warning(tmp_path):
    other = _saved(tmp_path / "other", torch_version="1.0.0")
    ours = MemoStore(tmp_path)
    ours.path.parent.mkdir(parents=True, exist_ok=True)
    ours.path.write_bytes(other.path.read_bytes())  # our name, another torch inside
    memo = MetaMemo(store=ours)
    _, messages = _warnings(lambda: _trace(memo))
    assert len(messages) == 1 and "torch '1.0.0'" in messages[0] and str(ours.path) in messages[0]
    assert memo.disk_hits == 0


def test_another_torch_version_is_never_read(tmp_path):
    other = _saved(tmp_path, torch_version="1.0.0")
    ours = MemoStore(tmp_path)
    assert other.path != ours.path and other.path.parent == ours.path.parent
    assert "1.0.0" in other.path.name and str(torch.__version__) in ours.path.name
    memo = MetaMemo(store=ours)
    _, messages = _warnings(lambda: _trace(memo))
    assert not messages and memo.disk_hits == 0 and memo.misses > 0


def test_another_source_of_torchfuse_graph_is_not_read(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(store_mod, "source_digest", lambda: "0123456789abcdef")
        _saved(tmp_path)
    memo = MetaMemo(store=MemoStore(tmp_path))
    _, messages = _warnings(lambda: _trace(memo))
    assert not messages and memo.disk_hits == 0  # an upgrade, not a problem: no warning
    memo.save()
    assert MemoStore(tmp_path).read()  # replaced by this source's answers


def test_a_file_too_large_is_not_read(tmp_path, monkeypatch):
    store = _saved(tmp_path)
    monkeypatch.setattr(store_mod, "MAX_FILE_BYTES", store.path.stat().st_size - 1)
    memo = MetaMemo(store=MemoStore(tmp_path))
    _, messages = _warnings(lambda: _trace(memo))
    assert len(messages) == 1 and "larger than" in messages[0]
    assert memo.disk_hits == 0


def _replace(struct, **changes):
    return msgspec.structs.replace(struct, **changes)


def _rewritten(store: MemoStore, change) -> None:
    """The file with each record passed through ``change`` (a hostile or broken writer)."""
    records = [change(r) for r in store.read()]
    store.path.write_bytes(msgspec.msgpack.encode((store.header(), records)))


@pytest.mark.parametrize("change", [
    lambda o: _replace(o, sizes=(-1,) * len(o.sizes)),
    lambda o: _replace(o, strides=(*o.strides, 1)),
    lambda o: _replace(o, dtype="no_such_dtype"),
    lambda o: _replace(o, dtype="float"),  # an alias, not the recorder's spelling
    lambda o: _replace(o, device="nowhere:7"),
    lambda o: _replace(o, sizes=(1 << 62,) * len(o.sizes)),
], ids=["negative", "strides", "dtype", "alias", "device", "huge"])
def test_a_malformed_answer_is_not_used(tmp_path, change):
    store = _saved(tmp_path)
    _rewritten(store, lambda r: _replace(r, outs=tuple(change(o) for o in r.outs)))
    memo = MetaMemo(store=MemoStore(tmp_path))
    graph, messages = _warnings(lambda: _trace(memo))
    assert memo.disk_hits == 0 and messages and str(store.path) in messages[0]
    assert graph.nodes == _trace(None).nodes


def test_several_outputs_need_a_container(tmp_path):
    store = _saved(tmp_path)
    _rewritten(store, lambda r: _replace(r, container=""))
    memo = MetaMemo(store=MemoStore(tmp_path))
    _, messages = _warnings(lambda: _trace(memo))
    assert any("container" in m for m in messages)
    assert memo.disk_hits == len([r for r in store.read() if len(r.outs) == 1])


def test_a_scalar_of_the_wrong_type_is_not_used(tmp_path):
    """``int`` 1 and ``True`` are equal and hash alike: a record saying ``int`` must hold an int."""

    def as_bool(arg):
        if type(arg) is store_mod._Scalar and arg.kind == "int" and arg.value == 1:
            return _replace(arg, value=True)
        return arg

    def f(x):
        return [torch.ops.aten.add.Scalar(x, 1)]

    x = torch.randn(3)
    memo = MetaMemo(store=MemoStore(tmp_path))
    _trace(memo, f, [x])
    memo.save()
    _rewritten(memo.store, lambda r: _replace(  # type: ignore[arg-type]
        r, args=tuple(as_bool(a) for a in r.args)))
    fresh = MetaMemo(store=MemoStore(tmp_path))
    _, messages = _warnings(lambda: _trace(fresh, f, [x]))
    assert fresh.disk_hits == 0 and messages


def test_an_unwritable_directory_costs_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    memo = MetaMemo(store=MemoStore(blocker / "meta_memo"))
    _trace(memo)
    assert memo.save() == 0  # logged at debug level, nothing raised
    memo._save_at_exit()


def test_clear_forgets_the_file(tmp_path):
    _saved(tmp_path)
    memo = MetaMemo(store=MemoStore(tmp_path))
    memo.clear()
    _trace(memo)
    assert memo.disk_hits == 0 and memo.misses > 0


def test_custom_ops_are_not_kept(tmp_path):
    """A custom op's meta kernel is the user's code, which may change under the same name."""
    lib = torch.library.Library("tf_memo_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
    memo = MetaMemo(store=MemoStore(tmp_path))
    _trace(memo, lambda x: [torch.ops.tf_memo_test.twice(x).sin()], [torch.randn(3)])
    assert {str(k[0]) for k in memo._entries} == {"tf_memo_test.twice.default", "aten.sin.default"}
    assert memo.save() == 1


def test_the_directory(tmp_path):
    assert default_directory({"TORCHFUSE_CACHE_DIR": str(tmp_path)}) == tmp_path / "meta_memo"
    assert default_directory({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "torchfuse" / "meta_memo"


def test_use_disk_attaches_the_cache_directory_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    memo = MetaMemo()
    assert memo.use_disk(False).store is None
    store = memo.use_disk().store
    assert store is not None and store.path.parent == tmp_path / "meta_memo"
    assert memo.use_disk().store is store and memo.use_disk(False).store is store
    atexit.unregister(memo._save_at_exit)
