"""Values: the named-dim expressions a DSL program computes with.

A ``Value`` is an IR scalar expression (spec/ir/expr.py) whose free loop variables are its dims:
reading tensor ``P`` with dims {n, x, ci} is the expression ``%P[n=n, x=x, ci=ci]`` over the
variables n, x, ci. Every operation keeps that reading:

* arithmetic and the scalar functions (scalar.py) combine expressions; a dim shared by name
  is the same variable, so ``P * W`` is aligned by name and broadcast over the dims only one
  of them has. No positional order exists anywhere;
* calling a value with keywords re-indexes dims: ``P(x=2*x + kx, y=2*y + ky)`` substitutes the
  variables x and y. The dims left out keep their own names, which is what lifts an operator
  over dims it never mentions (lift.py);
* a reduction (reduce.py) or ``materialize`` turns a value into a tensor: one comprehension.

Sizes travel with a value: each dim's known size (and where it came from, for messages), and
the *bounds* of reads whose index is not a bare variable (``2*x + kx < size of P's x``), from
which sizes.py infers the dims nothing else sizes. Two sizes of one dim that differ are a
``DimError`` naming the dim and both tensors, raised where the two meet.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.dsl.errors import DimError, DslError


@dataclass(frozen=True)
class Size:
    """A dim's size and where it was learned (``"P's x"``), for messages."""
    expr: Expr
    origin: str


@dataclass(frozen=True)
class Bound:
    """An unpadded read's index must lie in [0, extent): ``origin`` names the tensor's dim."""
    index: Expr
    extent: Expr
    origin: str


def size_text(e: Expr) -> str:
    return str(e.value) if e.is_const else repr(e)


def merge_size(sizes: dict, dim: str, new: Size | None) -> None:
    """Record ``new`` as ``dim``'s size in ``sizes``; a DimError if a different one is known."""
    old = sizes.get(dim)
    if new is None:
        sizes.setdefault(dim, None)
    elif old is None:
        sizes[dim] = new
    elif not ex.same_size(old.expr, new.expr):
        raise DimError(f"dim {dim} does not match: {old.origin} has size {size_text(old.expr)}, "
                       f"{new.origin} has {size_text(new.expr)}")


def _one_trace(*values):
    traces = {id(v.trace): v.trace for v in values if isinstance(v, Value) and v.trace is not None}
    if len(traces) > 1:
        raise DslError("values of two different traces are combined (a value outlived the "
                       "to_graph or import that made it)")
    return next(iter(traces.values()), None)


