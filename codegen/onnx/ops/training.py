"""Optimizer steps from ``ai.onnx.preview.training``: Adagrad, Adam, Momentum (and Nesterov).

Each op takes a learning rate R and a step count T (run-time scalars), then n tensors to
optimize and their per-tensor state (X1..Xn, G1..Gn, then V.../H...), and returns the updated
tensors and states in the same grouping. Every update is elementwise, so each output is one
comprehension; step-dependent factors (Adam's bias correction, Momentum's first-step beta)
are scalar expressions of R and T, folded into the body with a select on T > 0.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op

_DOMAIN = "ai.onnx.preview.training"


def _scalar(v):
    """The single element of a scalar (or one-element) input, as an expression."""
    return v.at([ex.const(0)] * v.rank)


def _groups(n, per: int):
    """(R, T, [[X_i, G_i, ...state_i] for each i]) for ops with ``per`` tensors per group."""
    ins = list(n.inputs)
    if len(ins) < 2 or (len(ins) - 2) % per or any(v is None for v in ins):
        raise n.fail(f"expects R, T and {per} tensors per optimized input, got {len(ins)} inputs")
    k = (len(ins) - 2) // per
    return ins[0], ins[1], [[ins[2 + j * k + i] for j in range(per)] for i in range(k)]


def _c(v, dtype):
    return ex.const(float(v), dtype)


def _regularized(n, x, g):
    """norm_coefficient * x + g: the gradient with L2 regularization."""
    return _c(n.attr("norm_coefficient"), x.dtype) * x + ex.cast(g, x.dtype)


def _map(b, v, fn):
    """One comprehension over v's shape; fn gets the index."""
    return b.map(v.dtype, v.shape, fn, v.names)


@op("Adagrad", domain=_DOMAIN)
def adagrad(b, n):
    r, t, groups = _groups(n, 3)
    decay, eps = n.attr("decay_factor"), n.attr("epsilon")
    xs, hs = [], []
    for x, g, h in groups:
        ft = x.dtype
        rate = ex.binary("div", ex.cast(_scalar(r), ft),
                         _c(1, ft) + ex.cast(_scalar(t), ft) * _c(decay, ft))

        def greg(i, x=x, g=g):
            return _regularized(n, x.at(i), g.at(i))

        h_new = _map(b, h, lambda i, h=h, greg=greg, ft=ft: ex.cast(h.at(i), ft) + greg(i) * greg(i))

        def x_step(i, x=x, h_new=h_new, greg=greg, rate=rate, ft=ft):
            denom = ex.unary("sqrt", ex.cast(h_new.at(i), ft)) + _c(eps, ft)
            return x.at(i) - ex.binary("div", rate * greg(i), denom)

        xs.append(_map(b, x, x_step))
        hs.append(h_new)
    return xs + hs


@op("Adam", domain=_DOMAIN)
def adam(b, n):
    r, t, groups = _groups(n, 4)
    alpha, beta = n.attr("alpha"), n.attr("beta")
    eps, post = n.attr("epsilon"), n.attr("norm_coefficient_post")
    # bias correction r * sqrt(1 - beta^t) / (1 - alpha^t), in f64 as the reference computes
    # it; the first step (t == 0) uses r as is
    tf = ex.cast(_scalar(t), "f64")
    rf = ex.cast(_scalar(r), "f64")
    one = _c(1, "f64")
    corrected = rf * ex.binary("div", ex.unary("sqrt", one - ex.binary("pow", _c(beta, "f64"), tf)),
                               one - ex.binary("pow", _c(alpha, "f64"), tf))
    rate64 = ex.select(ex.binary("gt", _scalar(t), ex.const(0, t.dtype)), corrected, rf)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        ft = x.dtype

        def greg(i, x=x, g=g):
            return _regularized(n, x.at(i), g.at(i))

        v_new = _map(b, v, lambda i, v=v, greg=greg, ft=ft: _c(alpha, ft) * ex.cast(v.at(i), ft)
                     + _c(1 - alpha, ft) * greg(i))
        h_new = _map(b, h, lambda i, h=h, greg=greg, ft=ft: _c(beta, ft) * ex.cast(h.at(i), ft)
                     + _c(1 - beta, ft) * (greg(i) * greg(i)))

        def x_step(i, x=x, v_new=v_new, h_new=h_new, ft=ft):
            denom = ex.unary("sqrt", ex.cast(h_new.at(i), ft)) + _c(eps, ft)
            moved = x.at(i) - ex.cast(rate64, ft) * ex.binary("div", ex.cast(v_new.at(i), ft), denom)
            return _c(1 - post, ft) * moved

        xs.append(_map(b, x, x_step))
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


@op("Momentum", domain=_DOMAIN)
def momentum(b, n):
    r, t, groups = _groups(n, 3)
    alpha, beta, mode = n.attr("alpha"), n.attr("beta"), n.attr("mode")
    if mode not in ("standard", "nesterov"):
        raise n.fail(f"mode {mode!r} is not supported")
    first = ex.binary("gt", _scalar(t), ex.const(0, t.dtype))
    xs, vs = [], []
    for x, g, v in groups:
        ft = x.dtype
        rate = ex.cast(_scalar(r), ft)
        beta_t = ex.select(first, _c(beta, ft), _c(1, ft))  # the first step takes the full gradient

        def greg(i, x=x, g=g):
            return _regularized(n, x.at(i), g.at(i))

        v_new = _map(b, v, lambda i, v=v, greg=greg, ft=ft, beta_t=beta_t:
                     _c(alpha, ft) * ex.cast(v.at(i), ft) + beta_t * greg(i))

        def x_step(i, x=x, v_new=v_new, greg=greg, ft=ft, rate=rate):
            vn = ex.cast(v_new.at(i), ft)
            if mode == "standard":
                return x.at(i) - rate * vn
            return x.at(i) - rate * (greg(i) + _c(alpha, ft) * vn)

        xs.append(_map(b, x, x_step))
        vs.append(v_new)
    return xs + vs
