"""Unflatten output dims that a Reshape flattened: ``m < B*S`` read only as ``m // S, m % S``.

A transformers model that runs a linear layer through ``x.view(-1, hidden)`` (GPT-2's Conv1D,
and every ``addmm`` over a flattened batch and sequence) gives a contraction whose output rows
are ``m`` over ``$batch * $sequence``, reading its input at ``[m // $sequence, m % $sequence, k]``.
That index is not affine in ``m``, so the cpu target cannot run the contraction as a GEMM (its
rows would be found by division), and its readers index it back at ``d0 * $sequence + d1``.
Splitting ``m`` into two dims of the same memory order, ``m_hi < B`` and ``m_lo < S``, makes
both sides affine: the op's body reads ``[m_hi, m_lo, k]``, and a reader's index ``e`` becomes
``e // S, e % S``, which is ``d0, d1`` for ``e = d0 * S + d1`` with ``d1 < S``. The tensor keeps
its bytes (row-major order is unchanged), so only index arithmetic moves.

It runs after split_dims, which simplifies the quotients a chain of Reshapes leaves (ViT-B/16's
``(768 * m + k) // 64 // 12 % $batch`` is ``m % $batch`` there). A dim is split only when every
use of it in the op's body is one of the two quotients by the same divisor and its size is that
divisor times a whole size; tensors that are graph outputs or that a procedure reads keep their
type.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, Procedure, TensorType, tensors_read
from mlpack.codegen.passes.sums import fresh


def _divisor(body: Expr, m: str) -> Expr | None:
    """The one divisor ``q`` such that ``m`` appears in ``body`` only as ``m // q`` and
    ``m % q`` (both), else None."""
    found: set = set()
    kinds: set = set()

    def walk(e: Expr) -> bool:   # False: m used some other way
        if e.op in ("floordiv", "mod") and e.args[0].op == "var" and e.args[0].arg == m:
            found.add(e.args[1])
            kinds.add(e.op)
            return m not in ex.free_vars(e.args[1])
        if e.op == "var":
            return e.arg != m
        return all(walk(a) for a in e.args)

    if not walk(body) or len(found) != 1 or kinds != {"floordiv", "mod"}:
        return None
    return next(iter(found))


def _quotients(e: Expr, q: Expr, ranges: dict[str, Expr]) -> tuple[Expr, Expr]:
    """(e // q, e % q), as ``a, b`` when ``e`` is ``a * q + b`` with a var ``b`` below ``q``."""
    if e.op == "add":
        for hi, lo in (e.args, e.args[::-1]):
            if lo.op == "var" and ex.same_size(ranges.get(lo.arg, ex.const(-1)), q) \
                    and hi.op == "mul":
                x, y = hi.args
                a = x if ex.same_size(y, q) else y if ex.same_size(x, q) else None
                if a is not None:
                    return a, lo
    return ex.floordiv(e, q), ex.mod(e, q)


def _replace_quotients(e: Expr, m: str, hi: str, lo: str) -> Expr:
    """``e`` with ``m // q`` as the var ``hi`` and ``m % q`` as ``lo`` (q: ``_divisor``'s)."""
    if e.op in ("floordiv", "mod") and e.args[0].op == "var" and e.args[0].arg == m:
        return ex.var(hi if e.op == "floordiv" else lo)
    if not e.args:
        return e
    args = tuple(_replace_quotients(a, m, hi, lo) for a in e.args)
    return e if args == e.args else ex.rebuild(e, args)


def _reindex(e: Expr, tensor: str, m: str, q: Expr, hi: str, lo: str, ranges) -> Expr:
    """``e`` with each read of ``tensor`` indexing ``hi, lo`` where it indexed ``m``."""
    if not e.args and e.op != "read":
        return e
    args = tuple(_reindex(a, tensor, m, q, hi, lo, ranges) for a in e.args)
    if e.op == "read" and e.arg[0] == tensor:
        index = {}
        for d, ix in zip(e.arg[1], args):
            if d == m:
                index[hi], index[lo] = _quotients(ix, q, ranges)
            else:
                index[d] = ix
        return ex.read(tensor, index, e.dtype, e.arg[2])
    return e if args == e.args else ex.rebuild(e, args)


def unflatten_dims(g: Graph) -> Graph:
    keep = {p.name for p in g.outputs}
    for op in g.ops:
        if isinstance(op, Procedure):
            keep |= tensors_read(op)
    for i, op in enumerate(g.ops):
        if not isinstance(op, Comprehension) or op.out in keep:
            continue
        for m, size in list(op.type.dims.items()):
            q = _divisor(op.body, m)
            if q is None:
                continue
            p = ex.simplify_size(ex.floordiv(size, q))
            if not ex.same_size(ex.simplify_size(p * q), size) or p.op == "floordiv":
                continue
            taken = set(op.loop_dims) | ex.free_vars(op.body)
            hi = fresh(f"{m}_hi", taken)
            lo = fresh(f"{m}_lo", taken | {hi})
            dims: dict[str, Expr] = {}
            for d, s in op.type.dims.items():
                if d == m:
                    dims[hi], dims[lo] = p, q
                else:
                    dims[d] = s
            op = replace(op, type=TensorType(op.type.dtype, dims),
                         body=_replace_quotients(op.body, m, hi, lo))
            g.ops[i] = op
            g.types[op.out] = op.type
            for j in range(i + 1, len(g.ops)):
                r = g.ops[j]
                if isinstance(r, Comprehension) and op.out in tensors_read(r):
                    ranges = dict(r.loop_dims)
                    g.ops[j] = replace(r, body=_reindex(r.body, op.out, m, q, hi, lo, ranges))
            break
    return g
