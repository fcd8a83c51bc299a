"""Sampling ops: GridSample (N-D; nearest, linear, cubic; zeros, border, reflection padding)
and RoiAlign (avg/max, fixed or adaptive sampling ratio).

GridSample follows ONNX's reference: a grid point is denormalized to a pixel coordinate, a
coordinate outside the valid range is clamped (border) or reflected (reflection), and the
interpolation taps are read with the same padding rule (zeros: a guarded read). Linear and
cubic interpolation are one ``sum`` comprehension over the taps (2 or 4 per spatial axis),
each tap weighted by a separable kernel of its distance, so the body stays small:

    y[n, c, o...] = sum{t...} prod_i K(frac_i - t_i + off) * x[n, c, floor_i + t_i - off...]

RoiAlign averages (or maxes) bilinear samples on a regular grid inside each bin. With a fixed
``sampling_ratio`` that grid is a reduction; with the adaptive ratio 0 its size depends on
each ROI, so the sampling is a procedure whose loop extents read the ROI.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import For, Let, Store
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import tensor_value
from mlpack.codegen.onnx.ops.conv import guarded, spatial_names
from mlpack.codegen.onnx.ops.indexing import result
from mlpack.codegen.onnx.ops.linalg import tmp_hint

_CUBIC_A = -0.75  # Keys' cubic kernel, as ONNX (and PyTorch) use


def _lt(a, b): return ex.binary("lt", a, b)
def _gt(a, b): return ex.binary("gt", a, b)


def _f(v, ftype):
    return ex.const(float(v), ftype)


def _compute_type(dtype: str) -> str:
    """Coordinates are computed in at least f32 (the reference uses f32)."""
    return dtype if dtype in ("f32", "f64") else "f32"


# ---------------------------------------------------------------- GridSample coordinates


def _denormalize(g, size, align: bool, ft):
    """A normalized grid coordinate in [-1, 1] as a pixel coordinate."""
    length = ex.cast(size, ft)
    one, half = _f(1, ft), _f(0.5, ft)
    if align:
        return (g + one) * half * (length - one)
    return ((g + one) * length - one) * half


def _bounds(size, align: bool, ft):
    """The valid coordinate range [lo, hi] (pixel centers or pixel edges)."""
    length = ex.cast(size, ft)
    if align:
        return _f(0, ft), length - _f(1, ft)
    return _f(-0.5, ft), length - _f(0.5, ft)


def _reflect(x, lo, hi, ft):
    """Reflect x off the nearer border until it lies within [lo, hi] (x outside only)."""
    rng = hi - lo
    below = _lt(x, lo)
    dx = ex.select(below, lo - x, x - hi)
    flips = ex.unary("floor", ex.binary("div", dx, rng))
    r = dx - flips * rng
    even = ex.binary("eq", ex.binary("fmod", flips, _f(2, ft)), _f(0, ft))
    return ex.select(below, ex.select(even, lo + r, hi - r), ex.select(even, hi - r, lo + r))


def _fix_range(x, size, align: bool, padding: str, ft):
    """A coordinate outside the valid range clamped (border) or reflected (reflection)."""
    if padding == "zeros":
        return x
    lo, hi = _bounds(size, align, ft)
    outside = ex.binary("or", _lt(x, lo), _gt(x, hi))
    if padding == "border":
        fixed = ex.minimum(ex.maximum(x, _f(0, ft)), ex.cast(size, ft) - _f(1, ft))
    else:
        fixed = _reflect(x, lo, hi, ft)
    return ex.select(outside, fixed, x)


def _tap_index(i, size, align: bool, padding: str):
    """The pixel an integer tap reads: clamped (border) or mirrored (reflection); zeros
    padding keeps the index and relies on a guarded read."""
    if padding == "zeros":
        return i
    if padding == "border":
        return ex.minimum(ex.maximum(i, ex.const(0)), size - 1)
    # reflection in integers: period 2(L-1) about pixel centers, 2L about pixel edges
    period = 2 * (size - 1) if align else 2 * size
    m = ex.binary("mod", ex.binary("mod", i, period) + period, period)
    mirrored = period - m if align else period - 1 - m
    return ex.select(_gt(m, size - 1), mirrored, m)


def _cubic_weight(d, ft):
    """Keys' kernel W(|d|) for |d| < 2."""
    a = _CUBIC_A
    d = ex.unary("abs", d)
    near = ((_f(a + 2, ft) * d - _f(a + 3, ft)) * d * d) + _f(1, ft)
    far = ((_f(a, ft) * d - _f(5 * a, ft)) * d + _f(8 * a, ft)) * d - _f(4 * a, ft)
    return ex.select(ex.binary("le", d, _f(1, ft)), near, far)


_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
          "cubic": "cubic"}