class Value:
    """A named-dim expression (see the module docstring). Build values from a trace's tensors,
    dims (``dsl.dims``), constants and the functions of this package; never by hand."""

    __slots__ = ("expr", "sizes", "bounds", "label", "scalars", "trace")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, expr: Expr, sizes: dict | None = None, bounds=(), label: str = "",
                 scalars=frozenset(), trace=None):
        self.expr = expr
        self.scalars = frozenset(scalars)   # procedure locals: variables that are not dims
        free = ex.free_vars(expr) - self.scalars
        sizes = dict(sizes or {})
        order = [d for d in sizes if d in free] + sorted(free - set(sizes))
        self.sizes: dict[str, Size | None] = {d: sizes.get(d) for d in order}
        self.bounds: tuple[Bound, ...] = tuple(dict.fromkeys(bounds))
        self.label = label or "the expression"
        self.trace = trace

    # ---------------------------------------------------------------- what it is
    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self.sizes)

    @property
    def dtype(self) -> str:
        return self.expr.dtype

    def size(self, dim: str) -> Expr:
        """The size of ``dim`` (an i64 IR expression, maybe symbolic)."""
        if dim not in self.sizes:
            raise DimError(f"{self.label} has no dim {dim} (its dims: {_names(self.dims)})")
        s = self.sizes[dim]
        if s is None:
            raise DimError(f"dim {dim} of {self.label} has no size yet (it is known once the "
                           "value is reduced or materialized)")
        return s.expr

    @property
    def tensor(self) -> str | None:
        """The tensor this value plainly reads (every dim at its own variable), or None."""
        e = self.expr
        if e.op != "read" or e.arg[2] is not None:
            return None
        name, dims, _ = e.arg
        if all(i.op == "var" and i.arg == d for d, i in zip(dims, e.args)):
            return name
        return None

    def __repr__(self) -> str:
        return f"<dsl value {self.label}: {self.dtype}{{{', '.join(self.dims)}}} = {self.expr!r}>"

    def __bool__(self):
        raise DslError(f"{self.label} has no truth value while an operator is traced; use "
                       "dsl.where for a choice per element, or a procedure's p.if_")

    __hash__ = object.__hash__

    # ---------------------------------------------------------------- re-indexing
    def __call__(self, pad=None, **index) -> "Value":
        """Re-index dims by name: ``P(x=2*x + kx, y=2*y + ky)``; ``pad=V``: out of range gives V
        (no bound is then implied). An index may read another tensor (a gather)."""
        if not index:
            return self
        for d in index:
            if d not in self.sizes:
                raise DimError(f"{self.label} has no dim {d} (its dims: {_names(self.dims)})")
        base = self
        if pad is not None and self.expr.op != "read":
            base = self._trace_or_fail("a padded read").materialize(self)  # pad guards one read
        idx = {d: _index(base, d, v) for d, v in index.items()}
        expr = ex.substitute(base.expr, {d: v.expr for d, v in idx.items()})
        if pad is not None:
            name, dims, _ = expr.arg
            expr = ex.read(name, dict(zip(dims, expr.args)), expr.dtype, pad=pad)
        sizes: dict = {}
        for d, s in base.sizes.items():   # a re-indexed dim's variables take its place
            if d in idx:
                for u in idx[d].sizes:
                    sizes.setdefault(u, None)
            else:
                merge_size(sizes, d, s)
        bounds = [Bound(ex.substitute(b.index, {d: v.expr for d, v in idx.items()}), b.extent,
                        b.origin) for b in base.bounds]
        scalars = set(base.scalars)
        for d, v in idx.items():
            scalars |= v.scalars
            bounds.extend(v.bounds)
            for u, s in v.sizes.items():
                merge_size(sizes, u, s)
            extent = base.sizes[d]
            if pad is not None or extent is None:
                continue
            origin = f"{base.label}'s {d}"
            if v.expr.op == "var" and v.expr.arg not in v.scalars:
                merge_size(sizes, v.expr.arg, Size(extent.expr, origin))
            else:
                bounds.append(Bound(v.expr, extent.expr, origin))
        return Value(expr, sizes, bounds, base.label, scalars, _one_trace(base, *idx.values()))

    def dim(self, name: str) -> "Dim":
        """The index variable ``name`` sized as this value's dim of that name (for an output
        that no unpadded read sizes: a "same" convolution's ``x = image.dim("x")``)."""
        return self._trace_or_fail("dim").dim(name, self.size(name))

    def rename(self, **names) -> "Value":
        """The same value with dims renamed: ``v.rename(t="time")``."""
        from_trace = self._trace_or_fail("rename")
        return self(**{old: from_trace.dim(new) for old, new in names.items()})

    def materialize(self, name: str | None = None) -> "Value":
        """This value computed into a tensor of its own (one comprehension), read back."""
        return self._trace_or_fail("materialize").materialize(self, name)

    def astype(self, dtype: str) -> "Value":
        return self._with(ex.cast(self.expr, dtype))

    def _with(self, expr: Expr) -> "Value":
        return Value(expr, self.sizes, self.bounds, self.label, self.scalars, self.trace)

    def _trace_or_fail(self, what: str):
        if self.trace is None:
            raise DslError(f"{what} needs a trace (dsl.to_graph, or an ONNX import)")
        return self.trace

    # ---------------------------------------------------------------- arithmetic
    def __add__(self, o): return apply("add", self, o)
    def __radd__(self, o): return apply("add", o, self)
    def __sub__(self, o): return apply("sub", self, o)
    def __rsub__(self, o): return apply("sub", o, self)
    def __mul__(self, o): return apply("mul", self, o)
    def __rmul__(self, o): return apply("mul", o, self)
    def __truediv__(self, o): return apply("div", self, o)
    def __rtruediv__(self, o): return apply("div", o, self)
    def __floordiv__(self, o): return apply("floordiv", self, o)
    def __rfloordiv__(self, o): return apply("floordiv", o, self)
    def __mod__(self, o): return apply("mod", self, o)
    def __rmod__(self, o): return apply("mod", o, self)
    def __pow__(self, o): return apply("pow", self, o)
    def __rpow__(self, o): return apply("pow", o, self)
    def __neg__(self): return apply("neg", self)
    def __abs__(self): return apply("abs", self)
    def __lt__(self, o): return apply("lt", self, o)
    def __le__(self, o): return apply("le", self, o)
    def __gt__(self, o): return apply("gt", self, o)
    def __ge__(self, o): return apply("ge", self, o)
    def __and__(self, o): return apply("and", self, o)
    def __or__(self, o): return apply("or", self, o)
    def __invert__(self): return apply("not", self)


