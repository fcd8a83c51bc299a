"""``compile_cpu(graph, target)``: an optimized IR graph -> a cpu artifact (ELF + plan + weights)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mlpack.codegen import debug, progress
from mlpack.codegen.passes.pipeline import run_passes
from mlpack.codegen.targets.base import Code
from mlpack.spec.ir.graph import Graph
from mlpack.spec.ir.verify import verify
from mlpack.codegen.targets.cpu import (bf16dot, checks, contraction, derived, gather, halo,
                                        layout, narrowconv, rowblocks, rows, tiles, winograd)
from mlpack.codegen.targets.cpu.concat import split_concats
from mlpack.codegen.targets.cpu.gemm import bf16_dot
from mlpack.codegen.targets.cpu.kernels import build_kernels, reject_procedures
from mlpack.codegen.targets.cpu.link import link_shared
from mlpack.codegen.targets.cpu.module import build_module, target_machine
from mlpack.codegen.targets.cpu.objects import emit_parts
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
    # passes whose rounding differs from the direct computation (Code.inexact_passes)
    inexact: tuple[str, ...] = ()
    # the weights beyond the graph's constants (every weight else is a constant as it is)
    extra: tuple[str, ...] = ()


@dataclass
class _Rewritten:
    """What the cpu target's passes leave beside the graph."""
    aliases: dict = field(default_factory=dict)   # tensor -> (concatenation, offset): concat.py
    parents: dict = field(default_factory=dict)   # the concatenations' buffers, no op writes them
    winograd: int = 0                             # convolutions on Winograd's algorithm
    bf16_products: int = 0                        # contractions of bf16 pairs (bf16dot.py)
    derived: dict = field(default_factory=dict)   # constants made from the weights (derived.py)
    tiles: list = field(default_factory=list)     # spans run point by point (tiles.py)
    blocks: list = field(default_factory=list)    # spans run a block of rows at a time


def target_passes(state: _Rewritten, t=None) -> list:
    """The cpu target's graph rewrites, in order, as named passes (codegen/passes/pipeline.py
    runs them: timed, verified, printed at MLPACK_DEBUG=2, MLPACK_DISABLE_PASSES=name). The
    last runs on targets that multiply bf16 pairs only (gemm.bf16_dot; None: every pass)."""

    def concatenations(g: Graph) -> Graph:
        g, state.aliases, state.parents = split_concats(g)
        return g

    def winograd_convolutions(g: Graph) -> Graph:
        g, state.winograd = winograd.rewrite(g, state.aliases, state.parents, state.derived)
        return g

    def channels(g: Graph) -> Graph:
        return layout.channels_last(g, state.derived)

    def point_tiles(g: Graph) -> Graph:
        state.tiles.clear()
        return tiles.point_tiles(g, state.tiles)

    def row_blocks(g: Graph) -> Graph:
        state.blocks.clear()
        return rowblocks.row_blocks(g, state.blocks)

    def bf16_products(g: Graph) -> Graph:
        g, state.bf16_products = bf16dot.round_activations(g, state.parents)
        return g

    passes = [("channels_last", channels), ("rows_first", rows.rows_first),
              ("gather_operands", gather.gathered_operands), ("split_concats", concatenations),
              ("winograd", winograd_convolutions), ("point_tiles", point_tiles),
              ("row_blocks", row_blocks)]
    if t is None or bf16_dot(t):
        passes.append(("bf16_products", bf16_products))
    return passes


def schedule_kernels(graph: Graph, t, disabled=frozenset()):
    """The kernels of ``graph`` for target ``t``, before the plan: (the graph as rewritten,
    kernels, buffers, concat aliases, convolutions on Winograd's algorithm). ``disabled``: the
    target's passes to leave out."""
    source, state = graph, _Rewritten()

    def check(g: Graph) -> None:   # a concatenation's buffer is written in place by its arms
        verify(g, external={name: g.types[name] for name in state.parents})

    graph = run_passes(graph, target_passes(state, t), where=f"cpu {t.name}", disabled=disabled,
                       check=check)
    bufs = tensor_buffers(graph)
    bufs.update(state.parents)
    points = {t: tile.dims for tile in state.tiles for t in tile.ops}
    points.update(rowblocks.points(state.blocks, graph))
    keep = {*state.aliases, *tiles.boundaries(state.tiles + state.blocks, graph)}
    kernels = halo.unguard_windows(build_kernels(graph, bufs, keep=keep, points=points), bufs)
    kernels = contraction.apply(graph, kernels, bufs, t, source)
    derived.inline(state.derived, kernels, bufs, source)
    made = derived.kernels(state.derived, graph, bufs, {r for k in kernels for r in k.reads},
                           source)
    outputs = {p.name for p in graph.outputs}
    kernels = tiles.group(made + kernels, state.tiles, bufs, outputs)
    kernels = rowblocks.group(kernels, state.blocks, bufs, outputs)
    return graph, kernels, bufs, state.aliases, state


