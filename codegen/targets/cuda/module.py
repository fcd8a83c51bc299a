"""The cuda target's kernels as LLVM modules: PTX entries for a GPU, or cpu-ABI kernels that run
each block's threads in turn (the ``cuda-emulated`` target).

**PTX entry** (the kernel ABI of a cuda artifact, spec/SPEC.md section 7): ``k(b_0, ...,
b_{n-1}, s_0, ..., s_{m-1}, push, err)``: the dispatch's bindings as global pointers (``noalias``;
``readonly`` for those it only reads, so loads may take the read-only path), every plan symbol's
value as an i64 in push order, the device copy of the push constants (where a procedure writes
the symbols it computes) and the dispatch's ``mlpack_kernel_error`` in device memory. A grid
kernel runs on ``workgroups`` blocks of ``block`` threads (the config's ``cuda.kernels``); a
procedure on one block of one thread.

**Emulated kernel**: ``i32 k(const mlpack_dispatch *d, uint32_t wg)`` of the cpu ABI, whose
workgroup ``wg`` is block ``wg``: it calls the same ``.impl`` once per thread of the block, in
order, and the plan is the GPU plan. Grid kernels never exchange data between threads, so
running them in turn computes what the GPU computes.
"""

from __future__ import annotations

import re

from llvmlite import ir

from mlpack.codegen.llvm.types import I32, I64, PTR
from mlpack.codegen.targets.cpu import checks as chk
from mlpack.codegen.targets.cpu.abi import DISPATCH, KERNEL_FN
from mlpack.codegen.targets.cpu.module import _finish, _share_identical, _table
from mlpack.codegen.targets.cpu.procedure import (PROCEDURE, binding_kinds, kernel_bindings,
                                                  kernel_writes)
from mlpack.codegen.targets.cuda.lower import BLOCK, GRID, GridLowering, SingleThreadLowering
from mlpack.codegen.targets.cuda.mma import TensorCoreLowering
from mlpack.codegen.targets.cuda.rowreduce import GroupReduceLowering
from mlpack.codegen.targets.cuda.tiled import TiledLowering
from mlpack.codegen.targets.cuda.spmd import BLOCK_KIND
from mlpack.codegen.targets.cuda.target import DATA_LAYOUT, TRIPLE

VOID = ir.VoidType()
# llvmlite has no readonly parameter attribute: an entry's read-only bindings are named "ro.J"
# and get it in the module's text
_READONLY = re.compile(r'ptr noalias %"ro\.')



def lowering_for(k, module: ir.Module, buffers, symbols: list[str], native_f16=(True, True),
                 schedule: tuple | None = None, emulate: bool = False):
    """The lowering of kernel ``k``: a procedure's, or by its ``schedule`` (compile.py) a
    contraction's tiles (tiled.py), a long reduction's thread groups (rowreduce.py), or a grid
    kernel's."""
    if k.strategy == PROCEDURE:
        return SingleThreadLowering(module, k, buffers, symbols, None, native_f16)
    if schedule is not None and schedule[0] == "mma":
        return TensorCoreLowering(module, k, buffers, symbols, None, native_f16, schedule[1],
                                  emulate, schedule[2])
    if schedule is not None and schedule[0] == "tiled":
        return TiledLowering(module, k, buffers, symbols, None, native_f16, schedule[1], emulate)
    if schedule is not None and schedule[0] == "group":
        return GroupReduceLowering(module, k, buffers, symbols, None, native_f16, emulate)
    return GridLowering(module, k, buffers, symbols, None, native_f16)


def entry_name(kernel: str) -> str:
    """A kernel's PTX entry name: PTX identifiers are letters, digits, _ and $ (kernel names
    carry the tensor's, "k16_ffn.0_Add"); the k<index> prefix keeps them distinct."""
    return re.sub(r"[^A-Za-z0-9_$]", "_", kernel)


