"""Shape ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Expand, ConstantOfShape,
Range, EyeLike.

Shape and Size produce *known* small integer tensors whose elements are size expressions (maybe
symbolic), so exporters' shape arithmetic (Shape -> Slice -> Concat -> Reshape) stays symbolic.
Reshape, Flatten, Squeeze, Unsqueeze and Expand are views: they only compose a new ``at``.
The helpers at the top are shared with movement.py.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.builder import FOLD_LIMIT, Builder
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import Value, view as _plain_view

# ---------------------------------------------------------------- shared helpers


def norm_axis(n, axis: int, rank: int) -> int:
    """A possibly negative axis as an index in [0, rank)."""
    if not -rank <= axis < max(rank, 1):
        raise n.shape_error(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def cmp(op_name: str, a, b) -> ex.Expr:
    """A comparison that folds when both sides are constants (ex.binary keeps bool consts)."""
    a, b = ex.as_expr(a), ex.as_expr(b)
    if a.is_const and b.is_const:
        return ex.const(bool(ex.index_value(ex.Expr(op_name, (a, b), None, "bool"), {})))
    return ex.binary(op_name, a, b)


def clamp(i, lo, hi) -> ex.Expr:
    return ex.minimum(ex.maximum(i, lo), hi)


def view(b: Builder, x: Value, shape, at, names=()) -> Value:
    """A view onto ``x``; small known or constant inputs are folded instead, so shape
    arithmetic keeps its known values and views of small constants stay constants."""
    shape = tuple(ex.simplify_size(ex.as_expr(s)) for s in shape)
    small = all(s.is_const for s in shape) and int(np.prod([s.value for s in shape])) <= FOLD_LIMIT
    if x.known is not None or (x.data is not None and small):
        return b.map(x.dtype, shape, at, names)
    return _plain_view(x, shape, at, names)


def guarded(x: Value, idx: list, pad) -> ex.Expr:
    """``x`` at ``idx``, or ``pad`` (an expression) where ``idx`` is out of range."""
    if x.tensor is not None and pad.is_const and x.known is None:
        return ex.read(x.tensor, dict(zip(x.names, idx)), x.dtype, pad=pad.value)
    ok = ex.const(True)
    clamped = []
    for i, s in zip(idx, x.shape):
        inb = ex.binary("and", cmp("ge", i, 0), cmp("lt", i, s))
        ok = inb if ok.is_const and ok.value else ex.binary("and", ok, inb)
        clamped.append(clamp(i, 0, s - 1))
    return ex.select(ok, x.at(clamped), ex.cast(pad, x.dtype))


def reshape_view(b: Builder, x: Value, out_shape, names=()) -> Value:
    """``x`` read row-major as ``out_shape``. Leading and trailing dims that match keep their
    index; only the middle is linearized (``//`` and ``%``)."""
    ins, outs = list(x.shape), [ex.simplify_size(s) for s in out_shape]
    p = 0
    while p < min(len(ins), len(outs)) and ex.same_size(ins[p], outs[p]):
        p += 1
    s = 0
    while s < min(len(ins), len(outs)) - p and ex.same_size(ins[-1 - s], outs[-1 - s]):
        s += 1
    mid_in, mid_out = ins[p:len(ins) - s], outs[p:len(outs) - s]

    def at(idx):
        mid = idx[p:len(idx) - s]
        flat = ex.const(0)
        for i, size in zip(mid, mid_out):
            flat = flat * size + i
        sub = []
        for k in reversed(range(len(mid_in))):
            size = mid_in[k]
            sub.append(flat % size if k > 0 else flat)
            flat = flat // size
        return x.at(list(idx[:p]) + sub[::-1] + list(idx[len(idx) - s:]))

    if not names:
        names = list(x.names[:p]) + [f"d{p + i}" for i in range(len(mid_out))] + \
            list(x.names[len(ins) - s:])
    return view(b, x, outs, at, names)


def axes_of(b: Builder, n, attr_before: int, input_index: int) -> list[int] | None:
    """An ``axes`` list that is an attribute before opset ``attr_before`` and an input since."""
    if n.opset < attr_before:
        return n.attr("axes", None)
    v = n.input(input_index)
    return None if v is None else b.static_ints(v, "axes")


# ---------------------------------------------------------------- ops


@op("Shape")
def shape(b, n):
    x = n.inputs[0]
    r = x.rank
    start, end = n.attr("start", 0), n.attr("end", None)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = r if end is None else min(max(end + r if end < 0 else end, 0), r)
    dims = list(x.shape[start:end]) if end > start else []
    return [b.known_value("i64", [len(dims)], dims)]


@op("Size")
def size(b, n):
    return [b.known_value("i64", [], [n.inputs[0].numel()])]


@op("Reshape")
def reshape(b, n):
    x = n.inputs[0]
    target = n.attr("shape") if n.opset < 5 else b.ints(n.input(1), "shape")
    target = [ex.as_expr(t) for t in target]
    allowzero = n.attr("allowzero", 0) if n.opset >= 14 else 0
    out = []
    for i, t in enumerate(target):
        if t.is_const and t.value == 0 and not allowzero:
            if i >= x.rank:
                raise n.shape_error(f"shape[{i}] = 0 copies a dim the input (rank {x.rank}) lacks")
            t = x.shape[i]
        out.append(t)
    holes = [i for i, t in enumerate(out) if t.is_const and t.value == -1]
    if len(holes) > 1:
        raise n.shape_error("more than one -1 in the target shape")
    if holes:
        rest = ex.product(t for i, t in enumerate(out) if i != holes[0])
        if rest.is_const and rest.value == 0:
            raise n.shape_error("-1 cannot be inferred when other target dims are 0")
        out[holes[0]] = ex.simplify_size(ex.floordiv(x.numel(), rest))
    numel = ex.product(out)
    if numel.is_const and x.numel().is_const and numel.value != x.numel().value:
        raise n.shape_error(f"cannot reshape {x.numel().value} elements to {[o.value for o in out]}")
    return [reshape_view(b, x, out)]


@op("Flatten")
def flatten(b, n):
    x = n.inputs[0]
    axis = n.attr("axis")
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise n.shape_error(f"axis {n.attr('axis')} is out of range for rank {x.rank}")
    return [reshape_view(b, x, [ex.product(x.shape[:axis]), ex.product(x.shape[axis:])])]


@op("Squeeze")
def squeeze(b, n):
    x = n.inputs[0]
    axes = axes_of(b, n, 13, 1)
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s.is_const and s.value == 1]
    axes = sorted({norm_axis(n, a, x.rank) for a in axes})
    for a in axes:
        if x.shape[a].is_const and x.shape[a].value != 1:
            raise n.shape_error(f"cannot squeeze axis {a} of size {x.shape[a].value}")
    keep = [i for i in range(x.rank) if i not in axes]

    def at(idx):
        full = [ex.const(0)] * x.rank
        for i, k in zip(idx, keep):
            full[k] = i
        return x.at(full)

    return [view(b, x, [x.shape[k] for k in keep], at, [x.names[k] for k in keep])]


