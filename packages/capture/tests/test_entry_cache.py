"""Captured entries kept on disk (`torchfuse.capture.entry_cache`): a new compile of the same
code rebuilds the entry whose guards hold without interpreting bytecode, and computes what
eager does; an entry whose guards do not hold, whose code changed, or whose file was written
by a stranger, is captured anew."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
import torch
import torch.nn.functional as F
from capture_gpt2 import GPT2
from capture_helpers import assert_same
from torch import nn
from torchfuse.capture import compile, compiler, entry_cache
from torchfuse.capture.config import config
from torchfuse.capture.portable import NotPortable, checked_expr


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """The cache on, over a directory of this test's own."""
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path / "cache"))
    with config.patch(capture_cache=True):
        yield tmp_path / "cache" / "captures"


@pytest.fixture
def no_capture(monkeypatch):
    """Fail the test if anything is captured (interpreted) from now on."""
    def refuse(*args, **kwargs):
        raise AssertionError("captured although a kept entry should have served")

    return lambda: monkeypatch.setattr(compiler, "capture", refuse)


class Net(nn.Module):
    def __init__(self, act=F.relu, out=8):
        super().__init__()
        self.lin = nn.Linear(8, out)
        self.norm = nn.LayerNorm(out)
        self.act = act
        self.scale = 2.0

    def forward(self, x, shift: float = 0.5):
        return self.act(self.norm(self.lin(x))) * self.scale + shift


def _entry(cm):
    return getattr(cm, "_compiled", cm).entries[-1].result


def test_a_new_compile_rebuilds_the_kept_entry_without_capturing(kept, no_capture):
    torch.manual_seed(0)
    m, x = Net(), torch.randn(4, 8, requires_grad=True)
    first = compile(m, backend="eager")
    assert_same(first(x), m(x))
    assert not _entry(first).from_disk and len(list(kept.iterdir())) == 1
    no_capture()
    again = compile(m, backend="eager")
    out = again(x)
    assert _entry(again).from_disk
    assert_same(out, m(x))
    (g,) = torch.autograd.grad(out.sum(), m.lin.weight)
    (ref,) = torch.autograd.grad(m(x).sum(), m.lin.weight)
    torch.testing.assert_close(g, ref)
    assert again._compiled.graph_count() == 1


def test_the_guards_choose_among_kept_entries(kept):
    torch.manual_seed(0)
    m = Net()
    a, b = torch.randn(4, 8), torch.randn(3, 8)
    first = compile(m, backend="eager", dynamic=False)
    first(a), first(b)
    assert len(first._compiled.entries) == 2
    again = compile(m, backend="eager", dynamic=False)
    assert_same(again(b), m(b))
    assert _entry(again).from_disk and _entry(again).graph.guards == first._compiled.entries[1].result.graph.guards
    c = torch.randn(5, 8)
    assert_same(again(c), m(c))  # no kept entry holds: captured
    assert not _entry(again).from_disk
    with torch.no_grad():  # grad mode is guarded
        assert_same(compile(m, backend="eager", dynamic=False)(a), m(a))


def test_records_of_other_input_sizes_are_passed_over_before_their_guards_are_built(kept, monkeypatch):
    """A function kept at several shapes: a new compile's miss checks each record's input
    tensors (size, dtype) first, and builds the guards of the one that can hold only."""
    torch.manual_seed(0)
    m = Net()
    xs = [torch.randn(n, 8) for n in (2, 3, 4, 5)]
    first = compile(m, backend="eager", dynamic=False)
    for x in xs:
        first(x)
    built = []
    real = entry_cache.replay_guards
    monkeypatch.setattr(entry_cache, "replay_guards", lambda *a, **k: built.append(1) or real(*a, **k))
    again = compile(m, backend="eager", dynamic=False)
    assert_same(again(xs[0]), m(xs[0]))  # the oldest of four records: three passed over
    assert _entry(again).from_disk and len(built) == 1
    built.clear()
    monkeypatch.setattr(entry_cache, "keep", lambda *a, **k: None)  # (keep checks what it writes)
    other = compile(m, backend="eager", dynamic=False)
    y = torch.randn(6, 8)
    assert_same(other(y), m(y))  # no record holds: none built, captured
    assert not _entry(other).from_disk and built == []


