"""Row-invariant selects: a branch per row instead of a select per element.

A concatenation in the IR is a select on the concatenated dim, ``select(lt(c, 64), A[c],
B[c - 64])``, and the fuse pass inlines it into its consumer (a pooling, a batchnorm). When
that dim is an outer dim of the kernel (not its row, not a reduction dim), the condition is
the same for every element of a row: lowered as written, the row loop evaluates both arms,
loads from both inputs at clamped indices and blends them, which keeps the loop from being a
plain vector loop (squeezenet's pooled concats ran 10x slower than a plain pooling).
``invariant_select`` finds such a select and ``expr.replace_node`` gives the body with it replaced by
one arm, so the lowering can branch once per row and emit each arm's row loop separately.

When the concatenated dim is the row itself (a concatenation of channels-last images along
their channel), ``row_select`` finds the select on it, ``lt(c, 64)``, and the lowering splits
the row's loop at 64 instead: one loop per arm, each over its part of the row. Within a part
the arm's clamped index of its input (``min(max(c - 64, 0), 127)``: both arms of a select may
be evaluated) is always in range, and ``unclamp`` takes the clamp out, so the part's loop reads
its input with plain vector loads.

A guarded read along the row (a padded copy: the zero-halo input of a padded convolution,
contraction.py's, or a Pad) splits the row the same way, at the values where its index, the
row plus a constant, enters and leaves its dim (``guard_cuts``): the pads' loops, and the
image's, where the lowering knows the index in range and loads a whole vector plainly
(codegen/llvm/scalar.py, ``lane_range``). Left in one loop, the guard was a masked load per
vector (AVX2's vmaskmovps behind a compare of the index): a stem's 3 x 224 x 224 input took
0.085 ms to copy on Zen 3, 0.047 ms split (MLPACK_PROFILE=1, under another process's load).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.concat import clamp_of
from mlpack.codegen.targets.cpu.indexing import affine

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


def row_select(exprs: list[Expr], row: str) -> Expr | None:
    """The first select in ``exprs`` whose condition is ``lt(row, K)``, K a constant."""
    for e in exprs:
        for n in ex.walk(e) if e is not None else ():
            if n.op == "select":
                cond = n.args[0]
                if cond.op == "lt" and cond.args[0].op == "var" and cond.args[0].arg == row \
                        and cond.args[1].is_const:
                    return n
    return None


def guard_cuts(exprs: list[Expr], row: str, buffers) -> tuple[int, int] | None:
    """``(a, b)``: the values of ``row`` for which the first guarded read in ``exprs`` that
    indexes a dim of constant extent ``n`` by ``row + c`` stays in it, ``a = -c``, ``b = n - c``
    (a padded copy's image, between its pads); else None. ``buffers``: name -> Buffer."""
    for e in exprs:
        for r in ex.walk(e) if e is not None else ():
            if r.op != "read" or r.arg[2] is None or r.arg[0] not in buffers:
                continue
            for d, ix in zip(r.arg[1], r.args):
                form = affine(ix, {row})
                n = buffers[r.arg[0]].sizes[d]
                if form is not None and form[0] == {row: 1} and form[1].is_const and n.is_const:
                    return -form[1].value, n.value - form[1].value
    return None


def unclamp(e: Expr | None, v: str, lo: int, hi: int | None) -> Expr | None:
    """``e`` with each ``min(max(v + a, 0), b)`` that ``v`` in ``[lo, hi)`` keeps in range
    replaced by ``v + a``."""
    if e is None or not e.args or hi is None:
        return e
    clamp = clamp_of(e)
    if clamp is not None:
        inner, top = clamp
        form = affine(inner, {v})
        if form is not None and form[0] == {v: 1} and form[1].is_const and \
                lo + form[1].value >= 0 and hi - 1 + form[1].value <= top:
            return inner
    args = tuple(unclamp(a, v, lo, hi) for a in e.args)
    return e if all(a is b for a, b in zip(args, e.args)) else ex.rebuild(e, args)
