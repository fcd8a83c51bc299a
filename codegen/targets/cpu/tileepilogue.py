"""A GEMM tile's epilogue: after the micro-kernel's K loop (microkernel.py) the tile is in a
stack buffer, and a loop over its valid rows and columns applies the kernel's epilogue (bias,
activation, residual: the scalar emitter, with the output dims bound) and stores each element.

The inner loop walks the output's unit-stride dim, and the dims it walks are bound as one flat
index wherever every address the epilogue reaches is affine in it (``flat_bindable``), so LLVM
vectorizes it and no element pays a division. (A second copy of the loops at constant trip
counts for whole tiles measured the same at run time, 1.006 and 0.996 on attention's scores and
ResNeXt-50, and cost 12% more of LLVM's time on GoogLeNet.)
Where the tile's rows are the outer loop (the output's unit stride along N), the micro-kernel
runs this right after each tile's K loop of a one-chunk K: the stores' cache misses then
overlap the next tile's multiply-adds instead of coming in one burst per group of tiles
(attention's 1500 x 1500 scores a head from K = 64: 23.8 -> 22.5 ms for six heads at 1 thread
on AVX-512).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.llvm.loops import delinearize
from mlpack.codegen.llvm.types import i64
from mlpack.codegen.targets.cpu.gemm import PACK
from mlpack.codegen.targets.cpu.indexing import coeff, is_one
from mlpack.codegen.targets.cpu.kernel import Buffer


def tile_epilogue(em, tile, m0, m_size, nt, osz, rows: int) -> None:
    """The epilogue of the tile buffer's ``rows`` rows from row ``m0`` (fewer past M)."""
    c, b, L, E = em.c, em.b, em.L, em.E
    tile_n = c.tb * PACK
    nrows = em.umin(i64(rows), b.sub(m_size, m0))
    n0 = b.mul(nt, i64(tile_n))
    ncols = em.umin(i64(tile_n), b.sub(em.n_size, n0))
    # the inner loop walks the output's unit-stride dim when it can (NCHW: along M)
    loops = [("row", nrows, m0, c.m), ("col", ncols, n0, c.n)]
    if L.out.contiguous_dim() in c.m:
        loops.reverse()
    idx = {}
    # the inner dims bound as one flat index when every address they reach is affine in
    # it (no division per element), so the loop vectorizes; the outer ones too (no division
    # per row: a channels-last convolution's pixels)
    flat = flat_bindable(L.k.epilogue, L.out, loops[1][3], L.buffers)
    flat_outer = flat_bindable(L.k.epilogue, L.out, loops[0][3], L.buffers)

    def bind(at, dims, flat_index: bool) -> None:
        """Bind ``dims`` at flat position ``at``: as one index (the last dim; the others
        0), or each delinearized."""
        if flat_index:
            *outer, last = dims
            for d in outer:
                E.bind(d, i64(0))
            E.bind(last, at)
        else:
            for d, v in delinearize(b, at, dims, osz).items():
                E.bind(d, v)

    def element() -> None:
        p = b.gep(tile, [b.add(b.mul(idx["row"], i64(tile_n)), idx["col"])], inbounds=True)
        L.store(L.finish(b.load(p, typ=em.ety)))

    # an NCHW output over a dynamic batch: (n, h, w) are not adjacent, (h, w) are
    split = None if flat else _flat_suffix(L, loops[1][3])
    with L.loops.loop(i64(0), loops[0][1], f"e.{loops[0][0]}") as i, E.scope():
        idx[loops[0][0]] = i
        bind(b.add(loops[0][2], i), loops[0][3], flat_outer)
        if split is not None:
            _segments(em, loops[1], split, osz, idx, element)
        else:
            with L.loops.loop(i64(0), loops[1][1], f"e.{loops[1][0]}", vectorize=flat) \
                    as j, E.scope():
                idx[loops[1][0]] = j
                bind(b.add(loops[1][2], j), loops[1][3], flat)
                element()


