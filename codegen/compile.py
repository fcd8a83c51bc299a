"""The compiler's front door: ONNX model -> verified, optimized IR graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir.graph import Graph
from .onnx.importer import import_model
from .passes.pipeline import run_pipeline


def compile_onnx(model: Any, specialize: dict[str, np.ndarray] | None = None) -> Graph:
    """Import ``model`` and run the pass pipeline over it."""
    return run_pipeline(import_model(model, specialize))
