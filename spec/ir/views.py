"""Reads at affine indices as strided views: the NumPy interpreter's fast path for reads.

A read whose every index is affine in the loop variables (``2*x + kx - 1``, ``i``, a constant,
a symbol) touches a lattice of the tensor's elements that NumPy can describe without copying
or gathering: a view with one axis per variable, whose stride is the sum, over the dims the
variable indexes, of its coefficient times that dim's stride. A convolution's window, a strided
pooling, a transpose and a broadcast are all such views, so the interpreter reads them at the
cost of a few Python operations instead of building index arrays the size of the read.

A padded read (``pad`` set) whose lattice leaves the tensor reads a copy of the tensor padded
with the pad value by the largest overhang over the variables' full ranges (made once per
read), which is what the guarded read means for indices that are affine per dim. Anything
else (a quasi-affine ``i // 4``, a gather, an unpadded read out of range, which must raise the
interpreter's range error) is left to the general path.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr

Form = tuple[int, dict[str, int]]   # c + sum of coef * var


def affine(e: Expr, syms: dict[str, int]) -> Form | None:
    """``e`` as (constant, {var: coefficient}) when it is affine in its vars, else None."""
    op = e.op
    if op == "const":
        v = e.arg
        return (int(v), {}) if dt.is_int(e.dtype) and isinstance(v, (int, np.integer)) \
            and not isinstance(v, bool) else None
    if op == "sym":
        return (int(syms[e.arg]), {}) if e.arg in syms else None
    if op == "var":
        return 0, {e.arg: 1}
    if op == "neg":
        a = affine(e.args[0], syms)
        return None if a is None else (-a[0], {v: -c for v, c in a[1].items()})
    if op in ("add", "sub"):
        a, b = affine(e.args[0], syms), affine(e.args[1], syms)
        if a is None or b is None:
            return None
        sign = 1 if op == "add" else -1
        coefs = dict(a[1])
        for v, c in b[1].items():
            coefs[v] = coefs.get(v, 0) + sign * c
        return a[0] + sign * b[0], {v: c for v, c in coefs.items() if c}
    if op == "mul":
        a, b = affine(e.args[0], syms), affine(e.args[1], syms)
        if a is None or b is None or (a[1] and b[1]):
            return None
        (k, _), (c, coefs) = (a, b) if not a[1] else (b, a)
        return c * k, {v: x * k for v, x in coefs.items() if x * k}
    return None


def _bounds(form: Form, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The least and greatest value of ``form`` with each var v in range(lo, lo + n)."""
    c, coefs = form
    low = high = c
    for v, k in coefs.items():
        lo, n = ranges[v]
        a, b = k * lo, k * (lo + n - 1)
        low, high = low + min(a, b), high + max(a, b)
    return low, high


def lattice(data: np.ndarray, forms: list[Form],
            ranges: dict[str, tuple[int, int]]) -> tuple[np.ndarray, tuple[str, ...]]:
    """The read-only view of ``data`` at ``forms`` (one per axis, all in range) over the vars'
    ``ranges`` {var: (start, count)}, and the var each of its axes stands for. ``data`` may
    also be an array converted where it is read (the float64 reference's weights,
    packager/reference.py): its ``.data`` is viewed, and the view converted to its ``dtype``."""
    if not isinstance(data, np.ndarray) and hasattr(data, "data"):
        view, labels = lattice(np.asarray(data.data), forms, ranges)
        return np.asarray(view, dtype=data.dtype), labels
    labels: list[str] = []
    for _, coefs in forms:
        labels.extend(v for v in coefs if v not in labels)
    start = []
    for c, coefs in forms:
        start.append(c + sum(k * ranges[v][0] for v, k in coefs.items()))
    strides = [sum(k * s for (_, coefs), s in zip(forms, data.strides) for u, k in coefs.items()
                   if u == v) for v in labels]
    # the view's origin is the element at the ranges' starts; strides may run back from it
    origin = data[tuple(slice(i, None) for i in start)] if data.ndim else data
    user = data.dtype.isbuiltin != 1   # as_strided cannot name ml_dtypes' types (bf16, fp8)
    if user:
        origin = origin.view(np.dtype((np.void, data.dtype.itemsize)))
    view = np.lib.stride_tricks.as_strided(origin, [ranges[v][1] for v in labels], strides,
                                          writeable=False)
    return (view.view(data.dtype) if user else view), tuple(labels)


def in_range(forms: list[Form], shape, ranges) -> bool:
    return all(0 <= lo and hi < n for (lo, hi), n in
               zip((_bounds(f, ranges) for f in forms), shape))


def overhang(forms: list[Form], shape, ranges) -> list[tuple[int, int]]:
    """Per axis, how far ``forms`` over ``ranges`` reach below 0 and past the end."""
    out = []
    for f, n in zip(forms, shape):
        lo, hi = _bounds(f, ranges)
        out.append((max(0, -lo), max(0, hi - (n - 1))))
    return out


def shifted(forms: list[Form], margins: list[tuple[int, int]]) -> list[Form]:
    """``forms`` re-based onto a tensor padded by ``margins`` before each axis."""
    return [(c + before, coefs) for (c, coefs), (before, _) in zip(forms, margins)]