def _sreg(b: ir.IRBuilder, name: str):
    m = b.module
    fname = f"llvm.nvvm.read.ptx.sreg.{name}"
    fn = m.globals.get(fname) or ir.Function(m, ir.FunctionType(I32, []), fname)
    return b.call(fn, [])


def _ptx_entry(module: ir.Module, name: str, impl: ir.Function, low, nsym: int, writes: int):
    nb = len(low.bound)
    f = ir.Function(module, ir.FunctionType(VOID, [PTR] * nb + [I64] * nsym + [PTR, PTR]), name=name)
    f.calling_convention = "ptx_kernel"
    f.attributes.add("nounwind")
    for j in range(nb):
        f.args[j].add_attribute("noalias")
        f.args[j].name = f"ro.{j}" if j >= writes else f"rw.{j}"   # (_READONLY)
    b = ir.IRBuilder(f.append_basic_block("entry"))
    status = b.alloca(I32, name="status")
    b.store(ir.Constant(I32, 0), status)
    bindings, syms = list(f.args[:nb]), list(f.args[nb:nb + nsym])
    push, err = f.args[nb + nsym:]
    tid, ctaid = _sreg(b, "tid.x"), _sreg(b, "ctaid.x")
    if low.kind == BLOCK_KIND:   # (the body reads its thread index itself: spmd.py)
        b.call(impl, bindings + syms + [ctaid, _sreg(b, "nctaid.x"), err, status])
        b.ret_void()
        return f
    if low.kind == GRID:
        ntid, nctaid = _sreg(b, "ntid.x"), _sreg(b, "nctaid.x")
        thread = b.add(b.mul(ctaid, ntid), tid)
        b.call(impl, bindings + syms + [thread, b.mul(nctaid, ntid), err, status])
        b.ret_void()
        return f
    run, done = f.append_basic_block("run"), f.append_basic_block("done")
    b.cbranch(b.icmp_unsigned("==", b.or_(tid, ctaid), ir.Constant(I32, 0)), run, done)
    b.position_at_end(run)
    b.call(impl, bindings + [push, err, status])
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return f


