"""Procedural ops: TopK, NonZero, Unique, NonMaxSuppression.

None of these is a comprehension (they select, order or count data-dependently), so each is
an IR Procedure: explicit sequential loops over scalar locals and stores, which the
interpreter runs statement by statement and every target compiles. Ordering is by insertion
or by counting ranks, never by calling a library sort.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import For, If, Let, SetSize, Store, TensorType, While
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.values import tensor_value
from mlpack.codegen.onnx.ops.indexing import fresh_sym, loops, norm_axis, result, unflatten

TRUE, FALSE = ex.const(True), ex.const(False)


def _and(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = ex.binary("and", out, x)
    return out


def _or(a, b_):
    return ex.binary("or", a, b_)


def _lt(a, b_):
    return ex.binary("lt", a, b_)


def _zero_index(v):
    """The index of a value's only element (a scalar or a 1-element tensor)."""
    return [ex.const(0)] * v.rank


# ---------------------------------------------------------------- TopK


@op("TopK")
def top_k(b, n):
    """Per row, insertion into the sorted output: O(n*K), ties kept in index order (an
    element only moves ahead of strictly worse ones), as ONNX specifies."""
    x = n.inputs[0]
    k = ex.const(n.attr("k")) if n.opset < 10 else b.ints(n.input(1), "TopK K")[0]
    axis = norm_axis(n, n.attr("axis"), x.rank)
    largest = n.attr("largest", 1) if n.opset >= 11 else 1
    shape = list(x.shape)
    shape[axis] = k
    vname, vty, dims = result(b, n.output_names[0] or "topk", x.dtype, x.names, shape)
    iname = b.fresh((n.output_names[1] if len(n.output_names) > 1 else "") or "topk_idx")
    ity = TensorType("i64", dict(dims))
    better = (lambda a, c: ex.binary("gt", a, c)) if largest else (lambda a, c: _lt(a, c))
    others = shape[:axis] + shape[axis + 1:]

    def row(o):
        def at(j):  # the output slot j of this row, as a dict index
            return {d: i for (d, _), i in zip(dims, o[:axis] + [j] + o[axis:])}
        cnt, p, v = ex.var("cnt"), ex.var("p"), ex.var("v", x.dtype)
        i = ex.var("i")
        last = ex.read(vname, at(cnt - 1), x.dtype, pad=0)  # cnt-1 < 0 is guarded below
        prev = ex.read(vname, at(ex.maximum(p - 1, ex.const(0))), x.dtype)
        shift = [Store(vname, at(p), prev),
                 Store(iname, at(p), ex.read(iname, at(ex.maximum(p - 1, ex.const(0))), "i64")),
                 Let("p", p - 1)]
        insert = [
            Let("p", ex.minimum(cnt, k - 1)),
            While(_and(ex.binary("gt", p, ex.const(0)), better(v, prev)), shift),
            Store(vname, at(p), v), Store(iname, at(p), i),
            Let("cnt", ex.minimum(cnt + 1, k)),
        ]
        wanted = _or(_lt(cnt, k), _and(ex.binary("gt", cnt, ex.const(0)), better(v, last)))
        return [Let("cnt", ex.const(0)),
                For("i", x.shape[axis], [Let("v", ex.cast(x.at(o[:axis] + [i] + o[axis:]), x.dtype)),
                                         If(wanted, insert)])]
    b.procedure({vname: vty, iname: ity}, loops(others, "o", row))
    return [tensor_value(vname, x.dtype, dims), tensor_value(iname, "i64", dims)]


# ---------------------------------------------------------------- NonZero


@op("NonZero")
def non_zero(b, n):
    x = n.inputs[0]
    size = fresh_sym(b, "nonzero")
    bound = x.numel()
    name, ty, dims = result(b, n.output_names[0] or "nonzero", "i64", ("rank", "nz"),
                            [ex.const(x.rank), ex.sym(size)])
    cnt = ex.var("cnt")

    def visit(v):
        nz = ex.binary("ne", x.at(v), ex.cast(ex.const(0), x.dtype))
        stores = [Store(name, {dims[0][0]: ex.const(d), dims[1][0]: cnt}, v[d])
                  for d in range(x.rank)]
        return [If(nz, stores + [Let("cnt", cnt + 1)])]
    body = [Let("cnt", ex.const(0))] + loops(list(x.shape), "i", visit) + [SetSize(size, cnt)]
    b.procedure({name: ty}, body, bounds={size: bound})
    return [tensor_value(name, "i64", dims)]


# ---------------------------------------------------------------- Unique


