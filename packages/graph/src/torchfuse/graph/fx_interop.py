"""Interop with ``torch.fx``: export a Graph as a GraphModule, import a GraphModule as a Graph.

torch.fx is an interop target only; nothing in torchfuse depends on it internally.

* `to_fx` builds a ``GraphModule`` with one ``call_function`` node per Graph node
  (targets are the ``torch.ops.aten`` overloads), ``operator.getitem`` for multi-output ops,
  and ``aten.sym_size.int`` plus integer arithmetic for size symbols. Each fx node keeps the
  format record it came from in ``node.meta["torchfuse"]`` and the value metadata in
  ``node.meta["torchfuse_meta"]``.
* `from_fx` runs a ``GraphModule`` under the [`Recorder`][torchfuse.graph.tracing.Recorder]
  on fake tensors, so any fx graph (ATen-level or ``symbolic_trace`` output with modules and
  torch functions) comes back as ATen nodes. Sizes come back concrete.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves
from torchfuse.graph import schema as S
from torchfuse.graph.expr import BinOp, Call, Name, Num, parse
from torchfuse.graph.ops import decode_arg, flatten_result, meta_of, resolve_op
from torchfuse.graph.printer import _Names, comment_text
from torchfuse.graph.tracing import GraphBuilder, Recorder
from torchfuse.graph.verify import SYMBOL_SOURCE, VerificationError, is_identifier

_FX_BINOPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "%": operator.mod, "==": operator.eq, "!=": operator.ne, "<=": operator.le,
    "<": operator.lt, ">=": operator.ge, ">": operator.gt,
}


class _FxBuilder:
    def __init__(self, graph: S.Graph) -> None:
        self.g = graph
        self.fx = torch.fx.Graph()
        self.names = _Names()
        self.env: dict[str, Any] = {}
        self.syms: dict[str, Any] = {}

    def node(self, target: Any, args: tuple, kwargs: dict | None = None, name: str | None = None):
        return self.fx.create_node("call_function", target, args, kwargs or {}, name=name)

    def expr(self, text: str) -> Any:
        def walk(ast: Any) -> Any:
            if isinstance(ast, Num):
                return ast.value
            if isinstance(ast, Name):
                if ast.name not in self.syms:
                    raise ValueError(f"symbol {ast.name!r} has no input source and no hint")
                return self.syms[ast.name]
            if isinstance(ast, BinOp):
                return self.node(_FX_BINOPS[ast.op], (walk(ast.lhs), walk(ast.rhs)))
            assert isinstance(ast, Call)
            return self.node(min if ast.fn == "min" else max, tuple(walk(a) for a in ast.args))

        return walk(parse(text))

    def arg(self, a: S.Argument) -> Any:
        if isinstance(a, S.TensorRef):
            return self.env[a.name]
        if isinstance(a, S.SymRef):
            return self.expr(a.expr)
        if isinstance(a, S.ListArg):
            return [self.arg(x) for x in a.items]
        return decode_arg(a, {}, {})

    def build(self) -> torch.fx.GraphModule:
        g = self.g
        for inp in g.inputs:
            p = self.fx.placeholder(self.names(inp.name))
            p.meta["torchfuse"] = inp
            if inp.name in g.values:
                p.meta["torchfuse_meta"] = g.values[inp.name]
            self.env[inp.name] = p
        for sym in g.symbols:
            m = SYMBOL_SOURCE.fullmatch(sym.source or "")
            if m and int(m.group(1)) < len(g.inputs):
                src = self.env[g.inputs[int(m.group(1))].name]
                self.syms[sym.name] = self.node(torch.ops.aten.sym_size.int, (src, int(m.group(2))),
                                                name=sym.name)
            elif sym.hint is not None:
                self.syms[sym.name] = sym.hint
        for node in g.nodes:
            bad = [k for k in node.kwargs if not is_identifier(k)]
            if bad:  # torch.fx writes keywords into the code it generates, as they are
                raise VerificationError(f"graph {g.name!r}, node {node.name!r}: keyword {bad[0]!r} is not an "
                                        "identifier", node.name)
            args = tuple(self.arg(a) for a in node.args)
            kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
            op = resolve_op(node.op)
            plain = [str(r.type) for r in op._schema.returns]
            single = plain == ["Tensor"] and len(node.outputs) == 1
            call = self.node(op, args, kwargs, name=self.names(node.outputs[0]) if single else None)
            call.meta["torchfuse"] = node
            if node.loc is not None:
                loc = node.loc  # one line each: torch.fx writes them into comments of its code
                call.meta["stack_trace"] = (
                    f'  File "{comment_text(loc.file)}", line {loc.line}, in '
                    f"{comment_text(loc.function or '<unknown>')}\n    {comment_text(loc.text or '')}")
            if single:
                self.env[node.outputs[0]] = call
                call.meta["torchfuse_meta"] = g.values.get(node.outputs[0])
                continue
            source = call
            if not (all(t == "Tensor" for t in plain) or plain == ["List[Tensor]"]):
                source = self.node(flatten_result, (call,))
            for i, out in enumerate(node.outputs):
                if out:
                    item = self.node(operator.getitem, (source, i), name=self.names(out))
                    item.meta["torchfuse_meta"] = g.values.get(out)
                    self.env[out] = item
        self.fx.output([self.arg(o.value) for o in g.outputs])
        gm = torch.fx.GraphModule(torch.nn.Module(), self.fx, class_name=_class_name(g.name))
        gm.meta["torchfuse_graph"] = g
        return gm


def _class_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name) or "Graph"


def to_fx(graph: S.Graph) -> torch.fx.GraphModule:
    """The graph as a ``torch.fx.GraphModule``; calling it returns a list, like ``run``."""
    return _FxBuilder(graph).build()


class _ModuleRecorder(Recorder):
    """Records a module's parameters and buffers as inputs of their kind, by qualified name."""

    def __init__(self, builder: GraphBuilder, module: torch.nn.Module) -> None:
        super().__init__(builder)
        self.owned: dict[int, tuple[str, S.InputKind]] = {}
        for qual, p in module.named_parameters():
            self.owned[id(p)] = (qual, "parameter")
        for qual, b in module.named_buffers():
            self.owned[id(b)] = (qual, "buffer")

    def on_constant(self, t: torch.Tensor) -> str:
        hit = self.owned.get(id(t))
        if hit is None:
            return super().on_constant(t)
        qual, kind = hit
        name = self.builder.add_input(meta_of(t), name=qual, kind=kind, target=qual)
        self.constants[name] = t
        self.bind(t, name)
        return name