@op("GridSample")
def grid_sample(b, n):
    x, grid = n.inputs[0], n.inputs[1]
    mode = _MODES.get(n.attr("mode"))
    padding = n.attr("padding_mode")
    align = bool(n.attr("align_corners"))
    if mode is None:
        raise n.fail(f"mode {n.attr('mode')!r} is not supported")
    if padding not in ("zeros", "border", "reflection"):
        raise n.fail(f"padding_mode {padding!r} is not supported")
    r = x.rank - 2
    if r < 1 or grid.rank != x.rank:
        raise n.shape_error(f"input rank {x.rank} and grid rank {grid.rank} do not fit")
    ft = _compute_type(grid.dtype)
    sizes = list(x.shape[2:])
    sp = tuple("o" + s for s in spatial_names(r))
    shape = (x.shape[0], x.shape[1], *grid.shape[1:-1])
    names = ("n", "c") + sp
    read = guarded(b, x, 0) if padding == "zeros" else x.at

    def coords(o):
        # the grid's last axis lists coordinates innermost first (x, then y, then z)
        out = []
        for i in range(r):
            g = ex.cast(grid.at([o[0], *o[2:], ex.const(r - 1 - i)]), ft)
            c = _denormalize(g, sizes[i], align, ft)
            if mode == "nearest":
                c = ex.unary("round", c)  # half to even, as the reference (np.rint)
            out.append(_fix_range(c, sizes[i], align, padding, ft))
        return out

    if mode == "nearest":
        def nearest(o):
            idx = [_tap_index(ex.cast(c, "i64"), s, align, padding) for c, s in zip(coords(o), sizes)]
            return read([o[0], o[1], *idx])
        return [b.map(x.dtype, shape, nearest, names)]

    taps, off = (2, 0) if mode == "linear" else (4, 1)

    def body(o, t):
        w, idx = None, []
        for c, s, ti in zip(coords(o), sizes, t):
            fl = ex.unary("floor", c)
            d = c - fl + _f(off, ft) - ex.cast(ti, ft)
            k = _f(1, ft) - ex.unary("abs", d) if mode == "linear" else _cubic_weight(d, ft)
            w = k if w is None else w * k
            idx.append(_tap_index(ex.cast(fl, "i64") + ti - off, s, align, padding))
        return ex.cast(w, x.dtype) * read([o[0], o[1], *idx])

    tn = tuple("t" + s for s in spatial_names(r))
    return [b.reduce("sum", x.dtype, shape, (taps,) * r, body, names, tn)]


# ---------------------------------------------------------------- RoiAlign


class _Roi:
    """One ROI's geometry as expressions of the ROI index (ONNX's reference, step by step)."""

    def __init__(self, n, rois, k, ft, out_h, out_w):
        # opset 10 has no such attribute and behaves as output_half_pixel
        half_pixel = n.opset >= 16 and n.attr("coordinate_transformation_mode") == "half_pixel"
        scale = _f(n.attr("spatial_scale"), ft)
        offset = _f(0.5 if half_pixel else 0.0, ft)
        box = [ex.cast(rois.at([k, ex.const(j)]), ft) * scale - offset for j in range(4)]
        self.start_w, self.start_h = box[0], box[1]
        self.roi_w, self.roi_h = box[2] - box[0], box[3] - box[1]
        if not half_pixel:  # legacy mode: ROIs are at least one pixel
            self.roi_w = ex.maximum(self.roi_w, _f(1, ft))
            self.roi_h = ex.maximum(self.roi_h, _f(1, ft))
        self.bin_h = ex.binary("div", self.roi_h, _f(out_h, ft))
        self.bin_w = ex.binary("div", self.roi_w, _f(out_w, ft))
        ratio = int(n.attr("sampling_ratio"))
        if ratio > 0:
            self.grid_h = self.grid_w = ex.const(ratio)
        else:  # adaptive: ceil(roi / out) samples per bin, depending on the ROI
            self.grid_h = ex.cast(ex.unary("ceil", self.bin_h), "i64")
            self.grid_w = ex.cast(ex.unary("ceil", self.bin_w), "i64")


