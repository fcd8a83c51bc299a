"""The register tile of a GEMM kernel (gemm.Contraction's vl, tb and mr): how many PACK blocks
of columns and how many rows one micro-kernel step holds in vector registers, chosen for FMAs
per load, for the columns a ragged N would waste, and, where a dispatch has few units, for how
evenly a few threads share them.
"""

from __future__ import annotations

import math

from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.gemm import PACK
from mlpack.codegen.targets.cpu.indexing import is_one
from mlpack.codegen.targets.cpu.target import CpuTarget

MAX_MR = 12                  # rows per tile: each row keeps an A pointer in a general register
NARROW_MR = 8                # ... of a narrow N (narrow): one accumulator per FMA in flight
MIN_NARROW_MR = 3            # ... and at least this many, else the default tiling
BALANCE_THREADS = (2, 4)     # thread counts a dispatch of few units is balanced for


def narrow(t: CpuTarget, info: dict) -> int:
    """Vectors per tile row of an f32 GEMM whose N fits one tile of fewer vectors than the
    default tiling computes (0: the default), so no zero column is multiplied: a grouped
    convolution's 8 channels per group on AVX2 (one vector, not a block of two), or 24 output
    channels (one tile of three vectors, not two tiles of two)."""
    vl, ns = max(4, t.vector_bits // 32), info["n_size"]
    if info.get("pair") is not None or info["b"].dtype != "f32" or not ns.is_const:
        return 0
    need = -(-ns.value // vl)
    blocks = -(-ns.value // PACK)
    tb = tile_shape(t, blocks)[1]
    default = -(-blocks // tb) * tb * (PACK // vl)
    rows = (t.vector_registers - need - 2) // need
    return need if need < default and rows >= MIN_NARROW_MR else 0


def _balance(units: int) -> float:
    """The share of the threads busy when ``units`` equal units are shared out, the mean over
    BALANCE_THREADS: three units on two threads keep them 75% busy, four 100%."""
    return sum(units / (n * -(-units // n)) for n in BALANCE_THREADS) / len(BALANCE_THREADS)


def tile_shape(t: CpuTarget, blocks: int, pairs: bool = False,
               nvec: int = 0, balance: bool = False) -> tuple[int, int, int]:
    """(vl, tb, mr): vector lanes, PACK blocks per tile and rows per tile for ``t``.
    ``pairs``: a step holds both pairs' B vectors (pmaddwd's, gemm.PAIR_PRODUCTS) beside a
    broadcast and a product; ``nvec``: vectors per row of a narrow N (``narrow``), which leaves
    registers for more rows; ``balance``: the N tiles are the dispatch's only units (a batch
    of one whose M is one group, contraction.py's ``_group``), so a tile width that shares
    them evenly among a few threads is worth some FMAs per load (a late 1x1 convolution of
    7x7 pixels and 160 channels on AVX-512: four blocks a tile make three units, three make
    four)."""
    vl = max(4, t.vector_bits // 32)
    per_block = PACK // vl
    if nvec:
        return vl, -(-nvec // per_block), max(
            1, min(NARROW_MR, (t.vector_registers - nvec - 2) // nvec))

    def live(nv):   # registers a step needs besides the accumulators
        return 2 * nv + 2 if pairs else nv + 2

    def shape(tb):
        # accumulators, plus the step's B vectors and its temporaries, fit the registers
        nv = tb * per_block
        mr = max(1, min(MAX_MR, (t.vector_registers - live(nv)) // nv))
        fill = blocks / (-(-blocks // tb) * tb)        # padding columns are wasted work
        busy = _balance(-(-blocks // tb)) if balance else 1.0
        return busy * fill * (mr * nv) / (mr + nv), mr        # FMAs per load, times those
    tbs = [tb for tb in range(1, 5) if live(tb * per_block) + tb * per_block <= t.vector_registers]
    tb = max(tbs or [1], key=lambda x: shape(x)[0])
    mr = shape(tb)[1]
    return vl, tb, mr


# A K of at most this many steps over two dims or more (a stem convolution: 3 colours x 3 x 3)
SHORT_K = 32


def row_runs(mr: int, k_sizes: list[Expr], run: Expr) -> int:
    """The tile height for a contraction whose K is a few scattered steps (``k_sizes``: its K
    dims' extents), so that tiles never straddle two runs of the output's fastest M dim
    (``run``: its extent): the highest divisor of the run from ``mr`` down to ``mr // 2``, else
    ``mr``. A tile's rows are then one pointer plus constant steps (microkernel.py). Over such
    a K the rows' own pointers are most of the work: a 3 -> 32 stem had twelve, spilled around
    27 multiply-adds per row."""
    dims = [n for n in k_sizes if not is_one(n)]
    if len(dims) < 2 or not all(n.is_const for n in dims) or not run.is_const:
        return mr
    if math.prod(n.value for n in dims) > SHORT_K:
        return mr
    return next((h for h in range(mr, mr // 2 - 1, -1) if h and run.value % h == 0), mr)
