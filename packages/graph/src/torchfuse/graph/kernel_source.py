"""Kernel sources from data: the one form of Triton module torchfuse imports without trust.

A Program's ``Kernel.source`` (and the ``source`` of a ``torchfuse.triton_kernel`` node) is a
Python module that must be imported for Triton's ``@jit`` to see it, and importing a module
runs its top level; under ``TRITON_INTERPRET=1`` the kernel bodies run as Python too. So
before anything imports a source that came from an archive, `check_kernel_source`
parses it with `ast` and accepts only the shape our code generators and capture write::

    import triton
    import triton.language as tl

    XBLOCK_MAX = 1024                       # constants: literals, or tl.constexpr(literal)


    @triton.jit
    def _helper(a, b):
        return a * b


    @triton.jit
    def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(out_ptr0 + xindex, _helper(tl.load(in_ptr0 + xindex), 2.0), xindex < xnumel)

Precisely, at the top level:

* ``import M`` / ``import M as A`` / ``from M import n [as a]`` where ``M`` is ``triton``,
  ``math``, ``triton.language`` or a submodule of it (``triton.language.extra.libdevice``);
* ``NAME = literal``, ``NAME = tl.constexpr(literal)`` or ``NAME = other_kernel_function``
  (a literal is a number, string, bool or None, optionally negated);
* ``def`` statements with exactly one decorator, ``@triton.jit``, whose defaults are literals
  and whose annotations are literals or attribute chains such as ``tl.constexpr``;
* a docstring. Nothing else: no other import, call, class, ``if``, loop or assignment.

Inside a kernel function: assignments (plain, augmented, annotated), expression statements,
``if``/``for``/``while``/``return``/``pass``/``break``/``continue``/``assert``, and
expressions built of constants, names, operators, comparisons, conditional expressions,
subscripts, slices, tuples, lists, f-strings and calls. Refused: ``import``, ``global``,
``nonlocal``, nested ``def``/``class``/``lambda``, comprehensions, ``with``, ``try``,
``yield``, ``await``, ``**`` unpacking of mappings, and walrus assignments. A name read must be
a parameter or local of the function, a top-level constant or function of the module, a
name imported from an allowed module, or one of `BUILTINS`; a module name may only be
the root of an attribute chain, and a function may not assign to a module-level name. No
attribute may start with ``_`` (that closes every ``__class__``/``__globals__`` escape).

An attribute chain rooted at a module (``tl.math.exp``, ``tl.PropagateNan.ALL``) is resolved
against the installed modules: every module it passes through must be ``triton.language``
(or a submodule) or ``math``; on ``triton`` itself only `TRITON_ATTRIBUTES` are
allowed; it must not end at a module; a callable it ends at must be defined in
``triton.language`` or ``math``; any other value it ends at must be a number, a string or a
Triton value (a dtype, an enum member), never a container. So ``tl.core.builtins.exec`` or
``triton.runtime.build`` are refused. Without triton installed, chains are checked for
spelling only (nothing can run a Triton kernel then anyway).

Sources this process produced itself, or read back from the user's own compile cache, are not
checked: they are the user's code (through `mark_trusted`: capture's rebuilding of the user's
own ``@triton.jit`` kernels, and every Triton kernel of a Program the inductor's
``compile_graph`` compiled or found in its cache; see the trust model in the format docs).
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import threading
import types
from collections.abc import Iterator

MAX_SOURCE_LENGTH = 1 << 20
"""The longest kernel source accepted (1 MiB)."""

ALLOWED_MODULES = ("triton", "math", "triton.language")
"""Modules a kernel module may import; submodules of ``triton.language`` are allowed too."""

TRITON_ATTRIBUTES = frozenset({"jit", "cdiv", "next_power_of_2", "language"})
"""The attributes of the ``triton`` module a kernel source may use."""

BUILTINS = frozenset({
    "range", "min", "max", "abs", "float", "int", "bool", "len", "isinstance", "print", "tuple",
    "list", "zip", "enumerate", "True", "False", "None"})
"""Python builtins a kernel body may name: none of them reaches code, files or attributes."""

_STMTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.For, ast.While,
          ast.Return, ast.Pass, ast.Break, ast.Continue, ast.Assert)
_EXPRS = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Constant,
          ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Name, ast.Starred,
          ast.JoinedStr, ast.FormattedValue)
_GLUE = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop, ast.keyword)

_trusted: set[str] = set()
_trusted_lock = threading.Lock()


class KernelSourceError(ValueError):
    """A kernel source outside the accepted form (see the module doc); the message names the
    line and what was refused."""


def mark_trusted(source: str) -> None:
    """Record ``source`` as written by this process (not read from data): it is not checked."""
    with _trusted_lock:
        _trusted.add(source)


def is_trusted(source: str) -> bool:
    return source in _trusted


def check_kernel_source(source: str, entry: str | None = None) -> None:
    """Raise `KernelSourceError` unless ``source`` has the accepted form (and defines the
    ``@triton.jit`` function ``entry``, when given). Results are cached per source."""
    if isinstance(source, str) and is_trusted(source):
        return
    problem = _problem(source, entry)
    if problem is not None:
        raise KernelSourceError(problem)


@functools.lru_cache(maxsize=1024)
def _problem(source: str, entry: str | None) -> str | None:
    if not isinstance(source, str):
        return f"a kernel source is a string, not {type(source).__name__}"
    if len(source) > MAX_SOURCE_LENGTH:
        return f"the kernel source has {len(source)} characters, more than {MAX_SOURCE_LENGTH}"
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return f"the kernel source does not parse: {e}"
    try:
        functions = _Module(tree).check()
    except KernelSourceError as e:
        return str(e)
    if entry is not None and entry not in functions:
        return f"the kernel source defines no @triton.jit function {entry!r}"
    return None


def _fail(node: ast.AST | None, message: str) -> KernelSourceError:
    line = getattr(node, "lineno", None)
    where = f"kernel source, line {line}" if line else "kernel source"
    return KernelSourceError(f"{where}: {message}")


def _allowed_module(name: str) -> bool:
    return name in ALLOWED_MODULES or name.startswith("triton.language.")


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    return isinstance(node, ast.Constant) and (
        node.value is None or type(node.value) in (int, float, bool, str))


def _chain(node: ast.AST) -> tuple[str, list[str]] | None:
    """``("tl", ["math", "exp"])`` for ``tl.math.exp``; None when not rooted at a name."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    return (node.id, attrs) if isinstance(node, ast.Name) else None


