"""Reductions into their copies: a reshape/transpose of a reduction's result computes it there.

    %s[p, o] = sum{r} f(p, o, r)
    %v[n, x, o] = %s[p=7*n + x, o=o]          ->   %v[n, x, o] = sum{r} f(7*n + x, o, r)

A framework reduces over flattened rows and then reshapes back (MatMul + ReduceSum + Reshape),
so the reduction's result is materialized only to be copied. When a map's body is a single
unguarded read of a reduction that nothing else reads (and that is not a graph output), the
map becomes the reduction with the reduction's output dims replaced by the read's index and
its reduction dims renamed away from the map's dims. It is done only when the copy has at most
as many elements as the reduction, so no reduction is computed more often than before.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph
from mlpack.codegen.passes.sums import merge, read_counts


def _elements(dims) -> int | None:
    n = 1
    for s in dims.values():
        if not s.is_const:
            return None
        n *= s.arg
    return n


def _no_more_work(copy: Comprehension, red: Comprehension) -> bool:
    a, b = _elements(copy.type.dims), _elements(red.type.dims)
    if a is not None and b is not None:
        return a <= b
    return ex.same_size(ex.product(copy.type.dims.values()), ex.product(red.type.dims.values()))


def absorb_reductions(g: Graph) -> Graph:
    counts, pinned = read_counts(g)
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    absorbed = set()
    for op in g.ops:
        if not isinstance(op, Comprehension) or op.reduce is not None or op.body.op != "read":
            continue
        at = op.body
        src = producers.get(at.arg[0])
        if (src is None or src.reduce is None or at.arg[2] is not None or src.out in pinned
                or counts[src.out] != 1 or src.out in absorbed or not _no_more_work(op, src)):
            continue
        op.reduce = src.reduce
        merge(op, src, at)
        absorbed.add(src.out)
    if absorbed:
        g.ops = [o for o in g.ops if not (isinstance(o, Comprehension) and o.out in absorbed)]
        for n in absorbed:
            del g.types[n]
    return g
