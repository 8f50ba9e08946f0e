"""Values and sources written as data, and read back without running anything.

What `torchfuse.capture.entry_cache` keeps of a captured entry names objects of the process
that captured it: the classes and functions its guards compare by identity, the constants
they compare by value, the sources (``L[0]._modules['h']``) they read. This module writes
each as plain data (lists, strings, numbers: what msgpack holds) and reads it back in another
process:

* constants (``None``, bools, ints, floats as hex, strings, bytes, tuples, lists, sets,
  dicts of them), dtypes, devices and enum members: by value;
* classes and builtins by module and qualified name, functions also by a digest of their
  code (`code_digest`), looked up only in modules the process has already imported, from
  their ``__dict__`` s: nothing is imported and no ``__getattr__`` runs; a decorated
  function (``functools.wraps``) as the one its wrappers wrap;
* the compiled function itself, and the module a ``forward`` is called on, by role
  (``["compiled_fn"]``, ``["argument", i]``): bound to the loading call's;
* sources as records of their fields, each checked on reading (names are identifiers,
  keys are literals, module tables are the three of ``nn.Module``), so that what a source
  prints is an expression of reads only; `checked_expr` accepts an expression string
  only when it parses to such a source and prints back identically.

Anything else raises `NotPortable`, and the entry holding it is not kept.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import keyword
import sys
import types
import weakref
from typing import Any

import torch
from torchfuse.capture import source as SRC
from torchfuse.capture.variables import HEAPTYPE
from torchfuse.graph.ops import dtype_name, to_dtype

MAX_DEPTH = 32
"""Nesting of sources and values read from a file."""


class NotPortable(Exception):
    """Something an entry holds has no description a later process can resolve."""


# ----------------------------------------------------------------------------- describing values

_DIGESTS: dict[int, tuple[weakref.ref[types.CodeType], str]] = {}
"""``code_digest`` per code object of this process (by identity: equal code objects may differ
in ``co_qualname``), so that guards naming one function many times hash it once."""


def code_digest(code: types.CodeType, h: Any = None) -> str:
    """A digest of what ``code`` does: bytecode, constants (nested code too), names, flags."""
    top = h is None
    if top:
        hit = _DIGESTS.get(id(code))
        if hit is not None and hit[0]() is code:
            return hit[1]
    h = h or hashlib.sha256()
    for part in (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 code.co_qualname, code.co_flags, code.co_argcount, code.co_kwonlyargcount,
                 code.co_posonlyargcount):
        h.update(repr(part).encode() + b"\0")
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            code_digest(c, h)
        else:
            h.update(f"{type(c).__name__}:{c!r}".encode() + b"\0")
    if not top:
        return ""
    digest = h.hexdigest()
    key = id(code)
    _DIGESTS[key] = (weakref.ref(code, lambda _: _DIGESTS.pop(key, None)), digest)  # gone with it
    return digest


def _lookup(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names in an already imported module, read from the
    ``__dict__`` s only (nothing imported, no ``__getattr__`` runs); ``None`` if absent."""
    obj: Any = sys.modules.get(module)
    if obj is None or "<" in qualname:
        return None
    for part in qualname.split("."):
        d = getattr(obj, "__dict__", None)
        if not isinstance(d, dict | types.MappingProxyType) or part not in d:
            return None
        obj = d[part]
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
    return obj


