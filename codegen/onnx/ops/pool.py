"""Pooling: MaxPool (with Indices), AveragePool, LpPool, the Global* pools and MaxUnpool.

A pool is one reduction over the kernel offsets of a guarded read of the input at
``o*stride + k*dilation - pad`` (the window arithmetic is conv.window):

    out[n, c, h, w] = max{kh, kw} x[n, c, h*s+kh*d-p, w*s+kw*d-q]   (pad: -inf)

AveragePool divides a sum by the number of counted window positions, itself a small
comprehension over the output's spatial dims only, so padding and ceil_mode need no cases.
"""

from __future__ import annotations

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import For, Store, TensorType
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import Value, tensor_value
from mlpack.codegen.onnx.ops.conv import guarded, spatial_names, window
from mlpack.codegen.onnx.ops.linalg import tmp_hint


class _Window:
    """The geometry of a pool node on input ``x``."""

    def __init__(self, b, n, x: Value):
        if x.rank < 3:
            raise n.shape_error(f"pooling needs an input of rank 3 or more, not {x.rank}")
        self.k = x.rank - 2
        self.kernel = [int(v) for v in n.attr("kernel_shape")]
        if len(self.kernel) != self.k:
            raise n.shape_error(f"kernel_shape has {len(self.kernel)} values for {self.k} spatial dims")
        ceil_mode = bool(n.attr("ceil_mode", 0))
        (self.outs, self.begins, self.ends, self.strides, self.dilations,
         self.padded) = window(n, x.shape[2:], self.kernel, ceil_mode)
        self.x = x
        self.sp = spatial_names(self.k)
        self.shape = tuple(x.shape[:2]) + tuple(self.outs)
        self.names = ("n", "c") + self.sp
        self.rnames = tuple("k" + s for s in self.sp)

    def positions(self, o_spatial, kidx):
        return [o * s + kk * d - p for o, kk, s, d, p in
                zip(o_spatial, kidx, self.strides, self.dilations, self.begins)]

    def reader(self, b, pad):
        return guarded(b, self.x, pad) if self.padded else self.x.at

    def reduce(self, b, kind, dtype, fn, pad, hint=None):
        """out[n, c, o...] = kind over the window of fn(x at the window position)."""
        read = self.reader(b, pad)

        def body(o, r):
            return fn(read(o[:2] + self.positions(o[2:], r)))

        return b.reduce(kind, dtype, self.shape, self.kernel, body, self.names, self.rnames, hint)


@op("MaxPool")
def max_pool(b, n):
    x = n.inputs[0]
    win = _Window(b, n, x)
    want_indices = len(n.output_names) > 1 and n.output_names[1]
    y = win.reduce(b, "max", x.dtype, lambda v: v, dt.lowest(x.dtype))
    if not want_indices:
        return [y]
    return [y, _max_indices(b, n, win)]


def _max_indices(b, n, win: _Window) -> Value:
    """The flat index into x of each window's maximum (argmax needs one reduction dim, so the
    kernel offsets are flattened into one)."""
    x, kernel = win.x, win.kernel
    read = win.reader(b, dt.lowest(x.dtype))

    def offsets(r):
        out, rest = [], r
        for j in reversed(range(len(kernel))):
            out.append(rest % kernel[j])
            rest = rest // kernel[j]
        return out[::-1]

    def body(o, r):
        return read(o[:2] + win.positions(o[2:], offsets(r[0])))

    size = 1
    for kk in kernel:
        size *= kk
    arg = b.reduce("argmax", "i64", win.shape, (size,), body, win.names, ("kk",), tmp_hint(n, "arg"))
    col_major = int(n.attr("storage_order", 0)) == 1

    def flat(o):
        pos = win.positions(o[2:], offsets(arg.at(o)))
        sizes = list(x.shape[2:])
        if col_major:  # spatial dims in reverse order, as ONNX defines storage_order=1
            pos, sizes = pos[::-1], sizes[::-1]
        f = o[0] * x.shape[1] + o[1]
        for p, s in zip(pos, sizes):
            f = f * s + p
        return f

    return b.map("i64", win.shape, flat, win.names, hint=n.output_names[1])


def _window_count(b, n, win: _Window, include_pad: bool, dtype: str) -> Value:
    """How many window positions each output averages over (a spatial-only comprehension)."""
    sizes = list(win.x.shape[2:])

    def body(o, r):
        ok = None
        for p, size, lo_pad, hi_pad in zip(win.positions(o, r), sizes, win.begins, win.ends):
            lo, hi = (-lo_pad, size + hi_pad) if include_pad else (ex.const(0), size)
            c = ex.binary("and", ex.binary("ge", p, lo), ex.binary("lt", p, hi))
            ok = c if ok is None else ex.binary("and", ok, c)
        return ex.select(ok, ex.const(1.0, dtype), ex.const(0.0, dtype))

    return b.reduce("sum", dtype, win.outs, win.kernel, body, win.sp, win.rnames, tmp_hint(n, "count"))


