"""Kernel bodies for the cuda target: a comprehension kernel over a grid of threads, a procedure
on one thread.

Each kernel is emitted as an internal ``.impl`` function whose parameters are the dispatch's
bindings (``noalias``: one binding per tensor, never overlapping), the symbols' values, the
calling thread's index and the number of threads, the dispatch's error record and a status
slot. module.py wraps it twice over: as a PTX entry (thread index from the special registers)
and, for the ``cuda-emulated`` target, as a cpu-ABI kernel whose workgroup runs the block's
threads in turn. The body is the same LLVM IR either way, so what the emulation checks against
the float64 reference is the code the GPU runs, but for the wrapper.

**Grid kernels** (``GridLowering``): thread ``t`` of ``T`` computes output elements ``t, t + T,
t + 2T, ...`` in the output's layout order, so the threads of a warp write consecutive
elements (coalesced), and any grid covers any size. A reduction runs in the thread, in a
scalar accumulator, with its epilogue applied before the store (codegen/targets/cpu/lower.py's
``_inner_reduce`` and ``finish``, which this class inherits). The expression lowering is the
shared one (codegen/llvm/scalar.py), so every op, dtype and index check the cpu target lowers,
this target lowers the same way.

**Procedures** (``SingleThreadLowering``): the cpu target's sequential lowering
(codegen/targets/cpu/procedure.py), run by thread 0 of a one-thread grid.
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.codegen.llvm.loops import Loops, strided
from mlpack.codegen.llvm.scalar import ScalarEmitter
from mlpack.codegen.llvm.types import I64
from mlpack.codegen.targets.cpu.lower import KernelLowering
from mlpack.codegen.targets.cpu.procedure import ProcedureLowering

GRID = "grid"       # a kernel's launch kind: threads over its output elements
SINGLE = "single"   # one thread (a procedure)
BLOCK = 256         # threads per block of a grid kernel


class CudaLowering(KernelLowering):
    """What every cuda comprehension lowering shares: ``emit`` makes the ``.impl`` function
    (its parameters: the bindings, the symbols, then four of the lowering's own) and ``_begin``
    its entry, with the expression emitter's tensors and symbols bound."""

    def emit(self) -> ir.Function:
        impl = self._impl_signature()
        self._emit_impl(impl)
        return impl

    def _begin(self, f: ir.Function) -> list:
        """The entry block and ``self.E``; the last four parameters (a thread or block index,
        their count, the error record, the status slot)."""
        b = ir.IRBuilder(f.append_basic_block("entry"))
        self.b = b
        self.loops = Loops(b, self.module)
        n = len(self.bound)
        self.E = ScalarEmitter(b, {t: f.args[j] for j, t in enumerate(self.bound)}, self.buffers,
                               self.k.name, self.native_f16, target="cuda")
        for i, s in enumerate(self.symbols):
            self.E.bind("$" + s, f.args[n + i])
        return list(f.args[n + len(self.symbols):])


class GridLowering(CudaLowering):
    """A comprehension kernel as ``.impl(bindings..., symbols..., i32 thread, i32 threads, err,
    status)``: each thread computes every ``threads``-th output element from ``thread``."""

    kind = GRID
    threads = BLOCK

    def _emit_impl(self, f: ir.Function) -> None:
        thread, threads, err, status = self._begin(f)
        b, E = self.b, self.E
        k = self.k
        # every element is computed whole by one thread: a reduction is its inner loop
        k.strategy = "map" if k.reduce is None else "inner"
        self._sizes()
        self.allocas = self._allocas()
        osz = E.sizes[self.out.name]
        dims = [d for d in self.out.layout
                if not (isinstance(osz[d], ir.Constant) and osz[d].constant == 1)]
        units = ir.Constant(I64, 1)
        for d in dims:
            units = b.mul(units, osz[d], flags=("nsw",))
        with strided(b, b.zext(thread, I64), units, b.zext(threads, I64), "elem") as e:
            with E.scope():
                self.bind_unit(e, dims)
                value = E(k.body) if k.reduce is None else self._inner_reduce()
                self.store(self.finish(value))
        b.ret_void()
        self._finish_checks(err, status)


class SingleThreadLowering(ProcedureLowering):
    """A procedure as ``.impl(bindings..., push, err, status)``, run by one thread (push: the
    symbols' values in device memory, where its SetSize statements write theirs)."""

    kind = SINGLE
    threads = 1

    def emit(self) -> ir.Function:
        return self._impl()


__all__ = ["CudaLowering", "GridLowering", "SingleThreadLowering", "GRID", "SINGLE", "BLOCK"]
