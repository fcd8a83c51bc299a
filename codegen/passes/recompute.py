"""Materialize or recompute: an intermediate read by several comprehensions, priced both ways.

    %V[n, r, o] = sum{k=4} %P[n, r, k] * %W[r, o, k]          (the capsule layer's votes)
    %mu[n, o]   = sum{r} %a[n, r] * %V[n, r, o]
    %var[n, o]  = sum{r} %a[n, r] * (%V[n, r, o] - %mu[n, o]) ** 2
        ->  each reader computes V's element where it reads it, V is never stored:
    %var[n, o]  = sum{r} %a[n, r] * (%P[n,r,0]*%W[r,o,0] + ... + %P[n,r,3]*%W[r,o,3] - %mu[n,o]) ** 2

The elementwise passes inline a producer only where that recomputes nothing (``fuse``: a map
read once; ``sums``: a sum read once as a factor). An intermediate that several reductions
read, as EM routing reads the votes three times per iteration, stays materialized by them,
however cheap it is to compute and however large it is. This pass prices both choices:

- **materialize**: the tensor is written once and read by each reader; one bigger than
  ``CACHE_BYTES`` goes through memory each time, at ``FLOPS_PER_BYTE`` flops per byte moved
  (what a core computes in the time it streams one byte: Zen 4, AVX-512, about 4);
- **recompute**: every read evaluates the producer's body again (its flops times the reader's
  iterations, each distinct read once: a body that reads ``%V`` twice at the same index
  computes it once), less the producer's own work; and each extra evaluation reads the
  producer's operands again, which go through memory when bigger than ``CACHE_BYTES``
  (Whisper's residual stream, four 2.3 MB tensors summed with an exact GELU, recomputed in
  each LayerNorm's mean, variance and output: 3x the layer norms' time, priced as flops alone).

- a tensor with a point span (points.py: every reader reads it, and all between them work,
  at the same point of some outer dims, as EM routing's per position) is held by the cpu target
  one point at a time, in cache: materializing it moves nothing through memory, and keeps
  POINTS_IN_FLIGHT points of it (what the budget counts).

Only what can be recomputed in place is a candidate: a map, or a sum of constant depth at most
``MAX_UNROLL``, which is unrolled into a plain expression (the IR has no reduction inside a
body); read at two places or more (one read is ``fuse``'s and ``sums``'s business), by
comprehensions only, unguarded, none of them a contraction of two plain reads (that one runs
as a GEMM, which an inlined body would break); not a graph output, not a map that only moves
data (a copy, a concatenation), not a body over ``MAX_FLOPS``. A tensor is recomputed into all
its readers or none (only then is its memory saved). Sizes with symbols are priced at 1.

The memory budget (``memory_budget``: ``mlpack build --memory-budget``, the ``memory_budget``
keyword of ``build``) caps the bytes of the candidates kept materialized: they are kept in
order of what materializing saves per byte while they fit, the rest are recomputed. No budget
(the default) keeps every candidate the prices say to keep. MLPACK_DEBUG=1 logs each decision.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

from mlpack.codegen import debug
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr, substitute, walk
from mlpack.spec.ir.graph import Comprehension, Graph
from mlpack.codegen.passes.points import (CACHE_BYTES, MAX_TERMS, POINTS_IN_FLIGHT,
                                          contraction, point_span)
from mlpack.codegen.passes.sums import read_counts

MAX_UNROLL = MAX_TERMS     # deepest sum unrolled into a reader (the votes: 4)
MAX_FLOPS = 256            # a bigger body stays materialized: every reader would carry it
FLOPS_PER_BYTE = 4.0       # flops a core does in the time it streams a byte from memory
_COSTLY = {"exp": 8, "log": 8, "tanh": 8, "sigmoid": 8, "erf": 8, "sqrt": 4, "div": 4,
           "recip": 4, "pow": 16, "sin": 8, "cos": 8}

_BUDGET: list[int | None] = [None]


@contextlib.contextmanager
def memory_budget(nbytes: int | None):
    """Within the block, the pass keeps at most ``nbytes`` of its candidates materialized
    (None: no cap, the cost model alone decides)."""
    if nbytes is not None and nbytes < 0:
        from mlpack.spec.errors import InputError
        raise InputError(f"memory budget must be 0 bytes or more, not {nbytes}")
    old, _BUDGET[0] = _BUDGET[0], nbytes
    try:
        yield
    finally:
        _BUDGET[0] = old


def parse_bytes(text: str) -> int:
    """'512MB', '1.5GiB', '4096' -> bytes (K, M, G, T: powers of 1000; Ki, Mi, Gi, Ti: 1024)."""
    from mlpack.spec.errors import InputError
    s = text.strip().upper().removesuffix("B")
    scale = 1
    for suffix, mult in (("KI", 1 << 10), ("MI", 1 << 20), ("GI", 1 << 30), ("TI", 1 << 40),
                         ("K", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
        if s.endswith(suffix):
            s, scale = s[:-len(suffix)], mult
            break
    try:
        value = float(s)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise InputError(f"memory budget {text!r}: expected bytes, like 4096, 512MB or 1.5GiB")
    return int(value * scale)


def as_bytes(value) -> int | None:
    """A budget as given (None, an int of bytes, or a string for ``parse_bytes``) in bytes."""
    if value is None or isinstance(value, int):
        return value
    return parse_bytes(str(value))


def _count(dims) -> int:
    """Elements of ``dims``, their symbols estimated at 1 (both prices scale alike with a batch
    symbol)."""
    n = 1
    for s in dims.values():
        n *= ex.value_at_one(s)
    return n


def _flops(body: Expr) -> int:
    """Arithmetic in a scalar body (index arithmetic is free: it is the loops' own)."""
    return sum(_COSTLY.get(n.op, 1) for n in walk(body)
               if n.op not in ex.LEAVES and n.op not in ("read", "cast", "select")
               and n.dtype not in (dt.INDEX, "bool"))


def _streamed(p: Comprehension, g: Graph) -> int:
    """Bytes of ``p``'s operands that one evaluation of all of ``p`` streams from memory: each
    tensor it reads that is bigger than CACHE_BYTES."""
    total = 0
    for t in {n.arg[0] for n in walk(p.body) if n.op == "read"}:
        if t in g.types:
            nbytes = _count(g.types[t].dims) * dt.bits(g.types[t].dtype) // 8
            total += nbytes if nbytes > CACHE_BYTES else 0
    return total


def written_out(p, limit: int = MAX_UNROLL) -> Expr | None:
    """``p``'s body as one expression over its output dims: a map's body, or a sum of at most
    ``limit`` constant terms written out term by term (k = 0, 1, ...). ``p``: a Comprehension,
    or a cpu Kernel (the same ``body``, ``reduce`` and ``rdims``)."""
    if p.reduce is None:
        return p.body
    if p.reduce != "sum" or not all(s.is_const for s in p.rdims.values()):
        return None
    terms = [{}]
    for d, s in p.rdims.items():
        terms = [{**t, d: ex.const(i)} for t in terms for i in range(s.value)]
    if not 1 <= len(terms) <= limit:
        return None
    out = None
    for t in terms:
        term = substitute(p.body, t)
        out = term if out is None else ex.add(out, term)
    return out


@dataclass
class Candidate:
    op: Comprehension
    inline: Expr              # the body, unrolled
    readers: list[Comprehension]
    nbytes: int
    recompute: float          # flops recomputing adds
    materialize: float        # flop-equivalents materializing costs (memory traffic)
    per_read: int             # flops per recomputed element
    reads: int
    span: object = None       # points.Span: kept one point at a time, never whole

    @property
    def kept(self) -> int:   # bytes materializing keeps (a span's: what its points take)
        return self.nbytes if self.span is None else self.span.point_bytes * POINTS_IN_FLIGHT

    @property
    def saving(self) -> float:   # what materializing saves over recomputing, per byte kept
        return (self.recompute - self.materialize) / max(self.kept, 1)


def _candidates(g: Graph) -> list[Candidate]:
    _, pinned = read_counts(g)
    readers: dict[str, list[Comprehension]] = defaultdict(list)
    sites: dict[str, set] = defaultdict(set)   # distinct (reader, index) pairs per tensor
    refused: set[str] = set(pinned)
    for op in g.ops:
        if not isinstance(op, Comprehension):
            continue
        for n in walk(op.body):
            if n.op != "read":
                continue
            t = n.arg[0]
            if n.arg[2] is not None or contraction(op):
                refused.add(t)
            if not any(r is op for r in readers[t]):
                readers[t].append(op)
            sites[t].add((id(op), n.args, n.arg[1]))
    found = []
    by_id = {id(op): op for op in g.ops}
    for p in g.ops:
        if not isinstance(p, Comprehension) or p.out in refused or not readers.get(p.out):
            continue
        if len(sites[p.out]) < 2 or (p.reduce is None and _flops(p.body) == 0):
            continue   # one read (fuse and sums take those), or a copy or concatenation (its
            # parts are materialized anyway; the cpu target writes them into it in place)
        inline = written_out(p)
        if inline is None:
            continue
        nbytes = _count(p.type.dims) * dt.bits(p.type.dtype) // 8
        per_read = _flops(inline)
        if per_read > MAX_FLOPS:
            continue
        reads = len(sites[p.out])
        own = _count(p.type.dims)
        evaluations = sum(_count(by_id[r].loop_dims) for r, _, _ in sites[p.out])
        extra = (evaluations - own) * per_read
        extra += (evaluations - own) / max(own, 1) * _streamed(p, g) * FLOPS_PER_BYTE
        traffic = 0.0 if nbytes <= CACHE_BYTES else nbytes * (1 + reads) * FLOPS_PER_BYTE
        span = point_span(g, p.out) if traffic else None
        if span is not None:   # held one point at a time, in cache (points.py)
            traffic = 0.0
        found.append(Candidate(p, inline, readers[p.out], nbytes, float(extra), traffic,
                               per_read, reads, span))
    return found


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n} {unit}"


