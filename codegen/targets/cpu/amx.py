"""fp32 contractions on Intel AMX tiles (the ``x86_64-v4-amx`` target): bf16x6 tile products.

AMX multiplies bf16 only (``tdpbf16ps``: a 16x16 f32 tile += a 16x32 bf16 tile of A times a
32x16 one of B). An f32 splits exactly into three bf16 parts, ``x = x1 + x2 + x3``, each rounded
to nearest from what the parts before it leave (``split``), and the six part products of order
above 2**-24, ``x1y1 + x1y2 + x2y1 + x1y3 + x2y2 + x3y1``, sum to an f32-grade product: the
three left out are below 2**-25 of it (cuBLAS's bf16x9 emulation of fp32 keeps all nine). Six
tile products per f32 product pay where the tile unit runs more than six times the AVX-512
FMA rate: on Sapphire Rapids it runs up to 17 times (benchmarks/amx.py).

A contraction runs here when classify's view has B a build-time constant (``plan``):

* B is packed at build time as ``[batch][N block of 16][K step of 32][part][16 pairs][16][2]``
  bf16 (``pack_b``): one 1 KB tile per (block, step, part), pairs of K adjacent as the tile
  multiply reads them, K zero-padded to whole steps;
* A is read through affine offsets as in contraction.py. A workgroup unit splits its blocks
  of 32 rows (``unit_blocks``: 1 to 8) once, over the whole K, into a stack scratch laid out
  as tiles, ``[block][K step][part][32 rows][32]`` bf16; then for each pair of 16-column
  blocks of its up to ``MAX_N`` columns, and each block of rows,
* a 2x2 block of accumulator tiles (32 rows x 32 columns) runs the whole K. Per K step it loads
  the parts in an order that reuses each (``PRODUCTS``: 16 tile loads for 24 tile products);
* the unit's outputs go through contraction.py's epilogue (bias, activation, residual).

A's K dims go in order of their stride in A (``k_order``), so the innermost run is at unit
stride, and A is split in vectors of 16 floats: whole from a run of 16 or more, or from 4 runs
of 4 along the next K dim out (the capsule's poses ``[n, X, Y, ci, i, k]``: k, for 4 ci), so
neither the poses nor their patches are copied. A whose runs are neither is copied first with
the dims only K reads innermost (``a_layout``); a convolution's input, channels last, is read
in place.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu import mathlib
from mlpack.codegen.targets.cpu.contraction import PACK, F32, I64, _affine, _c, _Gemm, read_step
from mlpack.codegen.targets.cpu.kernels import Buffer

TILE_K = 32                 # bf16 values of K per tile row (64 bytes)
TILE_ROWS = 16              # rows of a tile (A's M, B's K pairs)
TILE_BYTES = 1024
PARTS = 3                   # bf16 parts of an f32
BLOCK_ROWS = 2 * TILE_ROWS  # M rows per unit: two A tiles
RUN = 16                    # A is split in vectors of 16 floats along its unit-stride K run
MAX_N = 512                 # columns per unit: its f32 outputs (32 x 512, 64 KB) on the stack
MAX_K = 4608                # A's parts on the stack: 32 rows x K x 3 bf16 (864 KB at most)
STACK_BYTES = 1 << 20       # a unit's scratch (A's parts and its outputs) at most
MAX_BLOCKS = 8              # 32-row blocks per unit: each B tile loaded serves them all
MIN_UNITS = 4               # ... while the units still give both cores two each
MIN_M = 2 * BLOCK_ROWS      # rows: fewer waste too much of each tile product ...
MAX_WASTE = 1.25            # ... as do rows padded to whole blocks beyond this (7x7 = 49)
MIN_K = 64
# columns: splitting a row of A costs about as much as 100 columns of its tile products, and
# the split only pays off over more (squeezenet's 64-column convolutions ran 20% slower)
MIN_N = 128
MIN_WORK = 1 << 20          # multiply-adds: below this the f32 micro-kernel is as good
# per K step, the (A part, B part) products, ordered so consecutive ones share an operand:
# A1 with B3, B2, B1; then A2 with B1, B2; then A3 with B1 (16 tile loads for 24 products)
PRODUCTS = ((0, 2), (0, 1), (0, 0), (1, 0), (1, 1), (2, 0))
# tile registers: accumulators 0-3 (2 * M tile + N tile), A's two tiles 4-5, B's two 6-7
A_TILES, B_TILES = (4, 5), (6, 7)

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


# ---------------------------------------------------------------- the split, in NumPy


def _rne_bf16(bits: np.ndarray) -> np.ndarray:
    """The bf16 nearest (ties to even) to f32s given as uint32 bits, as uint16 bits."""
    bits = bits.astype(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
            >> np.uint32(16)).astype(np.uint16)


def _widen(parts: np.ndarray) -> np.ndarray:
    return (parts.astype(np.uint32) << np.uint32(16)).view(np.float32)


def split(x: np.ndarray) -> np.ndarray:
    """``x`` (f32) as its three bf16 parts, ``[3, *x.shape]`` uint16 bits, as the kernels split
    A: each part the nearest bf16 to what the parts before it leave (the first one truncated
    where rounding would overflow). A NaN is a quiet NaN in the first part, an infinity is the
    first part alone; finite values are exact sums."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((PARTS, *x.shape), np.uint16)
    bits = x.view(np.uint32)
    first = _rne_bf16(bits)
    # a finite value within half a bf16 step of the largest f32 would round to infinity:
    # truncated instead (an infinity truncates to itself)
    first = np.where(first & 0x7F80 == 0x7F80, (bits >> np.uint32(16)).astype(np.uint16), first)
    out[0] = np.where(np.isnan(x), np.uint16(0x7FC0), first)
    with np.errstate(invalid="ignore", over="ignore"):
        rest = x - _widen(out[0])
        rest = np.where(rest - rest == 0, rest, np.float32(0)).astype(np.float32)
        for p in range(1, PARTS):
            out[p] = _rne_bf16(rest.view(np.uint32))
            rest = (rest - _widen(out[p])).astype(np.float32)
    return out


