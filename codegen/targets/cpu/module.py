"""The kernel library as one LLVM module: kernels, the kernel table, optimization, object code.

Everything is ``internal`` except ``mlpack_kernel_table_v1``, so the shared object's dynamic
symbol table holds that one symbol. Its table (runtime/c/include/mlpack_abi.h) is version 2 (ABI
1.3): per kernel its function, its name and its bindings, one character per buffer its dispatches
bind ('w' written, 'r' only read: procedure.binding_kinds), which the engine checks the plan
against; the string is built from the same list the lowering binds (``bound``), so the two
cannot drift. Every function carries ``"no-builtins"`` so that LLVM does
not turn a fill or copy loop into a ``memset``/``memcpy`` call the library could not resolve.
Innermost loops get ``llvm.loop.vectorize.enable`` (a distinct, self-referencing loop id each:
codegen/llvm/loops.py).
"""

from __future__ import annotations

import re
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from mlpack.codegen import debug, progress
from mlpack.codegen.llvm.loops import LoopIds
from mlpack.codegen.llvm.types import I32, PTR
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.lower import KernelLowering
from mlpack.codegen.targets.cpu.procedure import (PROCEDURE, ProcedureLowering, binding_kinds,
                                                   kernel_bindings)
from mlpack.codegen.targets.cpu.target import CpuTarget

TABLE_SYMBOL = "mlpack_kernel_table_v1"
TABLE_VERSION = 2   # the table's layout (mlpack_abi.h's abi_version): with bindings, ABI 1.3
_INIT = threading.Lock()
_initialized = False


def init_llvm() -> None:
    global _initialized
    with _INIT:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def target_machine(t: CpuTarget):
    init_llvm()
    return llvm.Target.from_triple(t.triple).create_target_machine(
        cpu=t.cpu, features=t.feature_string, opt=3, reloc="pic", codemodel="default")


def _cstring(module: ir.Module, name: str, s: str) -> ir.GlobalVariable:
    data = bytearray(s.encode() + b"\0")
    ty = ir.ArrayType(ir.IntType(8), len(data))
    g = ir.GlobalVariable(module, ty, name=name)
    g.global_constant = True
    g.linkage = "private"
    g.initializer = ir.Constant(ty, data)
    return g


def _table(module: ir.Module, fns: list[ir.Function], names: list[str], bindings: list[str]) -> None:
    n = len(fns)
    arr = ir.ArrayType(PTR, n)
    kt = ir.GlobalVariable(module, arr, name="mlpack.kernels")
    kt.global_constant, kt.linkage = True, "internal"
    kt.initializer = ir.Constant(arr, list(fns))
    nt = ir.GlobalVariable(module, arr, name="mlpack.names")
    nt.global_constant, nt.linkage = True, "internal"
    nt.initializer = ir.Constant(arr, [_cstring(module, f"mlpack.name.{i}", s) for i, s in enumerate(names)])
    kinds: dict[str, ir.GlobalVariable] = {}   # one string per distinct signature ("wrr")
    for s in bindings:
        if s not in kinds:
            kinds[s] = _cstring(module, f"mlpack.bindings.{len(kinds)}", s)
    bt = ir.GlobalVariable(module, arr, name="mlpack.bindings")
    bt.global_constant, bt.linkage = True, "internal"
    bt.initializer = ir.Constant(arr, [kinds[s] for s in bindings])
    sty = ir.LiteralStructType([I32, I32, PTR, PTR, PTR])
    tab = ir.GlobalVariable(module, sty, name="mlpack.table")
    tab.global_constant, tab.linkage = True, "internal"
    tab.initializer = ir.Constant(sty, [ir.Constant(I32, TABLE_VERSION), ir.Constant(I32, n), kt, nt, bt])
    f = ir.Function(module, ir.FunctionType(PTR, []), name=TABLE_SYMBOL)
    f.attributes.add("nounwind")
    b = ir.IRBuilder(f.append_basic_block("entry"))
    b.ret(tab)


