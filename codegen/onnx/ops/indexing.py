"""Indexing ops: gathers (indirect reads), OneHot, ReverseSequence, scatters and Compress.

Gathers are comprehensions whose index reads another tensor. Scatters are procedures: the
result is a copy of the data, then a loop over the updates stores (or accumulates) into it,
which is the honest form when indices repeat or a reduction combines them. Compress has a
data-dependent output size, so it is a procedure that sets that size.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import For, If, Let, SetSize, Store, TensorType
from mlpack.spec.ir.origins import Origin, is_wrapped
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import tensor_value


# ---------------------------------------------------------------- shared helpers


def norm_index(i, size):
    """An ONNX index as i64, negative ones counting from the end (an IR select, so the
    indices may be run-time data)."""
    i = ex.cast(i, "i64")
    if i.is_const:
        return ex.simplify_size(i + size) if i.value < 0 else i
    return ex.select(ex.binary("lt", i, ex.const(0)), i + size, i)


def noted(b, n, e):
    """``e``, with every (tensor, dim) it reads at a data-dependent index recorded as indexed by
    node ``n`` (graph.origins): an index out of range then names the node on every executor."""
    for r in ex.walk(e):
        if r.op == "read" and r.arg[2] is None:
            _note_index(b, n, r.arg[0], dict(zip(r.arg[1], r.args)))
    return e


def _note_index(b, n, tensor: str, index: dict) -> None:
    for d, ix in index.items():
        if any(a.op == "read" for a in ex.walk(ix)):
            b.graph.origins.setdefault((tensor, d), Origin(repr(n), is_wrapped(ix)))


def norm_axis(n, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise n.shape_error(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def loops(extents, prefix: str, body):
    """Nested For loops over ``extents`` (vars prefix0, prefix1, ...); ``body(vars)`` gives
    the innermost statements."""
    names = [f"{prefix}{k}" for k in range(len(extents))]
    stmts = body([ex.var(v) for v in names])
    for v, e in reversed(list(zip(names, extents))):
        stmts = [For(v, e, stmts)]
    return stmts


def unflatten(flat, shape):
    """The row-major multi-index of flat offset ``flat`` into ``shape``."""
    idx = []
    for k in range(len(shape)):
        stride = ex.product(shape[k + 1:])
        q = flat // stride if not (stride.is_const and stride.value == 1) else flat
        idx.append(q % shape[k] if k > 0 else q)
    return idx


def fresh_sym(b, hint: str) -> str:
    taken = set(b.graph.symbols())
    k = 0
    while f"{hint}{k}" in taken:
        k += 1
    return f"{hint}{k}"


def result(b, hint: str, dtype: str, names, shape):
    """A procedure result: a fresh tensor name, its type, and its ONNX-ordered dims."""
    name = b.fresh(hint)
    dnames = b.dim_names(names, len(shape))
    dims = list(zip(dnames, shape))
    return name, TensorType(dtype, dict(dims)), dims


def copy_into(name: str, dims, src, prefix: str = "c"):
    """Statements copying Value ``src`` into tensor ``name`` (same ONNX shape)."""
    return loops([s for _, s in dims], prefix, lambda v: [
        Store(name, {d: i for (d, _), i in zip(dims, v)}, ex.cast(src.at(v), src.dtype))])


# ---------------------------------------------------------------- gathers


@op("Gather")
def gather(b, n):
    data, ind = n.inputs[0], n.inputs[1]
    axis = norm_axis(n, n.attr("axis"), data.rank)
    q = ind.rank
    shape = data.shape[:axis] + ind.shape + data.shape[axis + 1:]
    names = data.names[:axis] + ind.names + data.names[axis + 1:]

    def fn(idx):
        i = norm_index(ind.at(idx[axis:axis + q]), data.shape[axis])
        return noted(b, n, data.at(idx[:axis] + [i] + idx[axis + q:]))
    return [b.map(data.dtype, shape, fn, names)]


@op("GatherElements")
def gather_elements(b, n):
    data, ind = n.inputs[0], n.inputs[1]
    axis = norm_axis(n, n.attr("axis"), data.rank)

    def fn(idx):
        i = norm_index(ind.at(idx), data.shape[axis])
        return noted(b, n, data.at(idx[:axis] + [i] + idx[axis + 1:]))
    return [b.map(data.dtype, ind.shape, fn, ind.names)]


@op("GatherND")
def gather_nd(b, n):
    data, ind = n.inputs[0], n.inputs[1]
    bd = n.attr("batch_dims")
    k = ind.shape[-1]
    if not k.is_const:
        raise n.fail("the last dim of indices must be static")
    k = k.value
    q = ind.rank
    shape = ind.shape[:-1] + data.shape[bd + k:]
    names = ind.names[:-1] + data.names[bd + k:]

    def fn(idx):
        pre = idx[:q - 1]
        sel = [norm_index(ind.at(pre + [ex.const(j)]), data.shape[bd + j]) for j in range(k)]
        return noted(b, n, data.at(idx[:bd] + sel + idx[q - 1:]))
    return [b.map(data.dtype, shape, fn, names)]


@op("ArrayFeatureExtractor", domain="ai.onnx.ml")
def array_feature_extractor(b, n):
    """x[..., y]: a gather on the last axis by the flattened indices (a 1-D x reads as 1 row)."""
    x, ind = n.inputs[0], n.inputs[1]
    count = ind.numel()
    lead = x.shape[:-1] if x.rank > 1 else (ex.const(1),)

    def fn(idx):
        i = norm_index(ind.at(unflatten(idx[-1], ind.shape)), x.shape[-1])
        return noted(b, n, x.at((idx[:-1] if x.rank > 1 else []) + [i]))
    return [b.map(x.dtype, lead + (count,), fn, x.names[:-1] + ("feature",))]


@op("OneHot")
def one_hot(b, n):
    ind, depth, values = n.inputs
    depth = ex.const(int(b.scalar(depth, "OneHot depth")))
    axis = n.attr("axis")
    axis = norm_axis(n, axis, ind.rank + 1)
    shape = ind.shape[:axis] + (depth,) + ind.shape[axis:]
    names = ind.names[:axis] + ("depth",) + ind.names[axis:]
    off, on = values.at([ex.const(0)]), values.at([ex.const(1)])

    def fn(idx):
        i = ex.cast(ind.at(idx[:axis] + idx[axis + 1:]), "i64")
        i = ex.select(ex.binary("lt", i, ex.const(0)), i + depth, i)
        return ex.select(ex.binary("eq", i, idx[axis]), on, off)
    return [b.map(values.dtype, shape, fn, names)]


@op("ReverseSequence")
def reverse_sequence(b, n):
    x, lens = n.inputs[0], n.inputs[1]
    ba, ta = n.attr("batch_axis"), n.attr("time_axis")

    def fn(idx):
        t = idx[ta]
        length = ex.cast(lens.at([idx[ba]]), "i64")
        src = list(idx)
        src[ta] = ex.select(ex.binary("lt", t, length), length - 1 - t, t)
        return x.at(src)
    return [b.map(x.dtype, x.shape, fn, x.names)]


# ---------------------------------------------------------------- scatters


def _combine(n, reduction: str, old, new):
    if reduction == "none":
        return new
    ops = {"add": "add", "mul": "mul", "max": "max", "min": "min"}
    if reduction not in ops:
        raise n.fail(f"reduction {reduction!r} is not supported")
    if old.dtype == "bool" and reduction in ("add", "mul"):
        return ex.binary("or" if reduction == "add" else "and", old, new)
    return ex.cast(ex.binary(ops[reduction], old, new), old.dtype)


@op("ScatterElements", "Scatter")
def scatter_elements(b, n):
    data, ind, upd = n.inputs[0], n.inputs[1], n.inputs[2]
    axis = norm_axis(n, n.attr("axis"), data.rank)
    reduction = n.attr("reduction", "none") if n.op_type == "ScatterElements" else "none"
    name, ty, dims = result(b, n.output_names[0] or "scatter", data.dtype, data.names, data.shape)

    def update(v):
        at = list(v)
        at[axis] = norm_index(ind.at(v), data.shape[axis])
        index = {d: i for (d, _), i in zip(dims, at)}
        _note_index(b, n, name, index)
        old = ex.read(name, index, data.dtype)
        return [Store(name, index, _combine(n, reduction, old, ex.cast(upd.at(v), data.dtype)))]
    body = copy_into(name, dims, data) + loops(list(ind.shape), "u", update)
    b.procedure({name: ty}, body)
    return [tensor_value(name, data.dtype, dims)]


@op("ScatterND")
def scatter_nd(b, n):
    data, ind, upd = n.inputs[0], n.inputs[1], n.inputs[2]
    reduction = n.attr("reduction", "none")
    k = ind.shape[-1]
    if not k.is_const:
        raise n.fail("the last dim of indices must be static")
    k = k.value
    folded = _scatter_nd_of_constants(b, n, data, ind, upd, k) if reduction == "none" else None
    if folded is not None:
        return [folded]
    name, ty, dims = result(b, n.output_names[0] or "scatter", data.dtype, data.names, data.shape)
    outer = list(ind.shape[:-1])

    def update(v):
        pre, rest = v[:len(outer)], v[len(outer):]
        at = [norm_index(ind.at(pre + [ex.const(j)]), data.shape[j]) for j in range(k)] + rest
        index = {d: i for (d, _), i in zip(dims, at)}
        _note_index(b, n, name, index)
        old = ex.read(name, index, data.dtype)
        return [Store(name, index, _combine(n, reduction, old, ex.cast(upd.at(v), data.dtype)))]
    body = copy_into(name, dims, data) + loops(outer + list(data.shape[k:]), "u", update)
    b.procedure({name: ty}, body)
    return [tensor_value(name, data.dtype, dims)]


def _scatter_nd_of_constants(b, n, data, ind, upd, k: int):
    """A ScatterND whose data, indices and updates are all constants (Swin-T's shifted-window
    masks: 45 of them) computed here with NumPy, each index row in turn as the procedure would
    store it, into a constant; None where something is not a constant, the result is over
    FOLD_LIMIT, or an index is out of range (the procedure then says which)."""
    from mlpack.codegen.onnx.builder import FOLD_LIMIT

    if any(v.data is None for v in (data, ind, upd)) or data.data.size > FOLD_LIMIT:
        return None
    out = np.array(data.data, copy=True)
    bounds = np.asarray(out.shape[:k], dtype=np.int64)
    rows = np.asarray(ind.data, dtype=np.int64).reshape(-1, k)
    rows = np.where(rows < 0, rows + bounds, rows)
    if rows.size and ((rows < 0).any() or (rows >= bounds).any()):
        return None
    values = np.asarray(upd.data).reshape((len(rows),) + out.shape[k:]).astype(out.dtype)
    for row, value in zip(rows, values):   # in order: a repeated index keeps the last update
        out[tuple(row)] = value
    return b.constant(out, name=n.output_names[0] or None, names=data.names)


@op("TensorScatter")
def tensor_scatter(b, n):
    """A KV-cache write: each batch row's update lands at its write index along ``axis``.
    Every cache position takes at most one update, so this is a comprehension."""
    past, upd, wi = n.input(0), n.input(1), n.input(2)
    axis = norm_axis(n, n.attr("axis"), past.rank)
    mode = n.attr("mode")
    if mode not in ("linear", "circular"):
        raise n.fail(f"mode {mode!r} is not supported")
    seq, cap = upd.shape[axis], past.shape[axis]
    if seq.is_const and seq.value == 0:
        return [past]

    def fn(idx):
        w = ex.cast(wi.at([idx[0]]), "i64") if wi is not None else ex.const(0)
        rel = idx[axis] - w
        if mode == "circular":
            rel = ex.binary("mod", rel, cap)
        ok = ex.binary("and", ex.binary("ge", rel, ex.const(0)), ex.binary("lt", rel, seq))
        src = list(idx)
        src[axis] = ex.minimum(ex.maximum(rel, ex.const(0)), seq - 1)
        return ex.select(ok, upd.at(src), past.at(idx))
    return [b.map(past.dtype, past.shape, fn, past.names)]


@op("MaxUnpool")
def max_unpool(b, n):
    """Zeros, then each input value stored at its flat index into the whole output."""
    x, ind, oshape = n.input(0), n.input(1), n.input(2)
    k = n.attr("kernel_shape")
    sp = len(k)
    strides = n.attr("strides") or [1] * sp
    pads = n.attr("pads") or [0] * (2 * sp)
    inferred = list(x.shape[:2]) + [ex.simplify_size((x.shape[2 + i] - 1) * strides[i] + k[i]
                                                     - pads[i] - pads[sp + i]) for i in range(sp)]
    # Indices are flat offsets into the inferred shape; a larger output_shape pads at the end.
    shape = b.ints(oshape, "MaxUnpool output_shape") if oshape is not None else inferred
    name, ty, dims = result(b, n.output_names[0] or "unpool", x.dtype, x.names, shape)
    zero = loops(shape, "c", lambda v: [
        Store(name, {d: i for (d, _), i in zip(dims, v)}, ex.cast(ex.const(0), x.dtype))])

    def place(v):
        at = unflatten(ex.cast(ind.at(v), "i64"), inferred)
        return [Store(name, {d: i for (d, _), i in zip(dims, at)}, ex.cast(x.at(v), x.dtype))]
    b.procedure({name: ty}, zero + loops(list(x.shape), "u", place))
    return [tensor_value(name, x.dtype, dims)]


# ---------------------------------------------------------------- Compress


@op("Compress")
def compress(b, n):
    x, cond = n.inputs[0], n.inputs[1]
    axis = n.attr("axis", None)
    if axis is None:  # compress the flattened input
        total = x.numel()
        flat_at = lambda i: x.at(unflatten(i, x.shape))  # noqa: E731
        src_shape, axis, at = [total], 0, lambda v: flat_at(v[0])
        names = ("n",)
    else:
        axis = norm_axis(n, axis, x.rank)
        src_shape, at, names = list(x.shape), x.at, x.names
    size = fresh_sym(b, "compress")
    extent = ex.minimum(cond.shape[0], src_shape[axis])
    shape = src_shape[:axis] + [ex.sym(size)] + src_shape[axis + 1:]
    name, ty, dims = result(b, n.output_names[0] or "compress", x.dtype, names, shape)
    others = src_shape[:axis] + src_shape[axis + 1:]
    cnt, i = ex.var("cnt"), ex.var("i")

    def copy_slice(v):
        src = v[:axis] + [i] + v[axis:]
        dst = v[:axis] + [cnt] + v[axis:]
        return [Store(name, {d: j for (d, _), j in zip(dims, dst)}, ex.cast(at(src), x.dtype))]
    body = [
        Let("cnt", ex.const(0)),
        For("i", extent, [If(ex.cast(cond.at([i]), "bool"),
                              loops(others, "o", copy_slice) + [Let("cnt", cnt + 1)])]),
        SetSize(size, cnt),
    ]
    b.procedure({name: ty}, body, bounds={size: extent})
    return [tensor_value(name, x.dtype, dims)]
