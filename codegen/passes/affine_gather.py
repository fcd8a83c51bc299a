"""Affine constant gathers: an index read from a constant table becomes index arithmetic.

Frameworks cut patches (im2col, unfold, strided slices) with Gather and a constant int64 index
table such as ``idx[x, kx] = 2*x + kx``. The importer turns that into an indirect read
``%P[h=select(lt(%idx[..], 0), %idx[..] + 16, %idx[..])]`` (ONNX's negative-index wrap).
When the table's values are exactly an affine function of its own indices (checked with NumPy
over the whole constant) every unguarded read of it is replaced by that function, so the
gather is an affine read the other passes can inline and contract; the table becomes dead.

The wrap test ``lt(read, 0)`` folds from the table's values: an unguarded read only ever sees
in-range indices, so its value is one of the table's, and if they are all >= 0 (or all < 0)
the comparison is the same everywhere. Guarded reads of a table (pad) are left alone: outside
the table they give the pad value, which no affine function does.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Constant, Graph
from mlpack.codegen.passes.affine import from_linear, linear, tidy

_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}
_SWAP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def affine_fit(c: Constant) -> tuple[int, dict[str, int]] | None:
    """(base, {dim: coefficient}) with ``c[i] == base + sum coef[d] * i[d]`` exactly, or None."""
    data = c.data
    if not dt.is_int(c.type.dtype) or c.type.dtype == "bool" or data.size == 0:
        return None
    data = data.astype(np.int64)
    base = int(data.reshape(-1)[0])
    coef: dict[str, int] = {}
    fit = np.full(data.shape, base, dtype=np.int64)
    for ax, d in enumerate(c.layout):
        n = data.shape[ax]
        k = 0
        if n > 1:
            at = [0] * data.ndim
            at[ax] = 1
            k = int(data[tuple(at)]) - base
        coef[d] = k
        shape = [1] * data.ndim
        shape[ax] = n
        fit = fit + k * np.arange(n, dtype=np.int64).reshape(shape)
    if not np.array_equal(fit, data):
        return None
    return base, coef


class _Rewriter:
    def __init__(self, g: Graph):
        self.fits: dict[str, tuple[int, dict[str, int]] | None] = {}
        self.g = g

    def fit(self, name: str):
        if name not in self.fits:
            c = self.g.constants.get(name)
            self.fits[name] = affine_fit(c) if c is not None else None
        return self.fits[name]

    def table(self, e: Expr):
        """The fit of ``e`` if it is an unguarded read of an affine constant table."""
        if e.op == "read" and e.arg[2] is None:
            return self.fit(e.arg[0])
        return None

    def affine(self, e: Expr, fit) -> Expr:
        base, coef = fit
        lin: dict = {None: base}
        for d, i in zip(e.arg[1], e.args):
            for k, c in linear(self.rewrite(i)).items():
                lin[k] = lin.get(k, 0) + coef[d] * c
        return from_linear({k: c for k, c in lin.items() if c})

    def rewrite(self, e: Expr) -> Expr:
        if e.op in _CMP and len(e.args) == 2:
            folded = self._compare(e)
            if folded is not None:
                return folded
        if e.op == "cast" and e.dtype == dt.INDEX:
            fit = self.table(e.args[0])
            if fit is not None:
                # the table held integers in its own dtype, so widening them changes nothing
                return self.affine(e.args[0], fit)
        fit = self.table(e)
        if fit is not None:
            return ex.cast(self.affine(e, fit), e.dtype)
        if not e.args:
            return e
        args = tuple(self.rewrite(a) for a in e.args)
        if args == e.args:
            return e
        if e.op == "read":
            return Expr("read", tuple(tidy(a) for a in args), e.arg, e.dtype)
        return ex.rebuild(e, args)

    def _compare(self, e: Expr) -> Expr | None:
        """A table read compared with a constant, decided by the table's values if they agree."""
        op, (a, b) = e.op, e.args
        if b.op == "cast" and b.dtype == dt.INDEX:
            b = b.args[0]
        if a.op == "cast" and a.dtype == dt.INDEX:
            a = a.args[0]
        if self.table(b) is not None and a.is_const:
            a, b, op = b, a, _SWAP[op]
        if self.table(a) is None or not b.is_const or isinstance(b.arg, float):
            return None
        vals = _CMP[op](self.g.constants[a.arg[0]].data.astype(np.int64), b.arg)
        if vals.all():
            return ex.const(True)
        if not vals.any():
            return ex.const(False)
        return None


def fold_affine_gathers(g: Graph) -> Graph:
    if not any(affine_candidate(c) for c in g.constants.values()):
        return g
    rw = _Rewriter(g)
    for op in g.ops:
        if isinstance(op, Comprehension):
            op.body = rw.rewrite(op.body)
    return g


def affine_candidate(c: Constant) -> bool:
    return dt.is_int(c.type.dtype) and c.type.dtype != "bool" and c.data.size > 0
