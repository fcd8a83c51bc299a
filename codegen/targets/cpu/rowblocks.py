"""Row blocks: attention run a block of query rows at a time, its scores never stored whole.

Whisper's encoder computes, per layer, scores S[n, head, x, x_1] = sum_k Q[..] K[..] (six
1500 x 1500 heads, 54 MB), their row max, exp(S - max) (54 MB more), the row sums, and
P.V = sum_x1 exp[.., x, x_1] V[..]. Op by op, each of these streams the scores through
memory: written by the first GEMM, read by the max, read and written by the exponentials,
read by the sums and by the second GEMM, about 270 MB a layer. Yet every op is per row
(n, head, x): a row of the scores is needed only by that row's max, exponentials, sum and
output. Run a block of B query rows at a time, one block's scores and exponentials (B rows of
1500) are written and re-read while they are in L2, and the score matrix is never stored.

``find_row_blocks`` finds such spans in the graph: from a contraction of two activations whose
output is bigger than MIN_BYTES (the scores), through every reader of each tensor the span
writes that is about as big (the exponentials), and the maps right after that read the span
(attention's division by the row sums). Every op of the span keeps some dims R among its
output dims and reads what the span writes at the plain var of each (n, head, x): the rows.
The contractions of the span each read R's *block dims* (x) from one operand only: a block of
rows is a block of their GEMMs' M, and the rest of R (n, head) is their batch.

The cpu target then (``group``) runs the span's kernels as one ``BlockTileKernel``: each
workgroup walks its share of the blocks (one M group of each GEMM of the span, at a batch
point: B rows, a multiple of every GEMM's tile height) and calls every member for that block's units: a GEMM member for the block's M group
(units: its N tiles), a row kernel (scheduled with R as its points: kernels.py) for the
block's rows. Members are told their units as a [start, end) range (``Kernel.ranged``). A
tensor only the span reads lives in the workgroup's slice of a scratch buffer, B rows of it:
the member is handed a base pointer moved back by the block's first row, so its own address
arithmetic lands in the slice (as tiles.py does for one point). The tensors read after the
span (attention's output) are written in place.

A sequence of symbolic length (a decoder built for any length) counts as LONG tokens when
the span is sought, and the slices' sizes are expressions of it. A decoder's block whose
mask hides every key after its query (causal.py proves it from the graph) runs the keys up to
its last query only: Q.K^T's N tiles that hold them, the maps and reductions over the keys
and P.V's K loop bounded by the block's key count, passed to each member as the size symbol
causal.KEYS. What it does not do: a span with an op that does not depend on it, AMX or
depthwise members, and a softmax over blocks of keys (a block's whole rows of scores fit in
L2 at these lengths; at 32K tokens they would not). ``MLPACK_DISABLE_PASSES=row_blocks`` runs
each op whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from llvmlite import ir

from mlpack.codegen import debug
from mlpack.codegen.llvm.intrinsics import umin
from mlpack.codegen.llvm.types import I32, I64
from mlpack.codegen.passes.points import (CACHE_BYTES, POINTS_IN_FLIGHT, contraction,
                                          dims_bytes, kept_dims, op_reads)
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, tensors_read
from mlpack.codegen.targets.cpu import causal, narrowconv
from mlpack.codegen.targets.cpu.contraction import batch_symbols
from mlpack.codegen.targets.cpu.gemm import PACK, Contraction
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, exact_bytes
from mlpack.codegen.targets.cpu.kernels import row_dim
from mlpack.codegen.targets.cpu.rows import reordered
from mlpack.codegen.targets.cpu.tiles import ALIGN, TileKernel, TileLowering

BLOCK_BYTES = 512 << 10   # a block's intermediates at most: they stay in L2 between members
MAX_HEIGHT = 48           # rows a block at most (8 tiles of AVX-512's 6: a GEMM's usual group)
LONG = 512                # what a sequence of symbolic length counts as
# scores up to this size stay whole: ViT-B/16's (12 heads of 197 x 197, 1.9 MB) run alike
# either way, its attention a small share of the model (1.002 and 1.003, A/B in both orders)
MIN_BYTES = CACHE_BYTES


@dataclass(frozen=True)
class RowBlock:
    """A span as the target runs it: its ops (outputs, in graph order), its rows R (batch
    dims, then block dims) and the block dims; ``keys``: (tensor, its key dim) of a causal
    block's tensors along the keys, whose readers stop at the block's last query
    (causal.py)."""
    ops: tuple[str, ...]
    dims: tuple[str, ...]
    block: tuple[str, ...]
    keys: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------- the graph pass


def _bytes(g: Graph, t: str, at: dict[str, Expr]) -> int:
    """``t``'s bytes with its size symbols ``at`` these values."""
    ty = g.types[t]
    return dims_bytes({d: ex.simplify_size(ex.substitute(s, at, kind="sym"))
                       for d, s in ty.dims.items()}, ty.dtype)


