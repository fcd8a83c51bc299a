"""Procedures: sequential code for what is not a comprehension (scans, sorts, NonZero).

    with dsl.procedure() as p:                   # a running sum along n
        out = p.output(x.dtype, n=x.size("n"))
        acc = p.local("acc", 0.0)
        with p.loop("n") as n:                   # for n in range(size of n)
            p.assign(acc, acc + x)               # x read at n: the loop variable is the dim
            p.store(out, acc)                    # out[n] = acc

Each statement is the IR's (spec/ir/graph.py): ``loop`` is ``for``, ``while_``/``if_``/
``else_`` are ``while``/``if``, ``local``/``assign`` are ``let``, ``store`` writes one element,
``size``/``set_size`` declare and set a data-dependent size. A store or read names dims only to
re-index them; every other dim is read at the variable of its own name, which must then be a
loop variable in scope (a ``DimError`` says which is not). The op joins the graph when the
``with`` block ends; its outputs are tensors like any other.

**Lifting.** Inside a lifted call (an ``op`` applied to inputs with more dims, or a custom ONNX
op whose inputs have more axes than it names: lift.py, onnx_bridge.py), the procedure runs once
per element of the dims it is lifted over: its statements are wrapped in loops over them
(outermost first), its outputs and scratch tensors get them as leading dims, and since those
dims are then loop variables, every read and store is at the current element, locals start
afresh for each. A data-dependent size cannot be lifted (each element would set its own), and
the procedure may not name a lifted dim itself: both are refused by name.
"""

from __future__ import annotations

from contextlib import contextmanager

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import For, If, Let, Procedure, SetSize, Store, TensorType, While
from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.tensors import size_expr
from mlpack.codegen.dsl.trace import check_dim_name, current
from mlpack.codegen.dsl.values import Dim, Value, as_value


