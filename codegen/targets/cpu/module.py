"""The kernel library as LLVM modules: kernels, the kernel table, parts compiled in parallel.

Everything is ``internal`` except ``mlpack_kernel_table_v1``, so the shared object's dynamic
symbol table holds that one symbol. Its table (runtime/c/include/mlpack_abi.h) is version 2 (ABI
1.3): per kernel its function, its name and its bindings, one character per buffer its dispatches
bind ('w' written, 'r' only read: procedure.binding_kinds), which the engine checks the plan
against; the string is built from the same list the lowering binds (``bound``), so the two
cannot drift. Every function carries ``"no-builtins"`` so that LLVM does
not turn a fill or copy loop into a ``memset``/``memcpy`` call the library could not resolve.
Loops whose bodies are unrolled as written get ``llvm.loop.unroll.disable`` (a distinct,
self-referencing loop id each: codegen/llvm/loops.py). Kernels whose code is identical share
one function (``_share_identical``); micro-kernels that differ only in sizes share one generic
body (generic.py). A big library is cut into parts that LLVM compiles in parallel processes
(``build_module``'s ``parts``, objects.py).
"""

from __future__ import annotations

import re

from llvmlite import ir

from mlpack.codegen import cores, progress
from mlpack.codegen.llvm.loops import LoopIds
from mlpack.codegen.llvm.types import I32, PTR
from mlpack.codegen.targets.cpu import generic, objects
from mlpack.codegen.targets.cpu.gemm import Contraction
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.lower import KernelLowering
from mlpack.codegen.targets.cpu.sharing import kernel_key, renamed_checks
from mlpack.codegen.targets.cpu.rowblocks import BlockTileLowering
from mlpack.codegen.targets.cpu.tiles import TileLowering
from mlpack.codegen.targets.cpu.procedure import (PROCEDURE, ProcedureLowering, binding_kinds,
                                                   kernel_bindings)
from mlpack.codegen.targets.cpu.target import CpuTarget

TABLE_SYMBOL = "mlpack_kernel_table_v1"
TABLE_VERSION = 2   # the table's layout (mlpack_abi.h's abi_version): with bindings, ABI 1.3
# A module of at least this many bytes of IR text per spare core is cut into parts that LLVM
# optimizes and emits in parallel processes (objects.py): about 3 s of LLVM per MB, so a part
# of 250 KB is 0.75 s, against a tenth of a second to start a helper and parse the parts'
# shared declarations again. Only cores no other compile holds count (codegen/cores.py).
PART_BYTES = 250_000


def target_machine(t: CpuTarget):
    return objects.machine(t.triple, t.cpu, t.feature_string)


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


def _share_identical(module: ir.Module, fns: list[ir.Function], names: list[str],
                     printed: dict[str, str],
                     canon: dict[str, str] | None = None) -> list[ir.Function]:
    """The table's functions, where a kernel whose code is identical to an earlier one's (a
    repeated layer: resnet50's 76 kernels are 52 distinct functions) is dropped from the module
    and its table entry points at the earlier function. Code is compared as LLVM text with the
    kernel's own name blanked and each metadata reference replaced by its content (loop ids
    differ only by their self-reference), so only the same instructions on the same constants
    and the same loop hints match; LLVM then optimizes each distinct function once.
    ``printed``: each kernel function's text by name (and its ``.impl``'s), filled in here, so
    the module is printed once. (Most repeats never get here: sharing.py finds them before
    lowering; a function listed twice is listed as it went the first time.)"""
    if canon is None:   # (``_metadata_forms``; the caller may have them already)
        canon = _metadata_forms(module)
    first: dict[str, ir.Function] = {}
    out = []
    shared: dict[int, ir.Function] = {}   # a function already listed (sharing.py): as it went
    for f, name in zip(fns, names):
        if id(f) in shared:
            out.append(shared[id(f)])
            continue
        impl = module.globals.get(f"{name}.impl")
        printed[f.name] = str(f)
        if impl is not None:
            printed[impl.name] = str(impl)
        text = printed[f.name] + ("" if impl is None else printed[impl.name])
        key = re.sub(r"!(\d+)", lambda m: canon.get(m.group(1), m.group(0)),
                     text.replace(name, "K"))
        kept = first.setdefault(key, f)
        if kept is not f:
            del module.globals[f.name]
            if impl is not None:
                del module.globals[impl.name]
        out.append(kept)
        shared[id(f)] = kept
    return out


def _micro_kernel(k: Kernel) -> bool:
    """Whether kernel ``k``'s body is the f32 (or int8) micro-kernel (microkernel.py)."""
    return k.strategy == "gemm" and isinstance(k.gemm, Contraction) and not k.gemm.amx


