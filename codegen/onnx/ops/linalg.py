"""Contractions: MatMul, Gemm, Einsum, MatMulInteger.

Each contraction is one ``sum`` comprehension whose body is a plain product of reads, so the
interpreter runs it as a single einsum and later passes see the textbook form
``out[m, n] = sum{k} a[m, k] * b[k, n]``. Scaling and bias (Gemm's alpha, beta, C) and integer
zero points are separate elementwise comprehensions around it.
"""

from __future__ import annotations

import re

from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import Value


def batch_broadcast(b, n, shapes, names_of):
    """Broadcast the batch (leading) parts of several shapes; returns (shape, names)."""
    stubs = [Value("f32", tuple(s), None, tuple(nm)) for s, nm in zip(shapes, names_of)]
    shape = b.broadcast_shape(n, *stubs)
    return shape, b.broadcast_names(*stubs)


def batch_index(shape, idx):
    """The index into a batch part of ``shape`` from a broadcast batch index ``idx``."""
    off = len(idx) - len(shape)
    return [ex.const(0) if (s.is_const and s.value == 1) else idx[off + j] for j, s in enumerate(shape)]


def tmp_hint(n, what: str) -> str:
    """A name for an intermediate result, leaving the node's output name to its last one."""
    return f"{n.output_names[0] if n.output_names else n.op_type}_{what}"


def _dim_name(name: str, default: str) -> str:
    return default if re.fullmatch(r"d\d+", name) else name


def matmul(b, n, x: Value, y: Value, dtype: str, hint: str | None = None) -> Value:
    """numpy.matmul semantics: 1-D operands are promoted and the added dim dropped again."""
    if x.rank == 0 or y.rank == 0:
        raise n.shape_error("MatMul operands must not be scalars")
    xs, ys = list(x.shape), list(y.shape)
    x_vec, y_vec = x.rank == 1, y.rank == 1
    xb, yb = xs[:-2], ys[:-2]
    k = xs[-1]
    ky = ys[0] if y_vec else ys[-2]
    if k.is_const and ky.is_const and k.value != ky.value:
        raise n.shape_error(f"contraction dims differ: {k.value} vs {ky.value}")
    bshape, bnames = batch_broadcast(b, n, [xb, yb], [x.names[:-2], y.names[:-2]])
    rows = [] if x_vec else [xs[-2]]
    cols = [] if y_vec else [ys[-1]]
    shape = tuple(bshape) + tuple(rows) + tuple(cols)
    # keep meaningful operand dim names (a batch stays `batch`); positional ones become m, n
    names = tuple(bnames) + tuple(_dim_name(x.names[-2], "m") for _ in rows) \
        + tuple(_dim_name(y.names[-1], "n") for _ in cols)

    def body(o, r):
        bi, rest = o[:len(bshape)], o[len(bshape):]
        m = rest[:len(rows)]
        c = rest[len(rows):]
        a = x.at(batch_index(xb, bi) + m + [r[0]])
        w = y.at(batch_index(yb, bi) + [r[0]] + c)
        return a * w

    return b.reduce("sum", dtype, shape, (k,), body, names, ("k",), hint)


@op("MatMul")
def matmul_op(b, n):
    x, y = n.inputs[0], n.inputs[1]
    return [matmul(b, n, x, y, x.dtype)]


def _transposed(b, v: Value, trans: int) -> Value:
    if not trans:
        return v
    if v.rank != 2:
        raise b.node.shape_error("Gemm operands must be 2-D")
    return Value(v.dtype, v.shape[::-1], lambda idx: v.at(idx[::-1]), v.names[::-1])


@op("Gemm")
def gemm(b, n):
    a = _transposed(b, n.inputs[0], n.attr("transA"))
    w = _transposed(b, n.inputs[1], n.attr("transB"))
    c = n.input(2)
    alpha, beta = float(n.attr("alpha")), float(n.attr("beta"))
    dtype = a.dtype
    if a.rank != 2 or w.rank != 2:
        raise n.shape_error("Gemm operands must be 2-D")
    # alpha and beta scale outside the sum, so the contraction stays a pure product of reads
    has_c = c is not None and beta != 0.0
    if alpha == 1.0 and not has_c:
        return [matmul(b, n, a, w, dtype)]
    ab = matmul(b, n, a, w, dtype, tmp_hint(n, "mm"))

    def scale(v, f):
        return v if f == 1.0 else v * ex.const(f, dtype)

    if not has_c:
        return [b.elementwise(dtype, [ab], lambda p: scale(p, alpha))]
    return [b.elementwise(dtype, [ab, c], lambda p, q: scale(p, alpha) + scale(ex.cast(q, dtype), beta))]