def _unique_elements(n, x):
    """Unique's view of ``x`` as rows: (row count, row length, comp(row, c) -> Expr, the
    output Y's ONNX shape given the unique count, Y's index of (row, c))."""
    axis = n.attr("axis", None)
    if axis is None:
        rows = x.numel()
        return (rows, ex.const(1), lambda r, c: x.at(unflatten(r, x.shape)),
                lambda u: [u], lambda r, c: [r], ("u",))
    axis = norm_axis(n, axis, x.rank)
    others = list(x.shape[:axis] + x.shape[axis + 1:])

    def place(r, c):
        o = unflatten(c, others)
        return o[:axis] + [r] + o[axis:]
    return (x.shape[axis], ex.product(others), lambda r, c: x.at(place(r, c)),
            lambda u: list(x.shape[:axis]) + [u] + list(x.shape[axis + 1:]), place, x.names)


@op("Unique")
def unique(b, n):
    """First pass: each row is matched against the uniques so far (first occurrences,
    counts, inverse). If sorted, each unique's rank is the number of uniques lexicographically
    below it, and the outputs are written at their ranks."""
    x = n.inputs[0]
    rows, m, comp, yshape, place, ynames = _unique_elements(n, x)
    size = fresh_sym(b, "unique")
    u = ex.sym(size)
    y, yty, ydims = result(b, n.output_names[0] or "unique", x.dtype, ynames, yshape(u))
    outs = [result(b, (n.output_names[k] if len(n.output_names) > k else "") or hint, "i64",
                   (hint,), [s]) for k, hint, s in
            ((1, "indices", u), (2, "inverse", rows), (3, "counts", u))]
    (ind, indty, inddims), (inv, invty, invdims), (cts, ctsty, ctsdims) = outs
    first, count, inv0, rank = (b.fresh(h) for h in ("u_first", "u_count", "u_inv", "u_rank"))
    scratch = {t: TensorType("i64", {"r": rows}) for t in (first, count, inv0, rank)}
    rd = lambda t, i: ex.read(t, {"r": i}, "i64")  # noqa: E731
    st = lambda t, i, v: Store(t, {"r": i}, v)      # noqa: E731
    cnt, f, i, j, c = (ex.var(s) for s in ("cnt", "f", "i", "j", "c"))
    same = [Let("e", TRUE),
            For("c", m, [Let("e", _and(ex.var("e", "bool"),
                                       ex.binary("eq", comp(rd(first, j), c), comp(i, c))))]),
            If(ex.var("e", "bool"), [Let("f", j)])]
    scan = [
        Let("cnt", ex.const(0)),
        For("i", rows, [
            Let("f", ex.const(-1)),
            For("j", cnt, [If(_lt(f, ex.const(0)), same)]),
            If(_lt(f, ex.const(0)),
               [st(first, cnt, i), st(count, cnt, ex.const(1)), Let("f", cnt), Let("cnt", cnt + 1)],
               [st(count, f, rd(count, f) + 1)]),
            st(inv0, i, f)]),
        SetSize(size, cnt),
    ]
    body = scan + (_ranks(comp, m, cnt, rd, st, first, rank) if n.attr("sorted")
                   else [For("j", cnt, [st(rank, j, j)])])
    r = rd(rank, j)

    def ystore(cv):
        return [Store(y, {d: e for (d, _), e in zip(ydims, place(r, cv[0]))}, comp(rd(first, j), cv[0]))]
    body += [
        For("j", cnt, loops([m], "k", ystore) + [
            Store(ind, {inddims[0][0]: r}, rd(first, j)),
            Store(cts, {ctsdims[0][0]: r}, rd(count, j))]),
        For("i", rows, [Store(inv, {invdims[0][0]: i}, rd(rank, rd(inv0, i)))]),
    ]
    b.procedure({y: yty, ind: indty, inv: invty, cts: ctsty}, body, scratch, {size: rows})
    return [tensor_value(y, x.dtype, ydims), tensor_value(ind, "i64", inddims),
            tensor_value(inv, "i64", invdims), tensor_value(cts, "i64", ctsdims)]


def _ranks(comp, m, cnt, rd, st, first, rank):
    """rank[j] = how many uniques are lexicographically below unique j (all are distinct)."""
    j, j2, c = ex.var("j"), ex.var("j2"), ex.var("c")
    a, z = comp(rd(first, j2), c), comp(rd(first, j), c)
    done, below = ex.var("done", "bool"), ex.var("below", "bool")
    compare = [Let("done", FALSE), Let("below", FALSE),
               For("c", m, [If(_and(ex.unary("not", done), ex.binary("ne", a, z)),
                               [Let("done", TRUE), Let("below", _lt(a, z))])])]
    return [For("j", cnt, [Let("rk", ex.const(0)),
                           For("j2", cnt, compare + [If(below, [Let("rk", ex.var("rk") + 1)])]),
                           st(rank, j, ex.var("rk"))])]


# ---------------------------------------------------------------- NonMaxSuppression