def _metadata_forms(module: ir.Module) -> dict[str, str]:
    """Each metadata node's content by its name, its references replaced by their content and
    a loop id's self-reference blanked: what a reference means, for comparing code."""
    canon: dict[str, str] = {}
    for md in module.metadata:   # defined before use: operands are canonical already
        body = str(md).split(" = ", 1)[1]
        body = re.sub(r"!(\d+)", lambda m: canon.get(m.group(1), m.group(0)), body)
        canon[md.name] = re.sub(r'"LOOPSELF\d+"', '"LOOPSELF"', body)
    return canon


def _share_sizes(kernels: list[ir.Function], printed: dict[str, str], micro: set[str],
                 canon: dict[str, str]) -> list[list[str]]:
    """The bodies of the micro-kernels (``micro``: their kernel names) among ``kernels`` that
    differ only in sizes made calls of one generic body each (generic.py), in ``printed``;
    returns the groups of kernel names that share one, which must go into the same part."""
    impls = {f"{f.name}.impl" for f in kernels if f.name in micro} & set(printed)
    bodies = {name: printed[name] for name in sorted(impls)}
    groups = generic.share_bodies(bodies, canon)
    printed.update(bodies)
    return [[name.removesuffix(".impl") for name in group] for group in groups]


def _split(kernels: list[ir.Function], printed: dict[str, str], parts: int,
           together: list[list[str]] = ()) -> list[set[str]]:
    """The distinct kernels' function names (each with its ``.impl``) dealt into ``parts`` sets
    of about equal IR text, the largest first (a kernel's text is a fair proxy for LLVM's time
    on it); the kernels of each list in ``together`` (callers of one generic body) as one."""
    unit = {name: group[0] for group in together for name in group}
    sizes: dict[str, int] = {}
    names: dict[str, set[str]] = {}
    for f in dict.fromkeys(kernels):
        u = unit.get(f.name, f.name)
        sizes[u] = sizes.get(u, 0) + len(printed[f.name]) + \
            len(printed.get(f"{f.name}.impl", ""))
        names.setdefault(u, set()).update({f.name, f"{f.name}.impl"})
    bins: list[tuple[int, set[str]]] = [(0, set()) for _ in range(parts)]
    for u in sorted(sizes, key=lambda n: -sizes[n]):
        i = min(range(parts), key=lambda j: bins[j][0])
        bins[i] = (bins[i][0] + sizes[u], bins[i][1] | names[u])
    return [names for _, names in bins if names] or [set()]


