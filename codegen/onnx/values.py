"""ONNX-side values: an ordered view onto the IR's unordered tensors.

ONNX tensors have ordered axes; IR tensors have named, unordered dims. A ``Value`` bridges
them: ``shape`` is the ONNX shape (sizes as IR expressions, possibly symbolic), ``names`` are
the suggested dim names per axis, and ``at(index)`` returns the IR expression that reads the
value at an ONNX-ordered index. Data-movement ops (Transpose, Reshape, Squeeze, Unsqueeze,
Expand, Slice, broadcasting) only compose a new ``at``: they are views, not copies, and fold
into whichever op reads them.

``known`` holds the element values of small integer tensors when they are known at import time
(as IR expressions, so a shape computed by Shape->Gather->Concat keeps its symbols); it is how
shape inference stays symbolic through the shape arithmetic exporters emit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr


@dataclass
class Value:
    dtype: str
    shape: tuple[Expr, ...]
    at: Callable[[list[Expr]], Expr]
    names: tuple[str, ...] = ()
    known: list[Expr] | None = None   # flat element values (row-major), when known
    tensor: str | None = None         # the IR tensor, when this is a plain read of one
    data: np.ndarray | None = field(default=None, repr=False)  # constant data, when known

    def __post_init__(self):
        self.shape = tuple(ex.as_expr(s) for s in self.shape)
        if not self.names or len(self.names) != len(self.shape):
            self.names = tuple(f"d{i}" for i in range(len(self.shape)))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static_shape(self) -> tuple[int, ...] | None:
        if all(s.is_const for s in self.shape):
            return tuple(s.value for s in self.shape)
        return None

    def numel(self) -> Expr:
        return ex.product(self.shape)

    def known_ints(self) -> list[int] | None:
        """The element values as Python ints, when all are known constants."""
        if self.known is None or not all(k.is_const for k in self.known):
            return None
        return [int(k.value) for k in self.known]


def tensor_value(name: str, dtype: str, dims: list[tuple[str, Expr]], known=None, data=None) -> Value:
    """A Value that plainly reads IR tensor ``name`` whose dims, in ONNX order, are ``dims``."""
    names = tuple(d for d, _ in dims)

    def at(idx: list[Expr]) -> Expr:
        return ex.read(name, dict(zip(names, idx)), dtype)

    return Value(dtype, tuple(s for _, s in dims), at, names, known, name, data)


def view(base: Value, shape, at, names=None, known=None) -> Value:
    """A new view onto ``base``'s data (no tensor of its own)."""
    return Value(base.dtype, tuple(shape), at, tuple(names or ()), known, None,
                 None)