def _import_allowed(name: str) -> types.ModuleType | None:
    """The installed module (only ever an allowed one), or None when triton is missing."""
    if not _allowed_module(name):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_resolved: set[tuple[str, ...]] = set()
"""Attribute chains `_resolve` accepted (the answer depends on the installed modules only):
a kernel names ``tl.load`` dozens of times, and a Program has dozens of kernels."""


def _resolve(node: ast.AST, module: str, attrs: list[str]) -> None:
    """Check an attribute chain rooted at ``module`` against the installed modules."""
    key = (module, *attrs)
    if key in _resolved:
        return
    _resolve_once(node, module, attrs)
    _resolved.add(key)


def _resolve_once(node: ast.AST, module: str, attrs: list[str]) -> None:
    for a in attrs:
        if a.startswith("_"):
            raise _fail(node, f"attribute {a!r} starts with an underscore")
    if module == "triton" and attrs and attrs[0] not in TRITON_ATTRIBUTES:
        raise _fail(node, f"triton.{attrs[0]} is not available to kernels (only {sorted(TRITON_ATTRIBUTES)})")
    obj: object = _import_allowed(module)
    if obj is None:
        return  # triton is not installed: spelling only
    path = module
    for a in attrs:
        try:
            obj = getattr(obj, a)
        except Exception:
            raise _fail(node, f"{path}.{a} does not exist") from None
        path += f".{a}"
        if isinstance(obj, types.ModuleType) and not _allowed_module(obj.__name__):
            raise _fail(node, f"{path} is the module {obj.__name__!r}, which kernels may not use")
    if not attrs:
        return
    if isinstance(obj, types.ModuleType):
        raise _fail(node, f"{path} is a module; a kernel may only use what is inside it")
    if callable(obj) and not _kernel_callable(obj):
        raise _fail(node, f"{path} is {obj!r}, which is not a Triton or math function")
    if not callable(obj) and not (obj is None or type(obj) in (int, float, bool, str)
                                  or type(obj).__module__.startswith("triton")):
        # a container could hold anything (a module, a function of any library)
        raise _fail(node, f"{path} is a {type(obj).__name__}, not a Triton value or a number")


