"""Sum of sums: a reduction over a reduction of the same kind becomes one reduction.

    %v[b, r, o] = sum{k} f(b, r, o, k)
    %s[b, o]    = sum{r} %v[b, r, o]          ->   %s[b, o] = sum{r, k} f(b, r, o, k)

Frameworks write a contraction over several axes as a batched MatMul (over one axis) whose
result is then summed over the others (ReduceSum), which materializes the whole product (the
"votes" of a capsule layer). Merging the two loops computes the same sum without it. The inner
comprehension must be read once (so nothing else needs it), not be a graph output, and be read
unguarded; its output dims are replaced by the outer read's index and its reduction dims are
renamed where they clash with the outer loop's. For ``sum`` the outer body may multiply the
read by other factors (they distribute over the inner sum); for ``prod``, ``max`` and ``min``
it must be the read alone. Only a read whose index uses every outer loop var merges: otherwise
the outer loop reads each inner element several times and the merged loop would recompute it. Floating-point sums are reassociated, as any contraction order is.
"""

from __future__ import annotations

from collections import Counter

from mlpack.spec.ir.expr import Expr, substitute, var, walk
from mlpack.spec.ir.graph import Comprehension, Graph, Procedure, tensors_read

_MERGEABLE = ("sum", "prod", "max", "min")


def read_counts(g: Graph) -> tuple[Counter, set[str]]:
    """How often comprehensions read each tensor, and the tensors that must stay materialized
    (graph outputs and whatever a procedure reads)."""
    counts: Counter = Counter()
    pinned = {p.name for p in g.outputs}
    for op in g.ops:
        if isinstance(op, Procedure):
            pinned |= tensors_read(op)
        else:
            for n in walk(op.body):
                if n.op == "read":
                    counts[n.arg[0]] += 1
    return counts, pinned


def fresh(name: str, taken) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    return out


def _factor_read(body: Expr, reduce: str, inner: dict[str, Comprehension]) -> Expr | None:
    """The read of a mergeable inner comprehension that is the body, or (for sum) a factor."""
    if body.op == "read" and body.arg[0] in inner:
        return body
    if reduce == "sum" and body.op == "mul":
        for a in body.args:
            hit = _factor_read(a, reduce, inner)
            if hit is not None:
                return hit
    return None


def _replace(e: Expr, old: Expr, new: Expr) -> Expr:
    if e is old or e == old:
        return new
    if e.op != "mul":
        return e
    return Expr("mul", tuple(_replace(a, old, new) for a in e.args), e.arg, e.dtype)


def merge(outer: Comprehension, inner: Comprehension, at: Expr) -> None:
    """Make ``outer`` compute ``inner`` in place of its read ``at`` (mutates outer)."""
    taken = set(outer.loop_dims) | {n.arg for n in walk(outer.body) if n.op == "var"}
    renames: dict[str, Expr] = {}
    rdims = dict(outer.rdims)
    for k, size in inner.rdims.items():
        new = fresh(k, taken)
        taken.add(new)
        renames[k] = var(new)
        rdims[new] = size
    renames.update(zip(at.arg[1], at.args))
    body = substitute(inner.body, renames)
    outer.body = _replace(outer.body, at, body)
    outer.rdims = rdims


def _reads_each_once(outer: Comprehension, at: Expr) -> bool:
    """Whether every loop var of ``outer`` (its output dims and its rdims) appears in the index
    of the read ``at``: then distinct iterations read distinct inner elements and merging costs
    no extra work. A read that ignores one of them reuses each inner element: merging a chain of
    two matmuls, sum{k} (sum{t} P[s,t] V[t,k]) * Wo[k,j], would redo the inner sum for every j,
    turning s*t*k + s*k*j multiply-adds into s*t*k*j."""
    used = {n.arg for a in at.args for n in walk(a) if n.op == "var"}
    return set(outer.loop_dims) <= used


def merge_sums(g: Graph) -> Graph:
    changed = True
    while changed:
        changed = False
        counts, pinned = read_counts(g)
        inner = {op.out: op for op in g.ops if isinstance(op, Comprehension)
                 and op.reduce in _MERGEABLE and counts[op.out] == 1 and op.out not in pinned}
        for op in g.ops:
            if not isinstance(op, Comprehension) or op.reduce not in _MERGEABLE:
                continue
            cands = {n: c for n, c in inner.items()
                     if c.reduce == op.reduce and c.type.dtype == op.type.dtype and c is not op}
            at = _factor_read(op.body, op.reduce, cands)
            if at is None or at.arg[2] is not None or not _reads_each_once(op, at):
                continue
            src = cands[at.arg[0]]
            merge(op, src, at)
            g.ops = [o for o in g.ops if o is not src]
            del g.types[src.out]
            changed = True
            break
    return g
