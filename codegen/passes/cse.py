"""Common subexpression elimination at op level: identical comprehensions compute once.

Two comprehensions are the same when their types, reductions and bodies are equal (after the
earlier duplicates have been merged, so chains of duplicates collapse in one sweep).
"""

from __future__ import annotations

from mlpack.spec.ir.expr import rename_tensors
from mlpack.spec.ir.graph import Comprehension, Graph, Port


def _key(op: Comprehension):
    dims = tuple(sorted((d, s) for d, s in op.type.dims.items()))
    rdims = tuple(sorted((d, s) for d, s in op.rdims.items()))
    return (op.type.dtype, dims, op.reduce, rdims, op.body)


def eliminate_common_subexpressions(g: Graph) -> Graph:
    seen: dict = {}
    renames: dict[str, str] = {}
    outputs = {p.name for p in g.outputs}
    kept = []
    for op in g.ops:
        if isinstance(op, Comprehension):
            if renames:
                op.body = rename_tensors(op.body, renames)
            key = _key(op)
            first = seen.get(key)
            if first is not None and op.out not in outputs:
                renames[op.out] = first
                del g.types[op.out]
                continue
            seen.setdefault(key, op.out)
        elif renames:
            from mlpack.codegen.passes.rename import rename_in_procedure
            rename_in_procedure(op, renames)
        kept.append(op)
    g.ops = kept
    g.outputs = [Port(renames.get(p.name, p.name), p.layout) for p in g.outputs]
    return g
