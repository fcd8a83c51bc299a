"""Dead code elimination: drop ops and constants no output depends on."""

from __future__ import annotations

from mlpack.spec.ir.graph import Graph, Procedure, tensors_read


def eliminate_dead_code(g: Graph) -> Graph:
    live = {p.name for p in g.outputs}
    kept = []
    for op in reversed(g.ops):
        if live & set(op.outs):
            kept.append(op)
            live |= tensors_read(op)
    kept.reverse()
    kept_ids = {id(op) for op in kept}
    dead = [n for op in g.ops if id(op) not in kept_ids for n in op.outs]
    for op in g.ops:
        if isinstance(op, Procedure) and id(op) not in kept_ids:
            dead += list(op.locals_)
    g.ops = kept
    for name in [c for c in g.constants if c not in live]:
        del g.constants[name]
        g.types.pop(name, None)
    for n in dead:
        g.types.pop(n, None)
    return g