class Local(Value):
    """A scalar local of a procedure (a ``let``): a value with no dims."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str, trace):
        super().__init__(ex.var(name, dtype), {}, label=f"local {name}", scalars={name},
                         trace=trace)
        self.name = name


class ProcedureBuilder:
    """The statements of one procedure being written; see the module docstring."""

    def __init__(self, trace):
        self.trace = trace
        self.results: dict[str, TensorType] = {}
        self.scratch_: dict[str, TensorType] = {}
        self.bounds: dict = {}
        self.body: list = []
        self._blocks = [self.body]
        self._scope: list[set[str]] = [set()]
        self._locals: dict[str, str] = {}
        self.lifted: dict = {}           # dim -> Size, outermost first
        for _, dims in trace.lifted:
            for d, size in dims.items():
                self.lifted.setdefault(d, size)
        for d, size in self.lifted.items():   # one run of the statements per lifted element
            loop = For(d, size.expr, [])
            self._blocks[-1].append(loop)
            self._blocks.append(loop.body)
            self._scope.append({d})

    # ---------------------------------------------------------------- tensors and sizes
    def _tensor(self, kind: dict, dtype: str, name: str | None, sizes: dict) -> Value:
        if not sizes:
            raise DslError("a procedure's tensor needs at least one dim (name=size)")
        for d in sizes:
            self.trace.check_not_lifted(check_dim_name(d), f"its procedure has a tensor with "
                                        f"a dim {d}")
        dims = {d: s.expr for d, s in self.lifted.items()}
        dims.update((d, size_expr(s, f"dim {d}")) for d, s in sizes.items())
        tname = self.trace.fresh(name or "proc")
        self.trace.graph.types[tname] = kind[tname] = TensorType(dtype, dims)
        self.trace.made.add(tname)
        return self.trace.tensor(tname, name)

    def output(self, dtype: str, name: str | None = None, **sizes) -> Value:
        """A result tensor of the procedure: ``p.output("f32", n=x.size("n"))``."""
        return self._tensor(self.results, dtype, name, sizes)

    def scratch(self, dtype: str, name: str | None = None, **sizes) -> Value:
        """A scratch tensor, local to the procedure."""
        return self._tensor(self.scratch_, dtype, name, sizes)

    def size(self, name: str, bound) -> ex.Expr:
        """A size the procedure sets (``set_size``), allocated at ``bound``: use it as a dim's
        size in ``output``."""
        if self.lifted:
            raise DslError(f"size {name}: a data-dependent size cannot be lifted over "
                           f"{', '.join(self.lifted)} (each element would set its own); give "
                           "the op inputs with only the dims it is about")
        self.bounds[check_dim_name(name)] = size_expr(bound, f"size {name}")
        return ex.sym(name)

    # ---------------------------------------------------------------- statements
    def _in_scope(self, v: Value, what: str) -> ex.Expr:
        scope = set().union(*self._scope)
        loose = [d for d in v.dims if d not in scope]
        if loose:
            raise DimError(f"{what}: dim {loose[0]} is not a loop variable here (loops: "
                           f"{', '.join(sorted(scope)) or 'none'}); index it or loop over it")
        return v.expr

    def local(self, name: str, value, dtype: str | None = None) -> Local:
        """Declare a scalar local with its first value (``let``)."""
        check_dim_name(name)
        value = as_value(value)
        dtype = dtype or value.dtype
        self._locals[name] = dtype
        self._blocks[-1].append(Let(name, ex.cast(self._in_scope(value, f"local {name}"), dtype)))
        self._scope[-1].add(name)
        return Local(name, dtype, self.trace)

    def assign(self, local: Local, value) -> None:
        """Give a local a new value (``let`` again)."""
        e = self._in_scope(as_value(value), f"assignment to {local.name}")
        self._blocks[-1].append(Let(local.name, ex.cast(e, self._locals[local.name])))

    def store(self, tensor: Value, value, **index) -> None:
        """``tensor[index] = value``; dims not in ``index`` are stored at their own variable."""
        name = tensor.tensor
        if name is None:
            raise DslError(f"store to {tensor.label}: only a tensor (p.output or p.scratch) "
                           "can be stored to")
        ty = self.trace.graph.types[name]
        for d in index:
            if d not in ty.dims:
                raise DimError(f"store to {tensor.label}: it has no dim {d} (its dims: "
                               f"{', '.join(ty.dims)})")
        idx = {}
        for d in ty.dims:
            iv = as_value(index.get(d, Dim(d)))
            if not dt.is_int(iv.dtype):
                raise DimError(f"store to {tensor.label}: the index of {d} is {iv.dtype}")
            idx[d] = ex.cast(self._in_scope(iv, f"store to {tensor.label}"), dt.INDEX)
        v = as_value(value)
        e = ex.cast(self._in_scope(v, f"store to {tensor.label}"), ty.dtype)
        self._blocks[-1].append(Store(name, idx, e))

    def set_size(self, name: str, value) -> None:
        """Set the data-dependent size ``name`` (declared with ``size``)."""
        if name not in self.bounds:
            raise DslError(f"set_size {name}: declare it first with p.size({name!r}, bound=...)")
        e = self._in_scope(as_value(value), f"set_size {name}")
        self._blocks[-1].append(SetSize(name, ex.cast(e, dt.INDEX)))

    @contextmanager
    def _block(self, stmt, body: list, scope: set[str]):
        self._blocks[-1].append(stmt)
        self._blocks.append(body)
        self._scope.append(scope)
        try:
            yield
        finally:
            self._blocks.pop()
            self._scope.pop()

    @contextmanager
    def loop(self, var, extent=None):
        """``for var in range(extent)``; ``var`` a name or a dim; the extent by default the
        dim's size (``p.loop(x.dim("n"))``) or that of the procedure's tensors' dim of that
        name."""
        name = var.name if isinstance(var, Dim) else check_dim_name(var)
        self.trace.check_not_lifted(name, f"its procedure loops over {name}")
        if extent is None and isinstance(var, Dim) and var.sizes[name] is not None:
            extent = var.sizes[name].expr          # p.loop(x.dim("n")): x's size of n
        if extent is None:
            extent = self._extent_of(name)
        e = size_expr(extent, f"loop {name}") if not isinstance(extent, Value) else \
            self._in_scope(extent, f"loop {name}")
        stmt = For(name, e, [])
        with self._block(stmt, stmt.body, {name}):
            yield Dim(name, None, self.trace)

    def _extent_of(self, name: str):
        for ty in list(self.results.values()) + list(self.scratch_.values()):
            if name in ty.dims:
                return ty.dims[name]
        raise DimError(f"loop {name}: no output or scratch tensor of the procedure has a dim "
                       f"{name}; give the extent (p.loop({name!r}, extent))")

    @contextmanager
    def while_(self, cond):
        stmt = While(self._in_scope(as_value(cond), "while"), [])
        with self._block(stmt, stmt.body, set()):
            yield

    @contextmanager
    def if_(self, cond):
        stmt = If(self._in_scope(as_value(cond), "if"), [], [])
        with self._block(stmt, stmt.then, set()):
            yield

    @contextmanager
    def else_(self):
        last = self._blocks[-1][-1] if self._blocks[-1] else None
        if not isinstance(last, If) or last.orelse:
            raise DslError("p.else_() must follow a p.if_() block")
        with self._block_only(last.orelse):
            yield

    @contextmanager
    def _block_only(self, body: list):
        self._blocks.append(body)
        self._scope.append(set())
        try:
            yield
        finally:
            self._blocks.pop()
            self._scope.pop()

    def finish(self) -> Procedure:
        if not self.results:
            raise DslError("a procedure needs at least one output (p.output)")
        for name in self.results.keys() | self.scratch_.keys():
            del self.trace.graph.types[name]      # add_op defines the results again; the
            # scratch tensors are the procedure's own (the graph's table lists none)
        op = Procedure(dict(self.results), self.body, dict(self.scratch_), dict(self.bounds))
        self.trace.graph.add_op(op)
        return op


@contextmanager
def procedure():
    """Write a procedure: ``with dsl.procedure() as p: ...`` (see the module docstring)."""
    trace = current()
    if trace.procedure is not None:
        raise DslError("procedures do not nest; write one procedure with nested loops")
    builder = ProcedureBuilder(trace)
    trace.procedure = builder
    try:
        yield builder
    finally:
        trace.procedure = None
    builder.finish()
