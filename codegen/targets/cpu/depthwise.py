"""Depthwise (and other narrow) convolutions as direct kernels vectorized along output rows.

A contraction that the GEMM path leaves (contraction.py: fewer than MIN_N output columns
share a B operand, as in a depthwise convolution, ``y[n,c,h,w] = sum{kh,kw} x[n,c,h*s+kh-p,
w*s+kw-p] * W[c,0,kh,kw]``, one output channel per group) runs here when:

* its body is the product of two f32 reads (each maybe wrapped in a ``select`` whose condition
  only restates the read's own bounds guard, as grouped convolutions are lowered);
* one read (X) moves with the output's unit-stride dim ``w`` (the *row*) only in X's own
  unit-stride dim, affinely with a constant step ``s``; the other (W) does not move with it;
* the reduction is small and of constant size (the window's columns are unrolled, its rows
  a loop around them).

Each workgroup unit is one output row (every other output dim fixed). The row is cut into
tiles of up to ``MAX_VECTORS`` vectors of accumulators; per tile and per unrolled reduction
point, W is one scalar broadcast and X is ``s`` masked vector loads (shuffled down to every
s-th lane when s > 1) starting at the row's input offset: the masks drop the lanes whose input
index leaves X's row (the padding of the convolution, and the lanes past the end of the output
row), so no padded copy of X is needed. A reduction point whose other X indices (the input
row, the channel) are out of bounds is skipped as a whole. The tile then goes through a stack
buffer to the kernel's epilogue, in a loop the vectorizer may take (unit-stride stores).

Laid out channels last (layout.py), a depthwise convolution's row is the channel dim, which
both X and W move with: W is then one vector load per reduction point and accumulator vector
(``w_vector``) instead of a broadcast, X needs no shuffles (step 1) and its masks drop only the
lanes past the last channel, and the rows a unit holds are output columns sharing W's vectors.
Neighbouring columns read the same input columns at neighbouring points of the window, so the
rows are consecutive (the last unit starts early rather than clamping its rows) and LLVM loads
each input vector once for all of them; the tile's shape counts those loads' registers. Inside
X, each load's offset is the window row's one anchor plus a constant (``_var_step``), which is
what lets LLVM see two points' loads of one column as one; a unit on X's edge takes its
bounds from the same anchor, one test per distinct column (MnasNet-style 3x3 over 72 channels
at 56x56: 0.10 -> 0.083 -> 0.079 ms, ONNX Runtime 0.073-0.075). A unit
whose window stays inside X skips the bounds checks (only the last vector's lanes are masked
where the channels are not whole vectors).

Indices other than ``w`` may be anything the expression emitter evaluates (a channel shuffle
absorbed into the read, for instance): they are evaluated once per row and reduction point.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.llvm.intrinsics import intrinsic, line_alloca, load_masked_f32, splat, umin
from mlpack.codegen.llvm.types import F32, I1, I32, I64, i64
from mlpack.codegen.targets.cpu.indexing import coeff
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, share
from mlpack.codegen.targets.cpu.kernels import row_dim, shared_units
from mlpack.codegen.targets.cpu.target import CpuTarget

MAX_POINTS = 64       # reduction points unrolled per tile (3x3, 5x5, 7x7 windows fit)
MAX_VECTORS = 4       # accumulator vectors per tile
MIN_ROW = 4           # shorter output rows waste most of a vector
# x_vectors' and w_vector's ``checked`` for a unit inside X: no bounds checks on X's other dims,
# only the lanes past the row's end masked off
LANES = "lanes"
RESERVED = 4          # vector registers a channels-last unit leaves to its masks and spare
MAX_ACCS = 12         # accumulator vectors per unit (rows x vectors), with room for loads
# Lanes per vector from which the epilogue's loop over a tile's lanes is vectorized with masks
# (AVX-512's mask registers): the last vector of channels that are not whole vectors (72 =
# 4.5) was a scalar loop over its lanes, which took 72 channels longer than 80
# (a 3x3 depthwise on 56x56: 0.123-0.144 -> 0.095 ms; 80 channels 0.080-0.104). Narrower
# vectors keep the scalar remainder: AVX2's masked stores are slow on some cores, NEON has none.
MASKED_LANES = 16


@dataclass
class Direct:
    """How a kernel runs as a direct, row-vectorized contraction (Kernel.gemm, strategy gemm)."""
    x: Expr               # the read moving with the row (guard kept: it masks lanes)
    w: Expr               # the read fixed along the row (a scalar per reduction point)
    row: str              # the output's unit-stride dim
    outer: list[str]      # the other output dims (not of size 1), a unit each
    xdim: str             # X's dim that moves with the row
    step: int             # its index's coefficient in the row var
    points: list[dict]    # every reduction point: rdim -> value
    vl: int
    nvec: int
    fma: bool
    rows: int = 1         # output rows per unit (of the last outer dim, ``outer[-1]``)
    # (reduction dim, size) walked by a loop around the unrolled ``points`` (the other dims),
    # or None: every point unrolled
    loop: tuple[str, int] | None = None
    # W moves with the row too (channels last): a vector load per point, not a broadcast
    w_vector: bool = False


# ---------------------------------------------------------------- classification


def _bounds(e: Expr, ranges: dict[str, Expr]) -> tuple[int, int] | None:
    """(lo, hi) of an index affine in vars of constant ranges, else None."""
    if any(n.op in ("read", "sym") for n in ex.walk(e)):
        return None
    lo = hi = 0
    for v in ex.free_vars(e):
        c = coeff(e, v)
        r = ranges.get(v)
        if not isinstance(c, int) or r is None or not r.is_const:
            return None
        span = c * (r.value - 1)
        lo, hi = lo + min(0, span), hi + max(0, span)
    c0 = ex.simplify_size(ex.substitute(e, {v: ex.const(0) for v in ex.free_vars(e)}))
    if not c0.is_const:
        return None
    return lo + c0.value, hi + c0.value


def _implied(cond: Expr, read: Expr, sizes: dict[str, Expr], ranges: dict[str, Expr]) -> bool:
    """Whether ``cond`` holds wherever the guarded ``read`` is in bounds: each conjunct bounds
    one of the read's indices by its size, or holds over the vars' ranges."""
    if cond.op == "and":
        return all(_implied(a, read, sizes, ranges) for a in cond.args)
    if cond.op not in ("ge", "lt") or read.arg[2] is None:
        return False
    e, bound = cond.args
    index = dict(zip(read.arg[1], read.args))
    for d, ix in index.items():
        if ix == e and ((cond.op == "ge" and bound.is_const and bound.value == 0)
                        or (cond.op == "lt" and ex.same_size(bound, sizes[d]))):
            return True
    b = _bounds(e, ranges)
    if b is None or not bound.is_const:
        return False
    return b[0] >= bound.value if cond.op == "ge" else b[1] < bound.value


def _factor(e: Expr, bufs, ranges) -> Expr | None:
    """The read a body factor amounts to, or None."""
    if e.op == "select":
        cond, a, z = e.args
        if not (z.is_const and z.value == 0 and a.op == "read" and a.arg[2] == 0.0):
            return None
        if not _implied(cond, a, bufs[a.arg[0]].sizes, ranges):
            return None
        e = a
    if e.op != "read" or e.dtype != "f32":
        return None
    return e


def classify(k: Kernel, bufs: dict[str, Buffer], t: CpuTarget) -> Direct | None:
    if k.reduce != "sum" or k.acc_dtype != "f32" or k.strategy == "gemm" or k.points \
            or k.body.op != "mul":
        return None
    out = bufs[k.out]
    outer, row = row_dim(out)
    if row is None:
        return None
    size = out.sizes[row]
    if size.is_const and size.value < MIN_ROW:
        return None
    if not all(s.is_const for s in k.rdims.values()):
        return None
    npoints = 1
    for s in k.rdims.values():
        npoints *= s.value
    if not 1 <= npoints <= MAX_POINTS:
        return None
    ranges = {**out.sizes, **k.rdims}
    reads = [_factor(a, bufs, ranges) for a in k.body.args]
    if any(r is None or r.arg[0] == k.out for r in reads):
        return None
    moving = [r for r in reads if any(row in ex.free_vars(ix) for ix in r.args)]
    if len(moving) == 2:   # channels last: W is a vector of the row's channels per point
        w = _channel_vector(moving, row, bufs, k.rdims)
        if w is None:
            return None
        x = reads[1] if reads[0] is w else reads[0]
    elif len(moving) == 1:
        x = moving[0]
        w = reads[1] if reads[0] is x else reads[0]
    else:
        return None
    xbuf = bufs[x.arg[0]]
    inner = xbuf.contiguous_dim()
    step = None
    for d, ix in zip(x.arg[1], x.args):
        if row not in ex.free_vars(ix):
            continue
        c = coeff(ix, row)
        if d != inner or not isinstance(c, int) or c < 1 or c > 4:
            return None
        step = c
    # the lanes' index must be affine in the reduction vars too (the loads' offsets are
    # evaluated per point, so any form does, but a read of another tensor is no index)
    if any(n.op == "read" for ix in (*x.args, *w.args) for n in ex.walk(ix)):
        return None
    # The window's rows (a reduction dim that moves X's row, not its lanes) are a loop around
    # the unrolled window columns: the same loads and FMAs as unrolling both, at a fifth of the
    # code for a 5x5 window, which LLVM compiles that much faster (unrolled, mobilenet_v3's
    # depthwise kernels were nine tenths of its IR).
    fixed = [r for r, s in k.rdims.items()
             if s.value > 1 and r not in ex.free_vars(dict(zip(x.arg[1], x.args))[inner])]
    loop = (fixed[0], k.rdims[fixed[0]].value) if fixed else None
    points = [{}]
    for r, s in k.rdims.items():
        if loop is None or r != loop[0]:
            points = [{**p, r: i} for p in points for i in range(s.value)]
    lanes = max(4, t.vector_bits // 32)
    vl = lanes
    if size.is_const:
        while vl > 4 and vl // 2 >= size.value:
            vl //= 2
    per = -(-size.value // vl) if size.is_const else MAX_VECTORS
    # the row's vectors split evenly into tiles: 5 vectors as 3 + 3, not 4 + 4 (a last tile
    # of one vector would still compute four)
    nvec = -(-per // -(-per // MAX_VECTORS))
    w_vector = len(moving) == 2
    # channels last: at most half the registers hold accumulators (the unrolled window's W
    # vectors and the X loads LLVM shares between rows take the rest: 12 on AVX2 spilled),
    # and the channels split into tiles of whole vectors where they can (no lane masks)
    budget = MAX_ACCS
    most_rows = {n: max(1, budget // n) for n in range(1, MAX_VECTORS + 1)}
    if w_vector and size.is_const:
        budget = min(MAX_ACCS, t.vector_registers // 2)
        # the rows of a unit are output columns side by side, so at one point of the window
        # row r reads the input column that row r + 1 read ``stride`` points before: LLVM
        # keeps those loads for the points after, about stride * rows vectors beside the
        # accumulators and W's (per vector of the tile: (1 + stride) * rows + 2 registers)
        stride = _column_stride(x, outer[-1] if outer else None)
        free = t.vector_registers - RESERVED
        most_rows = {n: max(1, min(budget // n, (free // n - 2) // (1 + stride)))
                     for n in range(1, MAX_VECTORS + 1)}
        nvec = max(range(1, MAX_VECTORS + 1),
                   key=lambda n: (-(-per // n) * n == per, most_rows[n] * n, n))
    # short rows: several rows of the last outer dim per unit share the broadcasts of W and
    # the lane masks, and the loop overhead (a 7x7 plane is one unit)
    rows = 1
    if outer and not any(outer[-1] in ex.free_vars(ix) for ix in w.args):
        hs = out.sizes[outer[-1]]
        most = most_rows[nvec]
        if hs.is_const:
            rows = -(-hs.value // -(-hs.value // most))
    return Direct(x, w, row, outer, inner, step, points, vl, nvec, t.fma, rows, loop,
                  w_vector=w_vector)


def _column_stride(x: Expr, col: str | None) -> int:
    """How far X's index moves per output column ``col`` (a convolution's stride; 1 when
    no index of X moves with it as a constant step)."""
    steps = [coeff(ix, col) for ix in x.args if col is not None and col in ex.free_vars(ix)]
    return steps[0] if len(steps) == 1 and isinstance(steps[0], int) and steps[0] > 0 else 1


def _channel_vector(reads: list[Expr], row: str, bufs, rdims) -> Expr | None:
    """Of two reads that both move with the output's row (a depthwise convolution laid out
    channels last), the weights': the one indexed by nothing but the row and the reduction
    vars, the row alone indexing its unit-stride dim; None unless exactly one is."""
    found = []
    for r in reads:
        index = dict(zip(r.arg[1], r.args))
        inner = bufs[r.arg[0]].contiguous_dim()
        if inner is None or index[inner].op != "var" or index[inner].arg != row:
            continue
        if any(row in ex.free_vars(ix) for d, ix in index.items() if d != inner):
            continue
        if all(ex.free_vars(ix) <= {row, *rdims} for ix in index.values()):
            found.append(r)
    return found[0] if len(found) == 1 else None


def apply(k: Kernel, bufs: dict[str, Buffer], t: CpuTarget) -> bool:
    """Turn ``k`` into a direct kernel when it is one (see the top); whether it was."""
    d = classify(k, bufs, t)
    if d is None:
        return False
    k.gemm = d
    k.strategy = "gemm"
    k.row_chunks = 1
    return True


def workgroups(k: Kernel, out: Buffer) -> Expr:
    """As plan.workgroups for a row kernel: one unit per output row, or per block of ``rows``
    of the last outer dim; groupwise.py's kernels share units the same way."""
    d = k.gemm
    rows = ex.product([out.sizes[o] if o != d.outer[-1] or d.rows == 1
                       else ex.ceildiv(out.sizes[o], ex.const(d.rows)) for o in d.outer])
    work = ex.product([*out.sizes.values(), *k.rdims.values()])
    return shared_units(rows, work)


