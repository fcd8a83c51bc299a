"""What a GEMM kernel is: the ``Contraction`` record a kernel carries, and B's packed layout.

contraction.py decides which kernels are contractions and fills in the record; microkernel.py
and amxkernel.py emit the kernels from it. B, when it is a build-time constant, is packed here
(``pack_b``) as ``[batch][N blocks][K][PACK]``, zero-padded along N. ``PACK`` is 16 lanes for
every target, so that all cpu artifacts of a model share one weights archive (the packager
stores equal archives once); a target with narrower vectors loads a block in several vectors,
a wider one (AVX-512) takes several blocks per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.precisions.intsum import QUAD   # K per int8 product group (INT8_DOT)

PACK = 16                    # f32 lanes per packed column block, the same for every target
# bf16 pairs (bf16dot.py): per LLVM feature, the instruction's intrinsic and its f32 lanes;
# each adds a0*b0 + a1*b1 of adjacent bf16 pairs to every f32 lane (x86 vdpbf16ps, arm BFDOT)
BF16_DOT = {"avx512bf16": ("llvm.x86.avx512bf16.dpbf16ps.512", 16),
            "bf16": ("llvm.aarch64.neon.bfdot.v4f32.v8bf16", 4)}


# int8 quads (codegen/precisions/int8.py): per LLVM feature, the instruction's intrinsic and its
# i32 lanes; each adds a0*b0 + ... + a3*b3 of four adjacent u8 (A) x s8 (B) to every i32 lane
# (x86 vpdpbusd, arm USDOT of FEAT_I8MM; no saturation: four products of at most 255 * 127 fit)
INT8_DOT = {"avx512vnni": ("llvm.x86.avx512.vpdpbusd.512", 16),
            "i8mm": ("llvm.aarch64.neon.usdot.v4i32.v16i8", 4),
            "dotprod": ("llvm.aarch64.neon.sdot.v4i32.v16i8", 4),
            # x86 without VNNI: ``pmaddwd`` adds a0*b0 + a1*b1 of i16 pairs to each i32 lane,
            # exact (u8 and s8 widen to i16); K still goes in quads, A copied as u16 first
            # (contraction.py) so that each pair is one 32-bit broadcast, B packed as two s8
            # pairs per quad (``pair_halves``), sign-extended per load. ``pmaddubsw`` would take the bytes as they are, but its i16
            # pair sum saturates (2 * 255 * 127 > 32767): what ONNX Runtime's AVX2 kernel risks
            "avx512bw": ("llvm.x86.avx512.pmaddw.d.512", 16),
            "avx2": ("llvm.x86.avx2.pmadd.wd", 8),
            "ssse3": ("llvm.x86.sse2.pmadd.wd", 4)}
INT8_INTRINSICS = {name for name, _ in INT8_DOT.values()}
# ... and those that multiply i16 pairs (two per quad), not quads of bytes
PAIR_PRODUCTS = {"llvm.x86.avx512.pmaddw.d.512", "llvm.x86.avx2.pmadd.wd",
                 "llvm.x86.sse2.pmadd.wd"}
# the intrinsics whose byte operands LLVM types as byte vectors (the x86 ones take i32 lanes)
BYTE_OPERANDS = {"llvm.aarch64.neon.usdot.v4i32.v16i8", "llvm.aarch64.neon.sdot.v4i32.v16i8"}
# ... and those that multiply s8 x s8 (FEAT_DotProd's SDOT, on every ARMv8.2 core of note): A's
# u8 become s8 by flipping the top bit (a - 128), and each column's accumulators start at
# 128 * sum_k B[k] to give the u8 products back (``signed_correction``)
SIGNED_A = {"llvm.aarch64.neon.sdot.v4i32.v16i8"}


def signed_correction(panel: np.ndarray) -> np.ndarray:
    """128 * sum over K of a packed int8 B panel [batch, N blocks, K / 4, PACK, 4], as i32
    [batch, N blocks, PACK]: what an SDOT of (a - 128) lacks of the u8 products."""
    return (128 * panel.astype(np.int32).sum(axis=(2, 4))).astype(np.int32)


def pair_halves(quads: np.ndarray) -> np.ndarray:
    """A quad-packed int8 B panel [batch, N blocks, K / 4, PACK, 4] as ``pmaddwd`` reads it:
    each quad's two pairs apart, [batch, N blocks, K / 4, 2, PACK, 2] (pair h of a quad is
    its K 2h and 2h + 1), so one load of a pair gives every column of a vector its two K."""
    b, nb, kq, lanes, _ = quads.shape
    return np.ascontiguousarray(quads.reshape(b, nb, kq, lanes, 2, 2).transpose(0, 1, 2, 4, 3, 5))


def _dot(t, table) -> str | None:
    for feature, (name, lanes) in table.items():
        if feature in t.features and t.vector_bits == 32 * lanes:
            return name
    return None


def bf16_dot(t) -> str | None:
    """The bf16 pair-product intrinsic cpu target ``t`` multiplies with, or None: its feature
    present, at the target's vector width."""
    return _dot(t, BF16_DOT)


