"""Constant folding of maps: a map that reads only constants becomes a constant.

A dequantized weight (``(f32(W#i8) - 0) * sw[c]``, which the importer keeps as a map so that the
int8 precision can read its integers, codegen/precisions/qdq.py) or any other map of constants
would otherwise be computed on every run. Only maps no bigger than the largest constant they
read are folded, so no broadcast is materialized and a container's weights do not grow; graph
outputs stay ops.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, Port


def fold_constant_maps(g: Graph) -> Graph:
    """``g`` with every map that reads only constants and is no bigger than the largest of them
    evaluated into a constant (``g`` itself, unchanged, when there is none)."""
    from mlpack.spec.ir.interp import run_graph

    outputs = {p.name for p in g.outputs}
    constants, ops = dict(g.constants), []
    for op in g.ops:
        if _foldable(op, constants, outputs):
            reads = {n.arg[0] for n in ex.walk(op.body) if n.op == "read"}
            one = Graph("fold", constants={r: constants[r] for r in reads}, ops=[op],
                        types={**{r: constants[r].type for r in reads}, op.out: op.type})
            one.outputs.append(Port(op.out, tuple(op.type.dims)))
            data = run_graph(one, {})[op.out]
            constants[op.out] = Constant(op.out, op.type, tuple(op.type.dims),
                                         np.ascontiguousarray(data))
        else:
            ops.append(op)
    if len(ops) == len(g.ops):
        return g
    return eliminate_dead_code(replace(g, ops=ops, constants=constants, types=dict(g.types)))


def _foldable(op, constants: dict, outputs: set[str]) -> bool:
    if not isinstance(op, Comprehension) or op.reduce is not None or op.out in outputs:
        return False
    if not all(s.is_const for s in op.type.dims.values()):
        return False
    nodes = list(ex.walk(op.body))
    reads = {n.arg[0] for n in nodes if n.op == "read"}
    if not reads or not reads <= set(constants) or any(n.op == "sym" for n in nodes):
        return False
    size = int(np.prod([s.value for s in op.type.dims.values()]))
    return size <= max(constants[r].data.size for r in reads)
