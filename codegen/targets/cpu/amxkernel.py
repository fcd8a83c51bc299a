"""AMX kernels in LLVM IR: ``AmxGemm`` emits a contraction that amx.py put on tiles.

Each workgroup unit splits its blocks of A's rows into bf16 parts in a stack scratch, then runs
2x2 blocks of accumulator tiles over the whole K with ``tdpbf16ps``, six part products per K
step (amx.py says why, and how B is packed); the outputs go through the f32 micro-kernel's
epilogue (microkernel.py, which this builds on).
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.codegen.llvm.intrinsics import declare, line_alloca
from mlpack.codegen.llvm.types import F32, I8, I16, I32, I64, i64
from mlpack.codegen.targets.cpu.amx import (A_TILES, B_TILES, BLOCK_ROWS, PARTS, PRODUCTS, RUN,
                                            TILE_BYTES, TILE_K, TILE_ROWS)
from mlpack.codegen.targets.cpu.gemm import PACK
from mlpack.codegen.targets.cpu.microkernel import GemmEmitter


def _tile_config(module: ir.Module) -> ir.GlobalVariable:
    """ldtilecfg's 64 bytes (palette 1; tiles 0-7 of 16 rows x 64 bytes), once per module."""
    name = "mlpack.amx.tilecfg"
    if name in module.globals:
        return module.globals[name]
    cfg = bytearray(64)
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = 64   # colsb (u16, little-endian)
        cfg[48 + t] = TILE_ROWS
    g = ir.GlobalVariable(module, ir.ArrayType(I8, 64), name=name)
    g.global_constant = True
    g.linkage = "internal"
    g.align = 64
    g.initializer = ir.Constant(ir.ArrayType(I8, 64), bytearray(cfg))
    return g


