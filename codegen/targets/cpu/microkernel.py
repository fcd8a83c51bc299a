"""The GEMM micro-kernel in LLVM IR: ``GemmEmitter`` emits a gemm kernel's body (contraction.py
scheduled it; gemm.Contraction says how).

The micro-kernel keeps an ``MR x (TB*PACK)`` tile of outputs in vector registers (the target's
register budget decides MR and TB), and per step of the K loop loads the tile's B vectors once,
broadcasts MR scalars of A and does MR*TB*PACK/VL fused multiply-adds. Rows past the end of M
read a clamped row and are not stored; columns past N read the zero padding and are not
stored. After the K loop the tile goes to a stack buffer and a loop over its valid rows and
columns applies the kernel's epilogue and stores (tileepilogue.py): per tile, where K is one
chunk and the tile's rows are the epilogue's outer loop, else once for the unit's group.

Workgroup units are tiles ordered (batch, N tile, M tile) with the M tile fastest, so a
workgroup's contiguous range of units reuses one packed B panel from cache.
"""

from __future__ import annotations

from functools import reduce

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.llvm.intrinsics import (declare, intrinsic, line_alloca, load_masked_f32, splat,
                                            umin)
from mlpack.codegen.llvm.loops import delinearize
from mlpack.codegen.llvm import halfconv
from mlpack.codegen.llvm.types import BF16, F32, I8, I16, I32, I64, i64
from mlpack.codegen.targets.cpu.gemm import (BYTE_OPERANDS, PACK, PAIR_PRODUCTS, QUAD, SIGNED_A,
                                            Contraction)
from mlpack.codegen.targets.cpu.indexing import affine
from mlpack.codegen.targets.cpu.kernel import share
from mlpack.codegen.targets.cpu.tileepilogue import tile_epilogue

PREFETCH_ROWS = 48           # K steps ahead a streamed B panel is fetched (MnasNet's 1280 x
                             # 1000 classifier from L3 on Zen 5: 0.12 ms at 16, 0.09-0.10 at
                             # 48 and 96; alexnet's from memory alike; non-temporal 45% slower)
A_LINE = 16                  # f32 elements of A a K step fetches ahead (a 64-byte line)