def test_the_input_check_passes_over_only_what_surely_fails():
    from torchfuse.capture.source import LocalSource

    src = [LocalSource(0, "x")]
    rec = [["tensor", 0, ["type", "torch", "Tensor"], ["dtype", "float32"], ["device", "cpu"], [2, 3], [3, 1],
            False]]

    def differs(value):
        return entry_cache._inputs_differ(rec, src, lambda s: value)

    assert not differs(torch.zeros(2, 3))
    assert differs(torch.zeros(3, 2)) and differs(torch.zeros(2, 3, dtype=torch.float64)) and differs(1.0)
    assert not entry_cache._inputs_differ(rec, src, lambda s: (_ for _ in ()).throw(KeyError("gone")))
    assert not entry_cache._inputs_differ([["tensor", 7]], src, lambda s: 1.0)  # another form: full check


@pytest.mark.parametrize("other", ["layers", "activation", "width", "frozen"])
def test_a_model_of_another_make_is_captured(kept, other):
    """The kept entry is bound to the new call's module only when what the graph was made
    from matches: its children (names, classes), functions held as attributes, and every
    parameter's metadata (``requires_grad`` included)."""
    torch.manual_seed(0)
    if other == "layers":
        m1, m2, x = GPT2(layers=1).eval(), GPT2(layers=2).eval(), torch.randint(0, 64, (2, 8))
    else:
        m1, x = Net(), torch.randn(4, 8)
        m2 = {"activation": lambda: Net(act=F.gelu), "width": lambda: Net(out=4),
              "frozen": lambda: Net().requires_grad_(False)}[other]()
    compile(m1, backend="eager", dynamic=False)(x)
    cm = compile(m2, backend="eager", dynamic=False)
    assert_same(cm(x), m2(x))
    assert not _entry(cm).from_disk


def test_changes_to_a_module_in_process_recompile():
    """The guards the kept entries needed also serve one process: a function held by a
    module, and a container's children, are checked when modules change."""
    torch.manual_seed(0)
    m, x = Net(), torch.randn(4, 8)
    cm = compile(m, backend="eager")
    cm(x)
    m.act = F.gelu
    assert_same(cm(x), m(x))
    seq = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    cs = compile(seq, backend="eager")
    cs(x)
    seq.append(nn.Tanh())
    assert_same(cs(x), seq(x))
    assert len(cm._compiled.entries) == 2 and len(cs._compiled.entries) == 2


class State:
    mode = "idle"


STATE = State()


def _stateful(x):
    STATE.mode = "busy"
    return x.sin() * 2


def test_side_effects_are_replayed_by_a_rebuilt_entry(kept, no_capture):
    x = torch.randn(3)
    compile(_stateful, backend="eager")(x)
    STATE.mode = "idle"
    no_capture()
    cf = compile(_stateful, backend="eager")
    assert_same(cf(x), x.sin() * 2)
    assert _entry(cf).from_disk and STATE.mode == "busy"


_SENTINEL = object()


def test_what_has_no_portable_name_is_not_kept(kept):
    """An object compared by identity that is neither a module, a class nor a function has
    no description another process could check: the entry is not kept, and says why."""
    def f(x, flag=_SENTINEL):
        return x * 2 if flag is _SENTINEL else x

    x = torch.randn(3)
    cf = compile(f, backend="eager")
    cf(x)
    why = entry_cache.keep(f, None, _entry(cf), cf.binder(x), cf.closure)
    assert why is not None and "object" in why
    assert not kept.exists() or not any(kept.iterdir())


