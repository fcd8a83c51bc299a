"""Convolutions: Conv, ConvTranspose, ConvInteger (1-D, 2-D, 3-D and beyond).

A convolution is one ``sum`` comprehension over input channels and kernel offsets whose body
is a product of two reads, the input read guarded (pad 0) at ``o*stride + k*dilation - pad``:

    out[n, co, h, w] = sum{ci, kh, kw} x[n, ci, h*s+kh*d-p] * w[co, ci, kh, kw]

so it runs as an im2col gather plus one einsum. Grouped convolutions split the output channel
into (group, channel-in-group) dims and expose the usual layout as a view. The window
arithmetic (output sizes, auto_pad, ceil_mode) is shared with pooling (pool.py).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import Value, view
from mlpack.codegen.onnx.ops.linalg import tmp_hint

SPATIAL_NAMES = {1: ("x",), 2: ("h", "w"), 3: ("d", "h", "w")}


def spatial_names(k: int) -> tuple[str, ...]:
    return SPATIAL_NAMES.get(k, tuple(f"s{i}" for i in range(k)))


def guarded(b, v: Value, pad):
    """idx -> a read of ``v`` that gives ``pad`` outside its bounds (padding)."""
    if v.tensor is None:
        v = b.materialize(v)
    return lambda idx: ex.read(v.tensor, dict(zip(v.names, idx)), v.dtype, pad=pad)


def _const_ints(n, name, k, default):
    vals = n.attr(name, None)
    if vals is None:
        return [default] * k
    if len(vals) != k:
        raise n.shape_error(f"attribute {name} has {len(vals)} values, expected {k}")
    return [int(v) for v in vals]


def window(n, in_sizes, kernel, ceil_mode=False):
    """Output sizes and begin pads of a sliding window (Conv and the pools).

    Returns (out_sizes, pad_begin, pad_end, strides, dilations, padded) where padded says
    whether a window can reach outside the input (the input read must be guarded)."""
    k = len(kernel)
    strides = _const_ints(n, "strides", k, 1)
    dilations = _const_ints(n, "dilations", k, 1)
    pads = n.attr("pads", None) or [0] * (2 * k)
    if len(pads) != 2 * k:
        raise n.shape_error(f"pads has {len(pads)} values, expected {2 * k}")
    auto_pad = n.attr("auto_pad", "NOTSET") or "NOTSET"
    outs, begins, ends = [], [], []
    padded = bool(ceil_mode) or any(pads)
    for i, (size, kk, s, d) in enumerate(zip(in_sizes, kernel, strides, dilations)):
        ek = ex.const((kk - 1) * d + 1)
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = ex.ceildiv(size, s)
            total = ex.maximum((out - 1) * s + ek - size, 0)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
            padded = True
        elif auto_pad == "VALID":
            out = _out_size(size - ek, s, ceil_mode, size)
            pb = pe = ex.const(0)
        elif auto_pad == "NOTSET":
            pb, pe = ex.const(int(pads[i])), ex.const(int(pads[i + k]))
            out = _out_size(size + pads[i] + pads[i + k] - ek, s, ceil_mode, size + pads[i])
        else:
            raise n.fail(f"auto_pad={auto_pad!r} is not supported")
        outs.append(ex.simplify_size(out))
        begins.append(ex.simplify_size(pb))
        ends.append(ex.simplify_size(pe))
    return outs, begins, ends, strides, dilations, padded


def _out_size(span, s, ceil_mode, limit):
    """floor (or ceil) of span/s, plus one; in ceil mode a last window that would start past
    the input and the begin padding (``limit``) is dropped, as ONNX and PyTorch do."""
    if not ceil_mode:
        return span // s + 1
    out = ex.ceildiv(span, s) + 1
    return ex.select(ex.binary("ge", (out - 1) * s, limit), out - 1, out)


def _kernel_shape(n, w: Value):
    ks = n.attr("kernel_shape", None)
    shape = list(w.shape[2:])
    if ks is not None:
        return [int(v) for v in ks]
    if not all(s.is_const for s in shape):
        raise n.fail("the kernel shape must be static")
    return [s.value for s in shape]


def _static(n, e, what):
    if not e.is_const:
        raise n.fail(f"{what} must be static, it is {e}")
    return e.value


def conv(b, n, x: Value, w: Value, dtype: str, hint: str | None = None) -> Value:
    """The convolution of x [N, C, *S] with w [M, C/group, *K] (no bias)."""
    k = x.rank - 2
    if k < 1 or w.rank != x.rank:
        raise n.shape_error(f"input rank {x.rank} and weight rank {w.rank} do not fit a Conv")
    kernel = _kernel_shape(n, w)
    outs, begins, _, strides, dilations, padded = window(n, x.shape[2:], kernel)
    group = int(n.attr("group"))
    cig = w.shape[1]
    mg = ex.simplify_size(w.shape[0] // group) if group > 1 else w.shape[0]
    read_x = guarded(b, x, 0) if padded else x.at
    sp = spatial_names(k)

    def body(o, r):
        g, co = (o[1], o[2]) if group > 1 else (None, o[1])
        sidx, ci, kidx = o[-k:], r[0], r[1:]
        pos = [oi * s + ki * d - p for oi, ki, s, d, p in zip(sidx, kidx, strides, dilations, begins)]
        cx = ci if g is None else g * cig + ci
        cw = co if g is None else g * mg + co
        return read_x([o[0], cx] + pos) * w.at([cw, ci] + kidx)

    chan = ((ex.const(group), mg) if group > 1 else (w.shape[0],))
    cnames = ("g", "co") if group > 1 else ("co",)
    shape = (x.shape[0],) + chan + tuple(outs)
    out = b.reduce("sum", dtype, shape, (cig, *kernel), body, ("n",) + cnames + sp,
                   ("ci",) + tuple("k" + s for s in sp), hint if group == 1 else tmp_hint(n, "grouped"))
    if group == 1:
        return out
    # the usual [N, M, *S] layout, as a view onto [N, group, M/group, *S]
    return view(out, (x.shape[0], w.shape[0], *outs),
                lambda i: out.at([i[0], i[1] // mg, i[1] % mg] + list(i[2:])), ("n", "co") + sp)


def add_bias(b, v: Value, bias: Value | None) -> Value:
    """v + bias[c] along axis 1."""
    if bias is None:
        return v
    return b.map(v.dtype, v.shape, lambda i: v.at(i) + ex.cast(bias.at([i[1]]), v.dtype), v.names)


@op("Conv")
def conv_op(b, n):
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    if bias is None:
        return [conv(b, n, x, w, x.dtype)]
    return [add_bias(b, conv(b, n, x, w, x.dtype, tmp_hint(n, "conv")), bias)]


def _shift(b, v: Value, zp: Value | None, axis: int) -> Value:
    """cast<i32>(v) - zero_point, the zero point a scalar or per index of ``axis``."""
    hint = tmp_hint(b.node, "shifted")
    if zp is None:
        return b.map("i32", v.shape, lambda i: ex.cast(v.at(i), "i32"), v.names, hint)
    scalar = zp.rank == 0 or (zp.static_shape() or (0,)) == (1,)

    def f(i):
        z = zp.at([ex.const(0)] * zp.rank if scalar else [i[axis]])
        return ex.cast(v.at(i), "i32") - ex.cast(z, "i32")

    return b.map("i32", v.shape, f, v.names, hint)


@op("ConvInteger")
def conv_integer(b, n):
    # shift by the zero points first, so padding with 0 means padding with the zero point
    x = _shift(b, n.inputs[0], n.input(2), 1)
    w = _shift(b, n.inputs[1], n.input(3), 0)
    return [conv(b, n, x, w, "i32")]


# ---------------------------------------------------------------- ConvTranspose


def _transpose_geometry(n, in_sizes, kernel, strides, dilations):
    """Output sizes and begin pads of ConvTranspose (output_shape, output_padding, auto_pad)."""
    k = len(kernel)
    out_pad = _const_ints(n, "output_padding", k, 0)
    auto_pad = n.attr("auto_pad", "NOTSET") or "NOTSET"
    pads = n.attr("pads", None)
    out_shape = n.attr("output_shape", None)
    if out_shape is not None and len(out_shape) == k + 2:
        out_shape = out_shape[2:]
    full = [s * (i - 1) + op_ + (kk - 1) * d + 1
            for i, s, op_, kk, d in zip(in_sizes, strides, out_pad, kernel, dilations)]
    if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER") or (pads is None and out_shape):
        outs = ([ex.as_expr(o) for o in out_shape] if out_shape
                else [i * s for i, s in zip(in_sizes, strides)])
        begins = []
        for f, o in zip(full, outs):
            total = f - o
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    else:
        pads = pads or [0] * (2 * k)
        begins = [ex.const(int(p)) for p in pads[:k]]
        outs = [ex.as_expr(o) for o in out_shape] if out_shape else \
            [f - pads[i] - pads[i + k] for i, f in enumerate(full)]
    return [ex.simplify_size(o) for o in outs], [ex.simplify_size(p) for p in begins]


@op("ConvTranspose")
def conv_transpose(b, n):
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    k = x.rank - 2
    kernel = _kernel_shape(n, w)
    strides = _const_ints(n, "strides", k, 1)
    dilations = _const_ints(n, "dilations", k, 1)
    outs, begins = _transpose_geometry(n, x.shape[2:], kernel, strides, dilations)
    group = int(n.attr("group"))
    cig = ex.simplify_size(x.shape[1] // group) if group > 1 else x.shape[1]
    mg = w.shape[1]
    read_x = guarded(b, x, 0)
    sp = spatial_names(k)

    def source(o, kk, s, d, p):
        # out[o] gathers in[i] with i*s + kk*d - p == o; a non-multiple gives -1 (padding)
        t = o + p - kk * d
        if s == 1:
            return t
        return ex.select(ex.binary("eq", t % s, 0), t // s, ex.const(-1))

    def body(o, r):
        g, co = (o[1], o[2]) if group > 1 else (None, o[1])
        ci, kidx = r[0], r[1:]
        pos = [source(oi, ki, s, d, p) for oi, ki, s, d, p in zip(o[-k:], kidx, strides, dilations, begins)]
        cx = ci if g is None else g * cig + ci
        return read_x([o[0], cx] + pos) * w.at([cx, co] + kidx)

    chan = (ex.const(group), mg) if group > 1 else (mg,)
    cnames = ("g", "co") if group > 1 else ("co",)
    hint = tmp_hint(n, "convt") if group > 1 or bias is not None else None
    out = b.reduce("sum", x.dtype, (x.shape[0],) + chan + tuple(outs), (cig, *kernel), body,
                   ("n",) + cnames + sp, ("ci",) + tuple("k" + s for s in sp), hint)
    if group > 1:
        inner = out
        out = view(inner, (x.shape[0], mg * group, *outs),
                   lambda i: inner.at([i[0], i[1] // mg, i[1] % mg] + list(i[2:])), ("n", "co") + sp)
    return [add_bias(b, out, bias)]


# ---------------------------------------------------------------- CausalConvWithState


@op("CausalConvWithState")
def causal_conv_with_state(b, n):
    """Depthwise causal 1-D conv over [past_state, input]; the last k-1 positions are the new
    state. The concatenation is one small tensor, so the conv stays a product of reads."""
    x, w, bias, past = n.inputs[0], n.inputs[1], n.input(2), n.input(3)
    act = n.attr("activation", "none") or "none"
    if act not in ("none", "silu", "swish"):
        raise n.fail(f"activation={act!r} is not supported")
    if x.rank != 3 or w.rank != 3:
        raise n.shape_error("input and weight must be rank 3")
    k = _static(n, w.shape[2], "the kernel length")
    bsz, ch, length = x.shape
    names = ("n", "c", "t")
    read_x = guarded(b, x, 0)
    read_p = guarded(b, past, 0) if past is not None else None

    def concat(i):
        # guarded reads give 0 outside each part, so the sum is the concatenation
        v = read_x([i[0], i[1], i[2] - (k - 1)])
        return v if read_p is None else read_p(i) + v

    padded = b.map(x.dtype, (bsz, ch, length + (k - 1)), concat, names, tmp_hint(n, "padded"))
    conv = b.reduce("sum", x.dtype, (bsz, ch, length), (k,),
                    lambda o, r: padded.at([o[0], o[1], o[2] + r[0]]) * w.at([o[1], ex.const(0), r[0]]),
                    names, ("kt",), tmp_hint(n, "conv"))

    def finish(i):
        v = conv.at(i)
        if bias is not None:
            v = v + ex.cast(bias.at([i[1]]), x.dtype)
        if act == "none":
            return v
        f = ex.cast(v, "f32")  # the activation runs in f32, as the reference does for f16
        return ex.cast(f * ex.unary("sigmoid", f), x.dtype)

    out = b.map(x.dtype, (bsz, ch, length), finish, names)
    state = view(padded, (bsz, ch, ex.const(k - 1)),
                 lambda i: padded.at([i[0], i[1], i[2] + length]), names)
    return [out, state]


# ---------------------------------------------------------------- DeformConv


@op("DeformConv")
def deform_conv(b, n):
    """Conv whose taps sit at learned fractional offsets: the taps are sampled bilinearly
    (zero outside) into a column tensor cols[n, ci, k..., o...], then contracted with w."""
    x, w, offset, bias, mask = (n.inputs[0], n.inputs[1], n.inputs[2], n.input(3), n.input(4))
    k = x.rank - 2
    kernel = _kernel_shape(n, w)
    _, begins, _, strides, dilations, _ = window(n, x.shape[2:], kernel)
    group, ogroups = int(n.attr("group")), int(n.attr("offset_group"))
    outs = list(offset.shape[2:])
    cig_off = ex.simplify_size(x.shape[1] // ogroups)
    read_x = guarded(b, x, 0)
    sp = spatial_names(k)
    kn = tuple("k" + s for s in sp)
    dtype = x.dtype

    def sample(i):
        nn, ci, kidx, o = i[0], i[1], i[2:2 + k], i[2 + k:]
        og = ci // cig_off
        kflat = og
        for kk, size in zip(kidx, kernel):
            kflat = kflat * size + kk
        pos, floors = [], []
        for d in range(k):
            base = o[d] * strides[d] - begins[d] + kidx[d] * dilations[d]
            p = ex.cast(base, dtype) + offset.at([nn, kflat * k + d] + list(o))
            pos.append(p)
            floors.append(ex.unary("floor", p))
        total = None
        for corner in range(1 << k):
            bits = [(corner >> (k - 1 - d)) & 1 for d in range(k)]
            idx = [ex.cast(f, "i64") + c for f, c in zip(floors, bits)]
            term = read_x([nn, ci] + idx)
            for p, f, c in zip(pos, floors, bits):
                term = term * (ex.const(1.0, dtype) - ex.unary("abs", p - (f + ex.const(float(c), dtype))))
            total = term if total is None else total + term
        if mask is not None:
            total = total * mask.at([nn, kflat] + list(o))
        return total

    cols = b.map(dtype, (x.shape[0], x.shape[1], *kernel, *outs), sample, ("n", "ci") + kn + sp,
                 tmp_hint(n, "cols"))
    cig = w.shape[1]
    mg = ex.simplify_size(w.shape[0] // group) if group > 1 else w.shape[0]

    def body(o, r):
        g, co = (o[1], o[2]) if group > 1 else (None, o[1])
        ci = r[0] if g is None else g * cig + r[0]
        cw = co if g is None else g * mg + co
        return cols.at([o[0], ci] + list(r[1:]) + list(o[-k:])) * w.at([cw, r[0]] + list(r[1:]))

    chan = (ex.const(group), mg) if group > 1 else (w.shape[0],)
    cnames = ("g", "co") if group > 1 else ("co",)
    out = b.reduce("sum", dtype, (x.shape[0],) + chan + tuple(outs), (cig, *kernel), body,
                   ("n",) + cnames + sp, ("ci",) + kn,
                   None if group == 1 and bias is None else tmp_hint(n, "conv"))
    if group > 1:
        inner = out
        out = view(inner, (x.shape[0], w.shape[0], *outs),
                   lambda i: inner.at([i[0], i[1] // mg, i[1] % mg] + list(i[2:])), ("n", "co") + sp)
    return [add_bias(b, out, bias)]