def _kernel_callable(obj: object) -> bool:
    import triton

    if obj is triton.jit or obj is triton.cdiv or obj is triton.next_power_of_2:
        return True
    mod = getattr(obj, "__module__", None)
    if type(obj).__module__.startswith("triton.runtime") and callable(getattr(obj, "fn", None)):
        mod = getattr(obj.fn, "__module__", None)  # a @jit function of triton.language (interpreted or not)
    # while an interpreted kernel runs (TRITON_INTERPRET=1), Triton's interpreter temporarily
    # replaces the builtins of triton.language by wrappers of its own module
    return isinstance(mod, str) and (mod.startswith(("triton.language", "triton.runtime.interpreter"))
                                     or mod == "math")


class _Module:
    """The top-level checks; names bound at the top level and what they are."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.modules: dict[str, str] = {}    # alias -> module name
        self.imported: set[str] = set()      # names imported from an allowed module
        self.constants: set[str] = set()
        self.functions: set[str] = set()

    def names(self) -> set[str]:
        return set(self.modules) | self.imported | self.constants | self.functions

    def bind(self, node: ast.AST, name: str) -> None:
        if name.startswith("__") or name in self.names() or name in BUILTINS:
            raise _fail(node, f"the top-level name {name!r} is reserved or bound twice")

    def check(self) -> set[str]:
        for i, stmt in enumerate(self.tree.body):
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
                    stmt.value.value, str):
                continue  # a docstring
            if isinstance(stmt, ast.Import):
                self.import_(stmt)
            elif isinstance(stmt, ast.ImportFrom):
                self.import_from(stmt)
            elif isinstance(stmt, ast.Assign):
                self.constant(stmt)
            elif isinstance(stmt, ast.FunctionDef):
                self.function(stmt)
            else:
                raise _fail(stmt, f"top-level {type(stmt).__name__} statement (statement {i + 1}); a "
                                  "kernel module holds only imports, constants and @triton.jit functions")
        return self.functions

    def import_(self, stmt: ast.Import) -> None:
        for alias in stmt.names:
            if not _allowed_module(alias.name):
                raise _fail(stmt, f"import of {alias.name!r}; kernels may import only {ALLOWED_MODULES} "
                                  "and submodules of triton.language")
            if alias.asname is None:  # "import triton.language" binds "triton"
                root = alias.name.split(".")[0]
                if self.modules.get(root) != root:
                    self.bind(stmt, root)
                self.modules[root] = root
            else:
                self.bind(stmt, alias.asname)
                self.modules[alias.asname] = alias.name
            if _import_allowed(alias.name) is None and _import_allowed("triton") is not None:
                raise _fail(stmt, f"module {alias.name!r} does not exist")

    def import_from(self, stmt: ast.ImportFrom) -> None:
        module = stmt.module or ""
        if stmt.level or not _allowed_module(module):
            raise _fail(stmt, f"import from {module!r}; kernels may import only from {ALLOWED_MODULES} "
                              "and submodules of triton.language")
        for alias in stmt.names:
            if alias.name == "*" or alias.name.startswith("_"):
                raise _fail(stmt, f"'from {module} import {alias.name}' is not allowed")
            name = alias.asname or alias.name
            self.bind(stmt, name)
            sub = f"{module}.{alias.name}"
            if _allowed_module(sub) and _import_allowed(sub) is not None:
                self.modules[name] = sub
                continue
            _resolve(stmt, module, [alias.name])
            self.imported.add(name)

    def constant(self, stmt: ast.Assign) -> None:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            raise _fail(stmt, "a top-level assignment binds exactly one name")
        name, value = stmt.targets[0].id, stmt.value
        if isinstance(value, ast.Name) and value.id in self.functions | self.constants:
            self.bind(stmt, name)
            (self.functions if value.id in self.functions else self.constants).add(name)
            return
        if isinstance(value, ast.Call) and not value.keywords and len(value.args) == 1 and _literal(
                value.args[0]):
            chain = _chain(value.func)
            if chain and chain[0] in self.modules and chain[1][-1:] == ["constexpr"]:
                _resolve(value, self.modules[chain[0]], chain[1])
                value = value.args[0]
        if not _literal(value):
            raise _fail(stmt, f"the top-level value of {name!r} is not a literal or tl.constexpr(literal)")
        self.bind(stmt, name)
        self.constants.add(name)

    def function(self, fn: ast.FunctionDef) -> None:
        if len(fn.decorator_list) != 1 or not self.is_jit(fn.decorator_list[0]):
            raise _fail(fn, f"function {fn.name!r} must have exactly one decorator, @triton.jit")
        self.bind(fn, fn.name)
        args = fn.args
        if args.vararg or args.kwarg:
            raise _fail(fn, f"function {fn.name!r} takes *args or **kwargs")
        for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            if not _literal(d):
                raise _fail(d, f"a default of {fn.name!r} is not a literal")
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for p in params:
            if p.arg.startswith("__"):
                raise _fail(fn, f"parameter {p.arg!r} of {fn.name!r} is a dunder name")
            self.annotation(p.annotation)
        self.annotation(fn.returns)
        # the function's own name is bound first, so a recursive call is allowed
        self.functions.add(fn.name)
        _Body(self, fn, {p.arg for p in params}).check()

    def is_jit(self, node: ast.AST) -> bool:
        chain = _chain(node)
        return bool(chain) and self.modules.get(chain[0]) == "triton" and chain[1] == ["jit"]

    def annotation(self, node: ast.AST | None) -> None:
        if node is None or _literal(node):
            return
        chain = _chain(node)
        if chain is None or chain[0] not in self.modules or not chain[1]:
            raise _fail(node, "an annotation must be a literal or an attribute of an allowed module")
        _resolve(node, self.modules[chain[0]], chain[1])


class _Kind(enum.Enum):
    """What `_Body.node` does with a node of a type (decided once per type, `_kind`)."""

    OK = 0
    NAME = 1
    ATTRIBUTE = 2
    KEYWORD = 3
    BAD_STATEMENT = 4
    BAD_EXPRESSION = 5


def _kind(t: type) -> _Kind:
    if issubclass(t, ast.stmt):
        return _Kind.OK if issubclass(t, _STMTS) else _Kind.BAD_STATEMENT
    if issubclass(t, ast.keyword):
        return _Kind.KEYWORD
    if issubclass(t, _GLUE) or issubclass(t, ast.arguments | ast.arg):
        return _Kind.OK
    if not issubclass(t, _EXPRS):
        return _Kind.BAD_EXPRESSION
    if issubclass(t, ast.Name):
        return _Kind.NAME
    return _Kind.ATTRIBUTE if issubclass(t, ast.Attribute) else _Kind.OK


_KINDS: dict[type, _Kind] = {}


class _Body:
    """The checks of one ``@triton.jit`` function's body."""

    def __init__(self, module: _Module, fn: ast.FunctionDef, params: set[str]) -> None:
        self.m = module
        self.fn = fn
        # one traversal gives every node with its parent and the names the body binds (a
        # name may be read before the line that binds it: loops); the checks then run over it
        self.nodes = list(self.walk())
        self.local = set(params) | {n.id for n, _ in self.nodes if isinstance(n, ast.Name)
                                    and isinstance(n.ctx, ast.Store)}

    def check(self) -> None:
        clash = self.local & (self.m.names() | BUILTINS)
        if clash:
            raise _fail(self.fn, f"function {self.fn.name!r} rebinds the module-level or builtin "
                                 f"name(s) {sorted(clash)}")
        for node, parent in self.nodes:
            self.node(node, parent)

    def walk(self) -> Iterator[tuple[ast.AST, ast.AST | None]]:
        """``(node, parent)`` for every node of the body and of the parameters' annotations,
        breadth first from each statement (the order of ``ast.walk``)."""
        roots = list(self.fn.body)
        roots += [p.annotation for p in [*self.fn.args.posonlyargs, *self.fn.args.args,
                                         *self.fn.args.kwonlyargs] if p.annotation is not None]
        AST = ast.AST
        for root in roots:
            # a list read while it grows is the queue (what ``ast.iter_child_nodes`` yields,
            # without a generator per node: a warm start checks every kernel of a model)
            level: list[tuple[ast.AST, ast.AST | None]] = [(root, None)]
            i = 0
            while i < len(level):
                node = level[i][0]
                i += 1
                for field in node._fields:
                    child = getattr(node, field, None)
                    if isinstance(child, AST):
                        level.append((child, node))
                    elif isinstance(child, list):
                        level.extend((c, node) for c in child if isinstance(c, AST))
            yield from level

    def node(self, node: ast.AST, parent: ast.AST | None) -> None:
        kind = _KINDS.get(type(node))
        if kind is None:
            kind = _KINDS[type(node)] = _kind(type(node))
        if kind is _Kind.OK:
            return
        if kind is _Kind.NAME:
            self.name(node, parent)  # type: ignore[arg-type]
        elif kind is _Kind.ATTRIBUTE:
            self.attribute(node, parent)  # type: ignore[arg-type]
        elif kind is _Kind.KEYWORD:
            if node.arg is None:  # type: ignore[attr-defined]
                raise _fail(node, f"'**' unpacking in kernel {self.fn.name!r}")
        elif kind is _Kind.BAD_STATEMENT:
            raise _fail(node, f"{type(node).__name__} statement in kernel {self.fn.name!r}")
        else:
            raise _fail(node, f"{type(node).__name__} expression in kernel {self.fn.name!r}")

    def name(self, node: ast.Name, parent: ast.AST | None) -> None:
        n = node.id
        if n.startswith("__"):
            raise _fail(node, f"the name {n!r}")
        if isinstance(node.ctx, ast.Store) or n in self.local:
            return
        if n in self.m.modules:
            if not (isinstance(parent, ast.Attribute) and parent.value is node):
                raise _fail(node, f"the module {n!r} used as a value (only its attributes may be used)")
            return
        if n in self.m.constants | self.m.functions | self.m.imported or n in BUILTINS:
            return
        raise _fail(node, f"kernel {self.fn.name!r} reads the name {n!r}, which is neither its own, "
                          "the module's, nor an allowed builtin")

    def attribute(self, node: ast.Attribute, parent: ast.AST | None) -> None:
        if node.attr.startswith("_"):
            raise _fail(node, f"attribute {node.attr!r} starts with an underscore")
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the outermost attribute of a chain checks the whole chain
        chain = _chain(node)
        if chain is not None and chain[0] in self.m.modules and chain[0] not in self.local:
            _resolve(node, self.m.modules[chain[0]], chain[1])
            return
        base = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Constant):
            raise _fail(node, f"attribute {node.attr!r} of a constant")


__all__ = ["ALLOWED_MODULES", "BUILTINS", "MAX_SOURCE_LENGTH", "TRITON_ATTRIBUTES", "KernelSourceError",
           "check_kernel_source", "is_trusted", "mark_trusted"]