def test_a_closure_function_is_bound_by_its_code(kept):
    """A function with no importable name (a lambda in a closure) is kept as 'the function
    its source reads, with this code': a new lambda of the same code serves, another code
    captures anew."""
    def make(helper):
        def f(x):
            return helper(x) * 2
        return f

    x = torch.randn(3)
    compile(make(lambda t: t + 1), backend="eager")(x)
    cf = compile(make(lambda t: t + 1), backend="eager")
    assert_same(cf(x), (x + 1) * 2)
    assert _entry(cf).from_disk
    other = compile(make(lambda t: t - 1), backend="eager")
    assert_same(other(x), (x - 1) * 2)
    assert not _entry(other).from_disk


class _Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv", torch.arange(1.0, 9.0))

    @torch.no_grad()  # the decorator closes over a torch.no_grad object, guarded by identity
    def forward(self, x):
        return torch.cos(x * self.inv)


class _WithRotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.rot = nn.Linear(8, 8), _Rotary()

    def forward(self, x):
        return self.lin(x) * self.rot(x)


def test_a_grad_mode_decorated_method_is_bound_to_the_object_it_closes_over(kept, no_capture):
    """transformers' rotary embeddings are ``@torch.no_grad()`` methods: the entry guards the
    decorator's ``no_grad`` object by identity. It is kept as 'the object that source reads,
    of this class, with this state', so a later compile rebuilds the entry."""
    torch.manual_seed(0)
    m, x = _WithRotary(), torch.randn(4, 8, requires_grad=True)
    first = compile(m, backend="eager")
    assert_same(first(x), m(x))
    assert not _entry(first).from_disk and len(list(kept.iterdir())) == 1  # kept
    no_capture()
    again = compile(m, backend="eager")
    out = again(x)
    assert _entry(again).from_disk
    assert_same(out, m(x))
    (g,) = torch.autograd.grad(out.sum(), x)
    (ref,) = torch.autograd.grad(m(x).sum(), x)
    torch.testing.assert_close(g, ref)


def test_a_plain_object_is_bound_only_to_one_of_its_class_and_state():
    from torchfuse.capture.portable import Describer, check_read, describe_read

    class State:
        def __init__(self, k):
            self.k = k

    class Other:
        def __init__(self, k):
            self.k = k

    class Slotted:
        __slots__ = ("k",)

    d = Describer(lambda: None)
    desc = describe_read(d, State(1))
    assert desc is not None and desc[:2] == ["read", "object"]
    fresh = State(1)
    assert check_read(d, desc, fresh) is fresh
    for wrong in (State(2), Other(1), State([1])):
        with pytest.raises(NotPortable):
            check_read(d, desc, wrong)
    assert describe_read(d, Slotted()) is None  # state outside __dict__: no description
    assert describe_read(d, State(object())) is None  # state of no portable description
    grad_off = describe_read(d, torch.no_grad())
    assert check_read(d, grad_off, torch.no_grad()) is not None


def test_the_switch_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    with config.patch(capture_cache=False):
        compile(Net(), backend="eager")(torch.randn(2, 8))
    assert not (tmp_path / "captures").exists()


# ----------------------------------------------------------------------------- untrusted files

def _one_file(kept: Path) -> Path:
    (path,) = kept.iterdir()
    return path


def test_a_file_that_does_not_decode_is_ignored(kept):
    m, x = Net(), torch.randn(4, 8)
    compile(m, backend="eager")(x)
    _one_file(kept).write_bytes(b"\x93not msgpack at all")
    cm = compile(m, backend="eager")
    assert_same(cm(x), m(x))
    assert not _entry(cm).from_disk


@pytest.mark.parametrize("attack", ["expression", "import", "source", "attribute", "cycle", "float",
                                    "unhashable", "deep"])