def _edges(boxes, bb, box, center: int, prefix: str):
    """Lets binding prefix_x0, _x1, _y0, _y1 (min/max edges) of box ``box`` of batch ``bb``."""
    t = boxes.dtype
    c = [ex.cast(boxes.at([bb, box, ex.const(k)]), t) for k in range(4)]
    if center:
        half = ex.const(2.0, t)
        w, h = ex.binary("div", c[2], half), ex.binary("div", c[3], half)
        e = (c[0] - w, c[0] + w, c[1] - h, c[1] + h)
    else:
        e = (ex.minimum(c[1], c[3]), ex.maximum(c[1], c[3]),
             ex.minimum(c[0], c[2]), ex.maximum(c[0], c[2]))
    return [Let(f"{prefix}_{s}", v) for s, v in zip(("x0", "x1", "y0", "y1"), e)]


def _overlaps(t, thr):
    """Whether boxes a and b (their edge locals) overlap by IoU > thr, as ONNX's reference."""
    v = lambda s: ex.var(s, t)  # noqa: E731
    gt = lambda a_, b_: ex.binary("gt", a_, b_)  # noqa: E731
    zero = ex.const(0.0, t)
    ix0, ix1 = ex.maximum(v("a_x0"), v("b_x0")), ex.minimum(v("a_x1"), v("b_x1"))
    iy0, iy1 = ex.maximum(v("a_y0"), v("b_y0")), ex.minimum(v("a_y1"), v("b_y1"))
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a = (v("a_x1") - v("a_x0")) * (v("a_y1") - v("a_y0"))
    area_b = (v("b_x1") - v("b_x0")) * (v("b_y1") - v("b_y0"))
    union = area_a + area_b - inter
    return _and(gt(ix1, ix0), gt(iy1, iy0), gt(inter, zero), gt(area_a, zero), gt(area_b, zero),
                gt(union, zero), gt(ex.binary("div", inter, union), ex.cast(thr, t)))


@op("NonMaxSuppression")
def non_max_suppression(b, n):
    """Per (batch, class): repeatedly take the best remaining candidate (highest score, lowest
    index) and keep it unless it overlaps a kept box. Thresholds are read at run time."""
    boxes, scores = n.inputs[0], n.inputs[1]
    maxo, iou, sthr = n.input(2), n.input(3), n.input(4)
    center = n.attr("center_point_box")
    if center not in (0, 1):
        raise n.fail(f"center_point_box={center}")
    nb, nc, ns = scores.shape
    t = boxes.dtype
    size = fresh_sym(b, "nms")
    name, ty, dims = result(b, n.output_names[0] or "selected", "i64", ("sel", "triple"),
                            [ex.sym(size), ex.const(3)])
    alive, kept = b.fresh("nms_alive"), b.fresh("nms_kept")
    scratch = {alive: TensorType("bool", {"s": ns}), kept: TensorType("i64", {"s": ns})}
    limit = ex.cast(maxo.at(_zero_index(maxo)), "i64") if maxo is not None else ex.const(0)
    thr = iou.at(_zero_index(iou)) if iou is not None else ex.const(0.0, t)
    bb, cc, s, q = ex.var("bb"), ex.var("cc"), ex.var("s"), ex.var("q")
    best, nk, total = ex.var("best"), ex.var("nk"), ex.var("total")
    score = lambda i: scores.at([bb, cc, i])  # noqa: E731
    cand = TRUE if sthr is None else ex.binary(
        "gt", score(s), ex.cast(sthr.at(_zero_index(sthr)), scores.dtype))
    is_alive = lambda i: ex.read(alive, {"s": i}, "bool")  # noqa: E731
    pick = For("s", ns, [If(_and(is_alive(s), _or(_lt(best, ex.const(0)), ex.binary(
        "gt", score(s), score(ex.maximum(best, ex.const(0)))))), [Let("best", s)])])
    check = For("q", nk, _edges(boxes, bb, ex.read(kept, {"s": q}, "i64"), center, "b") + [
        If(_overlaps(t, thr), [Let("keep", FALSE)])])
    out = lambda k, v: Store(name, {dims[0][0]: total, dims[1][0]: ex.const(k)}, v)  # noqa: E731
    take = [Store(alive, {"s": best}, FALSE), Let("keep", TRUE)] + \
        _edges(boxes, bb, best, center, "a") + [check, If(ex.var("keep", "bool"), [
            Store(kept, {"s": nk}, best), out(0, bb), out(1, cc), out(2, best),
            Let("nk", nk + 1), Let("total", total + 1)])]
    step = [Let("best", ex.const(-1)), pick,
            If(_or(_lt(best, ex.const(0)), ex.binary("ge", nk, limit)), [Let("go", FALSE)], take)]
    per_class = [For("s", ns, [Store(alive, {"s": s}, cand)]), Let("nk", ex.const(0)),
                 Let("go", TRUE), While(ex.var("go", "bool"), step)]
    body = [Let("total", ex.const(0)), For("bb", nb, [For("cc", nc, per_class)]),
            SetSize(size, total)]
    b.procedure({name: ty}, body, scratch, {size: ex.simplify_size(nb * nc * ns)})
    return [tensor_value(name, "i64", dims)]