class AmxGemm(GemmEmitter):
    """Emits an AMX gemm kernel's body (see the module docstring)."""

    def _intr(self, name: str, *args: ir.Type) -> ir.Function:
        return declare(self.b.module, f"llvm.x86.{name}",
                               ir.FunctionType(ir.VoidType(), list(args)))

    def _tile(self, name: str, *regs: int, ptr=None, stride: int = 64) -> None:
        ops = [ir.Constant(I8, r) for r in regs]
        if ptr is None:
            self.b.call(self._intr(name, *[I8] * len(regs)), ops)
        else:
            self.b.call(self._intr(name, I8, ir.PointerType(), I64), [*ops, ptr, i64(stride)])

    def emit(self) -> None:
        L, b, E, c = self.L, self.b, self.E, self.c
        osz = E.sizes[L.out.name]
        c0, S = self.offsets(c.a)
        self.n_size = E(c.n_size)
        blocks = E(c.blocks)
        steps = c.k_steps
        tile_n = c.tb * PACK
        nblk = c.group * c.mr // BLOCK_ROWS   # 32-row blocks per unit
        rows = nblk * BLOCK_ROWS
        per_blk = steps * PARTS * BLOCK_ROWS * TILE_K   # one block's parts, in bf16
        scratch = line_alloca(b, ir.ArrayType(I16, nblk * per_blk), "aparts")
        cbuf = line_alloca(b, ir.ArrayType(F32, rows * tile_n), "cbuf")
        b.call(self._intr("ldtilecfg", ir.PointerType()), [_tile_config(b.module)])
        m_size = self.dims_size(c.m, osz)
        mgroups = b.udiv(self.add(m_size, i64(rows - 1)), i64(rows))
        ntiles = b.udiv(self.add(blocks, i64(c.tb - 1)), i64(c.tb))
        start, end = self.share(self.mul(self.mul(self.dims_size(c.batch, osz), ntiles), mgroups))
        A, packed = E.bases[c.a.arg[0]], E.bases[c.packed]
        last = b.sub(m_size, i64(1))
        if c.k_size.value % TILE_K:   # the last step's columns past K: zero in every row
            zty = ir.VectorType(I16, TILE_K)
            tail = PARTS * BLOCK_ROWS   # rows of 32 bf16 in a step's parts
            with L.loops.loop(i64(0), i64(nblk * tail), "zero") as z:
                at = b.add(b.mul(b.udiv(z, i64(tail)), i64(per_blk)),
                           b.add(i64((steps - 1) * tail * TILE_K), b.mul(b.urem(z, i64(tail)),
                                                                       i64(TILE_K))))
                ptr = b.gep(scratch, [i64(0), at], inbounds=True)
                b.store(ir.Constant(zty, [0] * TILE_K), b.bitcast(ptr, zty.as_pointer()), align=2)
        with L.loops.loop(start, end, "unit") as u, E.scope():
            mg, nt, bi, base = self.unit(u, mgroups, ntiles, c0, S)
            m0 = b.mul(mg, i64(rows))
            # the unit's blocks that hold rows of M (the last unit's may not all)
            used = self.umin(i64(nblk), b.udiv(b.add(b.sub(m_size, m0), i64(BLOCK_ROWS - 1)),
                                              i64(BLOCK_ROWS)))
            with L.loops.loop(i64(0), b.mul(used, i64(BLOCK_ROWS)), "arow") as r:
                m = self.umin(b.add(m0, r), last)
                row = b.gep(A, [self.row_offset(base, m, S, osz)], inbounds=True,
                            source_etype=F32)
                blk = b.gep(scratch, [i64(0), b.mul(b.udiv(r, i64(BLOCK_ROWS)), i64(per_blk))],
                            inbounds=True)
                self._split_row(row, b.urem(r, i64(BLOCK_ROWS)), blk, S)
            blk0 = b.mul(nt, i64(c.tb))   # the unit's column blocks, in pairs
            pairs = b.udiv(b.add(self.umin(i64(c.tb), b.sub(blocks, blk0)), i64(1)), i64(2))
            last_blk = b.sub(blocks, i64(1))
            with L.loops.loop(i64(0), pairs, "npair") as p:
                j0 = b.add(blk0, b.mul(p, i64(2)))
                j1 = self.umin(b.add(j0, i64(1)), last_blk)   # (a lone last block: not stored)
                panels = [b.gep(packed, [b.mul(b.add(b.mul(bi, blocks), j),
                                               i64(steps * PARTS * TILE_BYTES // 2))],
                                inbounds=True, source_etype=I16) for j in (j0, j1)]
                col = b.mul(p, i64(2 * PACK))
                # every block of rows uses the pair's B tiles while they are in cache
                with L.loops.loop(i64(0), used, "ablk", unroll=False) as g:
                    for acc in range(4):
                        self._tile("tilezero", acc)
                    self._k_steps(b.gep(scratch, [i64(0), b.mul(g, i64(per_blk))], inbounds=True),
                                  panels, steps)
                    row0 = b.mul(g, i64(BLOCK_ROWS * tile_n))
                    for mt in range(2):
                        for nt_ in range(2):
                            at = b.add(b.add(row0, col), i64(mt * TILE_ROWS * tile_n + nt_ * PACK))
                            self._tile("tilestored64", 2 * mt + nt_, ptr=b.gep(
                                cbuf, [i64(0), at], inbounds=True), stride=tile_n * 4)
            tile = b.gep(cbuf, [i64(0), i64(0)], inbounds=True)
            self.epilogue(tile, m0, m_size, nt, osz, c.group * c.mr)
        b.call(self._intr("tilerelease"), [])
        b.ret_void()
        L.loops_md(L.loops.latches, L.loops.unroll)

    def _k_steps(self, scratch, panels, steps: int) -> None:
        """The K loop of one 2x2 block of accumulator tiles: six part products per step."""
        b, L = self.b, self.L
        with L.loops.loop(i64(0), i64(steps), "kstep", unroll=False) as ks:
            a = b.gep(scratch, [b.mul(ks, i64(PARTS * BLOCK_ROWS * TILE_K))], inbounds=True,
                      source_etype=I16)
            bs = [b.gep(pan, [b.mul(ks, i64(PARTS * TILE_BYTES // 2))], inbounds=True,
                        source_etype=I16) for pan in panels]
            held_a = held_b = None
            for pa, pb in PRODUCTS:
                if pa != held_a:
                    for mt, reg in enumerate(A_TILES):
                        self._tile("tileloadd64", reg, ptr=b.gep(a, [i64(
                            (pa * BLOCK_ROWS + mt * TILE_ROWS) * TILE_K)], source_etype=I16))
                    held_a = pa
                if pb != held_b:
                    for nt, reg in enumerate(B_TILES):
                        self._tile("tileloadd64", reg, ptr=b.gep(
                            bs[nt], [i64(pb * TILE_BYTES // 2)], source_etype=I16))
                    held_b = pb
                for mt, ra in enumerate(A_TILES):
                    for nt, rb in enumerate(B_TILES):
                        self._tile("tdpbf16ps", 2 * mt + nt, ra, rb)

    def _split_row(self, row, r, scratch, S) -> None:
        """A's row ``r`` of the unit (at ``row``) split into the scratch's parts: nested loops
        over the K dims outside the run, the run in vectors of ``RUN`` floats, or each vector
        from ``run_group`` runs along the next K dim out (the capsule's 4 floats of k for 4
        values of ci)."""
        c, b, L = self.c, self.b, self.L
        ext = {v: L.k.rdims[v].value for v in c.k}
        inner = len(c.k) - c.run_dims
        run = 1
        for v in c.k[inner:]:
            run *= ext[v]
        group = c.run_group
        outer = c.k[:inner]
        vty = ir.VectorType(F32, RUN)

        def load(off):
            if group == 1:
                return [b.load(b.gep(row, [self.add(off, i64(q * RUN))], inbounds=True,
                                     source_etype=F32), typ=vty, align=4)
                        for q in range(run // RUN)]
            v = outer[-1]
            sty = ir.VectorType(F32, run)
            parts = [b.load(b.gep(row, [self.add(off, self.mul(S[v], i64(j))) if v in S else off],
                                  inbounds=True, source_etype=F32), typ=sty, align=4)
                     for j in range(group)]
            while len(parts) > 1:   # concatenate pairwise: 4 + 4 -> 8, 8 + 8 -> 16
                n = parts[0].type.count
                parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(
                    ir.VectorType(I32, 2 * n), list(range(2 * n)))) for i in range(0, len(parts), 2)]
            return parts

        def walk(depth, off, flat):
            if depth < len(outer):
                v = outer[depth]
                step = group if depth == len(outer) - 1 else 1
                with L.loops.loop(i64(0), i64(ext[v] // step), f"ak.{v}") as i:
                    at = self.mul(i, i64(step))
                    walk(depth + 1, self.add(off, self.mul(S[v], at)) if v in S else off,
                         self.add(self.mul(flat, i64(ext[v])), at))
                return
            for q, x in enumerate(load(off)):
                f = self.add(self.mul(flat, i64(run)), i64(q * RUN))   # the flat K index
                step, within = b.udiv(f, i64(TILE_K)), b.urem(f, i64(TILE_K))
                at = b.add(b.mul(step, i64(PARTS * BLOCK_ROWS * TILE_K)),
                           b.add(b.mul(r, i64(TILE_K)), within))
                for part, bits in enumerate(self._split(x)):
                    ptr = b.gep(scratch, [b.add(at, i64(part * BLOCK_ROWS * TILE_K))],
                                inbounds=True, source_etype=I16)
                    b.store(bits, b.bitcast(ptr, bits.type.as_pointer()), align=2)
        walk(0, i64(0), i64(0))

    def _split(self, x):
        """``split`` in vector code: three <16 x i16> of bf16 bits."""
        b = self.b
        ity = ir.VectorType(I32, RUN)
        hty = ir.VectorType(I16, RUN)
        fty = x.type

        def splat(v, ty=ity):
            return ir.Constant(ty, [v] * RUN)

        def rne(v):
            bits = b.bitcast(v, ity)
            odd = b.and_(b.lshr(bits, splat(16)), splat(1))
            return b.lshr(b.add(b.add(bits, splat(0x7FFF)), odd), splat(16))

        def widen(h):
            return b.bitcast(b.shl(h, splat(16)), fty)

        bits = b.bitcast(x, ity)
        first = rne(x)
        first = b.select(b.icmp_unsigned("==", b.and_(first, splat(0x7F80)), splat(0x7F80)),
                         b.lshr(bits, splat(16)), first)   # (as split: no overflow to inf)
        first = b.select(b.fcmp_unordered("uno", x, x), splat(0x7FC0), first)
        rest = b.fsub(x, widen(first))
        finite = b.fcmp_ordered("==", b.fsub(rest, rest), ir.Constant(fty, [0.0] * RUN))
        rest = b.select(finite, rest, ir.Constant(fty, [0.0] * RUN))
        second = rne(rest)
        rest = b.fsub(rest, widen(second))
        third = rne(rest)
        return [b.trunc(h, hty) for h in (first, second, third)]
