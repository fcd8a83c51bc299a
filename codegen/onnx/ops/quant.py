"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv.

Scales and zero points are per tensor (a scalar or a one-element vector), per axis (a vector
along ``axis``) or blocked (opset 21: same rank as the input, ``block_size`` elements of
``axis`` share one entry); ``_param`` reads either kind at an element's index, so every op
stays one comprehension. Outputs may be 8/16-bit integers, the narrow integers (int4, int2)
and the narrow floats (float8 variants, float4e2m1); narrow values are computed in f32 and
converted by one cast at the end.

Arithmetic follows the ONNX reference: quantize divides in the input's float type, rounds half
to even, adds the zero point and saturates; dequantize subtracts in f32 and scales; the QLinear
ops accumulate ``(a - a_zp) * (b - b_zp)`` in i32 and requantize in f32.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op

_QUANT_OUT = ("u8", "i8", "u16", "i16", "i32", "u4", "i4", "u2", "i2", "f8e4m3fn", "f8e4m3fnuz",
              "f8e5m2", "f8e5m2fnuz", "f4e2m1")


def _param(v, rank: int, axis: int, block: int, idx):
    """Read scale or zero point ``v`` for the input element at ``idx``."""
    shape = v.static_shape()
    if v.rank == 0 or (shape is not None and int(np.prod(shape)) == 1):
        return v.at([ex.const(0)] * v.rank)
    if block:
        return v.at([i // block if d == axis else i for d, i in enumerate(idx)])
    return v.at([idx[axis]])


def _axis(n, rank: int) -> int:
    axis = n.attr("axis", 1)
    return axis + rank if axis < 0 else axis


def _saturate(q, zp, out: str, saturate: bool = True):
    """Quantize ``q`` (already divided by the scale) to ``out``.

    Integers: round half to even, add the zero point, clip to the range. Narrow floats: the
    value itself (clipped to the finite range when ``saturate``), plus the zero point for fp4
    as the reference does; float8 zero points are zero by definition.
    """
    acc = "f64" if q.dtype == "f64" else "f32"
    lo, hi = dt.finite_range(out)
    q = ex.cast(ex.unary("round", q) if dt.is_int(out) else q, acc)
    if zp is not None and (dt.is_int(out) or out == "f4e2m1"):
        q = q + ex.cast(zp, acc)
    if saturate or dt.is_int(out):
        q = ex.minimum(ex.maximum(q, ex.const(lo, acc)), ex.const(hi, acc))
    return ex.cast(q, out)


def _out_type(b, n, zp) -> str:
    from mlpack.codegen.onnx.importer import onnx_dtype
    if zp is not None:
        out = zp.dtype
    elif n.attr("output_dtype", 0):
        out = onnx_dtype(n.attr("output_dtype"), f"{n!r} attribute 'output_dtype'")
    else:
        out = "u8"
    if out not in _QUANT_OUT:
        raise n.fail(f"quantizing to {out} is not supported (only {', '.join(_QUANT_OUT)})")
    return out


@op("QuantizeLinear")
def quantize_linear(b, n):
    x, scale, zp = n.input(0), n.input(1), n.input(2)
    out = _out_type(b, n, zp)
    axis, block = _axis(n, x.rank), n.attr("block_size", 0) or 0
    calc = x.dtype
    if n.attr("precision", 0):
        from mlpack.codegen.onnx.importer import onnx_dtype
        calc = onnx_dtype(n.attr("precision"), f"{n!r} attribute 'precision'")

    def fn(idx):
        s = ex.cast(_param(scale, x.rank, axis, block, idx), calc)
        q = ex.binary("div", ex.cast(x.at(idx), calc), s)
        z = _param(zp, x.rank, axis, block, idx) if zp is not None else None
        return _saturate(q, z, out, bool(n.attr("saturate", 1)))

    return [b.map(out, x.shape, fn, x.names)]


@op("DequantizeLinear")
def dequantize_linear(b, n):
    from mlpack.codegen.onnx.importer import onnx_dtype
    x, scale, zp = n.input(0), n.input(1), n.input(2)
    if not (dt.is_int(x.dtype) or dt.is_float(x.dtype)):
        raise n.fail(f"dequantizing {x.dtype} is not supported")
    out = scale.dtype
    if n.attr("output_dtype", 0):
        out = onnx_dtype(n.attr("output_dtype"), f"{n!r} attribute 'output_dtype'")
    axis, block = _axis(n, x.rank), n.attr("block_size", 0) or 0
    acc = dt.promote("f32", scale.dtype)

    def fn(idx):
        d = ex.cast(x.at(idx), "f32")
        if zp is not None and dt.is_int(x.dtype):  # float8/fp4 zero points are zero
            d = d - ex.cast(_param(zp, x.rank, axis, block, idx), "f32")
        return ex.cast(ex.cast(d, acc) * ex.cast(_param(scale, x.rank, axis, block, idx), acc), out)

    # an 8-bit weight stays a map of its integers, so that codegen/passes/qdq.py can put its
    # contraction on the integer kernels (it evaluates the maps no integer sum took)
    return [b.map(out, x.shape, fn, x.names, fold=x.dtype not in ("i8", "u8"))]


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(b, n):
    x = n.input(0)
    f = x.dtype
    zero = ex.const(0.0, f)
    all_r = list(x.shape)
    hi = b.reduce("max", f, (), all_r, lambda o, r: x.at(r), (), x.names, hint="dql_max")
    lo = b.reduce("min", f, (), all_r, lambda o, r: x.at(r), (), x.names, hint="dql_min")

    def scale_of(_):
        mx, mn = ex.maximum(zero, hi.at([])), ex.minimum(zero, lo.at([]))
        rng = ex.select(ex.binary("eq", mx, mn), ex.const(1.0, f), mx - mn)
        return ex.binary("div", rng, ex.const(255.0, f))

    scale = b.map(f, (), scale_of, (), hint="dql_scale")

    def zp_of(_):
        mn = ex.minimum(zero, lo.at([]))
        z = ex.const(0.0, f) - ex.binary("div", mn, scale.at([]))
        z = ex.minimum(ex.maximum(z, ex.const(0.0, f)), ex.const(255.0, f))
        return ex.cast(ex.unary("round", z), "u8")

    zp = b.map("u8", (), zp_of, (), hint="dql_zp")
    y = b.map("u8", x.shape, lambda idx: _saturate(
        ex.binary("div", x.at(idx), scale.at([])), zp.at([]), "u8"), x.names)
    return [y, scale, zp]


def _scalar(v):
    """A per-tensor parameter (a scalar or a one-element vector)."""
    return v.at([ex.const(0)] * v.rank)


def _centered(v, zp_expr):
    """``v - zp`` in i32, the accumulator type of the QLinear ops."""
    d = ex.cast(v, "i32")
    return d - ex.cast(zp_expr, "i32") if zp_expr is not None else d


def _requant_scale(sa, sb, sy):
    """a_scale * b_scale / y_scale, computed in the scales' own type as the reference does,
    then widened to f64 for the product with the i32 accumulator."""
    f = dt.promote(dt.promote(sa.dtype, sb.dtype), sy.dtype)
    return ex.cast(ex.binary("div", ex.cast(sa, f) * ex.cast(sb, f), ex.cast(sy, f)), "f64")


@op("QLinearMatMul")
def qlinear_matmul(b, n):
    a, sa, za, w, sw, zw, sy, zy = (n.input(i) for i in range(8))
    if a.rank < 2 or w.rank < 2:
        raise n.fail("QLinearMatMul of vectors (rank 1) is not supported")
    out = zy.dtype if zy is not None else a.dtype
    m, k, nn = a.shape[-2], a.shape[-1], w.shape[-1]
    ba = b.broadcast_shape(n, _Shape(a.shape[:-2]), _Shape(w.shape[:-2]))
    rank = len(ba)

    def row(v, i):  # a per-row (M) or per-tensor parameter
        return _param(v, 2, 0, 0, [i, ex.const(0)]) if v is not None else None

    def col(v, j):  # b per-column (N) or per-tensor parameter
        return _param(v, 2, 0, 0, [j, ex.const(0)]) if v is not None else None

    def acc(o, r):
        bi, i, j = o[:rank], o[rank], o[rank + 1]
        ai = _batch_index(a, bi) + [i, r[0]]
        wi = _batch_index(w, bi) + [r[0], j]
        return _centered(a.at(ai), row(za, i)) * _centered(w.at(wi), col(zw, j))

    names = tuple(f"b{i}" for i in range(rank)) + ("m", "n")
    c = b.reduce("sum", "i32", (*ba, m, nn), (k,), acc, names, ("k",), hint="qmm_acc")

    def fn(idx):
        i, j = idx[rank], idx[rank + 1]
        s = _requant_scale(row(sa, i), col(sw, j), _scalar(sy))
        z = _scalar(zy) if zy is not None else None
        return _saturate(ex.cast(c.at(idx), "f64") * s, z, out)

    return [b.map(out, c.shape, fn, names)]


class _Shape:
    """A stand-in with just a shape, for Builder.broadcast_shape."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.rank = len(shape)


def _batch_index(v, bi):
    """The leading (batch) index of ``v`` inside a broadcast batch index ``bi``."""
    nb = v.rank - 2
    off = len(bi) - nb
    return [ex.const(0) if (s.is_const and s.value == 1) else bi[off + j]
            for j, s in enumerate(v.shape[:nb])]


@op("QLinearConv")
def qlinear_conv(b, n):
    x, sx, zx, w, sw, zw, sy, zy, bias = (n.input(i) for i in range(9))
    nsp = x.rank - 2
    ks = [s.value for s in w.shape[2:]] if all(s.is_const for s in w.shape[2:]) else None
    if ks is None:
        raise n.fail("the kernel shape must be static")
    strides = n.attr("strides", None) or [1] * nsp
    dil = n.attr("dilations", None) or [1] * nsp
    group = n.attr("group", 1)
    pads = _conv_pads(n, x, ks, strides, dil, nsp)
    if not all(s.is_const for s in x.shape[2:]):
        raise n.fail("the spatial input shape must be static")
    insz = [s.value for s in x.shape[2:]]
    osz = [(insz[i] + pads[i] + pads[i + nsp] - dil[i] * (ks[i] - 1) - 1) // strides[i] + 1
           for i in range(nsp)]
    cin_g = w.shape[1]
    m = w.shape[0]
    m_g = ex.floordiv(m, group)
    out = zy.dtype if zy is not None else x.dtype
    zxe = _scalar(zx) if zx is not None else None
    x = b.materialize(x)  # so that the guarded read below is a plain read

    def acc(o, r):
        nb, oc, sp = o[0], o[1], o[2:]
        c, kk = r[0], r[1:]
        g = ex.floordiv(oc, m_g)
        pos = [sp[i] * strides[i] + kk[i] * dil[i] - pads[i] for i in range(nsp)]
        inside = None
        for p, s in zip(pos, insz):
            ok = ex.binary("and", ex.binary("ge", p, ex.const(0)), ex.binary("lt", p, ex.const(s)))
            inside = ok if inside is None else ex.binary("and", inside, ok)
        xv = _centered(_guarded(x, [nb, g * cin_g + c, *pos]), zxe)
        if inside is not None:  # padding holds the zero point, i.e. zero after centering
            xv = ex.select(inside, xv, ex.const(0, "i32"))
        wzp = _param(zw, 1, 0, 0, [oc]) if zw is not None else None
        return xv * _centered(w.at([oc, c, *kk]), wzp)

    names = ("n", "c", *[f"s{i}" for i in range(nsp)])
    rn = ("ci", *[f"k{i}" for i in range(nsp)])
    accv = b.reduce("sum", "i32", (x.shape[0], m, *osz), (cin_g, *ks), acc, names, rn,
                    hint="qconv_acc")

    def fn(idx):
        v = accv.at(idx)
        if bias is not None:
            v = v + ex.cast(bias.at([idx[1]]), "i32")
        s = _requant_scale(_scalar(sx), _param(sw, 1, 0, 0, [idx[1]]), _scalar(sy))
        z = _scalar(zy) if zy is not None else None
        return _saturate(ex.cast(v, "f64") * s, z, out)

    return [b.map(out, accv.shape, fn, names)]


def _guarded(x, idx):
    """Read ``x`` at ``idx``; out-of-range reads give 0 (the caller masks them)."""
    r = x.at(idx)
    return ex.read(r.arg[0], dict(zip(r.arg[1], r.args)), r.dtype, pad=0)


def _conv_pads(n, x, ks, strides, dil, nsp):
    """Begin and end pads (ONNX order), resolving auto_pad."""
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return n.attr("pads", None) or [0] * (2 * nsp)
    if auto == "VALID":
        return [0] * (2 * nsp)
    if not all(s.is_const for s in x.shape[2:]):
        raise n.fail(f"auto_pad={auto} needs a static spatial shape")
    begin, end = [], []
    for i in range(nsp):
        size = x.shape[2 + i].value
        out = -(-size // strides[i])
        total = max(0, (out - 1) * strides[i] + dil[i] * (ks[i] - 1) + 1 - size)
        lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    return begin + end
