"""Data-movement ops: Transpose, Concat, Slice, Split, Tile, Pad, DepthToSpace, SpaceToDepth,
plus the select-like Where and Trilu and the inference-mode Dropout.

Movement ops are views (a new ``at`` over their input, no copy) except Concat, which reads
several inputs and so becomes one comprehension. Sizes stay expressions (maybe symbolic).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.ops.shape import clamp, cmp, guarded, norm_axis, view

BIG = 1 << 31  # Slice bounds at or beyond this mean "to the end" (exporters use INT_MAX etc.)


@op("Transpose")
def transpose(b, n):
    x = n.inputs[0]
    perm = n.attr("perm", None)
    perm = list(reversed(range(x.rank))) if perm is None else [norm_axis(n, p, x.rank) for p in perm]
    if sorted(perm) != list(range(x.rank)):
        raise n.shape_error(f"perm {perm} is not a permutation of 0..{x.rank - 1}")

    def at(idx):
        sub = [None] * x.rank
        for j, p in enumerate(perm):
            sub[p] = idx[j]
        return x.at(sub)

    return [view(b, x, [x.shape[p] for p in perm], at, [x.names[p] for p in perm])]


@op("Concat")
def concat(b, n):
    xs = [v for v in n.inputs if v is not None]
    axis = norm_axis(n, n.attr("axis"), xs[0].rank)
    # empty inputs contribute nothing (ONNX allows them, e.g. a 0-length shape tensor)
    parts = [v for v in xs if not (v.shape[axis].is_const and v.shape[axis].value == 0)] or xs[:1]
    offsets, total = [], ex.const(0)
    for v in parts:
        offsets.append(total)
        total = ex.simplify_size(total + v.shape[axis])
    shape = list(parts[0].shape)
    shape[axis] = total

    def at(idx):
        i = idx[axis]
        out = None
        for v, off in reversed(list(zip(parts, offsets))):
            sub = list(idx)
            # clamped: both sides of a select may be evaluated
            sub[axis] = i - off if len(parts) == 1 else clamp(i - off, 0, v.shape[axis] - 1)
            val = v.at(sub)
            out = val if out is None else ex.select(cmp("lt", i, off + v.shape[axis]), val, out)
        return out

    return [b.map(xs[0].dtype, shape, at, parts[0].names)]


def _slice_bounds(start, end, step, dim):
    """(first index, count) of a Slice along one axis, clamped as ONNX defines it."""
    if dim.is_const and start.is_const and end.is_const:
        d, s, e = dim.value, start.value, end.value
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            return ex.const(s), ex.const(max(-(-(e - s) // step), 0))
        s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        return ex.const(s), ex.const(max(-(-(s - e) // -step), 0))
    # symbolic: assume in-range bounds, except the usual "to the end" sentinels
    def fix(v, lo_end):
        if v.is_const and v.value >= BIG:
            return dim if lo_end is None else dim - 1
        if v.is_const and v.value <= -BIG:
            return ex.const(0) if lo_end is None else ex.const(-1)
        return dim + v if v.is_const and v.value < 0 else v
    if step > 0:
        s, e = fix(start, None), fix(end, None)
        return s, ex.simplify_size(ex.ceildiv(e - s, step))
    s, e = fix(start, 1), fix(end, 1)
    return s, ex.simplify_size(ex.ceildiv(s - e, -step))


@op("Slice")
def slice_(b, n):
    x = n.inputs[0]
    if n.opset < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes, steps = n.attr("axes", None), None
    else:
        starts, ends = b.ints(n.input(1), "starts"), b.ints(n.input(2), "ends")
        axes = None if n.input(3) is None else b.static_ints(n.input(3), "axes")
        steps = None if n.input(4) is None else b.static_ints(n.input(4), "steps")
    axes = list(range(len(starts))) if axes is None else [norm_axis(n, a, x.rank) for a in axes]
    steps = [1] * len(axes) if steps is None else steps
    first = [ex.const(0)] * x.rank
    step_of = [1] * x.rank
    shape = list(x.shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise n.shape_error("slice step cannot be 0")
        first[a], shape[a] = _slice_bounds(ex.as_expr(s), ex.as_expr(e), st, x.shape[a])
        step_of[a] = st
    return [view(b, x, shape, lambda idx: x.at([f + i * st for f, i, st in zip(first, idx, step_of)]),
                 x.names)]


def _split_sizes(b, n, x, axis):
    dim = x.shape[axis]
    if n.opset < 13 and n.has("split"):
        return [ex.const(s) for s in n.attr("split")]
    if n.opset >= 13 and n.input(1) is not None:
        return b.ints(n.input(1), "split")
    if n.opset < 2 and n.input(1) is not None:
        return b.ints(n.input(1), "split")
    if n.opset >= 18 and n.has("num_outputs"):
        k = n.attr("num_outputs")
        chunk = ex.simplify_size(ex.ceildiv(dim, k))
        if chunk.is_const and dim.is_const:  # the last chunk is smaller; trailing ones may be 0
            sizes = [min(chunk.value, max(dim.value - i * chunk.value, 0)) for i in range(k)]
            return [ex.const(s) for s in sizes]
        return [chunk] * (k - 1) + [ex.simplify_size(dim - chunk * (k - 1))]
    k = len(n.output_names)
    if dim.is_const and dim.value % k:
        raise n.shape_error(f"cannot split a dim of {dim.value} into {k} equal parts")
    return [ex.simplify_size(ex.floordiv(dim, k))] * k


@op("Split")
def split(b, n):
    x = n.inputs[0]
    axis = norm_axis(n, n.attr("axis"), x.rank)
    outs, off = [], ex.const(0)
    for size in _split_sizes(b, n, x, axis):
        shape = list(x.shape)
        shape[axis] = size

        def at(idx, off=off):
            sub = list(idx)
            sub[axis] = idx[axis] + off
            return x.at(sub)

        outs.append(view(b, x, shape, at, x.names))
        off = ex.simplify_size(off + size)
    return outs


@op("Tile")
def tile(b, n):
    x = n.inputs[0]
    reps = b.ints(n.input(1), "repeats")
    if len(reps) != x.rank:
        raise n.shape_error(f"{len(reps)} repeats for an input of rank {x.rank}")
    shape = [s * r for s, r in zip(x.shape, reps)]
    return [view(b, x, shape, lambda idx: x.at([i % s for i, s in zip(idx, x.shape)]), x.names)]


def _pad_index(i, size, mode):
    """The source index of a padded position ``i`` (relative to the input's origin)."""
    if mode == "edge":
        return clamp(i, 0, size - 1)
    if mode == "wrap":
        return i % size
    # reflect: mirror without repeating the edge, with period 2*(size-1)
    if size.is_const and size.value == 1:
        return ex.const(0)
    period = 2 * (size - 1)
    m = i % period
    return ex.select(cmp("lt", m, size), m, period - m)


@op("Pad")
def pad(b, n):
    x = n.inputs[0]
    mode = n.attr("mode")
    if n.opset < 11:
        pads = n.attr("pads") if n.opset >= 2 else n.attr("paddings")
        value = ex.const(n.attr("value"), x.dtype)
        axes = list(range(x.rank))
    else:
        pads = b.ints(n.input(1), "pads")
        cv = n.input(2)
        if cv is None:
            value = ex.const(0, x.dtype)
        elif cv.data is not None and cv.data.size == 1:   # a literal, not a read
            value = ex.const(b.scalar(cv, "value"), x.dtype)
        else:
            value = ex.cast(cv.at([ex.const(0)] * cv.rank), x.dtype)
        axes = list(range(x.rank)) if n.input(3) is None else \
            [norm_axis(n, a, x.rank) for a in b.static_ints(n.input(3), "axes")]
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.fail(f"mode {mode!r} is not supported")
    if len(pads) != 2 * len(axes):
        raise n.shape_error(f"{len(pads)} pads for {len(axes)} axes")
    if all(ex.as_expr(p).is_const and ex.as_expr(p).value == 0 for p in pads):
        return [x]   # (exporters pad every convolution, SAME padding's 1x1 ones by nothing)
    if mode == "constant" and value.is_const and x.tensor is None and x.known is None:
        # a padded read of a tensor, the form a Conv's own padding takes, which the cpu
        # schedules recognize; a view read through bounds checks and clamped indices is not
        x = b.materialize(x)
    before, shape = [ex.const(0)] * x.rank, list(x.shape)
    for k, a in enumerate(axes):
        before[a] = ex.as_expr(pads[k])
        shape[a] = ex.simplify_size(x.shape[a] + pads[k] + pads[k + len(axes)])

    def at(idx):
        src = [i - p for i, p in zip(idx, before)]
        if mode == "constant":
            return guarded(x, src, value)
        return x.at([_pad_index(i, s, mode) if a in axes else i
                     for a, (i, s) in enumerate(zip(src, x.shape))])

    return [view(b, x, shape, at, x.names)]


@op("DepthToSpace")
def depth_to_space(b, n):
    x = n.inputs[0]
    k, mode = n.attr("blocksize"), n.attr("mode")
    if x.rank != 4 or mode not in ("DCR", "CRD"):
        raise n.fail(f"needs a 4-D input and mode DCR or CRD (rank {x.rank}, mode {mode})")
    N, C, H, W = x.shape
    c_out = ex.simplify_size(ex.floordiv(C, k * k))

    def at(idx):
        nn, c, h, w = idx
        bh, bw = h % k, w % k
        ch = (bh * k + bw) * c_out + c if mode == "DCR" else c * (k * k) + bh * k + bw
        return x.at([nn, ch, h // k, w // k])

    return [view(b, x, [N, c_out, H * k, W * k], at, x.names)]


@op("SpaceToDepth")
def space_to_depth(b, n):
    x = n.inputs[0]
    k = n.attr("blocksize")
    mode = n.attr("mode", "DCR")  # the attribute exists since opset 28
    if x.rank != 4 or mode not in ("DCR", "CRD"):
        raise n.fail(f"needs a 4-D input and mode DCR or CRD (rank {x.rank}, mode {mode})")
    N, C, H, W = x.shape

    def at(idx):
        nn, ch, h, w = idx
        if mode == "DCR":
            c, bw, bh = ch % C, (ch // C) % k, ch // (C * k)
        else:
            c, bh, bw = ch // (k * k), (ch // k) % k, ch % k
        return x.at([nn, c, h * k + bh, w * k + bw])

    shape = [N, C * (k * k), ex.floordiv(H, k), ex.floordiv(W, k)]
    return [view(b, x, shape, at, x.names)]


@op("Where")
def where(b, n):
    c, x, y = n.inputs
    return [b.elementwise(x.dtype, [c, x, y], lambda cc, a, bb: ex.select(cc, a, bb))]


@op("Trilu")
def trilu(b, n):
    x = n.inputs[0]
    kv = n.input(1)
    # k may be a run-time input: it is just an expression in the condition
    k = ex.const(0) if kv is None else ex.cast(kv.at([ex.const(0)] * kv.rank), "i64")
    keep = "ge" if n.attr("upper") else "le"
    zero = ex.const(0, x.dtype)
    return [b.map(x.dtype, x.shape, lambda idx: ex.select(
        cmp(keep, idx[-1] - idx[-2], k), x.at(list(idx)), zero), x.names)]


@op("Dropout")
def dropout(b, n):
    x = n.inputs[0]
    training = False
    if n.opset >= 12 and n.input(2) is not None:
        training = bool(b.scalar(n.input(2), "training_mode"))
    if training:
        r = n.input(1)
        known = r is None or r.data is not None or (r.known is not None and r.known[0].is_const)
        if not known or b.scalar(r, "ratio", 0.5) != 0:
            raise n.fail("training mode (random dropout) is not supported")
    outs = [x]
    if len(n.output_names) > 1 and n.output_names[1]:
        mask_dtype = "bool" if n.opset >= 10 else x.dtype
        one = ex.const(True) if mask_dtype == "bool" else ex.const(1, mask_dtype)
        outs.append(b.map(mask_dtype, x.shape, lambda idx: one, x.names))
    return outs


@op("CenterCropPad")
def center_crop_pad(b, n):
    x = n.inputs[0]
    target = b.ints(n.input(1), "shape")
    axes = n.attr("axes", None)
    axes = list(range(x.rank)) if axes is None else [norm_axis(n, a, x.rank) for a in axes]
    if len(target) != len(axes):
        raise n.shape_error(f"{len(target)} target sizes for {len(axes)} axes")
    shape, offset = list(x.shape), [ex.const(0)] * x.rank
    for a, t in zip(axes, target):
        d = x.shape[a]
        if not (d.is_const and t.is_const):
            raise n.fail("symbolic crop/pad sizes are not supported")
        # crop takes the floor-centred window; padding puts the smaller half before
        diff = d.value - t.value
        offset[a] = ex.const(diff // 2 if diff >= 0 else -((-diff) // 2))
        shape[a] = t
    zero = ex.const(0, x.dtype)
    return [view(b, x, shape, lambda idx: guarded(x, [i + o for i, o in zip(idx, offset)], zero),
                 x.names)]
