"""Resize and Upsample: nearest, linear and cubic interpolation, every coordinate mode.

Resizing is separable. For each resized axis the output coordinate fixes, at import time,
which input positions contribute ("taps") and with what weight; those per-axis tables are
small constants (out_size x taps) computed from static sizes only, never from data. The
result is then one comprehension over the taps:

    out[n, c, h, w] = sum{th, tw} x[n, c, ih[h, th], iw[w, tw]] * wh[h, th] * ww[w, tw]

(a gather plus an einsum in the interpreter). Nearest needs one tap and no weights: a pure
gather ``out[...] = x[n, c, ih[h], iw[w]]``. Axes that keep their size under an identity
mapping are left alone, so symbolic batch dims pass through.
"""

from __future__ import annotations

import math

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.builder import NeedsValue
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.ops.linalg import tmp_hint


def _floats(b, n, v, what):
    """A constant float input's values, or None when absent or empty."""
    if v is None:
        return None
    if v.data is not None:
        vals = np.asarray(v.data, dtype=np.float64).reshape(-1)
    elif v.known is not None and all(k.is_const for k in v.known):
        vals = np.array([k.value for k in v.known], dtype=np.float64)
    else:
        if v.static_shape() == (0,):
            return None
        raise NeedsValue(n.name, what)
    return None if vals.size == 0 else [float(x) for x in vals]


# ---------------------------------------------------------------- per-axis tables (NumPy)


def _coords(mode, y, scale, in_size, out_size, roi):
    """Source coordinate of each output index, and where it falls outside (tf_crop_and_resize)."""
    out_f = scale * in_size
    outside = None
    if mode == "align_corners":
        x = np.zeros_like(y) if out_f == 1 else y * (in_size - 1) / (out_f - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        x = (np.full_like(y, (hi - lo) * (in_size - 1) / 2) if out_f == 1
             else y * (hi - lo) * (in_size - 1) / (out_f - 1))
        x = x + lo * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full_like(y, -0.5) if out_f == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / out_f)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(mode)
    return x, outside


def _nearest(ratio, mode):
    if float(ratio).is_integer():
        return [0.0, 1.0]
    up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
          "floor": False, "ceil": True}[mode]
    return [float(not up), float(up)]


