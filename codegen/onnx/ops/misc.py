"""Signal and miscellaneous ops: window functions, DFT, STFT, MelWeightMatrix, Det, Col2Im,
Binarizer, BitCast, and a clear refusal for the random-sampling ops.

DFT and STFT are one reduction each: ``out[.., m, co] = sum_{k, ci} x[.., k, ci] * T[k, ci, m,
co]`` against a constant twiddle table ``T`` (cosines and sines of ``2 pi k m / N`` computed
exactly in f64 at import, with the inverse's 1/N and irfft's Hermitian weights folded in), so
a transform is an ordinary matrix product; it is accumulated in f64, like the reference.
Window functions and MelWeightMatrix are maps over their index; Det expands the Leibniz
formula (small matrices only); Col2Im sums, for each image pixel, the column entries whose
block covers it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op


def _out_dtype(n, attr: str = "output_datatype", default: str = "f32") -> str:
    from mlpack.codegen.onnx.importer import onnx_dtype
    if not n.has(attr):
        return default
    return onnx_dtype(n.attr(attr), f"{n!r} attribute {attr!r}")


# ---------------------------------------------------------------- windows

# (a0, a1, a2): w[i] = a0 - a1 cos(2 pi i / N) + a2 cos(4 pi i / N)
_WINDOWS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


@op(*_WINDOWS)
def window(b, n):
    size = int(b.scalar(n.input(0), "the window size"))
    periodic = n.attr("periodic", 1)
    denom = float(size if periodic else size - 1)
    a0, a1, a2 = _WINDOWS[n.op_type]
    out = _out_dtype(n)
    c = lambda v: ex.const(v, "f64")  # noqa: E731

    def fn(idx):
        phase = ex.binary("div", c(2 * math.pi) * ex.cast(idx[0], "f64"), c(denom))
        w = c(a0) - c(a1) * ex.unary("cos", phase)
        if a2:
            w = w + c(a2) * ex.unary("cos", c(2.0) * phase)
        return ex.cast(w, out)

    return [b.map(out, (size,), fn, ("n",))]


# ---------------------------------------------------------------- DFT, STFT


def _twiddle(n_in: int, c_in: int, n_out: int, length: int, inverse: bool, real_out: bool):
    """T[k, ci, m, co] for ``sum_{k, ci} x[k, ci] T[k, ci, m, co]`` (f64)."""
    k = np.arange(n_in)[:, None]
    m = np.arange(n_out)[None, :]
    theta = 2 * np.pi * ((k * m) % length) / length
    cos, sin = np.cos(theta), np.sin(theta)
    if real_out:  # irfft: the missing half is the conjugate mirror of the given one
        kk = np.arange(n_in)
        edge = (kk == 0) | ((length % 2 == 0) & (kk == length // 2))
        w = np.where(edge, 1.0, 2.0)[:, None] / length
        t = np.zeros((n_in, c_in, n_out, 1))
        t[:, 0, :, 0] = w * cos
        if c_in == 2:
            t[:, 1, :, 0] = -np.where(edge[:, None], 0.0, w) * sin
        return t
    sign, scale = (1.0, 1.0 / length) if inverse else (-1.0, 1.0)
    t = np.zeros((n_in, c_in, n_out, 2))
    t[:, 0, :, 0], t[:, 0, :, 1] = cos * scale, sign * sin * scale
    if c_in == 2:  # (a + ib)(cos + i s sin) = a cos - s b sin + i(s a sin + b cos)
        t[:, 1, :, 0], t[:, 1, :, 1] = -sign * sin * scale, cos * scale
    return t


def _transform(b, x, axis: int, n_in: int, table: np.ndarray, weight=None):
    """out[.., m, co] = sum_{k, ci} x[.., k, ci] (* weight[k]) * table[k, ci, m, co], in f64."""
    tw = b.constant(table, names=("k", "ci", "m", "co"))
    shape = list(x.shape)
    shape[axis], shape[-1] = table.shape[2], table.shape[3]

    def fn(o, r):
        idx = list(o)
        idx[axis], idx[-1] = r[0], r[1]
        v = ex.cast(x.at(idx), "f64")
        if weight is not None:
            v = v * ex.cast(weight(r[0]), "f64")
        return v * tw.at([r[0], r[1], o[axis], o[-1]])

    acc = b.reduce("sum", "f64", shape, (n_in, x.shape[-1]), fn, x.names, ("k", "ci"), hint="dft")
    return b.map(x.dtype, acc.shape, lambda idx: ex.cast(acc.at(idx), x.dtype), acc.names)


@op("DFT")
def dft(b, n):
    x = n.input(0)
    if n.opset >= 20:
        axis = int(b.scalar(n.input(2), "the DFT axis", -2))
    else:
        axis = n.attr("axis", 1)
    axis %= x.rank
    if axis == x.rank - 1:
        raise n.fail("the DFT axis cannot be the last (real/imaginary) axis")
    sig, comps = x.shape[axis], x.shape[-1]
    if not (sig.is_const and comps.is_const):
        raise n.fail("the signal length must be static")
    inverse, onesided = bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0))
    length = b.scalar(n.input(1), "dft_length", None)
    if length is None:
        length = 2 * (sig.value - 1) if inverse and onesided else sig.value
    length = int(length)
    if inverse and onesided:  # irfft: one-sided spectrum in, real signal out
        n_in = min(sig.value, length // 2 + 1)
        table = _twiddle(n_in, comps.value, length, length, True, True)
    else:
        n_in = min(sig.value, length)
        n_out = length // 2 + 1 if onesided else length
        table = _twiddle(n_in, comps.value, n_out, length, inverse, False)
    return [_transform(b, x, axis, n_in, table)]


@op("STFT")
def stft(b, n):
    x, window_v = n.input(0), n.input(2)
    step = int(b.scalar(n.input(1), "frame_step"))
    length = b.scalar(n.input(3), "frame_length", None)
    if length is None:
        length = window_v.shape[0].value if window_v is not None else x.shape[-2].value
    length = int(length)
    sig, comps = x.shape[-2], x.shape[-1]
    if not (sig.is_const and comps.is_const) or x.rank != 3:
        raise n.fail("the signal must be [batch, length, 1 or 2] with a static length")
    frames = 1 + (sig.value - length) // step
    onesided = bool(n.attr("onesided", 1))
    n_out = length // 2 + 1 if onesided else length
    table = _twiddle(length, comps.value, n_out, length, False, False)
    # frames as a view: framed[b, f, k, c] = x[b, f * step + k, c] (zero past the end)
    from mlpack.codegen.onnx.values import Value
    xm = b.materialize(x)

    def framed_at(idx):
        r = xm.at([idx[0], idx[1] * step + idx[2], idx[3]])
        return ex.read(r.arg[0], dict(zip(r.arg[1], r.args)), r.dtype, pad=0)

    framed = Value(x.dtype, (x.shape[0], frames, length, comps), framed_at,
                   ("b", "frame", "k", "c"))
    weight = (lambda k: window_v.at([k])) if window_v is not None else None
    return [_transform(b, framed, 2, length, table, weight)]


@op("MelWeightMatrix")
def mel_weight_matrix(b, n):
    mels = int(b.scalar(n.input(0), "num_mel_bins"))
    length = int(b.scalar(n.input(1), "dft_length"))
    rate, lo_hz, hi_hz = n.input(2), n.input(3), n.input(4)
    out = _out_dtype(n)
    f = "f64"
    c = lambda v: ex.const(float(v), f)  # noqa: E731
    ln10 = math.log(10)

    def to_mel(hz):
        return c(2595.0) * ex.binary("div", ex.unary("log", c(1.0) + ex.binary(
            "div", ex.cast(hz.at([ex.const(0)] * hz.rank), f), c(700.0))), c(ln10))

    def bin_of(i):  # the spectrogram bin of mel point i (as the reference computes it)
        lo, hi = to_mel(lo_hz), to_mel(hi_hz)
        mel = ex.cast(i, f) * ex.binary("div", hi - lo, c(mels + 2)) + lo
        hz = c(700.0) * (ex.unary("exp", ex.binary("div", mel, c(2595.0)) * c(ln10)) - c(1.0))
        sr = ex.cast(rate.at([ex.const(0)] * rate.rank), f)
        return ex.unary("floor", ex.binary("div", c(length + 1) * hz, sr))

    def fn(idx):
        j, i = ex.cast(idx[0], f), idx[1]
        lo, mid, hi = bin_of(i), bin_of(i + 1), bin_of(i + 2)
        rise = ex.select(ex.binary("eq", mid, lo), ex.select(ex.binary("eq", j, mid), c(1), c(0)),
                         ex.select(ex.binary("and", ex.binary("ge", j, lo), ex.binary("le", j, mid)),
                                   ex.binary("div", j - lo, mid - lo), c(0)))
        fall = ex.binary("and", ex.binary("gt", hi, mid),
                         ex.binary("and", ex.binary("ge", j, mid), ex.binary("lt", j, hi)))
        return ex.cast(ex.select(fall, ex.binary("div", hi - j, hi - mid), rise), out)

    return [b.map(out, (length // 2 + 1, mels), fn, ("bin", "mel"))]


# ---------------------------------------------------------------- linear algebra, images

_DET_MAX = 5  # the Leibniz expansion has n! terms


@op("Det")
def det(b, n):
    x = n.input(0)
    size = x.shape[-1]
    if not size.is_const or size.value > _DET_MAX:
        raise n.fail(f"Det of matrices larger than {_DET_MAX}x{_DET_MAX} (or of dynamic size) "
                     "is not supported")
    k = size.value

    def fn(idx):
        at = lambda i, j: x.at([*idx, ex.const(i), ex.const(j)])  # noqa: E731
        total = None
        for perm in itertools.permutations(range(k)):
            term = at(0, perm[0])
            for i in range(1, k):
                term = term * at(i, perm[i])
            inversions = sum(perm[i] > perm[j] for i in range(k) for j in range(i + 1, k))
            if total is None:
                total = -term if inversions % 2 else term
            else:
                total = ex.binary("sub" if inversions % 2 else "add", total, term)
        return total

    return [b.map(x.dtype, x.shape[:-2], fn, x.names[:-2])]


@op("Col2Im")
def col2im(b, n):
    x = n.input(0)
    image = b.static_ints(n.input(1), "image_shape")
    block = b.static_ints(n.input(2), "block_shape")
    nd = len(image)
    dil = n.attr("dilations", None) or [1] * nd
    pads = n.attr("pads", None) or [0] * (2 * nd)
    strides = n.attr("strides", None) or [1] * nd
    nblocks = [(image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
               for i in range(nd)]
    kprod = int(np.prod(block))
    channels = ex.floordiv(x.shape[1], kprod)
    xm = b.materialize(x)

    def fn(o, r):
        bn, ch, pix = o[0], o[1], o[2:]
        ok, kflat, bflat = None, ex.const(0), ex.const(0)
        for i in range(nd):
            # pixel = blk * stride - pad + k * dilation  =>  blk = (pixel + pad - k*dil) / stride
            num = pix[i] + pads[i] - r[i] * dil[i]
            blk = ex.floordiv(num, strides[i])
            cond = ex.binary("and", ex.binary("ge", num, ex.const(0)),
                             ex.binary("lt", blk, ex.const(nblocks[i])))
            if strides[i] > 1:
                cond = ex.binary("and", cond, ex.binary("eq", ex.mod(num, strides[i]), ex.const(0)))
            ok = cond if ok is None else ex.binary("and", ok, cond)
            kflat = kflat * block[i] + r[i]
            bflat = bflat * nblocks[i] + ex.maximum(blk, ex.const(0))
        v = xm.at([bn, ch * kprod + kflat, bflat])
        v = ex.read(v.arg[0], dict(zip(v.arg[1], v.args)), v.dtype, pad=0)
        return ex.select(ok, v, ex.const(0, x.dtype) if dt.is_int(x.dtype) else ex.const(0.0, x.dtype))

    return [b.reduce("sum", x.dtype, (x.shape[0], channels, *image), tuple(block), fn,
                     ("n", "c", *[f"s{i}" for i in range(nd)]), [f"k{i}" for i in range(nd)])]


# ---------------------------------------------------------------- elementwise odds and ends


@op("Binarizer", domain="ai.onnx.ml")
def binarizer(b, n):
    x = n.input(0)
    t = n.attr("threshold", 0.0)
    one, zero = (ex.const(1, x.dtype), ex.const(0, x.dtype)) if dt.is_int(x.dtype) else \
        (ex.const(1.0, x.dtype), ex.const(0.0, x.dtype))
    return [b.elementwise(x.dtype, [x], lambda a: ex.select(
        ex.binary("gt", a, ex.const(t, x.dtype)), one, zero))]


@op("Bernoulli", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
    "Multinomial")
def random(b, n):
    # The IR is deterministic by design (every target must agree with the reference
    # interpreter), and these ops' results depend on a generator's stream.
    raise n.fail("random sampling is not supported: mlpack programs are deterministic and "
                 "the IR has no random number source")


@op("BitCast")
def bitcast(b, n):
    from mlpack.codegen.onnx.importer import onnx_dtype
    x = n.input(0)
    to = onnx_dtype(n.attr("to"), f"{n!r} attribute 'to'")
    if dt.bits(x.dtype) != dt.bits(to):
        raise n.fail(f"BitCast needs equal widths ({x.dtype} is {dt.bits(x.dtype)} bits, "
                     f"{to} is {dt.bits(to)})")
    src_int = dt.is_int(x.dtype) or x.dtype == "bool"
    if src_int and (dt.is_int(to) or to == "bool"):
        # same-width integers: the bits are the two's complement value, i.e. a wrapping cast
        return [b.elementwise(to, [x], lambda a: ex.cast(a, to))]
    fmt = _FLOAT_FORMATS.get(to if dt.is_float(to) else x.dtype)
    if fmt is None:
        raise n.fail(f"BitCast between {x.dtype} and {to} is not supported")
    if dt.is_float(to):
        return [b.elementwise(to, [x], lambda a: _bits_to_float(a, to, *fmt))]
    return [b.elementwise(to, [x], lambda a: _float_to_bits(a, to, *fmt))]


# IEEE formats: (exponent bits, mantissa bits, integer type of the same width)
_FLOAT_FORMATS = {"f32": (8, 23, "i32"), "f64": (11, 52, "i64"), "f16": (5, 10, "i16")}


def _bits_to_float(a, to: str, ebits: int, mbits: int, _int: str):
    """Decode IEEE bits held in an integer into the float they encode (exact, in f64)."""
    bits = ex.cast(a, "i64")
    if dt.bits(to) < 64:  # unsigned view of the pattern
        bits = ex.binary("bitand", bits, ex.const((1 << dt.bits(to)) - 1))
    mant = ex.binary("bitand", bits, ex.const((1 << mbits) - 1))
    expo = ex.binary("bitand", ex.binary("shr", bits, ex.const(mbits)), ex.const((1 << ebits) - 1))
    neg = ex.binary("ne", ex.binary("bitand", ex.binary("shr", bits, ex.const(dt.bits(to) - 1)),
                                    ex.const(1)), ex.const(0))
    bias = (1 << (ebits - 1)) - 1
    f = "f64"
    frac = ex.binary("div", ex.cast(mant, f), ex.const(float(1 << mbits), f))
    # 2**e in two halves so that f64's own exponent range is never exceeded mid-way
    e = ex.cast(ex.select(ex.binary("eq", expo, ex.const(0)), ex.const(1 - bias), expo - bias), f)
    half = ex.unary("floor", ex.binary("div", e, ex.const(2.0, f)))
    scale = ex.binary("pow", ex.const(2.0, f), half) * ex.binary("pow", ex.const(2.0, f), e - half)
    normal = ex.select(ex.binary("eq", expo, ex.const(0)), frac, frac + ex.const(1.0, f))
    special = ex.select(ex.binary("eq", mant, ex.const(0)), ex.const(math.inf, f),
                        ex.const(math.nan, f))
    mag = ex.select(ex.binary("eq", expo, ex.const((1 << ebits) - 1)), special, normal * scale)
    return ex.cast(ex.select(neg, -mag, mag), to)


def _float_to_bits(a, to: str, ebits: int, mbits: int, _int: str):
    """Encode a float's IEEE bits into an integer (NaN becomes the canonical quiet NaN)."""
    f = "f64"
    v = ex.cast(a, f)
    width = dt.bits(a.dtype)
    bias = (1 << (ebits - 1)) - 1
    # the sign of -0.0 shows in its reciprocal
    neg = ex.binary("or", ex.binary("lt", v, ex.const(0.0, f)),
                    ex.binary("lt", ex.unary("recip", v), ex.const(0.0, f)))
    mag = ex.unary("abs", v)
    two = ex.const(2.0, f)
    # exponent: floor(log2(mag)), corrected by one either way for rounding in log
    e0 = ex.unary("floor", ex.binary("div", ex.unary("log", mag), ex.const(math.log(2), f)))
    e1 = ex.select(ex.binary("gt", ex.binary("pow", two, e0), mag), e0 - ex.const(1.0, f), e0)
    e = ex.select(ex.binary("le", ex.binary("pow", two, e1 + ex.const(1.0, f)), mag),
                  e1 + ex.const(1.0, f), e1)
    sub = ex.binary("lt", e, ex.const(float(1 - bias), f))  # subnormal (or zero)
    step = ex.binary("pow", two, ex.const(float(1 - bias - mbits), f))
    m_sub = ex.binary("div", mag, step)
    m_norm = (ex.binary("div", mag, ex.binary("pow", two, e)) - ex.const(1.0, f)) * \
        ex.const(float(1 << mbits), f)
    mant = ex.cast(ex.select(sub, m_sub, m_norm), "i64")
    expo = ex.select(sub, ex.const(0), ex.cast(e, "i64") + bias)
    top = (1 << ebits) - 1
    isnan, isinf = ex.unary("isnan", v), ex.unary("isinf", v)
    expo = ex.select(ex.binary("or", isnan, isinf), ex.const(top), expo)
    mant = ex.select(isinf, ex.const(0), ex.select(isnan, ex.const(1 << (mbits - 1)), mant))
    bits = ex.binary("bitor", ex.binary("shl", expo, ex.const(mbits)), mant)
    sign = ex.select(ex.binary("and", neg, ex.unary("not", isnan)),
                     ex.const(-(1 << (width - 1))), ex.const(0))  # the sign bit, wrapped
    return ex.cast(ex.binary("bitor", bits, sign), to)