def _roi_sample(x, roi: _Roi, ft, bidx, c, ph, pw, iy, ix, mode: str):
    """One bilinear sample of bin (ph, pw) at grid point (iy, ix): its weighted sum (avg) or
    its largest weighted corner (max, as ONNX's reference and ORT define max mode)."""
    height, width = x.shape[2], x.shape[3]
    one, half = _f(1, ft), _f(0.5, ft)

    def pos(start, bin_, p, i, grid):
        return start + ex.cast(p, ft) * bin_ + ex.binary(
            "div", (ex.cast(i, ft) + half) * bin_, ex.cast(grid, ft))

    y = pos(roi.start_h, roi.bin_h, ph, iy, roi.grid_h)
    xx = pos(roi.start_w, roi.bin_w, pw, ix, roi.grid_w)
    hf, wf = ex.cast(height, ft), ex.cast(width, ft)
    empty = ex.binary("or", ex.binary("or", _lt(y, -one), _gt(y, hf)),
                      ex.binary("or", _lt(xx, -one), _gt(xx, wf)))

    def axis(v, size):
        v = ex.maximum(v, _f(0, ft))
        low = ex.cast(v, "i64")
        at_edge = ex.binary("ge", low, size - 1)
        low = ex.select(at_edge, size - 1, low)
        high = ex.select(at_edge, size - 1, low + 1)
        frac = ex.select(at_edge, _f(0, ft), v - ex.cast(low, ft))
        return low, high, frac

    yl, yh, ly = axis(y, height)
    xl, xh, lx = axis(xx, width)
    corners = [((yl, xl), (one - ly) * (one - lx)), ((yl, xh), (one - ly) * lx),
               ((yh, xl), ly * (one - lx)), ((yh, xh), ly * lx)]
    terms = [w * ex.cast(x.at([bidx, c, yi, xi]), ft) for (yi, xi), w in corners]
    if mode == "avg":
        val = terms[0] + terms[1] + terms[2] + terms[3]
    else:
        val = ex.maximum(ex.maximum(terms[0], terms[1]), ex.maximum(terms[2], terms[3]))
    return ex.select(empty, _f(0, ft), val)  # outside: all weights 0, so the value 0


@op("RoiAlign")
def roi_align(b, n):
    x, rois, batch = n.inputs[0], n.inputs[1], n.inputs[2]
    mode = n.attr("mode")
    if mode not in ("avg", "max"):
        raise n.fail(f"mode {mode!r} is not supported")
    if x.rank != 4:
        raise n.shape_error(f"input must be rank 4, it is rank {x.rank}")
    out_h, out_w = int(n.attr("output_height")), int(n.attr("output_width"))
    ft = _compute_type(x.dtype)
    shape = (batch.shape[0], x.shape[1], ex.const(out_h), ex.const(out_w))
    names = ("roi", "c", "ph", "pw")
    if int(n.attr("sampling_ratio")) > 0:
        return [_roi_align_fixed(b, n, x, rois, batch, mode, ft, shape, names)]
    return [_roi_align_adaptive(b, n, x, rois, batch, mode, ft, shape, names)]


def _roi_align_fixed(b, n, x, rois, batch, mode, ft, shape, names):
    """A fixed sampling grid: a sum (then / count) or max over the grid."""
    out_h, out_w = shape[2].value, shape[3].value
    ratio = int(n.attr("sampling_ratio"))

    def body(o, r):
        roi = _Roi(n, rois, o[0], ft, out_h, out_w)
        bidx = ex.cast(batch.at([o[0]]), "i64")
        return _roi_sample(x, roi, ft, bidx, o[1], o[2], o[3], r[0], r[1], mode)

    if mode == "max":
        return b.reduce("max", x.dtype, shape, (ratio, ratio), body, names, ("iy", "ix"))
    total = b.reduce("sum", ft, shape, (ratio, ratio), body, names, ("iy", "ix"),
                     tmp_hint(n, "sum"))
    count = _f(ratio * ratio, ft)
    return b.map(x.dtype, shape, lambda i: ex.binary("div", total.at(i), count), names)


def _roi_align_adaptive(b, n, x, rois, batch, mode, ft, shape, names):
    """sampling_ratio 0: each ROI has its own grid, so the grid loops read the ROI."""
    out_h, out_w = shape[2].value, shape[3].value
    name, ty, dims = result(b, n.output_names[0] or "roialign", x.dtype, names, shape)
    k, c, ph, pw, iy, ix = (ex.var(v) for v in ("k", "c", "ph", "pw", "iy", "ix"))
    roi = _Roi(n, rois, k, ft, out_h, out_w)
    bidx = ex.cast(batch.at([k]), "i64")
    sample = _roi_sample(x, roi, ft, bidx, c, ph, pw, iy, ix, mode)
    acc = ex.var("acc", ft)
    first = ex.var("first", "bool")
    if mode == "avg":
        step = [Let("acc", acc + sample)]
        count = ex.cast(ex.maximum(roi.grid_h * roi.grid_w, ex.const(1)), ft)
        final = ex.binary("div", acc, count)
    else:  # the max over no samples is 0, as the reference's initial value
        step = [Let("acc", ex.select(first, sample, ex.maximum(acc, sample))),
                Let("first", ex.const(False))]
        final = acc
    inner = [Let("acc", _f(0, ft)), Let("first", ex.const(True)),
             For("iy", roi.grid_h, [For("ix", roi.grid_w, step)]),
             Store(name, {d: v for (d, _), v in zip(dims, (k, c, ph, pw))}, ex.cast(final, x.dtype))]
    body = [For("k", shape[0], [For("c", shape[1], [For("ph", shape[2], [For("pw", shape[3], inner)])])])]
    b.procedure({name: ty}, body)
    return tensor_value(name, x.dtype, dims)

