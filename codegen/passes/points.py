"""Point spans: a run of comprehensions that can execute one point of some outer dims at a time.

EM routing (examples/capsules) computes, for each output position (n, x, y), 590 KB of votes
V[kx, ky, ci, co, i, j] and then reads them in eight reductions (means, variances,
likelihoods) whose every other operand is that position's too. Stored whole, the votes are
231 MB streamed through memory eight times; recomputed in each reader (the ``recompute``
pass), each vote costs its four multiply-adds eight times over. Run one position at a time,
the votes are computed once into a buffer of one position's size and re-read while they are
in cache: the cpu target's ``point_tiles`` (codegen/targets/cpu/tiles.py) runs such a span so.

``point_span(g, t)`` says whether ``t`` has such a span: the ops from ``t``'s producer to its
last reader, in graph order, all comprehensions that keep some dims D of ``t`` among their
output dims, and read every tensor the span writes at the plain var of each dim of D (same
name), unguarded, with no index taken from data. D is the largest such set (in ``t``'s order).
It applies to a tensor worth the trouble and cheap to hold per point:

- ``t`` is bigger than ``CACHE_BYTES``, read at two places or more (an op's reads at one
  index are one place), and written by a sum of at most ``MAX_TERMS`` constant terms (a map
  is cheap to recompute where it is read, and a longer sum, attention's scores, would be one
  matrix-vector product per point);
- one point of ``t`` (its non-D dims, all constant) takes at most ``POINT_BYTES``;
- no op of the span but ``t``'s producer is a contraction of an operand with weights: the cpu
  target runs those as GEMMs (packed weights, register tiles), which a span would turn into
  one matrix-vector product per point.

The ``recompute`` pass keeps a tensor with a span materialized (it costs one point's buffer,
not a pass through memory); the cpu target finds the same spans in its graph and runs each as
one kernel. Dims are matched by name, as the DSL writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import walk
from mlpack.spec.ir.graph import Comprehension, Graph

POINT_BYTES = 1 << 20       # the most one point of a span's tensor may take
MAX_TERMS = 16              # the longest sum a span's intermediate may be (the votes: 4)
POINTS_IN_FLIGHT = 32       # points a target holds at once: a span's workgroups at most
CACHE_BYTES = 2 << 20       # a tensor up to this size is read back from cache: nearly free


@dataclass(frozen=True)
class Span:
    """Ops ``ops`` (their outputs, in graph order) run one point of ``dims`` at a time."""
    tensor: str
    ops: tuple[str, ...]
    dims: tuple[str, ...]
    point_bytes: int          # one point of ``tensor``


def contraction(c: Comprehension) -> bool:
    """A sum of a product of two plain reads: the cpu target runs it as a GEMM."""
    if c.reduce != "sum":
        return False
    factors, stack = [], [c.body]
    while stack:
        n = stack.pop()
        if n.op == "mul":
            stack.extend(n.args)
        else:
            factors.append(n)
    reads = [f for f in factors if f.op == "read"]
    return len(reads) == 2 and all(f.op in ("read", "const") for f in factors)


def dims_bytes(dims: dict, dtype: str) -> int:
    """The bytes of a tensor of ``dims`` (symbols at 1) and ``dtype``."""
    n = 1
    for s in dims.values():
        n *= ex.value_at_one(s)
    return n * max(dt.bits(dtype) // 8, 1)


def op_reads(op: Comprehension) -> list:
    """The read nodes of ``op``'s body."""
    return [n for n in walk(op.body) if n.op == "read"]


def kept_dims(span, keep: set[str]) -> set[str] | None:
    """Those of ``keep`` that every op of ``span`` has among its output dims and reads what
    the span writes at, by the plain var of the same name; None where a read of the span is
    guarded or any index comes from data (a gather: checked per element)."""
    written = {op.out for op in span}
    for op in span:
        keep = keep & set(op.type.dims)
        for r in op_reads(op):
            if any(m.op == "read" for i in r.args for m in walk(i)):
                return None
            if r.arg[0] not in written:
                continue
            if r.arg[2] is not None:
                return None
            at = dict(zip(r.arg[1], r.args))
            keep = {d for d in keep if d in at and at[d].op == "var" and at[d].arg == d}
    return keep


def point_span(g: Graph, t: str) -> Span | None:
    """``t``'s span (module docstring), or None."""
    index = {op.outs[0]: i for i, op in enumerate(g.ops)}
    if t not in index or t not in g.types:
        return None
    producer = g.ops[index[t]]
    if not isinstance(producer, Comprehension) or producer.reduce is None:
        return None
    terms = 1
    for s in producer.rdims.values():
        terms *= s.value if s.is_const else MAX_TERMS + 1
    if terms > MAX_TERMS:
        return None   # (attention's scores: a point would be a matrix-vector product)
    ttype = g.types[t]
    if dims_bytes(ttype.dims, ttype.dtype) <= CACHE_BYTES:
        return None
    # (reads at one index in one op are one place: SiLU's x * sigmoid(x) of a convolution
    # computes from one element, which native code loads once)
    sites = {i: n for i, op in enumerate(g.ops) if isinstance(op, Comprehension)
             for n in [len({r.args for r in op_reads(op) if r.arg[0] == t})] if n}
    if sum(sites.values()) < 2:
        return None
    span = g.ops[index[t]:max(sites) + 1]
    dims = [d for d, s in ttype.dims.items() if not (s.is_const and s.value == 1)]
    for op in span:
        if not isinstance(op, Comprehension):
            return None
        if op is not producer and contraction(op) and any(
                r.arg[0] in g.constants for r in op_reads(op)):
            return None   # a product with weights: a GEMM, which per point would be a GEMV
    keep = kept_dims(span, set(dims))
    if keep is None:
        return None
    dims = [d for d in dims if d in keep]
    if not dims:
        return None
    for op in span:   # one size per dim across the span
        for d in dims:
            if not ex.same_size(op.type.dims[d], ttype.dims[d]):
                return None
    rest = {d: s for d, s in ttype.dims.items() if d not in keep}
    if not all(s.is_const for s in rest.values()):
        return None
    point = dims_bytes(rest, ttype.dtype)
    if point > POINT_BYTES:
        return None
    return Span(t, tuple(op.outs[0] for op in span), tuple(dims), point)


__all__ = ["CACHE_BYTES", "MAX_TERMS", "POINT_BYTES", "POINTS_IN_FLIGHT", "Span", "contraction",
           "dims_bytes", "kept_dims", "op_reads", "point_span"]
