"""``compile_artifact(graph, target, precision)``: an optimized IR graph -> a cuda artifact.

The kernels and the plan are the cpu target's (codegen/targets/cpu/kernels.py builds the
kernels with their epilogues fused, plan.py places every tensor), without the cpu target's own
passes (channels last, Winograd), whose layouts serve CPU caches and vectors. Each dispatch's
``workgroups`` is its number of thread blocks, and the plan's ``cuda`` entry says how each
kernel is launched (``kernels``: its block size and whether it is a grid or a single thread)
and what the code needs (SM, PTX ISA version, driver). The code layers are the PTX and, where
ptxas is installed, a cubin of the level's SM (ptx.py). The ``cuda-emulated`` target compiles
the same kernels for the build host's CPU instead (module.py).
"""

from __future__ import annotations

import platform
import time

from mlpack.codegen import progress
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.passes.pipeline import disabled_passes
from mlpack.codegen.targets.base import Code
from mlpack.codegen.targets.cpu import checks, narrowconv
from mlpack.codegen.targets.cpu.kernels import build_kernels, reject_procedures
from mlpack.codegen.targets.cpu.plan import make_plan, output_copies, tensor_buffers
from mlpack.codegen.targets.cpu.procedure import binding_kinds
from mlpack.codegen.targets.cuda import module as cuda_module
from mlpack.codegen.targets.cuda import ptx as ptxmod
from mlpack.codegen.targets.cuda import mma, rowreduce, splitk, tiled
from mlpack.codegen.targets.cuda.lower import BLOCK, GRID
from mlpack.codegen.targets.cuda.target import CudaTarget, get_target
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.verify import verify
from mlpack.spec.ir.program import encode_expr

# a grid never needs more blocks than this: each thread loops over its share (2**31 - 1 is
# CUDA's limit; this keeps a block index times BLOCK inside 32 bits)
MAX_BLOCKS = 1 << 22


def blocks(k, bufs) -> ex.Expr:
    """A grid kernel's block count: ceil(elements / BLOCK), at least 1, at most MAX_BLOCKS."""
    out = bufs[k.out]
    n = ex.product([out.sizes[d] for d in out.layout])
    need = ex.floordiv(n + ex.const(BLOCK - 1), ex.const(BLOCK))
    return ex.simplify_size(ex.binary("max", ex.const(1), ex.binary("min", ex.const(MAX_BLOCKS), need)))


def schedule(graph, disabled=frozenset(), precision: str = "fp32"):
    """(kernels, buffers, plan, weights, launches, schedules, extra) of ``graph`` for the cuda
    target (``extra``: the weights made beside the graph's constants, plan.make_plan);
    ``disabled`` may name "split_k" (splitk.py), "tiled" and "group_reduce" (those kernels then
    run on the grid schedule) and "tensor_cores" (an fp16 or bf16 artifact's contractions then
    run on the f32 tiles)."""
    reject_procedures(graph)
    source = graph
    if splitk.PASS not in disabled:
        graph = splitk.split_k(graph)
        verify(graph)
    bufs = tensor_buffers(graph)
    kernels = build_kernels(graph, bufs)
    copies, owners = output_copies(graph, bufs, len(kernels))
    narrowconv.unpack_ports(graph, bufs, owners)
    kernels += copies
    for k in kernels:   # (kernel names become PTX entry names: module.entry_name)
        k.name = cuda_module.entry_name(k.name)
    plan, weights, extra = make_plan(graph, kernels, bufs, owners, raw=source.constants)
    packed = narrowconv.pack_weights(weights, bufs)
    extra += tuple(n for n in weights if packed[n] is not weights[n] and n not in extra)
    weights = packed
    launches, schedules = [], {}
    for k, disp in zip(kernels, plan["dispatches"]):
        kind = cuda_module.launch_kind(k)
        out = bufs[k.out]
        v = tiled.view(k, out) if kind == GRID and "tiled" not in disabled else None
        threads = BLOCK if kind == GRID else 1
        half = {"fp16": "f16", "bf16": "bf16"}.get(precision)
        if v is not None and half and mma.PASS not in disabled:
            schedules[k.name] = ("mma", v, half)
            disp["workgroups"], threads = encode_expr(mma.blocks(v, out, k.rdims)), mma.THREADS
        elif v is not None:
            schedules[k.name] = ("tiled", v)
            disp["workgroups"], threads = encode_expr(tiled.blocks(v, out, k.rdims)), tiled.THREADS
        elif kind == GRID and "group_reduce" not in disabled and rowreduce.suits(k, out):
            schedules[k.name] = ("group", None)
            disp["workgroups"], threads = encode_expr(rowreduce.blocks(out)), rowreduce.THREADS
        else:
            disp["workgroups"] = encode_expr(blocks(k, bufs)) if kind == GRID else 1
        launches.append({"name": k.name, "launch": kind, "block": threads,
                         "bindings": binding_kinds(k)})
    return kernels, bufs, plan, weights, launches, schedules, extra


