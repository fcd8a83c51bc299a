"""``compile_cpu(graph, target)``: an optimized IR graph -> a cpu artifact (ELF + plan + weights)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mlpack.codegen import debug
from mlpack.spec.ir.graph import Graph
from mlpack.codegen.targets.cpu import checks, contraction, layout, narrowconv, winograd
from mlpack.codegen.targets.cpu.concat import split_concats
from mlpack.codegen.targets.cpu.kernels import build_kernels, reject_procedures
from mlpack.codegen.targets.cpu.link import link_shared
from mlpack.codegen.targets.cpu.module import build_module, optimize_and_emit, target_machine
from mlpack.codegen.targets.cpu.plan import make_plan, output_copies, tensor_buffers
from mlpack.codegen.targets.cpu.target import get_target


@dataclass
class CpuArtifact:
    """What the packager puts in a cpu artifact: the code layer, the config's plan, the weights."""
    elf: bytes
    plan: dict
    weights: dict[str, np.ndarray]
    target: str
    features: list[str]
    kernel_names: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    winograd: int = 0   # convolutions computed with Winograd's algorithm (winograd.py)


def schedule_kernels(graph: Graph, t, use_winograd: bool = True):
    """The kernels of ``graph`` for target ``t``, before the plan: (the graph as rewritten,
    kernels, buffers, concat aliases, convolutions on Winograd's algorithm)."""
    source = graph
    graph, aliases, parents = split_concats(layout.channels_last(graph))
    graph, rewritten = winograd.rewrite(graph, aliases, parents) if use_winograd else (graph, 0)
    bufs = tensor_buffers(graph)
    bufs.update(parents)
    kernels = contraction.apply(graph, build_kernels(graph, bufs, keep=aliases), bufs, t,
                                source)
    return graph, kernels, bufs, aliases, rewritten


def compile_cpu(graph: Graph, target: str, use_winograd: bool = True) -> CpuArtifact:
    """Compile ``graph`` (the output of ``compile_onnx``) for the cpu target named ``target``.
    ``use_winograd``: whether convolutions may use Winograd's algorithm where it pays (winograd.py;
    ``MLPACK_WINOGRAD=0`` turns it off too).

    Raises UnsupportedTargetError naming the op when some part of the graph cannot be lowered
    (procedures, an op without a lowering, an unsupported dtype)."""
    t = get_target(target)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    reject_procedures(graph)
    graph, kernels, bufs, aliases, rewritten = schedule_kernels(graph, t, use_winograd)
    copies, owners = output_copies(graph, bufs, len(kernels))
    narrowconv.unpack_ports(graph, bufs, owners)
    kernels += copies
    plan, weights = make_plan(graph, kernels, bufs, owners, aliases)
    weights = narrowconv.pack_weights(weights, bufs)
    tm = target_machine(t)
    text = build_module(kernels, bufs, plan["symbols"], t, tm)
    checks.add_to_plan(plan, kernels, graph.origins)   # (known once the kernels are lowered)
    debug.log(f"cpu {target}: LLVM IR before optimization:\n{text}", 3)
    times["lower"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    obj = optimize_and_emit(text, tm)
    times["llvm"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    elf = link_shared(obj)
    times["link"] = time.perf_counter() - t2
    debug.log(f"cpu {target}: {len(kernels)} kernels, lower {times['lower']:.2f}s, "
              f"llvm {times['llvm']:.2f}s, link {times['link']:.2f}s")
    return CpuArtifact(elf, plan, weights, t.name, list(t.features),
                       [k.name for k in kernels], times, rewritten)