@op("AveragePool")
def average_pool(b, n):
    x = n.inputs[0]
    win = _Window(b, n, x)
    dtype = x.dtype
    total = win.reduce(b, "sum", dtype, lambda v: v, 0, tmp_hint(n, "sum"))
    if not win.padded:
        size = 1
        for kk in win.kernel:
            size *= kk
        return [b.map(dtype, win.shape, lambda o: ex.binary("div", total.at(o), ex.const(size, dtype)),
                      win.names)]
    count = _window_count(b, n, win, bool(n.attr("count_include_pad", 0)), dtype)
    return [b.map(dtype, win.shape, lambda o: ex.binary("div", total.at(o), count.at(o[2:])), win.names)]


def _lp(b, n, win_reduce, dtype, p, shape, names):
    """(sum |x|^p)^(1/p), with p=1 and p=2 kept free of pow."""
    if p == 1:
        return win_reduce(lambda v: ex.unary("abs", v), None)
    if p == 2:
        s = win_reduce(lambda v: v * v, tmp_hint(n, "sumsq"))
        return b.map(dtype, shape, lambda o: ex.unary("sqrt", s.at(o)), names)
    s = win_reduce(lambda v: ex.binary("pow", ex.unary("abs", v), ex.const(float(p), dtype)),
                   tmp_hint(n, "sump"))
    return b.map(dtype, shape, lambda o: ex.binary("pow", s.at(o), ex.const(1.0 / p, dtype)), names)


@op("LpPool")
def lp_pool(b, n):
    x = n.inputs[0]
    win = _Window(b, n, x)
    p = n.attr("p")
    return [_lp(b, n, lambda fn, hint: win.reduce(b, "sum", x.dtype, fn, 0, hint), x.dtype, p,
                win.shape, win.names)]


# ---------------------------------------------------------------- global pools


def _global(b, n, kind, fn, hint=None):
    """kind over all spatial dims of fn(x); the result keeps them with size 1."""
    x = n.inputs[0]
    if x.rank < 3:
        raise n.shape_error(f"global pooling needs an input of rank 3 or more, not {x.rank}")
    k = x.rank - 2
    sp = spatial_names(k)
    shape = tuple(x.shape[:2]) + (1,) * k
    return b.reduce(kind, x.dtype, shape, x.shape[2:], lambda o, r: fn(x.at(o[:2] + r)),
                    ("n", "c") + sp, tuple("k" + s for s in sp), hint)


@op("GlobalMaxPool")
def global_max_pool(b, n):
    return [_global(b, n, "max", lambda v: v)]


@op("GlobalAveragePool")
def global_average_pool(b, n):
    x = n.inputs[0]
    s = _global(b, n, "sum", lambda v: v, tmp_hint(n, "sum"))
    count = ex.cast(ex.product(x.shape[2:]), x.dtype)
    return [b.map(x.dtype, s.shape, lambda o: ex.binary("div", s.at(o), count), s.names)]


@op("GlobalLpPool")
def global_lp_pool(b, n):
    x = n.inputs[0]
    shape = tuple(x.shape[:2]) + (1,) * (x.rank - 2)
    names = ("n", "c") + spatial_names(x.rank - 2)
    return [_lp(b, n, lambda fn, hint: _global(b, n, "sum", fn, hint), x.dtype, n.attr("p"),
                shape, names)]


# ---------------------------------------------------------------- MaxUnpool


@op("MaxUnpool")
def max_unpool(b, n):
    """Scatter x to the flat positions I names in a zero tensor: a procedure, since where each
    value lands is data."""
    x, ind, shape_in = n.inputs[0], n.inputs[1], n.input(2)
    kernel = [int(v) for v in n.attr("kernel_shape")]
    k = len(kernel)
    strides = n.attr("strides", None) or [1] * k
    pads = n.attr("pads", None) or [0] * (2 * k)
    # the indices are flat in the shape the pooling input had; output_shape may only add room
    inferred = list(x.shape[:2]) + [ex.simplify_size((size - 1) * s + kk - pads[i] - pads[i + k])
                                    for i, (size, s, kk) in enumerate(zip(x.shape[2:], strides, kernel))]
    full = b.ints(shape_in, "output_shape") if shape_in is not None else inferred
    names = ("n", "c") + spatial_names(x.rank - 2)
    name = b.fresh(n.output_names[0])
    ty = TensorType(x.dtype, dict(zip(names, full)))

    def loops(prefix, sizes, inner):
        vs = [ex.var(f"{prefix}{i}") for i in range(len(sizes))]
        body = inner(vs)
        for i in reversed(range(len(sizes))):
            body = [For(f"{prefix}{i}", sizes[i], body)]
        return body

    def scatter(vs):
        # decompose the flat index into the output's named dims, row-major
        flat = ex.cast(ind.at(vs), "i64")
        index, rest = {}, flat
        for d, size in reversed(list(zip(names, inferred))):
            index[d] = rest % size
            rest = rest // size
        return [Store(name, index, x.at(vs))]

    zero = loops("o", full, lambda vs: [Store(name, dict(zip(names, vs)), ex.const(0, x.dtype))])
    b.procedure({name: ty}, zero + loops("i", list(x.shape), scatter))
    return [tensor_value(name, x.dtype, list(zip(names, full)))]
