"""Dead code elimination: drop ops and constants no output depends on."""

from __future__ import annotations

from ..ir.expr import walk
from ..ir.graph import Comprehension, For, Graph, If, Let, Procedure, SetSize, Store, While


def _stmt_reads(stmts, out: set[str]) -> None:
    for s in stmts:
        exprs = []
        if isinstance(s, (Let, SetSize)):
            exprs = [s.value]
        elif isinstance(s, Store):
            exprs = [s.value, *s.index.values()]
        elif isinstance(s, For):
            exprs = [s.extent]
            _stmt_reads(s.body, out)
        elif isinstance(s, While):
            exprs = [s.cond]
            _stmt_reads(s.body, out)
        elif isinstance(s, If):
            exprs = [s.cond]
            _stmt_reads(s.then, out)
            _stmt_reads(s.orelse, out)
        for e in exprs:
            out.update(n.arg[0] for n in walk(e) if n.op == "read")


def tensors_read(op) -> set[str]:
    """Names of the tensors an op reads."""
    out: set[str] = set()
    if isinstance(op, Comprehension):
        out.update(n.arg[0] for n in walk(op.body) if n.op == "read")
    else:
        _stmt_reads(op.body, out)
        out -= set(op.results) | set(op.locals_)
    return out


def eliminate_dead_code(g: Graph) -> Graph:
    live = {p.name for p in g.outputs}
    kept = []
    for op in reversed(g.ops):
        if live & set(op.outs):
            kept.append(op)
            live |= tensors_read(op)
    kept.reverse()
    kept_ids = {id(op) for op in kept}
    dead = [n for op in g.ops if id(op) not in kept_ids for n in op.outs]
    for op in g.ops:
        if isinstance(op, Procedure) and id(op) not in kept_ids:
            dead += list(op.locals_)
    g.ops = kept
    for name in [c for c in g.constants if c not in live]:
        del g.constants[name]
        g.types.pop(name, None)
    for n in dead:
        g.types.pop(n, None)
    return g