def _rows(span: list[Comprehension], t: str, g: Graph) -> list[str]:
    """The dims every op of ``span`` keeps and reads the span's tensors at (``t``'s order)."""
    keep = kept_dims(span, {d for d, s in g.types[t].dims.items()
                            if not (s.is_const and s.value == 1)})
    return [d for d in g.types[t].dims if d in (keep or ())]


def _block_dims(span: list[Comprehension], rows: list[str]) -> list[str] | None:
    """R's dims that each contraction of the span reads from one operand only (its M); None
    where a contraction reads some dim of R from neither."""
    block = set(rows)
    for op in span:
        if not contraction(op):
            continue
        a, b = [set().union(*(ex.free_vars(i) for i in r.args)) for r in op_reads(op)]
        if any(d not in a and d not in b for d in rows):
            return None
        block &= {d for d in rows if (d in a) != (d in b)}
    return [d for d in rows if d in block]


def row_block(g: Graph, t: str, index: dict[str, int], readers: dict[str, list[int]],
              outputs: set[str], at: dict[str, Expr]) -> RowBlock | None:
    """``t``'s row-block span (module docstring), or None. ``at``: the value each size symbol
    counts as."""
    producer = g.ops[index[t]]
    if not isinstance(producer, Comprehension) or not contraction(producer) or t in outputs:
        return None
    if any(r.arg[0] in g.constants for r in op_reads(producer)):
        return None   # a product with weights: a GEMM of its own
    size = _bytes(g, t, at)
    if size <= MIN_BYTES:
        return None
    start = end = index[t]
    while True:   # through every reader of a tensor about as big as the scores
        wide = [op.outs[0] for op in g.ops[start:end + 1]
                if _bytes(g, op.outs[0], at) * 2 >= size]
        if any(w in outputs for w in wide):
            return None
        last = max([end, *(i for w in wide for i in readers.get(w, ()))])
        if last == end:
            break
        end = last
    span = g.ops[start:end + 1]
    if not all(isinstance(op, Comprehension) for op in span):
        return None
    rows = _rows(span, t, g)
    while end + 1 < len(g.ops):   # the maps right after that read the span (the division)
        nxt = g.ops[end + 1]
        written = {op.out for op in span}
        if not (isinstance(nxt, Comprehension) and nxt.reduce is None and nxt.out not in outputs
                and any(r.arg[0] in written for r in op_reads(nxt))
                and _rows([*span, nxt], t, g) == rows):
            break
        span, end = [*span, nxt], end + 1
    written = {op.out for op in span}
    for op in span[1:]:   # every op depends on the span (none merely lies between)
        if not any(r.arg[0] in written for r in op_reads(op)):
            return None
    block = _block_dims(span, rows) if rows else None
    if not block:
        return None
    for op in span:   # one size per row dim
        for d, s in op.type.dims.items():
            if d in rows and not ex.same_size(s, g.types[t].dims[d]):
                return None
    outer = [d for d in rows if d not in block]
    return RowBlock(tuple(op.out for op in span), tuple(outer + block), tuple(block))


