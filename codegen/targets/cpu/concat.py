"""Concatenations written in place: each part computed straight into its slice of the result.

A Concat in the IR is a map whose body is a chain of selects on the concatenated dim ``c``,
``select(lt(c, 64), A(c), select(lt(c, 128), B(c - 64), C(c - 128)))``, and the fuse pass
inlines each part's elementwise producer (a bias and relu) into its arm. Run as written, the
concat is one more pass over its whole result, and the convolutions that feed it keep their
epilogues in the concat instead of in their own stores.

When ``c`` is the outermost dim of the result that is not of size 1, each part's slice is one
contiguous range of the result's memory. ``split_concats`` then replaces the map by one map per
arm (the arm with ``c`` shifted to start at 0) whose result is placed *inside* the
concatenation's buffer (an alias: parent, offset in elements). The arm maps are identity reads
of the convolutions that feed them, so ``build_kernels`` fuses them as those kernels'
epilogues; an arm that is a plain read of a tensor some kernel produces aliases that tensor
itself instead (DenseNet's growing concatenations then never copy). The plan places an alias
in its root's arena slot (plan.assign_arena) and the concatenation has no kernel of its own.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType
from mlpack.codegen.targets.cpu.indexing import is_one
from mlpack.codegen.targets.cpu.kernel import Buffer

Aliases = dict[str, tuple[str, int]]   # tensor -> (the tensor it lies in, offset in elements)


def select_arms(body: Expr, c: str, total: int) -> list[tuple[int, int, Expr]] | None:
    """(lo, hi, arm) of each part of a select chain on ``c``, or None if ``body`` is not one."""
    arms, lo, e = [], 0, body
    while e.op == "select":
        cond, arm, rest = e.args
        if not (cond.op == "lt" and cond.args[0].op == "var" and cond.args[0].arg == c
                and cond.args[1].is_const and lo < cond.args[1].value < total):
            return None
        hi = cond.args[1].value
        arms.append((lo, hi, arm))
        lo, e = hi, rest
    if not arms:
        return None
    arms.append((lo, total, e))
    return arms


def clamp_of(e: Expr) -> tuple[Expr, int] | None:
    """(x, hi) of a concatenation's clamp of its part's index, ``min(max(x, 0), hi)`` (both
    arms of its select may be evaluated), or None if ``e`` is not one."""
    if (e.op == "min" and e.args[1].is_const and e.args[0].op == "max"
            and e.args[0].args[1].is_const and e.args[0].args[1].value == 0):
        return e.args[0].args[0], e.args[1].value
    return None


def _unclamp(e: Expr, c: str, n: int) -> Expr:
    """``e`` with each ``min(max(c, 0), n - 1)`` (the concat's clamp, now always in range while
    ``c`` runs over [0, n)) replaced by ``c``."""
    clamp = clamp_of(e)
    if clamp is not None and clamp[1] == n - 1:
        inner = ex.simplify_size(clamp[0])
        if inner.op == "var" and inner.arg == c:
            return inner
    if not e.args:
        return e
    args = tuple(_unclamp(a, c, n) for a in e.args)
    return e if all(a is b for a, b in zip(args, e.args)) else ex.rebuild(e, args)


def _plain_read(arm: Expr, dims: dict[str, Expr], g: Graph) -> str | None:
    """The tensor ``arm`` reads whole, in the arm's own dim order, if it is just that read."""
    if arm.op != "read" or arm.arg[2] is not None:
        return None
    name = arm.arg[0]
    t = g.types.get(name)
    if t is None or t.dtype != arm.dtype:
        return None
    order = [d for d in dims if not is_one(dims[d])]
    index = dict(zip(arm.arg[1], arm.args))
    laid = []   # the arm's dims as the tensor's buffer lays them out (type order: plan.py)
    for d, size in t.dims.items():
        ix = index[d]
        if is_one(size) and ((ix.is_const and ix.value == 0)
                              or (ix.op == "var" and ix.arg in dims and is_one(dims[ix.arg]))):
            continue
        if ix.op != "var" or ix.arg not in dims or not ex.same_size(size, dims[ix.arg]):
            return None
        laid.append(ix.arg)
    return name if laid == order else None


def split_concats(g: Graph) -> tuple[Graph, Aliases, dict[str, Buffer]]:
    """``g`` with every in-place-able concatenation split into its arms (see the module
    docstring), the aliases, and the buffers of the concatenations (no op produces them now).
    ``g`` itself is not changed: it is shared by the targets of a build."""
    outputs = {p.name for p in g.outputs}
    producers = {o: op for op in g.ops for o in op.outs}
    aliases: Aliases = {}
    parents: dict[str, Buffer] = {}
    ops, types = [], dict(g.types)
    for op in g.ops:
        split = _split(op, g, outputs, producers, aliases) \
            if isinstance(op, Comprehension) else None
        if split is None:
            ops.append(op)
            continue
        arms, links = split
        for arm in arms:
            ops.append(arm)
            types[arm.out] = arm.type
        aliases.update(links)
        dims = op.type.dims
        parents[op.out] = Buffer(op.out, tuple(dims), dict(dims), op.type.dtype)
    if not aliases:
        return g, {}, {}
    return replace(g, ops=ops, types=types), aliases, parents


def _split(op: Comprehension, g: Graph, outputs, producers, aliases):
    """The arm maps of ``op`` and their aliases into it, or None."""
    dims = op.type.dims
    if op.reduce is not None or op.out in outputs or op.body.op != "select":
        return None
    if dt.bits(op.type.dtype) % 8 or not all(s.is_const for s in dims.values()):
        return None   # sub-byte elements have no byte offset; symbolic sizes: not attempted
    outer = [d for d in dims if not is_one(dims[d])]
    if not outer:
        return None
    c = outer[0]
    inner = math.prod(dims[d].value for d in outer[1:])
    arms = select_arms(op.body, c, dims[c].value)
    if arms is None:
        return None
    new, links = [], {}
    for i, (lo, hi, arm) in enumerate(arms):
        n = hi - lo
        body = _unclamp(ex.substitute(arm, {c: ex.var(c) + lo} if lo else {}), c, n)
        sub = dict(dims)
        sub[c] = ex.const(n)
        src = _plain_read(body, sub, g)
        if (src is not None and src not in aliases and src not in links and src not in outputs
                and isinstance(producers.get(src), Comprehension)):
            links[src] = (op.out, lo * inner)   # the producer writes into the slice itself
            continue
        name = f"{op.out}#{i}"
        new.append(Comprehension(name, TensorType(op.type.dtype, sub), body))
        links[name] = (op.out, lo * inner)
    return new, links


def root(t: str, aliases: Aliases) -> tuple[str, int]:
    """The tensor whose buffer ``t`` lies in, and ``t``'s offset in it (elements)."""
    off = 0
    while t in aliases:
        t, o = aliases[t]
        off += o
    return t, off


__all__ = ["split_concats", "root", "select_arms", "clamp_of", "Aliases"]
