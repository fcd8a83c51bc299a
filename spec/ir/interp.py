"""The NumPy reference interpreter: what an IR graph means.

Every pass and every target is tested against this. ``run_graph`` evaluates the ops in order:
a comprehension by spec/ir/interp_comprehension.py (labeled arrays, einsum for sums of
products, strided views for affine reads, big ones in blocks), a procedure statement by
statement with scalar locals (here). What each scalar op means is spec/ir/scalarops.py.
Tensors are freed after their last reader, so the peak is what the graph keeps live.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import (Comprehension, For, Graph, If, Let, Procedure, SetSize, Store,
                                  While, tensors_read)
from mlpack.spec.ir.expr import index_value
from mlpack.spec.errors import IndexRangeError, InterpError
from mlpack.spec.ir.interp_comprehension import ComprehensionEval
from mlpack.spec.ir.origins import message as index_message
from mlpack.spec.ir.scalarops import (_BINARY, _INT_BINARY, _UNARY, apply_op)  # noqa: F401


class _Tensors:
    """Materialized tensors: data stored with axes in ``layout`` order."""

    def __init__(self):
        self.data: dict[str, np.ndarray] = {}
        self.layout: dict[str, tuple[str, ...]] = {}

    def put(self, name, data, layout):
        self.data[name] = data
        self.layout[name] = tuple(layout)


class _Procedure:
    """Execute a procedure's statements with scalar locals."""

    def __init__(self, op: Procedure, tensors: _Tensors, syms: dict[str, int],
                 origins: dict | None = None):
        self.op, self.tensors, self.syms = op, tensors, syms
        self.origins = origins or {}
        self.locals: dict[str, object] = {}

    def value(self, e: Expr):
        op = e.op
        if op == "const":
            return np.asarray(e.arg, dtype=dt.to_numpy(e.dtype))
        if op == "var":
            try:
                return self.locals[e.arg]
            except KeyError:
                raise InterpError(f"procedure: unbound variable {e.arg}") from None
        if op == "sym":
            return np.int64(index_value(e, self.syms))
        if op == "read":
            name, dims, pad = e.arg
            data, layout = self.tensors.data[name], self.tensors.layout[name]
            index = {d: int(self.value(a)) for d, a in zip(dims, e.args)}
            pos = tuple(index[d] for d in layout)
            if any(not 0 <= p < n for p, n in zip(pos, data.shape)):
                if pad is not None:
                    return np.asarray(pad, dtype=data.dtype)
                raise self._range_error(name, layout, pos, data.shape, "read of")
            return data[pos]
        vals = [self.value(a) for a in e.args]
        return apply_op(op, [np.asarray(v) for v in vals], e.dtype, [a.dtype for a in e.args])

    def exec(self, stmts):
        for s in stmts:
            if isinstance(s, Let):
                self.locals[s.name] = self.value(s.value)
            elif isinstance(s, Store):
                data, layout = self.tensors.data[s.tensor], self.tensors.layout[s.tensor]
                pos = tuple(int(self.value(s.index[d])) for d in layout)
                if any(not 0 <= p < n for p, n in zip(pos, data.shape)):
                    raise self._range_error(s.tensor, layout, pos, data.shape, "store to")
                data[pos] = self.value(s.value)
            elif isinstance(s, For):
                n = int(self.value(s.extent))
                for i in range(n):
                    self.locals[s.var] = np.int64(i)
                    self.exec(s.body)
            elif isinstance(s, While):
                while bool(self.value(s.cond)):
                    self.exec(s.body)
            elif isinstance(s, If):
                self.exec(s.then if bool(self.value(s.cond)) else s.orelse)
            elif isinstance(s, SetSize):
                self.syms[s.sym] = int(self.value(s.value))

    def _range_error(self, name, layout, pos, shape, what) -> IndexRangeError:
        d, p, n = next((d, p, n) for d, p, n in zip(layout, pos, shape) if not 0 <= p < n)
        return IndexRangeError(index_message(name, d, p, n, self.origins.get((name, d)), what))

    def run(self):
        op = self.op
        bounded = dict(self.syms)
        for s, b in op.bounds.items():
            bounded[s] = index_value(b, self.syms)
        for name, ty in {**op.results, **op.locals_}.items():
            shape = [index_value(ty.dims[d], bounded) for d in ty.dims]
            self.tensors.put(name, np.zeros(shape, dtype=dt.to_numpy(ty.dtype)), tuple(ty.dims))
        self.exec(op.body)
        for name, ty in op.results.items():
            shape = tuple(index_value(ty.dims[d], self.syms) for d in ty.dims)
            trimmed = self.tensors.data[name][tuple(slice(0, n) for n in shape)]
            self.tensors.data[name] = np.ascontiguousarray(trimmed).reshape(trimmed.shape)
        for name in op.locals_:
            del self.tensors.data[name]


