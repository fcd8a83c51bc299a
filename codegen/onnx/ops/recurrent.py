"""Recurrent ops: RNN, GRU and LSTM (forward, reverse, bidirectional; layout 0 and 1).

The sequence length must be static: the recurrence is unrolled at import time into a few
comprehensions per time step, so the IR stays free of loops and every step is an ordinary
matrix product plus an elementwise gate map that later passes fuse and schedule like any other.
Per direction:

* ``XW[t, b, g] = sum_k X[t, b, k] * W[g, k]`` for all steps at once (one batched product);
* per step ``HR[b, g] = sum_k H[b, k] * R[g, k]`` and one map computing the new state from
  ``XW``, ``HR`` and the biases (GRU without ``linear_before_reset`` needs one more product of
  ``r * H``; LSTM one more map, for the cell state).

A loop (Procedure) would also handle symbolic lengths, but it hides the products from the
optimizer and is scalar code in the reference interpreter; the unrolled form is what a model
with a fixed sequence length wants. ``sequence_lens`` follows onnxruntime: a batch entry stops
updating after its length, its outputs there are zero, and the reverse direction starts at its
own last element.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op

# Activations taking alpha/beta, and their ONNX defaults.
_PARAMS = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}
_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activation(n, name: str, alpha, beta, f: str):
    """The activation ``name`` as a function on expressions of dtype ``f``."""
    c = lambda v: ex.const(v, f)  # noqa: E731
    key = name.lower()
    table = {
        "relu": lambda x: ex.maximum(x, c(0.0)),
        "tanh": lambda x: ex.unary("tanh", x),
        "sigmoid": lambda x: ex.unary("sigmoid", x),
        "affine": lambda x: c(alpha) * x + c(beta),
        "leakyrelu": lambda x: ex.select(ex.binary("ge", x, c(0.0)), x, c(alpha) * x),
        "thresholdedrelu": lambda x: ex.select(ex.binary("gt", x, c(alpha)), x, c(0.0)),
        "scaledtanh": lambda x: c(alpha) * ex.unary("tanh", c(beta) * x),
        "hardsigmoid": lambda x: ex.maximum(c(0.0), ex.minimum(c(1.0), c(alpha) * x + c(beta))),
        "elu": lambda x: ex.select(ex.binary("ge", x, c(0.0)), x,
                                   c(alpha) * (ex.unary("exp", x) - c(1.0))),
        "softsign": lambda x: ex.binary("div", x, c(1.0) + ex.unary("abs", x)),
        "softplus": lambda x: ex.unary("log", c(1.0) + ex.unary("exp", x)),
    }
    if key not in table:
        raise n.fail(f"activation {name!r} is not supported")
    return table[key]


def _activations(n, ndir: int, f: str) -> list[list]:
    """Per direction, the activation functions (f, g[, h]) with their alpha/beta."""
    per = len(_DEFAULTS[n.op_type])
    names = n.attr("activations", None) or _DEFAULTS[n.op_type] * ndir
    if len(names) == per and ndir == 2:
        names = names * 2
    if len(names) != per * ndir:
        raise n.fail(f"expected {per * ndir} activations, got {len(names)}")
    alphas = list(n.attr("activation_alpha", None) or [])
    betas = list(n.attr("activation_beta", None) or [])
    fns = []
    for name in names:  # alpha and beta are consumed in order by the functions that take them
        da, db = _PARAMS.get(name.lower(), (None, None))
        a = alphas.pop(0) if da is not None and alphas else da
        bb = betas.pop(0) if db is not None and betas else db
        fns.append(_activation(n, name, a, bb, f))
    return [fns[d * per:(d + 1) * per] for d in range(ndir)]


class _Cell:
    """What one direction of one recurrent node needs while it is unrolled."""

    def __init__(self, b, n, d: int, reverse: bool, acts):
        self.b, self.n, self.d, self.reverse, self.acts = b, n, d, reverse, acts
        x, w = n.input(0), n.input(1)
        self.layout = n.attr("layout", 0)
        self.f = x.dtype
        self.T = x.shape[1 if self.layout else 0]
        self.B = x.shape[0 if self.layout else 1]
        self.H = ex.const(n.attr("hidden_size", None) or w.shape[1].value // _GATES[n.op_type])
        self.gates = _GATES[n.op_type]
        self.R, self.Bias, self.lens = n.input(2), n.input(3), n.input(4)
        self.clip = n.attr("clip", None)
        xat = (lambda t, bb, k: x.at([bb, t, k])) if self.layout else (lambda t, bb, k: x.at([t, bb, k]))
        # all steps' input products at once
        self.xw = b.reduce("sum", self.f, (self.T, self.B, w.shape[1]), (x.shape[2],),
                           lambda o, r: xat(o[0], o[1], r[0]) * w.at([ex.const(d), o[2], r[0]]),
                           ("t", "b", "g"), ("k",), hint=f"{n.op_type.lower()}_xw{d}")

    def initial(self, i: int):
        """Initial state input ``i`` (h or c) as a read function, or None for zeros."""
        v = self.n.input(i)
        if v is None:
            return None
        d = ex.const(self.d)
        return (lambda bb, j: v.at([bb, d, j])) if self.layout else (lambda bb, j: v.at([d, bb, j]))

    def when(self, s: int, bb):
        """(time index, valid) of step ``s`` for batch entry ``bb``."""
        if self.lens is None:
            t = ex.const(self.T.value - 1 - s if self.reverse else s)
            return t, None
        length = ex.cast(self.lens.at([bb]), "i64")
        t = ex.maximum(length - (s + 1), ex.const(0)) if self.reverse else ex.const(s)
        return t, ex.binary("lt", ex.const(s), length)

    def product(self, h, rows0: int, nrows, s: int, tag: str = "hr"):
        """``sum_k h[b, k] * R[rows0 + g, k]`` (h a read function), a (B, nrows) tensor."""
        d = ex.const(self.d)
        return self.b.reduce("sum", self.f, (self.B, nrows), (self.H,),
                             lambda o, r: h(o[0], r[0]) * self.R.at([d, o[1] + rows0, r[0]]),
                             ("b", "g"), ("k",), hint=f"{self.n.op_type.lower()}_{tag}{self.d}_{s}")

    def bias(self, row, which: int):
        """W bias (which=0) or R bias (which=1) at gate row ``row``; None when absent."""
        if self.Bias is None:
            return None
        off = ex.const(which * self.gates) * self.H
        return self.Bias.at([ex.const(self.d), off + row])

    def pre(self, gate: int, bb, j, t, hr, wbias=True, rbias=True):
        """A gate's pre-activation: x W^T + h R^T + biases (hr: the step's product or None)."""
        row = ex.const(gate) * self.H + j
        v = self.xw.at([t, bb, row])
        if hr is not None:
            v = v + hr.at([bb, row])
        for which, on in ((0, wbias), (1, rbias)):
            bias = self.bias(row, which) if on else None
            if bias is not None:
                v = v + bias
        return v

    def clipped(self, v):
        if self.clip is None:
            return v
        c = ex.const(float(self.clip), self.f)
        return ex.minimum(ex.maximum(v, ex.const(-float(self.clip), self.f)), c)

    def state(self, s: int, prev, value_fn, tag: str):
        """A (B, H) state tensor: ``value_fn(b, j, t)`` where step ``s`` is valid, else ``prev``."""
        def fn(idx):
            bb, j = idx
            t, valid = self.when(s, bb)
            v = value_fn(bb, j, t)
            if valid is not None:
                v = ex.select(valid, v, prev(bb, j) if prev else ex.const(0.0, self.f))
            return v
        return self.b.map(self.f, (self.B, self.H), fn, ("b", "h"),
                          hint=f"{self.n.op_type.lower()}_{tag}{self.d}_{s}")


def _reader(v):
    return lambda bb, j: v.at([bb, j])


def _rnn_step(cell, s, h):
    act = cell.acts[0]
    hr = cell.product(h, 0, cell.H, s) if h else None
    new = cell.state(s, h, lambda bb, j, t: act(cell.clipped(cell.pre(0, bb, j, t, hr))), "h")
    return _reader(new), None


def _gru_step(cell, s, h):
    f, g = cell.acts
    lbr = cell.n.attr("linear_before_reset", 0)
    zero = ex.const(0.0, cell.f)
    hr = cell.product(h, 0, cell.H * (3 if lbr else 2), s) if h else None
    hp = h or (lambda bb, j: zero)
    gate = lambda k, bb, j, t: f(cell.clipped(cell.pre(k, bb, j, t, hr)))  # noqa: E731
    if lbr:
        def cand(bb, j, t):
            rec = hr.at([bb, ex.const(2) * cell.H + j]) if hr is not None else zero
            rb = cell.bias(ex.const(2) * cell.H + j, 1)
            rec = rec + rb if rb is not None else rec
            return cell.pre(2, bb, j, t, None, rbias=False) + gate(1, bb, j, t) * rec
    else:
        hrh = None
        if h:  # (r * h) R_h^T: r depends on the step, so this is a product of its own
            rh = cell.b.map(cell.f, (cell.B, cell.H), lambda idx: gate(
                1, idx[0], idx[1], cell.when(s, idx[0])[0]) * h(idx[0], idx[1]), ("b", "h"),
                hint=f"gru_rh{cell.d}_{s}")
            hrh = cell.product(_reader(rh), ex.const(2) * cell.H, cell.H, s, "hrh")

        def cand(bb, j, t):
            v = cell.pre(2, bb, j, t, None)
            return v + hrh.at([bb, j]) if hrh is not None else v

    one = ex.const(1.0, cell.f)

    def new(bb, j, t):
        z = gate(0, bb, j, t)
        return (one - z) * g(cell.clipped(cand(bb, j, t))) + z * hp(bb, j)

    return _reader(cell.state(s, h, new, "h")), None


def _lstm_step(cell, s, h, c):
    f, g, hf = cell.acts
    p = cell.n.input(7)
    coupled = cell.n.attr("input_forget", 0)
    zero = ex.const(0.0, cell.f)
    one = ex.const(1.0, cell.f)
    hr = cell.product(h, 0, cell.H * 4, s) if h else None
    cp = c or (lambda bb, j: zero)

    def peep(k, bb, j, cell_value):
        if p is None:
            return zero
        return p.at([ex.const(cell.d), ex.const(k) * cell.H + j]) * cell_value

    def gate(k, pk, bb, j, t, cell_value):  # gates iofc; peepholes iof
        v = cell.pre(k, bb, j, t, hr)
        if pk is not None:
            v = v + peep(pk, bb, j, cell_value)
        return f(cell.clipped(v))

    def new_c(bb, j, t):
        ig = gate(0, 0, bb, j, t, cp(bb, j))
        fg = one - ig if coupled else gate(2, 2, bb, j, t, cp(bb, j))  # coupled as onnxruntime
        cand = g(cell.clipped(cell.pre(3, bb, j, t, hr)))
        return fg * cp(bb, j) + ig * cand

    cnew = _reader(cell.state(s, c, new_c, "c"))

    def new_h(bb, j, t):
        return gate(1, 1, bb, j, t, cnew(bb, j)) * hf(cnew(bb, j))

    return _reader(cell.state(s, h, new_h, "h")), cnew


def _direction(b, n, d, reverse, acts):
    """Unroll one direction: the per-step h read functions, the final h and final c."""
    cell = _Cell(b, n, d, reverse, acts)
    h, c = cell.initial(5), cell.initial(6) if n.op_type == "LSTM" else None
    hs = []
    for s in range(cell.T.value):
        if n.op_type == "RNN":
            h, c = _rnn_step(cell, s, h)
        elif n.op_type == "GRU":
            h, c = _gru_step(cell, s, h)
        else:
            h, c = _lstm_step(cell, s, h, c)
        hs.append(h)
    return cell, hs, h, c


@op("RNN", "GRU", "LSTM")
def recurrent(b, n):
    x = n.input(0)
    layout = n.attr("layout", 0)
    if not x.shape[1 if layout else 0].is_const:
        raise n.fail("the sequence length must be static (the recurrence is unrolled)")
    direction = n.attr("direction", "forward")
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if dirs is None:
        raise n.fail(f"direction {direction!r} is not supported")
    acts = _activations(n, len(dirs), x.dtype)
    runs = [_direction(b, n, d, rev, acts[d]) for d, rev in enumerate(dirs)]
    cell = runs[0][0]
    zero = ex.const(0.0, x.dtype)
    names = n.output_names + [""] * 3

    def per_dir(d_idx, fn):
        out = fn(len(runs) - 1)
        for d in reversed(range(len(runs) - 1)):
            out = ex.select(ex.binary("eq", d_idx, ex.const(d)), fn(d), out)
        return out

    def final(k):  # Y_h (k=2) or Y_c (k=3), [D, B, H] or with layout 1 [B, D, H]
        def fn(idx):
            d_idx, bb, j = (idx[1], idx[0], idx[2]) if layout else idx
            return per_dir(d_idx, lambda d: runs[d][k](bb, j))
        shape = (cell.B, len(runs), cell.H) if layout else (len(runs), cell.B, cell.H)
        return b.map(x.dtype, shape, fn, ("b", "dir", "h") if layout else ("dir", "b", "h"))

    def y(idx):
        t, d_idx, bb, j = (idx[1], idx[2], idx[0], idx[3]) if layout else idx

        def one(d):
            c = runs[d][0]
            out = zero
            for s in reversed(range(c.T.value)):
                ts, valid = c.when(s, bb)
                hit = ex.binary("eq", t, ts)
                hit = ex.binary("and", hit, valid) if valid is not None else hit
                out = ex.select(hit, runs[d][1][s](bb, j), out)
            return out
        return per_dir(d_idx, one)

    results = [None, None, None]
    if names[0]:
        shape = (cell.B, cell.T, len(runs), cell.H) if layout else (cell.T, len(runs), cell.B, cell.H)
        results[0] = b.map(x.dtype, shape, y, ("b", "t", "dir", "h") if layout else
                           ("t", "dir", "b", "h"))
    if names[1]:
        results[1] = final(2)
    if n.op_type == "LSTM" and names[2]:
        results[2] = final(3)
    return results[:3 if n.op_type == "LSTM" else 2]
