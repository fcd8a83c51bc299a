"""The mlpack IR: named-dimension tensor types, comprehensions and procedures.

The IR is given four ways that agree: its data structures (graph.py, expr.py), its text form
(printer.py, parser.py), its verifier (verify.py) and its NumPy meaning (interp.py).

It lives in ``mlpack.spec`` because the portable artifact *is* an IR program (program.py
serializes it): the runtime, which may import only ``mlpack.spec``, must decode, verify and
interpret it, while the compiler (``mlpack.codegen``) builds and transforms it.
"""

from mlpack.spec.ir import dtypes
from mlpack.spec.ir.expr import Expr, cast, const, read, select, sym, var
from mlpack.spec.ir.graph import (Comprehension, Constant, For, Graph, If, Let, Port, Procedure,
                                  SetSize, Store, TensorType, While)
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.ir.parser import parse_expr, parse_graph
from mlpack.spec.ir.printer import format_expr, format_graph
from mlpack.spec.ir.verify import verify

__all__ = [
    "Comprehension", "Constant", "Expr", "For", "Graph", "If", "Let", "Port", "Procedure",
    "SetSize", "Store", "TensorType", "While", "cast", "const", "dtypes", "format_expr",
    "format_graph", "parse_expr", "parse_graph", "read", "run_graph", "select", "sym", "var",
    "verify",
]