class GemmEmitter:
    """Emits a gemm kernel's body into a KernelLowering (lower.py) whose entry block is
    current: ``L`` gives the kernel, the builder, its scalar emitter and loops, and stores
    through the kernel's epilogue."""

    def __init__(self, L, wg, count):
        self.L, self.b, self.E = L, L.b, L.E
        self.c: Contraction = L.k.gemm
        self.wg, self.count = wg, count
        # an int8 contraction (codegen/precisions/int8.py) sums u8 x s8 products in i32 lanes
        self.int = L.k.acc_dtype == "i32"
        self.ety = I32 if self.int else F32
        self.vty = ir.VectorType(self.ety, self.c.vl)
        # a build-time panel of 16-bit weights (precisions/weights16.py) is read in its dtype
        # and widened per vector: half the bytes through the caches for two more instructions
        self.bdt = L.E.buffers[self.c.packed].dtype
        # (AMX: amxkernel.py)
        self.bety = {"bf16": I16, "f16": ir.HalfType(), "i8": I8}.get(self.bdt, F32)
        # A in bf16 (bf16dot.py's rounded activations): paired with B for vdpbf16ps along
        # c.pair, else widened per element
        self.adt = L.E.buffers[self.c.a.arg[0]].dtype
        self.aety = {"bf16": I16, "u16": I16, "u8": I8}.get(self.adt, F32)
        self.slice = None   # the next K chunk's panel slice this tile fetches (_next_slices)
        self.fetch_base = None   # ... where a step's panel offset is taken from (_prefetch)

    # small integer helpers (operands i64)
    def add(self, x, y):
        if isinstance(y, ir.Constant) and y.constant == 0:
            return x
        if isinstance(x, ir.Constant) and x.constant == 0:
            return y
        if isinstance(x, ir.Constant) and isinstance(y, ir.Constant):
            return ir.Constant(x.type, x.constant + y.constant)
        return self.b.add(x, y, flags=("nsw",))

    def mul(self, x, y):
        if isinstance(y, ir.Constant) and y.constant == 1:
            return x
        if isinstance(x, ir.Constant) and x.constant == 1:
            return y
        if isinstance(x, ir.Constant) and isinstance(y, ir.Constant):
            return ir.Constant(x.type, x.constant * y.constant)
        return self.b.mul(x, y, flags=("nsw",))

    def umin(self, x, y):
        return umin(self.b, x, y)

    def share(self, units):
        """This workgroup's [start, end) of ``units`` (the count shared out evenly)."""
        return share(self.b, self.L.k, units, self.wg, self.count)

    def unit(self, u, mgroups, ntiles, c0, S, n_inner: bool = False, points=None):
        """(M group, N tile, batch point, A's offset there) of unit ``u``, the M groups walked
        fastest (or the N tiles, ``n_inner``; or the ``points`` of the batch, c.batch_inner);
        binds the batch dims."""
        b, c, E = self.b, self.c, self.E
        if c.batch_inner:
            bi, rest = b.urem(u, points), b.udiv(u, points)
            mg, nt = b.urem(rest, mgroups), b.udiv(rest, mgroups)
        elif n_inner:
            nt, rest = b.urem(u, ntiles), b.udiv(u, ntiles)
            mg, bi = b.urem(rest, mgroups), b.udiv(rest, mgroups)
        else:
            mg, rest = b.urem(u, mgroups), b.udiv(u, mgroups)
            nt, bi = b.urem(rest, ntiles), b.udiv(rest, ntiles)
        self.L.bind_unit(bi, c.batch)
        base = c0
        for d in c.batch:
            if d in S:
                base = self.add(base, self.mul(S[d], E.lookup(d)))
        return mg, nt, bi, base

    def row_offset(self, base, m, S, osz):
        """A's offset at flat row ``m`` (over the M dims) from ``base``, its batch point's: one
        product where A steps each M dim by the next one's whole extent (a channels-last
        image's pixels), else a division per dim."""
        step = _flat_step(self.c.m, S, osz)
        if step is not None:
            return self.add(base, self.mul(step, m))
        off = base
        for d, v in delinearize(self.b, m, self.c.m, osz).items():
            if d in S:
                off = self.add(off, self.mul(S[d], v))
        return off

    def dims_size(self, dims, osz):
        """The product of the output's sizes along ``dims`` (i64)."""
        n = i64(1)
        for d in dims:
            n = self.mul(n, osz[d])
        return n

    def offsets(self, read: Expr):
        """(constant part, {loop var: stride}) of ``read``'s flat element offset:
        c0 + sum_v S_v * v, with S_v = sum_d stride_d * coeff(ix_d, v)."""
        L, E = self.L, self.E
        name = read.arg[0]
        index = dict(zip(read.arg[1], read.args))
        loop = set(L.out.layout) | set(L.k.rdims)
        S: dict[str, ir.Value] = {}
        c0 = i64(0)
        for d, stride in zip(L.buffers[name].layout, E.strides[name]):
            coeffs, k0 = affine(index[d], loop)
            if not (k0.is_const and k0.value == 0):
                c0 = self.add(c0, self.mul(E.cast(E(k0), k0.dtype, "i64"), stride))
            for v, cf in coeffs.items():
                S[v] = self.add(S.get(v, i64(0)), self.mul(i64(cf), stride))
        return c0, S

    def emit(self) -> None:
        L, b, E, c = self.L, self.b, self.E, self.c
        osz = E.sizes[L.out.name]
        a_name = c.a.arg[0]
        c0, S = self.offsets(c.a)
        # B read in place: its offset is c0_b + sum S_b[v] * v (S_b[n] == 1); packed: panels
        self.SB = None
        if c.b_direct is not None:
            cb0, self.SB = self.offsets(c.b_direct)
        n_size, k_size, blocks = E(c.n_size), E(c.k_size), E(c.blocks)
        self.n_size = n_size
        self.kext = {r: E(L.k.rdims[r]) for r in c.k}
        self.loops = c.k_loops
        for run in self.loops:   # a run of K dims loops as one: its extent, A's step its last's
            if len(run) > 1:
                self.kext[run] = self.dims_product(run)
                S[run] = S.get(run[-1], i64(0))
                if self.SB is not None:
                    self.SB[run] = self.SB.get(run[-1], i64(0))
        ntiles = b.udiv(self.add(blocks, i64(c.tb - 1)), i64(c.tb))
        zero_vec = ir.Constant(self.vty, [0 if self.int else 0.0] * c.vl)
        per_block = PACK // c.vl
        nv = self.nv = c.nvec or c.tb * per_block
        accs = [b.alloca(self.vty, name=f"acc{i}") for i in range(c.mr * nv)]
        tile_n = c.tb * PACK
        # the group's outputs between K chunks (and for the epilogue): [G][MR][tile_n]
        cbuf = line_alloca(b, ir.ArrayType(self.ety, c.group * c.mr * tile_n), "cbuf")
        tile = b.gep(cbuf, [i64(0), i64(0)], inbounds=True)   # (the epilogue's first row)
        m_size = self.dims_size(c.m, osz)
        # one M group: each B panel is read once per run, from memory (a fully connected
        # layer at batch 1, a late convolution's 7x7 image): the hardware prefetcher alone
        # leaves the loads waiting (alexnet's fc6 15.4 -> 13.8 ms with it)
        self.stream_b = self.SB is None and c.stream
        # (c.stream counts a dynamic batch as one; B read in place is never "streamed")
        self.one_group = c.stream or (isinstance(m_size, ir.Constant)
                                      and m_size.constant <= c.group * c.mr)
        mtiles = b.udiv(self.add(m_size, i64(c.mr - 1)), i64(c.mr))
        mgroups = b.udiv(self.add(mtiles, i64(c.group - 1)), i64(c.group))
        points = self.dims_size(c.batch, osz)
        start, end = self.share(self.mul(self.mul(points, ntiles), mgroups))
        packed = L.E.bases[c.packed]
        A = L.E.bases[a_name]
        last = b.sub(m_size, i64(1))
        k0 = self.kext[self._key(self.loops[0])]
        if L.k.bounded is not None:   # (a causal block's P.V: its keys up to its last query)
            k0 = self.umin(k0, E(L.k.bounded[1]))
        nchunks = b.udiv(self.add(k0, i64(c.kc - 1)), i64(c.kc))
        panel_size = self.mul(k_size, i64(PACK))
        # no tile straddles two runs of M's fastest dim of a multiple of its height: its rows
        # are its first plus constant steps (tileshape.row_runs)
        run = osz[c.m[-1]] if c.m else None
        run_step = S.get(c.m[-1], i64(0)) if isinstance(run, ir.Constant) and \
            run.constant % c.mr == 0 else None

        def cvec(g, r, q):
            p = b.gep(cbuf, [i64(0), self.add(b.mul(g, i64(c.mr * tile_n)), i64(r * tile_n + q * c.vl))],
                      inbounds=True)
            return b.bitcast(p, self.vty.as_pointer())

        with L.loops.loop(start, end, "unit") as u, E.scope():
            mg, nt, bi, base = self.unit(u, mgroups, ntiles, c0, S, c.n_inner, points)
            t0 = b.mul(mg, i64(c.group))
            ng = self.umin(i64(c.group), b.sub(mtiles, t0))
            blk0 = b.mul(nt, i64(c.tb))
            last_blk = b.sub(blocks, i64(1))
            panels = []
            if self.SB is not None:
                bbase = cb0
                for d in c.batch:
                    if d in self.SB:
                        bbase = self.add(bbase, self.mul(self.SB[d], E.lookup(d)))
            self.bmasks = None
            if c.b_masked:   # columns past N: masked off (their memory may be past B's end)
                ity = ir.VectorType(I64, c.vl)
                nsplat = splat(b, n_size, ity)
                col0 = b.mul(blk0, i64(PACK))
                csplat = splat(b, col0, ity)
                self.bmasks = [b.icmp_signed("<", b.add(csplat, ir.Constant(
                    ity, [q * c.vl + i for i in range(c.vl)])), nsplat) for q in range(nv)]
            # a tile's panels at constant steps from its first where every tile is whole: one
            # base register and displacements in the K loop, where a pointer per panel held a
            # register each (with the rows', GoogLeNet's 6x4 tiles ran out of registers and
            # spilled accumulators)
            whole = isinstance(blocks, ir.Constant) and blocks.constant % c.tb == 0
            for j in range(c.tb):
                if whole and j:
                    step = i64(j * PACK) if self.SB is not None else self.mul(panel_size, i64(j))
                    panels.append(b.gep(panels[0], [step], inbounds=True,
                                        source_etype=self.bety))
                    continue
                blk = self.umin(self.add(blk0, i64(j)), last_blk)
                if self.SB is not None:   # (blocks past the end repeat the last, not stored)
                    at = self.add(bbase, b.mul(blk, i64(PACK)))
                else:
                    at = b.mul(self.add(b.mul(bi, blocks), blk), panel_size)
                panels.append(b.gep(packed, [at], inbounds=True, source_etype=self.bety))
            # one K chunk (a short K, a 1x1 convolution's): each tile starts from zero in its
            # registers and goes to the buffer once, instead of through it per chunk
            single = self._single_chunk()
            # each tile's outputs stored right after its K loop, where its rows are its
            # epilogue's outer loop (the output's unit stride along N): their cache misses
            # overlap the next tile's multiply-adds instead of coming in one burst a group
            per_tile = single and L.out.contiguous_dim() not in c.m
            starts = [zero_vec] * nv
            if c.init is not None:   # SDOT's correction, per column (gemm.signed_correction)
                base_init = L.E.bases[c.init]
                starts = []
                for j in range(c.tb):
                    blk = self.umin(self.add(blk0, i64(j)), last_blk)
                    at = b.mul(self.add(b.mul(bi, blocks), blk), i64(PACK))
                    for q in range(per_block):
                        p = b.gep(base_init, [self.add(at, i64(q * c.vl))], inbounds=True,
                                  source_etype=I32)
                        starts.append(b.load(p, typ=self.vty, align=4))
            if not single:
                with L.loops.loop(i64(0), ng, "zero") as g:
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(starts[q], cvec(g, r, q), align=4)
            # K in chunks (of the outermost K dim) outside the group's tiles: the chunk of the
            # B panel and the A rows it touches stay in L1 while every tile of the group uses them
            with L.loops.loop(i64(0), nchunks, "chunk") as ch:
                lo = b.mul(ch, i64(c.kc))
                hi = self.umin(b.add(lo, i64(c.kc)), k0)
                ahead = self._next_slices(panels, ch, nchunks, lo, hi, panel_size)
                with L.loops.loop(i64(0), ng, "mtile") as g:
                    # tile g fetches panel g's slice as it reads its own (those past the
                    # panels their own first panel again, from L1)
                    self.slice = self.fetch_base = None if ahead is None else reduce(
                        lambda p, j: b.select(b.icmp_unsigned("==", g, i64(j)), ahead[j], p),
                        range(len(ahead)), panels[0])
                    m0 = b.mul(b.add(t0, g), i64(c.mr))
                    at = self.row_offset(base, m0, S, osz) if run_step is not None else None
                    offs = [self.add(at, self.mul(run_step, i64(r))) if at is not None else
                            self.row_offset(base, self.umin(self.add(m0, i64(r)), last), S, osz)
                            for r in range(c.mr)]
                    if at is not None:   # (as the panels: steps from the first row)
                        first = b.gep(A, [at], inbounds=True, source_etype=self.aety)
                        rows = [first] + [b.gep(first, [self.mul(run_step, i64(r))],
                                                inbounds=True, source_etype=self.aety)
                                          for r in range(1, c.mr)]
                    else:
                        rows = [b.gep(A, [o], inbounds=True, source_etype=self.aety)
                                for o in offs]
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(starts[q] if single else b.load(cvec(g, r, q), align=4),
                                    accs[r * nv + q])
                    def k_loop(rows, accs):
                        self._k_loop(0, i64(0), i64(0), i64(0), rows, panels, accs, S, (lo, hi))
                    if c.tail_rows:   # M's last rows: a K loop of those rows alone
                        tail = b.icmp_unsigned("==", b.sub(m_size, m0), i64(c.tail_rows))
                        with b.if_else(tail) as (few, more):
                            with few:
                                k_loop(rows[:c.tail_rows], accs[:c.tail_rows * nv])
                            with more:
                                k_loop(rows, accs)
                    else:
                        k_loop(rows, accs)
                    slot = i64(0) if per_tile else g   # (one tile's buffer, kept in L1)
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(b.load(accs[r * nv + q]), cvec(slot, r, q), align=4)
                    if per_tile:
                        self.epilogue(tile, m0, m_size, nt, osz, c.mr)
            if not per_tile:
                self.epilogue(tile, b.mul(t0, i64(c.mr)), m_size, nt, osz, c.group * c.mr)
        b.ret_void()
        L.loops_md(L.loops.latches, L.loops.unroll)

    def _next_slices(self, panels, ch, nchunks, lo, hi, panel_size):
        """Where B's panels come from beyond L2 (``c.fetch_ahead``), where each panel's slice
        for the next K chunk begins (the next N tile's first chunk after the last), moved back
        by this chunk's first step (a step's offsets count from the panel's start); else None.
        The group's first tile waited on each chunk's slice from memory: GPT-2 small's FFN
        GEMMs at 128 tokens 2.75 -> 2.52 and 2.69 -> 2.38 ms at 1 thread with these fetches."""
        c, b = self.c, self.b
        if not c.fetch_ahead or self.SB is not None:
            return None
        inner = self.dims_product([r for run in self.loops[1:] for r in run])
        more = b.icmp_unsigned("<", b.add(ch, i64(1)), nchunks)
        at = b.select(more, self.mul(self.mul(hi, inner), i64(PACK)),
                      self.mul(panel_size, i64(c.tb)))
        at = b.sub(at, self.mul(self.mul(lo, inner), i64(PACK)))
        return [b.gep(p, [at], source_etype=self.bety) for p in panels]

    def _single_chunk(self) -> bool:
        """Whether the outermost K loop fits one chunk, known at build time."""
        ext = ex.product([self.L.k.rdims[r] for r in self.loops[0]])
        return ext.is_const and ext.value <= self.c.kc

    def dims_product(self, dims):
        """The product of the K extents of ``dims`` (i64)."""
        n = i64(1)
        for d in dims:
            n = self.mul(n, self.kext[d])
        return n

    @staticmethod
    def _key(run: tuple[str, ...]):
        """A K loop's key in kext, S and SB: its dim, or the run's tuple."""
        return run[0] if len(run) == 1 else run

    def _k_loop(self, depth: int, off, kflat, boff, rows, panels, accs, S, span) -> None:
        """Nested loops over the K dims (the outermost over ``span``); the innermost body is
        the micro-kernel step. ``off``: A's offset, ``kflat``: the flat K index (packed B),
        ``boff``: B's offset from the panel (B read in place)."""
        c, b, L = self.c, self.b, self.L
        if depth < len(self.loops):
            r = self._key(self.loops[depth])
            ext, label = self.kext[r], "_".join(self.loops[depth])
            lo, hi = span if depth == 0 else (i64(0), ext)
            if r == c.pair:   # two (four) K steps at once: i runs over the groups' first ones
                shift = c.pair_size.bit_length() - 1
                half = lambda v: b.lshr(v, i64(shift))  # noqa: E731 (extents are multiples)
                with L.loops.loop(half(lo), half(hi), f"k.{label}", unroll=False) as i2:
                    i = b.shl(i2, i64(shift))
                    self._k_loop(depth + 1, self.add(off, self.mul(S[r], i)) if r in S else off,
                                 self.add(self.mul(kflat, half(ext)), i2), boff, rows, panels,
                                 accs, S, span)
                return
            if depth == len(self.loops) - 1 and c.pair is None and not self.int:
                self._innermost(r, label, lo, hi, off, kflat, ext, boff, rows, panels, accs, S)
                return
            with L.loops.loop(lo, hi, f"k.{label}", unroll=False) as i:
                nb = boff
                if self.SB is not None and r in self.SB:
                    nb = self.add(boff, self.mul(self.SB[r], i))
                self._k_loop(depth + 1, self.add(off, self.mul(S[r], i)) if r in S else off,
                             self.add(self.mul(kflat, ext), i), nb, rows, panels, accs, S, span)
            return
        if c.pair is not None:
            (self._quad_step if self.int else self._dot_step)(kflat, off, rows, panels, accs)
            return
        if self.int:
            self._int_step(kflat, off, rows, panels, accs)
            return
        self._fma_step(boff if self.SB is not None else b.mul(kflat, i64(PACK)), off, rows,
                       panels, accs)

    def _innermost(self, r, label, lo, hi, off, kflat, ext, boff, rows, panels, accs, S):
        """The innermost K loop (over ``r`` from ``lo`` to ``hi``) of a multiply-add tile, its
        rows and panels advanced to its first step before it and walked by two offsets
        carried beside its counter (Loops.carrying): A's by its stride along ``r``, B's by a
        packed step (or B's stride, read in place)."""
        b = self.b
        a_step = S.get(r, i64(0))
        if self.SB is not None:
            b_step = self.SB.get(r, i64(0))
            b0 = self.add(boff, self.mul(b_step, lo))
        else:
            b_step = i64(PACK)
            b0 = self.mul(self.add(self.mul(kflat, ext), lo), i64(PACK))
        a0 = self.add(off, self.mul(a_step, lo))
        rows = [b.gep(row, [a0], inbounds=True, source_etype=self.aety) for row in rows]
        panels = [b.gep(p, [b0], inbounds=True, source_etype=self.bety) for p in panels]
        ahead = self._next_rows(rows, S, a_step, ext)
        # (the step's offsets count from b0 here: so does the next chunk's slice it fetches)
        self.fetch_base = None if self.slice is None else b.gep(self.slice, [b0],
                                                                source_etype=self.bety)
        with self.L.loops.carrying(lo, hi, f"k.{label}", [(i64(0), a_step),
                                                          (i64(0), b_step)]) as (_, (ao, bo)):
            if ahead is not None:   # a line of the next tile's rows per step
                self._fetch(b.gep(ahead, [self.mul(ao, i64(A_LINE))], source_etype=self.aety))
            self._fma_step(bo, ao, rows, panels, accs)

    def _next_rows(self, rows, S, a_step, ext):
        """Where the next tile's rows of A begin, for a tile whose rows lie one after another,
        each its whole K at unit stride (activations channels last, or a MatMul's rows: one K
        loop of ``ext`` steps), and are read once per run (N is one tile; M more than one
        group: one group's A stays in L1); else None. Fetched a line per K step ahead of use,
        the next tile being the next one run: a 1x1 convolution of 32 -> 16 channels on
        112x112 pixels waited on its rows (0.82 -> 1.0 of ONNX Runtime's speed). Where N has
        several tiles, A's rows are read again for each, from cache, and the fetches made
        DistilBERT's GEMMs 5-10% slower."""
        c = self.c

        def const(v, n=None) -> bool:
            return isinstance(v, ir.Constant) and (n is None or v.constant == n)
        if (self.one_group or len(self.loops) != 1 or not c.m or c.m[-1] not in S
                or self.adt != "f32" or not (c.ntiles.is_const and c.ntiles.value == 1)
                or not const(a_step, 1) or not const(ext)
                or not const(S[c.m[-1]], ext.constant)):
            return None
        return self.b.gep(rows[0], [self.mul(S[c.m[-1]], i64(c.mr))], source_etype=self.aety)

    def _fetch(self, ptr, locality: int = 3) -> None:
        """A prefetch of ``ptr``'s line into L1 (``locality`` 3; 2: L2) (a read; no fault
        where it is past the end)."""
        b = self.b
        pf = declare(b.module, "llvm.prefetch.p0", ir.FunctionType(
            ir.VoidType(), [ir.PointerType(), I32, I32, I32]))
        b.call(pf, [ptr, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)])

    def _fma_step(self, kp, off, rows, panels, accs) -> None:
        """One K step of multiply-adds: B's vectors at ``kp`` of each panel, A's scalar at
        ``off`` of each row broadcast, acc += a * b."""
        c, b = self.c, self.b
        per_block = PACK // c.vl
        bv = []
        for j in range(c.tb):
            for q in range(per_block):
                p = b.gep(panels[j], [self.add(kp, i64(q * c.vl))], inbounds=True,
                          source_etype=self.bety)
                if self.bmasks is not None:
                    bv.append(load_masked_f32(b, p, self.vty, self.bmasks[j * per_block + q]))
                elif self.bdt == "f32":
                    bv.append(b.load(p, typ=self.vty, align=4))
                else:
                    bv.append(halfconv.widen_vector(b, b.load(p, typ=ir.VectorType(
                        self.bety, c.vl), align=2), self.bdt, self.vty))
        bv = bv[:self.nv]   # (a narrow N's zero columns are not multiplied)
        self._prefetch(panels, kp, PACK, self.bety)
        fma = intrinsic(b.module, "llvm.fma", self.vty, 3) if c.fma else None
        nv = len(bv)
        for r, row in enumerate(rows):
            a = b.load(b.gep(row, [off], inbounds=True, source_etype=self.aety), typ=self.aety,
                       align=4 if self.adt == "f32" else 2)
            if self.adt == "bf16":
                a = halfconv.bf16_to_f32(b, a)
            a_lanes = splat(b, a, self.vty)
            for q in range(nv):
                acc = accs[r * nv + q]
                cur = b.load(acc)
                if fma is not None:
                    new = b.call(fma, [a_lanes, bv[q], cur])
                else:
                    new = b.fadd(cur, b.fmul(a_lanes, bv[q]))
                b.store(new, acc)

    def _dot_step(self, kpair, off, rows, panels, accs) -> None:
        """One step of two K (``kpair``: the flat index of the pair): per row, A's pair of bf16
        (adjacent along c.pair) broadcast to every lane; per B vector, vl columns x the pair;
        acc += a0 * b0 + a1 * b1 in f32 (c.dot: vdpbf16ps, BFDOT)."""
        c, b = self.c, self.b
        pairs = ir.VectorType(BF16, 2 * c.vl)
        kp = b.mul(kpair, i64(2 * PACK))
        bv = [b.load(b.gep(panels[j], [self.add(kp, i64(2 * c.vl * q))], inbounds=True,
                           source_etype=I16), typ=pairs, align=4)
              for j in range(c.tb) for q in range(PACK // c.vl)]
        self._prefetch(panels, kp, 2 * PACK, I16)
        dot = declare(b.module, c.dot, ir.FunctionType(self.vty, [self.vty, pairs, pairs]))
        ity = ir.VectorType(I32, c.vl)
        for r, row in enumerate(rows):
            a = b.load(b.gep(row, [off], inbounds=True, source_etype=I16), typ=I32, align=2)
            a_pairs = b.bitcast(splat(b, a, ity), pairs)
            for q in range(len(bv)):
                acc = accs[r * len(bv) + q]
                b.store(b.call(dot, [b.load(acc), a_pairs, bv[q]]), acc)

    def _int_step(self, kflat, off, rows, panels, accs) -> None:
        """One K step of an int8 contraction without quad products: A's u8 and B's s8 widened
        to i32 lanes, multiplied and added (exact, as the quads are)."""
        c, b = self.c, self.b
        kp = b.mul(kflat, i64(PACK))
        bv = []
        for j in range(c.tb):
            for q in range(PACK // c.vl):
                p = b.gep(panels[j], [self.add(kp, i64(q * c.vl))], inbounds=True,
                          source_etype=I8)
                bv.append(b.sext(b.load(p, typ=ir.VectorType(I8, c.vl), align=1), self.vty))
        self._prefetch(panels, kp, PACK, I8)
        for r, row in enumerate(rows):
            a = b.zext(b.load(b.gep(row, [off], inbounds=True, source_etype=I8), typ=I8), I32)
            a_lanes = splat(b, a, self.vty)
            for q in range(len(bv)):
                acc = accs[r * len(bv) + q]
                b.store(b.add(b.load(acc), b.mul(a_lanes, bv[q])), acc)

    def _quad_step(self, kquad, off, rows, panels, accs) -> None:
        """One step of four K (``kquad``: the flat index of the quad): per row, A's four u8
        (adjacent along c.pair) broadcast to every i32 lane; per B vector, vl columns x four s8;
        acc += a0*b0 + ... + a3*b3 in i32 (c.dot: vpdpbusd, USDOT)."""
        c, b = self.c, self.b
        if c.dot in PAIR_PRODUCTS:
            self._pairs_step(kquad, off, rows, panels, accs)
            return
        kp = b.mul(kquad, i64(QUAD * PACK))
        bv = [b.load(b.gep(panels[j], [self.add(kp, i64(QUAD * c.vl * q))], inbounds=True,
                           source_etype=I8), typ=self.vty, align=4)
              for j in range(c.tb) for q in range(PACK // c.vl)]
        self._prefetch(panels, kp, QUAD * PACK, I8)
        bytes_ty = ir.VectorType(I8, QUAD * c.vl) if c.dot in BYTE_OPERANDS else self.vty
        if bytes_ty is not self.vty:
            bv = [b.bitcast(v, bytes_ty) for v in bv]
        dot = declare(b.module, c.dot, ir.FunctionType(self.vty, [self.vty, bytes_ty, bytes_ty]))
        for r, row in enumerate(rows):
            a = b.load(b.gep(row, [off], inbounds=True, source_etype=I8), typ=I32, align=1)
            if c.dot in SIGNED_A:   # u8 to s8: a - 128
                a = b.xor(a, ir.Constant(I32, 0x80808080 - (1 << 32)))
            a_quads = splat(b, a, self.vty)
            if bytes_ty is not self.vty:
                a_quads = b.bitcast(a_quads, bytes_ty)
            for q in range(len(bv)):
                acc = accs[r * len(bv) + q]
                b.store(b.call(dot, [b.load(acc), a_quads, bv[q]]), acc)

    def _pairs_step(self, kquad, off, rows, panels, accs) -> None:
        """One step of four K without quad products (c.dot: ``pmaddwd``, two i16 products per
        i32 lane): per row, A's pairs (K 0, 1 and K 2, 3 of its u16 copy, contraction.py) each
        broadcast as 32 bits; per B vector and pair, vl columns x two s8 sign-extended
        (gemm.pair_halves); acc += a0*b0 + a1*b1 twice, exact in i32."""
        c, b = self.c, self.b
        per_block = PACK // c.vl
        kp = b.mul(kquad, i64(QUAD * PACK))
        wide = ir.VectorType(I16, 2 * c.vl)
        bv = [[b.sext(b.load(b.gep(panels[j], [self.add(kp, i64(h * 2 * PACK + 2 * c.vl * q))],
                                   inbounds=True, source_etype=I8),
                             typ=ir.VectorType(I8, 2 * c.vl), align=1), wide)
               for j in range(c.tb) for q in range(per_block)] for h in range(2)]
        self._prefetch(panels, kp, QUAD * PACK, I8)
        dot = declare(b.module, c.dot, ir.FunctionType(self.vty, [wide, wide]))
        nv = len(bv[0])
        for r, row in enumerate(rows):
            for h in range(2):
                at = b.gep(row, [self.add(off, i64(2 * h))], inbounds=True, source_etype=I16)
                pairs = b.bitcast(splat(b, b.load(at, typ=I32, align=2), self.vty), wide)
                for q in range(nv):
                    acc = accs[r * nv + q]
                    b.store(b.add(b.load(acc), b.call(dot, [pairs, bv[h][q]])), acc)

    def _prefetch(self, panels, kp, step: int, etype) -> None:
        """The fetches of a K step at ``kp`` (``etype`` elements from the panel's start, or
        from the innermost loop's first step): a line of the next K chunk's slice into L2
        (``fetch_base``, _next_slices), and where B is read once (``stream_b``) each panel
        PREFETCH_ROWS K steps of ``step`` elements ahead."""
        b = self.b
        if self.fetch_base is not None:   # (a step reads a line of each panel or less)
            self._fetch(b.gep(self.fetch_base, [kp], source_etype=etype), 2)
        if not self.stream_b:
            return
        for j in range(self.c.tb):   # (no inbounds: the last steps' addresses pass the panel)
            self._fetch(b.gep(panels[j], [self.add(kp, i64(PREFETCH_ROWS * step))],
                              source_etype=etype))

    def epilogue(self, tile, m0, m_size, nt, osz, rows: int) -> None:
        """The epilogue of the tile buffer's ``rows`` rows from row ``m0`` (tileepilogue.py)."""
        tile_epilogue(self, tile, m0, m_size, nt, osz, rows)


def _flat_step(dims: list[str], S: dict, sizes: dict):
    """A's step per flat row over ``dims`` (last fastest) when every dim's step is the next
    one's times its extent, known at build time (constants), else None."""
    steps = [S.get(d) for d in dims]
    if not dims or not all(isinstance(v, ir.Constant) for v in steps):
        return None
    for (outer, inner), d in zip(zip(steps, steps[1:]), dims[1:]):
        n = sizes[d]
        if not isinstance(n, ir.Constant) or outer.constant != inner.constant * n.constant:
            return None
    return steps[-1]
