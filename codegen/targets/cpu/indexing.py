"""Index algebra over IR expressions: how an index moves with the loop variables.

The schedules ask the same questions of a read's indices: is the index affine in the loop
variables, with which coefficients (``coeff``, ``affine``), over what range (``index_range``),
and how far does the read move in memory when one variable steps (``read_step``).
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.kernel import Buffer


def is_one(s: Expr) -> bool:
    """Whether a size is the constant 1 (a dim a layout may skip)."""
    return s.is_const and s.value == 1


def coeff(e: Expr, v: str):
    """d e / d v when ``e`` is affine in ``v`` with a constant coefficient, else None."""
    if v not in ex.free_vars(e):
        return 0
    if e.op == "var":
        return 1
    if e.op in ("add", "sub"):
        a, b = coeff(e.args[0], v), coeff(e.args[1], v)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if e.op == "mul":
        x, y = e.args
        if x.is_const:
            c = coeff(y, v)
            return None if c is None else x.value * c
        if y.is_const:
            c = coeff(x, v)
            return None if c is None else y.value * c
    if e.op == "neg":
        c = coeff(e.args[0], v)
        return None if c is None else -c
    return None


def affine(ix: Expr, loop: set[str]) -> tuple[dict[str, int], Expr] | None:
    """(coefficient per loop var, constant part) of an index affine in the loop vars."""
    if any(n.op == "read" for n in ex.walk(ix)):
        return None
    coeffs = {}
    for v in ex.free_vars(ix):
        if v not in loop:
            return None
        c = coeff(ix, v)
        if not isinstance(c, int):
            return None
        if c:
            coeffs[v] = c
    c0 = ex.simplify_size(ex.substitute(ix, {v: ex.const(0) for v in ex.free_vars(ix)}))
    if ex.free_vars(c0):
        return None
    return coeffs, c0


def index_range(coeffs: dict[str, int], c0: Expr, extent) -> tuple[Expr, Expr]:
    """The least and greatest value of ``c0 + sum(c * v)`` (``affine``'s form), each var
    ``v`` over ``[0, extent(v))``."""
    lo, hi = c0, c0
    for v, c in coeffs.items():
        span = ex.const(c) * (extent(v) - 1)
        if c < 0:
            lo = lo + span
        else:
            hi = hi + span
    return ex.simplify_size(lo), ex.simplify_size(hi)


def read_step(aff: dict, buf: Buffer, v: str, layout=None) -> Expr:
    """How many elements a read of ``buf`` moves in memory when loop var ``v`` steps by one:
    ``aff`` is the read's affine form per dim (``affine``), ``layout`` the buffer's dims in
    memory order (its own by default)."""
    step, stride = ex.const(0), ex.const(1)
    for d in reversed(layout or buf.layout):
        c = aff[d][0].get(v)
        if c:
            step = ex.simplify_size(step + ex.const(c) * stride)
        stride = ex.simplify_size(stride * buf.sizes[d])
    return step
