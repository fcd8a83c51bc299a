"""A GEMM's B panels packed from a B whose K runs along memory: 16 x 16 blocks transposed in
vector registers, not gathered a lane at a time.

A panel holds B as ``[batch dims][N block][K][lane]`` (panels.py): 16 columns of one K step
side by side. Attention's scores read the keys as B (``sum{k} Q[m, k] * K[n, k]``): along
memory a key's K values follow each other and its N neighbours are a row apart (2304 floats in
GPT-2's fused projection), so the map kernel that packs it gathered each lane of every panel
row from another row of the keys, and divided its unit index per 16 floats: about 4 GB/s, 0.72
ms a layer of Whisper-tiny's encoder and 0.37 of GPT-2 small's at 512 tokens. A weight stored
``[N, K]`` with one K dim (a Gemm with transB, a classifier) packed at load went the same way.

Here (``plan``: B f32 and read unguarded, one K dim of constant size along which the read
steps one element, one N dim along which it does not) each unit is one N block of a batch
point: for each 16 K steps it loads 16 vectors, one per column (the column's next 16 K values,
contiguous; a column past N is zeros, a last K block is a masked load), transposes them with
four rounds of two-source shuffles (each round swaps the off-diagonal blocks of its size, 8, 4,
2, 1: 64 shuffles, vpermt2ps on AVX-512), and stores the 16 rows of the panel as whole vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.llvm.intrinsics import load_masked_f32
from mlpack.codegen.llvm.types import F32, I1, I32, I64
from mlpack.codegen.targets.cpu.gemm import PACK
from mlpack.codegen.targets.cpu.indexing import affine, read_step
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, share
from mlpack.codegen.targets.cpu.kernels import shared_units

NB, LANE = "pack.nb", "pack.l"   # panels.pack_kernel's N block and lane dims


@dataclass(frozen=True)
class Transpose:
    """How a pack kernel runs as transposed blocks (Kernel.gemm, strategy "transpose"): B's
    read over the contraction's own vars, its K var (of ``k_size``) and its N var (of
    ``n_size``)."""
    read: Expr
    k: str
    k_size: int
    n: str
    n_size: Expr


def plan(pk: Kernel, info: dict, bufs: dict[str, Buffer], rdims: dict[str, Expr]) -> Transpose | None:
    """The transposed packing of ``pk`` (panels.pack_kernel's kernel for the contraction whose
    ``info`` and ``rdims`` are given), or None where B does not run along K in memory."""
    rb = info["b"]
    if (rb.dtype != "f32" or bufs[pk.out].dtype != "f32" or info.get("pair") is not None
            or rb.arg[2] is not None or len(info["k"]) != 1 or len(info["n"]) != 1):
        return None
    kd, nd = info["k"][0], info["n"][0]
    size = rdims[kd]
    if not size.is_const or bufs[pk.out].layout != (*info["batch"], NB, kd, LANE):
        return None
    src = bufs[rb.arg[0]]
    loop = {*info["batch"], kd, nd}
    forms = {d: affine(ix, loop) for d, ix in zip(rb.arg[1], rb.args)}
    if any(f is None for f in forms.values()):
        return None
    along_k, along_n = read_step(forms, src, kd), read_step(forms, src, nd)
    if not (along_k.is_const and along_k.value == 1) or (along_n.is_const and along_n.value == 1):
        return None
    return Transpose(rb, kd, size.value, nd, info["n_size"])


def workgroups(k: Kernel, out: Buffer) -> Expr:
    """One unit per N block of a batch point, shared out like a map kernel's rows."""
    units = ex.product([out.sizes[d] for d in out.layout if d not in (k.gemm.k, LANE)])
    return shared_units(units, ex.product(list(out.sizes.values())))


def _swap_masks(s: int) -> tuple[list[int], list[int]]:
    """The shuffles of one round: row i keeps its lanes whose bit ``s`` is clear and takes
    row i + s's below them; row i + s takes row i's lanes above and keeps its own (lanes of
    the second operand count from PACK)."""
    lo = [e if not e & s else PACK + e - s for e in range(PACK)]
    hi = [e + s if not e & s else PACK + e for e in range(PACK)]
    return lo, hi


