"""Normalizations: LayerNormalization, RMSNormalization, BatchNormalization,
InstanceNormalization, GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN.

Each is a few comprehensions: keepdims statistics (the mean, then the mean of (x - mean)^2: the
two-pass form, which does not cancel catastrophically as E[x^2] - E[x]^2 does), a small map for
1/sqrt(var + eps), and one elementwise map that reads x, the statistics and the affine
parameters. Statistics are computed in the stash type (at least f32), so f16 models keep
their accuracy.
"""

from __future__ import annotations

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.ops.reduce import (bcast_reduced, count, norm_axis, reduce_indexed,
                                            reduce_over, tmp)


def _c(v, dtype):
    return ex.const(v, dtype)


def _stash(n, x) -> str:
    """The dtype statistics are computed in: the stash type, or x's type when wider."""
    from mlpack.codegen.onnx.importer import onnx_dtype
    stash = onnx_dtype(n.attr("stash_type", 1), f"{n!r} attribute 'stash_type'")
    if not dt.is_float(x.dtype) or dt.bits(x.dtype) >= dt.bits(stash):
        return x.dtype
    return stash


def _out_hint(b, n, i: int, what: str) -> str:
    """Name a statistic after the node output it is returned as, if the node has one."""
    names = n.output_names
    return names[i] if i < len(names) and names[i] else tmp(b, what)


def _inv_count(n, dtype):
    """1/n as a scalar of ``dtype`` (folded when the count is static)."""
    if n.is_const and n.value:
        return _c(1 / n.value, dtype)
    return ex.binary("div", _c(1, dtype), ex.cast(n, dtype))


def _mean(b, x, axes, dtype, hint, fn=None):
    """The mean over ``axes`` (keepdims) of fn(full index), default x itself, in ``dtype``."""
    fn = fn or (lambda i: ex.cast(x.at(i), dtype))
    inv_n = _inv_count(count(x, axes), dtype)
    return reduce_indexed(b, "sum", x, axes, True, lambda i: fn(i) * inv_n, hint, dtype)


def _rsqrt(b, v, eps, dtype, hint):
    return b.map(dtype, v.shape, lambda i: ex.unary("recip", ex.unary(
        "sqrt", v.at(i) + _c(eps, dtype))), v.names, hint=hint)


def _moments(b, x, axes, dtype, eps, mean_hint, inv_hint):
    """Keepdims mean and 1/sqrt(var + eps) of x over ``axes``."""
    mean = _mean(b, x, axes, dtype, mean_hint)
    m = bcast_reduced(mean, axes)
    var = _mean(b, x, axes, dtype, tmp(b, "var"), lambda i: _sq(ex.cast(x.at(i), dtype) - m(i)))
    return mean, _rsqrt(b, var, eps, dtype, inv_hint)


def _sq(v):
    return v * v


def _normalize(b, x, dtype, mean_at, inv_at, scale_at=None, bias_at=None):
    """y = cast((x - mean) * inv) * scale + bias, elementwise over x."""
    def f(i):
        v = ex.cast(x.at(i), dtype)
        if mean_at is not None:
            v = v - mean_at(i)
        v = ex.cast(v * inv_at(i), x.dtype)
        if scale_at is not None:
            v = v * ex.cast(scale_at(i), x.dtype)
        if bias_at is not None:
            v = v + ex.cast(bias_at(i), x.dtype)
        return v

    return b.map(x.dtype, x.shape, f, x.names)


def _channel(v):
    """Read a per-channel [C] parameter at a full NC... index (None when absent)."""
    return None if v is None else (lambda i: v.at([i[1]]))


def _trailing(b, v):
    """Read a parameter broadcast against the trailing axes (None when absent)."""
    return None if v is None else (lambda i: b.bcast(v, i))


# ---------------------------------------------------------------- per-row normalizations


@op("LayerNormalization")
def layer_norm(b, n):
    x, scale, bias = n.inputs[0], n.input(1), n.input(2)
    axes = list(range(norm_axis(n, n.attr("axis"), x.rank), x.rank))
    dtype = _stash(n, x)
    mean, inv = _moments(b, x, axes, dtype, n.attr("epsilon"),
                         _out_hint(b, n, 1, "mean"), _out_hint(b, n, 2, "inv"))
    y = _normalize(b, x, dtype, bcast_reduced(mean, axes), bcast_reduced(inv, axes),
                   _trailing(b, scale), _trailing(b, bias))
    return [y, mean, inv]