def _share_identical(module: ir.Module, fns: list[ir.Function], names: list[str]) -> list[ir.Function]:
    """The table's functions, where a kernel whose code is identical to an earlier one's (a
    repeated layer: resnet50's 76 kernels are 52 distinct functions) is dropped from the module
    and its table entry points at the earlier function. Code is compared as LLVM text with the
    kernel's own name blanked and each metadata reference replaced by its content (loop ids
    differ only by their self-reference), so only the same instructions on the same constants
    and the same loop hints match; LLVM then optimizes each distinct function once."""
    canon: dict[str, str] = {}
    for md in module.metadata:   # defined before use: operands are canonical already
        body = str(md).split(" = ", 1)[1]
        body = re.sub(r"!(\d+)", lambda m: canon.get(m.group(1), m.group(0)), body)
        canon[md.name] = re.sub(r'"LOOPSELF\d+"', '"LOOPSELF"', body)
    first: dict[str, ir.Function] = {}
    out = []
    for f, name in zip(fns, names):
        impl = module.globals.get(f"{name}.impl")
        text = str(f) + ("" if impl is None else str(impl))
        key = re.sub(r"!(\d+)", lambda m: canon.get(m.group(1), m.group(0)),
                     text.replace(name, "K"))
        kept = first.setdefault(key, f)
        if kept is not f:
            del module.globals[f.name]
            if impl is not None:
                del module.globals[impl.name]
        out.append(kept)
    return out


def build_module(kernels: list[Kernel], buffers: dict[str, Buffer], symbols: list[str],
                 t: CpuTarget, tm) -> str:
    """The module's LLVM IR text (before optimization)."""
    module = ir.Module(name="mlpack_kernels")
    module.triple = t.triple
    module.data_layout = str(tm.target_data)
    ids = LoopIds(module)
    # f16 loads use fpext where it is an instruction (F16C, aarch64; x86-64 v2 would call
    # __extendhfsf2). Stores use fptrunc only on aarch64: on x86 LLVM folds an f64 -> f32 -> f16
    # chain (pow, fmod, f64 casts) into one f64 -> f16 fptrunc, which is a __truncdfhf2 call.
    native_f16 = (t.arch == "arm64" or "f16c" in t.features, t.arch == "arm64")
    # (procedures, sequential code: procedure.py)
    lowerings = [(ProcedureLowering if k.strategy == PROCEDURE else KernelLowering)(
        module, k, buffers, symbols, ids, native_f16) for k in kernels]
    fns = []
    for lowering in lowerings:
        fns.append(lowering.emit())
        progress.report("lowering", len(fns), len(lowerings))   # (a build's progress display)
    for k, lowering in zip(kernels, lowerings):
        # the table records what the plan binds (kernel_bindings); the code loads `bound`
        if list(lowering.bound) != kernel_bindings(k):
            raise AssertionError(f"cpu: kernel {k.name} loads bindings {lowering.bound}, but its "
                                 f"dispatch binds {kernel_bindings(k)}")
    _table(module, _share_identical(module, fns, [k.name for k in kernels]),
           [k.name for k in kernels], [binding_kinds(k) for k in kernels])
    text = LoopIds.finalize(str(module))
    # every definition: no libcalls synthesized from loops
    return re.sub(r"^(define .*\))( [^\n{]*)?\n\{", lambda m: f'{m.group(1)}{m.group(2) or ""}'
                  f' "no-builtins"\n{{', text, flags=re.M)


def optimize_and_emit(text: str, tm) -> bytes:
    """Parse, verify, run the O3 pipeline with both vectorizers, return object code."""
    mod = llvm.parse_assembly(text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    if debug.level() >= 3:
        debug.log(f"cpu {tm.triple}: assembly after optimization:\n{tm.emit_assembly(mod)}", 3)
    return tm.emit_object(mod)
