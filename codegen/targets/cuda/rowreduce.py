"""Long reductions on the GPU: a group of threads per output element (softmax and layer-norm
statistics, global pooling, a matrix-vector product's dot products).

The grid schedule gives each output element one thread, which sums the whole reduction alone
and, where the reduced dim is the contiguous one (a softmax over the last axis), reads memory
with a stride across the warp. Here a group of ``LANES`` threads shares each output element:
lane ``l`` folds the terms ``l, l + LANES, ...`` of the flattened reduction (consecutive lanes,
consecutive terms: coalesced), the group combines its partial values through shared memory in
a tree (one phase per level), and lane 0 applies the epilogue and stores. The reduction's
combine and identity are codegen/llvm/reduce.py's, so sums, products, max and min (NaN-
propagating) mean what they mean on the CPU. Written as phases (spmd.py), so ``cuda-emulated``
runs the same body.
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.codegen.llvm.loops import delinearize, strided
from mlpack.codegen.llvm.reduce import combine, identity
from mlpack.codegen.llvm.types import I64, llvm_type
from mlpack.codegen.targets.cpu.indexing import is_one
from mlpack.codegen.targets.cuda.lower import CudaLowering
from mlpack.codegen.targets.cuda.spmd import BLOCK_KIND, Block

LANES = 32                 # threads per output element
GROUPS = 8                 # output elements per block
THREADS = LANES * GROUPS
MIN_TERMS = 32             # a shorter reduction stays one thread's (the grid schedule)
MANY_OUTPUTS = 1 << 16     # this many outputs fill the GPU with one thread each...
LONG = 256                 # ...unless each sums at least this many terms


def suits(k, out) -> bool:
    """Whether kernel ``k`` (writing ``out``) is a reduction long enough for a group per output."""
    if k.reduce not in ("sum", "prod", "max", "min") or not k.rdims:
        return False
    terms = ex.simplify_size(ex.product(list(k.rdims.values())))
    if terms.is_const and terms.value < MIN_TERMS:
        return False
    outputs = ex.simplify_size(ex.product([out.sizes[d] for d in out.layout]))
    if outputs.is_const and outputs.value >= MANY_OUTPUTS and not (terms.is_const and terms.value >= LONG):
        return False
    return True


def blocks(out) -> ex.Expr:
    n = ex.product([out.sizes[d] for d in out.layout])
    need = ex.floordiv(n + ex.const(GROUPS - 1), ex.const(GROUPS))
    return ex.simplify_size(ex.binary("max", ex.const(1), ex.binary("min", ex.const(1 << 21), need)))


class GroupReduceLowering(CudaLowering):
    """A reduction kernel as ``.impl(bindings..., symbols..., i32 block, i32 blocks, err,
    status)``: block ``block`` of ``blocks`` reduces every ``blocks``-th group of GROUPS outputs."""

    kind = BLOCK_KIND
    threads = THREADS
    blocks_per_sm = 2

    def __init__(self, module, k, buffers, symbols, loops_md, native_f16, emulate: bool):
        super().__init__(module, k, buffers, symbols, loops_md, native_f16)
        self.emulate = emulate

    def _emit_impl(self, f: ir.Function) -> None:
        block, blocks, err, status = self._begin(f)
        b, k, E = self.b, self.k, self.E
        k.strategy = "inner"
        self._sizes()
        osz = E.sizes[self.out.name]
        self.dims = [d for d in self.out.layout if not is_one(self.out.sizes[d])]
        self.zeros = {d: ir.Constant(I64, 0) for d in self.out.layout if d not in self.dims}
        units = ir.Constant(I64, 1)
        for d in self.dims:
            units = b.mul(units, osz[d], flags=("nsw",))
        terms = ir.Constant(I64, 1)
        for r in k.rdims:
            terms = b.mul(terms, self.extents[r], flags=("nsw",))
        self.units, self.terms, self.osz = units, terms, osz
        self.vdt = k.acc_dtype
        ty = llvm_type(self.vdt, target="cuda")
        blk = Block(b, THREADS, self.emulate, k.name)
        self.blk = blk
        self.part = blk.shared(ty, THREADS, "part")
        self.ty = ty
        start = b.mul(b.zext(block, I64), ir.Constant(I64, GROUPS))
        step = b.mul(b.zext(blocks, I64), ir.Constant(I64, GROUPS))
        with blk.uniform_loop(start, units, step, "group") as base:
            self._group(base)
        b.ret_void()
        self._finish_checks(err, status)

    def _slot(self, i):
        return self.b.gep(self.part, [i], source_etype=self.ty)

    def _element(self, base, tid):
        """(this thread's output element, its lane)."""
        b = self.b
        g = b.udiv(tid, ir.Constant(I64, LANES))
        return b.add(base, g), b.urem(tid, ir.Constant(I64, LANES))

    def _guarded(self, cond, body) -> None:
        b = self.b
        fn = b.block.function
        then, done = fn.append_basic_block("g.in"), fn.append_basic_block("g.done")
        b.cbranch(cond, then, done)
        b.position_at_end(then)
        body()
        b.branch(done)
        b.position_at_end(done)

    def _group(self, base) -> None:
        b, E, k = self.b, self.E, self.k
        with self.blk.phase() as tid:   # each lane folds every LANES-th term
            e, lane = self._element(base, tid)
            slot = self._slot(tid)
            b.store(identity(k.reduce, self.vdt), slot)

            def fold():
                with E.scope(**{**self.zeros, **delinearize(b, e, self.dims, self.osz)}):
                    with strided(b, lane, self.terms, ir.Constant(I64, LANES), "term") as t:
                        with E.scope(**delinearize(b, t, list(k.rdims), self.extents)):
                            x = self._term(self.vdt)
                            b.store(combine(E, k.reduce, b.load(slot, typ=self.ty), x, self.vdt,
                                            inner=True), slot)
            self._guarded(b.icmp_unsigned("<", e, self.units), fold)
        span = LANES // 2
        while span:   # the group's partial values combined in a tree
            with self.blk.phase() as tid:
                lane = b.urem(tid, ir.Constant(I64, LANES))

                def join(tid=tid, span=span):
                    here, there = self._slot(tid), self._slot(b.add(tid, ir.Constant(I64, span)))
                    b.store(combine(E, k.reduce, b.load(here, typ=self.ty), b.load(there, typ=self.ty),
                                    self.vdt, inner=True), here)
                self._guarded(b.icmp_unsigned("<", lane, ir.Constant(I64, span)), join)
            span //= 2
        with self.blk.phase() as tid:   # lane 0: the epilogue and the store
            e, lane = self._element(base, tid)

            def put(tid=tid, e=e):
                with E.scope(**{**self.zeros, **delinearize(b, e, self.dims, self.osz)}):
                    self.store(self.finish(b.load(self._slot(tid), typ=self.ty)))
            self._guarded(b.and_(b.icmp_unsigned("==", lane, ir.Constant(I64, 0)),
                                 b.icmp_unsigned("<", e, self.units)), put)
