"""Renaming tensors inside procedures (used by passes that merge or replace tensors)."""

from __future__ import annotations

from mlpack.spec.ir.expr import rename_tensors
from mlpack.spec.ir.graph import For, If, Let, Procedure, SetSize, Store, While


def _rename(e, renames):
    return rename_tensors(e, renames)


def _stmts(stmts, renames):
    for s in stmts:
        if isinstance(s, (Let, SetSize)):
            s.value = _rename(s.value, renames)
        elif isinstance(s, Store):
            s.value = _rename(s.value, renames)
            s.index = {d: _rename(i, renames) for d, i in s.index.items()}
        elif isinstance(s, For):
            s.extent = _rename(s.extent, renames)
            _stmts(s.body, renames)
        elif isinstance(s, While):
            s.cond = _rename(s.cond, renames)
            _stmts(s.body, renames)
        elif isinstance(s, If):
            s.cond = _rename(s.cond, renames)
            _stmts(s.then, renames)
            _stmts(s.orelse, renames)


def rename_in_procedure(op: Procedure, renames: dict[str, str]) -> None:
    _stmts(op.body, renames)


def rename_in_graph(g, mapping: dict[str, str]) -> None:
    """Rename tensors everywhere in ``g``: definitions, reads, types, constants and ports."""
    from mlpack.spec.ir.graph import Comprehension, Port
    if not mapping:
        return
    for op in g.ops:
        if isinstance(op, Comprehension):
            op.body = rename_tensors(op.body, mapping)
            op.out = mapping.get(op.out, op.out)
        else:
            _stmts(op.body, mapping)
            for s in _all_stores(op.body):
                s.tensor = mapping.get(s.tensor, s.tensor)
            op.results = {mapping.get(n, n): t for n, t in op.results.items()}
            op.locals_ = {mapping.get(n, n): t for n, t in op.locals_.items()}
    g.constants = {mapping.get(n, n): c for n, c in g.constants.items()}
    for c in g.constants.values():
        c.name = mapping.get(c.name, c.name)
    g.types = {mapping.get(n, n): t for n, t in g.types.items()}
    g.inputs = [Port(mapping.get(p.name, p.name), p.layout) for p in g.inputs]
    g.outputs = [Port(mapping.get(p.name, p.name), p.layout) for p in g.outputs]
    g.origins = {(mapping.get(t, t), d): o for (t, d), o in g.origins.items()}


def _all_stores(stmts):
    for s in stmts:
        if isinstance(s, Store):
            yield s
        for attr in ("body", "then", "orelse"):
            yield from _all_stores(getattr(s, attr, []) or [])