def find_row_blocks(g: Graph) -> list[RowBlock]:
    """The row blocks of ``g``, none overlapping another."""
    index = {op.outs[0]: i for i, op in enumerate(g.ops)}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(g.ops):
        if isinstance(op, Comprehension):
            for r in op_reads(op):
                readers.setdefault(r.arg[0], []).append(i)
    outputs = {p.name for p in g.outputs}
    # (a batch of one; a sequence of symbolic length counts as long: the scores grow with it)
    at = {**{s: ex.const(LONG) for ty in g.types.values() for size in ty.dims.values()
             for s in ex.free_syms(size)}, **batch_symbols(g)}
    found, taken = [], set()
    for op in g.ops:
        if isinstance(op, Comprehension) and op.out not in taken:
            hit = row_block(g, op.out, index, readers, outputs, at)
            if hit is not None and not taken & set(hit.ops):
                found.append(hit)
                taken |= set(hit.ops)
    return found


def row_blocks(g: Graph, found: list) -> Graph:
    """``g`` with the tensors of each row block laid out rows first (a block of rows is then
    one run of each), its contractions' outputs read after it excepted (a GEMM writes any
    layout); the blocks appended to ``found``. ``g`` itself is not changed."""
    blocks = find_row_blocks(g)
    outputs = {p.name for p in g.outputs}
    orders = {}
    gemm = _gemm_written(blocks, g)
    for blk in blocks:
        inside = set(blk.ops)
        read_after = {r.arg[0] for op in g.ops if isinstance(op, Comprehension)
                      and op.out not in inside for r in op_reads(op)}
        for t in blk.ops:
            dims = list(g.types[t].dims)
            order = [*blk.dims, *[d for d in dims if d not in blk.dims]]
            if order == dims or (t in gemm and t in read_after):
                continue
            if t in outputs:
                break   # (a graph output keeps its layout)
            orders[t] = order
        else:
            # (a graph's own size symbol of that name would be shadowed in the members)
            keys = None if causal.KEYS in g.symbols() else causal.causal_keys(
                g, blk.ops, blk.dims, blk.block, outputs.union(*(
                    tensors_read(op) for op in g.ops if not inside & set(op.outs))))
            if keys:
                blk = replace(blk, keys=tuple(keys.items()))
            found.append(blk)
            debug.log(f"row blocks: {', '.join(blk.ops)} a block of ({', '.join(blk.block)}) "
                      f"at a time, rows ({', '.join(blk.dims)})"
                      + (", keys up to its last query" if keys else ""))
    return reordered(g, {t: o for t, o in orders.items()
                         if any(t in blk.ops for blk in found)})


def _gemm_written(blocks: list[RowBlock], g: Graph) -> set[str]:
    """The tensors of ``blocks`` a GEMM writes: their contractions' and the maps that read
    those (a GEMM's epilogue)."""
    producers = g.producers()
    gemms = {t for blk in blocks for t in blk.ops if contraction(producers[t])}
    return gemms | {t for blk in blocks for t in blk.ops if producers[t].reduce is None
                    and any(r.arg[0] in gemms for r in op_reads(producers[t]))}


def points(blocks: list[RowBlock], g: Graph) -> dict[str, tuple[str, ...]]:
    """The row kernels' points (kernels.py): each op of a block but those a GEMM writes."""
    gemm = _gemm_written(blocks, g)
    return {t: blk.dims for blk in blocks for t in blk.ops if t not in gemm}


# ---------------------------------------------------------------- kernels


