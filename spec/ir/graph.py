"""Tensor types, ops and graphs: the containers of the IR.

A ``TensorType`` is a dtype plus a *set* of named dimensions, each sized by an ``i64``
expression over symbols (``$batch``). No order lives in the type; the order of a buffer
(its layout) is chosen per materialized buffer, and only graph inputs, outputs and constants
carry one, because the outside world hands us ordered arrays.

Two kinds of op produce tensors:

* ``Comprehension``: ``out[d...] = reduce over r... of body``, where ``body`` is a scalar
  expression (see expr.py) over the output and reduction variables.
* ``Procedure``: explicit sequential statements (loops, ifs, scalar locals, stores) for what is
  not a comprehension (TopK, sort, NonZero, NonMaxSuppression). It may define data-dependent
  sizes: an output dim sized by a symbol the body sets, allocated at a declared bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr, walk

REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "argmax_last", "argmin_last")


@dataclass
class TensorType:
    dtype: str
    dims: dict[str, Expr]  # name -> size; equality ignores order

    def __post_init__(self):
        self.dims = {d: ex.as_expr(s) for d, s in self.dims.items()}

    def __eq__(self, other):
        return (isinstance(other, TensorType) and self.dtype == other.dtype
                and self.dims.keys() == other.dims.keys()
                and all(ex.same_size(s, other.dims[d]) for d, s in self.dims.items()))

    def size(self, dim: str) -> Expr:
        return self.dims[dim]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def static_shape(self, order) -> tuple[int, ...] | None:
        sizes = [self.dims[d] for d in order]
        if all(s.is_const for s in sizes):
            return tuple(s.value for s in sizes)
        return None


@dataclass
class Port:
    """A graph input or output: a tensor and the order of its dims outside the graph."""
    name: str
    layout: tuple[str, ...]


@dataclass
class Constant:
    """Constant data; ``data`` holds its axes in ``layout`` order."""
    name: str
    type: TensorType
    layout: tuple[str, ...]
    data: np.ndarray

    def __eq__(self, other):
        return (isinstance(other, Constant) and self.name == other.name and self.type == other.type
                and self.layout == other.layout and self.data.dtype == other.data.dtype
                and self.data.shape == other.data.shape
                and np.array_equal(self.data, other.data, equal_nan=dt.is_float(self.type.dtype)))


@dataclass
class Comprehension:
    out: str
    type: TensorType
    body: Expr
    reduce: str | None = None          # one of REDUCTIONS, or None for a map
    rdims: dict[str, Expr] = field(default_factory=dict)  # reduction variables and their extents

    def __post_init__(self):
        self.rdims = {d: ex.as_expr(s) for d, s in self.rdims.items()}

    @property
    def outs(self) -> list[str]:
        return [self.out]

    @property
    def loop_dims(self) -> dict[str, Expr]:
        return {**self.type.dims, **self.rdims}

    def __eq__(self, other):
        return (isinstance(other, Comprehension) and self.out == other.out and self.type == other.type
                and self.body == other.body and self.reduce == other.reduce
                and self.rdims.keys() == other.rdims.keys()
                and all(ex.same_size(v, other.rdims[k]) for k, v in self.rdims.items()))


# ---------------------------------------------------------------- procedural statements


@dataclass
class Let:
    """Assign a scalar local (a ``var`` with a dtype); the first assignment declares it."""
    name: str
    value: Expr


@dataclass
class Store:
    tensor: str
    index: dict[str, Expr]
    value: Expr


@dataclass
class For:
    var: str
    extent: Expr
    body: list["Stmt"]


@dataclass
class While:
    cond: Expr
    body: list["Stmt"]


@dataclass
class If:
    cond: Expr
    then: list["Stmt"]
    orelse: list["Stmt"] = field(default_factory=list)


@dataclass
class SetSize:
    """Define a data-dependent size symbol (the procedure's output is trimmed to it)."""
    sym: str
    value: Expr


Stmt = Union[Let, Store, For, While, If, SetSize]


@dataclass
class Procedure:
    """Sequential code over tensors.

    results: output tensors (name -> type); locals_: scratch tensors, same form.
    bounds:  for each size symbol the body defines with SetSize, the upper bound it is
             allocated at.
    """
    results: dict[str, TensorType]
    body: list[Stmt]
    locals_: dict[str, TensorType] = field(default_factory=dict)
    bounds: dict[str, Expr] = field(default_factory=dict)

    @property
    def outs(self) -> list[str]:
        return list(self.results)


Op = Union[Comprehension, Procedure]


@dataclass
class Graph:
    name: str
    inputs: list[Port] = field(default_factory=list)
    outputs: list[Port] = field(default_factory=list)
    constants: dict[str, Constant] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)  # every tensor, inputs included
    # (tensor, dim) -> the ONNX node that indexes it with data, for messages (origins.py)
    origins: dict = field(default_factory=dict)

    def type_of(self, name: str) -> TensorType:
        return self.types[name]

    def producers(self) -> dict[str, Op]:
        return {o: op for op in self.ops for o in op.outs}

    def add_op(self, op: Op) -> Op:
        self.ops.append(op)
        if isinstance(op, Comprehension):
            self.types[op.out] = op.type
        else:
            self.types.update(op.results)
        return op

    def add_constant(self, c: Constant) -> Constant:
        self.constants[c.name] = c
        self.types[c.name] = c.type
        return c

    def add_input(self, name: str, type_: TensorType, layout) -> Port:
        port = Port(name, tuple(layout))
        self.inputs.append(port)
        self.types[name] = type_
        return port

    def symbols(self) -> list[str]:
        """Size symbols, in order of first appearance (inputs first)."""
        seen: dict[str, None] = {}
        for p in self.inputs:
            for s in self.types[p.name].dims.values():
                for n in sorted(ex.free_syms(s)):
                    seen.setdefault(n)
        for op in self.ops:
            if isinstance(op, Procedure):
                for n in op.bounds:
                    seen.setdefault(n)
        return list(seen)

    def __eq__(self, other):
        return (isinstance(other, Graph) and self.name == other.name and self.inputs == other.inputs
                and self.outputs == other.outputs and self.constants == other.constants
                and self.ops == other.ops and self.types.keys() == other.types.keys()
                and all(t == other.types[n] for n, t in self.types.items()))

    def __str__(self) -> str:
        from mlpack.spec.ir.printer import format_graph
        return format_graph(self)


def stmt_exprs(stmts):
    """Every expression of a procedure's statements (values, indices, extents, conditions),
    nested bodies included."""
    for s in stmts:
        if isinstance(s, (Let, SetSize)):
            yield s.value
        elif isinstance(s, Store):
            yield s.value
            yield from s.index.values()
        elif isinstance(s, For):
            yield s.extent
            yield from stmt_exprs(s.body)
        elif isinstance(s, While):
            yield s.cond
            yield from stmt_exprs(s.body)
        elif isinstance(s, If):
            yield s.cond
            yield from stmt_exprs(s.then)
            yield from stmt_exprs(s.orelse)


def _stmt_reads(stmts, out: set[str]) -> None:
    for e in stmt_exprs(stmts):
        out.update(n.arg[0] for n in walk(e) if n.op == "read")


def tensors_read(op) -> set[str]:
    """Names of the tensors an op reads."""
    out: set[str] = set()
    if isinstance(op, Comprehension):
        out.update(n.arg[0] for n in walk(op.body) if n.op == "read")
    else:
        _stmt_reads(op.body, out)
        out -= set(op.results) | set(op.locals_)
    return out
