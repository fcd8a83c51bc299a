"""Elementwise fusion: inline a map comprehension into the comprehensions that read it.

A map (no reduction) ``%p[i] = f(...)`` read by a consumer at index ``e`` becomes ``f`` with
``i := e`` inside the consumer, and ``%p`` is no longer materialized. It is inlined when that
recomputes nothing: the producer is read exactly once in the whole graph, or its body is a
single read (a copy, which costs nothing to redo). Reads guarded by ``pad`` are left alone:
the padding would have to guard every read inside the inlined body.
"""

from __future__ import annotations

from collections import Counter

from ...spec.ir.expr import Expr, rebuild, substitute, walk
from ...spec.ir.graph import Comprehension, Graph, Procedure, tensors_read


def _read_counts(g: Graph) -> tuple[Counter, set[str]]:
    counts: Counter = Counter()
    pinned: set[str] = {p.name for p in g.outputs}
    for op in g.ops:
        if isinstance(op, Procedure):
            pinned |= tensors_read(op)
            continue
        for n in walk(op.body):
            if n.op == "read":
                counts[n.arg[0]] += 1
                if n.arg[2] is not None:
                    pinned.add(n.arg[0])
    return counts, pinned


def _inline(e: Expr, producers: dict[str, Comprehension]) -> Expr:
    if e.op == "read" and e.arg[0] in producers:
        p = producers[e.arg[0]]
        index = {d: _inline(a, producers) for d, a in zip(e.arg[1], e.args)}
        return _inline(substitute(p.body, index), producers)
    if not e.args:
        return e
    args = tuple(_inline(a, producers) for a in e.args)
    return e if args == e.args else rebuild(e, args)


def fuse_elementwise(g: Graph) -> Graph:
    counts, pinned = _read_counts(g)
    inlinable: dict[str, Comprehension] = {}
    for op in g.ops:
        if not isinstance(op, Comprehension) or op.reduce is not None or op.out in pinned:
            continue
        if counts[op.out] == 1 or op.body.op == "read":
            inlinable[op.out] = op
    if not inlinable:
        return g
    kept = []
    for op in g.ops:
        if isinstance(op, Comprehension):
            if op.out in inlinable:
                continue
            op.body = _inline(op.body, inlinable)
        kept.append(op)
    # an inlined producer may itself have read an inlined one: _inline recurses, so all gone
    for name in inlinable:
        del g.types[name]
    g.ops = kept
    return g