def join(parts: np.ndarray) -> np.ndarray:
    """The f32 values of ``split``'s parts (their sum, in f64): for tests."""
    return sum(_widen(p).astype(np.float64) for p in parts)


def pack_b(blocked: np.ndarray) -> np.ndarray:
    """contraction.pack_b's ``[batch, N blocks, K, 16]`` f32 as the tiles the kernel loads:
    ``[batch, N blocks, K steps, part, 16 pairs, 16 columns, 2]`` bf16 bits, K zero-padded."""
    bsz, nb, k, lanes = blocked.shape
    steps = -(-k // TILE_K)
    padded = np.zeros((bsz, nb, steps * TILE_K, lanes), np.float32)
    padded[:, :, :k] = blocked
    parts = split(padded).reshape(PARTS, bsz, nb, steps, TILE_ROWS, 2, lanes)
    return np.ascontiguousarray(parts.transpose(1, 2, 3, 0, 4, 6, 5))


# ---------------------------------------------------------------- where it applies


def k_order(read: Expr, buf: Buffer, kdims: list[str], extents: dict[str, int],
            layout=None) -> tuple[list[str], int, int] | None:
    """(the K dims in order of their stride in A, how many innermost ones form its unit-stride
    run, sub-runs per vector) for A read by ``read`` from ``buf`` laid out as ``layout``; None
    when the vectors of ``RUN`` floats cannot be loaded whole or from ``RUN // run`` equal runs
    (at least 4 floats each) along the next K dim out."""
    aff = {}
    for d, ix in zip(read.arg[1], read.args):
        aff[d] = _affine(ix, set(kdims) | set(ex.free_vars(ix)))
        if aff[d] is None:
            return None
    step = {v: read_step(aff, buf, v, layout) for v in kdims}
    if not all(s.is_const for s in step.values()):
        return None
    order = sorted(kdims, key=lambda v: -step[v].value)
    run, dims = 1, 0
    for v in reversed(order):
        if step[v].value != run or run % RUN == 0:
            break
        run *= extents[v]
        dims += 1
    if run % RUN == 0:
        return order, dims, 1
    group = RUN // run
    if run < 4 or RUN % run or dims == len(order) or extents[order[-dims - 1]] % group:
        return None
    return order, dims, group


def a_layout(read: Expr, buf: Buffer, kdims: list[str]) -> tuple[str, ...]:
    """``buf``'s layout with the dims that only K vars index moved innermost (in their order):
    then A's rows step over the others and its K runs are the longest the data allows."""
    only_k = []
    for d, ix in zip(read.arg[1], read.args):
        used = ex.free_vars(ix)
        if used and used <= set(kdims):
            only_k.append(d)
    return tuple([d for d in buf.layout if d not in only_k] +
                 [d for d in buf.layout if d in only_k])


def plan(info: dict, bufs: dict[str, Buffer], extents: dict[str, int],
         out_inner: str | None) -> tuple | None:
    """For a contraction whose B is a build-time constant (classify's ``const`` mode) on an AMX
    target: (the layout A should have, or None for its own) when it runs on tiles; None when
    it does not: too small, its output's unit-stride dim (``out_inner``) not among the
    columns (the epilogue would store across them), or A's K not readable in whole vectors
    in any layout."""
    if out_inner not in info["n"]:
        return None
    ms, ns, ks = info["m_size"], info["n_size"], info["k_size"]
    if not (ns.is_const and ks.is_const) or ns.value < MIN_N or not MIN_K <= ks.value <= MAX_K:
        return None
    if ms.is_const and (ms.value < MIN_M or ms.value * ns.value * ks.value < MIN_WORK
                        or -(-ms.value // BLOCK_ROWS) * BLOCK_ROWS > MAX_WASTE * ms.value):
        return None
    read = info["a"]
    buf = bufs[read.arg[0]]
    if read.arg[2] is None and k_order(read, buf, info["k"], extents) is not None:
        return (None,)   # A is read in place
    layout = a_layout(read, buf, info["k"])
    if k_order(read, buf, info["k"], extents, layout) is None:
        return None
    return (layout,)


def unit_blocks(k_steps: int, tb: int, m_size: Expr, others: Expr) -> int:
    """32-row blocks per workgroup unit: as many as fit the stack budget while the units
    (``others``: units per row block, N tiles times batch) number at least MIN_UNITS. B's
    panel is read from beyond L2 once per unit, so more rows per unit read it less often (the
    capsule's 3.5 MB of B parts once per 32 rows streamed more bytes than its tile products
    took time; squeezenet's last convolution, 169 rows, ran 1.6x slower in 32-row units)."""
    per = k_steps * PARTS * BLOCK_ROWS * TILE_K * 2 + BLOCK_ROWS * tb * PACK * 4
    best = 1
    for g in range(2, MAX_BLOCKS + 1):
        if g * per > STACK_BYTES:
            break
        if m_size.is_const and others.is_const and \
                -(-m_size.value // (g * BLOCK_ROWS)) * others.value < MIN_UNITS:
            break
        best = g
    return best


# ---------------------------------------------------------------- lowering


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


class AmxGemm(_Gemm):
    """Emits an AMX gemm kernel's body (see the module docstring)."""

    def _intr(self, name: str, *args: ir.Type) -> ir.Function:
        return mathlib.declare(self.b.module, f"llvm.x86.{name}",
                               ir.FunctionType(ir.VoidType(), list(args)))

    def _tile(self, name: str, *regs: int, ptr=None, stride: int = 64) -> None:
        ops = [ir.Constant(I8, r) for r in regs]
        if ptr is None:
            self.b.call(self._intr(name, *[I8] * len(regs)), ops)
        else:
            self.b.call(self._intr(name, I8, ir.PointerType(), I64), [*ops, ptr, _c(stride)])

    def emit(self) -> None:
        L, b, E, c = self.L, self.b, self.E, self.c
        osz = E.sizes[L.out.name]
        c0, S = self._offsets(c.a)
        self.n_size = E(c.n_size)
        blocks = E(c.blocks)
        steps = c.k_steps
        tile_n = c.tb * PACK
        nblk = c.group * c.mr // BLOCK_ROWS   # 32-row blocks per unit
        rows = nblk * BLOCK_ROWS
        per_blk = steps * PARTS * BLOCK_ROWS * TILE_K   # one block's parts, in bf16
        scratch = b.alloca(ir.ArrayType(I16, nblk * per_blk), name="aparts")
        scratch.align = 64
        cbuf = b.alloca(ir.ArrayType(F32, rows * tile_n), name="cbuf")
        cbuf.align = 64
        b.call(self._intr("ldtilecfg", ir.PointerType()), [_tile_config(b.module)])
        m_size = self._size(c.m, osz)
        mgroups = b.udiv(self.add(m_size, _c(rows - 1)), _c(rows))
        ntiles = b.udiv(self.add(blocks, _c(c.tb - 1)), _c(c.tb))
        start, end = self._share(self.mul(self.mul(self._size(c.batch, osz), ntiles), mgroups))
        A, packed = E.bases[c.a.arg[0]], E.bases[c.packed]
        last = b.sub(m_size, _c(1))
        if c.k_size.value % TILE_K:   # the last step's columns past K: zero in every row
            zty = ir.VectorType(I16, TILE_K)
            tail = PARTS * BLOCK_ROWS   # rows of 32 bf16 in a step's parts
            with L.loops.loop(_c(0), _c(nblk * tail), "zero") as z:
                at = b.add(b.mul(b.udiv(z, _c(tail)), _c(per_blk)),
                           b.add(_c((steps - 1) * tail * TILE_K), b.mul(b.urem(z, _c(tail)),
                                                                       _c(TILE_K))))
                ptr = b.gep(scratch, [_c(0), at], inbounds=True)
                b.store(ir.Constant(zty, [0] * TILE_K), b.bitcast(ptr, zty.as_pointer()), align=2)
        with L.loops.loop(start, end, "unit") as u, E.scope():
            mg, nt, bi, base = self._unit(u, mgroups, ntiles, c0, S)
            m0 = b.mul(mg, _c(rows))
            # the unit's blocks that hold rows of M (the last unit's may not all)
            used = self.umin(_c(nblk), b.udiv(b.add(b.sub(m_size, m0), _c(BLOCK_ROWS - 1)),
                                              _c(BLOCK_ROWS)))
            with L.loops.loop(_c(0), b.mul(used, _c(BLOCK_ROWS)), "arow") as r:
                m = self.umin(b.add(m0, r), last)
                row = b.gep(A, [self._row_offset(base, m, S, osz)], inbounds=True,
                            source_etype=F32)
                blk = b.gep(scratch, [_c(0), b.mul(b.udiv(r, _c(BLOCK_ROWS)), _c(per_blk))],
                            inbounds=True)
                self._split_row(row, b.urem(r, _c(BLOCK_ROWS)), blk, S)
            blk0 = b.mul(nt, _c(c.tb))   # the unit's column blocks, in pairs
            pairs = b.udiv(b.add(self.umin(_c(c.tb), b.sub(blocks, blk0)), _c(1)), _c(2))
            last_blk = b.sub(blocks, _c(1))
            with L.loops.loop(_c(0), pairs, "npair") as p:
                j0 = b.add(blk0, b.mul(p, _c(2)))
                j1 = self.umin(b.add(j0, _c(1)), last_blk)   # (a lone last block: not stored)
                panels = [b.gep(packed, [b.mul(b.add(b.mul(bi, blocks), j),
                                               _c(steps * PARTS * TILE_BYTES // 2))],
                                inbounds=True, source_etype=I16) for j in (j0, j1)]
                col = b.mul(p, _c(2 * PACK))
                # every block of rows uses the pair's B tiles while they are in cache
                with L.loops.loop(_c(0), used, "ablk", unroll=False) as g:
                    for acc in range(4):
                        self._tile("tilezero", acc)
                    self._k_steps(b.gep(scratch, [_c(0), b.mul(g, _c(per_blk))], inbounds=True),
                                  panels, steps)
                    row0 = b.mul(g, _c(BLOCK_ROWS * tile_n))
                    for mt in range(2):
                        for nt_ in range(2):
                            at = b.add(b.add(row0, col), _c(mt * TILE_ROWS * tile_n + nt_ * PACK))
                            self._tile("tilestored64", 2 * mt + nt_, ptr=b.gep(
                                cbuf, [_c(0), at], inbounds=True), stride=tile_n * 4)
            tile = b.gep(cbuf, [_c(0), _c(0)], inbounds=True)
            self._epilogue(tile, m0, m_size, nt, osz)
        b.call(self._intr("tilerelease"), [])
        b.ret_void()
        L.loops_md(L.loops.latches)

    def _k_steps(self, scratch, panels, steps: int) -> None:
        """The K loop of one 2x2 block of accumulator tiles: six part products per step."""
        b, L = self.b, self.L
        with L.loops.loop(_c(0), _c(steps), "kstep", unroll=False) as ks:
            a = b.gep(scratch, [b.mul(ks, _c(PARTS * BLOCK_ROWS * TILE_K))], inbounds=True,
                      source_etype=I16)
            bs = [b.gep(pan, [b.mul(ks, _c(PARTS * TILE_BYTES // 2))], inbounds=True,
                        source_etype=I16) for pan in panels]
            held_a = held_b = None
            for pa, pb in PRODUCTS:
                if pa != held_a:
                    for mt, reg in enumerate(A_TILES):
                        self._tile("tileloadd64", reg, ptr=b.gep(a, [_c(
                            (pa * BLOCK_ROWS + mt * TILE_ROWS) * TILE_K)], source_etype=I16))
                    held_a = pa
                if pb != held_b:
                    for nt, reg in enumerate(B_TILES):
                        self._tile("tileloadd64", reg, ptr=b.gep(
                            bs[nt], [_c(pb * TILE_BYTES // 2)], source_etype=I16))
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
                return [b.load(b.gep(row, [self.add(off, _c(q * RUN))], inbounds=True,
                                     source_etype=F32), typ=vty, align=4)
                        for q in range(run // RUN)]
            v = outer[-1]
            sty = ir.VectorType(F32, run)
            parts = [b.load(b.gep(row, [self.add(off, self.mul(S[v], _c(j))) if v in S else off],
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
                with L.loops.loop(_c(0), _c(ext[v] // step), f"ak.{v}") as i:
                    at = self.mul(i, _c(step))
                    walk(depth + 1, self.add(off, self.mul(S[v], at)) if v in S else off,
                         self.add(self.mul(flat, _c(ext[v])), at))
                return
            for q, x in enumerate(load(off)):
                f = self.add(self.mul(flat, _c(run)), _c(q * RUN))   # the flat K index
                step, within = b.udiv(f, _c(TILE_K)), b.urem(f, _c(TILE_K))
                at = b.add(b.mul(step, _c(PARTS * BLOCK_ROWS * TILE_K)),
                           b.add(b.mul(r, _c(TILE_K)), within))
                for part, bits in enumerate(self._split(x)):
                    ptr = b.gep(scratch, [b.add(at, _c(part * BLOCK_ROWS * TILE_K))],
                                inbounds=True, source_etype=I16)
                    b.store(bits, b.bitcast(ptr, bits.type.as_pointer()), align=2)
        walk(0, _c(0), _c(0))

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