@dataclass
class BlockTileKernel(TileKernel):
    """A row block's kernels run a block of rows at a time (tiles.TileKernel's fields; its
    ``dims`` are the rows R, ``locals`` give each local's offset in a slice and its bytes per
    row, and ``slice_bytes`` a slice's size, as size expressions: a key length may be a
    symbol)."""
    block_dims: tuple[str, ...] = ()
    height: int = 1                 # rows per block: the GEMM members' M group
    gemm_members: list[int] = field(default_factory=list)   # which members are GEMMs
    # a causal block (causal.py): its members take the block's key count as the symbol
    # causal.KEYS, and these GEMM members (member -> columns per N tile) run the N tiles
    # that hold those keys only
    causal: bool = False
    key_tiles: dict[int, int] = field(default_factory=dict)

    def workgroups(self, bufs: dict[str, Buffer]) -> Expr:
        return ex.binary("min", _blocks(self, bufs), ex.const(self.slices))


def _sizes(k: BlockTileKernel, bufs: dict[str, Buffer]) -> tuple[Expr, Expr]:
    """(batch points, M) of the block tile's rows."""
    sizes = bufs[k.members[0].out].sizes
    batch = ex.product([sizes[d] for d in k.dims if d not in k.block_dims])
    return batch, ex.product([sizes[d] for d in k.block_dims])


def _blocks(k: BlockTileKernel, bufs: dict[str, Buffer]) -> Expr:
    batch, m = _sizes(k, bufs)
    return ex.product([batch, ex.ceildiv(m, ex.const(k.height))])



def _members(kernels: list[Kernel], blk: RowBlock) -> tuple[int, int] | None:
    inside = set(blk.ops)
    idx = [i for i, k in enumerate(kernels) if k.out in inside]
    return (idx[0], idx[-1]) if idx else None


def _fits(members: list[Kernel], blk: RowBlock, bufs: dict[str, Buffer], written: set[str],
          ) -> str | None:
    """Why ``members`` cannot run a block at a time (None: they can)."""
    for m in members:
        if narrowconv.shares_bytes(bufs[m.out]):
            return f"{m.name} packs its outputs into shared bytes"
        if m.strategy == "gemm":
            c = m.gemm
            if not isinstance(c, Contraction) or c.amx or c.batch_inner:
                return f"{m.name} is not an f32 register-tile GEMM"
            if list(c.batch) + list(c.m) != list(blk.dims) or list(c.m) != list(blk.block):
                return f"{m.name} runs rows ({', '.join(c.batch + c.m)}), not the block's"
            if c.packed in written or (c.b_direct is not None and c.b_direct.arg[0] in written):
                return f"{m.name} reads its B from the block"
            continue
        if m.strategy not in ("map", "inner") or m.row_chunks != 1 or m.blocked:
            return f"{m.name} is scheduled as {m.strategy}"
        outer, _ = row_dim(bufs[m.out], m.blocked, m.points)
        if outer != list(blk.dims):
            return f"{m.name}'s rows are ({', '.join(outer)})"
    return None


def group(kernels: list[Kernel], blocks: list[RowBlock], bufs: dict[str, Buffer],
          outputs: set[str]) -> list[Kernel]:
    """``kernels`` with each row block's kernels replaced by their BlockTileKernel; the kernels
    between them that read nothing the block writes (its GEMMs' run-time B packs) go first."""
    for blk in blocks:
        hit = _members(kernels, blk)
        if hit is None:
            continue
        lo, hi = hit
        inside = set(blk.ops)
        span = kernels[lo:hi + 1]
        members = [k for k in span if k.out in inside]
        written = {k.out for k in members}
        others = [k for k in span if k.out not in inside]
        why = next((f"{k.name} reads the block" for k in others if written & set(k.reads)), None)
        why = why or _fits(members, blk, bufs, written)
        if why is not None:
            debug.log(f"row blocks: {members[0].name} .. {members[-1].name} run whole: {why}")
            continue
        tile = _tile_kernel(members, blk, kernels[hi + 1:], bufs, outputs)
        kernels = kernels[:lo] + others + [tile] + kernels[hi + 1:]
    return kernels


