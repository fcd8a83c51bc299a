"""Fold a constant per-channel affine epilogue into a contraction's constant weights.

    %c[n, co, h, w] = sum{...} %x[...] * %W[co, ci, kh, kw]
    %y[n, co, h, w] = (%c[..] + %B[co] - %mean[co]) * %inv[co] * %s[co] + %t[co]
      ->
    %c[n, co, h, w] = sum{...} %x[...] * %W'[co, ci, kh, kw]      W' = W * (inv * s)
    %y[n, co, h, w] = %c[..] + %t'[co]                              t' = (B - mean) * inv * s + t

BatchNormalization (or any Mul/Add by constants) after a Conv or MatMul is, at inference, an
affine map ``y = a*c + b`` of the contraction's result with ``a`` and ``b`` made of constants.
Scaling the weights by ``a`` at build time removes the multiply and folds the bias and shift
into one constant. The epilogue must read the contraction once (nothing else reads it, and it
is not a graph output) at a plain renaming of its dims, the contraction must be a ``sum`` whose
body multiplies exactly one constant factor by the rest, and ``a`` may only vary along dims that
factor is read at directly. New constants are computed with the reference interpreter, so
they mean exactly what the expressions they replace meant (rounded once, in float32).
"""

from __future__ import annotations

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr, substitute, walk
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, TensorType
from mlpack.codegen.passes.sums import fresh, read_counts

_ZERO = None  # marks "no term" in an (a, b) pair


def _is_one(size: Expr) -> bool:
    return size.is_const and size.value == 1


def _is_const_expr(e: Expr, g: Graph) -> bool:
    return all(n.arg[0] in g.constants for n in walk(e) if n.op == "read")


def _split(e: Expr, target: str, g: Graph):
    """``e`` as (a, b) with ``e == a * read + b`` for the one read of ``target``; a or b None
    when zero. None if ``e`` is not affine in that read with constant a and b."""
    if e.op == "read" and e.arg[0] == target:
        return (ex.const(1.0, e.dtype), _ZERO)
    if not any(n.op == "read" and n.arg[0] == target for n in walk(e)):
        return (_ZERO, e) if _is_const_expr(e, g) else None
    if e.op in ("add", "sub"):
        l, r = _split(e.args[0], target, g), _split(e.args[1], target, g)
        if l is None or r is None:
            return None
        f = ex.add if e.op == "add" else ex.sub
        return tuple(_comb(f, x, y, e.op) for x, y in zip(l, r))
    if e.op == "neg":
        s = _split(e.args[0], target, g)
        return None if s is None else tuple(x if x is None else ex.unary("neg", x) for x in s)
    if e.op in ("mul", "div"):
        l, r = _split(e.args[0], target, g), _split(e.args[1], target, g)
        if l is None or r is None:
            return None
        if e.op == "mul" and l[0] is None:  # constant * (a*read + b)
            l, r = r, l
        if r[0] is not None:  # read * read, or dividing by the read
            return None
        k = r[1]
        if k is None:
            return None
        f = ex.mul if e.op == "mul" else (lambda x, y: ex.binary("div", x, y))
        return tuple(x if x is None else f(x, k) for x in l)
    return None


def _comb(f, x, y, op):
    if y is None:
        return x
    if x is None:
        return y if op == "add" else ex.unary("neg", y)
    return f(x, y)


def _factors(e: Expr) -> list[Expr]:
    return _factors(e.args[0]) + _factors(e.args[1]) if e.op == "mul" else [e]


def _evaluate(g: Graph, name: str, dims: dict, layout, body: Expr):
    """A new constant ``name[dims] = body`` (body over dims, reading g's constants)."""
    import numpy as np

    from mlpack.spec.ir.interp import run_graph
    dtype = body.dtype
    used = {n.arg[0] for n in walk(body) if n.op == "read"}
    tmp = Graph("fold", constants={n: g.constants[n] for n in used},
                types={n: g.constants[n].type for n in used})
    op = Comprehension(name, TensorType(dtype, dims), body)
    tmp.add_op(op)
    from mlpack.spec.ir.graph import Port
    tmp.outputs = [Port(name, tuple(layout))]
    data = np.ascontiguousarray(run_graph(tmp, {})[name])
    return Constant(name, TensorType(dtype, dict(dims)), tuple(layout), data)


