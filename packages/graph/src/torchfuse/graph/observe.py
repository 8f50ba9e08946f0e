"""Observability shared by every torchfuse package: one log switch, one debug switch.

``TORCHFUSE_LOGS=graph,guards,recompiles,breaks,aot,schedule,output_code`` (or ``all``)
turns on the named log channels. Each channel is a ``logging`` logger named
``torchfuse.<channel>`` that prints to stderr when enabled. ``TORCHFUSE_DEBUG=1`` writes
every compiled graph's artifacts under ``torchfuse_debug/run_<time>/<graph>/``.

The environment is read once, here, through :class:`ObserveConfig`; packages ask
:func:`log_enabled`, :func:`get_logger` and :func:`debug_dir` rather than reading it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CHANNELS = ("graph", "guards", "recompiles", "breaks", "aot", "schedule", "output_code", "runtime")


@dataclass
class ObserveConfig:
    """What ``TORCHFUSE_LOGS`` / ``TORCHFUSE_DEBUG`` / ``TORCHFUSE_DEBUG_DIR`` asked for."""

    logs: frozenset[str] = frozenset()
    debug: bool = False
    debug_root: Path = Path("torchfuse_debug")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ObserveConfig:
        env = dict(os.environ if env is None else env)
        names = {n.strip().lstrip("+") for n in env.get("TORCHFUSE_LOGS", "").split(",") if n.strip()}
        if "all" in names:
            names = set(CHANNELS)
        unknown = names - set(CHANNELS)
        if unknown:
            print(f"torchfuse: unknown TORCHFUSE_LOGS channel(s) {sorted(unknown)}; "
                  f"known: {', '.join(CHANNELS)}", file=sys.stderr)
        return cls(
            logs=frozenset(names & set(CHANNELS)),
            debug=env.get("TORCHFUSE_DEBUG", "0") not in ("", "0", "false", "False"),
            debug_root=Path(env.get("TORCHFUSE_DEBUG_DIR", "torchfuse_debug")),
        )


config = ObserveConfig.from_env()
_handler: logging.Handler | None = None


def reload_config() -> None:
    """Re-read the environment (tests change it)."""
    global config, _run_dir
    config = ObserveConfig.from_env()
    _run_dir = None
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


def write_artifact(graph_name: str, filename: str, text: str) -> Path | None:
    """Record one artifact of a compiled graph: hand it to every active :func:`collect` block
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
    """:func:`write_artifact` into the graph being compiled (see :func:`compiling`).

    Inside a ``compiling(name, role="backward")`` block the file name gets the role as a
    prefix (``backward_output_code.py``), so that the forward and backward halves of a
    training graph keep their files side by side.
    """
    role = _role.get()
    if role:
        filename = f"{role}_{filename}"
    return write_artifact(current_graph() or fallback_name, filename, text)


def record_time(stage: str, seconds: float) -> None:
    """Add a stage's duration to the current graph's ``timings.json`` (debug/collect only)."""
    if not wants_artifacts():
        return
    name = current_graph() or "graph"
    role = _role.get()
    table = _timings.setdefault(name, {})
    key = f"{role}.{stage}" if role else stage
    table[key] = table.get(key, 0.0) + seconds
    write_artifact(name, "timings.json", json.dumps(
        {"stages_s": table, "total_s": sum(table.values())}, indent=2))


def wants_artifacts() -> bool:
    """True when someone will read artifacts: the debug switch, or a :func:`collect` block.
    Stages use it to skip rendering text nobody reads."""
    return config.debug or bool(_collectors)


@dataclass(frozen=True)
class Artifact:
    graph: str
    filename: str
    text: str


@dataclass
class Collector:
    """Artifacts emitted while a :func:`collect` block was active, in emission order."""

    artifacts: list[Artifact] = field(default_factory=list)

    def get(self, filename: str, graph: str | None = None) -> str | None:
        """The last artifact of that file name (of that graph, if given)."""
        for a in reversed(self.artifacts):
            if a.filename == filename and (graph is None or a.graph == graph):
                return a.text
        return None


_collectors: list[Collector] = []
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("torchfuse_graph", default=None)
_role: contextvars.ContextVar[str] = contextvars.ContextVar("torchfuse_role", default="")
_timings: dict[str, dict[str, float]] = {}


@contextlib.contextmanager
def collect() -> Iterator[Collector]:
    """Keep every artifact emitted inside the block in memory (the main job and tests use it
    to show what each stage produced without a debug directory)."""
    sink = Collector()
    _collectors.append(sink)
    try:
        yield sink
    finally:
        _collectors.remove(sink)


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
    """The graph named by the innermost :func:`compiling` block, if any."""
    return _current.get()


# ----------------------------------------------------------------------------- stage timings


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
