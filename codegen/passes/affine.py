"""Index arithmetic with ranges: affine forms, bounds, and exact floordiv/mod simplification.

A helper for the passes, not a pass. Reshapes leave indices like ``(288*p + r) // 32 % 3``;
once the loop variables' extents are known most such quotients and remainders are affine
again (``(288*p + 96*a + 32*b + c) // 32 == 9*p + 3*a + b`` because ``0 <= c < 32``).
Everything here is exact integer math over the variables' ranges, so a simplified index reads
the same element for every point of the loop nest, guarded reads included.
"""

from __future__ import annotations

from math import gcd

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr

Linear = dict  # atom Expr (a var, or any non-affine subexpression) -> coefficient; None -> constant


def linear(e: Expr) -> Linear:
    """``e`` as a sum of integer multiples of atoms plus a constant (key None)."""
    if e.op == "const" and dt.is_int(e.dtype) and e.dtype != "bool":
        return {None: e.arg} if e.arg else {}
    if e.dtype == dt.INDEX and e.op in ("add", "sub"):
        a, b = linear(e.args[0]), linear(e.args[1])
        s = 1 if e.op == "add" else -1
        out = dict(a)
        for k, c in b.items():
            out[k] = out.get(k, 0) + s * c
        return {k: c for k, c in out.items() if c}
    if e.dtype == dt.INDEX and e.op == "mul":
        a, b = e.args
        if b.is_const:
            a, b = b, a
        if a.is_const:
            return {k: a.arg * c for k, c in linear(b).items() if a.arg * c}
    if e.dtype == dt.INDEX and e.op == "neg":
        return {k: -c for k, c in linear(e.args[0]).items()}
    return {e: 1}


def from_linear(lin: Linear) -> Expr:
    """The expression of an affine form: added terms in their order, then subtracted ones,
    the constant last (or first, when every term is subtracted: ``7 - k``)."""
    terms = [(k, c) for k, c in lin.items() if k is not None and c]
    c0 = lin.get(None, 0)
    out = ex.const(0)
    for k, c in terms:
        if c > 0:
            out = ex.add(out, k if c == 1 else ex.mul(ex.const(c), k))
    if out == ex.const(0) and c0:
        out, c0 = ex.const(c0), 0
    for k, c in terms:
        if c < 0:
            out = ex.sub(out, k if c == -1 else ex.mul(ex.const(-c), k))
    return ex.add(out, ex.const(c0)) if c0 else out


def tidy(e: Expr) -> Expr:
    """An affine index over plain variables in its canonical form (``-1 - k + 8 -> 7 - k``);
    anything else unchanged."""
    lin = linear(e)
    if all(k is None or k.op == "var" for k in lin):
        return from_linear(lin)
    return e


