"""The trace: the IR graph a DSL program is building, and the ways values become tensors.

A ``Trace`` wraps an IR ``Graph`` (a new one for ``dsl.to_graph``, the importer's for a custom
ONNX op) and a name allocator. DSL functions run inside one (``with trace:``); ``dsl.dim``,
``dsl.dims`` and ``dsl.constant`` use the innermost active trace, and every value made from
its tensors carries it. ``materialize`` is the one place a value becomes an op: a single
comprehension whose output dims are the value's dims not reduced over, sized by sizes.py.

It also keeps the stack of lifted calls (lift.py), so that an operator naming a dim of its own
the same as a dim it is lifted over is refused by name instead of silently joining the two.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, TensorType
from mlpack.codegen.dsl import sizes as sz
from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.values import Dim, Size, Value

_ACTIVE: list["Trace"] = []
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_dim_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise DslError(f"dim name {name!r} is not an identifier (letters, digits, _)")
    return name


class Trace:
    """The graph under construction; use as ``with Trace(graph):``."""

    def __init__(self, graph: Graph, fresh=None):
        self.graph = graph
        self._fresh = fresh
        self._counter = itertools.count()
        # (operator, {dim it is lifted over: its Size}), outermost call first
        self.lifted: list[tuple[str, dict]] = []
        self.procedure = None                            # the procedure being written, if any
        self.made: set[str] = set()                      # tensors this trace's ops define

    def __enter__(self) -> "Trace":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    # ---------------------------------------------------------------- names and tensors
    def fresh(self, hint: str = "t") -> str:
        hint = re.sub(r"[^A-Za-z0-9_.]", "_", hint or "t") or "t"
        if self._fresh is not None:
            return self._fresh(hint)
        name = hint
        while name in self.graph.types:
            name = f"{hint}.{next(self._counter)}"
        return name

    def tensor(self, name: str, label: str | None = None) -> Value:
        """A value that reads tensor ``name`` of the graph at its own dims."""
        ty = self.graph.types[name]
        label = label or name
        read = ex.read(name, {d: ex.var(d) for d in ty.dims}, ty.dtype)
        sizes = {d: Size(s, f"{label}'s {d}") for d, s in ty.dims.items()}
        return Value(read, sizes, label=label, trace=self)

    def dim(self, name: str, size=None) -> Dim:
        check_dim_name(name)
        self.check_not_lifted(name, f"names a dim {name} of its own")
        return Dim(name, size, self)

    def check_not_lifted(self, name: str, what: str) -> None:
        for op, dims in self.lifted:
            if name in dims:
                raise DimError(f"{op} is lifted over dim {name} of its inputs and {what}; "
                               f"rename the input's dim first (value.rename({name}=...))")

    def constant(self, data, dims, name: str | None = None) -> Value:
        data = np.ascontiguousarray(data)
        names = dims.split() if isinstance(dims, str) else list(dims)
        if len(names) != data.ndim or len(set(names)) != len(names):
            raise DimError(f"constant {name or ''} of shape {data.shape} is given dims {names}: "
                           "name each axis once")
        for d in names:
            check_dim_name(d)
            self.check_not_lifted(d, f"has a constant with a dim {d}")
        try:
            dtype = dt.from_numpy(data.dtype)
        except KeyError:
            raise DslError(f"constant {name or ''} has dtype {data.dtype}, which the IR has no "
                           "type for") from None
        cname = self.fresh(name or "const")
        ty = TensorType(dtype, {d: ex.const(int(n)) for d, n in zip(names, data.shape)})
        self.graph.add_constant(Constant(cname, ty, tuple(names), data))
        return self.tensor(cname, name)

    # ---------------------------------------------------------------- values into tensors
    def materialize(self, value: Value, name: str | None = None, reduce: str | None = None,
                    over=(), hint: str | None = None, force: bool = False) -> Value:
        """``value`` as a tensor: one comprehension, a reduction ``reduce`` over ``over``;
        a value that already reads a whole tensor is that tensor unless ``force``."""
        if reduce is None and name is None and value.tensor is not None and not force:
            return value
        where = f"{reduce} over {', '.join(over)}" if reduce else (name or "the result")
        if self.procedure is not None:
            raise DslError(f"{where}: a reduction or tensor cannot be made inside a procedure; "
                           "compute it before the procedure starts")
        if value.scalars:
            raise DslError(f"{where} reads procedure locals {sorted(value.scalars)} outside "
                           "their procedure")
        sizes = sz.resolve(value.sizes, value.bounds, where)
        sz.check(value.bounds, sizes)
        body = value.expr
        kind = (reduce or "").startswith("arg")
        out = {d: sizes[d].expr for d in value.dims if d not in over}
        tname = self.fresh(name or hint or (reduce or "t"))
        ty = TensorType("i64" if kind else body.dtype, out)
        self.graph.add_op(Comprehension(tname, ty, body, reduce,
                                        {d: sizes[d].expr for d in over}))
        self.made.add(tname)
        return self.tensor(tname, name)


def current() -> Trace:
    """The innermost active trace; a DslError outside any."""
    if not _ACTIVE:
        raise DslError("DSL operations run inside a trace: dsl.to_graph(fn, ...) or an ONNX "
                       "import of a registered custom op")
    return _ACTIVE[-1]


def dim(name: str, size=None) -> Dim:
    """An index variable named ``name`` (the dim of every tensor it indexes by that name);
    ``size`` where no read sizes it (a padded output, say)."""
    return current().dim(name, size)


def dims(names: str, like: Value | None = None) -> tuple[Dim, ...]:
    """Several index variables at once: ``x, y, kx, ky = dsl.dims("x y kx ky")``; with
    ``like``, each sized as that value's dim of the same name."""
    if like is not None:
        return tuple(like.dim(n) for n in names.split())
    return tuple(current().dim(n) for n in names.split())


def constant(data, dims, name: str | None = None) -> Value:
    """A constant tensor from a NumPy array; ``dims`` names its axes (``"kx ky ci co"``)."""
    return current().constant(data, dims, name)