def _segments(em, loop, split: int, osz, idx, element) -> None:
    """The epilogue's inner loop over dims whose last ones (from ``split``) can be walked
    as one flat index but the first cannot: a loop over the runs within one value of the
    first (an image of an NCHW output), each a flat, vectorizable loop."""
    b, L, E = em.b, em.L, em.E
    name, count, first, dims = loop
    pre, suf = dims[:split], dims[split:]
    run = em.dims_size(suf, osz)
    end = b.add(first, count)
    lo = b.udiv(first, run)
    hi = b.udiv(b.add(end, b.sub(run, i64(1))), run)
    with L.loops.loop(lo, hi, f"e.{name}.run") as q, E.scope():
        for d, v in delinearize(b, q, pre, osz).items():
            E.bind(d, v)
        at = b.mul(q, run)
        start = b.select(b.icmp_unsigned(">", first, at), first, at)
        stop = em.umin(end, b.add(at, run))
        with L.loops.loop(b.sub(start, at), b.sub(stop, at), f"e.{name}", vectorize=True) \
                as r, E.scope():
            *outer, last = suf
            for d in outer:
                E.bind(d, i64(0))
            E.bind(last, r)
            idx[name] = b.sub(b.add(at, r), first)
            element()


def _flat_suffix(L, dims: list[str]) -> int | None:
    """Where the longest run of ``dims`` that the epilogue may walk as one flat index starts
    (flat_bindable), if not at the first dim; None when no run of two dims or more is."""
    for s in range(1, len(dims) - 1):
        if flat_bindable(L.k.epilogue, L.out, dims[s:], L.buffers):
            return s
    return None


def _adjacent(buf: Buffer, bdims: list[str], sizes: list[Expr]) -> bool:
    """Whether ``buf``'s dims ``bdims`` lie next to each other in its layout, in this order
    (size-1 dims aside), each after the first of the size ``sizes`` gives it: then a flat index
    over them addresses ``buf`` as the last alone would, with the others at 0."""
    order = [d for d in buf.layout if d in bdims or not is_one(buf.sizes[d])]
    pos = [order.index(d) for d in bdims]
    if pos != list(range(pos[0], pos[0] + len(bdims))):
        return False
    return all(ex.same_size(buf.sizes[d], s) for d, s in zip(bdims[1:], sizes[1:]))


def flat_bindable(epilogue: Expr | None, out: Buffer, dims: list[str], bufs) -> bool:
    """Whether the epilogue's inner loop over ``dims`` (flattened, last fastest) may bind them
    as one flat index: the output and every read that uses them hold them adjacent and in
    order, each indexed by the plain var (once), unguarded, or index one dim by their flat
    position itself (``_flattened``: a grouped convolution's bias, ``b[4 * g + co]``), and no
    other use of them."""
    sizes = [out.sizes[d] for d in dims]
    if not dims or not _adjacent(out, dims, sizes):
        return False
    want = set(dims)

    def ok(e: Expr) -> bool:
        if e.op == "var":
            return e.arg not in want
        if e.op != "read":
            return all(ok(a) for a in e.args)
        at = {}   # loop dim -> the buffer dim it indexes
        for d, ix in zip(e.arg[1], e.args):
            if ix.op == "var" and ix.arg in want:
                if ix.arg in at:
                    return False   # one var indexing two dims (a diagonal): not a flat walk
                at[ix.arg] = d
            elif want & ex.free_vars(ix):
                if at or not _flattened(ix, dims, sizes):
                    return False
            elif not ok(ix):
                return False
        if not at:
            return True
        if set(at) != want or e.arg[2] is not None:
            return False
        return _adjacent(bufs[e.arg[0]], [at[v] for v in dims], sizes)
    return epilogue is None or ok(epilogue)


def _flattened(ix: Expr, dims: list[str], sizes: list[Expr]) -> bool:
    """Whether index ``ix`` is ``a`` times the flat position of ``dims`` (of constant
    ``sizes``, last fastest) plus terms of other vars: then the flat index bound to the last
    dim, the others 0, gives it the same value."""
    if any(n.op == "read" for n in ex.walk(ix)) or not all(s.is_const for s in sizes[1:]):
        return False
    stride, want = 1, [1]
    for s in reversed(sizes[1:]):
        stride *= s.value
        want.append(stride)
    want.reverse()
    got = [coeff(ix, d) for d in dims]
    if not all(isinstance(c, int) for c in got) or got[-1] == 0:
        return False
    return all(c == got[-1] * w for c, w in zip(got, want))