@op("Unsqueeze")
def unsqueeze(b, n):
    x = n.inputs[0]
    axes = axes_of(b, n, 13, 1)
    if axes is None:
        raise n.fail("axes is missing")
    rank = x.rank + len(axes)
    normed = sorted({norm_axis(n, a, rank) for a in axes})
    if len(normed) != len(axes):
        raise n.shape_error(f"repeated axes {axes}")
    axes = normed
    keep = [i for i in range(rank) if i not in axes]
    shape, names = [ex.const(1)] * rank, [f"u{i}" for i in range(rank)]
    for k, s, nm in zip(keep, x.shape, x.names):
        shape[k], names[k] = s, nm
    return [view(b, x, shape, lambda idx: x.at([idx[k] for k in keep]), names)]


@op("Expand")
def expand(b, n):
    x = n.inputs[0]
    target = b.ints(n.input(1), "shape")
    shape = Builder.broadcast_shape(n, x, Value(x.dtype, tuple(target), lambda i: None))
    return [view(b, x, shape, lambda idx: Builder.bcast(x, idx), b.broadcast_names(x))]


@op("ConstantOfShape")
def constant_of_shape(b, n):
    shape = b.ints(n.inputs[0], "shape")
    value = n.attr("value", None)
    data = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value).reshape(-1)
    dtype = dt.from_numpy(data.dtype)
    c = ex.const(data[0].item(), dtype)
    return [b.map(dtype, shape, lambda idx: c)]


@op("Range")
def range_(b, n):
    dtype = n.inputs[0].dtype
    if dt.is_int(dtype):  # sizes may be symbolic (Range(0, Shape(x)[0], 1))
        start, limit, delta = (b.ints(n.input(i), w)[0] for i, w in
                               enumerate(("start", "limit", "delta")))
        if not delta.is_const or delta.value == 0:
            raise n.fail("delta must be a known nonzero constant")
        d = delta.value
        count = ex.ceildiv(limit - start, d) if d > 0 else ex.ceildiv(start - limit, -d)
        if count.is_const:
            count = ex.const(max(count.value, 0))
        return [b.map(dtype, [count], lambda idx: start + idx[0] * d)]
    start, limit, delta = (b.scalar(n.input(i), w) for i, w in
                           enumerate(("start", "limit", "delta")))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    # start + i * delta in the input's precision, as ONNX defines it
    s, d = ex.const(start, dtype), ex.const(delta, dtype)
    return [b.map(dtype, [count], lambda idx: s + ex.cast(idx[0], dtype) * d)]


@op("EyeLike")
def eye_like(b, n):
    from mlpack.codegen.onnx.importer import onnx_dtype
    x = n.inputs[0]
    dtype = onnx_dtype(n.attr("dtype"), f"{n!r} attribute 'dtype'") if n.has("dtype") else x.dtype
    if x.rank != 2:
        raise n.shape_error(f"input must be 2-D, it has rank {x.rank}")
    k = n.attr("k")
    one, zero = ex.const(1, dtype), ex.const(0, dtype)
    return [b.map(dtype, x.shape, lambda idx: ex.select(cmp("eq", idx[1] - idx[0], k), one, zero),
                  x.names)]