def _part_count(size: int) -> int:
    """How many parts a module of ``size`` bytes of IR text is cut into: one per core that no
    other compile of the build holds (``cores.share``), each of at least PART_BYTES."""
    return max(1, min(cores.share(), size // PART_BYTES))


def build_module(kernels: list[Kernel], buffers: dict[str, Buffer], symbols: list[str],
                 t: CpuTarget, tm, parts: int | None = None) -> list[str]:
    """The LLVM IR text (before optimization) of the kernel library, as one module or as
    ``parts`` modules (None: by size, ``_part_count``) that link into one library: the first
    holds the table and declares the others' kernels, which are ``hidden`` there (global in
    the link, absent from the dynamic symbol table); each part carries every helper function,
    constant and metadata node (LLVM drops what a part does not use)."""
    module = ir.Module(name="mlpack_kernels")
    module.triple = t.triple
    module.data_layout = str(tm.target_data)
    ids = LoopIds(module)
    # f16 loads use fpext where it is an instruction (F16C, aarch64; x86-64 v2 would call
    # __extendhfsf2). Stores use fptrunc only on aarch64: on x86 LLVM folds an f64 -> f32 -> f16
    # chain (pow, fmod, f64 casts) into one f64 -> f16 fptrunc, which is a __truncdfhf2 call.
    native_f16 = (t.arch == "arm64" or "f16c" in t.features, t.arch == "arm64")
    # (procedures, sequential code: procedure.py)
    lowering_of = {PROCEDURE: ProcedureLowering, "tile": TileLowering,
                   "rowblock": BlockTileLowering}
    lowerings = [lowering_of.get(k.strategy, KernelLowering)(
        module, k, buffers, symbols, ids, native_f16) for k in kernels]
    fns = []
    lowered: dict[tuple, tuple[int, list[str]]] = {}   # key -> (kernel, its tensors): sharing.py
    for i, (k, lowering) in enumerate(zip(kernels, lowerings)):
        keyed = kernel_key(k, buffers) if type(lowering) is KernelLowering else None
        if keyed is not None and keyed[0] in lowered:
            j, tensors = lowered[keyed[0]]
            fns.append(fns[j])   # the same code under other tensors' names
            k.checks = renamed_checks(kernels[j].checks, tensors, keyed[1])
        else:
            fns.append(lowering.emit())
            if keyed is not None:
                lowered[keyed[0]] = (i, keyed[1])
        progress.report("lowering", len(fns), len(lowerings))   # (a build's progress display)
    for k, lowering in zip(kernels, lowerings):
        # the table records what the plan binds (kernel_bindings); the code loads `bound`
        if list(lowering.bound) != kernel_bindings(k):
            raise AssertionError(f"cpu: kernel {k.name} loads bindings {lowering.bound}, but its "
                                 f"dispatch binds {kernel_bindings(k)}")
    printed: dict[str, str] = {}
    once = {k.name for k in kernels if k.prepare}
    canon = _metadata_forms(module)
    distinct = _share_identical(module, fns, [k.name for k in kernels], printed, canon)
    together = _share_sizes(distinct, printed, {k.name for k in kernels if _micro_kernel(k)},
                            canon)
    before = set(module.globals)
    _table(module, distinct, [k.name for k in kernels], [binding_kinds(k) for k in kernels])
    table = set(module.globals) - before
    # a point tile's members are functions of their own (tiles.py), dealt into parts as
    # kernels are: the tile's part declares those another part defines. Those of a tile whose
    # code repeats an earlier one's go with it (_share_identical): defined hidden in a part,
    # LLVM would keep and compile them, unused (GPT-2's 12 layers: 79 functions, not 24)
    members = {}
    for lowering, f, kept in zip(lowerings, fns, distinct):
        for name in getattr(lowering, "impls", ()):
            if f is kept:
                members[name] = lowering.k.name
            else:
                del module.globals[name]
    for name in members:
        printed[name] = str(module.globals[name])
    split = distinct + [module.globals[name] for name in members]
    if parts is None:
        parts = _part_count(sum(len(printed[n]) for f in set(split)
                                for n in (f.name, f"{f.name}.impl") if n in printed))
    groups = _split(split, printed, parts, together)
    owner = {name: i for i, names in enumerate(groups) for name in names}
    header = [f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
              f'target datalayout = "{module.data_layout}"', ""]
    header += [it.get_declaration() for it in module.get_identified_types().values()]
    metadata = module._get_metadata_lines()
    texts = []
    for i in range(len(groups)):
        lines = list(header)
        for name, g in module.globals.items():
            part = owner.get(name)
            if name in table and i != 0:
                continue
            if name in members:
                if part == i:
                    text = printed[name]
                    lines.append(text.replace("define internal ", "define hidden ", 1)
                                 if len(groups) > 1 else text)
                elif owner.get(members[name]) == i:
                    lines.append(str(ir.Function(ir.Module(), g.function_type, name)).replace(
                        "declare ", "declare hidden ", 1))
                continue
            if part is None or part == i:
                text = printed.get(name) or str(g)
                if part is not None and len(groups) > 1 and not name.endswith(".impl"):
                    # called through the table of part 0 (a kernel of part 0 stays internal)
                    text = text.replace("define internal ", "define hidden ", 1) if i else text
                lines.append(text)
            elif i == 0 and not name.endswith(".impl"):   # another part's kernel, in the table
                lines.append(str(ir.Function(ir.Module(), g.function_type, name)).replace(
                    "declare ", "declare hidden ", 1))
        texts.append(_finish("\n".join(lines + metadata), once))
    return texts


def _finish(text: str, once=frozenset()) -> str:
    """Loop ids made self-referencing, and every definition without libcalls synthesized from
    loops; the functions of the kernels ``once`` names (each runs once, when the engine opens
    the artifact: a weight packed) optimized for size, which takes LLVM a quarter of the time
    (vgg19's 19 panels: 1.9 -> 0.5 s) for a copy that runs once per open."""
    text = LoopIds.finalize(text)
    # x86-64: every function realigns its frame to a cache line, whatever the stack of the
    # thread that runs it (the ABI promises 16 bytes): 256- and 512-bit spills and the tile
    # buffers (line_alloca) then never split two lines (GoogLeNet's v4 artifact ran 20-60%
    # slower on the threads whose stacks fell off a 64-byte boundary)
    realign = ' "stackrealign"' if 'target triple = "x86_64' in text else ""

    def attrs(m) -> str:
        name = re.search(r'@"?([^"(]+)"?\(', m.group(1))
        small = name is not None and \
            name.group(1).removesuffix(".generic").removesuffix(".impl") in once
        return (f'{m.group(1)}{m.group(2) or ""} "no-builtins"{realign}'
                f'{" minsize optsize" if small else ""}\n{{')
    return re.sub(r"^(define .*\))( [^\n{]*)?\n\{", attrs, text, flags=re.M)
