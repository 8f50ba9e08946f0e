"""``compile()``: the cache of compiled entries, guard checks, recompiles, eager fallback.

Per code object a list of `Entry` is kept on the `CompiledFunction`. A call
binds its arguments (generated binder), then tries the entries in order: the first whose
guards hold runs — flat inputs gathered by generated code, the backend's callable, side
effects replayed, the return value rebuilt. A miss captures again (logged under
``recompiles`` with the guard that failed); past ``config.recompile_limit`` entries the
function runs eagerly, with one warning.

Dynamic shapes (``dynamic=``): ``None`` (the default) is *automatic dynamic*: the first
capture specializes every size; when a miss is due to an input size that changed, that
(source, dim) is remembered and the recapture makes it a size symbol, so one entry then
serves every size of it. ``True`` makes every input dim symbolic from the start, ``False``
never. ``mark_dynamic`` requests apply in every mode. See `torchfuse.capture.dynamic`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture import codegen, entry_cache, pyrandom
from torchfuse.capture import config as C
from torchfuse.capture import distributed as D
from torchfuse.capture.backends import Backend, backend_parameters, lookup_backend
from torchfuse.capture.convert import CaptureResult, capture, make_binder
from torchfuse.capture.dynamic import (
    DynamicPolicy,
    ScalarChange,
    SizeChange,
    dynamic_requests,
    mark_dynamic,
    module_changes,
    out_of_range,
    scalar_changes,
    size_changes,
)
from torchfuse.capture.entry import Entry, _gather_functions, counts_as_graph
from torchfuse.capture.errors import (
    GraphBreakInFullgraph,
    RecompileLimitExceeded,
    Unsupported,
    break_stack,
    where,
)
from torchfuse.capture.guards import module_version, watch_module_attributes
from torchfuse.capture.hooks import call_with_hooks, python_hooks
from torchfuse.capture.resume import (
    Continue,
    is_user_break,
    resume_code_for,
    wrap_resume_arg,
)
from torchfuse.graph import observe
from torchfuse.graph.collector import gc_paused
from torchfuse.graph.interpreter import run as run_graph
from torchfuse.graph.printer import describe_guard, to_python
from torchfuse.graph.torchfuse_ops import SET_GRAD_ENABLED

_ALL: weakref.WeakSet[CompiledFunction] = weakref.WeakSet()


class CompiledFunction:
    """A function (or a module's ``forward``) compiled by torchfuse capture.

    A graph break compiles the graph up to it, runs the breaking instruction in Python and
    continues in a *resume function* ([`torchfuse.capture.resume`][torchfuse.capture.resume]), itself compiled
    on first call with its own guards and entries. ``results`` keeps every capture made
    for this function, its resume functions and the user functions called at a break.
    """

    def __init__(self, fn: types.FunctionType, *, backend: str | Backend, fullgraph: bool,
                 dynamic: bool | None, mode: str | None, options: dict[str, Any] | None,
                 bound_self: Any = None) -> None:
        self.fn = fn
        self.backend = backend
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.options = dict(options or {})
        self.bound_self = bound_self
        self.binder = make_binder(fn)
        self.globals = fn.__globals__
        self.closure = fn.__closure__
        self.cache: dict[types.CodeType, list[Entry]] = {fn.__code__: []}
        self.entries = self.cache[fn.__code__]
        self.name = fn.__qualname__
        self.recompiles = 0
        self._warned_kwargs = False
        self.auto_dynamic: dict[str, set[int]] = {}
        """Automatic dynamic: input dims (by source expression) seen changing size."""
        self.auto_scalars: set[str] = set()
        """Automatic dynamic: int arguments (by source expression) seen changing value."""
        self.auto_modules: set[str] = set()
        """Module arguments seen to be a new module of the same class: type-guarded."""
        self.results: list[CaptureResult] = []
        self.root: CompiledFunction = self
        self.resumes: dict[tuple, ResumeFunction] = {}
        self.callees: weakref.WeakKeyDictionary[types.FunctionType, CompiledFunction] = \
            weakref.WeakKeyDictionary()
        self._logged_breaks: set[tuple] = set()
        self._warned = False
        self._warned_eager = False
        self._checked_graphs = False
        self._routed: dict[types.CodeType, types.FunctionType] = {}
        self._last_failure: str | None = None
        self._backend_fn: Backend | None = None
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)
        _ALL.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        L = self.binder(*args, **kwargs)
        out = self._dispatch(L, self.closure, args, kwargs)
        while type(out) is Continue:  # graph breaks: a flat trampoline, loops never nest
            out = out.target._dispatch(out.args, out.cells, out.args, None)
        if not self._checked_graphs and self.root is self:
            self._checked_graphs = True
            self._check_graphs()
        return out

    def _check_graphs(self) -> None:
        """After the first call: a function that broke and captured no graph at all ran
        entirely in Python, which the user must hear about."""
        if self.graph_count() or not self.results:
            return
        err = next((r.error for r in self.results if is_user_break(r)), None)
        if err is not None:
            self._warn_eager(f"{self.name} captured no graph and ran eagerly; the first break: "
                             f"{err.reason} at {where(err.loc)}")

    def _dispatch(self, L: tuple[Any, ...], C_: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        G = self.globals
        ver = module_version[0]
        for e in self.entries:
            if e.fast(L, G, C_) and (e.version == ver or e.revalidate(L, G, C_)):
                if e.eager:
                    return self._eager(C_, args, kwargs, e.routed)
                return e.run(L, G, C_)
        return self._miss(args, kwargs, L, C_)

    def _eager(self, C_: Any, args: tuple[Any, ...], kwargs: Any,
               code: types.CodeType | None = None) -> Any:
        if code is None:
            return self.fn(*args, **kwargs)
        routed = self._routed.get(code)
        if routed is None:  # made once per routed code object, then called like fn
            fn = self.fn
            routed = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
            routed.__kwdefaults__ = fn.__kwdefaults__
            self._routed[code] = routed
        return routed(*args, **kwargs)

    def _frame_code(self) -> types.CodeType:
        return self.fn.__code__

    def _capture(self, L: tuple[Any, ...], C_: Any) -> CaptureResult:
        return capture(self.fn, L, self.name, dynamic=self._policy())

    def _policy(self) -> DynamicPolicy:
        return DynamicPolicy(self.dynamic, self.auto_dynamic, frozenset(self.auto_scalars),
                             frozenset(self.auto_modules))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    # ----------------------------------------------------------------- graph breaks
    def resume_function(self, code: types.CodeType, offset: int, nulls: tuple[bool, ...],
                        local_names: tuple[str, ...]) -> ResumeFunction:
        """The resume function of ``code`` at ``offset`` for this stack layout (cached)."""
        root = self.root
        key = (code, offset, nulls, local_names, id(self.globals))
        rf = root.resumes.get(key)
        if rf is None:
            rf = root.resumes[key] = ResumeFunction(root, resume_code_for(code, offset, nulls, local_names),
                                                    self.globals)
        return rf

    def callee(self, fn: Any) -> Callable[..., Any] | None:
        """A user function called where a graph break happened inside it, compiled on its own.

        Bound methods and ``nn.Module`` s without hooks go through their function /
        ``forward`` (one compiled function per function, the instance as first argument)."""
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            inner = self.callee(fn.__func__)
            return None if inner is None else functools.partial(inner, fn.__self__)
        if isinstance(fn, torch.nn.Module) and not isinstance(fn, CompiledModule) and \
                isinstance(type(fn).forward, types.FunctionType) and \
                (not _has_hooks(fn) or python_hooks(fn)):
            inner = self.callee(type(fn).forward)
            if inner is None:
                return None
            if _has_hooks(fn):  # hooks in Python around the compiled forward (FSDP2's)
                return functools.partial(call_with_hooks, fn, functools.partial(inner, fn))
            return functools.partial(inner, fn)
        if not isinstance(fn, types.FunctionType) or fn.__code__.co_flags & 0x3A0 or \
                not all(n.isidentifier() for n in fn.__code__.co_varnames):  # comprehensions (3.11)
            return None
        root = self.root
        cf = root.callees.get(fn)
        if cf is None:
            cf = CompiledFunction(fn, backend=root.backend, fullgraph=False, dynamic=root.dynamic,
                                  mode=root.mode, options=root.options)
            cf.root = root
            root.callees[fn] = cf
        return cf

    def _record(self, result: CaptureResult, routed: bool = False) -> None:
        result.part = self.root is not self
        result.debug_name = observe.entry_folder(self, result.name)  # one folder per entry
        self.root.results.append(result)
        _write_debug(result)
        err = result.error
        if not is_user_break(result):
            return
        if self.root.fullgraph:
            raise GraphBreakInFullgraph(err) from err
        # once per break and per way of handling it (resumed, routed, run eagerly)
        handling = "resume" if result.plan is not None else "route" if routed else "eager"
        key = (err.loc.file, err.loc.line, err.reason, handling) if err.loc is not None else \
            (err.reason, handling)
        if key not in self.root._logged_breaks:
            self.root._logged_breaks.add(key)
            fallback = getattr(err, "fallback", None) or "cannot resume"
            if result.plan is not None:
                how = "resuming after it"
            elif routed:
                how = (f"running {self.name} in Python ({fallback}); the call that broke is "
                       f"compiled as a frame of its own")
            else:
                how = f"running the frame eagerly ({fallback})"
            C.logger("breaks").info("graph break in %s: %s%s; %s", self.name, err,
                                    break_stack(err), how)
            if result.plan is None and not routed:
                self.root._warn_eager(f"{self.name} runs eagerly, with everything it calls: "
                                      f"{err.reason} at {where(err.loc)} ({fallback})")

    def _warn_eager(self, message: str) -> None:
        """Say once per compiled function that a real part of it runs eagerly."""
        if self._warned_eager:
            return
        self._warned_eager = True
        warnings.warn(f"torchfuse: {message}. TORCHFUSE_LOGS=breaks shows every break; "
                      f"explain() shows them with the graphs.", EagerFallbackWarning,
                      stacklevel=_user_stacklevel())

    # ----------------------------------------------------------------- misses
    def _miss(self, args: tuple[Any, ...], kwargs: Any, L: tuple[Any, ...], C_: Any) -> Any:
        G = self.globals
        binder = getattr(self, "binder", None)
        if binder is not None and (binder.__defaults__ is not self.fn.__defaults__ or
                                   binder.__kwdefaults__ is not self.fn.__kwdefaults__):
            # fn.__defaults__ was replaced (its entries' guards say so): bind the new ones
            self.binder = make_binder(self.fn)
            L = self.binder(*args, **kwargs)
        with self._lock:  # one capture at a time per function: one entry per guard set
            ver = module_version[0]
            # another thread may have made the entry while this one waited
            entry = next((e for e in self.entries if e.fast(L, G, C_) and
                          (e.version == ver or e.revalidate(L, G, C_))), None)
            over = None
            new = entry is None
            if entry is None:
                # capture and backend call with the collector paused: their allocations kept
                # starting full collections, which walk the whole process (a loaded model)
                with gc_paused():
                    entry, over = self._new_entry(L, C_)
        if entry is None:  # the entry runs outside the lock: it may call other compiled code
            return self._over_limit(C_, args, kwargs, over)
        if entry.eager:
            return self._eager(C_, args, kwargs, entry.routed)
        if not new:
            return entry.run(L, G, C_)
        try:
            return entry.run(L, G, C_)
        finally:  # the entry's first call: its stage timings on perf_hints, the progress line ended
            observe.flush_timings(_debug_name(entry.result))

    def _new_entry(self, L: tuple[Any, ...], C_: Any) -> tuple[Entry | None, str | None]:
        """Capture and compile an entry for this call (``None`` and the failing guard when
        the recompile limit is reached)."""
        G = self.globals
        changes: list[SizeChange] = []
        ints: list[ScalarChange] = []
        if self.entries:
            failure = self._failure_reason(L, C_)
            if len(self.entries) >= C.config.recompile_limit:
                return None, failure
            self.recompiles += 1
            C.logger("recompiles").info("recompiling %s (entry %d): guard failed: %s",
                                        self.name, len(self.entries) + 1, failure)
            if self.dynamic is None:  # automatic dynamic: sizes that changed become symbols
                changes = size_changes([(e.result.checks.entries, e.result.checks.namespace)
                                        for e in self.entries], L, G, C_)
                for ch in changes:
                    self.auto_dynamic.setdefault(ch.source, set()).add(ch.dim)
                ints = [ch for ch in scalar_changes([e.result.checks.entries for e in self.entries], L)
                        if ch.source not in self.auto_scalars]
                self.auto_scalars.update(ch.source for ch in ints)
            # a module made in the frame reaches a resume function anew on each call: type-
            # guarded from now on (the first entry keeps serving its module by identity)
            for src in module_changes([e.result.checks for e in self.entries], L):
                if self.dynamic is not False and src not in self.auto_modules:
                    self.auto_modules.add(src)
                    C.logger("recompiles").info("%s: %s is a new module of the same class; recompiling "
                                                "with it guarded on its type", self.name, src)
        kept = self._keeps_entries()
        result = entry_cache.load(self.fn, self.dynamic, self.name, L, C_, CaptureResult) if kept else None
        if result is None:
            result = self._capture(L, C_)
        for ic in ints:
            symbol = result.scalar_symbols.get(ic.source)
            what = "a symbol" if type(ic.new) is int else "a graph input"
            how = f"recompiling with it {what} ({symbol})" if symbol is not None else \
                "it stays a constant in the new entry (ints below 2 are never symbolic)"
            C.logger("recompiles").info("%s: %s changed %r -> %r; %s", self.name, ic.display,
                                        ic.old, ic.new, how)
        for ch in changes:
            symbol = result.dynamic_dims.get((ch.source, ch.dim))
            why = "sizes 0 and 1 are never symbolic" if ch.new < 2 else \
                "outside its mark_dynamic range, or a layout whose strides cannot be symbolic"
            how = f"recompiling with it dynamic ({symbol})" if symbol is not None else \
                f"it stays specialized in the new entry ({why})"
            C.logger("recompiles").info("%s: %s.size(%d) changed %d -> %d; %s", self.name,
                                        ch.display, ch.dim, ch.old, ch.new, how)
        routed = None
        if result.error is not None and result.plan is None:
            routed = codegen.routed_eager_code(result.error, self._frame_code(), self)
        self._record(result, routed is not None)
        if result.error is not None and result.plan is None:
            entry = Entry(result, None)
            entry.routed = routed
        else:
            _log_graph(result)
            compiled = self._compile_graph(result, L, C_)
            try:
                entry = Entry(result, compiled, self)
            except Exception as e:  # a bug in resumption must not break the program: eager
                if result.plan is None:
                    raise
                result.plan = None
                result.error.fallback = f"internal error preparing the resume: {type(e).__name__}: {e}"
                entry = Entry(result, None)
            else:
                entry.params = entry.fetch_params(L, G, C_)
                if kept and not result.from_disk:
                    why = entry_cache.keep(self.fn, self.dynamic, result, L, C_)
                    if why is not None:
                        C.logger("recompiles").debug("%s: entry not kept for later processes: %s",
                                                     self.name, why)
        if result.uses_modules:
            watch_module_attributes()
        entry.version = module_version[0]
        self.entries.append(entry)
        return entry, None

    def _keeps_entries(self) -> bool:
        """Whether this function's entries are kept on disk and looked up there
        (`torchfuse.capture.entry_cache`): a whole function (no resume function or callee),
        outside DDP, while automatic dynamic has made nothing dynamic."""
        return C.config.capture_cache and type(self) is CompiledFunction and self.root is self and \
            isinstance(self.fn, types.FunctionType) and not self.auto_dynamic and \
            not self.auto_scalars and not self.auto_modules and D.active_ddp() is None

    def _compile_graph(self, result: CaptureResult, L: tuple[Any, ...], C_: Any) -> Callable[..., list[Any]]:
        graph = result.graph
        if not graph.nodes:  # a break before any torch op: nothing worth a backend call
            return lambda *inputs: run_graph(graph, *inputs)
        if self._backend_fn is None:
            self._backend_fn = lookup_backend(self.backend)
        ns = dict(result.checks.namespace)
        gather, fetch = _gather_functions(result.inputs, ns)
        with pyrandom.states_kept(result.random_generators):  # the call draws them again
            examples = list(gather(L, self.globals, C_, fetch(L, self.globals, C_)))
        # Every stage the backend runs (aot, inductor, ...) files its artifacts under this graph.
        kwargs = self._backend_kwargs()
        with observe.compiling(_debug_name(result)), \
                torch.enable_grad() if result.grad_entry else contextlib.nullcontext():
            ddp = D.active_ddp()
            if ddp is None:
                compiled = self._backend_fn(result.graph, examples, **kwargs)
            else:  # pieces per DDP bucket, so that all-reduces overlap the backward
                compiled, result.ddp_plan = D.split_for_ddp(
                    result.graph, examples, ddp, lambda g, ex: self._backend_fn(g, ex, **kwargs),
                    self.root.name)
        if not result.grad_entry:
            return compiled
        # the mode the code leaves on (it left the region, or not), as eager leaves it
        modes = [bool(n.args[0].value) for n in graph.nodes if n.op == SET_GRAD_ENABLED]

        def with_grad(*inputs: Any) -> list[Any]:
            try:
                torch.set_grad_enabled(True)
                return compiled(*inputs)
            finally:
                torch.set_grad_enabled(modes[-1])
        return with_grad

    def _backend_kwargs(self) -> dict[str, Any]:
        """``mode`` and ``options`` for the backend, when the user gave them and the backend
        takes them (a backend without them gets neither, and a warning says they were ignored)."""
        given = {k: v for k, v in (("mode", self.mode), ("options", self.options)) if v}
        if not given:
            return {}
        accepted = backend_parameters(self._backend_fn)
        taken = {k: v for k, v in given.items() if accepted is None or k in accepted}
        ignored = sorted(set(given) - set(taken))
        if ignored and not self._warned_kwargs:
            self._warned_kwargs = True
            warnings.warn(f"torchfuse: backend {self.backend!r} takes no {' or '.join(ignored)}; "
                          f"ignoring {', '.join(f'{k}={given[k]!r}' for k in ignored)}",
                          RuntimeWarning, stacklevel=_user_stacklevel())
        return taken

    def _failure_reason(self, L: tuple[Any, ...], C_: Any) -> str:
        e = self.entries[-1]
        failed = e.result.checks.first_failure(L, self.globals, C_)
        if failed is None:
            return "no entry matched"
        loc = failed.record.loc
        text = describe_guard(failed.record) + out_of_range(failed, e.result.checks.namespace, L,
                                                            self.globals, C_)
        self._last_failure = text
        if loc is None:
            return text
        return f"{text}  (guard from {loc.file}:{loc.line}: {loc.text or loc.function})"

    def _over_limit(self, C_: Any, args: tuple[Any, ...], kwargs: Any, failure: str) -> Any:
        msg = (f"torchfuse: {self.name} hit the recompile limit ({C.config.recompile_limit}); "
               f"the guard that kept failing: {failure}. Running it eagerly from now on. "
               "Raise torchfuse.capture.config.recompile_limit, or make the changing value a "
               "tensor or constant.")
        if C.config.raise_on_recompile_limit:
            raise RecompileLimitExceeded(msg)
        if not self._warned:
            self._warned = True
            warnings.warn(msg, RuntimeWarning, stacklevel=_user_stacklevel())
        return self._eager(C_, args, kwargs)

    def graph_count(self) -> int:
        """Graphs captured so far, resume functions included (see `counts_as_graph`)."""
        return sum(1 for r in self.results if counts_as_graph(r))

    def reset(self) -> None:
        for entries in self.cache.values():
            entries.clear()
        self.results.clear()
        self.resumes.clear()
        self.callees.clear()
        self._logged_breaks.clear()
        self.recompiles = 0
        self.auto_dynamic.clear()
        self.auto_scalars.clear()
        self.auto_modules.clear()
        self._warned = False
        self._warned_eager = False
        self._checked_graphs = False


_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_MODULE_CALL_FILE = torch.nn.modules.module.__file__


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the user's call, for a warning raised by this function's caller.

    A fixed number goes stale whenever the call path changes (modules, resume trampolines,
    compiled callees): skip every frame of this package, of its generated code and of
    ``nn.Module.__call__`` instead."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith((_CAPTURE_DIR, "<torchfuse "))
                                 or frame.f_code.co_filename == _MODULE_CALL_FILE):
        frame, level = frame.f_back, level + 1
    return level


def _has_hooks(mod: torch.nn.Module) -> bool:
    hooks = torch.nn.modules.module
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or
                getattr(mod, "_backward_pre_hooks", None) or
                getattr(mod, "_forward_hooks_with_kwargs", None) or
                hooks._global_forward_hooks or hooks._global_forward_pre_hooks or
                getattr(hooks, "_global_backward_hooks", None) or
                getattr(hooks, "_global_backward_pre_hooks", None))


class ResumeFunction(CompiledFunction):
    """The continuation of a function after a graph break, compiled like any function.

    Its code is generated (`torchfuse.capture.codegen.resume_code`); its arguments are
    the live stack values and locals, its closure the live cells (new on every call, so
    they are passed per call rather than fixed on the object)."""

    def __init__(self, root: CompiledFunction, code: types.CodeType, f_globals: dict[str, Any]) -> None:
        self.code = code
        self.fn = codegen.make_function(code, f_globals, ())  # for names; never called
        self.backend = root.backend
        self.fullgraph = root.fullgraph
        self.dynamic, self.mode, self.options = root.dynamic, root.mode, root.options
        self.bound_self = None
        self.globals = f_globals
        """The globals of the function it continues (a compiled callee's, not the root's)."""
        self.closure = None
        self.entries: list[Entry] = []
        self.cache = {code: self.entries}
        self.name = code.co_qualname
        self.recompiles = 0
        self.auto_dynamic = {}
        self.auto_scalars = set()
        self.auto_modules = set()
        self.results = []
        self.root = root
        self.resumes = {}
        self.callees = weakref.WeakKeyDictionary()
        self._logged_breaks = set()
        self._warned = False
        self._warned_eager = False
        self._checked_graphs = False
        self._last_failure = None
        self._backend_fn = None
        self._lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - not user-facing
        raise TypeError("resume functions are called by the trampoline")

    def _eager(self, C_: Any, args: tuple[Any, ...], kwargs: Any,
               code: types.CodeType | None = None) -> Any:
        return codegen.make_function(code or self.code, self.globals, C_)(*args)

    def _frame_code(self) -> types.CodeType:
        return self.code

    def _capture(self, L: tuple[Any, ...], C_: Any) -> CaptureResult:
        fn = codegen.make_function(self.code, self.globals, C_)
        return capture(fn, L, self.name, wrap_arg=wrap_resume_arg, dynamic=self._policy())


class EagerFallbackWarning(RuntimeWarning):
    """A compiled function runs a real part of its work eagerly (no graph, or a whole frame
    with everything it calls). Filter it with `warnings`."""


def _log_graph(result: CaptureResult) -> None:
    if C.log_enabled("graph"):
        g = result.graph
        lines = [f"captured {g.name}: {len(g.inputs)} inputs, {len(g.nodes)} nodes"]
        lines += [f"  {n.name} = {n.op}({', '.join(map(str, n.args))})" for n in g.nodes]
        C.logger("graph").info("\n".join(lines))
    if C.log_enabled("guards"):
        C.logger("guards").info("guards of %s:\n%s", result.name,
                                "\n".join("  " + describe_guard(r) for r in result.graph.guards))


def _debug_name(result: CaptureResult) -> str:
    return result.debug_name or result.name.replace("<", "").replace(">", "")


def _write_debug(result: CaptureResult) -> None:
    """The captured graph as Python (``graph.py``), its guards (``guards.txt``: the records,
    then the generated check function) and the break if any, for ``TORCHFUSE_DEBUG=1`` and
    artifact collectors ([`torchfuse.graph.observe`][torchfuse.graph.observe])."""
    name = _debug_name(result)
    if not observe.wants_artifacts():
        with observe.compiling(name):  # perf_hints and the progress line want it too
            observe.record_time("capture", result.seconds)
            observe.record_count("capture.from_disk", int(result.from_disk))
        return
    with observe.compiling(name):
        observe.record_time("capture", result.seconds)
        observe.record_count("capture.from_disk", int(result.from_disk))
        if result.graph is not None:
            observe.emit("graph.py", to_python(result.graph))
            records = "\n".join(describe_guard(r) + (f"    # {r.loc}" if r.loc else "")
                                for r in result.graph.guards)
            observe.emit("guards.txt", f"{records}\n\n# the generated check function\n"
                                       f"{result.checks.source}")
        if result.error is not None:
            observe.emit("graph_break.txt", str(result.error))


def _call_module(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


class CompiledModule(torch.nn.Module):
    """Wraps an ``nn.Module``; ``forward`` is compiled, parameters and state are shared.

    A module of its own with the original as its child ``_orig_mod`` (``modules()`` lists
    both, as with torch.compile's wrapper); parameters and ``state_dict`` keep the original's
    names; attribute reads go to the original. While the original has hooks, a call goes
    through ``module(*args)``, compiled on its own: forward hooks are traced, backward and
    global hooks break the graph (docs/semantics.md, "Modules").
    """

    def __init__(self, module: torch.nn.Module, compiled: CompiledFunction) -> None:
        super().__init__()
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_hooked", None)
        self._modules["_orig_mod"] = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if _has_hooks(self._orig_mod):
            if python_hooks(self._orig_mod):  # FSDP2's: unshard, compiled forward, reshard
                return call_with_hooks(self._orig_mod, self._compiled, *args, **kwargs)
            return self._with_hooks()(self._orig_mod, *args, **kwargs)
        return self._compiled(*args, **kwargs)

    def _with_hooks(self) -> CompiledFunction:
        hooked = self._hooked
        if hooked is None:
            c = self._compiled
            hooked = CompiledFunction(_call_module, backend=c.backend, fullgraph=c.fullgraph,
                                      dynamic=c.dynamic, mode=c.mode, options=c.options)
            object.__setattr__(self, "_hooked", hooked)
        return hooked

    def graph_count(self) -> int:
        """Graphs captured so far for ``forward`` (see `CompiledFunction.graph_count`)."""
        hooked = self._hooked
        return self._compiled.graph_count() + (hooked.graph_count() if hooked is not None else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_orig_mod"], name)

    # state is the original module's: same keys, same tensors
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_parameters(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Any:
        return self._orig_mod.parameters(recurse)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_buffers(*args, **kwargs)

    def buffers(self, recurse: bool = True) -> Any:
        return self._orig_mod.buffers(recurse)

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)
        return self

    @property
    def training(self) -> bool:  # type: ignore[override]
        return self.__dict__["_orig_mod"].training

    @training.setter
    def training(self, value: bool) -> None:
        if "_orig_mod" in self.__dict__:
            self._orig_mod.training = value

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"


def compile(fn_or_module: Any = None, *, backend: str | Backend | None = None,
            fullgraph: bool = False, dynamic: bool | None = None, mode: str | None = None,
            options: dict[str, Any] | None = None) -> Any:
    """Compile a function or ``nn.Module`` with torchfuse.

    Usable as ``compile(fn)``, ``@compile`` and ``@compile(backend="eager")``. The first call
    captures the bytecode into a Graph with guards and hands it to the backend; later calls
    whose guards hold reuse it, and a call whose guards fail recompiles (up to
    ``config.recompile_limit`` entries, then the function runs eagerly, with a warning). A graph
    break compiles the graph up to it, runs the unsupported line in Python and resumes capture
    after it.

    Args:
        fn_or_module: A Python function, a bound method, or an ``nn.Module`` (its ``forward``
            is compiled). Omitted, ``compile(...)`` returns a decorator.
        backend: What turns each captured Graph into a callable: a name registered under the
            ``torchfuse.backends`` entry-point group (``"inductor"``, ``"aot_eager"``,
            ``"eager"``, ``"cudagraphs"``, or a third-party one; see
            [`list_backends`][torchfuse.capture.list_backends]), an entry-point value
            ``"package.module:function"``, or a callable
            ``backend(graph, example_inputs) -> callable``. ``None`` (the default) takes
            ``config.default_backend``: the ``TORCHFUSE_BACKEND`` environment variable when
            set, else ``"inductor"``.
        fullgraph: Raise [`GraphBreakInFullgraph`][torchfuse.capture.GraphBreakInFullgraph]
            at the first graph break instead of splitting the graph there.
        dynamic: Which input sizes are symbolic. ``None`` (automatic dynamic) specializes
            every size first and makes a dimension symbolic when a call with another size
            recompiles; ``True`` makes every dimension of size >= 2 of every input tensor
            symbolic from the first call; ``False`` never (one entry per size). Parameters and
            buffers are always static, sizes 0 and 1 always specialized, and
            [`mark_dynamic`][torchfuse.capture.mark_dynamic] requests apply in every mode.
        mode: Passed to a backend that takes it. For ``inductor``: ``"default"``,
            ``"max-autotune"`` (Triton matmul templates with fused epilogues, autotuned) or
            ``"reduce-overhead"`` (calls replayed as CUDA graphs).
        options: Passed to a backend that takes it. For ``inductor``, overrides of
            [`InductorConfig`][torchfuse.inductor.InductorConfig] fields, e.g.
            ``{"persistent_rnumel_max": 1024}``. A backend that takes neither ``mode`` nor
            ``options`` gets neither, and a warning says they were ignored.

    Returns:
        A [`CompiledFunction`][torchfuse.capture.CompiledFunction] for a function, a
        [`CompiledModule`][torchfuse.capture.CompiledModule] (sharing the original's
        parameters, buffers and ``state_dict``) for a module, or a decorator when
        ``fn_or_module`` is omitted.

    Raises:
        BackendNotFound: ``backend`` (or ``TORCHFUSE_BACKEND``) names no installed backend;
            the message lists those that exist. Raised here, not at the first call (a name
            that is ``"inductor"`` is looked up at the first call, to keep ``compile`` cheap).
        AmbiguousBackend: Two installed packages register that name.
        TypeError: ``fn_or_module`` is not a function, method or module.

    Examples:
        >>> import torch
        >>> from torchfuse.capture import compile
        >>> f = compile(lambda x: x.sin() + 1, backend="eager")
        >>> x = torch.randn(3)
        >>> torch.equal(f(x), x.sin() + 1)
        True
    """
    origin = None
    if backend is None:
        backend, origin = C.config.default_backend, "config.default_backend / TORCHFUSE_BACKEND"
    kw = {"backend": backend, "fullgraph": fullgraph, "dynamic": dynamic, "mode": mode,
          "options": options}
    if fn_or_module is None:
        return lambda f: compile(f, **kw)
    if not callable(backend) and backend != "inductor":
        lookup_backend(backend, origin=origin)  # fail early on a misspelled name
    if isinstance(fn_or_module, torch.nn.Module):
        forward = type(fn_or_module).forward
        if not isinstance(forward, types.FunctionType):
            raise TypeError(f"cannot compile {type(fn_or_module).__name__}.forward "
                            f"of type {type(forward).__name__}")
        cf = CompiledFunction(forward, bound_self=fn_or_module, **kw)
        return CompiledModule(fn_or_module, cf)
    if isinstance(fn_or_module, types.MethodType):
        return CompiledFunction(fn_or_module.__func__, bound_self=fn_or_module.__self__, **kw)
    if isinstance(fn_or_module, types.FunctionType):
        return CompiledFunction(fn_or_module, **kw)
    raise TypeError(f"compile() takes a function or an nn.Module, not {type(fn_or_module).__name__}")


def reset() -> None:
    """Forget every compiled entry of every compiled function; each recompiles on its next call.

    Useful in tests and notebooks, after changing ``config`` or a global the guards do not watch.
    The entries kept on disk for later processes (`torchfuse.capture.entry_cache`) stay: the
    next call rebuilds one whose guards hold; ``config.capture_cache = False`` (or
    ``TORCHFUSE_CAPTURE_CACHE=0``) makes it capture instead.
    """
    for cf in list(_ALL):
        cf.reset()


__all__ = ["CompiledFunction", "CompiledModule", "EagerFallbackWarning", "Unsupported", "compile",
           "dynamic_requests", "mark_dynamic", "reset"]
