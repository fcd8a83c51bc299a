"""One kernel -> one LLVM function ``i32 k(const mlpack_dispatch *d, uint32_t wg)`` (abi.py).

The exported function only unpacks the dispatch (binding pointers, push constants, workgroup
count) and calls an always-inlined body whose buffer parameters are ``noalias``: after inlining
LLVM keeps that as alias scopes, so the vectorizer needs no runtime overlap checks. (Bindings
never alias: one binding per tensor, and the plan never overlaps the arena slots of an op's
inputs and output.)

The body walks the units this workgroup owns (``[units*wg/count, units*(wg+1)/count)``; a
unit is a row, or a chunk of one when the kernel cuts rows in ``row_chunks``), delinearizes
each into the outer dims' indices and runs the kernel's strategy (see kernels.py); a gemm
kernel's body comes from microkernel.py, amxkernel.py or depthwise.py. Scalar expressions are
emitted by codegen/llvm/scalar.py's ``ScalarEmitter``, reductions combine as
codegen/llvm/reduce.py says.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import replace

from llvmlite import ir

from mlpack.spec.ir.expr import Expr, replace_node
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.llvm.intrinsics import umin
from mlpack.codegen.llvm.loops import Loops, delinearize
from mlpack.codegen.llvm.reduce import (arg_better, combine, extreme_result, extreme_step,
                                        identity, is_float_extreme)
from mlpack.codegen.llvm.oprules import CONTRACT
from mlpack.codegen.llvm.scalar import ScalarEmitter
from mlpack.codegen.llvm.types import I32, I64, NARROW_FLOATS, PTR, llvm_type, storage_type
from mlpack.codegen.targets.cpu import checks as chk
from mlpack.codegen.targets.cpu import depthwise, groupwise, hoist, narrowconv, rowvector, transpose
from mlpack.codegen.targets.cpu.abi import DISPATCH, KERNEL_FN
from mlpack.codegen.targets.cpu.amxkernel import AmxGemm
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, share
from mlpack.codegen.targets.cpu.kernels import ACC, row_dim
from mlpack.codegen.targets.cpu.microkernel import GemmEmitter


INTERLEAVE = 4         # vectors a vectorized reduction into a scalar keeps in flight ...
INTERLEAVE_MIN = 256   # ... where it sums this many terms at least (4 x 16 lanes, 4 times)


class KernelLowering:
    """Emits one kernel into a module. A gemm kernel's emitter (``_emit_gemm``) works inside
    it: it takes the builder ``b``, the scalar emitter ``E``, ``loops`` and the kernel ``k``,
    binds the output's dims from a flat unit (``bind_unit``) and stores each output element
    through the epilogue (``store(finish(value))``)."""

    def __init__(self, module: ir.Module, k: Kernel, buffers: dict[str, Buffer],
                 symbols: list[str], loops_md, native_f16: tuple[bool, bool] = (True, True)):
        self.module = module
        self.native_f16 = native_f16
        self.k = k
        self.buffers = buffers
        self.symbols = symbols
        self.loops_md = loops_md
        self.out = buffers[k.out]
        self.bound = [k.out, *k.reads]   # binding j of the dispatch is tensor bound[j]

    def emit(self) -> ir.Function:
        impl = self._impl_signature()
        self._emit_impl(impl)
        return self._emit_wrapper(impl)

    def _impl_signature(self) -> ir.Function:
        n = len(self.bound)
        # ..., wg, count, the dispatch's error record and a status slot (checks.py)
        fnty = ir.FunctionType(ir.VoidType(),
                               [PTR] * n + [I64] * len(self.symbols) + [I32, I32, PTR, PTR])
        f = ir.Function(self.module, fnty, name=f"{self.k.name}.impl")
        f.linkage = "internal"
        f.attributes.add("alwaysinline")
        f.attributes.add("nounwind")
        for j in range(n):
            f.args[j].add_attribute("noalias")
        return f

    def _emit_wrapper(self, impl: ir.Function) -> ir.Function:
        f = ir.Function(self.module, KERNEL_FN, name=self.k.name)
        f.linkage = "internal"
        f.attributes.add("nounwind")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        d, wg = f.args
        bindings = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 0)], source_etype=DISPATCH),
                          typ=PTR)
        push = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 1)], source_etype=DISPATCH),
                      typ=PTR)
        count = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 2)], source_etype=DISPATCH),
                       typ=I32)
        args = [b.load(b.gep(bindings, [ir.Constant(I64, j)], source_etype=PTR), typ=PTR)
                for j in range(len(self.bound))]
        args += [b.load(b.gep(push, [ir.Constant(I64, i)], source_etype=I64), typ=I64)
                 for i in range(len(self.symbols))]
        report = chk.wrapper_args(b, d, DISPATCH, self.E.checks)
        b.call(impl, args + [wg, count] + report)
        b.ret(chk.wrapper_status(b, report))
        return f

    # -- body

    def _emit_impl(self, f: ir.Function) -> None:
        b = ir.IRBuilder(f.append_basic_block("entry"))
        self.b = b
        # a gemm kernel's bodies are unrolled as written (tiles, windows): LLVM's unroller
        # would only multiply its code (objects.py)
        # (a point tile's map walks a point's rows in loops of constant trip counts: unrolled
        # whole before the vectorizer saw them, SLP packed them across rows, with gathers, and
        # took LLVM a quarter second a kernel; its row reductions still unroll the row of each
        # step, which LLVM then vectorizes along it)
        self.loops = Loops(b, self.module, unroll=self.k.strategy not in (
            "gemm", "transpose") and not (self.k.points and self.k.strategy in ("map", "inner")))
        n = len(self.bound)
        bases = {t: f.args[j] for j, t in enumerate(self.bound)}
        E = ScalarEmitter(b, bases, self.buffers, self.k.name, self.native_f16, target="cpu")
        self.E = E
        for i, s in enumerate(self.symbols):
            E.bind("$" + s, f.args[n + i])
        wg, count, err, status = f.args[n + len(self.symbols):]
        self._sizes()
        self.allocas = self._allocas()
        if self.k.strategy in ("gemm", "transpose"):   # contraction.py, transpose.py
            if self.k.strategy == "gemm":   # packed, register-blocked tiles
                self._emit_gemm(wg, count)
            else:
                transpose.emit(self, wg, count)
            self._finish_checks(err, status)
            return
        outer, row = row_dim(self.out, self.k.blocked, self.k.points)
        chunks = ir.Constant(I64, self.k.row_chunks)
        units = chunks
        for d in outer:
            units = b.mul(units, E.sizes[self.out.name][d], flags=("nsw",))
        start, end = share(b, self.k, units, wg, count)
        if narrowconv.shares_bytes(self.out):
            # packed int4/int2/fp4: a store rewrites its whole byte, so workgroup 0 does every
            # unit and no two threads ever share a byte (the others find nothing to do)
            first = b.icmp_unsigned("==", b.zext(wg, I64), ir.Constant(I64, 0))
            start, end = b.select(first, ir.Constant(I64, 0), units), units
        with self.loops.loop(start, end, "unit") as u:
            with E.scope():
                r = u
                self.j_range = None
                if row is not None:
                    self.j_range = (ir.Constant(I64, 0), self._bounded(
                        row, E.sizes[self.out.name][row]))
                    size = self.out.sizes[row]   # the row's bounds, known at build time
                    self.row_bounds = (0, size.value if size.is_const and not
                                       self.k.bounded else None)
                if self.k.row_chunks > 1:
                    r, c = b.udiv(u, chunks), b.urem(u, chunks)
                    n = E.sizes[self.out.name][row]
                    self.j_range = (b.udiv(b.mul(c, n), chunks),
                                    b.udiv(b.mul(b.add(c, ir.Constant(I64, 1)), n), chunks))
                self.bind_unit(r, outer)
                self._row(row)
        b.ret_void()
        self.loops_md(self.loops.latches, self.loops.unroll)
        self._finish_checks(err, status)

    def _emit_gemm(self, wg, count) -> None:
        """The body of a gemm kernel: a direct row kernel (depthwise.py), AMX tiles
        (amxkernel.py) or the f32 micro-kernel (microkernel.py)."""
        gemm = self.k.gemm
        if isinstance(gemm, depthwise.Direct):
            depthwise.emit_direct(self, wg, count)
        elif isinstance(gemm, groupwise.Grouped):
            groupwise.emit_grouped(self, wg, count)
        elif gemm.amx:
            AmxGemm(self, wg, count).emit()
        else:
            GemmEmitter(self, wg, count).emit()

    def _finish_checks(self, err, status) -> None:
        self.E.checks.finish(err, status)
        self.k.checks = list(self.E.checks.keys)   # the plan lists them (checks.add_to_plan)

    def _sizes(self) -> None:
        """Every bound buffer's dim sizes and strides (i64 values) and the rdims' extents."""
        E = self.E
        for t in self.bound:
            buf = self.buffers[t]
            sizes = {d: E(buf.sizes[d]) for d in buf.layout}
            E.sizes[t] = sizes
            # constant strides stay constants (not instructions LLVM folds later): the
            # schedule's choices test them (microkernel._flat_step: a dynamic batch's pixels
            # walked by one product instead of a division per dim and row)
            strides, acc = [], ir.Constant(I64, 1)
            for d in reversed(buf.layout):
                strides.append(acc)
                size = sizes[d]
                if _const_one(size):
                    continue
                if isinstance(acc, ir.Constant) and isinstance(size, ir.Constant):
                    acc = ir.Constant(I64, acc.constant * size.constant)
                else:
                    acc = size if _const_one(acc) else self.b.mul(acc, size, flags=("nsw",))
            E.strides[t] = strides[::-1]
        self.extents = {r: self._bounded(r, E(s)) for r, s in self.k.rdims.items()}

    def _bounded(self, d: str, extent):
        """``extent``, or less where the kernel bounds the loop over ``d`` (Kernel.bounded)."""
        if self.k.bounded is None or self.k.bounded[0] != d:
            return extent
        return umin(self.b, self.E(self.k.bounded[1]), extent)

    def _allocas(self) -> dict:
        k, b = self.k, self.b
        if k.strategy != "inner":
            return {}
        arg = k.reduce.startswith("arg")
        acc_type = llvm_type(k.body.dtype if arg else k.acc_dtype, target="cpu")
        out = {"acc": b.alloca(acc_type, name="acc")}
        if arg:
            out["idx"] = b.alloca(I64, name="idx")
        if is_float_extreme(k.reduce, k.acc_dtype):
            out["nan"] = b.alloca(ir.IntType(1), name="nan")
        return out

    def bind_unit(self, r, outer: list[str], sizes: dict | None = None) -> None:
        """Bind ``outer`` from the flat unit index ``r`` (``sizes``: their extents, the
        output's by default), and the output's size-1 dims to 0."""
        E = self.E
        osz = E.sizes[self.out.name]
        for d, v in delinearize(self.b, r, outer, sizes or osz).items():
            E.bind(d, v)
        for d in self.out.layout:
            if _const_one(osz[d]):
                E.bind(d, ir.Constant(I64, 0))

    def _out_ptr(self):
        E = self.E
        return E.address(self.out.name, [E.lookup(d) for d in self.out.layout])

    @contextmanager
    def _row_loop(self, row: str | None, vectorize: bool = True, block=None, unroll=None):
        """Over the row dim (or just once, for an output with no dim left), inside loops over
        the kernel's ``block`` dims (the unit's rows: kernels.block_rows). ``unroll``: as
        Loops.loop's, for the row loop."""
        block = list(self.k.blocked) if block is None else block
        if block:
            d = block[0]
            # (a point tile's kernel walks all of a point's rows in these: unrolled, their
            # constant trip counts multiply its code, and LLVM's time on it, by 5)
            with self.loops.loop(ir.Constant(I64, 0), self.E.sizes[self.out.name][d],
                                 f"b.{d}", unroll=False if self.k.points else None) as i:
                with self.E.scope(**{d: i}):
                    with self._row_loop(row, vectorize, block[1:], unroll):
                        yield
            return
        if row is None:
            with self.E.scope():
                yield
            return
        j0, j1 = self.j_range
        with self.loops.loop(j0, j1, f"j.{row}", vectorize, unroll) as j:
            with self.E.scope(**{row: j}):
                yield

    def _row(self, row: str | None, depth: int = 0) -> None:
        """The row, branching first on any select whose condition is the same for the whole
        row (a concatenation on an outer dim: hoist.py), so each arm gets a plain row loop."""
        k, b = self.k, self.b
        outer = {d for d in self.out.layout if d != row and d not in k.blocked}
        sel = hoist.invariant_select([k.body, k.epilogue], outer) if depth < hoist.MAX_HOISTED \
            else None
        if sel is None:
            split = hoist.row_select([k.body, k.epilogue], row) if (
                k.strategy in ("map", "row") and row is not None and depth < hoist.MAX_HOISTED) \
                else None
            cuts = hoist.guard_cuts([k.body, k.epilogue], row, self.E.buffers) if (
                split is None and k.strategy == "map" and row is not None
                and self.row_bounds[1] is not None and depth < hoist.MAX_HOISTED) else None
            if split is not None:
                self._split_row(row, split, depth)
            elif cuts is not None:
                self._split_guarded(row, cuts)
            else:
                self._row_body(row)
            return
        cond = self.E(sel.args[0])
        fn = b.block.function
        arms = [fn.append_basic_block("sel.then"), fn.append_basic_block("sel.else")]
        merge = fn.append_basic_block("sel.merge")
        b.cbranch(cond, *arms)
        for block, arm in zip(arms, sel.args[1:]):
            b.position_at_end(block)
            self.k = replace(k, body=replace_node(k.body, sel, arm),
                             epilogue=replace_node(k.epilogue, sel, arm))
            with self.E.scope():   # values made in one arm do not dominate the other
                self._row(row, depth + 1)
            b.branch(merge)
        self.k = k
        b.position_at_end(merge)

    def _split_row(self, row: str, sel, depth: int) -> None:
        """The row as two loops, split where ``sel``'s condition ``row < K`` turns (a
        concatenation along the row: hoist.py), each with its arm of ``sel``."""
        k, b = self.k, self.b
        cut = sel.args[0].args[1].value
        j0, j1 = self.j_range
        lo, hi = self.row_bounds
        mid = ir.Constant(I64, cut)
        mid = b.select(b.icmp_signed("<", mid, j0), j0, b.select(b.icmp_signed(
            ">", mid, j1), j1, mid))
        parts = ((j0, mid, sel.args[1], (lo, cut if hi is None else min(hi, cut))),
                 (mid, j1, sel.args[2], (max(lo, cut), hi)))
        for start, end, arm, bounds in parts:
            self.j_range, self.row_bounds = (start, end), bounds
            self.k = replace(k, **{f: hoist.unclamp(replace_node(getattr(k, f), sel, arm), row,
                                                    *bounds) for f in ("body", "epilogue")})
            with self.E.scope():
                self._row(row, depth + 1)
        self.k, self.j_range, self.row_bounds = k, (j0, j1), (lo, hi)

    def _split_guarded(self, row: str, cuts: tuple[int, int]) -> None:
        """The row as up to three loops: where a guarded read's index along some dim, the row
        plus a constant, leaves that dim before its interior, the interior, and after it (a
        padded copy's left pad, its image, its right pad: hoist.guard_cuts). In the interior
        the dim needs no guard, so the read is a plain vector load (scalar.py's lane_range)."""
        b = self.b
        j0, j1 = self.j_range
        lo, hi = self.row_bounds
        a = max(lo, min(cuts[0], hi))
        c = max(a, min(cuts[1], hi))

        def at(cut):   # (the part's first index, within this unit's share of the row)
            v = ir.Constant(I64, cut)
            return b.select(b.icmp_signed("<", v, j0), j0, b.select(b.icmp_signed(">", v, j1),
                                                                    j1, v))
        ma, mc = at(a), at(c)
        for start, end, bounds in ((j0, ma, (lo, a)), (ma, mc, (a, c)), (mc, j1, (c, hi))):
            if bounds[0] >= bounds[1]:
                continue
            self.j_range, self.row_bounds = (start, end), bounds
            with self.E.scope():
                self._row_body(row)
        self.j_range, self.row_bounds = (j0, j1), (lo, hi)

    def _row_body(self, row: str | None) -> None:
        k = self.k
        if k.strategy == "map":
            with self._row_loop(row):
                if row is not None:
                    self.E.lane = (row, self.E.sizes[self.out.name][row])
                    self.E.lane_range = None if self.row_bounds[1] is None else self.row_bounds
                self.store(self.finish(self.E(k.body)))
                self.E.lane = self.E.lane_range = None
        elif k.strategy == "row":
            self._row_accumulate(row)
        else:
            with self._row_loop(row, vectorize=False):
                self.store(self.finish(self._inner_reduce()))

    def finish(self, value):
        """The epilogue applied to the kernel's value, cast to the output's dtype."""
        k, E = self.k, self.E
        if k.epilogue is None:
            return E.cast(value, k.acc_dtype, self.out.dtype)
        if k.acc_dtype in NARROW_FLOATS and k.strategy != "row":
            value = E.round_to(value, k.acc_dtype)   # the reduction's tensor is of that dtype
        with E.scope(**{ACC: value}):
            res = E(k.epilogue)
        return E.cast(res, k.epilogue.dtype, self.out.dtype)

    def store(self, value) -> None:
        """Store ``value`` (the output's dtype) at the output element the dims are bound to."""
        self.E.store(value, self.out.dtype, self._out_ptr())

    def _row_accumulate(self, row: str) -> None:
        """Reduction loops outside the row loop; the output row holds the accumulators."""
        k, E = self.k, self.E
        ety = storage_type(self.out.dtype)
        # (a point tile's rows, unrolled whole, were packed across rows by SLP: see __init__)
        once = False if k.points else None
        chunk = self.j_range
        rest = None
        if rowvector.applies(k, self.out, self.buffers, row):
            # whole vectors summed in registers (rowvector.py); the rest as below
            rest = rowvector.emit(self, row)
            self.j_range = (rest, chunk[1])
        with self.b.if_then(self.b.icmp_unsigned("<", *self.j_range)) if rest is not None \
                else nullcontext(), E.scope():
            with self._row_loop(row, unroll=once):
                self.store(identity(k.reduce, k.acc_dtype))
            self._nest(list(k.rdims), lambda: self._row_step(row, ety))
        self.j_range = chunk
        if k.epilogue is not None:
            with self._row_loop(row, unroll=once):
                ptr = self._out_ptr()
                acc = E.load(ety, self.out.dtype, ptr, ir.Constant(I64, 0))
                self.store(self.finish(acc))

    def _row_step(self, row: str, ety) -> None:
        k, E = self.k, self.E
        with self._row_loop(row):
            ptr = self._out_ptr()
            acc = E.load(ety, self.out.dtype, ptr, ir.Constant(I64, 0))
            x = self._term(k.acc_dtype)
            self.store(combine(E, k.reduce, acc, x, k.acc_dtype))

    def _term(self, vdt: str):
        """One step's value of the reduction body. An f16/bf16 sum of products multiplies its
        (rounded) factors in f32 without rounding the product, as the interpreter's einsum
        does (softmax probabilities times V in attention); other bodies round as every op."""
        k, E = self.k, self.E
        if k.reduce != "sum" or vdt not in ("f16", "bf16") or k.body.dtype != vdt:
            return E.cast(E(k.body), k.body.dtype, vdt)
        out = None
        for f in _factors(k.body):
            v = E(f)
            out = v if out is None else self.b.fmul(out, v, flags=CONTRACT)
        return out

    def _nest(self, dims: list[str], inner, vectorize_last: bool = False) -> None:
        if not dims:
            inner()
            return
        d = dims[0]
        vec = vectorize_last and len(dims) == 1
        # (a scalar accumulator's vectorized loop: each vector's step waits on the last, an
        # add's latency for a sum; four chains overlap where the reduction is long enough to
        # fill them)
        size = self.k.rdims[d]
        long_ = vec and (not size.is_const or size.value >= INTERLEAVE_MIN)
        with self.loops.loop(ir.Constant(I64, 0), self.extents[d], f"r.{d}", vec,
                             unroll=False if self.k.points else None,
                             interleave=INTERLEAVE if long_ else 0) as i:
            with self.E.scope(**{d: i}):
                self._nest(dims[1:], inner, vectorize_last)

    def _inner_reduce(self):
        """One output element: the reduction loops innermost, into a scalar accumulator."""
        k, E, b = self.k, self.E, self.b
        acc = self.allocas["acc"]
        arg = k.reduce.startswith("arg")
        vdt = k.body.dtype if arg else k.acc_dtype
        b.store(identity(k.reduce, vdt), acc)
        if arg:
            if len(k.rdims) != 1:
                raise UnsupportedTargetError(f"cpu: kernel {k.name}: {k.reduce} over "
                                             f"{len(k.rdims)} dims")
            b.store(ir.Constant(I64, 0), self.allocas["idx"])
        nan = self.allocas.get("nan")
        if nan is not None:
            b.store(ir.Constant(ir.IntType(1), 0), nan)

        def step():
            x = self._term(vdt)
            cur = b.load(acc)
            if nan is not None:
                value, seen = extreme_step(b, k.reduce, cur, x, b.load(nan))
                b.store(value, acc)
                b.store(seen, nan)
                return
            if not arg:
                b.store(combine(E, k.reduce, cur, x, vdt, inner=True), acc)
                return
            better = arg_better(E, k.reduce, x, cur, vdt)
            b.store(b.select(better, x, cur), acc)
            idx = self.allocas["idx"]
            b.store(b.select(better, E.lookup(list(k.rdims)[0]), b.load(idx)), idx)

        self._nest(list(k.rdims), step, vectorize_last=not arg)
        if arg:
            return b.load(self.allocas["idx"])
        if nan is not None:
            return extreme_result(b, b.load(acc), b.load(nan))
        return b.load(acc)


def _factors(e: Expr) -> list[Expr]:
    """The factors of a product chain of one dtype (as the interpreter's einsum splits it)."""
    if e.op == "mul" and all(a.dtype == e.dtype for a in e.args):
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _const_one(v) -> bool:
    return isinstance(v, ir.Constant) and v.constant == 1
