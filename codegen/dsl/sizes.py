"""Sizes of the dims of a comprehension: inferred from the reads, checked against them.

A dim read by a bare variable (``W`` read at its own ``ci``) takes the tensor's size exactly
(values.py). A dim that only appears inside affine indices of unpadded reads (the ``x`` of
``P(x=2*x + kx)``) gets the largest size that keeps every such read in range, as a valid
convolution does: ``(size of P's x - 1 - (kx's size - 1)) // 2 + 1``, symbolic where the sizes
are. A dim with no size at all (read only through padded or data-dependent indices) is a
``DimError`` that says to give it one (``dsl.dim("x", size=...)``). Once every size is known,
static ones are checked: an affine read that would leave its tensor is a ``DimError`` naming
the tensor, the dim and the index's range.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.dsl.errors import DimError
from mlpack.codegen.dsl.values import Size, size_text


def linear(e: Expr) -> dict | None:
    """``e`` as {variable: coefficient, None: constant} when it is affine with integer
    coefficients, else None."""
    if e.op == "const" and isinstance(e.value, int):
        return {None: e.value}
    if e.op == "var":
        return {e.arg: 1, None: 0}
    if e.op in ("add", "sub"):
        a, b = linear(e.args[0]), linear(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        out = dict(a)
        for k, c in b.items():
            out[k] = out.get(k, 0) + sign * c
        return out
    if e.op == "neg":
        a = linear(e.args[0])
        return None if a is None else {k: -c for k, c in a.items()}
    if e.op == "mul":
        a, b = linear(e.args[0]), linear(e.args[1])
        if a is None or b is None:
            return None
        if set(a) == {None}:
            return {k: a[None] * c for k, c in b.items()}
        if set(b) == {None}:
            return {k: b[None] * c for k, c in a.items()}
    return None


def _extreme(lin: dict, sizes: dict[str, Expr], top: bool) -> Expr:
    """The largest (``top``) or smallest value of an affine index over its variables' ranges."""
    out = ex.const(lin.get(None, 0))
    for v, c in lin.items():
        if v is not None and (c > 0) == top and c != 0:
            out = ex.add(out, ex.mul(c, ex.sub(sizes[v], 1)))
    return ex.simplify_size(out)


def resolve(sizes: dict[str, Size | None], bounds, where: str) -> dict[str, Size]:
    """Every dim's size: the known ones, then those the bounds imply, one variable at a time."""
    known = {d: s for d, s in sizes.items() if s is not None}
    changed = True
    while changed:
        changed = False
        for b in bounds:
            lin = linear(b.index)
            if lin is None:
                continue
            open_ = [v for v in lin if v is not None and v not in known and lin[v]]
            if len(open_) != 1 or lin[open_[0]] < 0:
                continue
            v, a = open_[0], lin[open_[0]]
            rest = {k: c for k, c in lin.items() if k != v}
            top = _extreme(rest, {k: s.expr for k, s in known.items()}, True)
            size = ex.simplify_size(ex.floordiv(ex.sub(ex.sub(b.extent, 1), top), a) + 1)
            if size.is_const and size.value <= 0:
                raise DimError(f"dim {v} has no valid size: {b.origin} (size "
                               f"{size_text(b.extent)}) is too small for the read at "
                               f"{b.index!r}")
            known[v] = Size(size, f"the reads of {b.origin} at {b.index!r}")
            changed = True
    missing = [d for d in sizes if d not in known]
    if missing:
        raise DimError(f"dim {missing[0]} of {where} has no size: no tensor is read at it "
                       f"directly or through an unpadded affine index; give it one with "
                       f"dsl.dim({missing[0]!r}, size=...)")
    return {d: known[d] for d in sizes}


def check(bounds, sizes: dict[str, Size]) -> None:
    """A DimError for a read whose static index range leaves its tensor."""
    for b in bounds:
        lin = linear(b.index)
        if lin is None or not b.extent.is_const:
            continue
        vals = {v: sizes[v].expr for v in lin if v is not None and v in sizes}
        if len(vals) != len([v for v in lin if v is not None]) or \
                not all(s.is_const for s in vals.values()):
            continue
        lo, hi = _extreme(lin, vals, False), _extreme(lin, vals, True)
        if lo.value < 0 or hi.value >= b.extent.value:
            ranges = ", ".join(f"{v} < {size_text(s)}" for v, s in vals.items())
            raise DimError(f"dim out of range: {b.origin} has size {b.extent.value}, read at "
                           f"{b.index!r} from {lo.value} to {hi.value} ({ranges}); pad the "
                           f"read (pad=...) or size the dims to fit")