def _shift(b, v: Value, zp: Value | None, axis: int | None) -> Value:
    """``cast<i32>(v) - zero_point``: the zero point is a scalar, or a vector along ``axis``."""
    hint = tmp_hint(b.node, "shifted")
    if zp is None:
        return b.map("i32", v.shape, lambda i: ex.cast(v.at(i), "i32"), v.names, hint)
    if zp.rank == 0 or (zp.rank == 1 and zp.shape[0].is_const and zp.shape[0].value == 1):
        z = zp.at([ex.const(0)] * zp.rank)
        return b.map("i32", v.shape, lambda i: ex.cast(v.at(i), "i32") - ex.cast(z, "i32"),
                     v.names, hint)
    if zp.rank != 1 or axis is None:
        raise b.node.fail(f"zero point of shape {zp.shape} is not supported")
    ax = axis % v.rank
    return b.map("i32", v.shape, lambda i: ex.cast(v.at(i), "i32") - ex.cast(zp.at([i[ax]]), "i32"),
                 v.names, hint)


@op("MatMulInteger")
def matmul_integer(b, n):
    x = _shift(b, n.inputs[0], n.input(2), -2 if n.inputs[0].rank > 1 else None)
    y = _shift(b, n.inputs[1], n.input(3), -1)
    return [matmul(b, n, x, y, "i32")]


# ---------------------------------------------------------------- Einsum


def _parse_einsum(n, eq: str, ranks: list[int]):
    """Terms (lists of letters, '.' standing for the ellipsis dims) per operand and output."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise n.shape_error(f"equation {eq!r} has {len(terms)} operands, the node {len(ranks)}")
    ell = 0
    parsed = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            pre, _, post = t.partition("...")
            k = r - len(pre) - len(post)
            ell = max(ell, k)
            parsed.append(list(pre) + [f".{i}" for i in range(k)] + list(post))
        else:
            parsed.append(list(t))
    # ellipsis dims are right-aligned across operands, like numpy broadcasting
    for p in parsed:
        k = sum(1 for c in p if c.startswith("."))
        for j, c in enumerate(p):
            if c.startswith("."):
                p[j] = f".{int(c[1:]) + ell - k}"
    ells = [f".{i}" for i in range(ell)]
    if arrow:
        out = list(rhs.replace("...", "\0"))
        out = [x for c in out for x in (ells if c == "\0" else [c])]
    else:
        letters = [c for p in parsed for c in p if not c.startswith(".")]
        out = ells + sorted(c for c in set(letters) if letters.count(c) == 1)
    for p, r in zip(parsed, ranks):
        if len(p) != r:
            raise n.shape_error(f"equation {eq!r} does not match an operand of rank {r}")
    return parsed, out


@op("Einsum")
def einsum(b, n):
    xs = n.inputs
    terms, out = _parse_einsum(n, n.attr("equation"), [x.rank for x in xs])
    sizes: dict[str, ex.Expr] = {}
    for t, x in zip(terms, xs):
        for c, s in zip(t, x.shape):
            if c not in sizes or (sizes[c].is_const and sizes[c].value == 1):
                sizes[c] = s
    red = [c for t in terms for c in t if c not in out]
    red = list(dict.fromkeys(red))
    dtype = xs[0].dtype

    def label(c):
        return f"e{c[1:]}" if c.startswith(".") else c

    def body(o, r):
        env = dict(zip(out, o)) | dict(zip(red, r))
        prod = None
        for t, x in zip(terms, xs):
            # a size-1 ellipsis dim broadcasts
            idx = [ex.const(0) if c.startswith(".") and s.is_const and s.value == 1 else env[c]
                   for c, s in zip(t, x.shape)]
            f = x.at(idx)
            prod = f if prod is None else prod * f
        return prod

    shape = [sizes[c] for c in out]
    if not red:
        return [b.map(dtype, shape, lambda o: body(o, []), [label(c) for c in out])]
    return [b.reduce("sum", dtype, shape, [sizes[c] for c in red], body,
                     [label(c) for c in out], [label(c) for c in red])]
