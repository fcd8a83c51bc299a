"""``compile_portable``: an optimized IR graph (in its precision) -> the portable program (one
layer) and its weights, the graph's constants."""

from __future__ import annotations

from mlpack.codegen.targets.base import Code
from mlpack.spec import media
from mlpack.spec.ir.graph import Graph
from mlpack.spec.ir.program import dumps_program


def compile_portable(graph: Graph, target: str, precision: str, disabled=frozenset()) -> Code:
    return Code([(media.PROGRAM_PORTABLE, dumps_program(graph))], raw_weights=True)
