"""Observability shared by every torchfuse package: one log switch, one debug switch.

``TORCHFUSE_LOGS=graph,guards,recompiles,breaks,aot,schedule,output_code`` (or ``all``)
turns on the named log channels. Each channel is a ``logging`` logger named
``torchfuse.<channel>`` that prints to stderr when enabled; ``-name`` turns a channel off
(``-progress``: no progress line, see `torchfuse.graph.progress`). ``perf_hints`` prints
every compiled entry's stage timings and counts after its first call (`flush_timings`).
``TORCHFUSE_GC_PAUSE=0`` keeps Python's garbage collector running while a compile runs
(`torchfuse.graph.collector.gc_paused` then pauses nothing; for measuring what the pause buys,
or for a process whose compiles build cycles it cannot afford to keep until the end).
``TORCHFUSE_DEBUG=1`` writes
every compiled entry's artifacts under ``torchfuse_debug/run_<time>_pid<pid>/<function>/entry_<n>/``
(see [`entry_folder`][torchfuse.graph.observe.entry_folder]: no two entries share a folder),
with every stage's duration in ``timings.json`` and ``timings.txt``.

The environment is read once, here, through `ObserveConfig`; packages ask
`log_enabled`, `get_logger` and `debug_dir` rather than reading it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchfuse.graph import progress

CHANNELS = ("graph", "guards", "recompiles", "breaks", "aot", "schedule", "output_code", "runtime",
            "perf_hints", "progress")
DEFAULT_OFF = frozenset({"progress"})
"""Channels that ``all`` leaves out: ``progress`` is on by default (on a terminal) and is not
a log channel of records, so ``all`` does not change it; ``-progress`` turns it off."""


@dataclass
class ObserveConfig:
    """What ``TORCHFUSE_LOGS`` / ``TORCHFUSE_DEBUG`` / ``TORCHFUSE_DEBUG_DIR`` /
    ``TORCHFUSE_GC_PAUSE`` asked for."""

    logs: frozenset[str] = frozenset()
    debug: bool = False
    debug_root: Path = Path("torchfuse_debug")
    off: frozenset[str] = frozenset()
    """Channels turned off with ``-name`` (``-progress``)."""
    ci: bool = False
    """The ``CI`` variable is set: no progress line."""
    gc_pause: bool = True
    """Whether `torchfuse.graph.collector.gc_paused` pauses the collector
    (``TORCHFUSE_GC_PAUSE=0``: it does nothing)."""

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> ObserveConfig:
        env = dict(os.environ if env is None else env)
        items = [n.strip() for n in env.get("TORCHFUSE_LOGS", "").split(",") if n.strip()]
        off = {n[1:].strip() for n in items if n.startswith("-")}
        names = {n.lstrip("+") for n in items if not n.startswith("-")}
        if "all" in names:
            names = set(CHANNELS) - DEFAULT_OFF
        unknown = (names | off) - set(CHANNELS)
        if unknown:
            print(f"torchfuse: unknown TORCHFUSE_LOGS channel(s) {sorted(unknown)}; "
                  f"known: {', '.join(CHANNELS)}", file=sys.stderr)
        return cls(
            logs=frozenset((names - off) & set(CHANNELS)),
            debug=env.get("TORCHFUSE_DEBUG", "0") not in ("", "0", "false", "False"),
            debug_root=Path(env.get("TORCHFUSE_DEBUG_DIR", "torchfuse_debug")),
            off=frozenset(off & set(CHANNELS)),
            ci=env.get("CI", "") not in ("", "0", "false", "False"),
            gc_pause=env.get("TORCHFUSE_GC_PAUSE", "1").strip() not in ("0", "false", "False", "off"),
        )


config = ObserveConfig.from_environment()
_handler: logging.Handler | None = None
# the progress line asks these settings (read at each call: tests and reload_config swap them)
progress.set_switch(lambda: "progress" not in config.off and not config.ci)


def reload_config() -> None:
    """Re-read the environment (tests change it)."""
    global config, _run_dir
    config = ObserveConfig.from_environment()
    _run_dir = None
    with _folders_lock:
        _folder_of.clear()
        _entries_of.clear()
        _timings.clear()
        _counts.clear()
        _flushed.clear()
    for ch in CHANNELS:
        _configure(logging.getLogger(f"torchfuse.{ch}"), ch)


def log_enabled(channel: str) -> bool:
    return channel in config.logs


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (pytest swaps it per test)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # never let logging break a compile
            self.handleError(record)


def _configure(logger: logging.Logger, channel: str, force: bool = False) -> None:
    global _handler
    if _handler is None:
        _handler = _StderrHandler()
        _handler.setFormatter(logging.Formatter("[torchfuse.%(channel)s] %(message)s"))
    logger.propagate = False
    if force or channel in config.logs:
        if _handler not in logger.handlers:
            logger.addHandler(_handler)
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.WARNING)


class _ChannelAdapter(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        kwargs.setdefault("extra", {})["channel"] = self.extra["channel"]
        return msg, kwargs


def get_logger(channel: str, *, force: bool = False) -> logging.LoggerAdapter:
    """The logger of one channel (``graph``, ``guards``, ``recompiles`` …), printing to stderr
    as ``[torchfuse.<channel>] …`` when the channel is on. ``force=True`` turns it on for a
    caller that was asked to log through its own options (e.g. inductor's ``logs`` option)."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown log channel {channel!r}; known: {', '.join(CHANNELS)}")
    logger = logging.getLogger(f"torchfuse.{channel}")
    _configure(logger, channel, force)
    return _ChannelAdapter(logger, {"channel": channel})


# ----------------------------------------------------------------------------- debug directory

_run_dir: Path | None = None


def debug_dir(graph_name: str | None = None) -> Path | None:
    """``torchfuse_debug/run_<time>/[<graph_name>/]`` when ``TORCHFUSE_DEBUG`` is on, else None."""
    global _run_dir
    if not config.debug:
        return None
    if _run_dir is None:
        stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
        _run_dir = config.debug_root / f"run_{stamp}_pid{os.getpid()}"
        _run_dir.mkdir(parents=True, exist_ok=True)
    if graph_name is None:
        return _run_dir
    d = _run_dir / graph_name
    d.mkdir(parents=True, exist_ok=True)
    return d


_folders_lock = threading.Lock()
_folder_of: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
"""The function folder each owner (a compiled function) was given in this run."""
_entries_of: dict[str, int] = {}
"""Function folder -> entry folders handed out so far."""


def entry_folder(owner: object, name: str) -> str:
    """The artifact folder of the next compiled entry of ``owner``: ``<name>/entry_<n>``.

    One folder per compiled entry, never handed out twice in a run: a recompile gets
    ``entry_1``, ``entry_2``, … (counting on after a reset), and a second owner with the same
    name (two lambdas) gets ``<name>_2``. The graphs an entry's backend compiles (the forward
    and backward halves) share its folder, told apart by their file prefixes.

    Args:
        owner: What the entries belong to (capture passes the compiled function); held weakly.
        name: A readable name for it (a qualified name), used as the function folder:
            ``<locals>.`` and characters outside ``[A-Za-z0-9_.-]`` are dropped.

    Returns:
        A relative folder name, to pass to [`compiling`][torchfuse.graph.observe.compiling].
    """
    clean = "".join(c for c in name.replace("<locals>.", "") if c.isalnum() or c in "_.-") or "graph"
    with _folders_lock:
        folder = _folder_of.get(owner)
        if folder is None:
            taken = set(_folder_of.values()) | set(_entries_of)
            folder, n = clean, 1
            while folder in taken:
                n += 1
                folder = f"{clean}_{n}"
            _folder_of[owner] = folder
        index = _entries_of.get(folder, 0)
        _entries_of[folder] = index + 1
    return f"{folder}/entry_{index}"


def write_artifact(graph_name: str, filename: str, text: str) -> Path | None:
    """Record one artifact of a compiled graph: hand it to every active `collect` block
    and, when the debug switch is on, write it to ``debug_dir(graph_name)/filename``."""
    for sink in _collectors:
        sink.artifacts.append(Artifact(graph_name, filename, text))
    d = debug_dir(graph_name)
    if d is None:
        return None
    path = d / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def emit(filename: str, text: str, *, fallback_name: str = "graph") -> Path | None:
    """`write_artifact` into the graph being compiled (see `compiling`).

    Inside a ``compiling(name, role="backward")`` block the file name gets the role as a
    prefix (``backward_output_code.py``), so that the forward and backward halves of a
    training graph keep their files side by side.
    """
    role = _role.get()
    if role:
        filename = f"{role}_{filename}"
    return write_artifact(current_graph() or fallback_name, filename, text)


def keeps_timings() -> bool:
    """Whether stage durations and counts are kept: for the debug folder, a `collect` block or
    the ``perf_hints`` channel (a stage asks before doing extra work to measure)."""
    return wants_artifacts() or bool(_timing_blocks) or "perf_hints" in config.logs


def record_time(stage: str, seconds: float) -> None:
    """Add a stage's duration to the current graph's ``timings.json`` and ``timings.txt``
    (debug/collect/``perf_hints`` only). Stage names are dotted by package (``capture``,
    ``aot.joint``, ``inductor.schedule``, ``runtime.load``); a backward half's get the prefix
    ``backward.``. Every call also moves the progress line on (`torchfuse.graph.progress`)."""
    name = current_graph() or "graph"
    role = _role.get()
    key = f"{role}.{stage}" if role else stage
    progress.stage(name, key, seconds)
    if not keeps_timings():
        return
    with _folders_lock:
        table = _timings.setdefault(name, {})
        table[key] = table.get(key, 0.0) + seconds
    _write_timings(name)


def record_count(what: str, n: int = 1) -> None:
    """Add ``n`` to a counter of the current graph (``inductor.cache.program_hits``,
    ``runtime.triton_compiles``, ...): kept beside the stage timings, in ``timings.json``
    under ``counts`` (debug/collect/``perf_hints`` only)."""
    if not n or not keeps_timings():
        return
    name = current_graph() or "graph"
    role = _role.get()
    key = f"{role}.{what}" if role else what
    with _folders_lock:
        table = _counts.setdefault(name, {})
        table[key] = table.get(key, 0) + int(n)
    _write_timings(name)


def _write_timings(name: str) -> None:
    if not wants_artifacts():
        return
    with _folders_lock:
        table = dict(_timings.get(name, {}))
        counts = dict(_counts.get(name, {}))
    doc: dict[str, object] = {"stages_s": table, "total_s": sum(table.values())}
    if counts:
        doc["counts"] = counts
    write_artifact(name, "timings.json", json.dumps(doc, indent=2))
    write_artifact(name, "timings.txt", format_timings(table, counts))


def timed_graphs() -> list[str]:
    """The graphs (entry folders) that have stage timings or counts kept, in order."""
    with _folders_lock:
        return list(dict.fromkeys([*_timings, *_counts]))


def timings_of(graph_name: str) -> tuple[dict[str, float], dict[str, int]]:
    """The stage durations and counts kept so far for one graph (entry folder)."""
    with _folders_lock:
        return dict(_timings.get(graph_name, {})), dict(_counts.get(graph_name, {}))


def flush_timings(graph_name: str | None) -> None:
    """An entry's first call is over: print its stages and counts recorded since the last
    flush on the ``perf_hints`` channel, and end the progress line. Capture calls it after an
    entry's first call, autograd after a backward's first call."""
    if graph_name is None:
        return
    progress.finish(graph_name)
    if "perf_hints" not in config.logs:
        return
    stages, counts = timings_of(graph_name)
    with _folders_lock:
        seen = _flushed.setdefault(graph_name, set())
        new = {k: v for k, v in stages.items() if k not in seen}
        new_counts = {k: v for k, v in counts.items() if k not in seen}
        seen.update(new, new_counts)
    if new:
        get_logger("perf_hints").info("%s: %.1f ms\n%s", graph_name, sum(new.values()) * 1e3,
                                      format_timings(new, new_counts).rstrip())


def format_timings(stages: dict[str, float], counts: dict[str, int] | None = None) -> str:
    """A stage table as aligned text: one line per stage in milliseconds, then each package's
    subtotal (the part of a stage name before its first dot) and the total, then the counts."""
    counts = counts or {}
    width = max([len(k) for k in [*stages, *counts]] + [len("total")])
    lines = [f"{'stage':<{width}}  {'ms':>10}"]
    lines += [f"{k:<{width}}  {v * 1e3:10.2f}" for k, v in stages.items()]
    groups: dict[str, float] = {}
    for k, v in stages.items():
        parts = k.split(".")
        group = ".".join(parts[:2]) if parts[0] == "backward" and len(parts) > 2 else parts[0]
        groups[group] = groups.get(group, 0.0) + v
    if len(groups) < len(stages):
        lines.append("")
        lines += [f"{g:<{width}}  {v * 1e3:10.2f}" for g, v in groups.items()]
    lines.append(f"{'total':<{width}}  {sum(stages.values()) * 1e3:10.2f}")
    if counts:
        lines += ["", f"{'count':<{width}}  {'n':>10}"]
        lines += [f"{k:<{width}}  {v:10d}" for k, v in counts.items()]
    return "\n".join(lines) + "\n"


def wants_artifacts() -> bool:
    """True when someone will read artifacts: the debug switch, or a `collect` block.
    Stages use it to skip rendering text nobody reads."""
    return config.debug or bool(_collectors)


@dataclass(frozen=True)
class Artifact:
    graph: str
    filename: str
    text: str


@dataclass
class Collector:
    """Artifacts emitted while a `collect` block was active, in emission order."""

    artifacts: list[Artifact] = field(default_factory=list)

    def get(self, filename: str, graph: str | None = None) -> str | None:
        """The last artifact of that file name (of that graph, if given)."""
        for a in reversed(self.artifacts):
            if a.filename == filename and (graph is None or a.graph == graph):
                return a.text
        return None


_collectors: list[Collector] = []
_timing_blocks: list[object] = []
"""Open `collect` blocks with ``artifacts=False``: they keep timings and counts only."""
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("torchfuse_graph", default=None)
_role: contextvars.ContextVar[str] = contextvars.ContextVar("torchfuse_role", default="")
_timings: dict[str, dict[str, float]] = {}
_counts: dict[str, dict[str, int]] = {}
_flushed: dict[str, set[str]] = {}
"""Per graph, the stages and counts `flush_timings` has printed already."""


@contextlib.contextmanager
def collect(artifacts: bool = True) -> Iterator[Collector]:
    """Keep every artifact emitted inside the block in memory (the main job and tests use it
    to show what each stage produced without a debug directory).

    ``artifacts=False`` keeps only the stage timings and counts (`timings_of`): the stages
    then render no text nobody asked for, and cost what they cost without the block
    (``benchmarks/compile_profile.py`` measures first calls this way)."""
    sink = Collector()
    owner = _collectors if artifacts else _timing_blocks
    owner.append(sink)
    try:
        yield sink
    finally:
        owner.remove(sink)


@contextlib.contextmanager
def compiling(graph_name: str, role: str = "") -> Iterator[None]:
    """Name the graph whose artifacts the stages inside the block emit (capture sets it
    around the backend call; autograd keeps it for the backward it compiles later), and
    optionally the role of what is compiled (``"backward"``)."""
    token = _current.set(graph_name)
    role_token = _role.set(role)
    try:
        yield
    finally:
        _role.reset(role_token)
        _current.reset(token)


def current_graph() -> str | None:
    """The graph named by the innermost `compiling` block, if any."""
    return _current.get()


def current_role() -> str:
    """The role named by the innermost `compiling` block (``"backward"``), or ``""``."""
    return _role.get()


# ----------------------------------------------------------------------------- stage timings


@dataclass(frozen=True, slots=True)
class Stage:
    """One pass's result, stamped with the pass name and how long it took: the autograd
    pipeline keeps its graphs this way (``fn.stages``), the inductor its passes' outputs
    (``CompileResult.stages``)."""

    name: str
    seconds: float
    value: Any



@dataclass
class Timings:
    """Durations of named compile stages, in seconds, in the order they ran."""

    stages: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t0

    def total(self) -> float:
        return sum(self.stages.values())

    def to_json(self) -> str:
        return json.dumps({"stages_s": self.stages, "total_s": self.total()}, indent=2)
