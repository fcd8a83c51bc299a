"""fp32 contractions on Intel AMX tiles (the ``x86_64-v4-amx`` target): bf16x6 tile products.

AMX multiplies bf16 only (``tdpbf16ps``: a 16x16 f32 tile += a 16x32 bf16 tile of A times a
32x16 one of B). An f32 splits exactly into three bf16 parts, ``x = x1 + x2 + x3``, each rounded
to nearest from what the parts before it leave (``split``), and the six part products of order
above 2**-24, ``x1y1 + x1y2 + x2y1 + x1y3 + x2y2 + x3y1``, sum to an f32-grade product: the
three left out are below 2**-25 of it (cuBLAS's bf16x9 emulation of fp32 keeps all nine). Six
tile products per f32 product pay where the tile unit runs more than six times the AVX-512
FMA rate: on Sapphire Rapids it runs up to 17 times (benchmarks/amx.py).

A contraction runs here when classify's view has B a build-time constant (``plan``):

* B is packed at build time as ``[batch][N block of 16][K step of 32][part][16 pairs][16][2]``
  bf16 (``pack_b``): one 1 KB tile per (block, step, part), pairs of K adjacent as the tile
  multiply reads them, K zero-padded to whole steps;
* A is read through affine offsets as in contraction.py. A workgroup unit splits its blocks
  of 32 rows (``unit_blocks``: 1 to 8) once, over the whole K, into a stack scratch laid out
  as tiles, ``[block][K step][part][32 rows][32]`` bf16; then for each pair of 16-column
  blocks of its up to ``MAX_N`` columns, and each block of rows,
* a 2x2 block of accumulator tiles (32 rows x 32 columns) runs the whole K. Per K step it loads
  the parts in an order that reuses each (``PRODUCTS``: 16 tile loads for 24 tile products);
* the unit's outputs go through the f32 micro-kernel's epilogue (bias, activation, residual).

A's K dims go in order of their stride in A (``k_order``), so the innermost run is at unit
stride, and A is split in vectors of 16 floats: whole from a run of 16 or more, or from 4 runs
of 4 along the next K dim out (the capsule's poses ``[n, X, Y, ci, i, k]``: k, for 4 ci), so
neither the poses nor their patches are copied. A whose runs are neither is copied first with
the dims only K reads innermost (``a_layout``); a convolution's input, channels last, is read
in place.

This module decides where AMX runs, packs B (NumPy, at build time) and makes a kernel's record
(``gemm``); amxkernel.py emits the kernels.
"""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.gemm import PACK, Contraction
from mlpack.codegen.targets.cpu.gemm import pack_b as gemm_pack_b
from mlpack.codegen.targets.cpu.gemmview import extent
from mlpack.codegen.targets.cpu.indexing import affine, read_step
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.kernels import fresh_name

TILE_K = 32                 # bf16 values of K per tile row (64 bytes)
TILE_ROWS = 16              # rows of a tile (A's M, B's K pairs)
TILE_BYTES = 1024
PARTS = 3                   # bf16 parts of an f32
BLOCK_ROWS = 2 * TILE_ROWS  # M rows per unit: two A tiles
RUN = 16                    # A is split in vectors of 16 floats along its unit-stride K run
MAX_N = 512                 # columns per unit: its f32 outputs (32 x 512, 64 KB) on the stack
MAX_K = 4608                # A's parts on the stack: 32 rows x K x 3 bf16 (864 KB at most)
STACK_BYTES = 1 << 20       # a unit's scratch (A's parts and its outputs) at most
MAX_BLOCKS = 8              # 32-row blocks per unit: each B tile loaded serves them all
MIN_UNITS = 4               # ... while the units still give both cores two each
MIN_M = 2 * BLOCK_ROWS      # rows: fewer waste too much of each tile product ...
MAX_WASTE = 1.25            # ... as do rows padded to whole blocks beyond this (7x7 = 49)
MIN_K = 64
# columns: splitting a row of A costs about as much as 100 columns of its tile products, and
# the split only pays off over more (squeezenet's 64-column convolutions ran 20% slower)
MIN_N = 128
MIN_WORK = 1 << 20          # multiply-adds: below this the f32 micro-kernel is as good
# per K step, the (A part, B part) products, ordered so consecutive ones share an operand:
# A1 with B3, B2, B1; then A2 with B1, B2; then A3 with B1 (16 tile loads for 24 products)
PRODUCTS = ((0, 2), (0, 1), (0, 0), (1, 0), (1, 1), (2, 0))
# tile registers: accumulators 0-3 (2 * M tile + N tile), A's two tiles 4-5, B's two 6-7
A_TILES, B_TILES = (4, 5), (6, 7)