def _tile_kernel(members: list[Kernel], blk: RowBlock, after: list[Kernel],
                 bufs: dict[str, Buffer], outputs: set[str]) -> BlockTileKernel:
    written = [m.out for m in members]
    read_after = {t for k in after for t in k.reads}
    rows = {}   # a local's bytes per row (symbolic where the key length is)
    for t in written:
        if t in outputs or t in read_after:
            continue
        buf = bufs[t]
        rows[t] = exact_bytes(replace(buf, sizes={d: (ex.const(1) if d in blk.dims else s)
                                                  for d, s in buf.sizes.items()}))
    per_row = sum(ex.value_at_one(r) for r in rows.values())
    gemms = [j for j, m in enumerate(members) if m.strategy == "gemm"]
    # a block is one M group of every GEMM: a multiple of each one's tile height (ViT's
    # scores take tiles of 9 rows, its P.V of 6: blocks of 36)
    step = math.lcm(*(members[j].gemm.mr for j in gemms))
    height = step * max(1, min(BLOCK_BYTES // max(per_row, 1), MAX_HEIGHT) // step)
    for j in gemms:   # one M group a block; its N tiles are its units, walked in a row
        members[j].gemm = replace(members[j].gemm, group=height // members[j].gemm.mr,
                                  n_inner=True, stream=False)
    offsets, offset = {}, ex.const(0)
    for t, row in rows.items():
        offsets[t] = (offset, row)
        offset = ex.simplify_size(offset + ex.ceildiv(row * ex.const(height), ex.const(ALIGN))
                                  * ex.const(ALIGN))
    key_tiles = _bound_keys(members, blk, bufs)
    name = f"{members[0].name}.rows"
    scratch = f"{name}#scratch"
    k = BlockTileKernel(name, written[0], ex.const(0.0), None, {}, "f32", strategy="rowblock",
                        members=members, dims=blk.dims, locals=offsets, scratch=scratch,
                        slice_bytes=offset, block_dims=blk.block, height=height,
                        gemm_members=gemms, causal=key_tiles is not None,
                        key_tiles=key_tiles or {})
    # as many slices as a batch of one has blocks, or POINTS_IN_FLIGHT (a symbolic M)
    blocks = ex.value_at_one(_blocks(k, bufs)) if all(
        bufs[k.out].sizes[d].is_const for d in blk.block) else POINTS_IN_FLIGHT
    k.slices = min(POINTS_IN_FLIGHT, max(1, blocks))
    bufs[scratch] = Buffer(scratch, ("slot",), {"slot": ex.simplify_size(
        ex.ceildiv(ex.const(k.slices) * offset, ex.const(4)))}, "f32")
    k.writes = [t for t in written if t not in rows] + [scratch]
    k.out = k.writes[0]
    k.reads = [t for t in dict.fromkeys(r for m in members for r in m.reads)
               if t not in written]
    k.fused = [t for m in members for t in m.fused]
    for j, m in enumerate(members):
        m.name, m.ranged = f"{name}.{j}", True
    debug.log(f"row blocks: {name}: {len(members)} kernels, {height} rows a block, "
              f"{offset} bytes of scratch a block"
              + (", keys up to the block's last query" if k.causal else ""))
    return k


def _bound_keys(members: list[Kernel], blk: RowBlock, bufs: dict[str, Buffer],
                ) -> dict[int, int] | None:
    """A causal block's members (RowBlock.keys) told to stop at the block's keys (their
    ``bounded``); returns the GEMM members that write N tiles of keys (member -> columns per
    tile), or None (none told) where some member that reads or writes keys cannot stop (a
    member past the bound would read keys no member wrote)."""
    keys = dict(blk.keys)
    if not keys:
        return None
    told, tiles = {}, {}
    for j, m in enumerate(members):
        read = [causal.key_var(e, keys) for e in (m.body, m.epilogue) if e is not None]
        if False in read or len({v for v in read if v}) > 1:
            return None
        v = next((v for v in read if v), None)
        if v is None and m.out not in keys:
            continue   # (neither reads nor writes keys: P.V's division by the sums)
        c, out_key = m.gemm, keys.get(m.out)
        if out_key is not None and v not in (None, out_key):
            return None
        if m.strategy == "gemm" and v is None and list(c.n) == [out_key]:
            tiles[j] = c.tb * PACK   # (Q.K^T: its units are the N tiles of one M group)
        elif m.strategy == "gemm" and out_key is None and list(c.k) == [v] and c.pair is None:
            told[j] = v              # (P.V: its K loop, microkernel.py)
        elif m.strategy == "map" and row_dim(bufs[m.out], m.blocked, m.points)[1] == (
                v or out_key) and out_key is not None:
            told[j] = out_key
        elif m.strategy == "inner" and out_key is None and v in m.rdims:
            told[j] = v
        else:
            debug.log(f"row blocks: {m.name} cannot stop at a block's keys")
            return None
    for j, v in told.items():
        members[j].bounded = (v, ex.sym(causal.KEYS))
    return tiles


# ---------------------------------------------------------------- lowering


class BlockTileLowering(TileLowering):
    """A BlockTileKernel's body: its members called block by block, each for its units (a
    causal block's: its keys up to the block's last query)."""

    def __init__(self, module, k: BlockTileKernel, buffers, symbols, loops_md,
                 native_f16=(True, True)):
        super().__init__(module, k, buffers, symbols, loops_md, native_f16)
        if k.causal:
            self.member_symbols = [*symbols, causal.KEYS]

    def _emit_impl(self, f: ir.Function) -> None:
        k = self.k
        members, E, bases, syms, (wg, count, err, status) = self._begin(f)
        b = self.b
        batch, m_size = (E(s) for s in _sizes(k, self.buffers))
        height = ir.Constant(I64, k.height)
        mgroups = b.udiv(b.add(m_size, ir.Constant(I64, k.height - 1)), height)
        start, end, base = self._share(b.mul(batch, mgroups), wg, count, bases[k.scratch],
                                       E(k.slice_bytes))
        locals_ = {t: (E(off), E(row)) for t, (off, row) in k.locals.items()}
        ntiles = {j: E(k.members[j].gemm.ntiles) for j in k.gemm_members}
        with self.loops.loop(start, end, "block") as blk:
            bi, mg = b.udiv(blk, mgroups), b.urem(blk, mgroups)
            m0 = b.mul(mg, height)
            rows = b.sub(m_size, m0)
            rows = umin(b, rows, height)
            r0 = b.add(b.mul(bi, m_size), m0)
            keys = b.add(m0, rows)   # (a causal block's: up to its last query)
            for j, (lowering, impl) in enumerate(members):
                if j in ntiles:
                    lo = b.mul(blk, ntiles[j])
                    run = ntiles[j]
                    if j in k.key_tiles:
                        width = ir.Constant(I64, k.key_tiles[j])
                        run = umin(b, b.udiv(b.add(keys, ir.Constant(I64, k.key_tiles[j] - 1)),
                                             width), ntiles[j])
                    hi = b.add(lo, run)
                else:
                    lo, hi = r0, b.add(r0, rows)
                # (the slices moved back by the block's first row)
                self._call(lowering, impl, bases, base, r0, locals_,
                           [*syms, keys] if k.causal else syms,
                           [b.trunc(lo, I32), b.trunc(hi, I32), err, status])
        b.ret_void()
        self.loops_md(self.loops.latches, self.loops.unroll)
        self._finish_checks(err, status)


__all__ = ["BLOCK_BYTES", "BlockTileKernel", "BlockTileLowering", "RowBlock",
           "find_row_blocks", "group", "points", "row_block", "row_blocks"]