def bind_symbols(g: Graph, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Sizes of the symbols, read off the inputs' shapes (checked for consistency)."""
    from mlpack.spec.ir.expr import free_syms
    syms: dict[str, int] = {}
    deferred = []
    for port in g.inputs:
        ty = g.types[port.name]
        arr = inputs[port.name]
        if arr.ndim != len(port.layout):
            raise InterpError(f"input {port.name!r} has rank {arr.ndim}, expected {len(port.layout)}")
        for d, n in zip(port.layout, arr.shape):
            s = ty.dims[d]
            if s.op == "sym" and s.arg not in syms:
                syms[s.arg] = n
            else:
                deferred.append((port.name, d, s, n))
    for name, d, s, n in deferred:
        if free_syms(s) - set(syms):
            continue
        if index_value(s, syms) != n:
            raise InterpError(f"input {name!r}: dim {d} is {n}, expected {index_value(s, syms)}")
    return syms


def _last_uses(g: Graph) -> dict[int, list[str]]:
    """For each op index, the tensors no later op reads (freed after it: peak memory stays low)."""
    last: dict[str, int] = {}
    for i, op in enumerate(g.ops):
        for name in tensors_read(op):
            last[name] = i
    out: dict[int, list[str]] = {}
    for name, i in last.items():
        out.setdefault(i, []).append(name)
    return out


def run_graph(g: Graph, inputs: dict[str, np.ndarray], observe=None) -> dict[str, np.ndarray]:
    """Evaluate ``g`` on NumPy inputs (arrays in each input's layout); outputs in theirs.
    ``observe(name, data)``, when given, sees every input and every comprehension's output as it
    is computed (data in the tensor's dims order; calibration, codegen/precisions/int8.py)."""
    tensors = _Tensors()
    for port in g.inputs:
        if port.name not in inputs:
            raise InterpError(f"missing input {port.name!r}")
        want = dt.to_numpy(g.types[port.name].dtype)
        tensors.put(port.name, np.asarray(inputs[port.name]).astype(want, copy=False), port.layout)
    syms = bind_symbols(g, {p.name: tensors.data[p.name] for p in g.inputs})
    if observe is not None:
        for port in g.inputs:
            observe(port.name, tensors.data[port.name])
    for c in g.constants.values():
        tensors.put(c.name, c.data, c.layout)
    last_use = _last_uses(g)
    keep = {p.name for p in g.outputs}
    for i, op in enumerate(g.ops):
        if isinstance(op, Comprehension):
            tensors.put(op.out, ComprehensionEval(op, tensors, syms, g.origins).run(),
                        tuple(op.type.dims))
            if observe is not None:
                observe(op.out, tensors.data[op.out])
        else:
            _Procedure(op, tensors, syms, g.origins).run()
        for name in last_use.get(i, ()):
            if name not in keep and name not in g.constants:
                tensors.data.pop(name, None)
    out = {}
    for port in g.outputs:
        data, layout = tensors.data[port.name], tensors.layout[port.name]
        data = np.transpose(data, [layout.index(d) for d in port.layout])
        data = np.ascontiguousarray(data).reshape(data.shape)
        out[port.name] = data if data.flags.writeable else data.copy()   # a shared view
    return out