def _emulated_entry(module: ir.Module, name: str, impl: ir.Function, low, nsym: int):
    f = ir.Function(module, KERNEL_FN, name=name)
    f.linkage = "internal"
    f.attributes.add("nounwind")
    b = ir.IRBuilder(f.append_basic_block("entry"))
    d, wg = f.args
    field = lambda i, ty: b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, i)],  # noqa: E731
                                       source_etype=DISPATCH), typ=ty)
    bindings, push, count = field(0, PTR), field(1, PTR), field(2, I32)
    args = [b.load(b.gep(bindings, [ir.Constant(I64, j)], source_etype=PTR), typ=PTR)
            for j in range(len(low.bound))]
    report = chk.wrapper_args(b, d, DISPATCH, low.E.checks)
    if low.kind == BLOCK_KIND:   # the block runs in one call, its threads phase by phase (spmd.py)
        syms = [b.load(b.gep(push, [ir.Constant(I64, i)], source_etype=I64), typ=I64)
                for i in range(nsym)]
        b.call(impl, args + syms + [wg, count] + report)
    elif low.kind == GRID:
        syms = [b.load(b.gep(push, [ir.Constant(I64, i)], source_etype=I64), typ=I64)
                for i in range(nsym)]
        first = b.mul(wg, ir.Constant(I32, BLOCK))
        threads = b.mul(count, ir.Constant(I32, BLOCK))
        pre = b.block
        head, body, done = (f.append_basic_block(n) for n in ("t.head", "t.body", "t.done"))
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(I32, name="t")
        t.add_incoming(first, pre)
        b.cbranch(b.icmp_unsigned("<", t, b.add(first, ir.Constant(I32, BLOCK))), body, done)
        b.position_at_end(body)
        b.call(impl, args + syms + [t] + [threads] + report)
        t.add_incoming(b.add(t, ir.Constant(I32, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)
    else:
        run, done = f.append_basic_block("run"), f.append_basic_block("done")
        b.cbranch(b.icmp_unsigned("==", wg, ir.Constant(I32, 0)), run, done)
        b.position_at_end(run)
        b.call(impl, args + [push] + report)
        b.branch(done)
        b.position_at_end(done)
    b.ret(chk.wrapper_status(b, report))
    return f


def build_module(kernels, buffers, symbols: list[str], *, emulate=None, schedules=None
                 ) -> tuple[str, list[str]]:
    """The LLVM IR text (before optimization) of every kernel: PTX entries, or with ``emulate``
    (the host's cpu target: ``codegen/targets/cpu/target.CpuTarget``) a cpu kernel library with
    its kernel table. ``schedules``: kernel name -> ("tiled", its GEMM view) for a contraction
    run as tiles through shared memory (tiled.py), ("group", None) for a long reduction run by a
    group of threads per output (rowreduce.py); the others are grid kernels. Also the entry each kernel runs as: a kernel whose
    code is the same as an earlier one's (a repeated layer) shares its entry, so LLVM and ptxas
    compile it once."""
    module = ir.Module(name="mlpack_cuda")
    if emulate is None:
        module.triple, module.data_layout = TRIPLE, DATA_LAYOUT
    else:
        from mlpack.codegen.targets.cpu.module import target_machine

        module.triple = emulate.triple
        module.data_layout = str(target_machine(emulate).target_data)
    # half floats: PTX converts with cvt; on the host, as the cpu target's module does (x86-64
    # v2 has no F16C: its conversions are integer code, halfconv.py)
    native_f16 = (True, True) if emulate is None else (
        emulate.arch == "arm64" or "f16c" in emulate.features, emulate.arch == "arm64")
    fns, lowerings = [], []
    for k in kernels:
        low = lowering_for(k, module, buffers, symbols, native_f16, (schedules or {}).get(k.name),
                           emulate is not None)
        impl = low.emit()
        lowerings.append(low)
        if list(low.bound) != kernel_bindings(k):
            raise AssertionError(f"cuda: kernel {k.name} loads bindings {low.bound}, but its "
                                 f"dispatch binds {kernel_bindings(k)}")
        if emulate is None:
            fns.append(_ptx_entry(module, k.name, impl, low, len(symbols), len(kernel_writes(k))))
        else:
            fns.append(_emulated_entry(module, k.name, impl, low, len(symbols)))
    names = [k.name for k in kernels]
    distinct = _share_identical(module, fns, names, {})
    if emulate is not None:
        _table(module, distinct, names, [binding_kinds(k) for k in kernels])
    text = _READONLY.sub(r'ptr noalias readonly %"ro.', _finish(str(module)))
    if emulate is None:
        text = _launch_bounds(text, {f.name: (low.threads, getattr(low, "blocks_per_sm", 1))
                                     for f, low in zip(fns, lowerings)})
    return text, [f.name for f in distinct]


def _launch_bounds(text: str, bounds: dict) -> str:
    """Each entry's block size and the blocks an SM should hold at once (CUDA's
    ``__launch_bounds__``: ptxas's .maxntid and .minnctapersm), so ptxas keeps the registers a
    thread uses within what that many blocks leave it."""
    def add(m):
        threads, blocks = bounds.get(m.group(2), (None, None))
        if threads is None:
            return m.group(0)
        return f'{m.group(1)} "nvvm.maxntid"="{threads}" "nvvm.minctasm"="{blocks}"\n{{'
    return re.sub(r'^(define ptx_kernel void @"([^"]+)"\(.*\)[^\n{]*"no-builtins")\n\{', add, text,
                  flags=re.M)


def launch_kind(k) -> str:
    """How a kernel is launched: GRID or SINGLE (lower.py)."""
    from mlpack.codegen.targets.cpu.procedure import PROCEDURE
    from mlpack.codegen.targets.cuda.lower import SINGLE

    return SINGLE if k.strategy == PROCEDURE else GRID