def _cubic(ratio, scale, a, antialias):
    if not antialias:
        r, s = ratio, 1 - ratio
        return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                ((a + 2) * r - (a + 3)) * r * r + 1,
                ((a + 2) * s - (a + 3)) * s * s + 1,
                ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a]
    scale = min(scale, 1.0)

    def k(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0

    start = int(np.floor(-2 / scale) + 1)
    c = [k(scale * (i - ratio)) for i in range(start, 2 - start)]
    return [v / sum(c) for v in c]


def _linear(ratio, scale, antialias):
    if not antialias:
        return [1 - ratio, ratio]
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return list(c / c.sum())


def axis_taps(p, in_size, out_size, scale, roi):
    """(indices [out, taps] clamped into range, weights [out, taps], outside [out] or None),
    mirroring the ONNX reference's neighbour choice."""
    y = np.arange(out_size, dtype=np.float64)
    x, outside = _coords(p["ctm"], y, scale, in_size, out_size, roi)
    xi = np.floor(x)
    ratios = np.where(x == xi, 1.0, x - xi)
    if p["mode"] == "nearest":
        coeffs = np.array([_nearest(r, p["nearest_mode"]) for r in ratios])
    elif p["mode"] == "linear":
        coeffs = np.array([_linear(r, scale, p["antialias"]) for r in ratios])
    else:
        coeffs = np.array([_cubic(r, scale, p["a"], p["antialias"]) for r in ratios])
    taps = coeffs.shape[1]
    half = int(np.ceil(taps / 2))
    xp = x + half
    base = np.floor(xp)
    frac = xp - base
    if taps % 2 == 0:
        off = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    idx = (base + off).astype(np.int64)[:, None] + np.arange(taps)[None, :] - half
    if p["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= in_size), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_size - 1), coeffs, outside


# ---------------------------------------------------------------- the op


def _params(n):
    old = n.op_type == "Upsample" or n.opset < 11
    mode = n.attr("mode", "nearest")
    if mode in ("bilinear", "trilinear"):  # Upsample-7 spellings
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic"):
        raise n.fail(f"mode={mode!r} is not supported")
    return {
        "mode": mode,
        # before opset 11, Resize and Upsample map coordinates asymmetrically and round down
        "ctm": "asymmetric" if old else n.attr("coordinate_transformation_mode"),
        "nearest_mode": "floor" if old else n.attr("nearest_mode"),
        "a": -0.75 if old else float(n.attr("cubic_coeff_a")),
        "exclude_outside": 0 if old else int(n.attr("exclude_outside")),
        "antialias": 0 if n.opset < 18 or old else int(n.attr("antialias")),
        "extrapolation": 0.0 if old else float(n.attr("extrapolation_value")),
    }


def _geometry(b, n, x, scales, sizes, roi, axes):
    """Per-axis (scale, out size, roi pair) over all of x's axes."""
    r = x.rank
    axes = [a % r for a in (axes or range(r))]
    full_scale = [1.0] * r
    out = list(x.shape)
    full_roi = [(0.0, 1.0)] * r
    if roi is not None and len(roi) == 2 * len(axes):
        for i, a in enumerate(axes):
            full_roi[a] = (roi[i], roi[len(axes) + i])

    def static(a):
        if not x.shape[a].is_const:
            raise n.fail(f"resized axis {a} must have a static size")
        return x.shape[a].value

    if sizes is not None:
        if len(sizes) != len(axes):
            raise n.shape_error(f"sizes has {len(sizes)} values for {len(axes)} axes")
        ratio = [sizes[i] / static(a) for i, a in enumerate(axes)]
        policy = "stretch" if n.op_type == "Upsample" or n.opset < 18 else n.attr("keep_aspect_ratio_policy")
        if policy == "stretch":
            for i, a in enumerate(axes):
                full_scale[a], out[a] = ratio[i], ex.const(int(sizes[i]))
        else:
            s = min(ratio) if policy == "not_larger" else max(ratio)
            for a in axes:
                full_scale[a], out[a] = s, ex.const(int(s * static(a) + 0.5))
    elif scales is not None:
        if len(scales) != len(axes):
            raise n.shape_error(f"scales has {len(scales)} values for {len(axes)} axes")
        for s, a in zip(scales, axes):
            full_scale[a] = s
            if s != 1.0:
                out[a] = ex.const(int(math.floor(s * static(a))))
    else:
        raise n.fail("neither scales nor sizes is given")
    return full_scale, out, full_roi


def _is_identity(p, x, a, scale, out, roi):
    return (math.isclose(scale, 1.0) and ex.same_size(out, x.shape[a])
            and (p["ctm"] != "tf_crop_and_resize" or
                 (math.isclose(roi[0], 0.0) and math.isclose(roi[1], 1.0))))


def resize(b, n, x, scales, sizes, roi, axes):
    p = _params(n)
    if p["mode"] != "nearest" and not dt.is_float(x.dtype):
        raise n.fail(f"{p['mode']} interpolation of {x.dtype} is not supported")
    scale, out, rois = _geometry(b, n, x, scales, sizes, roi, axes)
    names = tuple(x.names)
    tables = {}   # axis -> (index table, weight table or None, outside table or None)
    for a in range(x.rank):
        if _is_identity(p, x, a, scale[a], out[a], rois[a]):
            continue
        idx, w, outside = axis_taps(p, x.shape[a].value, out[a].value, scale[a], rois[a])
        if p["mode"] == "nearest":  # one tap: the one with weight 1
            idx, w = idx[np.arange(len(idx)), np.argmax(w, axis=1)][:, None], None
        tname = f"{names[a]}_{n.output_names[0]}"
        tables[a] = (b.constant(idx, name=f"{tname}_src"),
                     None if w is None else
                     b.constant(w.astype(dt.to_numpy(x.dtype)), name=f"{tname}_w"),
                     None if outside is None or not outside.any() else
                     b.constant(outside, name=f"{tname}_out"))
    taps = [a for a in tables if tables[a][1] is not None]
    masks = [a for a in tables if tables[a][2] is not None]

    def body(o, t):
        tap = dict(zip(taps, t))
        src = [tables[a][0].at([o[a], tap.get(a, ex.const(0))]) if a in tables else o[a]
               for a in range(x.rank)]
        prod = x.at(src)
        for a in taps:
            prod = prod * tables[a][1].at([o[a], tap[a]])
        return prod

    rshape = [tables[a][1].shape[1] for a in taps]
    hint = tmp_hint(n, "interp") if masks else None
    rnames = [f"t{names[a]}" for a in taps]
    if taps:
        y = b.reduce("sum", x.dtype, out, rshape, body, names, rnames, hint)
    else:
        y = b.map(x.dtype, out, lambda o: body(o, []), names, hint)
    if not masks:
        return y

    # tf_crop_and_resize: a position whose source falls outside the input (on any axis)
    def extrapolate(o):
        far = None
        for a in masks:
            m = tables[a][2].at([o[a]])
            far = m if far is None else ex.binary("or", far, m)
        return ex.select(far, ex.const(p["extrapolation"], x.dtype), y.at(o))

    return b.map(x.dtype, out, extrapolate, names)


@op("Resize")
def resize_op(b, n):
    x = n.inputs[0]
    if n.opset < 11:
        return [resize(b, n, x, _floats(b, n, n.input(1), "scales"), None, None, None)]
    roi = _floats(b, n, n.input(1), "roi")
    scales = _floats(b, n, n.input(2), "scales")
    sizes = None
    if n.input(3) is not None and n.input(3).static_shape() != (0,):
        sizes = b.static_ints(n.input(3), "sizes")
    if sizes is not None:
        scales = None
    axes = n.attr("axes", None) if n.opset >= 18 else None
    return [resize(b, n, x, scales, sizes, roi, axes)]


@op("Upsample")
def upsample(b, n):
    x = n.inputs[0]
    scales = n.attr("scales", None) if n.opset < 9 else _floats(b, n, n.input(1), "scales")
    return [resize(b, n, x, [float(s) for s in scales], None, None, None)]