# ---------------------------------------------------------------- the split, in NumPy


def _rne_bf16(bits: np.ndarray) -> np.ndarray:
    """The bf16 nearest (ties to even) to f32s given as uint32 bits, as uint16 bits."""
    bits = bits.astype(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
            >> np.uint32(16)).astype(np.uint16)


def _widen(parts: np.ndarray) -> np.ndarray:
    return (parts.astype(np.uint32) << np.uint32(16)).view(np.float32)


def split(x: np.ndarray) -> np.ndarray:
    """``x`` (f32) as its three bf16 parts, ``[3, *x.shape]`` uint16 bits, as the kernels split
    A: each part the nearest bf16 to what the parts before it leave (the first one truncated
    where rounding would overflow). A NaN is a quiet NaN in the first part, an infinity is the
    first part alone; finite values are exact sums."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((PARTS, *x.shape), np.uint16)
    bits = x.view(np.uint32)
    first = _rne_bf16(bits)
    # a finite value within half a bf16 step of the largest f32 would round to infinity:
    # truncated instead (an infinity truncates to itself)
    first = np.where(first & 0x7F80 == 0x7F80, (bits >> np.uint32(16)).astype(np.uint16), first)
    out[0] = np.where(np.isnan(x), np.uint16(0x7FC0), first)
    with np.errstate(invalid="ignore", over="ignore"):
        rest = x - _widen(out[0])
        rest = np.where(rest - rest == 0, rest, np.float32(0)).astype(np.float32)
        for p in range(1, PARTS):
            out[p] = _rne_bf16(rest.view(np.uint32))
            rest = (rest - _widen(out[p])).astype(np.float32)
    return out


def join(parts: np.ndarray) -> np.ndarray:
    """The f32 values of ``split``'s parts (their sum, in f64): for tests."""
    return sum(_widen(p).astype(np.float64) for p in parts)