def fold_scales(g: Graph, wider: bool = False) -> Graph:
    """``g`` with each affine epilogue folded (in place). ``wider``: also where the epilogue
    reads the contraction's size-1 dims at 0 (a batch of one) or reads other tensors beside it
    (a residual add), as the int8 precision asks (its requantizing epilogues cost more per
    element); the graph pipeline keeps the narrower rule, so fp32 kernels stay as they are."""
    counts, pinned = read_counts(g)
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    for op in list(g.ops):
        if not isinstance(op, Comprehension) or op.reduce is not None or not dt.is_float(op.type.dtype):
            continue
        targets = [n for n in walk(op.body) if n.op == "read" and n.arg[0] in producers]
        if len(targets) != 1 and not wider:
            continue
        for at in targets:
            src = producers[at.arg[0]]
            if (src.reduce != "sum" or src.out in pinned or counts[src.out] != 1
                    or at.arg[2] is not None or src.type.dtype != op.type.dtype):
                continue
            back = _renaming(op, src, at, wider)
            if back is not None and _fold(g, op, src, at, back):
                counts, pinned = read_counts(g)
    return g


def _renaming(op: Comprehension, src: Comprehension, at: Expr, wider: bool) -> dict | None:
    """{epilogue var: contraction dim} when the read ``at`` renames every dim (``wider``: a
    size-1 dim read at 0 aside), else None."""
    back = {}
    for d, ix in zip(at.arg[1], at.args):
        if wider and ix.is_const and ix.value == 0 and _is_one(src.type.dims[d]):
            continue   # a batch of one, read at its only index
        if ix.op != "var" or ix.arg in back or not ex.same_size(op.type.dims[ix.arg], src.type.dims[d]):
            return None
        back[ix.arg] = d
    want = sum(not _is_one(s) for s in op.type.dims.values()) if wider else len(op.type.dims)
    return back if len(back) == want else None


def _affine_part(e: Expr, target: str, g: Graph):
    """The largest subexpression of ``e`` affine in the read of ``target`` (the BatchNorm
    inside a ``max(.., 0)`` ReLU) and its (a, b), or None."""
    split = _split(e, target, g)
    if split is not None:
        return e, split
    for x in e.args:
        if any(n.op == "read" and n.arg[0] == target for n in walk(x)):
            return _affine_part(x, target, g)
    return None


def _fold(g: Graph, op: Comprehension, src: Comprehension, at: Expr, back: dict) -> bool:
    found = _affine_part(op.body, src.out, g)
    if found is None or found[1][0] is None:
        return False
    part, (a, b) = found
    if a == ex.const(1.0, a.dtype):  # no multiply to remove (a bias alone stays as it is)
        return False
    if not all(s.is_const for s in op.type.dims.values()):
        return False
    # a over the contraction's dims
    a_src = substitute(a, {v: ex.var(d) for v, d in back.items()})
    need = ex.free_vars(a_src)
    weights = [f for f in _factors(src.body) if f.op == "read" and f.arg[0] in g.constants
               and f.arg[2] is None]
    cands = []
    for w in weights:
        plain = {ix.arg: d for d, ix in zip(w.arg[1], w.args) if ix.op == "var"}
        if need <= set(plain) and sum(1 for f in _factors(src.body) if f is w or f == w) == 1:
            cands.append((w, plain))
    if len(cands) != 1 or not dt.is_float(cands[0][0].dtype):
        return False
    w, plain = cands[0]
    wc = g.constants[w.arg[0]]
    # W'[wdims] = W[wdims] * a(co := wdim)
    wbody = ex.mul(ex.read(wc.name, {d: ex.var(d) for d in wc.layout}, wc.type.dtype),
                   substitute(a_src, {v: ex.var(plain[v]) for v in need}))
    if wbody.dtype != wc.type.dtype:
        return False
    taken = set(g.types)
    new_w = _evaluate(g, fresh(wc.name + "_scaled", taken), wc.type.dims, wc.layout, wbody)
    g.add_constant(new_w)
    src.body = _replace(src.body, w, Expr("read", w.args, (new_w.name, w.arg[1], None), w.dtype))
    body = at
    if b is not None:
        bvars = [v for v in op.type.dims if v in ex.free_vars(b)]
        shift = _evaluate(g, fresh(src.out + "_shift", set(g.types)),
                          {v: op.type.dims[v] for v in bvars}, bvars, b)
        g.add_constant(shift)
        body = ex.add(at, ex.read(shift.name, {v: ex.var(v) for v in bvars}, shift.type.dtype))
    op.body = ex.replace_node(op.body, part, body)
    return True


def _replace(e: Expr, old: Expr, new: Expr) -> Expr:
    if e == old:
        return new
    if e.op != "mul":
        return e
    return Expr("mul", tuple(_replace(x, old, new) for x in e.args), e.arg, e.dtype)