def _log_assembly(mod, tm) -> None:
    if debug.level() >= 3:
        debug.log(f"cpu {tm.triple}: assembly after optimization:\n{tm.emit_assembly(mod)}", 3)


def compile_cpu(graph: Graph, target: str, disabled=frozenset()) -> CpuArtifact:
    """Compile ``graph`` (the output of ``compile_onnx``) for the cpu target named ``target``.
    ``disabled``: the target's passes to leave out (``target_passes``; MLPACK_DISABLE_PASSES
    adds to them), e.g. {"winograd"} for direct convolutions only.

    Raises UnsupportedTargetError naming the op when some part of the graph cannot be lowered
    (procedures, an op without a lowering, an unsupported dtype)."""
    t = get_target(target)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    reject_procedures(graph)
    progress.report("scheduling")
    source = graph
    graph, kernels, bufs, aliases, state = schedule_kernels(graph, t, disabled)
    copies, owners = output_copies(graph, bufs, len(kernels))
    narrowconv.unpack_ports(graph, bufs, owners)
    # the kernels run once at open last, so dispatch i of a run is kernel i of the library
    kernels = [k for k in kernels + copies if not k.prepare] + [k for k in kernels if k.prepare]
    plan, weights, extra = make_plan(graph, kernels, bufs, owners, aliases, source.constants)
    packed = narrowconv.pack_weights(weights, bufs)
    extra += tuple(n for n in weights if packed[n] is not weights[n] and n not in extra)
    weights = packed
    tm = target_machine(t)
    # (one part at MLPACK_DEBUG=3, so the assembly printed is the whole library's)
    texts = build_module(kernels, bufs, plan["symbols"], t, tm,
                         parts=1 if debug.level() >= 3 else None)
    checks.add_to_plan(plan, kernels, graph.origins)   # (known once the kernels are lowered)
    for text in texts:
        debug.log(f"cpu {target}: LLVM IR before optimization:\n{text}", 3)
    times["lower"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    progress.report("optimizing", len(kernels), len(kernels))
    objs = emit_parts(texts, t.triple, t.cpu, t.feature_string, _log_assembly)
    times["llvm"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    progress.report("linking", len(kernels), len(kernels))
    elf = link_shared(objs)
    times["link"] = time.perf_counter() - t2
    debug.log(f"cpu {target}: {len(kernels)} kernels, lower {times['lower']:.2f}s, "
              f"llvm {times['llvm']:.2f}s in {len(texts)} part{'s' * (len(texts) > 1)}, "
              f"link {times['link']:.2f}s")
    inexact = (("winograd",) if state.winograd else ()) + \
        (("bf16_products",) if state.bf16_products else ())
    return CpuArtifact(elf, plan, weights, t.name, list(t.features),
                       [k.name for k in kernels], times, state.winograd, inexact, extra)


def compile_artifact(graph: Graph, target: str, precision: str, disabled=frozenset()) -> Code:
    """The registry's entry (codegen/targets/base.py): ``compile_cpu`` as a target's ``Code``.
    ``disabled``: passes of this target not to run ("winograd")."""
    from mlpack.spec import media

    code = compile_cpu(graph, target, disabled)
    t = get_target(target)
    config = {"plan": code.plan,
              "cpu_features": media.config_cpu_features(code.features, t.arch)}
    return Code.beside_graph([(media.CODE_ELF, code.elf)], code.weights, code.extra, graph,
                             config, code.timings, code.inexact)
