"""User ``@triton.jit`` kernels launched inside a compiled function.

``kernel[grid](*args, **kwargs)`` becomes one node of the format op
``torchfuse.triton_kernel.default`` (see `torchfuse.graph.user_kernels`), followed by
one ``aten.copy_`` per tensor the kernel writes, so the user's tensors hold what eager would
leave in them::

    add_kernel[(2,)](x, y, out, n, BLOCK=64)

    # recorded as
    triton_kernel = torch.ops.torchfuse.triton_kernel.default('{"args":[...],...}', [x, y, out], [2])
    copy_ = torch.ops.aten.copy_.default(out, triton_kernel)

How the pieces are found:

* ``kernel[grid]`` reaches `handler_for` as a call of ``KernelInterface.__getitem__``
  and yields a partial of `launch`; calling it records the node.
* the grid is a tuple of ints, or a callable evaluated on the kernel's bound arguments (a
  dict by parameter name, constexprs included), interpreted like any other user code;
* the kernel's module source is rebuilt from ``inspect.getsource`` of the function: its
  decorators dropped and ``@triton.jit`` put back, plus what its body reads from its
  globals -- modules (``tl``, ``libdevice``), other ``@triton.jit`` helpers (their sources,
  recursively) and constants (``tl.constexpr`` or plain numbers, baked in as they are now);
* written pointers are found by reading the kernel's AST: a parameter that reaches the
  first argument of ``tl.store``/``tl.atomic_*`` (or any ``.store`` method, or a call of a
  helper) through assignments is written. When the source cannot be read, every tensor
  argument counts as written.

Not supported (a graph break: the launch runs in Python, capture resumes after it): ``@triton.autotune`` /
``@triton.heuristics`` kernels, launch options other than ``num_warps``/``num_stages``,
arguments that are neither tensors nor int/float/bool/str constants (dtypes, ``None``,
also as a default), closures in the kernel.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

import torch
from torchfuse.capture import variables as V
from torchfuse.capture.context import current
from torchfuse.capture.dynamic import concrete
from torchfuse.capture.errors import Unsupported
from torchfuse.graph.user_kernels import dumps

Handler = Callable[[list[V.Var], dict[str, V.Var]], V.Var]

_LAUNCH_OPTIONS = ("num_warps", "num_stages")
_DEFAULT_OPTIONS = {"num_warps": 4, "num_stages": 3}
_WRITE_CALLS = frozenset({"store", "atomic_add", "atomic_max", "atomic_min", "atomic_and",
                          "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas"})
_HEADER = "import triton\nimport triton.language as tl\n"


def handler_for(value: Any) -> Handler | None:
    """The capture rule for ``value`` when it belongs to a user-kernel launch, else None.

    Triton is never imported here: when it is not loaded, no user kernel exists.
    """
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None:
        return None
    if value is _launch:
        return _launch_handler
    if value is getattr(jit.KernelInterface, "__getitem__", None):
        return _subscript
    if isinstance(value, types.FunctionType) and value.__code__ in _launcher_codes(jit):
        return _launcher_call(value)  # kernel[grid] made outside capture, called inside
    constexpr_fn = getattr(jit, "ConstexprFunction", None)
    if constexpr_fn is not None and isinstance(value, constexpr_fn):
        return _constexpr_call(value)  # triton.cdiv(n, BLOCK) in a grid
    return None


def _kernel_classes() -> tuple[type, ...]:
    classes: list[type] = []
    jit = sys.modules.get("triton.runtime.jit")
    if jit is not None:
        classes.append(jit.JITFunction)
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is not None:
        classes.append(interp.InterpretedFunction)
    return tuple(classes)


def is_user_kernel(value: Any) -> bool:
    """A plain ``@triton.jit`` function (compiled or interpreted build)."""
    return isinstance(value, _kernel_classes())


def _launch(*args: Any, **kwargs: Any) -> None:
    """Stands for ``kernel[grid]`` inside capture (never called for real)."""
    raise RuntimeError("torchfuse capture placeholder for a Triton launch")


def _subscript(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    ctx = current()
    kernel, grid = args
    value = getattr(kernel, "value", None)
    if not is_user_kernel(value):
        raise Unsupported(f"launching a {type(value).__name__} (autotuned or heuristics Triton "
                          "kernels) inside a compiled function", ctx.loc,
                          "launch the @triton.jit function itself with a fixed config")
    if kernel.source is not None:  # the source text goes into the graph: pin the object
        ctx.guards.identity(kernel.source, value)
    return V.PartialVar(V.ObjVar(_launch), [kernel, grid], {})


@functools.cache
def _launcher_codes(jit: types.ModuleType) -> tuple[types.CodeType, ...]:
    """The code of the launcher lambda ``KernelInterface.__getitem__`` returns."""
    getitem = getattr(jit.KernelInterface, "__getitem__", None)
    code = getattr(getitem, "__code__", None)
    return tuple(c for c in (code.co_consts if code else ()) if isinstance(c, types.CodeType))


def _launcher_call(fn: types.FunctionType) -> Handler:
    """The launcher ``kernel[grid]`` returns, called: the same launch, its kernel and grid
    read from the closure (guarded like any closure cell of a called function)."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))

    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        ctx = current()
        kernel, grid = cells["self"].cell_contents, cells["grid"].cell_contents
        partial = _subscript([V.UserObjVar(kernel, None), ctx.wrap(grid, None)], {})
        assert isinstance(partial, V.PartialVar)
        return _launch_handler([*partial.args, *args], kwargs)

    return h


