"""Split-K: a contraction with too few output tiles to fill a GPU sums its K in parts.

A batch-1 model's late convolutions (7 x 7 outputs, 2048 channels, K of 4608) and a transformer
block's projections at short sequences have a few dozen 64 x 64 output tiles, so a tiled
contraction (tiled.py) would keep a few dozen of a GPU's hundred-odd multiprocessors busy, each
walking the whole of K. This rewrite of the graph (the cuda target's, before its kernels are
built) gives such a contraction an extra output dim ``s`` over ``S`` parts of its longest
reduction dim ``r`` (``r = s * C + r'``, ``C = extent / S``, S dividing the extent so no part
reads past it):

    part[s, d...] = sum{r' < C, other r} body(r = s * C + r')
    out[d...]     = sum{s < S} part[s, d...]

The parts are one tiled contraction with ``s`` as a batch dim (S times the blocks), and the
second sum is a short reduction into which the original epilogue (bias, activation, residual)
still fuses. Sums of f32 reassociate within the fp32 tolerance, as the CPU's chunked K does.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.targets.cuda import tiled

TILE = 64                 # the tiled contraction's output tile (tiled.py, mma.py)
FILL = 128                # output tiles that keep a large GPU busy (an H100 has 132 SMs)
MIN_PART = 128            # terms a part sums at least
MAX_PARTS = 16
PASS = "split_k"          # its name in MLPACK_DISABLE_PASSES


def _parts(extent: int, want: int) -> int:
    """The largest divisor of ``extent`` of at most ``want`` that leaves MIN_PART // 4 terms a
    part (the other reduction dims add to them), or 1."""
    for s in range(min(want, MAX_PARTS), 1, -1):
        if extent % s == 0 and extent // s >= MIN_PART // 4:
            return s
    return 1


def _split(g: Graph, op, taken: set[str]) -> list | None:
    if not isinstance(op, Comprehension) or op.reduce != "sum" or op.body.op != "mul" \
            or op.type.dtype != "f32" or not op.rdims:
        return None
    sizes = [*op.type.dims.values(), *op.rdims.values()]
    if not all(s.is_const for s in sizes):
        return None
    fa, fb = op.body.args
    va, vb = ex.free_vars(fa), ex.free_vars(fb)
    dims = {d: s.value for d, s in op.type.dims.items() if s.value != 1}
    if any(d not in va and d not in vb for d in dims):
        return None
    m = [d for d in dims if d in va and d not in vb]
    n = [d for d in dims if d in vb and d not in va]
    if not m or not n:
        return None

    def count(ds):
        out = 1
        for d in ds:
            out *= dims[d]
        return out
    tiles = -(-count(m) // TILE) * -(-count(n) // TILE) * count(d for d in dims if d not in m + n)
    terms = 1
    for s in op.rdims.values():
        terms *= s.value
    if tiles >= FILL or terms < 2 * MIN_PART or count(m) < tiled.MIN_M or count(n) < tiled.MIN_N:
        return None   # (a thin one is a grouped reduction per output: rowreduce.py)
    r = max(op.rdims, key=lambda d: op.rdims[d].value)
    parts = _parts(op.rdims[r].value, min(-(-FILL // tiles), terms // MIN_PART))
    if parts < 2:
        return None
    chunk = op.rdims[r].value // parts
    s = _fresh("ksplit", taken | set(op.type.dims) | set(op.rdims))
    part = _fresh(f"{op.out}.part", taken)
    taken |= {s, part}
    body = ex.substitute(op.body, {r: ex.var(s) * chunk + ex.var(r)})
    ptype = TensorType(op.type.dtype, {**op.type.dims, s: ex.const(parts)})
    partial = Comprehension(part, ptype, body, "sum", {**op.rdims, r: ex.const(chunk)})
    index = {d: ex.var(d) for d in op.type.dims}
    combine = Comprehension(op.out, op.type, ex.read(part, {**index, s: ex.var(s)}, op.type.dtype),
                            "sum", {s: ex.const(parts)})
    return [partial, combine]


def _fresh(name: str, taken) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}{k}", k + 1
    return out


def split_k(g: Graph) -> Graph:
    """``g`` with each contraction that has fewer than FILL output tiles summed in parts."""
    taken = set(g.types)
    ops, types, changed = [], dict(g.types), False
    for op in g.ops:
        parts = _split(g, op, taken)
        if parts is None:
            ops.append(op)
            continue
        changed = True
        ops.extend(parts)
        types[parts[0].out] = parts[0].type
    return replace(g, ops=ops, types=types) if changed else g
