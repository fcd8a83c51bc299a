"""Divide or scale after summing: ``sum{k} (A / B) * F`` is ``(sum{k} A * F) / B``, and
``sum{k} (A * C) * F`` is ``(sum{k} A * F) * C``, when B (C) has no k.

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

``divide_after`` rewrites a sum whose body is a product of a read of a map whose body is
``div(A, B)`` and another factor, A a single unguarded read (a tensor: inlining anything
costlier would recompute it for every output column) and B, at the read's index, free of the
reduction's dims. The map itself is left to dce.

``scale_after`` does the same for a map ``A * C`` whose A is a tensor read elsewhere too: torch
exports scaled dot-product attention with both Q and K^T multiplied by the fourth root of
1/d, each a map over the slices of one fused projection that three readers share, so each was
a kernel of its own (ViT-B/16: 0.10 ms a layer, K's written transposed) and K's product a
generic pack of it. After, Q.K^T reads both slices of the projection in place and multiplies
its output by the two constants in its epilogue. A map whose A only it reads is left alone:
it is fused into A's producer for nothing (Whisper's query scale, in its projection's
epilogue), where after the sum it would cost a multiply per score (1500 x 1500 a head).
A sum with several such factors has each moved, into one map after it.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.passes.sums import fresh, read_counts


def _at(e: Expr) -> dict:
    """The read map's vars bound to the indices of ``e``."""
    return dict(zip(e.arg[1], e.args))


def _quotient(e: Expr, producers: dict[str, Comprehension], shared) -> tuple | None:
    """("div", A, B) at the read's index, when ``e`` is an unguarded read of a map
    ``div(A, B)`` whose numerator A is a single unguarded read."""
    p = _map_of(e, producers)
    if p is None or p.body.op != "div":
        return None
    num, den = p.body.args
    if num.op != "read" or num.arg[2] is not None:
        return None
    at = _at(e)
    return "div", ex.substitute(num, at), ex.substitute(den, at)


def _scaled(e: Expr, producers: dict[str, Comprehension], shared) -> tuple | None:
    """("mul", A, C) at the read's index, when ``e`` is an unguarded read of a map ``A * C``
    (either order) whose A is a single unguarded read of a tensor that ``shared`` says other
    ops read too."""
    p = _map_of(e, producers)
    if p is None or p.body.op != "mul" or len(p.body.args) != 2:
        return None
    for a, c in (p.body.args, p.body.args[::-1]):
        if a.op == "read" and a.arg[2] is None and shared(a.arg[0]):
            at = _at(e)
            return "mul", ex.substitute(a, at), ex.substitute(c, at)
    return None


def _map_of(e: Expr, producers: dict[str, Comprehension]) -> Comprehension | None:
    """The map an unguarded read ``e`` reads, else None."""
    if e.op != "read" or e.arg[2] is not None:
        return None
    p = producers.get(e.arg[0])
    return p if p is not None and p.reduce is None else None


def _move_after(g: Graph, find, suffix: str) -> Graph:
    """Each sum of two factors, one a read that ``find`` takes apart as (op, A, B), summed
    over A instead and then ``op``-ed with B (again while another factor qualifies)."""
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    outputs = {p.name for p in g.outputs}
    counts, pinned = read_counts(g)

    def shared(name: str) -> bool:   # read by another op too (the map reads it once)
        return name in pinned or counts[name] > 1

    ops, types = [], dict(g.types)
    taken = set(g.types) | set(g.constants)
    for op in g.ops:
        moved, body = [], op.body if isinstance(op, Comprehension) else None
        while op.__class__ is Comprehension and op.reduce == "sum" and body.op == "mul" \
                and len(body.args) == 2 and body.dtype in ("f32", "f64"):
            for i, factor in enumerate(body.args):
                found = find(factor, producers, shared)
                if found is not None and factor.arg[0] not in outputs and \
                        not ex.free_vars(found[2]) & set(op.rdims):
                    break
            else:
                break
            kind, num, den = found
            other = body.args[1 - i]
            body = ex.mul(num, other) if i == 0 else ex.mul(other, num)
            moved.append((kind, den))
        if not moved:
            ops.append(op)
            continue
        # one map after the sum, with every factor moved (a chain of maps would be a kernel
        # each past the first, which the contraction's epilogue takes)
        name = fresh(f"{op.out}_{suffix}", taken)
        taken.add(name)
        ops.append(Comprehension(name, op.type, body, "sum", dict(op.rdims)))
        types[name] = TensorType(op.type.dtype, dict(op.type.dims))
        after = ex.read(name, {d: ex.var(d) for d in op.type.dims}, op.type.dtype)
        for kind, den in moved:
            after = ex.binary(kind, after, den)
        ops.append(Comprehension(op.out, op.type, after))
    return replace(g, ops=ops, types=types)


def divide_after(g: Graph) -> Graph:
    return _move_after(g, _quotient, "undivided")


def scale_after(g: Graph) -> Graph:
    return _move_after(g, _scaled, "unscaled")