def _inline(e: Expr, name: str, body: Expr) -> Expr:
    """``e`` with each read of ``name`` replaced by ``body`` at the read's index."""
    if e.op == "read" and e.arg[0] == name:
        index = {d: _inline(a, name, body) for d, a in zip(e.arg[1], e.args)}
        return substitute(body, index)
    if not e.args:
        return e
    args = tuple(_inline(a, name, body) for a in e.args)
    return e if args == e.args else ex.rebuild(e, args)


def _describe(c: Candidate) -> str:
    held = "" if c.span is None else (f", one point of ({', '.join(c.span.dims)}) at a time: "
                                      f"{_human(c.span.point_bytes, 'B')} each")
    return (f"{c.op.out} ({_human(c.nbytes, 'B')}; {c.per_read} flops per element, read at "
            f"{c.reads} places: recomputing costs {_human(c.recompute, 'flop')}, materializing "
            f"moves {_human(c.materialize / FLOPS_PER_BYTE, 'B')}{held})")


def _pick(cands: list[Candidate], budget: int | None) -> tuple[Candidate, str] | None:
    """The next tensor to recompute: the one recomputing saves most on, else, while the
    candidates kept exceed the budget, the one that costs least per byte freed."""
    cheaper = [c for c in cands if c.recompute < c.materialize]
    if cheaper:
        return max(cheaper, key=lambda c: c.materialize - c.recompute), "cheaper"
    kept = sum(c.kept for c in cands)
    if budget is not None and kept > budget:
        c = min(cands, key=lambda c: c.saving)
        return c, (f"materialized candidates would take {_human(kept, 'B')}, over the memory "
                   f"budget of {_human(budget, 'B')}")
    return None


def recompute_intermediates(g: Graph) -> Graph:
    """One tensor at a time, priced again after each (an inlined body changes its readers'
    costs), until no candidate is cheaper to recompute and what is kept fits the budget."""
    budget = _BUDGET[0]
    while True:
        cands = _candidates(g)
        pick = _pick(cands, budget)
        if pick is None:
            break
        c, why = pick
        debug.log(f"recompute {_describe(c)} into {', '.join(r.out for r in c.readers)}: {why}")
        for op in c.readers:
            op.body = _inline(op.body, c.op.out, c.inline)
        g.ops = [o for o in g.ops if o is not c.op]
        del g.types[c.op.out]
    for c in cands:
        debug.log(f"materialize {_describe(c)}")
    return g