def int8_dot(t) -> str | None:
    """The u8 x s8 quad-product intrinsic cpu target ``t`` multiplies with, or None."""
    return _dot(t, INT8_DOT)


@dataclass
class Contraction:
    """How a kernel runs as a GEMM (Kernel.gemm when Kernel.strategy == "gemm")."""
    a: Expr                   # the read of A (unguarded), over batch, M and K vars
    packed: str               # B: a panel packed at load or at run time, or (direct) B itself
    data: np.ndarray | None   # AMX tiles packed at build time (amx.pack_b), or None
    batch: list[str]          # output dims walked outside the GEMM
    m: list[str]              # output dims flattened into GEMM rows (output layout order)
    n: list[str]              # output dims flattened into GEMM columns (output layout order)
    k: list[str]              # reduction dims (loop order)
    n_size: Expr              # sizes, symbolic where B is read at run time
    k_size: Expr
    blocks: Expr              # N blocks of PACK columns
    vl: int                   # f32 lanes per vector register
    tb: int                   # blocks per tile
    mr: int                   # rows per tile
    fma: bool
    group: int = 1            # M tiles per workgroup unit (they share each K chunk)
    kc: int = 1               # K chunk, in steps of the outermost K dim
    b_direct: Expr | None = None   # B read in place: N dims flattened at unit stride
    b_masked: bool = False    # in place with a ragged N: the last columns load under a mask
    n_inner: bool = False     # units walk N tiles fastest (A stays cached, B is re-read)
    amx: bool = False         # bf16x6 tile products (amx.py): mr, group, tb as its blocks
    k_steps: int = 0          # AMX: K in steps of 32, zero-padded
    run_dims: int = 0         # AMX: the innermost K dims, A's unit-stride run
    run_group: int = 1        # AMX: runs per vector of A (amx.k_order)
    pair: str | None = None   # bf16 pairs (bf16dot.py) or int8 quads: the K dim they group
    dot: str | None = None    # ... and the product intrinsic (BF16_DOT, INT8_DOT)
    init: str | None = None   # SIGNED_A: the accumulators' start per column (signed_correction)
    # f32 vectors per tile row when fewer hold columns than tb * PACK / vl: an N of one narrow
    # block (a grouped convolution's 8 channels per group in AVX2's 8 lanes), 0 for all of them
    nvec: int = 0
    # K dims per loop of the micro-kernel, outermost first (empty: one each): adjacent K dims
    # that A steps through as one run (a channel unflatten split into groups) loop as one
    k_runs: tuple[int, ...] = ()
    # units walk the batch points fastest: a grouped convolution laid out channels last, whose
    # groups lie inside each pixel of A and of the output (walked outermost, each group's GEMM
    # would stream both whole for a few bytes of every cache line)
    batch_inner: bool = False
    # B's panels are read once per run (one M group at the batch size the model is built for):
    # each is fetched ahead (microkernel.PREFETCH_ROWS)
    stream: bool = False
    # B's packed panels (f32, 16-bit, bf16 pairs or int8 quads) are too big to stay in L2
    # (they come from L3 or memory) and M is more than one tile: each K chunk's next slice is
    # fetched while the group's tiles run the one before it (microkernel._next_slices)
    fetch_ahead: bool = False
    # M's rows past its last whole tile at the batch the schedule sees (M % mr; 0: none): the
    # tile with that many rows left runs a K loop of those rows alone, not of mr rows (the
    # rows past M are computed all the same otherwise). A batch of one's single row (a fully
    # connected layer, a squeeze-excitation's) and 128 tokens' last 2 rows of 6 take it.
    tail_rows: int = 0

    @property
    def pair_size(self) -> int:
        """How many K the product intrinsic takes at once: 4 (int8 quads) or 2 (bf16 pairs)."""
        return QUAD if self.dot in INT8_INTRINSICS else 2

    @property
    def k_loops(self) -> list[tuple[str, ...]]:
        """The K dims grouped as the micro-kernel loops over them (``k_runs``)."""
        runs, out, i = self.k_runs or (1,) * len(self.k), [], 0
        for n in runs:
            out.append(tuple(self.k[i:i + n]))
            i += n
        return out

    @property
    def ntiles(self) -> Expr:
        return ex.ceildiv(self.blocks, ex.const(self.tb))


