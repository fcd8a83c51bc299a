"""The verifier: the invariants every graph holds between passes.

It checks that each tensor is defined once before it is read, that each read names exactly the
dims of its tensor, that bodies use only their own loop variables, that indices are integers,
that dtypes agree, and that layouts are permutations of the dims. ``verify`` raises
``VerifyError`` naming the op and the fault.
"""

from __future__ import annotations

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr, free_syms, walk
from mlpack.spec.ir.graph import (REDUCTIONS, Comprehension, For, Graph, If, Let, Procedure,
                                  SetSize, Store, While)
from mlpack.spec.errors import VerifyError


def _check_reads(where: str, e: Expr, types, scope_vars: set[str] | None) -> None:
    for n in walk(e):
        if n.op == "read":
            name, dims, pad = n.arg
            if name not in types:
                raise VerifyError(f"{where}: reads %{name}, which is not defined before it")
            ty = types[name]
            if set(dims) != set(ty.dims) or len(dims) != len(ty.dims):
                raise VerifyError(f"{where}: read of %{name} indexes dims {list(dims)}, "
                                  f"the tensor has {list(ty.dims)}")
            if n.dtype != ty.dtype:
                raise VerifyError(f"{where}: read of %{name} typed {n.dtype}, tensor is {ty.dtype}")
            for d, ix in zip(dims, n.args):
                if not dt.is_int(ix.dtype):
                    raise VerifyError(f"{where}: index of %{name} dim {d} has dtype {ix.dtype}")
        elif n.op == "var" and scope_vars is not None and n.arg not in scope_vars:
            raise VerifyError(f"{where}: uses variable {n.arg}, which is not a loop variable here")


def _check_layout(where: str, layout, dims) -> None:
    if sorted(layout) != sorted(dims) or len(set(layout)) != len(layout):
        raise VerifyError(f"{where}: layout {list(layout)} is not an order of dims {list(dims)}")


def _check_stmts(where: str, stmts, types, scope: set[str], defined_syms: set[str]) -> None:
    for s in stmts:
        if isinstance(s, Let):
            _check_reads(where, s.value, types, scope | {s.name})
            scope.add(s.name)
        elif isinstance(s, Store):
            if s.tensor not in types:
                raise VerifyError(f"{where}: stores to undeclared %{s.tensor}")
            if set(s.index) != set(types[s.tensor].dims):
                raise VerifyError(f"{where}: store to %{s.tensor} indexes {list(s.index)}")
            for ix in s.index.values():
                _check_reads(where, ix, types, scope)
            _check_reads(where, s.value, types, scope)
        elif isinstance(s, For):
            _check_reads(where, s.extent, types, scope)
            _check_stmts(where, s.body, types, scope | {s.var}, defined_syms)
        elif isinstance(s, While):
            _check_reads(where, s.cond, types, scope)
            _check_stmts(where, s.body, types, set(scope), defined_syms)
        elif isinstance(s, If):
            _check_reads(where, s.cond, types, scope)
            _check_stmts(where, s.then, types, set(scope), defined_syms)
            _check_stmts(where, s.orelse, types, set(scope), defined_syms)
        elif isinstance(s, SetSize):
            _check_reads(where, s.value, types, scope)
            defined_syms.add(s.sym)


def verify(g: Graph, external: dict | None = None) -> None:
    """Raise VerifyError if ``g`` breaks an IR invariant. ``external``: name -> TensorType of
    tensors a target's rewrite placed outside the graph's ops (a concatenation's buffer, which
    its arms write in place), defined as inputs are."""
    defined: dict = dict(external or {})
    syms: set[str] = set()
    for p in g.inputs:
        if p.name in defined:
            raise VerifyError(f"input %{p.name} is defined twice")
        ty = g.types.get(p.name)
        if ty is None:
            raise VerifyError(f"input %{p.name} has no type")
        _check_layout(f"input %{p.name}", p.layout, ty.dims)
        defined[p.name] = ty
        for s in ty.dims.values():
            syms |= free_syms(s)
    for c in g.constants.values():
        where = f"constant %{c.name}"
        if c.name in defined:
            raise VerifyError(f"{where} is defined twice")
        _check_layout(where, c.layout, c.type.dims)
        shape = c.type.static_shape(c.layout)
        if shape is None or tuple(c.data.shape) != shape:
            raise VerifyError(f"{where}: data shape {c.data.shape} does not match its type")
        if c.data.dtype != dt.to_numpy(c.type.dtype):
            raise VerifyError(f"{where}: data dtype {c.data.dtype} is not {c.type.dtype}")
        defined[c.name] = c.type
    for op in g.ops:
        if isinstance(op, Comprehension):
            where = f"op %{op.out}"
            if op.out in defined:
                raise VerifyError(f"{where} is defined twice")
            if op.reduce is not None and op.reduce not in REDUCTIONS:
                raise VerifyError(f"{where}: unknown reduction {op.reduce!r}")
            clash = set(op.rdims) & set(op.type.dims)
            if clash:
                raise VerifyError(f"{where}: reduction dims {sorted(clash)} are also output dims")
            if op.reduce is None and op.rdims:
                raise VerifyError(f"{where}: reduction dims without a reduction")
            if op.reduce and op.reduce.startswith("arg"):
                if op.type.dtype != "i64" or len(op.rdims) != 1:
                    raise VerifyError(f"{where}: {op.reduce} gives i64 over exactly one dim")
            elif op.body.dtype != op.type.dtype:
                raise VerifyError(f"{where}: body has dtype {op.body.dtype}, result is {op.type.dtype}")
            for s in list(op.type.dims.values()) + list(op.rdims.values()):
                unknown = free_syms(s) - syms
                if unknown:
                    raise VerifyError(f"{where}: size uses unbound symbol ${sorted(unknown)[0]}")
            _check_reads(where, op.body, defined, set(op.type.dims) | set(op.rdims))
            defined[op.out] = op.type
        elif isinstance(op, Procedure):
            where = f"procedure {', '.join('%' + n for n in op.results)}"
            for n in list(op.results) + list(op.locals_):
                if n in defined:
                    raise VerifyError(f"{where}: %{n} is defined twice")
            inner = {**defined, **op.results, **op.locals_}
            defined_syms: set[str] = set()
            _check_stmts(where, op.body, inner, set(), defined_syms)
            missing = set(op.bounds) - defined_syms
            if missing:
                raise VerifyError(f"{where}: never sets size ${sorted(missing)[0]}")
            syms |= defined_syms
            defined.update(op.results)
        else:
            raise VerifyError(f"unknown op kind {type(op).__name__}")
    for p in g.outputs:
        if p.name not in defined:
            raise VerifyError(f"output %{p.name} is not defined")
        _check_layout(f"output %{p.name}", p.layout, defined[p.name].dims)
    for name, ty in defined.items():
        if g.types.get(name) != ty:
            raise VerifyError(f"%{name}: the graph's type table disagrees with its definition")
