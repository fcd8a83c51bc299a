"""Block-level code that both a GPU and the CPU emulation run: phases between barriers.

A kernel whose threads share data (a tile in shared memory) is written as a sequence of *phases*:
every thread of the block runs a phase's code, then the block waits at a barrier before the next.
``Block`` emits that code twice over from the same body functions:

* on the GPU, each thread runs the body once per phase with its own thread index (``tid.x``),
  thread-private values live in registers (an ``alloca`` per thread, which LLVM promotes), shared
  memory is an ``addrspace(3)`` global, and a phase ends with ``bar.sync``;
* emulated on a CPU (the ``cuda-emulated`` target), the block runs in one call: each phase is a
  loop over the block's threads, a thread-private value is a slot per thread in an array the
  whole block keeps, and shared memory is an array of the block's.

Between two barriers no thread reads what another wrote in the same phase (that is what the
barriers are for), so running the threads of a phase one after another computes what the GPU
computes. Loops whose trip count is the same for every thread (a contraction's K tiles) may hold
phases; ``uniform_loop`` makes them.
"""

from __future__ import annotations

from contextlib import contextmanager

import llvmlite.binding as llvm
from llvmlite import ir

from mlpack.codegen.llvm.loops import strided

I32, I64 = ir.IntType(32), ir.IntType(64)
# a lowering of this kind runs a whole block in one call of its .impl(..., block, blocks, ...):
# the PTX entry passes its block index, the emulated kernel its workgroup (module.py)
BLOCK_KIND = "block"
PTR = ir.PointerType()


def _barrier(b: ir.IRBuilder) -> None:
    m = b.module
    if llvm.llvm_version_info >= (20,):
        name, args = "llvm.nvvm.barrier.cta.sync.aligned.all", [ir.Constant(I32, 0)]
    else:
        name, args = "llvm.nvvm.barrier0", []
    fn = m.globals.get(name) or ir.Function(m, ir.FunctionType(ir.VoidType(), [a.type for a in args]), name)
    b.call(fn, args)


def _sreg(b: ir.IRBuilder, name: str):
    m = b.module
    fname = f"llvm.nvvm.read.ptx.sreg.{name}"
    fn = m.globals.get(fname) or ir.Function(m, ir.FunctionType(I32, []), fname)
    return b.call(fn, [])


class Private:
    """``count`` values of ``ty`` per thread."""

    def __init__(self, base, ty, count: int):
        self.base, self.ty, self.count = base, ty, count


class Block:
    """Emits phases for ``threads`` threads, for the GPU or (``emulate``) for a CPU."""

    def __init__(self, b: ir.IRBuilder, threads: int, emulate: bool, name: str):
        self.b, self.threads, self.emulate, self.name = b, threads, emulate, name
        self.tid = None          # this thread's index (i64), inside a phase
        self._entry = b.function.entry_basic_block
        self._shared = 0

    def _entry_builder(self) -> ir.IRBuilder:
        """A builder in the entry block: the kernel's own while it is there (a second builder
        inserting there would leave the first one's position stale), else one at its start."""
        if self.b.block is self._entry:
            return self.b
        entry = ir.IRBuilder(self._entry)
        entry.position_at_start(self._entry)
        return entry

    def _alloca(self, ty, count: int, name: str):
        return self._entry_builder().alloca(ty, size=ir.Constant(I32, count), name=name)

    def private(self, ty, count: int, name: str) -> Private:
        per = count * (self.threads if self.emulate else 1)
        return Private(self._alloca(ty, per, name), ty, count)

    def at(self, p: Private, i):
        """This thread's slot ``i`` (an i64 value or int) of ``p``."""
        i = ir.Constant(I64, i) if isinstance(i, int) else i
        if self.emulate:
            i = self.b.add(self.b.mul(self.tid, ir.Constant(I64, p.count)), i)
        return self.b.gep(p.base, [i], source_etype=p.ty)

    def shared(self, ty, count: int, name: str):
        """A pointer to ``count`` values of ``ty`` the whole block shares."""
        if self.emulate:
            return self._alloca(ty, count, name)
        m = self.b.module
        arr = ir.ArrayType(ty, count)
        g = ir.GlobalVariable(m, arr, f"{self.name}.{name}.{self._shared}", addrspace=3)
        self._shared += 1
        g.linkage = "internal"
        g.initializer = ir.Constant(arr, ir.Undefined)
        g.align = 16
        # (generic pointers: LLVM infers address space 3 back, so accesses are ld/st.shared)
        return self._entry_builder().addrspacecast(g, PTR)

    @contextmanager
    def phase(self):
        """One phase: every thread runs the body; a barrier follows."""
        b = self.b
        if not self.emulate:
            self.tid = b.zext(_sreg(b, "tid.x"), I64)
            yield self.tid
            _barrier(b)
            return
        pre = b.block
        fn = pre.function
        head, body, done = (fn.append_basic_block(f"t.{s}") for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(I64, name="t")
        t.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_unsigned("<", t, ir.Constant(I64, self.threads)), body, done)
        b.position_at_end(body)
        self.tid = t
        yield t
        t.add_incoming(b.add(t, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)
        self.tid = None

    def uniform_loop(self, start, end, step, name: str):
        """``for i in range(start, end, step)`` that every thread runs the same number of
        times (so it may hold phases); yields i (i64)."""
        return strided(self.b, start, end, step, name)
