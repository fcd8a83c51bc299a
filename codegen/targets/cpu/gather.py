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

The same copy takes an affine activation that lies column-major: its unit-stride dim walked by
rows and each K step a cache line or more away, an NCHW image that a 1x1 convolution reads
while the tensor keeps its order (a graph input, or ShuffleNet's channel shuffles, which keep
channels_last off its blocks). Each of the tile's broadcasts then reads a new line per K step,
and A's rows over K (a 464-channel 7 x 7 image: 91 KB) do not stay in L1 beside B's panel; rows
first, a tile's rows are six runs along K. Where the GEMM has columns enough to repay a pass
over A (``COLUMN_MIN_N``) and does not read the image as B instead (contraction._swapped, an
NCHW output of many pixels): ShuffleNetV2's last convolution (464 -> 1024 channels at 7 x 7)
0.97 -> 0.77 ms and 1.14 -> 0.79 ms in two runs, its copy 0.06 ms (MLPACK_PROFILE=1, x86_64-v3
on Zen 3); alone, with ReLU and a global pooling, 0.69 -> 1.03 of ONNX Runtime's speed.
``MLPACK_DISABLE_PASSES=gather_operands`` leaves such reads in place.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.targets.cpu.contraction import SWAP_MIN_N
from mlpack.codegen.targets.cpu.indexing import affine, is_one
from mlpack.codegen.targets.cpu.kernels import fresh_name
from mlpack.codegen.targets.cpu.rows import operands

COLUMN_MIN_STEP = 16   # elements (a cache line) a K step of a column-major activation moves
COLUMN_MIN_N = 256     # ... and the GEMM's columns that repay its copy


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
    forms = [affine(ix, loop) for ix in a.args]
    if all(f is not None for f in forms) and not _columns(op, g, a, forms, hit[1]):
        return None   # the GEMM reads it in place
    sizes = {**op.type.dims, **op.rdims}
    order = [d for d in op.type.dims if d in used] + [r for r in op.rdims if r in used]
    name = fresh_name(f"{a.arg[0]}#rows", taken)
    rows = Comprehension(name, TensorType(a.dtype, {v: sizes[v] for v in order}), a)
    plain = ex.read(name, {v: ex.var(v) for v in order}, a.dtype)
    body = ex.replace_node(op.body, a, plain)
    return rows, replace(op, body=body)


def _columns(op: Comprehension, g: Graph, a, forms, w) -> bool:
    """Whether ``a`` (read at affine ``forms``) lies column-major: its unit-stride dim walked by
    rows (output vars) and every K step a line or more away (an NCHW image read by a 1x1
    convolution's K), the rows not the weights' (a grouped convolution's groups), and no swap
    (contraction._swapped) reads it as B in place instead."""
    steps = _steps(a, forms, g)
    if steps is None:
        return False
    ks = [v for v, n in op.rdims.items() if steps.get(v, 0) and not is_one(n)]
    rows = [v for v, n in op.type.dims.items() if steps.get(v, 0) and not is_one(n)]
    if not ks or not any(steps[v] == 1 for v in rows):
        return False
    if any(abs(steps[v]) < COLUMN_MIN_STEP for v in ks):
        return False
    if set(rows) & set().union(*map(ex.free_vars, w.args)):
        return False
    cols = ex.product([s for d, s in op.type.dims.items() if d not in steps])
    if not cols.is_const or cols.value < COLUMN_MIN_N:
        return False   # too few columns to repay the copy (a ShuffleNet's 116-channel blocks)
    inner = [d for d, s in op.type.dims.items() if not is_one(s)]
    if inner and inner[-1] in rows:
        pixels = math.prod(op.type.dims[v].value for v in rows if op.type.dims[v].is_const)
        if pixels >= SWAP_MIN_N:   # (a symbolic batch counts as one)
            return False
    return True


def _steps(a, forms, g: Graph) -> dict[str, int] | None:
    """Elements ``a`` moves in memory per step of each loop var, or None if not constant."""
    sizes = g.types[a.arg[0]].dims
    form = dict(zip(a.arg[1], forms))
    steps, stride = {}, ex.const(1)
    for d in reversed(list(sizes)):
        for v, c in form[d][0].items():
            if not stride.is_const:
                steps[v] = None
                continue
            steps[v] = steps.get(v, 0) + c * stride.value
        stride = ex.simplify_size(stride * sizes[d])
    if any(s is None for s in steps.values()):
        return None
    return steps


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