class Describer:
    """Writes values as data (``describe``) and reads them back (``resolve``)."""

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn

    def describe(self, v: Any, depth: int = 0) -> list[Any]:
        if depth > MAX_DEPTH:
            raise NotPortable("a value nested too deep")
        t = type(v)
        if v is None:
            return ["none"]
        if t in (bool, int, str, bytes):
            return [t.__name__, v]
        if t is float:
            return ["float", v.hex()]
        if t in (tuple, list, frozenset, set, torch.Size):
            items = sorted(v, key=repr) if t in (frozenset, set) else v
            return [t.__name__, [self.describe(i, depth + 1) for i in items]]
        if t is dict:
            return ["dict", [[self.describe(k, depth + 1), self.describe(x, depth + 1)]
                             for k, x in v.items()]]
        if t is torch.dtype:
            return ["dtype", dtype_name(v)]
        if t is torch.device:
            return ["device", str(v)]
        if v is self.fn:
            return ["compiled_fn"]
        if isinstance(v, enum.Enum):
            return ["enum", self.describe(t, depth + 1), v.name]
        if isinstance(v, type) and v in _TYPE_ALIASES:  # types.FunctionType is builtins.function
            return ["type", "types", _TYPE_ALIASES[v]]
        if isinstance(v, type | types.FunctionType | types.BuiltinFunctionType):
            mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
            found = _lookup(mod, qual) if isinstance(mod, str) and isinstance(qual, str) else None
            unwrap = 0  # a decorated function (functools.wraps): the one its wrappers wrap
            while found is not v and unwrap < 8 and isinstance(found, types.FunctionType) and \
                    "__wrapped__" in found.__dict__:
                found, unwrap = found.__dict__["__wrapped__"], unwrap + 1
            if found is not v:
                raise NotPortable(f"{v!r} is not reachable by its module and name")
            if isinstance(v, types.FunctionType):
                return ["function", mod, qual, code_digest(v.__code__), unwrap]
            return ["type" if isinstance(v, type) else "builtin", mod, qual]
        raise NotPortable(f"a {t.__name__} has no portable description")

    def resolve(self, d: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH or not isinstance(d, list) or not d or not isinstance(d[0], str):
            raise NotPortable("not a value description")
        tag, args = d[0], d[1:]
        if tag == "none":
            return None
        if tag in ("bool", "int", "str", "bytes"):
            want = {"bool": bool, "int": int, "str": str, "bytes": bytes}[tag]
            if len(args) != 1 or type(args[0]) is not want:
                raise NotPortable(f"a bad {tag}")
            return args[0]
        if tag == "float":
            return float.fromhex(_str(args))
        if tag in ("tuple", "list", "frozenset", "set", "Size"):
            items = [self.resolve(i, depth + 1) for i in _list(args)]
            return {"tuple": tuple, "list": list, "frozenset": frozenset, "set": set,
                    "Size": torch.Size}[tag](items)
        if tag == "dict":
            return {self.resolve(pair(p)[0], depth + 1): self.resolve(pair(p)[1], depth + 1)
                    for p in _list(args)}
        if tag == "dtype":  # never getattr(torch, name): torch's module __getattr__ imports
            try:
                return to_dtype(_str(args))
            except ValueError as e:
                raise NotPortable(str(e)) from None
        if tag == "device":
            try:
                return torch.device(_str(args))
            except (RuntimeError, ValueError) as e:
                raise NotPortable(f"an unknown device: {e}") from e
        if tag == "compiled_fn":
            return self.fn
        if tag == "enum":
            cls = self.resolve(args[0], depth + 1) if len(args) == 2 and isinstance(args[1], str) else None
            members = vars(cls).get("_member_map_") if isinstance(cls, enum.EnumMeta) else None
            member = members.get(args[1]) if isinstance(members, dict) else None
            if type(member) is not cls:
                raise NotPortable("an enum member that is gone")
            return member
        if tag in ("type", "function", "builtin"):
            unwrap = args.pop() if tag == "function" and args else 0
            if len(args) != (3 if tag == "function" else 2) or not all(isinstance(a, str) for a in args) \
                    or type(unwrap) is not int:
                raise NotPortable(f"a bad {tag}")
            obj = _lookup(args[0], args[1])
            for _ in range(min(unwrap, 8)):
                obj = obj.__dict__.get("__wrapped__") if isinstance(obj, types.FunctionType) else None
            ok = {"type": isinstance(obj, type), "builtin": isinstance(obj, types.BuiltinFunctionType),
                  "function": isinstance(obj, types.FunctionType) and
                  code_digest(obj.__code__) == args[2]}[tag]
            if not ok:
                raise NotPortable(f"{args[0]}.{args[1]} is gone or changed")
            return obj
        raise NotPortable(f"an unknown value tag {tag!r}")


_TYPE_ALIASES = {obj: name for name, obj in vars(types).items()
                 if isinstance(obj, type) and not name.startswith("_") and
                 _lookup(obj.__module__, obj.__qualname__) is not obj}


def class_digest(cls: type) -> str:
    """A digest of what a class defines: its names, bases, and the code of its methods
    (a class made inside a function has no name to look it up by in another process)."""
    h = hashlib.sha256(f"{cls.__module__}.{cls.__qualname__}".encode())
    for b in cls.__mro__[1:]:
        h.update(f"|{b.__module__}.{b.__qualname__}".encode())
    for name, v in sorted(vars(cls).items()):
        v = v.__func__ if isinstance(v, staticmethod | classmethod) else v
        if isinstance(v, types.FunctionType):
            h.update(f"|{name}:{code_digest(v.__code__)}".encode())
        elif v is None or type(v) in (bool, int, float, str):
            h.update(f"|{name}={v!r}".encode())
        else:
            h.update(f"|{name}:{type(v).__qualname__}".encode())
    return h.hexdigest()


def describe_read(d: Describer, obj: Any) -> list[Any] | None:
    """For an object guarded by identity that has no name (a model, a submodule kept in a
    global, a closure's function, the ``torch.no_grad()`` a decorated method closes over):
    ``["read", …]``, to be bound to the object the guard's own source reads in the loading
    process, when that object is a module of the same class, a function with the same code, or
    a plain Python object (all of its state in its ``__dict__``) of the same class whose
    ``__dict__`` describes the same (`check_read`). ``None`` for anything else."""
    if isinstance(obj, torch.nn.Module):
        return ["read", "module", type_ref(d, type(obj))]
    if isinstance(obj, types.FunctionType):
        return ["read", "function", code_digest(obj.__code__)]
    if isinstance(obj, type):
        return ["read", "type", class_digest(obj)]
    if _state_in_dict(type(obj)):
        try:
            return ["read", "object", [type_ref(d, type(obj)), d.describe(dict(vars(obj)))]]
        except NotPortable:
            return None
    return None


def _state_in_dict(cls: type) -> bool:
    """Whether an instance of ``cls`` keeps all of its state in its ``__dict__``: every
    class of its MRO but ``object`` written in Python, none with ``__slots__`` (a
    ``torch.no_grad`` object: yes; a tensor, a list: no)."""
    return cls is not object and all(k is object or (k.__flags__ & HEAPTYPE and "__slots__" not in vars(k))
                                     for k in cls.__mro__)


def type_ref(d: Describer, cls: type) -> list[Any]:
    """A class by name, or by `class_digest` when it has none."""
    try:
        return d.describe(cls)
    except NotPortable:
        return ["local", class_digest(cls)]


def check_read(d: Describer, desc: Any, obj: Any) -> Any:
    """``obj`` (read through a guard's source) if it fits ``desc`` (`describe_read`)."""
    if not isinstance(desc, list) or len(desc) != 3 or desc[0] != "read":
        raise NotPortable("not a read description")
    kind, want = desc[1], desc[2]
    if kind == "module" and isinstance(obj, torch.nn.Module):
        ok = _same_class(d, want, type(obj))
    elif kind == "function":
        ok = isinstance(obj, types.FunctionType) and code_digest(obj.__code__) == want
    elif kind == "type":
        ok = isinstance(obj, type) and class_digest(obj) == want
    elif kind == "object" and isinstance(want, list) and len(want) == 2 and _state_in_dict(type(obj)):
        # a plain object (a grad-mode decorator's context manager): the one read, when of the
        # same class with equal state (its __dict__, all of it, as data)
        try:
            ok = _same_class(d, want[0], type(obj)) and d.describe(dict(vars(obj))) == want[1]
        except NotPortable:
            ok = False
    else:
        ok = False
    if not ok:
        raise NotPortable(f"the object read for a {kind} guard is another one")
    return obj


def _same_class(d: Describer, ref: Any, cls: type) -> bool:
    """Whether ``cls`` is the class `type_ref` wrote as ``ref``."""
    if isinstance(ref, list) and len(ref) == 2 and ref[0] == "local":
        return class_digest(cls) == ref[1]
    return cls is d.resolve(ref)


def _list(args: list[Any]) -> list[Any]:
    if len(args) != 1 or not isinstance(args[0], list):
        raise NotPortable("a bad list")
    return args[0]


def _str(args: list[Any]) -> str:
    if len(args) != 1 or not isinstance(args[0], str):
        raise NotPortable("a bad string")
    return args[0]


def pair(p: Any) -> list[Any]:
    if not isinstance(p, list) or len(p) != 2:
        raise NotPortable("a bad pair")
    return p


# ----------------------------------------------------------------------------- sources

_SOURCES: dict[str, type] = {
    "L": SRC.LocalSource, "G": SRC.GlobalSource, "C": SRC.ClosureSource, "attr": SRC.AttrSource,
    "mattr": SRC.ModuleAttrSource, "mstate": SRC.ModuleStateSource, "item": SRC.ItemSource,
    "ditem": SRC.DictItemSource, "dvalue": SRC.DictValueSource, "cattr": SRC.ClassAttrSource,
    "mcall": SRC.MethodCallSource, "mglobal": SRC.ModuleGlobalSource,
}
_TAGS = {cls: tag for tag, cls in _SOURCES.items()}
_TABLES = ("_parameters", "_buffers", "_modules")


_FIELDS = {cls: tuple(cls.__dataclass_fields__) for cls in _SOURCES.values()}
_NAMED = (SRC.AttrSource, SRC.ModuleAttrSource, SRC.ClassAttrSource, SRC.MethodCallSource)


class SourceTable:
    """Sources written as rows, each once, a base before what hangs off it: ``[tag, field…]``
    with a base as its row number. A record names a source by its row (a model's guards
    share their bases: OPT's 2615 nested source records were 560 distinct sources)."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self._index: dict[SRC.Source, int] = {}

    def add(self, s: Any) -> int:
        try:
            i = self._index.get(s)
        except TypeError:  # an unhashable key
            raise NotPortable(f"a source {s}") from None
        if i is not None:
            return i
        tag = _TAGS.get(type(s))
        if tag is None:
            raise NotPortable(f"a source {type(s).__name__} is not kept")
        row: list[Any] = [tag]
        for f in _FIELDS[type(s)]:
            v = getattr(s, f)
            if isinstance(v, SRC.Source):
                row.append(self.add(v))
            elif v is None or type(v) in (int, str, bool):
                row.append(v)
            else:
                raise NotPortable(f"a source key {type(v).__name__}")
        self._index[s] = len(self.rows)
        self.rows.append(row)
        return len(self.rows) - 1


def read_sources(rows: Any) -> list[SRC.Source]:
    """The sources of a `SourceTable`'s rows, each field checked (`check_source`); a base
    must be an earlier row."""
    if not isinstance(rows, list):
        raise NotPortable("sources are not a list")
    out: list[SRC.Source] = []
    for row in rows:
        if not isinstance(row, list) or not row or row[0] not in _SOURCES:
            raise NotPortable("not a source record")
        cls = _SOURCES[row[0]]
        names = _FIELDS[cls]
        if len(row) != len(names) + 1:
            raise NotPortable("a source record of the wrong length")
        vals = list(row[1:])
        if names[0] == "base":
            b = vals[0]
            if type(b) is not int or not 0 <= b < len(out):
                raise NotPortable("a base that is no earlier row")
            vals[0] = out[b]
        out.append(check_source(cls(*vals)))
    return out


def source_at(sources: list[SRC.Source], i: Any) -> SRC.Source:
    if type(i) is not int or not 0 <= i < len(sources):
        raise NotPortable("a source row out of range")
    return sources[i]


def check_source(s: SRC.Source) -> SRC.Source:
    """``s`` if its own fields are what capture writes (its base is checked on its own):
    indices are ints, keys literals, names strings, attribute names identifiers, module
    tables the three of ``nn.Module``; what its ``expr()`` prints is then a read."""
    cls = type(s)
    for name in _FIELDS[cls]:
        v = getattr(s, name)
        if name == "base":
            ok = isinstance(v, SRC.Source)
        elif name == "index":
            ok = type(v) is int and v >= 0
        elif name == "key" and cls is not SRC.ModuleStateSource:
            ok = v is None or type(v) in (int, str, bool)
        else:  # name, table, key of a module table, module
            ok = type(v) is str
        if not ok:
            raise NotPortable(f"a bad {name} in a {cls.__name__}")
    if cls in _NAMED and (not s.name.isidentifier() or keyword.iskeyword(s.name)):
        raise NotPortable(f"attribute name {s.name!r}")
    if cls is SRC.ModuleStateSource and s.table not in _TABLES:
        raise NotPortable(f"module table {s.table!r}")
    if cls is SRC.MethodCallSource and s.name != "is_integer":
        raise NotPortable(f"a method call {s.name!r}")
    return s


def _key_of(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (int, str, bool)):
        return node.value
    raise NotPortable("a key that is no literal")


def _source_of(n: ast.expr, depth: int = 0) -> SRC.Source:
    if depth > MAX_DEPTH:
        raise NotPortable("an expression nested too deep")
    if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in ("L", "G"):
        key = _key_of(n.slice)
        if n.value.id == "L" and type(key) is int:
            return SRC.LocalSource(key, "")
        if n.value.id == "G" and type(key) is str:
            return SRC.GlobalSource(key)
    elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr in _TABLES:
        return SRC.ModuleStateSource(_source_of(n.value.value, depth + 1), n.value.attr, _key_of(n.slice))
    elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "__dict__":
        mods = n.value.value  # sys.modules['m'].__dict__['n']
        if isinstance(mods, ast.Subscript) and ast.unparse(mods.value) == "sys.modules":
            return SRC.ModuleGlobalSource(_key_of(mods.slice), _key_of(n.slice))
    elif isinstance(n, ast.Subscript):
        return SRC.ItemSource(_source_of(n.value, depth + 1), _key_of(n.slice))
    elif isinstance(n, ast.Attribute) and n.attr == "cell_contents" and isinstance(n.value, ast.Subscript) \
            and isinstance(n.value.value, ast.Name) and n.value.value.id == "C":
        return SRC.ClosureSource(_key_of(n.value.slice), "")
    elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call) and \
            isinstance(n.value.func, ast.Name) and n.value.func.id == "type" and len(n.value.args) == 1:
        return SRC.ClassAttrSource(_source_of(n.value.args[0], depth + 1), n.attr)
    elif isinstance(n, ast.Attribute):
        return SRC.AttrSource(_source_of(n.value, depth + 1), n.attr)
    elif isinstance(n, ast.Call) and ast.unparse(n.func) == "dict.__getitem__" and len(n.args) == 2:
        return SRC.DictItemSource(_source_of(n.args[0], depth + 1), _key_of(n.args[1]))
    raise NotPortable("an expression that is no source")


def checked_expr(text: Any) -> str:
    """``text`` if it is exactly what a source prints (`read_source`'s checks applied to
    that source): an expression read from a file is never compiled otherwise."""
    if not isinstance(text, str) or len(text) > 4096:
        raise NotPortable("a bad expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError) as e:
        raise NotPortable(f"an expression that does not parse: {e}") from None
    source = _source_of(tree.body)
    chain = source
    while chain is not None:  # each link checked as a kept source's fields are
        if type(chain) not in _FIELDS:
            raise NotPortable("an expression that is no source")
        check_source(chain)
        chain = getattr(chain, "base", None)
    if source.expr() != text:
        raise NotPortable(f"an expression that is no source: {text!r}")
    return text


__all__ = [
    "Describer",
    "NotPortable",
    "SourceTable",
    "check_read",
    "check_source",
    "checked_expr",
    "class_digest",
    "code_digest",
    "describe_read",
    "read_sources",
    "source_at",
]
