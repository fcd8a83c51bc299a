"""What the cpu target schedules: ``Buffer``, how a tensor lies in memory, and ``Kernel``, one
loop nest computing one tensor (kernels.py builds them from the graph and picks each one's
schedule; the other modules of this folder refine, lower and plan them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from mlpack.codegen.llvm.types import I64
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr


@dataclass
class Buffer:
    """How a tensor lies in memory: dims in layout order, their sizes, element type."""
    name: str
    layout: tuple[str, ...]
    sizes: dict[str, Expr]
    dtype: str
    packed: bool = True   # int4/int2/fp4 two (four) per byte; ports hold one per byte (narrowconv)

    def contiguous_dim(self) -> str | None:
        """The last layout dim that is not of constant size 1 (unit stride)."""
        for d in reversed(self.layout):
            s = self.sizes[d]
            if not (s.is_const and s.value == 1):
                return d
        return None


@dataclass
class Kernel:
    """One loop nest writing the tensor ``out``: a map (``reduce`` None), or a reduction over
    ``rdims`` whose value an ``epilogue`` may take on (kernels.py fuses it there)."""
    name: str
    out: str
    body: Expr                     # over the output's dim vars and the rdims
    reduce: str | None
    rdims: dict[str, Expr]         # in loop order, innermost last
    acc_dtype: str                 # the body's (reduction's) dtype
    epilogue: Expr | None = None   # over the output's dim vars and var kernels.ACC
    strategy: str = "map"          # "map", "row", "inner" (kernels.py), "gemm", "procedure"
    row_chunks: int = 1            # workgroup units per row (rows too few to share out)
    # outer dims of the output that one unit walks whole with its row
    # (kernels.block_rows: a reduction's operand that does not vary along them is read once
    # per unit and reduction step instead of once per row)
    block: tuple[str, ...] = ()
    reads: list[str] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)   # IR ops it computes, for messages
    gemm: object = None            # gemm.Contraction or depthwise.Direct when strategy == "gemm"
    window: int = 1                # terms per element of an unrolled window (unroll_window)
    checks: list = field(default_factory=list)   # (tensor, dim) per index check, once lowered
    # outer dims run one point at a time (tiles.py): never the row, never in ``block``
    points: tuple[str, ...] = ()
    # run once when the engine opens the artifact (the plan's "prepare"), not on every run: it
    # computes a tensor of the weights alone (a packed B panel, a weight relaid out) into the
    # artifact's packed region (plan.py)
    prepare: bool = False
    # a row block's member (rowblocks.py): its body's (wg, count) arguments are the [start,
    # end) of the units it runs, not a share of them
    ranged: bool = False
    # (a dim or rdim, an upper bound on its extent read at run time): a causal row block's
    # member loops over the keys up to its block's last query only (causal.py)
    bounded: tuple[str, Expr] | None = None

    @property
    def blocked(self) -> tuple[str, ...]:
        """``block`` where it applies: a row reduction's, or any kernel's of a point tile
        (kernels.point_block); a kernel made a gemm later has none."""
        return self.block if self.strategy == "row" or (self.points and self.strategy in (
            "map", "inner")) else ()


def exact_bytes(buf: Buffer) -> Expr:
    """The bytes ``buf``'s elements take (int4/int2/fp4 packed two or four to a byte)."""
    count = ex.product([buf.sizes[d] for d in buf.layout])
    per = 8 // dt.bits(buf.dtype) if buf.dtype != "bool" and dt.bits(buf.dtype) < 8 else 0
    # int4/int2/fp4 are packed two (four) to a byte: round the byte count up
    return ex.simplify_size(ex.floordiv(count + (per - 1), ex.const(per)) if per else count * ex.const(
        1 if buf.dtype == "bool" else dt.bits(buf.dtype) // 8))


def share(b: ir.IRBuilder, k: Kernel, units, wg, count):
    """[start, end) of ``units`` that workgroup ``wg`` of ``count`` runs: an even share, or
    for a row block's member (``Kernel.ranged``) the range its caller passes as (wg, count)."""
    w64, c64 = b.zext(wg, I64), b.zext(count, I64)
    if k.ranged:
        return w64, c64
    return b.udiv(b.mul(units, w64), c64), b.udiv(b.mul(units, b.add(w64, ir.Constant(I64, 1))), c64)