@op("RMSNormalization")
def rms_norm(b, n):
    x, scale = n.inputs[0], n.input(1)
    axes = list(range(norm_axis(n, n.attr("axis"), x.rank), x.rank))
    dtype = _stash(n, x)
    ms = _mean(b, x, axes, dtype, tmp(b, "ms"), lambda i: _sq(ex.cast(x.at(i), dtype)))
    inv = _rsqrt(b, ms, n.attr("epsilon"), dtype, tmp(b, "inv"))
    return [_normalize(b, x, dtype, None, bcast_reduced(inv, axes), _trailing(b, scale))]


@op("InstanceNormalization")
def instance_norm(b, n):
    x, scale, bias = n.inputs[0], n.input(1), n.input(2)
    axes = list(range(2, x.rank))
    dtype = _stash(n, x)
    mean, inv = _moments(b, x, axes, dtype, n.attr("epsilon"), tmp(b, "mean"), tmp(b, "inv"))
    return [_normalize(b, x, dtype, bcast_reduced(mean, axes), bcast_reduced(inv, axes),
                       _channel(scale), _channel(bias))]


@op("MeanVarianceNormalization")
def mean_variance_norm(b, n):
    x = n.inputs[0]
    axes = sorted({norm_axis(n, a, x.rank) for a in n.attr("axes", [0, 2, 3])})
    dtype = _stash(n, x)
    mean = _mean(b, x, axes, dtype, tmp(b, "mean"))
    m = bcast_reduced(mean, axes)
    var = _mean(b, x, axes, dtype, tmp(b, "var"), lambda i: _sq(ex.cast(x.at(i), dtype) - m(i)))
    # the ONNX definition: (x - mean) / (sqrt(var) + 1e-9), not 1/sqrt(var + eps)
    inv = b.map(dtype, var.shape, lambda i: ex.unary("recip", ex.unary("sqrt", var.at(i))
                                                     + _c(1e-9, dtype)), var.names, hint=tmp(b, "inv"))
    return [_normalize(b, x, dtype, m, bcast_reduced(inv, axes))]


# ---------------------------------------------------------------- BatchNormalization


@op("BatchNormalization")
def batch_norm(b, n):
    x, scale, bias, mean_in, var_in = n.inputs[:5]
    if x.rank < 2:
        raise n.fail("an input of rank < 2 (no channel axis)")
    if n.opset < 9 and n.attr("spatial", 1) == 0:
        raise n.fail("spatial=0 (per-activation statistics)")
    training = n.opset >= 14 and n.attr("training_mode")
    if not training and len([o for o in n.output_names if o]) > 1:
        raise n.fail("training outputs (mean/var) without training_mode")
    dtype, eps = _stash(n, x), n.attr("epsilon")
    if not training:
        inv = _rsqrt(b, _cast(b, var_in, dtype), eps, dtype, tmp(b, "inv"))
        return [_normalize(b, x, dtype, lambda i: ex.cast(mean_in.at([i[1]]), dtype),
                           _channel(inv), _channel(scale), _channel(bias))]
    axes = [a for a in range(x.rank) if a != 1]
    mean = _mean(b, x, axes, dtype, tmp(b, "mean"))
    m = bcast_reduced(mean, axes)
    var = _mean(b, x, axes, dtype, tmp(b, "var"), lambda i: _sq(ex.cast(x.at(i), dtype) - m(i)))
    inv = _rsqrt(b, var, eps, dtype, tmp(b, "inv"))
    y = _normalize(b, x, dtype, m, bcast_reduced(inv, axes), _channel(scale), _channel(bias))
    mom = n.attr("momentum")
    return [y, _running(b, mean_in, mean, mom, x.rank), _running(b, var_in, var, mom, x.rank)]


def _cast(b, v, dtype):
    return v if v.dtype == dtype else b.map(dtype, v.shape, lambda i: ex.cast(v.at(i), dtype),
                                            v.names, hint=tmp(b, "cast"))


