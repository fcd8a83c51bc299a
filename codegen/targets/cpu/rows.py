"""A GEMM's activation operand laid out rows first, so each row's K dims are one unit-stride run.

The plan lays a tensor out in its type's dim order (plan.tensor_buffers). Attention's output
is computed per head, ``O[head, token, d]``, and the projection after it reads it as a matrix of
tokens by (head, d): ``Y[token, n] = sum{head, d} O[head, token, d] * W[64 * head + d, n]``
(ONNX's Transpose and Reshape between them became that index). In the type's order each row of
that matrix is twelve runs of 64 floats, 32 KiB apart, which all fall in one L1 set, and
DistilBERT's output projection ran at half the speed of the same-size Q projection beside it.

``rows_first`` reorders such a tensor's type: the dims its reader indexes with output vars (the
GEMM's rows) first, in their order, then the dims it indexes with reduction vars (K), in theirs,
so that a row is one run. It applies where that reader is a contraction of the tensor with a
constant (the weights, packed at load in any order, contraction.py), the only reader of a
tensor that a comprehension writes and that is no graph output, reading it at plain vars
without a guard, and where K spans two dims or more (one K dim is left to the GEMM's own
choices, an NCHW 1x1 convolution's swapped operands among them). The producer then stores
each of its rows at the new stride: for attention, P.V's tile rows of 64 go to rows of 768.
``MLPACK_DISABLE_PASSES=rows_first`` keeps every tensor in its type's order.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType, tensors_read


def operands(op: Comprehension, g: Graph) -> tuple[Expr, Expr] | None:
    """(the activation's read, the constant's read) of a sum of products of the two, or None.
    A constant read under a widening cast (16-bit weights) counts as the constant."""
    if op.reduce != "sum" or not op.rdims or op.body.op != "mul":
        return None
    reads = []
    for arg in op.body.args:
        r = arg.args[0] if arg.op == "cast" else arg
        if r.op != "read":
            return None
        reads.append(r)
    consts = [r for r in reads if r.arg[0] in g.constants]
    if len(consts) != 1:
        return None
    return (reads[1], reads[0]) if reads[0] is consts[0] else (reads[0], reads[1])


def _rows_first(op: Comprehension, t: str, g: Graph) -> list[str] | None:
    """``t``'s dims, rows first and K last (module docstring), when ``op`` reads it as the
    activation of a contraction with a constant over two K dims or more and that order is not
    its order already; else None."""
    hit = operands(op, g)
    if hit is None or hit[0].arg[0] != t or hit[0].arg[2] is not None:
        return None
    index = dict(zip(hit[0].arg[1], hit[0].args))
    if any(ix.op != "var" for ix in index.values()):
        return None
    if len({ix.arg for ix in index.values()}) != len(index):
        return None   # one var at two dims (a diagonal)
    layout = list(g.types[t].dims)
    ks = [d for d in layout if index[d].arg in op.rdims]
    if len(ks) < 2:
        return None
    order = [d for d in layout if d not in ks] + ks
    return order if order != layout else None


def rows_first(g: Graph) -> Graph:
    """``g`` with each tensor the module docstring describes laid out rows first. ``g`` itself
    is not changed: the targets of a build share it."""
    outputs = {p.name for p in g.outputs}
    readers: dict[str, list] = {}
    for op in g.ops:
        for t in tensors_read(op):
            readers.setdefault(t, []).append(op)
    orders = {}
    for op in g.ops:
        if not isinstance(op, Comprehension) or op.out in outputs:
            continue
        rs = readers.get(op.out, [])
        if len(rs) == 1 and isinstance(rs[0], Comprehension):
            order = _rows_first(rs[0], op.out, g)
            if order is not None:
                orders[op.out] = order
    return reordered(g, orders)


def reordered(g: Graph, orders: dict[str, list[str]]) -> Graph:
    """``g`` with each comprehension's output in ``orders`` laid out in that dim order (a new
    graph; ``g`` is not changed)."""
    if not orders:
        return g
    ops, types = [], dict(g.types)
    for op in g.ops:
        if isinstance(op, Comprehension) and op.out in orders:
            op = replace(op, type=TensorType(op.type.dtype,
                                             {d: op.type.dims[d] for d in orders[op.out]}))
            types[op.out] = op.type
        ops.append(op)
    return replace(g, ops=ops, types=types)


__all__ = ["operands", "reordered", "rows_first"]
