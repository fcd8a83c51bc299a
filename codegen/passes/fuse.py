"""Elementwise fusion: inline a map comprehension into the comprehensions that read it.

A map (no reduction) ``%p[i] = f(...)`` read by a consumer at index ``e`` becomes ``f`` with
``i := e`` inside the consumer, and ``%p`` is no longer materialized. It is inlined when that
recomputes nothing: the producer is read exactly once in the whole graph by a read whose index
uses every loop var of its consumer (so each element is computed once: a GELU read by the
matmul after it, sum{k} gelu(%h[s,k]) * %W[k,n], would be recomputed for every n, and the
matmul would no longer be a product of two tensors), or its body is a single read (a copy,
which costs nothing to redo), or its body is cheap (adds, products, clamps: ``CHEAP``) and its
one consumer reads it at one index only, however many times (hardswish's ``x * clamp(x / 6 +
1/2)`` of a bias add: native code merges the repeated terms, and the convolution's epilogue then
takes the activation). A guarded read (``pad``) of a copy is
inlined too: it becomes the copy's own read, guarded with the consumer's pad, and when the copy
is not a plain renaming of its source's dims, a bounds test on the copy's dims selects the pad
(a convolution's padding over a reshaped input). Guarded reads of any other map are left alone:
the padding would have to guard every read inside the inlined body. Inlining repeats until
nothing more is inlined: a producer read by two consumers has one left once the other is
inlined into it (SiLU's Sigmoid into its Mul), and may then be inlined too.
"""

from __future__ import annotations

from collections import Counter

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr, rebuild, substitute, walk
from mlpack.spec.ir.graph import Comprehension, Graph, Procedure, tensors_read


# ops whose results are cheap enough to compute again where one consumer reads a producer
# more than once at the same index (LLVM's common subexpressions merge them in native code)
CHEAP = frozenset({"read", "const", "var", "add", "sub", "mul", "neg", "max", "min"})


def _cheap(op: Comprehension) -> bool:
    return all(n.op in CHEAP for n in walk(op.body))


def _read_counts(g: Graph) -> tuple[Counter, set[str], set[str], set[str], set[str]]:
    """Reads per tensor, the tensors that must stay (outputs, procedure inputs), the tensors
    read with a guard (only a copy may still be inlined there), the tensors some consumer
    reads more than once per element (an index that leaves out one of its loop vars), and the
    tensors one consumer only reads, always at the same unguarded index (hardswish's ``x *
    clamp(x / 6 + 1/2, 0, 1)``: inlining a cheap producer there computes each of its elements
    once per consumer element, like a single read does)."""
    counts: Counter = Counter()
    pinned: set[str] = {p.name for p in g.outputs}
    guarded: set[str] = set()
    reused: set[str] = set()
    sites: dict[str, set] = {}   # tensor -> (reader, index) of each of its reads
    for op in g.ops:
        if isinstance(op, Procedure):
            pinned |= tensors_read(op)
            continue
        # a loop var of constant size 1 only ever takes the value 0, so a read indexing that
        # dim with the constant 0 (broadcast imports write n=0) still reads each element once
        loop_vars = {d for d, s in op.loop_dims.items() if not (s.is_const and s.value == 1)}
        for n in walk(op.body):
            if n.op == "read":
                counts[n.arg[0]] += 1
                sites.setdefault(n.arg[0], set()).add((op.out, n.args))
                if n.arg[2] is not None:
                    guarded.add(n.arg[0])
                used = {v.arg for a in n.args for v in walk(a) if v.op == "var"}
                if not loop_vars <= used:
                    reused.add(n.arg[0])
    one_site = {t for t, s in sites.items() if len(s) == 1 and t not in guarded}
    return counts, pinned, guarded, reused, one_site


def _renames_dims(p: Comprehension, g: Graph) -> bool:
    """Whether the copy ``p`` reads its source at a permutation of its own dims, each dim of
    the same size: then an index is in ``p``'s range exactly when it is in the source's."""
    src = p.body
    src_type = g.types[src.arg[0]]
    seen = set()
    for d, ix in zip(src.arg[1], src.args):
        if (ix.op != "var" or ix.arg in seen or ix.arg not in p.type.dims
                or not ex.same_size(p.type.dims[ix.arg], src_type.dims[d])):
            return False
        seen.add(ix.arg)
    return len(seen) == len(p.type.dims)


