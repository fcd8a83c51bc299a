"""Renaming tensors inside procedures (used by passes that merge or replace tensors)."""

from __future__ import annotations

from ..ir.expr import rename_tensors
from ..ir.graph import For, If, Let, Procedure, SetSize, Store, While


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
