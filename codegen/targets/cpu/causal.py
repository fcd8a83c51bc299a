"""Causal row blocks: a block of query rows reads only the keys up to its last row.

A decoder's attention adds a mask to its scores that is hugely negative wherever a key comes
after its query (GPT-2: ``where(key <= query, 0, finfo(float32).min)``, built from two Ranges).
Past the query, a score plus the mask is at most about -1e9, its exponential exactly 0: it
changes neither the row max (the key equal to the query is kept, finite), nor the row sum, nor P.V.
So a row block (rowblocks.py) of queries [m0, m1) needs the keys [0, m1) only: its Q.K^T
computes the N tiles up to m1, its maps and reductions over the keys stop there, and P.V's K
loop too; about half of the attention's work is skipped, at any sequence length.

``causal_keys`` proves it from the span's ops, as the reference would compute them: every
tensor of the span along its key dim is classed, for the keys past the query and for those up
to it, as "neg" (at most MASKED plus a finite value), "zero", "any" (a finite value of the
computation) or "wild" (data that may be a mask of its own), by its op's body (``_Classes``).
A read of a tensor outside the span (the mask, or what computes it) is inlined through the
maps that produce it and folded with the key put past the query (``key = $q + 1 + $t``,
``query = $q`` for size symbols ``$q, $t >= 0``: comparisons of sizes fold) and then up to it
(``key = $q - $t``): a constant each way, else "any" or "wild". Then the skipped keys change
nothing where each reduction over the keys is a max of "neg" values whose kept keys are "any"
or "zero" (the row's max is a kept score), or a sum (a P.V contraction, too) of "zero" terms,
and no tensor with a key dim is read after the span. Anything else, a mask that depends on the
inputs (padding, which may mask a whole row) included, keeps the block whole.
"""

from __future__ import annotations

import math

from mlpack.codegen.passes.points import op_reads
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph

KEYS = "@keys"    # the size symbol a member's bounded loops read: the block's key count
# a mask at most this much makes a score's exponential exactly 0 (exp underflows below -104;
# a score would have to pass 1e8 to bring it back: an overflow already): finfo.min, -inf and
# the -1e9 of masked_fill all are
MASKED = -1e9
INLINE_DEPTH = 24          # producers inlined into one read at most ...
INLINE_NODES = 4000        # ... and nodes of the inlined expression
_PAST = "@past"            # the size symbol that puts a key past its query (module docstring)
_QUERY = "@query"          # ... and the query's


def causal_keys(g: Graph, ops: tuple[str, ...], rows: tuple[str, ...], block: tuple[str, ...],
                read_after: set[str]) -> dict[str, str] | None:
    """{tensor: its key dim} of the span's tensors along the keys, for the row block of ``ops``
    (in graph order, the first the scores' contraction) whose rows are ``rows``, ``block``
    among them (one query dim), where its keys past each block's last query can be skipped
    (module docstring); else None. ``read_after``: the tensors read outside the span, by any
    op (a procedure's too) or as a graph output."""
    if len(block) != 1:
        return None
    producers = g.producers()
    first = producers[ops[0]]
    keys = [d for d in first.type.dims if d not in rows]
    if len(keys) != 1:
        return None
    key_dim = {ops[0]: keys[0]}   # each span tensor's key dim
    classes = {ops[0]: ("any", "any")}   # (past the query, up to it)
    query = block[0]
    for t in ops[1:]:
        op = producers[t]
        kv = key_var(op.body, key_dim)
        if kv is False:
            return None
        if kv is None:
            continue   # (reads no key: the division of P.V by the row sums)
        cls = _Classes(g, producers, set(ops), key_dim, classes, kv, query)
        past, kept = cls.of(op.body, "past"), cls.of(op.body, "kept")
        if op.reduce is None:
            if kv not in op.type.dims:
                return None
            key_dim[t] = kv
            classes[t] = (past, kept)
            continue
        if kv not in op.rdims:
            return None
        if op.reduce == "max" and not (past == "neg" and kept in ("any", "zero")):
            return None
        if op.reduce == "sum" and past != "zero":
            return None
        if op.reduce not in ("max", "sum"):
            return None
    if any(t in read_after for t in key_dim):
        return None
    if not any(c[0] != "any" for c in classes.values()):
        return None
    return key_dim


def key_var(body: Expr, key_dim: dict[str, str]) -> str | bool | None:
    """The one var ``body`` reads every tensor of ``key_dim`` at along its key dim (an output
    dim, or an rdim); None where it reads none, False where it reads one at anything but a
    var or at two different vars."""
    seen = set()
    for r in ex.reads(body):
        t, dims = r.arg[0], r.arg[1]
        if t in key_dim:
            ix = r.args[dims.index(key_dim[t])]
            if ix.op != "var":
                return False
            seen.add(ix.arg)
    if not seen:
        return None
    return seen.pop() if len(seen) == 1 else False


