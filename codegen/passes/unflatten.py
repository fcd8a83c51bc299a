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

A dim of constant size may also be used whole beside its quotients: a grouped convolution's
output ``[n, g, co, h, w]`` is read back as ``[n, c // 8, c % 8, h, w]`` by its bias and
activation, which read the bias at ``b[c]``. The map is then split too (a whole use of ``c``
becomes ``8 * c_hi + c_lo``), so it reads the convolution at the identity index and joins its
epilogue (kernels.py), and the tensor's readers reindex it the same way: a map reader with its
own quotients is split in turn, a reduction over ``c`` is split by split_dims' rule (the next
1x1 convolution's input channels become two K dims). Such a split is made only where every
reader can take it, so no reader is left dividing where it read an index whole.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, Procedure, TensorType, tensors_read
from mlpack.codegen.passes.affine import const_ranges, simplify_reads
from mlpack.codegen.passes.split_dims import SPLIT_REDUCTIONS, split_reduction
from mlpack.codegen.passes.sums import fresh


def _divisor(body: Expr, m: str) -> tuple[Expr, bool] | None:
    """(q, whether ``m`` is also used whole) for the one divisor ``q`` such that ``m`` appears
    in ``body`` as ``m // q`` and ``m % q`` (both), else None."""
    found: set = set()
    kinds: set = set()

    def walk(e: Expr) -> bool:   # False: m divided by something that depends on it
        if e.op in ("floordiv", "mod") and e.args[0].op == "var" and e.args[0].arg == m:
            found.add(e.args[1])
            kinds.add(e.op)
            return m not in ex.free_vars(e.args[1])
        if e.op == "var":
            if e.arg == m:
                kinds.add("whole")
            return True
        return all(walk(a) for a in e.args)

    if not walk(body) or len(found) != 1 or not {"floordiv", "mod"} <= kinds:
        return None
    return next(iter(found)), "whole" in kinds


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


def _reads_by_tensor(g: Graph) -> dict[str, list[int]]:
    """Each tensor's reading comprehensions, by index in order. The pass replaces ops in place
    and a rewritten reader reads the same tensors, so this holds while it runs (asking every
    later op for each tensor was quadratic: 3 of Swin-T's 13 s of a warm rebuild)."""
    out: dict[str, list[int]] = {}
    for j, op in enumerate(g.ops):
        if isinstance(op, Comprehension):
            for t in tensors_read(op):
                out.setdefault(t, []).append(j)
    return out


def _readers(reads: dict[str, list[int]], i: int, tensor: str) -> list[int]:
    """Indices of the comprehensions after op ``i`` that read ``tensor`` (``reads``:
    ``_reads_by_tensor``)."""
    return [j for j in reads.get(tensor, ()) if j > i]


def _absorbs(g: Graph, j: int, tensor: str, m: str, q: Expr, keep: set[str],
             reads: dict[str, list[int]]) -> bool:
    """Whether reader ``g.ops[j]`` indexes ``tensor``'s dim ``m`` so that a split leaves it
    affine: as ``a * q + b`` (``_quotients``), or with a whole var the reader splits in turn
    (a reduction dim of constant size, or a dim of its own output whose readers all absorb
    that split)."""
    r = g.ops[j]
    ranges = dict(r.loop_dims)
    for n in ex.walk(r.body):
        if n.op != "read" or n.arg[0] != tensor:
            continue
        ix = dict(zip(n.arg[1], n.args))[m]
        if _quotients(ix, q, ranges)[0].op != "floordiv":
            continue
        if ix.op != "var":
            return False
        if ix.arg in r.rdims:
            if not r.rdims[ix.arg].is_const or r.reduce not in SPLIT_REDUCTIONS:
                return False
        elif r.out in keep or _divisor(r.body, ix.arg) is not None or not all(
                _absorbs(g, k, r.out, ix.arg, q, keep, reads) for k in _readers(reads, j, r.out)):
            return False
    return True


def unflatten_dims(g: Graph) -> Graph:
    keep = {p.name for p in g.outputs}
    for op in g.ops:
        if isinstance(op, Procedure):
            keep |= tensors_read(op)
    reads = _reads_by_tensor(g)
    for i, op in enumerate(g.ops):
        if not isinstance(op, Comprehension) or op.out in keep:
            continue
        readers = _readers(reads, i, op.out)
        for m, size in list(op.type.dims.items()):
            found = _divisor(op.body, m)
            if found is None:
                continue
            q, whole = found
            p = ex.simplify_size(ex.floordiv(size, q))
            if not ex.same_size(ex.simplify_size(p * q), size) or p.op == "floordiv":
                continue
            if whole and not (size.is_const and q.is_const and all(
                    _absorbs(g, j, op.out, m, q, keep, reads) for j in readers)):
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
            body = _replace_quotients(op.body, m, hi, lo)
            if whole:
                body = ex.substitute(body, {m: ex.var(hi) * q + ex.var(lo)})
            op = replace(op, type=TensorType(op.type.dtype, dims), body=body)
            g.ops[i] = op
            g.types[op.out] = op.type
            for j in readers:
                r = g.ops[j]
                ranges = dict(r.loop_dims)
                r = replace(r, body=_reindex(r.body, op.out, m, q, hi, lo, ranges))
                # a reduction over the dim the reader walked whole splits too
                r.body = simplify_reads(r.body, const_ranges(r.loop_dims))
                split_reduction(r)
                g.ops[j] = r
            break
    return g
