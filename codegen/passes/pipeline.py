"""The pass pipeline: the passes, in order, in one place.

Each pass is ``fn(graph) -> graph``; ``MLPACK_DEBUG`` logs its name and time (1) and the IR
after it when it changed something (2). The verifier runs after every pass, so a pass that
breaks an invariant is named at once. A pass is switched off with MLPACK_DISABLE_PASSES=name,...
``run_passes`` is the runner; a target runs its own pass list through it (the cpu target's:
channels_last, split_concats, winograd in codegen/targets/cpu/compile.py), so every pass is
timed, verified, printed and switched off alike.
"""

from __future__ import annotations

import time

from mlpack.codegen import debug
from mlpack.spec import environment
from mlpack.spec.ir.graph import Graph
from mlpack.spec.ir.printer import format_graph
from mlpack.spec.ir.verify import verify
from mlpack.codegen.passes.cse import eliminate_common_subexpressions
from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.passes.divide_after import divide_after, scale_after
from mlpack.codegen.passes.absorb import absorb_reductions
from mlpack.codegen.passes.affine_gather import fold_affine_gathers
from mlpack.codegen.passes.fold_scale import fold_scales
from mlpack.codegen.passes.split_dims import split_dims
from mlpack.codegen.passes.unflatten import unflatten_dims
from mlpack.codegen.passes.sums import merge_sums
from mlpack.codegen.passes.recompute import recompute_intermediates

PASSES = [
    ("dce", eliminate_dead_code),
    ("cse", eliminate_common_subexpressions),
    ("affine_gather", fold_affine_gathers),
    ("fuse", fuse_elementwise),
    ("divide_after", divide_after),
    ("scale_after", scale_after),
    ("fold_scale", fold_scales),
    ("sums", merge_sums),
    ("absorb", absorb_reductions),
    ("recompute", recompute_intermediates),
    ("split_dims", split_dims),
    ("unflatten", unflatten_dims),   # (after split_dims has simplified the quotients)
    ("dce", eliminate_dead_code),
]


def disabled_passes() -> set[str]:
    """The passes MLPACK_DISABLE_PASSES names (the graph's and the targets' alike)."""
    return set(filter(None, environment.get("MLPACK_DISABLE_PASSES").split(",")))


def run_passes(g: Graph, passes, *, where: str = "", disabled=(), check=verify) -> Graph:
    """Run ``passes`` ((name, fn(graph) -> graph), in order) on ``g``: each is timed and logged
    (MLPACK_DEBUG=1), ``check``ed after it runs, its IR printed when it changed something
    (MLPACK_DEBUG=2); one named in ``disabled`` or MLPACK_DISABLE_PASSES is left out. ``where``
    prefixes the log lines (a target's passes say which target)."""
    off = disabled_passes() | set(disabled)
    prefix = f"{where}: " if where else ""
    before = format_graph(g) if debug.level() >= 2 else None
    for name, fn in passes:
        if name in off:
            debug.log(f"{prefix}pass {name}: disabled")
            continue
        t0 = time.perf_counter()
        g = fn(g)
        check(g)
        debug.log(f"{prefix}pass {name}: {1e3 * (time.perf_counter() - t0):.2f} ms")
        if before is not None:
            after = format_graph(g)
            if after != before:
                debug.log(f"{prefix}IR after {name}:\n{after}", 2)
            before = after
    return g


def run_pipeline(g: Graph, passes=None) -> Graph:
    """The graph passes (PASSES) on an imported graph, verified before and after each."""
    verify(g)
    if debug.level() >= 2:
        debug.log(f"IR after import:\n{format_graph(g)}", 2)
    return run_passes(g, PASSES if passes is None else passes)