def bounds(e: Expr, ranges: dict[str, int]) -> tuple[int, int] | None:
    """Inclusive (lo, hi) of an index expression when each var v lies in [0, ranges[v])."""
    op = e.op
    if op == "const":
        return (e.arg, e.arg) if isinstance(e.arg, int) and not isinstance(e.arg, bool) else None
    if op == "var":
        n = ranges.get(e.arg)
        return (0, n - 1) if n else None
    if e.dtype != dt.INDEX:
        return None
    if op in ("add", "sub", "mul", "neg", "max", "min"):
        bs = [bounds(a, ranges) for a in e.args]
        if any(b is None for b in bs):
            return None
        if op == "neg":
            return (-bs[0][1], -bs[0][0])
        (a0, a1), (b0, b1) = bs
        if op == "add":
            return (a0 + b0, a1 + b1)
        if op == "sub":
            return (a0 - b1, a1 - b0)
        if op == "max":
            return (max(a0, b0), max(a1, b1))
        if op == "min":
            return (min(a0, b0), min(a1, b1))
        ps = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
        return (min(ps), max(ps))
    if op in ("floordiv", "mod") and e.args[1].is_const and e.args[1].arg > 0:
        d = e.args[1].arg
        b = bounds(e.args[0], ranges)
        if op == "floordiv":
            return None if b is None else (b[0] // d, b[1] // d)
        if b is not None and b[0] // d == b[1] // d:
            return (b[0] % d, b[1] % d)
        return (0, d - 1)
    if op == "select":
        a, b = bounds(e.args[1], ranges), bounds(e.args[2], ranges)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    return None


def _lin_bounds(lin: Linear, ranges) -> tuple[int, int] | None:
    lo = hi = lin.get(None, 0)
    for k, c in lin.items():
        if k is None:
            continue
        b = bounds(k, ranges)
        if b is None:
            return None
        lo += min(c * b[0], c * b[1])
        hi += max(c * b[0], c * b[1])
    return lo, hi


def _divmod(e: Expr, ranges) -> Expr:
    """``x // d`` or ``x % d`` (d > 0, x already simplified) made affine where the range allows."""
    x, d = e.args[0], e.args[1].arg
    if e.op == "floordiv" and x.op == "floordiv" and x.args[1].is_const and x.args[1].arg > 0:
        # floor(floor(x / a) / b) == floor(x / (a*b)) for positive a, b
        return _divmod(ex.floordiv(x.args[0], ex.const(x.args[1].arg * d)), ranges)
    lin = linear(x)
    q = {k: c // d for k, c in lin.items() if k is not None and c % d == 0}
    r = {k: c for k, c in lin.items() if k is None or c % d}
    b = _lin_bounds(r, ranges)
    if b is None or b[0] // d != b[1] // d:
        return e
    k = b[0] // d
    if e.op == "floordiv":
        q[None] = k
        return from_linear(q)
    r[None] = r.get(None, 0) - k * d
    return from_linear(r)


def simplify_index(e: Expr, ranges: dict[str, int]) -> Expr:
    """``e`` with every floordiv/mod by a positive constant made affine where ranges allow."""
    if not e.args:
        return e
    args = tuple(simplify_index(a, ranges) for a in e.args)
    out = e if args == e.args else ex.rebuild(e, args)
    if (out.op in ("floordiv", "mod") and out.dtype == dt.INDEX and out.args[1].is_const
            and out.args[1].arg > 0):
        out = _divmod(out, ranges)
    return out


def simplify_reads(e: Expr, ranges: dict[str, int]) -> Expr:
    """``e`` with the index of every read simplified (values other than indices untouched)."""
    if not e.args:
        return e
    if e.op == "read":
        args = tuple(simplify_reads(simplify_index(a, ranges), ranges) for a in e.args)
    else:
        args = tuple(simplify_reads(a, ranges) for a in e.args)
    if args == e.args:
        return e
    return Expr("read", args, e.arg, e.dtype) if e.op == "read" else ex.rebuild(e, args)


def const_ranges(dims: dict[str, Expr]) -> dict[str, int]:
    """Extents of the dims whose size is a constant (the others have no known range)."""
    return {d: s.arg for d, s in dims.items() if s.is_const and s.arg > 0}


def count_divmod(e: Expr) -> int:
    return sum(1 for n in ex.walk(e) if n.op in ("floordiv", "mod") and n.dtype == dt.INDEX)


def radices(e: Expr, v: str, extent: int) -> list[int]:
    """The divisors ``d`` of ``extent`` that ``v`` is split by in ``e`` (``(.. + c*v) // d`` or
    ``% d`` with ``c`` dividing ``d``), sorted, if they form a chain each dividing the next."""
    found: set[int] = set()
    for n in ex.walk(e):
        if n.op not in ("floordiv", "mod") or n.dtype != dt.INDEX or not n.args[1].is_const:
            continue
        d = n.args[1].arg
        x = n.args[0]
        # a chain x // a // b splits at a*b
        while n.op == "floordiv" and x.op == "floordiv" and x.args[1].is_const and x.args[1].arg > 0:
            d *= x.args[1].arg
            x = x.args[0]
        c = linear(x).get(ex.var(v), 0)
        if c and d > 0 and d % abs(c) == 0:
            step = d // gcd(d, abs(c))
            if 1 < step < extent and extent % step == 0:
                found.add(step)
    out = sorted(found)
    if any(b % a for a, b in zip(out, out[1:])):
        return []
    return out