def test_a_record_written_by_a_stranger_runs_nothing(kept, tmp_path, attack):
    """Every string of a record is data: an expression that is no source, a name of a module
    not imported, a source field that is no name, a source row whose base is not an earlier
    row: the record is skipped, nothing runs or is imported, and the function is captured as
    if nothing were kept."""
    marker = tmp_path / "ran"
    x = torch.randn(3)
    compile(_stateful, backend="eager")(x)
    path = _one_file(kept)
    doc = msgspec.msgpack.decode(path.read_bytes())
    rec = doc["records"][0]
    rows = rec["sources"]
    evil = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    if attack == "expression":
        rec["side_effects"][0][1] = evil
    elif attack == "import":
        rec["guards"].append(["type_", 0, ["type", "antigravity", "X"]])
    elif attack == "source":
        rows.append(["attr", 0, evil])
        rec["guards"].append(["constant", len(rows) - 1, ["int", 1]])
    elif attack == "attribute":
        rows.append(["attr", 0, "__class__.__init__"])
        rec["inputs"][0][2] = len(rows) - 1
    elif attack == "cycle":
        rows.append(["attr", len(rows) + 1, "x"])
        rec["guards"].append(["constant", len(rows) - 1, ["int", 1]])
    elif attack == "float":
        rec["guards"].append(["constant", 0, ["float", "not hex"]])
    elif attack == "unhashable":
        rec["guards"].append(["constant", 0, ["frozenset", [["list", []]]]])
    else:
        deep: list = ["none"]
        for _ in range(200):  # deeper than a record may nest
            deep = ["tuple", [deep]]
        rec["guards"].append(["constant", 0, deep])
    path.write_bytes(msgspec.msgpack.encode(doc))
    STATE.mode = "idle"
    cf = compile(_stateful, backend="eager")
    assert_same(cf(x), x.sin() * 2)
    assert not _entry(cf).from_disk and STATE.mode == "busy"
    assert not marker.exists() and "antigravity" not in sys.modules


def test_an_untampered_record_is_rebuilt(kept):
    """The tampering tests above fail for their tampering: the same file, decoded and
    encoded again unchanged, serves."""
    x = torch.randn(3)
    compile(_stateful, backend="eager")(x)
    path = _one_file(kept)
    path.write_bytes(msgspec.msgpack.encode(msgspec.msgpack.decode(path.read_bytes())))
    cf = compile(_stateful, backend="eager")
    assert_same(cf(x), x.sin() * 2)
    assert _entry(cf).from_disk


def test_a_dtype_name_from_a_file_imports_nothing():
    """``["dtype", "onnx"]`` is no dtype; read with ``getattr(torch, name)``, torch's module
    ``__getattr__`` would import ``torch.onnx``. In a fresh process, where it is not imported."""
    code = ("import sys, torch\n"
            "from torchfuse.capture.portable import Describer, NotPortable\n"
            "assert 'torch.onnx' not in sys.modules\n"
            "try:\n    Describer(lambda: 0).resolve(['dtype', 'onnx'])\n"
            "except NotPortable:\n    pass\n"
            "print('torch.onnx' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "False"


@pytest.mark.parametrize("text", [
    "L[0]", "G['torch']", "C[1].cell_contents", "L[0]._modules['h']._parameters['w']",
    "L[0].config.hidden_size", "dict.__getitem__(L[0], 'k')", "type(L[0]).forward",
    "sys.modules['torch.nn'].__dict__['functional']",
])
def test_expressions_a_source_prints_are_accepted(text):
    assert checked_expr(text) == text


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "L[0](1)", "L[0] + 1", "open('x')",
    "L[0]._modules['a'].__dict__['b']", "L[0] if 1 else 2", "L[0][1:2]", "G['x'].y()",
    "type(L[0], 1).x", "L[0]; G", "", 3, "L[0]." + "a" * 5000,
])
def test_anything_else_is_refused(text):
    with pytest.raises(NotPortable):
        checked_expr(text)


# ----------------------------------------------------------------------------- across processes

_MODEL = """
import torch
from helpers import helper

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return helper(self.lin(x))
"""

_RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from model import Model
from torchfuse.capture import compile
torch.manual_seed(0)
m = Model()
x = torch.arange(8.0).reshape(2, 4)
cm = compile(m, backend="eager")
out = cm(x)
print(json.dumps({"from_disk": cm._compiled.entries[0].result.from_disk,
                  "same": bool(torch.equal(out, m(x)))}))
