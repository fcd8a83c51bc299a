"""A contraction's activation read through divisions is gathered into a tensor of its own first.

The GEMM (contraction.py) finds each operand's element at ``base(m) + off(k)``, affine in the
loop vars. The front end folds data movement into the reads of what follows it, so a window
partition (Swin's 7 x 7 windows of a 14 x 14 image, shifted by a roll) reaches the QKV
projection as an index with divisions and remainders:

    %y[d0, m, n] = sum{k} %x[b=d0 // 4, h=7 * (d0 // 2 % 2) + (49 * d0 + m) // 7 % 7,
                            w=7 * (d0 % 2) + (49 * d0 + m) % 7, c=k] * %W[k, n]

No GEMM takes that, and the kernel ran as a generic reduction, at a fifth of the GEMM's speed
(Swin-T's QKV projections, a third of its time). ``gathered_operands`` copies such an operand
into a tensor over the read's own vars, rows first and K last (a map: every element moved once,
each row a unit-stride run), and the contraction reads that at plain vars:

    %x#rows[d0, m, k] = %x[b=d0 // 4, h=.., w=.., c=k]
    %y[d0, m, n]      = sum{k} %x#rows[d0=d0, m=m, k=k] * %W[k, n]

It applies to a sum of the product of two reads, one of them a constant (the weights, packed at
load), the other indexed by the loop vars through an index that is not affine in them (guarded
or not: the map takes the guard, as when windows pad the image); the copy costs a pass over
the operand against a GEMM's K flops per element it reads.
``MLPACK_DISABLE_PASSES=gather_operands`` leaves such reads in place.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.targets.cpu.indexing import affine
from mlpack.codegen.targets.cpu.kernels import fresh_name
from mlpack.codegen.targets.cpu.rows import operands


def _gather(op: Comprehension, g: Graph, taken: set[str]) -> tuple[Comprehension,
                                                                    Comprehension] | None:
    """(the gathering map, ``op`` reading it) when ``op``'s activation needs gathering."""
    hit = operands(op, g)
    if hit is None:
        return None
    a = hit[0]
    loop = set(op.type.dims) | set(op.rdims)
    used = set().union(*(ex.free_vars(ix) for ix in a.args))
    if not used <= loop or not used & set(op.rdims):
        return None
    if all(affine(ix, loop) is not None for ix in a.args):
        return None   # the GEMM reads it in place
    sizes = {**op.type.dims, **op.rdims}
    order = [d for d in op.type.dims if d in used] + [r for r in op.rdims if r in used]
    name = fresh_name(f"{a.arg[0]}#rows", taken)
    rows = Comprehension(name, TensorType(a.dtype, {v: sizes[v] for v in order}), a)
    plain = ex.read(name, {v: ex.var(v) for v in order}, a.dtype)
    body = ex.replace_node(op.body, a, plain)
    return rows, replace(op, body=body)


def gathered_operands(g: Graph) -> Graph:
    """``g`` with each activation the module docstring describes gathered before its
    contraction. ``g`` itself is not changed: the targets of a build share it."""
    taken = set(g.types) | set(g.constants)
    ops, types, count = [], dict(g.types), 0
    for op in g.ops:
        hit = _gather(op, g, taken) if isinstance(op, Comprehension) else None
        if hit is None:
            ops.append(op)
            continue
        rows, op = hit
        taken.add(rows.out)
        types[rows.out] = rows.type
        ops.extend([rows, op])
        count += 1
    return replace(g, ops=ops, types=types) if count else g


__all__ = ["gathered_operands"]
