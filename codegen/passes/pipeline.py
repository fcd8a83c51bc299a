"""The pass pipeline: the passes, in order, in one place.

Each pass is ``fn(graph) -> graph``; ``MLPACK_DEBUG`` logs its name and time (1) and the IR
after it when it changed something (2). The verifier runs after every pass, so a pass that
breaks an invariant is named at once. A pass is switched off with MLPACK_DISABLE_PASSES=name,...
"""

from __future__ import annotations

import os
import time

from mlpack.codegen import debug
from mlpack.spec.ir.graph import Graph
from mlpack.spec.ir.printer import format_graph
from mlpack.spec.ir.verify import verify
from mlpack.codegen.passes.cse import eliminate_common_subexpressions
from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.passes.absorb import absorb_reductions
from mlpack.codegen.passes.affine_gather import fold_affine_gathers
from mlpack.codegen.passes.fold_scale import fold_scales
from mlpack.codegen.passes.split_dims import split_dims
from mlpack.codegen.passes.sums import merge_sums

PASSES = [
    ("dce", eliminate_dead_code),
    ("cse", eliminate_common_subexpressions),
    ("affine_gather", fold_affine_gathers),
    ("fuse", fuse_elementwise),
    ("fold_scale", fold_scales),
    ("sums", merge_sums),
    ("absorb", absorb_reductions),
    ("split_dims", split_dims),
    ("dce", eliminate_dead_code),
]


def run_pipeline(g: Graph, passes=None) -> Graph:
    disabled = set(filter(None, os.environ.get("MLPACK_DISABLE_PASSES", "").split(",")))
    verify(g)
    before = format_graph(g) if debug.level() >= 2 else None
    if before is not None:
        debug.log(f"IR after import:\n{before}", 2)
    for name, fn in passes or PASSES:
        if name in disabled:
            debug.log(f"pass {name}: disabled")
            continue
        t0 = time.perf_counter()
        g = fn(g)
        verify(g)
        debug.log(f"pass {name}: {1e3 * (time.perf_counter() - t0):.2f} ms")
        if before is not None:
            after = format_graph(g)
            if after != before:
                debug.log(f"IR after {name}:\n{after}", 2)
            before = after
    return g