def from_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor], *,
            name: str | None = None, constants: dict[str, torch.Tensor] | None = None) -> S.Graph:
    """A Graph recorded by running ``gm`` on fakes of ``example_inputs``.

    Placeholders become inputs under their fx names (and kinds, when the module came from
    `to_fx`); parameters and buffers the module reads become ``parameter``/``buffer``
    inputs after them, with ``target`` set to their qualified name; other real tensors become
    ``constant`` inputs. Pass a dict as ``constants`` to receive those tensors by input name.
    The outputs are the leaves of what ``gm`` returns. ``requires_grad`` of the inputs is
    taken from ``example_inputs``: an ATen-level graph that already holds its backward ops
    should be imported from examples that do not require grad, or autograd will add its own
    ``detach`` nodes while recording.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ValueError(f"the GraphModule takes {len(placeholders)} inputs, got {len(example_inputs)}")
    rec = _ModuleRecorder(GraphBuilder(name or type(gm).__name__), gm)
    with rec:
        fakes = []
        for p, example in zip(placeholders, example_inputs, strict=True):
            origin = p.meta.get("torchfuse")
            kind = origin.kind if isinstance(origin, S.GraphInput) else "user_input"
            target = origin.target if isinstance(origin, S.GraphInput) else None
            fakes.append(rec.input(example, name=p.name, kind=kind, target=target))
        result = gm(*fakes)
    for leaf in tree_leaves(result):
        rec.output(leaf)
    if constants is not None:
        constants.update(rec.constants)
    return rec.builder.build()