def _guarded_copy(e: Expr, p: Comprehension, index: dict[str, Expr], renames: bool) -> Expr:
    """``p[index; pad]`` for a copy ``p``, written as a guarded read of p's source."""
    pad = e.arg[2]
    src = substitute(p.body, index)
    t, dims, src_pad = src.arg
    if renames:
        return Expr("read", src.args, (t, dims, pad), src.dtype)
    # the source read must not fail where the test below discards it, so it is guarded too
    inner = Expr("read", src.args, (t, dims, pad if src_pad is None else src_pad), src.dtype)
    cond = None
    for d, ix in index.items():
        ok = ex.binary("and", ex.binary("ge", ix, ex.const(0)), ex.binary("lt", ix, p.type.dims[d]))
        cond = ok if cond is None else ex.binary("and", cond, ok)
    return ex.select(cond, inner, ex.const(pad, e.dtype)) if cond is not None else inner


def _inline(e: Expr, producers: dict[str, Comprehension], renames=frozenset()) -> Expr:
    if e.op == "read" and e.arg[0] in producers:
        p = producers[e.arg[0]]
        index = {d: _inline(a, producers, renames) for d, a in zip(e.arg[1], e.args)}
        if e.arg[2] is not None:  # only copies are inlinable under a guard
            return _inline(_guarded_copy(e, p, index, p.out in renames), producers, renames)
        return _inline(substitute(p.body, index), producers, renames)
    if not e.args:
        return e
    args = tuple(_inline(a, producers, renames) for a in e.args)
    return e if args == e.args else rebuild(e, args)


def fuse_elementwise(g: Graph) -> Graph:
    # (until nothing more is inlined: a producer read by two consumers, one of which is
    # inlined into the other, is read by one consumer after the round: SiLU's ``x *
    # sigmoid(x)`` of a bias add, imported as a Sigmoid and a Mul, reads the bias add at one
    # index only once the Sigmoid is in the Mul, and the convolution then takes both as its
    # epilogue; EfficientNet's expand convolutions ran their SiLU as a kernel of its own)
    while _fuse_round(g):
        pass
    return g


def _fuse_round(g: Graph) -> bool:
    """One round of inlining (module docstring); whether it inlined anything."""
    counts, pinned, guarded, reused, one_site = _read_counts(g)
    inlinable: dict[str, Comprehension] = {}
    renames: set[str] = set()
    # a guarded read of a copy becomes a guarded read of its source: propagate (consumers
    # come after their producers, so one backward sweep reaches the chain's start)
    for op in reversed(g.ops):
        if (isinstance(op, Comprehension) and op.out in guarded and op.reduce is None
                and op.body.op == "read" and op.out not in pinned):
            guarded.add(op.body.arg[0])
    # a copy is inlined wherever it is read, so what it copies is read there too: a copy read
    # more than once per element of its reader (GPT-2's Cast of the softmax, read by P.V for
    # each of its 64 columns) makes its source reused (else the softmax's exp was inlined
    # through it into the matmul, computed 64 times per element and no GEMM)
    for op in reversed(g.ops):
        if (isinstance(op, Comprehension) and op.reduce is None and op.body.op == "read"
                and op.out not in pinned and (op.out in reused or counts[op.out] > 1)):
            reused.add(op.body.arg[0])
    for op in g.ops:
        if not isinstance(op, Comprehension) or op.reduce is not None or op.out in pinned:
            continue
        if op.out in guarded and op.body.op != "read":
            continue
        once = counts[op.out] == 1 or (op.out in one_site and _cheap(op))
        if (once and op.out not in reused) or op.body.op == "read":
            inlinable[op.out] = op
            if op.body.op == "read" and _renames_dims(op, g):
                renames.add(op.out)
    if not inlinable:
        return False
    kept = []
    for op in g.ops:
        if isinstance(op, Comprehension):
            if op.out in inlinable:
                continue
            op.body = _inline(op.body, inlinable, renames)
        kept.append(op)
    # an inlined producer may itself have read an inlined one: _inline recurses, so all gone
    for name in inlinable:
        del g.types[name]
    g.ops = kept
    return True
