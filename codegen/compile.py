"""The compiler's front door: ONNX model -> verified, optimized IR graph."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mlpack.codegen import debug
from mlpack.spec.ir.graph import Graph
from mlpack.codegen.onnx.importer import import_model
from mlpack.codegen.passes.pipeline import run_pipeline


def compile_onnx(model: Any, specialize: dict[str, np.ndarray] | None = None) -> Graph:
    """Import ``model`` and run the pass pipeline over it."""
    t0 = time.perf_counter()
    g = import_model(model, specialize)
    debug.log(f"import: {1e3 * (time.perf_counter() - t0):.2f} ms, {len(g.ops)} ops")
    return run_pipeline(g)
