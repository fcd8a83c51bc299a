"""Row-invariant selects: a branch per row instead of a select per element.

A concatenation in the IR is a select on the concatenated dim, ``select(lt(c, 64), A[c],
B[c - 64])``, and the fuse pass inlines it into its consumer (a pooling, a batchnorm). When
that dim is an outer dim of the kernel (not its row, not a reduction dim), the condition is
the same for every element of a row: lowered as written, the row loop evaluates both arms,
loads from both inputs at clamped indices and blends them, which keeps the loop from being a
plain vector loop (squeezenet's pooled concats ran 10x slower than a plain pooling).
``invariant_select`` finds such a select and ``expr.replace_node`` gives the body with it replaced by
one arm, so the lowering can branch once per row and emit each arm's row loop separately.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr

MAX_HOISTED = 8   # nested selects hoisted per kernel (a concat of 9+ inputs keeps the rest)


def invariant_select(exprs: list[Expr], outer: set[str]) -> Expr | None:
    """The first select in ``exprs`` whose condition reads no tensor and depends only on the
    vars in ``outer`` (and symbols), else None."""
    for e in exprs:
        if e is None:
            continue
        for n in ex.walk(e):
            if n.op != "select":
                continue
            cond = n.args[0]
            if any(m.op == "read" for m in ex.walk(cond)):
                continue
            if ex.free_vars(cond) <= outer:
                return n
    return None


