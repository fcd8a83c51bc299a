"""Tensor types for a DSL operator's inputs: a dtype and named dims with sizes.

    dsl.f32(n="batch", x=16, y=16, ci=32)      # n is the size symbol $batch

A size is an int, a symbol's name (``"batch"`` or ``"$batch"``) or an IR size expression.
The keywords' order is the order of the array a caller hands in from outside (a graph input's
layout); inside the DSL only the names count.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import TensorType
from mlpack.codegen.dsl.errors import DslError
from mlpack.codegen.dsl.trace import check_dim_name


def size_expr(size, where: str) -> Expr:
    """An IR size from an int, a symbol name or an expression."""
    if isinstance(size, bool):
        raise DslError(f"{where}: a size is an int or a symbol name, not a bool")
    if isinstance(size, int):
        if size < 0:
            raise DslError(f"{where}: size {size} is negative")
        return ex.const(size)
    if isinstance(size, str):
        name = size.removeprefix("$")
        check_dim_name(name)
        return ex.sym(name)
    if isinstance(size, Expr) and size.dtype == dt.INDEX:
        return size
    raise DslError(f"{where}: size {size!r} is not an int, a symbol name or a size expression")


@dataclass
class TensorSpec:
    """An input's dtype and dims (name -> size; the order only lays out outside arrays)."""
    dtype: str
    dims: dict[str, Expr]

    def __init__(self, dtype: str, **sizes):
        if dtype not in dt.DTYPES:
            raise DslError(f"unknown dtype {dtype!r}")
        self.dtype = dtype
        self.dims = {check_dim_name(d): size_expr(s, f"dim {d}") for d, s in sizes.items()}

    def type(self) -> TensorType:
        return TensorType(self.dtype, dict(self.dims))


def tensor(dtype: str, **sizes) -> TensorSpec:
    return TensorSpec(dtype, **sizes)


def f32(**sizes) -> TensorSpec: return TensorSpec("f32", **sizes)
def f16(**sizes) -> TensorSpec: return TensorSpec("f16", **sizes)
def f64(**sizes) -> TensorSpec: return TensorSpec("f64", **sizes)
def i64(**sizes) -> TensorSpec: return TensorSpec("i64", **sizes)
def i32(**sizes) -> TensorSpec: return TensorSpec("i32", **sizes)
