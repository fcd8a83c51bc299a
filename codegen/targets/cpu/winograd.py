"""Winograd convolutions: a 3-tap window along one dim computed with F(4, 3), half the products.

A convolution in the IR is a sum of products ``out[.., h, ..] = sum{kh, ..} A[.., h + kh + c0,
..] * W[.., kh, ..]`` with W a constant. Along that one window dim, four outputs of a tile
``h = 4t + o`` need 4 x 3 products per step of the other reduction dims; Winograd's minimal
filtering algorithm F(4, 3) needs 6, at six points ``p``:

    Z[p, t, ..] = sum{l < 6} BT[p, l] * A[.., 4t + l + c0, ..]                  (input transform)
    Wt[p, ..]   = sum{kh < 3} G[p, kh] * W[.., kh, ..]                      (at build time)
    M[p, t, ..] = sum{the other reduction dims} Z[p, t, ..] * Wt[p, ..]      (a batched gemm)
    out[.., 4t + o, ..] = sum{p < 6} AT[o, p] * M[p, t, ..]                    (output transform)

``rewrite`` replaces such a contraction by these comprehensions where it pays (``_pays``). The
gemm is an ordinary contraction (contraction.py runs it, with ``p`` as its batch dim), so a 3x3
convolution keeps its other window dim in the gemm: the algorithm is applied along one dim
only, which halves the products (two dims would quarter them, but the transforms would then
have to gather along the unit-stride dim, where these maps are plain vector loops).

The transforms are maps whose bodies choose their coefficients with a select tree on ``p``
(input) or ``h % 4`` (output). Both are outer dims of their kernels, so hoist.py branches once
per row and each row is a short sum of unit-stride vector reads with constant coefficients.
The input transform also takes the convolution's zero padding (the gemm then reads it
unguarded, with no pad copy), and the output transform takes the convolution's epilogue: it
replaces the map that read the convolution at the identity (a bias and relu, batchnorm, a
concatenation's arm), so its result is stored once, where that map stored it.

Numerics: the f32 error is about three times the direct sum's (a few units in the last place of
the largest term; tests/codegen/targets/cpu/test_winograd.py checks against ONNX Runtime at the
fp32 tolerance, and a build whose artifact then misses its test vectors builds it again with
direct convolutions: packager/build.py). A NaN or infinity in the input reaches every output
of its 4-row tile, not only the rows whose window holds it, as in every Winograd convolution.
``MLPACK_DISABLE_PASSES=winograd`` keeps every convolution direct.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from mlpack.spec.ir import dtypes
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType, tensors_read
from mlpack.codegen.targets.cpu import derived
from mlpack.codegen.targets.cpu.indexing import affine as _affine
from mlpack.codegen.targets.cpu.indexing import index_range
from mlpack.codegen.targets.cpu.kernels import fresh_name as _fresh
from mlpack.codegen.targets.cpu.kernels import identity_map as _identity_map
from mlpack.codegen.targets.cpu.kernels import replace_reads
from mlpack.codegen.targets.cpu.plan import tensor_buffers

TILE = 4          # outputs per tile
TAPS = 3          # window size
POINTS = TILE + TAPS - 1
# F(4, 3) at the points 0, 1, -1, 2, -1/2 and infinity: the Toom-Cook matrices with each
# point's row of BT scaled to small integers (exact in f32; G takes the inverse scale, and Wt is
# computed in float64). These points give about 3/4 of the error of Lavin's 0, 1, -1, 2, -2.
BT = np.array([[2, 3, -4, -3, 2, 0],
               [0, 2, 5, 1, -2, 0],
               [0, 2, 1, -5, 2, 0],
               [0, -1, -2, 1, 2, 0],
               [0, -2, 1, 2, -1, 0],
               [0, 2, 3, -4, -3, 2]], dtype=np.float64)
G = np.array([[1 / 2, 0, 0],
              [1 / 6, 1 / 6, 1 / 6],
              [1 / 6, -1 / 6, 1 / 6],
              [1 / 30, 1 / 15, 2 / 15],
              [16 / 15, -8 / 15, 4 / 15],
              [0, 0, 1 / 2]], dtype=np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0],
               [0, 1, -1, 2, -1 / 2, 0],
               [0, 1, 1, 4, 1 / 4, 0],
               [0, 1, -1, 8, -1 / 8, 1]], dtype=np.float64)

# Where it pays, measured on single layers against the direct gemm at 1 and 2 threads
# (python -m benchmarks.kernels; docs/decisions.md): the saved products must outweigh the two
# transform passes and the doubled weights.
MIN_GAIN = 1.6    # direct products over Winograd's, counting the padded last tile
MIN_ROWS = 32     # gemm rows per point: fewer, and streaming the doubled weights costs more
MIN_K = 64        # products per output and point (the other reduction dims): 16 channels in
                  # on 55x55 gained nothing at 2 threads
MIN_N = 16        # gemm columns (output channels)
MIN_WIDTH = 24    # unit-stride extent of the output (the transform maps' vector loop): a
                  # 13x13 image lost at 48 and 64 channels in ...
WIDE_K = 288      # ... unless the gemm is this deep (256 channels in on 12x12 gained 1.6x;
                  # GoogLeNet's 96 and 112 on 14x14, 0.88 -> 0.53 and 1.02 -> 0.61 ms)


def rewrite(g: Graph, keep=(), parents=None, made=None) -> tuple[Graph, int]:
    """``g`` with every convolution where Winograd pays rewritten (module docstring), and how
    many were. ``keep``: tensors that must still be written under their own name (aliases of a
    concatenation's slice); ``parents``: the buffers of split concatenations (concat.py),
    which no op of ``g`` produces; ``made``: where the transformed weights' recipes go
    (derived.py). ``g`` itself is not changed: the targets of a build share it."""
    outputs = {p.name for p in g.outputs}
    bufs = {**tensor_buffers(g), **(parents or {})}   # the layouts the plan will give them
    ops, types, constants = list(g.ops), dict(g.types), dict(g.constants)
    count, dropped = 0, set()
    for op in g.ops:
        if not isinstance(op, Comprehension):
            continue
        hit = _match(op, g, bufs)
        if hit is None:
            continue
        new = _transforms(op, hit, g, types, constants, made)
        readers = [o for o in ops if op.out in tensors_read(o)]
        at = ops.index(op)
        fused = None
        if op.out not in outputs and op.out not in keep and len(readers) == 1:
            fused = _fuse_output(op, readers[0], new["out"])
        if fused is not None:
            ops[ops.index(readers[0])] = fused
            types.pop(op.out, None)
            ops[at:at + 1] = new["ops"]
        else:
            ops[at:at + 1] = new["ops"] + [Comprehension(op.out, op.type, new["out"])]
        for o in new["ops"]:
            types[o.out] = o.type
        dropped.add(hit["w"].arg[0])
        count += 1
    if not count:
        return g, 0
    read = set().union(*(tensors_read(o) for o in ops))
    for name in dropped - read - outputs:   # the original weights, now folded into Wt
        del constants[name]
        del types[name]
    return replace(g, ops=ops, types=types, constants=constants), count


# ---------------------------------------------------------------- matching


def _unwidened(e: Expr, g: Graph) -> Expr:
    """The 16-bit weights' read under its widening cast (codegen/precisions/weights16.py), else
    ``e``: Winograd folds them like f32 ones, and keeps Wt in their dtype."""
    if (e.op == "cast" and e.dtype == "f32" and e.args[0].op == "read"
            and e.args[0].dtype in ("bf16", "f16") and e.args[0].arg[0] in g.constants):
        return e.args[0]
    return e


def _match(op: Comprehension, g: Graph, bufs) -> dict | None:
    """The window of ``op`` Winograd can take: (A read, W read, out var h, window var kh, A's
    dim, the index's constant, W's dim), or None."""
    if op.reduce != "sum" or op.type.dtype != "f32" or op.body.op != "mul":
        return None
    reads = [_unwidened(r, g) for r in op.body.args]
    if any(r.op != "read" or (r.dtype != "f32" and r.arg[0] not in g.constants) for r in reads):
        return None
    ws = [r for r in reads if r.arg[0] in g.constants]
    if len(ws) != 1 or ws[0].arg[2] is not None:
        return None
    w = ws[0]
    a = reads[1] if reads[0] is w else reads[0]
    if a.arg[0] in g.constants or a.arg[2] not in (None, 0.0):
        return None
    sizes = {**op.type.dims, **op.rdims}
    w_index = dict(zip(w.arg[1], w.args))
    if any(ix.op != "var" for ix in w_index.values()):
        return None
    a_index = dict(zip(a.arg[1], a.args))
    # a dynamic dim (the batch) only as a loop that the gemm and both transforms keep as it is
    if not all(s.is_const for s in op.rdims.values()) or any(
            not s.is_const and (d in {ix.arg for ix in w_index.values()}
                                or _passed_through(d, a_index) is None)
            for d, s in op.type.dims.items()):
        return None
    out_row = bufs[op.out].contiguous_dim()
    a_row = bufs[a.arg[0]].contiguous_dim()
    w_vars = {ix.arg for ix in w_index.values()}
    for kh, size in op.rdims.items():
        if size.value != TAPS or kh not in w_vars:
            continue
        uses = [d for d, ix in a_index.items() if kh in ex.free_vars(ix)]
        if len(uses) != 1 or uses[0] == a_row:
            continue
        d_h = uses[0]
        aff = _affine(a_index[d_h], set(sizes))   # h + kh + c0
        if aff is None or len(aff[0]) != 2 or aff[0].get(kh) != 1 or not aff[1].is_const:
            continue
        h = next(v for v in aff[0] if v != kh)
        if aff[0][h] != 1 or h not in op.type.dims or h == out_row or h in w_vars:
            continue
        if any(h in ex.free_vars(e) for d, e in a_index.items() if d != d_h):
            continue
        if any(_extent(e, sizes) is None for d, e in a_index.items() if d != d_h):
            return None
        hit = {"a": a, "w": w, "h": h, "kh": kh, "d_h": d_h, "c0": aff[1].value,
               "d_kh": next(d for d, e in w_index.items() if e.arg == kh),
               "a_layout": bufs[a.arg[0]].layout}
        if _pays(op, hit, w_vars, op.type.dims[out_row].value):
            return hit
    return None


def _pays(op: Comprehension, hit: dict, w_vars: set[str], width: int) -> bool:
    """Whether the saved products outweigh the transforms and the doubled weights: enough
    gemm rows, columns and depth per point, little of the last tile padded, and rows wide
    enough for the transforms' vector loops unless the gemm is deep."""
    dims = op.type.dims
    height = dims[hit["h"]].value
    tiles = -(-height // TILE)
    gain = TAPS * height / (POINTS * tiles)
    # per batch item: a dynamic dim counts as 1
    rows = tiles * math.prod(s.value for d, s in dims.items()
                             if d != hit["h"] and d not in w_vars and s.is_const)
    cols = math.prod(s.value for d, s in dims.items() if d in w_vars)
    depth = math.prod(s.value for r, s in op.rdims.items() if r != hit["kh"])
    return (gain >= MIN_GAIN and rows >= MIN_ROWS and cols >= MIN_N and depth >= MIN_K
            and (width >= MIN_WIDTH or depth >= WIDE_K))


# ---------------------------------------------------------------- the rewrite


def _tree(v: Expr, leaves: list[Expr], lo: int = 0) -> Expr:
    """``leaves[v - lo]`` as a balanced tree of selects on ``v`` (hoist.py branches on each)."""
    if len(leaves) == 1:
        return leaves[0]
    mid = len(leaves) // 2
    return ex.select(ex.binary("lt", v, ex.const(lo + mid)), _tree(v, leaves[:mid], lo),
                     _tree(v, leaves[mid:], lo + mid))


def _combination(coeffs, term) -> Expr:
    """sum of c * term(i) over the nonzero coefficients, with 1 and -1 as adds and subtracts."""
    acc = None
    for i, c in enumerate(coeffs):
        if c == 0:
            continue
        t = term(i)
        mag = abs(float(c))
        if mag != 1.0:
            t = ex.mul(ex.const(mag, "f32"), t)
        if acc is None:
            acc = t if c > 0 else ex.unary("neg", t)
        else:
            acc = ex.add(acc, t) if c > 0 else ex.sub(acc, t)
    return acc


def _span(ix: Expr, sizes: dict[str, Expr]) -> tuple[int, int] | None:
    """The least and greatest value of an index affine in the loop vars, or None."""
    aff = _affine(ix, set(sizes))
    if aff is None:
        return None
    lo, hi = index_range(*aff, sizes.__getitem__)
    return (lo.value, hi.value) if lo.is_const and hi.is_const else None


def _passed_through(d: str, a_index: dict[str, Expr]) -> str | None:
    """The dim of A that the output's dim ``d`` reads as it is (``A[.., d, ..]``), or None."""
    dims = [ad for ad, ix in a_index.items() if ix.op == "var" and ix.arg == d]
    return dims[0] if len(dims) == 1 else None


def _extent(ix: Expr, sizes: dict[str, Expr]) -> tuple[int, Expr] | None:
    """The least value of an index and how many values it takes (an Expr): a constant span,
    or a dynamic dim's whole range where the index is that dim's var; else None."""
    span = _span(ix, sizes)
    if span is not None:
        return span[0], ex.const(span[1] - span[0] + 1)
    if ix.op == "var" and ix.arg in sizes and not sizes[ix.arg].is_const:
        return 0, sizes[ix.arg]
    return None


def _transforms(op: Comprehension, hit: dict, g: Graph, types, constants, made=None) -> dict:
    """The input transform and gemm comprehensions replacing ``op`` (their types and Wt added
    to ``types``/``constants``, Wt's recipe to ``made``: derived.py), and the output transform
    over ``op``'s own dim vars."""
    a, w, h, kh, d_h = hit["a"], hit["w"], hit["h"], hit["kh"], hit["d_h"]
    taken = set(types) | set(constants)
    z_name = _fresh(f"{op.out}#wz", taken)
    m_name = _fresh(f"{op.out}#wm", taken | {z_name})
    wt_name = _fresh(f"{w.arg[0]}#wt", taken | {z_name, m_name})
    used = set(op.type.dims) | set(op.rdims) | set(g.types[a.arg[0]].dims) \
        | set(g.types[w.arg[0]].dims)
    p = _fresh("p", used)
    t = _fresh("t", used | {p})
    tiles = -(-op.type.dims[h].value // TILE)
    sizes = {**op.type.dims, **op.rdims}
    a_index = dict(zip(a.arg[1], a.args))

    # Z: A's dims, the window dim as (p, t); every other dim over the range the gemm reads,
    # so the gemm needs no guard (the convolution's padding is read here, as zeros)
    z_dims, shift = {p: ex.const(POINTS)}, {}
    for d in hit["a_layout"]:
        if d == d_h:
            z_dims[t] = ex.const(tiles)
            continue
        shift[d], z_dims[d] = _extent(a_index[d], sizes)
    src = {d: (ex.var(d) + shift[d] if shift[d] else ex.var(d)) for d in shift}

    def a_at(row: int) -> Expr:
        index = dict(src)
        index[d_h] = ex.const(TILE) * ex.var(t) + (row + hit["c0"])
        return ex.read(a.arg[0], index, "f32", 0.0)

    z_body = _tree(ex.var(p), [_combination(BT[i], a_at) for i in range(POINTS)])
    z = Comprehension(z_name, TensorType("f32", z_dims), z_body)

    # Wt: the window folded into six points (float64, then rounded once), at build time and,
    # from the weights as the model has them, when the engine opens the artifact (derived.py)
    wc = g.constants[w.arg[0]]
    axis = list(wc.layout).index(hit["d_kh"])
    data = np.tensordot(G, np.moveaxis(wc.data.astype(np.float64), axis, 0), axes=(1, 0))
    wt_layout = (p,) + tuple(d for d in wc.layout if d != hit["d_kh"])
    wt_dims = {p: ex.const(POINTS), **{d: wc.type.dims[d] for d in wt_layout[1:]}}
    wdt = wc.type.dtype   # 16-bit weights stay 16-bit (rounded once more, from float64)

    def tap(i: int) -> Expr:
        index = {d: ex.const(i) if d == hit["d_kh"] else ex.var(d) for d in wc.layout}
        return ex.cast(ex.read(w.arg[0], index, wdt), "f64")

    def point(row) -> Expr:   # G[row] . W, in float64 and in G's order, as np.tensordot sums
        terms = [ex.mul(ex.const(float(c), "f64"), tap(i)) for i, c in enumerate(row) if c]
        acc = terms[0]
        for term in terms[1:]:
            acc = ex.add(acc, term)
        return acc

    fold = Comprehension(wt_name, TensorType(wdt, wt_dims),
                         ex.cast(_tree(ex.var(p), [point(G[i]) for i in range(POINTS)]), wdt))
    derived.add(made, constants, types, fold, wt_layout, data.astype(dtypes.to_numpy(wdt)))

    # the gemm: op with h -> t, kh gone, and the point p as a batch dim
    w_index = {d: e for d, e in zip(w.arg[1], w.args) if d != hit["d_kh"]}
    z_read = {p: ex.var(p), t: ex.var(t)}
    for d in shift:
        z_read[d] = ex.simplify_size(a_index[d] - shift[d]) if shift[d] else a_index[d]
    m_body = ex.mul(ex.read(z_name, z_read, "f32"),
                    ex.cast(ex.read(wt_name, {p: ex.var(p), **w_index}, wdt), "f32"))
    m_dims = {p: ex.const(POINTS)}
    for d, s in op.type.dims.items():
        m_dims[t if d == h else d] = ex.const(tiles) if d == h else s
    rdims = {r: s for r, s in op.rdims.items() if r != kh}
    m = Comprehension(m_name, TensorType("f32", m_dims), m_body, "sum", rdims)

    # the output transform, over op's dims: row h = 4t + o takes AT[o] of the six points
    def m_at(point: int) -> Expr:
        index = {d: ex.var(d) for d in op.type.dims if d != h}
        index[p] = ex.const(point)
        index[t] = ex.floordiv(ex.var(h), ex.const(TILE))
        return ex.read(m_name, index, "f32")

    out = _tree(ex.mod(ex.var(h), ex.const(TILE)),
                [_combination(AT[o], m_at) for o in range(TILE)])
    return {"ops": [z, m], "out": out}


def _fuse_output(op: Comprehension, reader, value: Expr):
    """``reader`` with its reads of ``op`` replaced by the output transform ``value``, when it
    is a map reading ``op`` only at the identity (an epilogue), else None."""
    if not isinstance(reader, Comprehension) or reader.reduce is not None:
        return None
    reads = [n for n in ex.walk(reader.body) if n.op == "read" and n.arg[0] == op.out]
    index = _identity_map(op, reader, reads) if reads else None
    if index is None:
        return None
    at = {d: index[d] for d in op.type.dims}
    return replace(reader, body=replace_reads(reader.body, op.out, ex.substitute(value, at)))


__all__ = ["rewrite", "BT", "G", "AT"]