# ---------------------------------------------------------------- lowering


def unit_range(L, outer: list[str], rows: int, wg, count):
    """(sizes, start, end): each outer dim's extent in units, the last in blocks of ``rows``
    (as ``workgroups`` counts them), and the range of units workgroup ``wg`` of ``count``
    runs; for this module's kernels and groupwise.py's."""
    b = L.b
    osz = L.E.sizes[L.out.name]
    sizes = {o: osz[o] for o in outer}
    if rows > 1:
        sizes[outer[-1]] = b.udiv(b.add(osz[outer[-1]], i64(rows - 1)), i64(rows))
    units = i64(1)
    for o in outer:
        units = b.mul(units, sizes[o], flags=("nsw",))
    start, end = share(b, L.k, units, wg, count)
    return sizes, start, end


def emit_direct(L, wg, count) -> None:
    """The body of a direct kernel, into a KernelLowering (lower.py) whose entry block is
    current (as microkernel.GemmEmitter's)."""
    d: Direct = L.k.gemm
    b, E = L.b, L.E
    osz = E.sizes[L.out.name]
    vty = ir.VectorType(F32, d.vl)
    ity = ir.VectorType(I64, d.vl)
    mty = ir.VectorType(I1, d.vl)
    fma = intrinsic(b.module, "llvm.fma", vty, 3) if d.fma else None
    zero = ir.Constant(vty, [0.0] * d.vl)
    tile = d.nvec * d.vl
    accs = [[b.alloca(vty, name=f"acc{r}.{i}") for i in range(d.nvec)] for r in range(d.rows)]
    buf = line_alloca(b, ir.ArrayType(F32, tile), "tile")
    x = d.x
    xbuf = L.buffers[x.arg[0]]
    xsizes = E.sizes[x.arg[0]]
    wlen = xsizes[d.xdim]
    xindex = dict(zip(x.arg[1], x.args))
    hdim = d.outer[-1] if d.outer else None
    sizes, start, end = unit_range(L, d.outer, d.rows, wg, count)
    rowlen = osz[d.row]
    ntiles = b.udiv(b.add(rowlen, i64(tile - 1)), i64(tile))
    lane_ix = [ir.Constant(ity, [t * d.vl + j for j in range(d.vl)]) for t in range(d.step)]

    def x_offset():
        """X's flat offset at the bound point and row."""
        return E.flat_offset(x.arg[0], [E.cast(E(xindex[dim]), xindex[dim].dtype, "i64")
                                        for dim in xbuf.layout])

    def x_vectors(i, checked=True, flat=None, inside=None):
        """X's vector for accumulator i at the bound point and row: ``step`` masked loads
        (lanes outside X's row, or a row out of bounds, load nothing and read 0); unless not
        ``checked`` (a unit inside X, whole vectors of channels): one plain load; LANES (a
        unit inside X, the channels not whole vectors): the lanes' masks alone. ``flat``:
        X's offset, and ``inside``: whether the point's other indices are in bounds, where
        the caller has them."""
        if checked is False:
            flat = x_offset() if flat is None else flat
            ptr = b.gep(E.bases[x.arg[0]], [b.add(flat, i64(i * d.vl))],
                        inbounds=True, source_etype=F32)
            return b.load(ptr, typ=vty, align=4)
        idx, ok = [], inside
        for dim in xbuf.layout:
            if flat is not None and dim != d.xdim:
                idx.append(None)
                continue
            v = E.cast(E(xindex[dim]), xindex[dim].dtype, "i64")
            idx.append(v)
            if dim != d.xdim and x.arg[2] is not None and checked != LANES:
                inb = b.icmp_unsigned("<", v, xsizes[dim])
                ok = inb if ok is None else b.and_(ok, inb)
        pos = idx[list(xbuf.layout).index(d.xdim)]   # X's index of the tile's first lane
        flat = E.flat_offset(x.arg[0], idx) if flat is None else flat
        okv = None
        if ok is not None:
            # a point outside X loads nothing, from X's start: masked lanes on an address
            # outside the buffer may cross into an unmapped page, which costs a fault-
            # suppressing assist per load (a 7x7 window's padding rows made a channels-last
            # kernel 20x slower, depending on where the arena lay)
            flat = b.select(ok, flat, i64(0))
            okv = splat(b, ok, mty)
        parts = []
        for t in range(d.step):
            first = b.add(pos, i64(i * d.vl * d.step))
            lane = b.add(splat(b, first, ity), lane_ix[t])
            # 0 <= lane < wlen as one unsigned compare (a negative lane is past any size):
            # a compare and an and less per load, 7% of LLVM's time on MobileNetV3-large's
            # x86_64-v4 and aarch64 libraries, whose <16 x i64> masks it legalizes in halves
            m = b.icmp_unsigned("<", lane, splat(b, wlen, ity))
            if okv is not None:
                m = b.and_(m, okv)
            # (no inbounds: masked-off lanes may lie outside the buffer)
            ptr = b.gep(E.bases[x.arg[0]], [b.add(flat, i64(i * d.vl * d.step + t * d.vl))],
                        source_etype=F32)
            parts.append(load_masked_f32(b, ptr, vty, m))
        if d.step == 1:
            return parts[0]
        if d.step == 2:   # every other lane of the two loads
            return b.shuffle_vector(parts[0], parts[1], ir.Constant(
                ir.VectorType(I32, d.vl), [2 * j for j in range(d.vl)]))
        out = ir.Constant(vty, ir.Undefined)
        for j in range(d.vl):
            q, r = divmod(j * d.step, d.vl)
            out = b.insert_element(out, b.extract_element(parts[q], ir.Constant(I32, r)),
                                   ir.Constant(I32, j))
        return out

    w = d.w
    wbuf = L.buffers[w.arg[0]]
    windex = dict(zip(w.arg[1], w.args))
    wrow = E.sizes[w.arg[0]][wbuf.contiguous_dim()] if d.w_vector else None

    def w_vector(i, checked=True):
        """W's vector for accumulator i (channels last): the row's channels at the bound
        point, lanes past the row's end masked off (unless not ``checked``: whole vectors)."""
        idx = [E.cast(E(windex[dim]), windex[dim].dtype, "i64") for dim in wbuf.layout]
        ptr = b.gep(E.bases[w.arg[0]], [b.add(E.flat_offset(w.arg[0], idx), i64(i * d.vl))],
                    source_etype=F32)
        if checked is False:
            return b.load(ptr, typ=vty, align=4)
        first = b.add(E.lookup(d.row), i64(i * d.vl))
        lane = b.add(splat(b, first, ity), lane_ix[0])
        m = b.icmp_signed("<", lane, splat(b, wrow, ity))
        return load_masked_f32(b, ptr, vty, m)

    # inside X, a point's and a row's X offset is one anchor (the window's first point, the
    # unit's first row) plus a constant: the rows are output columns side by side, the points
    # steps of the window. Each computed on its own, LLVM hoisted them out of the window loop
    # as fourteen pointers, spilled and reloaded before every load, and loads of one address
    # from two points (row r + 1 at one column of the window, row r at the next) were two
    pvars = sorted({v for p in d.points for v in p})
    xix = [xindex[dim] for dim in xbuf.layout]
    col = hdim if d.rows > 1 else None   # (one row a unit: the unit binds it)
    steps = {v: _var_step(xix, v, E.strides[x.arg[0]]) for v in [*pvars, col] if v}
    anchored = None not in steps.values()

    # at a unit on X's edge, the same: each point's and row's other indices of X too are the
    # anchor's plus constants, and one bounds test per distinct column (not per point and
    # row, each index recomputed) says whether it loads anything
    guarded = [dim for dim in xbuf.layout if dim != d.xdim and x.arg[2] is not None]
    coefs = {(dim, v): coeff(xindex[dim], v) for dim in guarded for v in [*pvars, col] if v}
    edge_anchored = anchored and d.step == 1 and all(isinstance(c, int) for c in coefs.values())

    def accumulate(checked=True):
        """The tile's sums over every reduction point into ``accs``."""
        with _window_rows(L, d):
            anchor = at = None
            if anchored and (checked is not True or edge_anchored):
                with E.scope(**{v: i64(0) for v in pvars}, **({col: hs[0]} if col else {})):
                    anchor = x_offset()
                    if checked is True:
                        at = {dim: E.cast(E(xindex[dim]), xindex[dim].dtype, "i64")
                              for dim in guarded}
            for p in d.points:
                with E.scope(**{r: i64(v) for r, v in p.items()}):
                    ws = [w_vector(i, checked) for i in range(d.nvec)] if d.w_vector else \
                        [splat(b, E(d.w), vty)] * d.nvec
                    for r, h in enumerate(hs):
                        with E.scope(**({} if h is None else {hdim: h})):
                            here = {**p, **({col: r} if col else {})}
                            flat = None if anchor is None else b.add(anchor, i64(
                                sum(n * steps[v] for v, n in here.items())), flags=("nsw",))
                            inside = None
                            for dim in (at or {}):
                                ix = b.add(at[dim], i64(sum(n * coefs[dim, v]
                                                            for v, n in here.items())))
                                inb = b.icmp_unsigned("<", ix, xsizes[dim])
                                inside = inb if inside is None else b.and_(inside, inb)
                            if at is not None and inside is None:
                                inside = ir.Constant(I1, 1)
                            for i, acc in enumerate(accs[r]):
                                xv = x_vectors(i, checked, flat, inside)
                                cur = b.load(acc)
                                new = b.call(fma, [xv, ws[i], cur]) if fma is not None \
                                    else b.fadd(cur, b.fmul(xv, ws[i]))
                                b.store(new, acc)

    with L.loops.loop(start, end, "unit") as u, E.scope():
        L.bind_unit(u, d.outer, sizes)
        h0 = first = None
        if d.rows > 1:
            # the last unit, when the rows do not divide the dim, starts early enough to end
            # at its end: the rows it shares with the unit before are computed again and not
            # stored. Every row is then ``first`` plus a constant, so the rows' X loads at one
            # input column are one load LLVM shares (rows clamped to the last one each were
            # separate addresses: twice the loads, and their addresses spilled)
            h0 = b.mul(E.lookup(hdim), i64(d.rows))
            top = b.sub(osz[hdim], i64(d.rows))
            first = umin(b, h0, top)
        hs = [None if first is None else b.add(first, i64(r), flags=("nsw",))
              for r in range(d.rows)]
        with L.loops.loop(i64(0), ntiles, "tile") as ti, E.scope():
            w0 = b.mul(ti, i64(tile))
            E.bind(d.row, w0)
            for row in accs:
                for a in row:
                    b.store(zero, a)
            inside = _inside(L, d, hs) if d.w_vector and d.step == 1 else None
            if inside is None:
                accumulate()
            else:   # a unit whose every point lies inside X: no bounds checks, and no masks
                # either where the channels are whole vectors (else the last vector's lanes)
                fn = b.block.function
                fast, slow, done = (fn.append_basic_block(n) for n in ("in", "edge", "summed"))
                b.cbranch(inside, fast, slow)
                interior = False if _whole_vectors(d, osz) else LANES
                for block, checked in ((fast, interior), (slow, True)):
                    b.position_at_end(block)
                    accumulate(checked)
                    b.branch(done)
                b.position_at_end(done)
            n = b.sub(rowlen, w0)
            n = umin(b, n, i64(tile))
            for r, h in enumerate(hs):
                after = None
                if h is not None:
                    fn = b.block.function
                    body, after = fn.append_basic_block("row.st"), fn.append_basic_block("row.next")
                    b.cbranch(b.icmp_unsigned(">=", h, h0), body, after)
                    b.position_at_end(body)
                for i, a in enumerate(accs[r]):
                    ptr = b.gep(buf, [i64(0), i64(i * d.vl)], inbounds=True)
                    b.store(b.load(a), b.bitcast(ptr, vty.as_pointer()), align=4)
                with E.scope(**({} if h is None else {hdim: h})), \
                        L.loops.loop(i64(0), n, "e.col", vectorize=True,
                                     predicate=d.vl >= MASKED_LANES) as j, E.scope():
                    E.bind(d.row, b.add(w0, j, flags=("nsw",)))
                    v = b.load(b.gep(buf, [i64(0), j], inbounds=True), typ=F32)
                    L.store(L.finish(v))
                if after is not None:
                    b.branch(after)
                    b.position_at_end(after)
    b.ret_void()
    L.loops_md(L.loops.latches, L.loops.unroll)


