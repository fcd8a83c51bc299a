"""Contractions of the fp16 and bf16 variants on tensor cores (``mma.sync.m16n8k16``, sm_80 on).

The GEMM view and the tile loads are tiled.py's; here the tiles are stored in shared memory as
16-bit values (the factors rounded to the artifact's precision, the weights already are) and a
block of four warps multiplies them with ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}``,
accumulating in f32: a 64 x 64 output tile per block, 32 x 16 per warp for eight warps (2 x 2
instructions per 16 of K). Each thread holds its fragments as the PTX ISA lays them out (``_a_words``,
``_b_words``: "Matrix Fragments for mma.m16n8k16"), and its accumulators as the D fragment.

The ``cuda-emulated`` target runs the same fragment loads, then ``_emulated_mma``: the
instruction written out from the PTX ISA's fragment layouts (which lane holds which element of
A, B, C and D), computed over the warp's 32 lanes on a CPU. That model is written apart from
the loads, so a load that put an element in the wrong lane or register computes a wrong product
in the emulation, and the build's validation against float64 catches it.

Rounding the activations to 16 bits is what makes this faster and what costs accuracy, so the
schedule is an inexact pass (``tensor_cores``): an artifact that misses its precision's
tolerance is compiled again without it (the f32 tiles of tiled.py, 16-bit weights widened).
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.codegen.llvm import halfconv
from mlpack.codegen.llvm.types import F32, I64
from mlpack.codegen.targets.cuda import tiled
from mlpack.codegen.targets.cuda.spmd import BLOCK_KIND, Block

I16, I32 = ir.IntType(16), ir.IntType(32)
HALF = ir.HalfType()
V2H = ir.VectorType(HALF, 2)
BM, BN, BK = 64, 64, 32
WARPS_M, WARPS_N = 2, 4
WM, WN = BM // WARPS_M, BN // WARPS_N   # a warp's tile: 32 x 16
MT, NT = WM // 16, WN // 8              # its m16 and n8 tiles
THREADS = 32 * WARPS_M * WARPS_N        # 256
STRIDE = BK + 8                    # halves per shared row: 16 bytes of padding against bank conflicts
PASS = "tensor_cores"
INTRINSIC = {"f16": "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
             "bf16": "llvm.nvvm.mma.m16n8k16.row.col.bf16"}


def blocks(v: dict, out, rdims):
    from mlpack.spec.ir import expr as ex

    def count(dims, tile):
        n = ex.product([out.sizes[d] for d in dims])
        return ex.floordiv(n + ex.const(tile - 1), ex.const(tile))
    tiles = ex.product([count(v["m"], BM), count(v["n"], BN),
                        ex.product([out.sizes[d] for d in v["batch"]])])
    return ex.simplify_size(ex.binary("max", ex.const(1), ex.binary("min", ex.const(1 << 21), tiles)))


class TensorCoreLowering(tiled.TiledLowering):
    """tiled.TiledLowering with 16-bit tiles multiplied by mma.sync (``half``: f16 or bf16)."""

    kind = BLOCK_KIND
    threads = THREADS
    tile = (BM, BN)
    bk = BK
    blocks_per_sm = 2   # (256 threads at up to 128 registers each)

    def __init__(self, module, k, buffers, symbols, loops_md, native_f16, v: dict, emulate: bool,
                 half: str):
        super().__init__(module, k, buffers, symbols, loops_md, native_f16, v, emulate)
        self.half = half

    # -- the tile (tiled.TiledLowering._emit_impl calls _setup, then _tile per output tile)

    def _setup(self, blk: Block) -> None:
        self.acc = blk.private(F32, MT * NT * 4, "acc")
        self.As = blk.shared(I16, BM * STRIDE, "a")
        self.Bs = blk.shared(I16, BN * STRIDE, "b")
        if self.emulate:
            self.afrag = blk.private(I32, 2 * MT * 4, "afrag")
            self.bfrag = blk.private(I32, 2 * NT * 2, "bfrag")

    def _tile(self, m0, n0) -> None:
        b, blk = self.b, self.blk
        with blk.phase():
            for i in range(MT * NT * 4):
                b.store(ir.Constant(F32, 0.0), blk.at(self.acc, i))
        with blk.uniform_loop(ir.Constant(I64, 0), self.K, ir.Constant(I64, self.bk), "ktile") as k0:
            with blk.phase() as tid:
                self._load_tiles(m0, n0, k0, tid)
            with blk.phase() as tid:
                self._fragments_and_mma(tid)
            if self.emulate:
                self._emulated_mma()
        with blk.phase() as tid:
            self._store_d(m0, n0, tid)

    def _round16(self, x):
        """An f32 value as the 16 bits of the artifact's half type."""
        b = self.b
        if self.half == "bf16":
            return halfconv.f32_to_bf16(b, x)
        if self.emulate:   # (the host may lack F16C; both round to nearest even)
            return halfconv.f32_to_f16(b, x)
        return b.bitcast(b.fptrunc(x, HALF), I16)

    def _slot(self, tile, width: int, i, kk):
        """Element (i, kk) of a 16-bit tile, m- or n-major: tile[i * STRIDE + kk]."""
        b = self.b
        return b.gep(tile, [b.add(b.mul(i, ir.Constant(I64, STRIDE)), kk)], source_etype=I16)

    def _stored(self, x):
        return self._round16(x)

    def _zero(self):
        return ir.Constant(I16, 0)

    def _lane(self, tid):
        b = self.b
        warp, lane = b.udiv(tid, ir.Constant(I64, 32)), b.urem(tid, ir.Constant(I64, 32))
        wm, wn = b.udiv(warp, ir.Constant(I64, WARPS_N)), b.urem(warp, ir.Constant(I64, WARPS_N))
        g, t4 = b.lshr(lane, ir.Constant(I64, 2)), b.and_(lane, ir.Constant(I64, 3))
        return wm, wn, g, t4

    def _word(self, tile, row, col):
        """The 32 bits of two 16-bit values tile[row * STRIDE + col .. + 1] (col even)."""
        b = self.b
        at = b.add(b.mul(row, ir.Constant(I64, STRIDE)), col)
        return b.load(b.gep(tile, [at], source_etype=I16), typ=I32, align=4)

    def _a_words(self, wm, g, t4, mt: int, ks: int) -> list:
        """A fragment of m16 tile ``mt`` at k-step ``ks``: a0a1 (row g, cols 2t, 2t+1), a2a3 (row
        g+8), a4a5 (row g, cols 2t+8, 2t+9), a6a7 (row g+8, cols 2t+8, 2t+9)."""
        b = self.b
        r = b.add(b.add(b.mul(wm, ir.Constant(I64, WM)), ir.Constant(I64, mt * 16)), g)
        c = b.add(ir.Constant(I64, ks * 16), b.mul(t4, ir.Constant(I64, 2)))
        r8, c8 = b.add(r, ir.Constant(I64, 8)), b.add(c, ir.Constant(I64, 8))
        return [self._word(self.As, r, c), self._word(self.As, r8, c), self._word(self.As, r, c8),
                self._word(self.As, r8, c8)]

    def _b_words(self, wn, g, t4, nt: int, ks: int) -> list:
        """B fragment of n8 tile ``nt`` at k-step ``ks``: b0b1 (rows k = 2t, 2t+1 of column g),
        b2b3 (k = 2t+8, 2t+9): the tile is stored n-major, so each pair is one word."""
        b = self.b
        n = b.add(b.add(b.mul(wn, ir.Constant(I64, WN)), ir.Constant(I64, nt * 8)), g)
        k = b.add(ir.Constant(I64, ks * 16), b.mul(t4, ir.Constant(I64, 2)))
        return [self._word(self.Bs, n, k), self._word(self.Bs, n, b.add(k, ir.Constant(I64, 8)))]

    def _fragments_and_mma(self, tid) -> None:
        b, blk = self.b, self.blk
        wm, wn, g, t4 = self._lane(tid)
        for ks in range(BK // 16):
            a = [self._a_words(wm, g, t4, mt, ks) for mt in range(MT)]
            bw = [self._b_words(wn, g, t4, nt, ks) for nt in range(NT)]
            if self.emulate:   # the warp's instruction runs after every lane has its fragments
                for mt in range(MT):
                    for r in range(4):
                        b.store(a[mt][r], blk.at(self.afrag, (ks * MT + mt) * 4 + r))
                for nt in range(NT):
                    for r in range(2):
                        b.store(bw[nt][r], blk.at(self.bfrag, (ks * NT + nt) * 2 + r))
                continue
            for mt in range(MT):
                for nt in range(NT):
                    slots = [blk.at(self.acc, (mt * NT + nt) * 4 + i) for i in range(4)]
                    c = [b.load(s, typ=F32) for s in slots]
                    d = self._mma(a[mt], bw[nt], c)
                    for s, x in zip(slots, d):
                        b.store(x, s)

    def _mma(self, a: list, bw: list, c: list) -> list:
        b = self.b
        name = INTRINSIC[self.half]
        word = V2H if self.half == "f16" else I32
        m = b.module
        fn = m.globals.get(name) or ir.Function(m, ir.FunctionType(
            ir.LiteralStructType([F32] * 4), [word] * 6 + [F32] * 4), name)
        args = [x if word is I32 else b.bitcast(x, V2H) for x in a + bw] + c
        d = b.call(fn, args)
        return [b.extract_value(d, i) for i in range(4)]

    # -- the instruction on a CPU, from the PTX ISA's fragment layouts

    def _half(self, word, which):
        """Element ``which`` (an i64 value: 0 the low 16 bits, 1 the high) of a fragment word,
        as f32."""
        b = self.b
        shift = b.trunc(b.mul(which, ir.Constant(I64, 16)), I32)
        h = b.trunc(b.lshr(word, shift), I16)
        return halfconv.bf16_to_f32(b, h) if self.half == "bf16" else halfconv.f16_to_f32(b, h)

    def _emulated_mma(self) -> None:
        """D = A B + C for every warp, k-step and (m16, n8) tile, lane by lane: lane L = 4g + t
        holds A[g + 8(j & 1)][2t + h + 8(j >> 1)] in word j, half h; B[2t + h + 8j][g] in word j,
        half h; and C/D[g + 8(i >> 1)][2t + (i & 1)] in accumulator i."""
        b, loops = self.b, self.loops
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        with loops.loop(c(0), c(WARPS_M * WARPS_N), "warp") as warp, \
                loops.loop(c(0), c(BK // 16), "ks") as ks, \
                loops.loop(c(0), c(MT), "mt") as mt, \
                loops.loop(c(0), c(NT), "nt") as nt, \
                loops.loop(c(0), c(32), "lane") as lane, \
                loops.loop(c(0), c(4), "i") as i:
            first = b.mul(warp, c(32))
            g, t = b.lshr(lane, c(2)), b.and_(lane, c(3))
            row = b.add(g, b.mul(b.lshr(i, c(1)), c(8)))
            col = b.add(b.mul(t, c(2)), b.and_(i, c(1)))
            slot = self._lane_slot(self.acc, b.add(first, lane),
                              b.add(b.mul(b.add(b.mul(mt, c(NT)), nt), c(4)), i))
            a_base = b.mul(b.add(b.mul(ks, c(MT)), mt), c(4))
            b_base = b.mul(b.add(b.mul(ks, c(NT)), nt), c(2))
            with loops.loop(c(0), c(16), "k") as k:
                pair = b.lshr(b.and_(k, c(7)), c(1))      # (k % 8) // 2
                hi = b.lshr(k, c(3))                       # k >= 8
                # A[row][k]: lane 4 (row % 8) + (k % 8) // 2, word (row >= 8) + 2 (k >= 8)
                a_lane = b.add(first, b.add(b.mul(b.and_(row, c(7)), c(4)), pair))
                a_word = b.add(b.lshr(row, c(3)), b.mul(hi, c(2)))
                aw = b.load(self._lane_slot(self.afrag, a_lane, b.add(a_base, a_word)), typ=I32)
                # B[k][col]: lane 4 col + (k % 8) // 2, word (k >= 8)
                b_lane = b.add(first, b.add(b.mul(col, c(4)), pair))
                bw = b.load(self._lane_slot(self.bfrag, b_lane, b.add(b_base, hi)), typ=I32)
                half = b.and_(k, c(1))
                b.store(b.fadd(b.load(slot, typ=F32), b.fmul(self._half(aw, half), self._half(bw, half))),
                        slot)

    def _lane_slot(self, p, thread, index):
        """Thread ``thread``'s slot ``index`` (an i64 value) of private ``p`` (emulation)."""
        b = self.b
        return b.gep(p.base, [b.add(b.mul(thread, ir.Constant(I64, p.count)), index)],
                     source_etype=p.ty)

    def _store_d(self, m0, n0, tid) -> None:
        """Each D fragment element through the epilogue: accumulator i of (mt, nt) is row
        g + 8 (i >> 1), column 2t + (i & 1) of the m16 x n8 tile."""
        b = self.b
        wm, wn, g, t4 = self._lane(tid)
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        rows = {(mt, h): self._index(b.add(m0, b.add(b.add(b.mul(wm, c(WM)), c(mt * 16 + 8 * h)), g)),
                                     self.v["m"], self.M) for mt in range(MT) for h in range(2)}
        cols = {(nt, e): self._index(b.add(n0, b.add(b.add(b.mul(wn, c(WN)), c(nt * 8 + e)),
                                                      b.mul(t4, c(2)))), self.v["n"], self.N)
                for nt in range(NT) for e in range(2)}
        for mt in range(MT):
            for nt in range(NT):
                for i in range(4):
                    self._put(rows[mt, i >> 1], cols[nt, i & 1], (mt * NT + nt) * 4 + i)
