"""Reductions: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, CumSum/CumProd.

Each reduction is one comprehension over the kept axes with the reduced axes as reduction
variables; the ONNX flavours differ only in what is reduced (``pre``: |x|, x*x, exp(x - max))
and what is applied to the result (``post``: sqrt, log, / count). The softmax family is the
numerically stable form: subtract the row max before exp. Cumulative ops are comprehensions
too: out[i] = sum over r of (r <= i ? x[r] : 0), no sequential scan needed.
"""

from __future__ import annotations

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op


# ---------------------------------------------------------------- axes


def norm_axis(n, axis: int, rank: int) -> int:
    """A possibly negative axis as 0..rank-1 (rank 0 accepts axis 0 / -1)."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise n.shape_error(f"axis {axis} is out of range for rank {rank}")
    return a


def _axes_from_input(n) -> bool:
    """Whether this opset gives axes as an input (ReduceSum from 13, the others from 18)."""
    return n.opset >= (13 if n.op_type == "ReduceSum" else 18)


def reduce_axes(b, n, rank: int) -> list[int] | None:
    """The sorted axes to reduce; [] for a no-op (noop_with_empty_axes), None for all."""
    if _axes_from_input(n):
        axes = b.static_ints(n.input(1), "axes") if n.input(1) is not None else []
        if not axes:
            return [] if n.attr("noop_with_empty_axes") else None
    else:
        axes = n.attr("axes")
        if not axes:
            return None
    return sorted({norm_axis(n, a, rank) for a in axes})


def tmp(b, what: str) -> str:
    """A name hint for an intermediate tensor: the node's outputs keep their own names."""
    out = b.node.output_names[0] if b.node is not None and b.node.output_names else "t"
    return f"{out}_{what}"


def reduce_over(b, kind, x, axes, keepdims: bool, pre=lambda v: v, dtype=None, hint=None):
    """kind over ``axes`` of pre(x): one comprehension; keepdims leaves size-1 axes.
    ``hint`` names an intermediate result (None: this is the node's result)."""
    dtype = dtype or x.dtype
    kept = [i for i in range(x.rank) if i not in axes]
    if keepdims:
        shape = [ex.const(1) if i in axes else x.shape[i] for i in range(x.rank)]
        names = list(x.names)
    else:
        shape = [x.shape[i] for i in kept]
        names = [x.names[i] for i in kept]

    def body(o, r):
        it_o, it_r = iter(o), iter(r)
        idx = []
        for i in range(x.rank):
            if i in axes:
                idx.append(next(it_r))
                if keepdims:
                    next(it_o)
            else:
                idx.append(next(it_o))
        return pre(x.at(idx))

    if not axes:  # nothing to reduce: an elementwise map
        return b.map(dtype, shape, lambda o: body(o, []), names, hint=hint)
    return b.reduce(kind, dtype, shape, [x.shape[i] for i in axes], body, names,
                    [f"r_{x.names[i]}" for i in axes], hint=hint)


def count(x, axes) -> ex.Expr:
    return ex.product([x.shape[i] for i in axes])


def _insert_zeros(idx, axes, rank):
    it = iter(idx)
    return [ex.const(0) if a in axes else next(it) for a in range(rank)]


def reduce_indexed(b, kind, x, axes, keep, fn, hint=None, dtype=None):
    """Like reduce_over, but fn gets the full input index (to read other tensors too)."""
    class _V:  # a stand-in whose at() hands fn the index instead of reading x
        rank, shape, names = x.rank, x.shape, x.names
        at = staticmethod(fn)
    return reduce_over(b, kind, _V, axes, keep, dtype=dtype or x.dtype, hint=hint)


def bcast_reduced(r, axes):
    """Read a keepdims reduction result at a full input index."""
    return lambda i: r.at([ex.const(0) if a in axes else j for a, j in enumerate(i)])


# ---------------------------------------------------------------- Reduce*


def _c(v, dtype):
    return ex.const(v, dtype)


def _log_sum_exp(b, x, axes, keep):
    """log(sum(exp(x - m))) + m with m the max (0 when the max is infinite, so an empty or
    all -inf reduction gives -inf instead of NaN)."""
    if not dt.is_float(x.dtype):
        s = reduce_over(b, "sum", x, axes, keep, lambda v: ex.unary("exp", v), hint=tmp(b, "sum"))
        return b.map(x.dtype, s.shape, lambda i: ex.unary("log", s.at(i)), s.names)
    m = reduce_over(b, "max", x, axes, True, hint=tmp(b, "max"))
    m0 = b.map(x.dtype, m.shape, lambda i: ex.select(
        ex.unary("isinf", m.at(i)), _c(0, x.dtype), m.at(i)), m.names, hint=tmp(b, "shift"))
    shift = bcast_reduced(m0, axes)
    s = reduce_indexed(b, "sum", x, axes, keep, lambda i: ex.unary("exp", x.at(i) - shift(i)),
                        hint=tmp(b, "sum"))

    def out(i):  # i indexes s; m0 has every reduced axis kept
        full = i if keep else _insert_zeros(i, axes, x.rank)
        return ex.unary("log", s.at(i)) + m0.at(full)

    return b.map(x.dtype, s.shape, out, s.names)


def _sq(v):
    return v * v


