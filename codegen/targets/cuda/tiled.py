"""Contractions on the GPU as tiled GEMMs through shared memory (matmuls, convolutions, einsums).

A kernel that sums a product of two factors, ``out[batch, m, n] = sum{k} A(batch, m, k) *
B(batch, n, k)``, is a GEMM over the flattened index spaces M (output dims only A's factor uses),
N (only B's), K (the reduction dims) and a batch (dims both use). Nothing is assumed about how
the factors index their tensors: each is evaluated per element by the shared expression lowering
with the dims bound, so a convolution's strided, padded window reads (implicit GEMM), a gather or
a cast of 16-bit weights is a GEMM like a plain matmul.

A block of 256 threads computes a ``BM x BN`` output tile: for each ``BK`` slice of K, the block
loads the A and B tiles into shared memory (each thread a few elements, consecutive threads
along the factor's contiguous dim where it can tell: ``_along_k``), waits, and each thread
multiplies out a ``TM x TN`` register block of the tile from them; the epilogue (bias,
activation, residual) is applied to each output as it is stored. The code is written as phases
(spmd.py), so the ``cuda-emulated`` target runs the same body on a CPU.
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.codegen.llvm.loops import delinearize
from mlpack.codegen.llvm.oprules import CONTRACT
from mlpack.codegen.llvm.types import F32, I64
from mlpack.codegen.targets.cpu.indexing import is_one
from mlpack.codegen.targets.cuda.lower import CudaLowering
from mlpack.codegen.targets.cuda.spmd import BLOCK_KIND, Block

BM, BN, BK = 64, 64, 16
TM, TN = 4, 4
THREADS = (BM // TM) * (BN // TN)     # 256
MIN_M, MIN_N, MIN_K = 16, 16, 8       # smaller than this: the grid kernel is as good


def view(k, out) -> dict | None:
    """The GEMM view of kernel ``k`` writing buffer ``out``, or None: {"a", "b" (the factors),
    "batch", "m", "n" (output dims), "k" (the reduction dims)}."""
    if k.reduce != "sum" or k.body.op != "mul" or k.acc_dtype != "f32" or k.body.dtype != "f32":
        return None
    fa, fb = k.body.args
    va, vb = ex.free_vars(fa), ex.free_vars(fb)
    dims = [d for d in out.layout if not is_one(out.sizes[d])]
    if any(d not in va and d not in vb for d in dims):
        return None   # a broadcast output dim: the product would be recomputed per point
    m = [d for d in dims if d in va and d not in vb]
    n = [d for d in dims if d in vb and d not in va]
    batch = [d for d in dims if d in va and d in vb]
    kd = [r for r in k.rdims if not is_one(k.rdims[r])]
    if not m or not n or not kd:
        return None
    sizes = {"m": [out.sizes[d] for d in m], "n": [out.sizes[d] for d in n],
             "k": [k.rdims[r] for r in kd]}
    for what, least in (("m", MIN_M), ("n", MIN_N), ("k", MIN_K)):
        total = ex.simplify_size(ex.product(sizes[what]))
        if total.is_const and total.value < least:
            return None
    return {"a": fa, "b": fb, "batch": batch, "m": m, "n": n, "k": kd}


def blocks(v: dict, out, rdims) -> ex.Expr:
    """The grid: one block per output tile, at most 65535 * 32 (blocks then loop over tiles)."""
    def count(dims, sizes, tile):
        n = ex.product([sizes[d] for d in dims])
        return ex.floordiv(n + ex.const(tile - 1), ex.const(tile))
    tiles = ex.product([count(v["m"], out.sizes, BM), count(v["n"], out.sizes, BN),
                        ex.product([out.sizes[d] for d in v["batch"]])])
    return ex.simplify_size(ex.binary("max", ex.const(1), ex.binary("min", ex.const(1 << 21), tiles)))


def _along_k(factor: ex.Expr, kdims: list[str], buffers) -> bool:
    """Whether the factor's first read moves along its buffer's contiguous dim when a K dim
    steps (so consecutive threads should take consecutive k)."""
    reads = [n for n in ex.walk(factor) if n.op == "read"]
    if not reads:
        return True
    r = reads[0]
    buf = buffers[r.arg[0]]
    inner = buf.contiguous_dim()
    if inner is None:
        return True
    index = dict(zip(r.arg[1], r.args))
    return bool(ex.free_vars(index[inner]) & set(kdims))


class TiledLowering(CudaLowering):
    """A contraction kernel as ``.impl(bindings..., symbols..., i32 block, i32 blocks, err,
    status)``: block ``block`` of ``blocks`` computes every ``blocks``-th output tile."""

    kind = BLOCK_KIND
    threads = THREADS
    tile = (BM, BN)     # the output tile of a block
    bk = BK             # the K slice a tile load takes
    blocks_per_sm = 2   # (256 threads at up to 128 registers each)

    def __init__(self, module, k, buffers, symbols, loops_md, native_f16, v: dict, emulate: bool):
        super().__init__(module, k, buffers, symbols, loops_md, native_f16)
        self.v, self.emulate = v, emulate

    def _emit_impl(self, f: ir.Function) -> None:
        block, blocks, err, status = self._begin(f)
        b, E = self.b, self.E
        self.k.strategy = "inner"   # (finish: the accumulator is the reduction's f32 value)
        self._sizes()
        v, osz = self.v, E.sizes[self.out.name]
        size = {**{d: osz[d] for d in self.out.layout}, **self.extents}

        def total(dims):
            t = ir.Constant(I64, 1)
            for d in dims:
                t = b.mul(t, size[d], flags=("nsw",))
            return t
        self.M, self.N, self.K = total(v["m"]), total(v["n"]), total(v["k"])
        self.size = size
        # output dims and reduction dims of size 1 are left out of M, N and K: index 0
        kept = set(v["m"]) | set(v["n"]) | set(v["batch"]) | set(v["k"])
        self.zeros = {d: ir.Constant(I64, 0) for d in [*self.out.layout, *self.k.rdims]
                      if d not in kept}
        bm, bn = self.tile
        tm = b.udiv(b.add(self.M, ir.Constant(I64, bm - 1)), ir.Constant(I64, bm))
        tn = b.udiv(b.add(self.N, ir.Constant(I64, bn - 1)), ir.Constant(I64, bn))
        tiles = b.mul(b.mul(tm, tn), total(v["batch"]))
        blk = Block(b, self.threads, self.emulate, self.k.name)
        self.blk = blk
        self._setup(blk)
        self.a_along_k = _along_k(v["a"], v["k"], self.buffers)
        self.b_along_k = _along_k(v["b"], v["k"], self.buffers)
        with blk.uniform_loop(b.zext(block, I64), tiles, b.zext(blocks, I64), "tile") as t:
            bt, r = b.udiv(t, b.mul(tm, tn)), b.urem(t, b.mul(tm, tn))
            m0 = b.mul(b.udiv(r, tn), ir.Constant(I64, bm))
            n0 = b.mul(b.urem(r, tn), ir.Constant(I64, bn))
            batch = delinearize(b, bt, v["batch"], size) if v["batch"] else {}
            with E.scope(**batch):
                self._tile(m0, n0)
        b.ret_void()
        self._finish_checks(err, status)

    # -- one output tile

    def _setup(self, blk: Block) -> None:
        """The block's storage: accumulators per thread, the two tiles in shared memory."""
        self.acc = blk.private(F32, TM * TN, "acc")
        self.As = blk.shared(F32, BK * BM, "a")
        self.Bs = blk.shared(F32, BK * BN, "b")

    def _tile(self, m0, n0) -> None:
        b, blk = self.b, self.blk
        zero = ir.Constant(F32, 0.0)
        with blk.phase():
            for i in range(TM * TN):
                b.store(zero, blk.at(self.acc, i))
        with blk.uniform_loop(ir.Constant(I64, 0), self.K, ir.Constant(I64, self.bk), "ktile") as k0:
            with blk.phase() as tid:
                self._load_tiles(m0, n0, k0, tid)
            with blk.phase() as tid:
                self._multiply(tid)
        with blk.phase() as tid:
            self._store(m0, n0, tid)

    def _load_tiles(self, m0, n0, k0, tid) -> None:
        """This thread's elements of the A and B tiles at ``(m0, k0)`` and ``(n0, k0)``."""
        v = self.v
        for factor, dims, width, tile, base, along_k, extent in (
                (v["a"], v["m"], self.tile[0], self.As, m0, self.a_along_k, self.M),
                (v["b"], v["n"], self.tile[1], self.Bs, n0, self.b_along_k, self.N)):
            with self.E.scope():
                self._load(factor, dims, width, tile, base, k0, tid, along_k, extent)

    def _slot(self, tile, width: int, i, kk):
        """Where element (i, kk) of a ``BK x width`` tile lies: tile[kk * width + i]."""
        b = self.b
        return b.gep(tile, [b.add(b.mul(kk, ir.Constant(I64, width)), i)], source_etype=F32)

    def _stored(self, x):
        """An f32 factor value as the tile holds it."""
        return x

    def _zero(self):
        return ir.Constant(F32, 0.0)

    def _load(self, factor, dims, width: int, tile, base, k0, tid, along_k: bool, extent) -> None:
        """This thread's elements of a ``BK x width`` tile of ``factor`` (at ``_slot``), zero
        past the M (N) or K extent: a loop LLVM leaves rolled (each element's index math and
        expression are the bulk of the kernel's code, and of ptxas's time)."""
        b, E, bk = self.b, self.E, self.bk
        per = ir.Constant(I64, bk * width // self.threads)
        with self.loops.loop(ir.Constant(I64, 0), per, "ld", unroll=False) as j:
            e = b.add(tid, b.mul(j, ir.Constant(I64, self.threads)))
            if along_k:
                kk, i = b.urem(e, ir.Constant(I64, bk)), b.udiv(e, ir.Constant(I64, bk))
            else:
                i, kk = b.urem(e, ir.Constant(I64, width)), b.udiv(e, ir.Constant(I64, width))
            gi, gk = b.add(base, i), b.add(k0, kk)
            ok = b.and_(b.icmp_unsigned("<", gi, extent), b.icmp_unsigned("<", gk, self.K))
            slot = self._slot(tile, width, i, kk)
            fn = b.block.function
            load, skip, done = (fn.append_basic_block(f"ld.{s}") for s in ("in", "out", "done"))
            b.cbranch(ok, load, skip)
            b.position_at_end(load)
            binds = {**self.zeros, **delinearize(b, gi, dims, self.size),
                     **delinearize(b, gk, self.v["k"], self.size)}
            with E.scope(**binds):
                b.store(self._stored(E.cast(E(factor), factor.dtype, "f32")), slot)
            b.branch(done)
            b.position_at_end(skip)
            b.store(self._zero(), slot)
            b.branch(done)
            b.position_at_end(done)

    def _multiply(self, tid) -> None:
        """acc += A-tile column x B-tile row, for each of the BK slices (a TM x TN outer product)."""
        b, blk = self.b, self.blk
        ty = b.udiv(tid, ir.Constant(I64, BN // TN))
        tx = b.urem(tid, ir.Constant(I64, BN // TN))
        with self.loops.loop(ir.Constant(I64, 0), ir.Constant(I64, BK), "kk") as kk:
            row_a = b.add(b.mul(kk, ir.Constant(I64, BM)), b.mul(ty, ir.Constant(I64, TM)))
            row_b = b.add(b.mul(kk, ir.Constant(I64, BN)), b.mul(tx, ir.Constant(I64, TN)))
            a = [b.load(b.gep(self.As, [b.add(row_a, ir.Constant(I64, i))], source_etype=F32), typ=F32)
                 for i in range(TM)]
            bb = [b.load(b.gep(self.Bs, [b.add(row_b, ir.Constant(I64, j))], source_etype=F32), typ=F32)
                  for j in range(TN)]
            for i in range(TM):
                for j in range(TN):
                    # (contracted into an FMA on the GPU; a CPU without FMA multiplies and adds)
                    s = b.fadd(b.load(blk.at(self.acc, i * TN + j), typ=F32),
                               b.fmul(a[i], bb[j], flags=CONTRACT), flags=CONTRACT)
                    b.store(s, blk.at(self.acc, i * TN + j))

    def _store(self, m0, n0, tid) -> None:
        b = self.b
        ty = b.udiv(tid, ir.Constant(I64, BN // TN))
        tx = b.urem(tid, ir.Constant(I64, BN // TN))
        rows = [self._index(b.add(m0, b.add(b.mul(ty, ir.Constant(I64, TM)), ir.Constant(I64, i))),
                            self.v["m"], self.M) for i in range(TM)]
        cols = [self._index(b.add(n0, b.add(b.mul(tx, ir.Constant(I64, TN)), ir.Constant(I64, j))),
                            self.v["n"], self.N) for j in range(TN)]
        for i in range(TM):
            for j in range(TN):
                self._put(rows[i], cols[j], i * TN + j)

    def _index(self, g, dims, extent):
        """(whether output row/column ``g`` is inside, its dims' indices): computed once per row
        and per column of a thread's block, not per element."""
        b = self.b
        return b.icmp_unsigned("<", g, extent), delinearize(b, g, dims, self.size)

    def _put(self, row, col, slot: int) -> None:
        """Accumulator ``slot`` (a constant: it stays in a register) through the epilogue into
        the output at ``row`` and ``col`` (``_index``), if both are inside."""
        b, E = self.b, self.E
        fn = b.block.function
        put, done = fn.append_basic_block("st.in"), fn.append_basic_block("st.done")
        b.cbranch(b.and_(row[0], col[0]), put, done)
        b.position_at_end(put)
        with E.scope(**{**self.zeros, **row[1], **col[1]}):
            self.store(self.finish(b.load(self.blk.at(self.acc, slot), typ=F32)))
        b.branch(done)
        b.position_at_end(done)


__all__ = ["TiledLowering", "view", "blocks", "THREADS"]