def _var_step(index: list[Expr], var: str, strides) -> int | None:
    """How far X's flat offset moves per step of ``var``, known at build time (X's ``index``,
    in its layout's order, affine in it with constant coefficients, and X's ``strides``
    constants), else None."""
    step = 0
    for ix, s in zip(index, strides):
        if var not in ex.free_vars(ix):
            continue
        c = coeff(ix, var)
        if not isinstance(c, int) or not isinstance(s, ir.Constant):
            return None
        step += c * s.constant
    return step


def _whole_vectors(d: Direct, osz) -> bool:
    """Whether the row (the channels) is whole tiles of whole vectors, known at build time: no
    lane then needs a mask."""
    n = osz[d.row]
    return isinstance(n, ir.Constant) and n.constant % (d.nvec * d.vl) == 0 and d.step == 1


def _inside(L, d: Direct, hs) -> ir.Value | None:
    """An i1: whether every point of every row of the bound unit reads X inside its bounds
    (the guarded dims other than the lanes'), from the extreme points of X's affine indices;
    None when an index is not affine with constant coefficients."""
    b, E, x = L.b, L.E, d.x
    if x.arg[2] is None:
        return ir.Constant(I1, 1)
    ranges = {r: s.value for r, s in L.k.rdims.items()}
    hdim = d.outer[-1] if d.outer else None
    ok = ir.Constant(I1, 1)
    xsizes = E.sizes[x.arg[0]]
    for dim, ix in zip(x.arg[1], x.args):
        if dim == d.xdim:
            continue
        ends = []
        for lowest in (True, False):
            at = {}
            for v in ex.free_vars(ix):
                c = coeff(ix, v)
                if not isinstance(c, int):
                    return None
                if v in ranges:
                    at[v] = i64(0 if (c >= 0) == lowest else ranges[v] - 1)
                elif v == hdim and hs[0] is not None:
                    at[v] = hs[0] if (c >= 0) == lowest else hs[-1]
            with E.scope(**at):
                ends.append(E.cast(E(ix), ix.dtype, "i64"))
        lo, hi = ends
        ok = b.and_(ok, b.and_(b.icmp_signed(">=", lo, i64(0)),
                               b.icmp_signed("<", hi, xsizes[dim])))
    return ok


@contextmanager
def _window_rows(L, d: Direct):
    """The loop over ``d.loop``'s reduction dim (its value bound in a scope of its own), or
    nothing when every point is unrolled. LLVM is told not to unroll it: that would undo it."""
    if d.loop is None:
        yield
        return
    name, size = d.loop
    with L.loops.loop(i64(0), i64(size), "window", unroll=False) as v, L.E.scope():
        L.E.bind(name, v)
        yield