"""


def test_a_second_process_rebuilds_and_an_edit_makes_it_stale(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "model.py").write_text(_MODEL)
    (code / "helpers.py").write_text("def helper(t):\n    return t.relu()\n")
    env = {**os.environ, "TORCHFUSE_CACHE_DIR": str(tmp_path / "cache"), "TORCHFUSE_CAPTURE_CACHE": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}

    def run() -> dict:
        p = subprocess.run([sys.executable, "-c", _RUN, str(code)], env=env, capture_output=True,
                           text=True, timeout=240)
        assert p.returncode == 0, p.stderr[-3000:]
        import json

        return json.loads(p.stdout.strip().splitlines()[-1])

    assert run() == {"from_disk": False, "same": True}
    assert run() == {"from_disk": True, "same": True}
    # the helper the graph inlined changes (same name, new body): captured anew
    (code / "helpers.py").write_text(textwrap.dedent("""
        def helper(t):
            return t.sigmoid()
    """))
    assert run() == {"from_disk": False, "same": True}
    assert run() == {"from_disk": True, "same": True}


class Holder(nn.Module):
    """Holds a bound method of another module as a plain attribute."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.call = self.inner.forward

    def forward(self, x):
        return self.call(x) * 2


def test_a_bound_method_held_by_a_module_is_guarded_with_the_module_guards(kept):
    """Its function and instance are guarded (checked when modules change); the instance's
    parameters reach the graph as constants (read through the method, not a module path),
    so the entry is not kept, and says so."""
    torch.manual_seed(0)
    m, x = Holder(), torch.randn(2, 4)
    cm = compile(m, backend="eager")
    assert_same(cm(x), m(x))
    cf = cm._compiled
    held = [e for e in _entry(cm).checks.entries if ".call.__" in e.condition]
    assert len(held) == 2 and all(e.module_group for e in held)
    assert entry_cache.keep(cf.fn, cf.dynamic, _entry(cm), cf.binder(m, x), cf.closure) == \
        "a constant tensor input"
    m.call = nn.Linear(4, 4).forward  # another module's method: the module guards see it
    assert_same(cm(x), m(x))
    assert len(cf.entries) == 2


@pytest.mark.parametrize("change", [None, "attribute", "eps", "activation", "child", "weight"])
def test_the_python_check_of_module_guards_agrees_with_the_compiled_one(change):
    """`entry_cache.holds` checks a rebuilt entry's guards without compiling them; on the
    module a capture saw, and after each kind of change, it answers as the generated checks
    do (module guards with full parameter metadata)."""
    torch.manual_seed(0)
    m, x = nn.Sequential(Net(), nn.ReLU()), torch.randn(4, 8)
    cm = compile(m, backend="eager")
    cm(x)
    cf = cm._compiled
    r = cf.entries[0].result
    if change == "attribute":
        m[0].scale = 3.0
    elif change == "eps":
        m[0].norm.eps = 1e-3
    elif change == "activation":
        m[0].act = F.gelu
    elif change == "child":
        m.append(nn.Tanh())
    elif change == "weight":
        m[0].lin.weight = nn.Parameter(torch.randn(8, 8).t())  # other strides
    L, G, C_ = cf.binder(m, x), cf.globals, cf.closure
    compiled = r.checks.fast(L, G, C_) and r.checks.module(L, G, C_)
    in_python = entry_cache.holds(r.checks.log, lambda s: entry_cache._read(s, L, G, C_)) is not None
    assert in_python == compiled == (change is None)


def _matmul(x, w):
    return x @ w


def test_an_entry_kept_under_autocast_serves_that_dtype_only(kept):
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compile(_matmul, backend="eager")(x, w)
        bf = compile(_matmul, backend="eager")
        assert bf(x, w).dtype == torch.bfloat16 and _entry(bf).from_disk
    with torch.autocast("cpu", dtype=torch.float16):
        fp = compile(_matmul, backend="eager")
        assert fp(x, w).dtype == torch.float16 and not _entry(fp).from_disk