# name -> (reduction kind, pre(element), post(reduced value, x, axes) or None)
_REDUCE = {
    "ReduceSum": ("sum", None, None),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceSumSquare": ("sum", _sq, None),
    "ReduceL1": ("sum", lambda v: ex.unary("abs", v), None),
    "ReduceL2": ("sum", _sq, lambda v, x, axes: ex.cast(ex.unary("sqrt", v), x.dtype)),
    "ReduceLogSum": ("sum", None, lambda v, x, axes: ex.unary("log", v)),
    "ReduceMean": ("sum", None, lambda v, x, axes: ex.binary(
        "div", v, ex.cast(count(x, axes), x.dtype))),
}


@op(*_REDUCE, "ReduceLogSumExp")
def reduce(b, n):
    x = n.inputs[0]
    axes = reduce_axes(b, n, x.rank)
    axes = list(range(x.rank)) if axes is None else axes
    keep = bool(n.attr("keepdims"))
    if n.op_type == "ReduceLogSumExp":
        return [_log_sum_exp(b, x, axes, keep)]
    kind, pre, post = _REDUCE[n.op_type]
    r = reduce_over(b, kind, x, axes, keep, pre or (lambda v: v),
                    hint=None if post is None else tmp(b, kind))
    if post is None:
        return [r]
    return [b.map(x.dtype, r.shape, lambda i: post(r.at(i), x, axes), r.names)]


# ---------------------------------------------------------------- ArgMax / ArgMin


@op("ArgMax", "ArgMin")
def arg_reduce(b, n):
    x = n.inputs[0]
    axis = norm_axis(n, n.attr("axis"), x.rank)
    kind = "argmax" if n.op_type == "ArgMax" else "argmin"
    if n.opset >= 12 and n.attr("select_last_index"):
        kind += "_last"
    return [reduce_over(b, kind, x, [axis], bool(n.attr("keepdims")), dtype="i64")]


# ---------------------------------------------------------------- Softmax family


def _softmax_axes(n, rank) -> list[int]:
    """Opset < 13 flattens to 2D at ``axis`` (default 1); opset >= 13 reduces one axis (-1)."""
    if n.opset >= 13:
        return [norm_axis(n, n.attr("axis"), rank)]
    return list(range(norm_axis(n, n.attr("axis"), rank), rank))


@op("Softmax", "LogSoftmax")
def softmax(b, n):
    x = n.inputs[0]
    if x.rank == 0:
        raise n.fail("a scalar input")
    axes = _softmax_axes(n, x.rank)
    m = bcast_reduced(reduce_over(b, "max", x, axes, True, hint=tmp(b, "max")), axes)
    if n.op_type == "Softmax":
        # exp once, as a tensor its sum and the normalization both read (an attention's
        # P.V then sums it and divides after: passes/divide_after.py)
        e = b.map(x.dtype, x.shape, lambda i: ex.unary("exp", x.at(i) - m(i)), x.names,
                  hint=tmp(b, "exp"))
        s = bcast_reduced(reduce_over(b, "sum", e, axes, True, hint=tmp(b, "sum")), axes)
        return [b.map(x.dtype, x.shape, lambda i: ex.binary("div", e.at(i), s(i)), x.names)]
    s = bcast_reduced(reduce_indexed(b, "sum", x, axes, True,
                                       lambda i: ex.unary("exp", x.at(i) - m(i)),
                                       hint=tmp(b, "sum")), axes)
    fn = lambda i: x.at(i) - m(i) - ex.unary("log", s(i))  # noqa: E731
    return [b.map(x.dtype, x.shape, fn, x.names)]


def _flat(idx, shape):
    out = ex.const(0)
    for i, s in zip(idx, shape):
        out = out * s + i
    return out


@op("Hardmax")
def hardmax(b, n):
    x = n.inputs[0]
    axes = _softmax_axes(n, x.rank)
    shape = [x.shape[a] for a in axes]
    if len(axes) == 1:
        first = bcast_reduced(reduce_over(b, "argmax", x, axes, True, dtype="i64",
                                           hint=tmp(b, "argmax")), axes)
    else:  # the first (row-major) position of the max over several axes
        m = bcast_reduced(reduce_over(b, "max", x, axes, True, hint=tmp(b, "max")), axes)
        big = ex.product(shape)
        pos = lambda i: ex.select(ex.binary("eq", x.at(i), m(i)),  # noqa: E731
                                  _flat([i[a] for a in axes], shape), big)
        first = bcast_reduced(reduce_indexed(b, "min", x, axes, True, pos, tmp(b, "first")), axes)
    one, zero = _c(1, x.dtype), _c(0, x.dtype)
    return [b.map(x.dtype, x.shape, lambda i: ex.select(
        ex.binary("eq", ex.cast(first(i), "i64"), _flat([i[a] for a in axes], shape)), one, zero),
        x.names)]


# ---------------------------------------------------------------- CumSum / CumProd


@op("CumSum", "CumProd")
def cumulative(b, n):
    x = n.inputs[0]
    axis = norm_axis(n, b.static_ints(n.input(1), "axis")[0], x.rank)
    exclusive, reverse = bool(n.attr("exclusive")), bool(n.attr("reverse"))
    kind = "sum" if n.op_type == "CumSum" else "prod"
    ident = _c(0 if kind == "sum" else 1, x.dtype)
    cmp = {(False, False): "le", (True, False): "lt", (False, True): "ge", (True, True): "gt"}
    rel = cmp[(exclusive, reverse)]

    def body(o, r):
        idx = list(o)
        idx[axis] = r[0]
        return ex.select(ex.binary(rel, r[0], o[axis]), x.at(idx), ident)

    return [b.reduce(kind, x.dtype, x.shape, [x.shape[axis]], body, x.names, ["r_scan"])]