# ---------------------------------------------------------------- B packed at build time


def pack_b(data: np.ndarray, layout, rb: Expr, aff_b: dict, dims: list[str],
           extents: dict[str, int], n_dims: list[str], k_dims: list[str]) -> np.ndarray:
    """B evaluated at every (batch, n, k) point, as [batch, N blocks, K, PACK] (N zero-padded)."""
    perm = _permutation(data, layout, aff_b, dims, extents)
    if perm is not None:   # B's dims are the loop vars themselves: a transpose, no gather
        kept = [s for s in data.shape if s != 1]
        return _blocked(np.transpose(data.reshape(kept), perm).astype(np.float32), dims,
                        extents, n_dims, k_dims)
    flat = np.zeros([extents[v] for v in dims], dtype=np.int64)
    strides = np.cumprod([1, *data.shape[::-1]])[:-1][::-1]
    grids = {v: np.arange(extents[v], dtype=np.int64).reshape(
        [-1 if i == j else 1 for j in range(len(dims))]) for i, v in enumerate(dims)}
    for axis, d in enumerate(layout):
        coeffs, c0 = aff_b[d]
        ix = np.full([1] * len(dims), c0.value, dtype=np.int64)
        for v, c in coeffs.items():
            if v in grids:   # (a dim of size 1 is at 0)
                ix = ix + c * grids[v]
        if ix.size and (ix.min() < 0 or ix.max() >= data.shape[axis]):   # (affine: never data)
            raise UnsupportedTargetError(f"cpu: packing B: dim {d} read at {int(ix.min())}.."
                                         f"{int(ix.max())}, outside its size {data.shape[axis]}")
        flat = flat + ix * int(strides[axis])
    return _blocked(data.reshape(-1)[flat].astype(np.float32), dims, extents, n_dims, k_dims)


def _permutation(data, layout, aff_b: dict, dims: list[str], extents: dict[str, int]):
    """The axes of ``data`` (its size-1 axes left out) in ``dims`` order when each of B's dims
    is indexed by one of the loop vars ``dims`` over its whole extent (a weight read as it
    lies), else None."""
    axis_of, kept = {}, 0
    for axis, d in enumerate(layout):
        coeffs, c0 = aff_b[d]
        if not (c0.is_const and c0.value == 0):
            return None
        if data.shape[axis] == 1 and not any(v in extents for v in coeffs):
            continue   # a size-1 axis read at 0 (a 1x1 kernel's window)
        if len(coeffs) != 1 or data.shape[axis] == 1:
            return None
        (v, c), = coeffs.items()
        if c != 1 or v not in extents or v in axis_of or extents[v] != data.shape[axis]:
            return None
        axis_of[v] = kept
        kept += 1
    if sorted(axis_of) != sorted(dims):
        return None
    return [axis_of[v] for v in dims]


def _blocked(vals: np.ndarray, dims, extents, n_dims, k_dims) -> np.ndarray:
    """B's values at the (batch, n, k) points as [batch, N blocks, K, PACK], N zero-padded."""
    nb = len(dims) - len(n_dims) - len(k_dims)
    bsz = int(np.prod([extents[v] for v in dims[:nb]], dtype=np.int64))
    nsz = int(np.prod([extents[v] for v in n_dims], dtype=np.int64))
    ksz = int(np.prod([extents[v] for v in k_dims], dtype=np.int64))
    vals = vals.reshape(bsz, nsz, ksz)
    blocks = -(-nsz // PACK)
    padded = np.zeros((bsz, blocks * PACK, ksz), dtype=np.float32)
    padded[:, :nsz] = vals
    return np.ascontiguousarray(padded.reshape(bsz, blocks, PACK, ksz).transpose(0, 1, 3, 2))


def pack_pairs(panel: np.ndarray, extents: list[int], pair: int, group: int = 2) -> np.ndarray:
    """A packed B panel [batch points, N blocks, K, PACK] (K flat over the K dims of
    ``extents``, loop order) as vdpbf16ps (``group`` 2) or vpdpbusd (4) reads it: K dim number
    ``pair`` (extent a multiple of ``group``) split into groups, each group of K adjacent per
    column: [batch, blocks, K / group, PACK, group]."""
    b, nb, _, lanes = panel.shape
    shape = list(extents)
    shape[pair:pair + 1] = [shape[pair] // group, group]
    x = panel.reshape(b, nb, *shape, lanes)
    axis = 2 + pair + 1                        # the group's axis
    x = np.moveaxis(x, axis, -1)               # [b, nb, ..., e/group, ..., lanes, group]
    return np.ascontiguousarray(x.reshape(b, nb, -1, lanes, group))