def transpose_rows(b: ir.IRBuilder, rows: list) -> list:
    """The PACK x PACK block whose rows are ``rows`` (vectors of PACK), transposed."""
    rows = list(rows)
    s = PACK // 2
    while s:
        lo, hi = (ir.Constant(ir.VectorType(I32, PACK), m) for m in _swap_masks(s))
        for i in range(PACK):
            if not i & s:
                a, c = rows[i], rows[i + s]
                rows[i], rows[i + s] = b.shuffle_vector(a, c, lo), b.shuffle_vector(a, c, hi)
        s //= 2
    return rows


def emit(low, wg, count) -> None:
    """The kernel's body into ``low`` (a lower.KernelLowering): the units of workgroup ``wg``
    of ``count``, each a batch point's N block, 16 K steps at a time in a loop (a weight's K
    of thousands would be thousands of shuffles written out), the last steps masked."""
    k, b, E, t = low.k, low.b, low.E, low.k.gemm
    out = low.out
    outer = [d for d in out.layout if d not in (t.k, LANE)]
    units = ir.Constant(I64, 1)
    for d in outer:
        units = b.mul(units, E.sizes[out.name][d], flags=("nsw",))
    start, end = share(b, k, units, wg, count)
    src = t.read.arg[0]
    index = dict(zip(t.read.arg[1], t.read.args))
    layout = low.buffers[src].layout
    with low.loops.loop(start, end, "unit") as u:
        with E.scope():
            low.bind_unit(u, outer)
            n_size = E(t.n_size)
            first = b.mul(E.lookup(NB), ir.Constant(I64, PACK), flags=("nsw",))
            columns = []   # (inside N, the column's first K step) per lane
            for j in range(PACK):
                col = b.add(first, ir.Constant(I64, j), flags=("nsw",))
                inside = b.icmp_signed("<", col, n_size)
                # (a column past N reads column 0, in bounds, and is zeroed)
                with E.scope(**{t.k: ir.Constant(I64, 0),
                                t.n: b.select(inside, col, ir.Constant(I64, 0))}):
                    columns.append((inside, E.address(src, [E.cast(E(index[d]), index[d].dtype,
                                                                   "i64") for d in layout])))
            with E.scope(**{t.k: ir.Constant(I64, 0), LANE: ir.Constant(I64, 0)}):
                panel = low._out_ptr()   # (a K step is PACK floats further)
            full, rest = divmod(t.k_size, PACK)
            if full:
                with low.loops.loop(ir.Constant(I64, 0), ir.Constant(I64, full), "kb",
                                    unroll=False) as kb:
                    _block(b, columns, panel, b.mul(kb, ir.Constant(I64, PACK)), PACK)
            if rest:
                _block(b, columns, panel, ir.Constant(I64, full * PACK), rest)
    b.ret_void()
    low.loops_md(low.loops.latches, low.loops.unroll)


def _block(b: ir.IRBuilder, columns: list, panel, k0, width: int) -> None:
    """K steps ``k0`` to ``k0 + width`` of every column, transposed into the panel's rows."""
    vty = ir.VectorType(F32, PACK)
    zero = ir.Constant(vty, [0.0] * PACK)
    rows = [b.select(inside, _load(b, b.gep(ptr, [k0], source_etype=F32), vty, width), zero)
            for inside, ptr in columns]
    at = b.mul(k0, ir.Constant(I64, PACK))
    for i, row in enumerate(transpose_rows(b, rows)[:width]):
        step = b.add(at, ir.Constant(I64, i * PACK))
        b.store(row, b.gep(panel, [step], source_etype=F32), align=4)


def _load(b: ir.IRBuilder, ptr, vty: ir.VectorType, width: int):
    """``width`` floats from ``ptr`` as a vector, the lanes past them zero."""
    if width == vty.count:
        return b.load(ptr, typ=vty, align=4)
    return load_masked_f32(b, ptr, vty, ir.Constant(ir.VectorType(I1, vty.count),
                                                    [i < width for i in range(vty.count)]))


__all__ = ["Transpose", "emit", "plan", "transpose_rows", "workgroups"]
