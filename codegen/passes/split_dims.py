"""Split flattened reduction dims and simplify index quotients (undo a Reshape's flattening).

A Reshape that flattens (kx, ky, ci) into one axis of 288 leaves, after the copies are inlined,
a reduction dim ``r < 288`` read as ``r // 96``, ``r // 32 % 3`` and ``r % 32``. Written as
``r = 96*a + 32*b + c`` (``a, b < 3``, ``c < 32``) every such index becomes affine again, and a
contraction over ``r`` is the contraction over ``a, b, c`` that the direct form wrote. The
split points are the divisors ``r`` is divided by (they must divide the extent and each other);
a split is kept only when it removes quotients or remainders from the body. Independently,
every read index of every comprehension is simplified with the loop extents (see affine.py),
which also cleans up the output side (``(49*n + 7*x + y) // 7 % 7 == x``).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph
from mlpack.codegen.passes.affine import const_ranges, count_divmod, radices, simplify_reads
from mlpack.codegen.passes.sums import fresh

SPLIT_REDUCTIONS = ("sum", "prod", "max", "min")   # the reductions whose order is free


def _split_one(op: Comprehension) -> bool:
    """Split the first reduction dim whose split removes quotients; True if one was."""
    ranges = const_ranges(op.loop_dims)
    before = count_divmod(op.body)
    if not before:
        return False
    for r, size in op.rdims.items():
        if not size.is_const:
            continue
        steps = radices(op.body, r, size.arg)
        if not steps:
            continue
        bounds = steps + [size.arg]
        taken = set(op.loop_dims) | ex.free_vars(op.body)
        value, stride = ex.const(0), 1
        parts: dict[str, int] = {}
        # least significant part first: r = c + 32*b + 96*a
        for k, top in enumerate(bounds):
            name = fresh(f"{r}_{len(bounds) - 1 - k}", taken)
            taken.add(name)
            parts[name] = top // stride
            value = ex.add(ex.mul(ex.const(stride), ex.var(name)), value) if k else ex.var(name)
            stride = top
        new_ranges = {**{d: n for d, n in ranges.items() if d != r}, **parts}
        body = simplify_reads(ex.substitute(op.body, {r: value}), new_ranges)
        if count_divmod(body) >= before:
            continue
        rdims = {}
        for d, s in op.rdims.items():
            if d == r:
                rdims.update({n: ex.const(parts[n]) for n in reversed(list(parts))})
            else:
                rdims[d] = s
        op.body, op.rdims = body, rdims
        return True
    return False


def split_dims(g: Graph) -> Graph:
    for op in g.ops:
        if not isinstance(op, Comprehension):
            continue
        op.body = simplify_reads(op.body, const_ranges(op.loop_dims))
        split_reduction(op)
    return g


def split_reduction(op: Comprehension) -> None:
    """Split ``op``'s reduction dims (in place) while a split removes quotients."""
    if op.reduce in SPLIT_REDUCTIONS:
        while _split_one(op):
            pass