def _running(b, old, batch, momentum, rank):
    """old * momentum + batch * (1 - momentum), per channel, in old's dtype."""
    def f(i):
        cur = ex.cast(batch.at([ex.const(0)] + i + [ex.const(0)] * (rank - 2)), old.dtype)
        return old.at(i) * _c(momentum, old.dtype) + cur * _c(1 - momentum, old.dtype)

    return b.map(old.dtype, old.shape, f, old.names)


# ---------------------------------------------------------------- GroupNormalization


@op("GroupNormalization")
def group_norm(b, n):
    x, scale, bias = n.inputs[0], n.input(1), n.input(2)
    groups, dtype, eps = n.attr("num_groups"), _stash(n, x), n.attr("epsilon")
    chans = x.shape[1]
    if chans.is_const and chans.value % groups:
        raise n.shape_error(f"{chans.value} channels do not split into {groups} groups")
    cpg = ex.floordiv(chans, groups)
    rshape = [cpg, *x.shape[2:]]
    inv_n = _inv_count(ex.product(rshape), dtype)

    def xs(o, r):  # x at batch o[0], group o[1], channel r[0] of the group, position r[1:]
        return ex.cast(x.at([o[0], o[1] * cpg + r[0], *r[1:]]), dtype)

    def stat(fn, what):
        return b.reduce("sum", dtype, [x.shape[0], ex.const(groups)], rshape,
                        lambda o, r: fn(o, r) * inv_n, [x.names[0], "group"], [], tmp(b, what))

    mean = stat(xs, "mean")
    var = stat(lambda o, r: _sq(xs(o, r) - mean.at(o)), "var")
    inv = _rsqrt(b, var, eps, dtype, tmp(b, "inv"))
    group = lambda i: [i[0], ex.floordiv(i[1], cpg)]  # noqa: E731
    return [_normalize(b, x, dtype, lambda i: mean.at(group(i)), lambda i: inv.at(group(i)),
                       _group_param(scale, chans, cpg), _group_param(bias, chans, cpg))]


def _group_param(v, chans, cpg):
    """Scale/bias are per channel (opset 21) or per group (opset 18)."""
    if v is None:
        return None
    if ex.same_size(v.shape[0], chans):
        return lambda i: v.at([i[1]])
    return lambda i: v.at([ex.floordiv(i[1], cpg)])


# ---------------------------------------------------------------- Lp, LRN


@op("LpNormalization")
def lp_norm(b, n):
    x = n.inputs[0]
    axis, p = norm_axis(n, n.attr("axis"), x.rank), n.attr("p")
    if p not in (1, 2):
        raise n.fail(f"p={p} (ONNX defines 1 and 2)")
    pre = (lambda v: ex.unary("abs", v)) if p == 1 else (lambda v: v * v)
    s = reduce_over(b, "sum", x, [axis], True, pre, hint=tmp(b, "norm"))
    norm = bcast_reduced(s, [axis]) if p == 1 else (
        lambda i: ex.unary("sqrt", bcast_reduced(s, [axis])(i)))
    zero = _c(0, x.dtype)
    # a zero norm gives 0, not 0/0 (as the ONNX reference does)
    return [b.map(x.dtype, x.shape, lambda i: ex.select(
        ex.binary("eq", norm(i), zero), zero, ex.binary("div", x.at(i), norm(i))), x.names)]


@op("LRN")
def lrn(b, n):
    x = b.materialize(n.inputs[0])
    size = n.attr("size")
    alpha, beta, bias = n.attr("alpha"), n.attr("beta"), n.attr("bias")
    lo = (size - 1) // 2
    dtype = x.dtype

    def sq(o, r):  # channels c - lo .. c - lo + size - 1; out of range reads 0
        idx = list(o)
        idx[1] = o[1] - lo + r[0]
        v = ex.read(x.tensor, dict(zip(x.names, idx)), dtype, pad=0)
        return v * v

    s = b.reduce("sum", dtype, x.shape, [ex.const(size)], sq, x.names, ["r_win"], tmp(b, "sq"))
    k, a = _c(bias, dtype), _c(alpha / size, dtype)
    return [b.map(dtype, x.shape, lambda i: ex.binary("div", x.at(i), ex.binary(
        "pow", k + a * s.at(i), _c(beta, dtype))), x.names)]