def _host_cpu_target():
    """The build host's baseline cpu level, which the emulated kernels are compiled for."""
    from mlpack.codegen.targets.cpu.target import get_target as cpu_target

    arch = platform.machine().lower()
    return cpu_target({"x86_64": "x86_64-v2", "amd64": "x86_64-v2", "aarch64": "aarch64",
                       "arm64": "aarch64"}.get(arch, arch))


def compile_artifact(graph, target: str, precision: str, disabled=frozenset()) -> Code:
    """The registry's entry (codegen/targets/base.py) for the cuda levels and ``cuda-emulated``."""
    from mlpack.spec import media

    t = get_target(target)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    progress.report("scheduling")
    kernels, bufs, plan, weights, launches, schedules, extra = schedule(
        graph, frozenset(disabled) | disabled_passes(), precision)
    # tensor cores round the activations to 16 bits: a build whose artifact misses its
    # tolerance compiles it again without them (Code.inexact_passes)
    inexact = (mma.PASS,) if any(s[0] == "mma" for s in schedules.values()) else ()
    if t.emulated:
        return _emulated(graph, t, kernels, bufs, plan, weights, extra, launches, schedules, t0,
                         inexact)
    symbols = plan["symbols"]
    text, entries = cuda_module.build_module(kernels, bufs, symbols, schedules=schedules)
    for launch, entry in zip(launches, entries):
        launch["name"] = entry
    checks.add_to_plan(plan, kernels, graph.origins)
    plan["cuda"] = {"sm": t.sm, "ptx_isa": t.ptx_version, "driver": t.driver, "kernels": launches}
    times["lower"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    progress.report("optimizing", len(kernels), len(kernels))
    ptx = ptxmod.emit_ptx(text, t)
    times["llvm"] = time.perf_counter() - t1
    layers = [(media.CODE_PTX, ptx.encode())]
    ptxas = ptxmod.find_ptxas()
    if ptxas:
        t2 = time.perf_counter()
        progress.report("assembling", len(kernels), len(kernels))
        layers.append((media.CODE_CUBIN, ptxmod.assemble(ptx, t, ptxas)))
        times["ptxas"] = time.perf_counter() - t2
    config = {"plan": plan, "cuda_sm": t.sm}
    return Code.beside_graph(layers, weights, extra, graph, config, times, inexact)


def _emulated(graph, t: CudaTarget, kernels, bufs, plan, weights, extra, launches, schedules, t0,
              inexact=()) -> Code:
    from mlpack.codegen.targets.cpu.link import link_shared
    from mlpack.codegen.targets.cpu.objects import emit_parts
    from mlpack.spec import media

    host = _host_cpu_target()
    text, _ = cuda_module.build_module(kernels, bufs, plan["symbols"], emulate=host,
                                      schedules=schedules)
    checks.add_to_plan(plan, kernels, graph.origins)
    plan["cuda"] = {"sm": t.sm, "kernels": launches, "emulated": host.name}
    times = {"lower": time.perf_counter() - t0}
    t1 = time.perf_counter()
    objs = emit_parts([text], host.triple, host.cpu, host.feature_string)
    times["llvm"] = time.perf_counter() - t1
    elf = link_shared(objs)
    config = {"plan": plan,
              "cpu_features": media.config_cpu_features(list(host.features), host.arch)}
    return Code.beside_graph([(media.CODE_ELF, elf)], weights, extra, graph, config, times,
                             inexact)


__all__ = ["compile_artifact", "schedule", "blocks", "UnsupportedTargetError"]