class _Classes:
    """The class of an expression of one op of the span for the keys past the query or up to it
    (the module docstring): "neg" (at most MASKED plus a finite value), "zero", "any" (a
    finite value of the computation), "wild" (a value of the data, which may be a mask of its
    own: a graph input, a select of a hugely negative constant), or None (not known)."""

    def __init__(self, g, producers, span: set[str], key_dim, classes, kv: str, query: str):
        self.g, self.producers, self.span = g, producers, span
        self.key_dim, self.classes, self.kv, self.query = key_dim, classes, kv, query
        self.inputs = {p.name for p in g.inputs}

    def of(self, e: Expr, region: str) -> str | None:
        op = e.op
        if op == "const":
            return _const_class(e.value)
        if op == "read":
            return self._read(e, region)
        args = [self.of(a, region) for a in e.args]
        if None in args:
            return None
        if op == "cast" and ex.dt.is_float(e.dtype) and ex.dt.is_float(e.args[0].dtype):
            return args[0]
        if op == "exp":
            return "zero" if args[0] == "neg" else "any"
        if op == "add" or op == "sub" and args[1] != "neg":
            if "neg" in args:   # (two hugely negative values may add to -inf: exp is 0 still)
                return "neg" if "wild" not in args else None
            return "zero" if args == ["zero", "zero"] else _plain(args)
        if op == "mul" and "neg" not in args and "zero" in args:
            return "zero"
        if op == "div" and args[0] == "zero" and self._row_sum(e.args[1]):
            return "zero"   # (a sum of exponentials: at least the max's, 1)
        if op == "select" and args[1] == args[2]:
            return args[1]
        if "neg" not in args and op not in ("max", "min"):
            return _plain(args)
        return None

    def _row_sum(self, e: Expr) -> bool:
        """Whether ``e`` reads a row's sum over the keys of the span's ``exp(s - max)`` (at
        least 1: the max's own term), by which a zero divides to zero."""
        if e.op != "read" or e.arg[0] not in self.span:
            return False
        total = self.producers[e.arg[0]]
        if total.reduce != "sum" or total.body.op != "read" or total.body.arg[0] not in self.span:
            return False
        x = self.producers[total.body.arg[0]].body
        if x.op != "exp" or x.args[0].op != "sub" or x.args[0].args[1].op != "read":
            return False
        top = x.args[0].args[1].arg[0]
        return top in self.span and self.producers[top].reduce == "max"

    def _read(self, e: Expr, region: str) -> str | None:
        t = e.arg[0]
        if t in self.span:
            if t not in self.key_dim:
                return "any"   # a row's value (its max or sum)
            return self.classes[t][0 if region == "past" else 1]
        if self.kv not in ex.free_vars(e):
            return "any"
        folded = _fold(_inline(e, self.g, self.producers, self.span), self._at(region))
        if folded is None:
            return None
        if folded.is_const:
            return _const_class(folded.value)
        # a value of the computation: "any", unless it may be a mask of its own (a graph
        # input's padding, or a hugely negative constant chosen by data): "wild"
        for n in ex.walk(folded):
            if n.op == "read" and n.arg[0] in self.inputs or n.op == "const" and \
                    _const_class(n.value) == "neg":
                return "wild"
        return "any"

    def _at(self, region: str) -> dict[str, Expr]:
        # (the query a size symbol too, >= 0 as an index is: sizes' differences fold)
        q = ex.sym(_QUERY)
        return {self.query: q, self.kv: q + 1 + ex.sym(_PAST) if region == "past"
                else q - ex.sym(_PAST)}


def _plain(args: list[str]) -> str:
    """The class of a value computed from values of these classes, none of them "neg"."""
    return "wild" if "wild" in args else "any"


def _const_class(v) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
        return None
    if v <= MASKED:
        return "neg"
    return "zero" if v == 0 else "any"


def _inline(e: Expr, g: Graph, producers, span: set[str], depth: int = 0) -> Expr | None:
    """``e`` with every read of a map outside ``span`` replaced by its body, and every read of a
    one-element constant by its value; None past INLINE_DEPTH or INLINE_NODES."""
    if depth > INLINE_DEPTH:
        return None
    if e.op == "read":
        t, dims = e.arg[0], e.arg[1]
        c = g.constants.get(t)
        if c is not None and c.data.size == 1:
            return ex.const(c.data.item(), e.dtype)
        op = producers.get(t)
        if isinstance(op, Comprehension) and op.reduce is None and t not in span:
            body = ex.substitute(op.body, dict(zip(dims, e.args)))
            return _inline(body, g, producers, span, depth + 1)
        return e
    if not e.args:
        return e
    args = []
    for a in e.args:
        a = _inline(a, g, producers, span, depth)
        if a is None:
            return None
        args.append(a)
    out = ex.rebuild(e, tuple(args))
    return out if sum(1 for _ in ex.walk(out)) <= INLINE_NODES else None


def _fold(e: Expr | None, at: dict[str, Expr]) -> Expr | None:
    """``e`` with ``at`` substituted, its logic folded where constants decide it."""
    if e is None:
        return None
    e = ex.substitute(e, at)
    return _logic(e)


def _logic(e: Expr) -> Expr:
    if not e.args:
        return e
    args = tuple(_logic(a) for a in e.args)
    consts = [a.value for a in args if a.is_const]
    if e.op in ("and", "or") and consts:
        if e.op == "and" and False in consts or e.op == "or" and True in consts:
            return ex.const(e.op == "or")
        rest = [a for a in args if not a.is_const]
        return rest[0] if len(rest) == 1 else ex.const(e.op == "and")
    if e.op == "not" and consts:
        return ex.const(not consts[0])
    return ex.rebuild(e, args)


__all__ = ["KEYS", "causal_keys", "key_var"]