def _constexpr_call(fn: Any) -> Handler:
    """Triton's constexpr helpers (``triton.cdiv``) are plain arithmetic on constants."""

    def h(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
        if not all(isinstance(a, V.ConstVar) for a in [*args, *kwargs.values()]):
            raise Unsupported(f"triton.{getattr(fn, '__name__', 'function')} on non-constant "
                              "arguments", current().loc)
        return V.ConstVar(fn(*[a.python() for a in args], **{k: v.python() for k, v in kwargs.items()}))

    return h


# ----------------------------------------------------------------------------- the launch


def _constant(var: V.Var, what: str) -> Any:
    ctx = current()
    if isinstance(var, V.ConstVar | V.ListVar):
        # a launch records plain numbers (arguments, grid): a symbolic size is specialized
        return concrete(var.python())
    raise Unsupported(f"{what}: {var.describe()} is not a constant", ctx.loc)


def _is_constexpr(param: inspect.Parameter) -> bool:
    ann = param.annotation
    if isinstance(ann, str):
        return ann.split(".")[-1].startswith("constexpr")
    tl = sys.modules.get("triton.language")
    return tl is not None and (ann is tl.constexpr or isinstance(ann, tl.constexpr))


def _unwrap(value: Any) -> Any:
    tl = sys.modules.get("triton.language")
    if tl is not None and isinstance(value, tl.constexpr):
        return value.value
    return value


def _launch_handler(args: list[V.Var], kwargs: dict[str, V.Var]) -> V.Var:
    from torchfuse.capture.calls import call

    ctx = current()
    kernel_var, grid_var, *rest = args
    kernel = kernel_var.value  # type: ignore[attr-defined]
    pyfn = kernel.fn
    name = getattr(pyfn, "__name__", "kernel")
    kwargs = dict(kwargs)
    options = dict(_DEFAULT_OPTIONS)
    for opt in _LAUNCH_OPTIONS:
        if opt in kwargs:
            options[opt] = int(_constant(kwargs.pop(opt), f"{opt} of {name}"))
    sig = inspect.signature(pyfn)
    unknown = [k for k in kwargs if k not in sig.parameters]
    if unknown:
        raise Unsupported(f"launch option(s) {unknown} of Triton kernel {name}", ctx.loc,
                          f"only {', '.join(_LAUNCH_OPTIONS)} are supported")
    try:
        bound = sig.bind(*rest, **kwargs)
    except TypeError as e:
        raise Unsupported(f"Triton kernel {name}: {e}", ctx.loc) from e

    tensors: list[V.TensorVar] = []
    index: dict[int, int] = {}
    layout: list[dict[str, Any]] = []
    by_name: dict[str, V.Var] = {}
    for pname, param in sig.parameters.items():
        if pname in bound.arguments:
            var = bound.arguments[pname]
        elif param.default is not inspect.Parameter.empty:
            var = V.ConstVar(_unwrap(param.default))
        else:
            raise Unsupported(f"Triton kernel {name}: missing argument {pname!r}", ctx.loc)
        by_name[pname] = var
        if isinstance(var, V.TensorVar):
            if _is_constexpr(param):
                raise Unsupported(f"Triton kernel {name}: tensor passed to constexpr {pname!r}", ctx.loc)
            i = index.setdefault(id(var.fake), len(tensors))
            if i == len(tensors):
                tensors.append(var)
            layout.append({"name": pname, "tensor": i})
            continue
        value = _unwrap(_constant(var, f"argument {pname!r} of Triton kernel {name}"))
        if not isinstance(value, bool | int | float | str):  # None too: a Program cannot pass it
            raise Unsupported(f"Triton kernel {name}: argument {pname!r} of type "
                              f"{type(value).__name__}", ctx.loc)
        if _is_constexpr(param):
            layout.append({"name": pname, "constexpr": value})
        elif isinstance(value, str):
            raise Unsupported(f"Triton kernel {name}: string for runtime argument {pname!r}", ctx.loc)
        else:
            layout.append({"name": pname, "value": value})

    grid = _grid(grid_var, by_name, name, call)
    try:
        source = kernel_source(kernel)
        written = written_params(pyfn)
    except (OSError, TypeError, SyntaxError) as e:
        raise Unsupported(f"Triton kernel {name}: its source cannot be read ({e})", ctx.loc) from e
    except ValueError as e:
        raise Unsupported(f"Triton kernel {name}: {e}", ctx.loc) from e
    mutated = sorted({a["tensor"] for a in layout if "tensor" in a
                      and (written is None or a["name"] in written)})
    text = dumps({"source": source, "entry": pyfn.__name__, "grid": list(grid), "args": layout,
                  **options})
    fakes = [t.fake for t in tensors]
    outs = ctx.call_torch(torch.ops.torchfuse.triton_kernel.default, [text, fakes, mutated], {},
                          f"Triton kernel {name}")
    for i, new in zip(mutated, outs, strict=True):
        # the user's tensor takes the new contents: its Python identity stays, as in eager
        ctx.call_torch(torch.Tensor.copy_, [fakes[i], new], {}, f"write-back of Triton kernel {name}")
    return V.ConstVar(None)


def _grid(grid_var: V.Var, by_name: dict[str, V.Var], name: str, call: Any) -> tuple[int, ...]:
    ctx = current()
    if not isinstance(grid_var, V.ConstVar | V.ListVar):
        # Triton calls a grid callable with the bound arguments by name
        grid_var = call(grid_var, [V.DictVar(dict(by_name))], {})
    grid = _constant(grid_var, f"grid of Triton kernel {name}")
    if isinstance(grid, int):
        grid = (grid,)
    grid = tuple(_unwrap(g) for g in grid)
    if not 1 <= len(grid) <= 3 or not all(isinstance(g, int) and not isinstance(g, bool) for g in grid):
        raise Unsupported(f"grid of Triton kernel {name} must be 1 to 3 ints, got {grid!r}", ctx.loc)
    return grid


# ----------------------------------------------------------------------------- the source


def _function_text(pyfn: types.FunctionType) -> tuple[str, ast.FunctionDef]:
    text = textwrap.dedent(inspect.getsource(pyfn))
    tree = ast.parse(text)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise ValueError("not a function definition")
    lines = text.splitlines()
    return "\n".join(lines[fdef.lineno - 1:]) + "\n", fdef  # decorators dropped


def _global_names(fdef: ast.FunctionDef) -> list[str]:
    params = {a.arg for a in [*fdef.args.posonlyargs, *fdef.args.args, *fdef.args.kwonlyargs]}
    stored = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = [n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(n for n in names if n not in params and n not in stored))


def kernel_source(kernel: Any) -> str:
    """A complete module defining ``kernel`` under its own name, with what it reads globally."""
    blocks: list[str] = []
    imports: list[str] = []
    done: set[int] = set()

    def add(k: Any) -> None:
        pyfn = k.fn
        if id(pyfn) in done:
            return
        done.add(id(pyfn))
        if pyfn.__closure__:
            raise ValueError(f"{pyfn.__name__} reads variables of an enclosing function")
        body, fdef = _function_text(pyfn)
        consts: list[str] = []
        for g in _global_names(fdef):
            if g not in pyfn.__globals__:
                continue  # a builtin (range, min, float)
            value = pyfn.__globals__[g]
            if isinstance(value, types.ModuleType):
                if (g, value.__name__) not in (("tl", "triton.language"), ("triton", "triton")):
                    line = f"import {value.__name__} as {g}" if g != value.__name__ else f"import {g}"
                    if line not in imports:
                        imports.append(line)
            elif is_user_kernel(value):
                add(value)
                if value.fn.__name__ != g:
                    consts.append(f"{g} = {value.fn.__name__}")
            elif isinstance(_unwrap(value), bool | int | float | str) and value is not None:
                raw = _unwrap(value)
                wrapped = raw is not value
                consts.append(f"{g} = tl.constexpr({raw!r})" if wrapped else f"{g} = {raw!r}")
            else:
                raise ValueError(f"{pyfn.__name__} reads the global {g!r} of type "
                                 f"{type(value).__name__}, which cannot be written into a kernel module")
        blocks.append("\n".join([*consts, "", "", "@triton.jit", body.rstrip(), ""]))

    add(kernel)
    return _HEADER + "".join(f"{i}\n" for i in imports) + "\n".join(blocks)


def written_params(pyfn: types.FunctionType) -> set[str] | None:
    """Parameters whose memory the kernel may write (None: cannot tell, assume all)."""
    try:
        _, fdef = _function_text(pyfn)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    params = [a.arg for a in [*fdef.args.posonlyargs, *fdef.args.args, *fdef.args.kwonlyargs]]
    flows: dict[str, set[str]] = {p: {p} for p in params}

    def roots(node: ast.AST | None) -> set[str]:
        """Parameters a pointer expression may derive from (loaded values are data)."""
        if node is None:
            return set()
        if isinstance(node, ast.Call) and _is_tl_call(node, "load"):
            return set()
        if isinstance(node, ast.Name):
            return set(flows.get(node.id, set())) if isinstance(node.ctx, ast.Load) else set()
        return set().union(*[roots(c) for c in ast.iter_child_nodes(node)])

    def targets(t: ast.AST) -> list[str]:
        return [n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]

    changed = True
    while changed:  # flow-insensitive: a name derives from every parameter any assignment gives it
        changed = False
        for node in ast.walk(fdef):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                src = roots(node.value)
                for t in tgts:
                    for name in targets(t):
                        have = flows.setdefault(name, set())
                        if not src <= have:
                            have |= src
                            changed = True
            elif isinstance(node, ast.For | ast.With):
                src = roots(node.iter) if isinstance(node, ast.For) else set().union(
                    *[roots(i.context_expr) for i in node.items])
                tgts = [node.target] if isinstance(node, ast.For) else [i.optional_vars for i in node.items
                                                                        if i.optional_vars is not None]
                for t in tgts:
                    for name in targets(t):
                        have = flows.setdefault(name, set())
                        if not src <= have:
                            have |= src
                            changed = True
    written: set[str] = set()
    for node in ast.walk(fdef):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        attr = f.attr if isinstance(f, ast.Attribute) else None
        if attr in _WRITE_CALLS:
            if (isinstance(f.value, ast.Name) and f.value.id in ("tl", "triton")) or \
                    isinstance(f.value, ast.Attribute):
                ptr = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg in ("pointer", "ptr")), None)
                written |= roots(ptr)
            else:  # a method: desc.store(offsets, value), ptr.atomic_add(...)
                written |= roots(f.value)
        elif _calls_helper(f, pyfn.__globals__):
            # a helper kernel may write through what it is given
            written |= set().union(*[roots(a) for a in node.args],
                                   *[roots(k.value) for k in node.keywords])
    return written & set(params)


def _is_tl_call(node: ast.Call, name: str) -> bool:
    f = node.func
    return isinstance(f, ast.Attribute) and f.attr == name and isinstance(f.value, ast.Name) \
        and f.value.id in ("tl", "triton")


def _calls_helper(f: ast.AST, f_globals: dict[str, Any]) -> bool:
    """A call of a global function (a helper kernel, ``helpers.fn``), not of a builtin, a
    ``tl`` function or a method of a value (``x.to(tl.float32)``)."""
    if isinstance(f, ast.Name):
        return f.id in f_globals and not isinstance(f_globals[f.id], types.ModuleType)
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        base = f_globals.get(f.value.id)
        return isinstance(base, types.ModuleType) and not base.__name__.startswith("triton")
    return False


__all__ = ["handler_for", "is_user_kernel", "kernel_source", "written_params"]
