"""Divide after summing: ``sum{k} (A / B) * F`` is ``(sum{k} A * F) / B`` when B has no k.

An attention's softmax is read by the product after it, ``P.V``:

    %e[x, j]  = exp(%s[x, j] - %max[x, 0])
    %z[x, 0]  = sum{j} %e[x, j]
    %p[x, j]  = div(%e[x, j], %z[x, 0])
    %o[x, n]  = sum{k} %p[x, k] * %v[k, n]
        ->
    %o_sum[x, n] = sum{k} %e[x, k] * %v[k, n]
    %o[x, n]     = div(%o_sum[x, n], %z[x, 0])

Every term of the sum is divided by the same row total, so the division moves after it, onto
the result (``S x 64`` per head where ``p`` is ``S x S``), where the GEMM takes it as its
epilogue; the GEMM reads the exponentials, which the softmax's sum reads too. The exp is then
computed once per element (it was computed in the sum and again in the normalization), and the
normalized matrix is not written at all when nothing else reads it (dce drops it). The rounding
differs from the term-by-term division by about an ulp of the result.

A sum is rewritten when its body is a product of a read of a map whose body is ``div(A, B)``
and another factor, A a single unguarded read (a tensor: inlining anything costlier would
recompute it for every output column) and B, at the read's index, free of the reduction's
dims. The map itself is left to dce.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.passes.sums import fresh


def _quotient(e: Expr, producers: dict[str, Comprehension]) -> tuple[Expr, Expr] | None:
    """(A, B) at the read's index, when ``e`` is an unguarded read of a map ``div(A, B)``
    whose numerator A is a single unguarded read."""
    if e.op != "read" or e.arg[2] is not None:
        return None
    p = producers.get(e.arg[0])
    if p is None or p.reduce is not None or p.body.op != "div":
        return None
    num, den = p.body.args
    if num.op != "read" or num.arg[2] is not None:
        return None
    at = dict(zip(e.arg[1], e.args))
    return ex.substitute(num, at), ex.substitute(den, at)


def divide_after(g: Graph) -> Graph:
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    outputs = {p.name for p in g.outputs}
    ops, types = [], dict(g.types)
    taken = set(g.types) | set(g.constants)
    for op in g.ops:
        body = op.body if isinstance(op, Comprehension) else None
        if op.__class__ is not Comprehension or op.reduce != "sum" or body.op != "mul" \
                or len(body.args) != 2 or body.dtype not in ("f32", "f64"):
            ops.append(op)
            continue
        for i, factor in enumerate(body.args):
            found = _quotient(factor, producers)
            if found is not None and factor.arg[0] not in outputs and \
                    not ex.free_vars(found[1]) & set(op.rdims):
                break
        else:
            ops.append(op)
            continue
        num, den = found
        other = body.args[1 - i]
        name = fresh(f"{op.out}_undivided", taken)
        taken.add(name)
        summed = Comprehension(name, op.type, ex.mul(num, other) if i == 0 else
                               ex.mul(other, num), "sum", dict(op.rdims))
        ident = ex.read(name, {d: ex.var(d) for d in op.type.dims}, op.type.dtype)
        ops.append(summed)
        types[name] = TensorType(op.type.dtype, dict(op.type.dims))
        ops.append(Comprehension(op.out, op.type, ex.binary("div", ident, den)))
    return replace(g, ops=ops, types=types)