class Dim(Value):
    """An index variable: a dim by name, optionally with a size (``dsl.dim("x", size=8)``)."""

    __slots__ = ("name",)

    def __init__(self, name: str, size=None, trace=None):
        sizes = {name: None if size is None else Size(ex.as_expr(size), f"dim {name}")}
        super().__init__(ex.var(name), sizes, label=f"dim {name}", trace=trace)
        self.name = name


def _names(dims) -> str:
    return ", ".join(dims) if dims else "none"


def _index(base: Value, dim: str, v) -> Value:
    """An index given for ``dim`` of ``base`` as an i64 value."""
    if isinstance(v, bool) or not isinstance(v, (int, Value)):
        raise DslError(f"the index of {base.label}'s {dim} must be an integer, a dim or an "
                       f"integer expression, not {type(v).__name__}")
    if isinstance(v, int):
        return Value(ex.const(v))
    if not dt.is_int(v.dtype):
        raise DimError(f"the index of {base.label}'s {dim} has dtype {v.dtype}, not an integer")
    return v if v.dtype == dt.INDEX else v._with(ex.cast(v.expr, dt.INDEX))


def as_value(x) -> Value:
    """A Value from a Value or a Python number (a constant with no dims)."""
    if isinstance(x, Value):
        return x
    if isinstance(x, (bool, int, float)):
        return Value(ex.const(x, "f32" if isinstance(x, float) else None))
    if hasattr(x, "dtype") and getattr(x, "shape", None) == ():   # a NumPy scalar
        return Value(ex.const(x.item(), dt.from_numpy(x.dtype)))
    raise DslError(f"a DSL operation got a {type(x).__name__}; give values, dims or numbers "
                   "(arrays become tensors with dsl.constant)")


def _operand(x, other):
    """The IR operand for ``x`` next to ``other``: Python numbers take the other's dtype."""
    if isinstance(x, (bool, int, float)) and isinstance(other, Value) and not isinstance(x, bool):
        if isinstance(x, float) and not dt.is_float(other.dtype):
            return ex.const(x, "f32")
        return ex.const(x, other.dtype)
    return as_value(x).expr


def _common(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """Operands of one dtype: an integer next to a float becomes that float (``x * 0.5`` for a
    dim x is f32, not f64 as NumPy's promotion would make it); otherwise the promoted dtype."""
    if a.dtype == b.dtype:
        return a, b
    if dt.is_float(a.dtype) != dt.is_float(b.dtype):
        want = a.dtype if dt.is_float(a.dtype) else b.dtype
    else:
        want = dt.promote(a.dtype, b.dtype)
    return ex.cast(a, want), ex.cast(b, want)


def apply(op: str, *args) -> Value:
    """The IR scalar op ``op`` applied to values (merging their dims, sizes and bounds)."""
    if op == "select":
        c, a, b = args
        exprs = [as_value(c).expr, *_common(_operand(a, b), _operand(b, a))]
    elif len(args) == 2:
        exprs = [_operand(args[0], args[1]), _operand(args[1], args[0])]
    else:
        exprs = [as_value(args[0]).expr]
    values = [a for a in args if isinstance(a, Value)]
    sizes: dict = {}
    for v in values:
        for d, s in v.sizes.items():
            merge_size(sizes, d, s)
    try:
        if op == "select":
            expr = ex.select(*exprs)
        elif op in ex.UNARY:
            expr = ex.unary(op, exprs[0])
        else:
            if op not in ex.LOGICAL:
                exprs = list(_common(*exprs))
            expr = ex.binary(op, *exprs)
    except (AssertionError, ValueError, KeyError) as e:
        raise DslError(f"{op} of {', '.join(x.dtype for x in map(as_value, args))}: {e}") from None
    labels = {v.label for v in values if v.label != "the expression"}
    label = labels.pop() if len(labels) == 1 and len(values) == 1 else "the expression"
    bounds = [b for v in values for b in v.bounds]
    scalars = frozenset().union(*(v.scalars for v in values))
    return Value(expr, sizes, bounds, label, scalars, _one_trace(*values))