def pack_b(blocked: np.ndarray) -> np.ndarray:
    """gemm.pack_b's ``[batch, N blocks, K, 16]`` f32 as the tiles the kernel loads:
    ``[batch, N blocks, K steps, part, 16 pairs, 16 columns, 2]`` bf16 bits, K zero-padded."""
    bsz, nb, k, lanes = blocked.shape
    steps = -(-k // TILE_K)
    padded = np.zeros((bsz, nb, steps * TILE_K, lanes), np.float32)
    padded[:, :, :k] = blocked
    parts = split(padded).reshape(PARTS, bsz, nb, steps, TILE_ROWS, 2, lanes)
    return np.ascontiguousarray(parts.transpose(1, 2, 3, 0, 4, 6, 5))


# ---------------------------------------------------------------- where it applies


def k_order(read: Expr, buf: Buffer, kdims: list[str], extents: dict[str, int],
            layout=None) -> tuple[list[str], int, int] | None:
    """(the K dims in order of their stride in A, how many innermost ones form its unit-stride
    run, sub-runs per vector) for A read by ``read`` from ``buf`` laid out as ``layout``; None
    when the vectors of ``RUN`` floats cannot be loaded whole or from ``RUN // run`` equal runs
    (at least 4 floats each) along the next K dim out."""
    aff = {}
    for d, ix in zip(read.arg[1], read.args):
        aff[d] = affine(ix, set(kdims) | set(ex.free_vars(ix)))
        if aff[d] is None:
            return None
    step = {v: read_step(aff, buf, v, layout) for v in kdims}
    if not all(s.is_const for s in step.values()):
        return None
    order = sorted(kdims, key=lambda v: -step[v].value)
    run, dims = 1, 0
    for v in reversed(order):
        if step[v].value != run or run % RUN == 0:
            break
        run *= extents[v]
        dims += 1
    if run % RUN == 0:
        return order, dims, 1
    group = RUN // run
    if run < 4 or RUN % run or dims == len(order) or extents[order[-dims - 1]] % group:
        return None
    return order, dims, group


def a_layout(read: Expr, buf: Buffer, kdims: list[str]) -> tuple[str, ...]:
    """``buf``'s layout with the dims that only K vars index moved innermost (in their order):
    then A's rows step over the others and its K runs are the longest the data allows."""
    only_k = []
    for d, ix in zip(read.arg[1], read.args):
        used = ex.free_vars(ix)
        if used and used <= set(kdims):
            only_k.append(d)
    return tuple([d for d in buf.layout if d not in only_k] +
                 [d for d in buf.layout if d in only_k])


def plan(info: dict, bufs: dict[str, Buffer], extents: dict[str, int],
         out_inner: str | None) -> tuple | None:
    """For a contraction whose B is a build-time constant (classify's ``const`` mode) on an AMX
    target: (the layout A should have, or None for its own) when it runs on tiles; None when
    it does not: too small, its output's unit-stride dim (``out_inner``) not among the
    columns (the epilogue would store across them), or A's K not readable in whole vectors
    in any layout."""
    if out_inner not in info["n"]:
        return None
    ms, ns, ks = info["m_size"], info["n_size"], info["k_size"]
    if not (ns.is_const and ks.is_const) or ns.value < MIN_N or not MIN_K <= ks.value <= MAX_K:
        return None
    if ms.is_const and (ms.value < MIN_M or ms.value * ns.value * ks.value < MIN_WORK
                        or -(-ms.value // BLOCK_ROWS) * BLOCK_ROWS > MAX_WASTE * ms.value):
        return None
    read = info["a"]
    buf = bufs[read.arg[0]]
    if read.arg[2] is None and k_order(read, buf, info["k"], extents) is not None:
        return (None,)   # A is read in place
    layout = a_layout(read, buf, info["k"])
    if k_order(read, buf, info["k"], extents, layout) is None:
        return None
    return (layout,)


def unit_blocks(k_steps: int, tb: int, m_size: Expr, others: Expr) -> int:
    """32-row blocks per workgroup unit: as many as fit the stack budget while the units
    (``others``: units per row block, N tiles times batch) number at least MIN_UNITS. B's
    panel is read from beyond L2 once per unit, so more rows per unit read it less often (the
    capsule's 3.5 MB of B parts once per 32 rows streamed more bytes than its tile products
    took time; squeezenet's last convolution, 169 rows, ran 1.6x slower in 32-row units)."""
    per = k_steps * PARTS * BLOCK_ROWS * TILE_K * 2 + BLOCK_ROWS * tb * PACK * 4
    best = 1
    for g in range(2, MAX_BLOCKS + 1):
        if g * per > STACK_BYTES:
            break
        if m_size.is_const and others.is_const and \
                -(-m_size.value // (g * BLOCK_ROWS)) * others.value < MIN_UNITS:
            break
        best = g
    return best


def gemm(k: Kernel, info: dict, ra: Expr, g, bufs: dict[str, Buffer], packs: dict,
         cache: dict) -> bool:
    """Make ``k`` (a contraction of contraction.py's, classified as ``info``) an AMX gemm,
    which amxkernel.py emits, reading A through ``ra``: B split and packed as tiles (once per
    graph), K in A's stride order. False when A's K cannot be read in whole vectors."""
    ob, rb = bufs[k.out], info["b"]
    extents = {v: extent(v, ob, k.rdims).value for v in info["batch"] + info["n"] + info["k"]}
    found = k_order(ra, bufs[ra.arg[0]], info["k"], extents)
    if found is None:
        return False
    order, run, group = found
    dims = info["batch"] + info["n"] + order
    key = ("amx", rb.arg[0], rb, tuple(dims), tuple(extents.items()), tuple(info["n"]))
    const = g.constants[rb.arg[0]]
    name, data = _weights_pack(
        key, f"{rb.arg[0]}#amx", ("b", "nb", "ks", "part", "pair", "l", "e"), "u16",
        lambda: pack_b(gemm_pack_b(const.data, const.layout, rb, info["aff_b"], dims,
                                   extents, info["n"], order)), bufs, packs, cache)
    blocks = data.shape[1]
    tb = min(MAX_N // PACK, -(-blocks // 2) * 2)
    others = ex.const(data.shape[0] * -(-blocks // tb))
    nblk = unit_blocks(data.shape[2], tb, info["m_size"], others)
    k.gemm = Contraction(ra, name, data, info["batch"], info["m"], info["n"], order,
                         info["n_size"], info["k_size"], ex.const(blocks), RUN, tb,
                         TILE_ROWS, True, 2 * nblk, 1, amx=True, k_steps=data.shape[2],
                         run_dims=run, run_group=group)
    k.strategy = "gemm"
    return True


def _weights_pack(key: tuple, stem: str, axes: tuple[str, ...], dtype: str, make,
                  bufs: dict[str, Buffer], packs: dict, cache: dict) -> tuple[str, np.ndarray]:
    """(buffer name, data) of constant weights packed at build time: ``make()``d once per
    graph (``cache``, which every target of a build shares) and declared once per kernel list
    (``packs``), as a buffer named after ``stem`` with ``axes``."""
    if key not in packs:
        if key not in cache:
            cache[key] = make()
        data = cache[key]
        name = fresh_name(stem, bufs)
        bufs[name] = Buffer(name, axes, {d: ex.const(n) for d, n in zip(axes, data.shape)},
                            dtype)
        packs[key] = (name, data)
    return packs[key]
