"""A row reduction of one plain read, accumulated in vector registers.

The ``row`` strategy (kernels.py) keeps a reduction's accumulators in its output row: for each
reduction step, a loop along the row loads each accumulator, adds the step's term and stores
it back. Where the row is short (a global average pooling over a channels-last image, whose row
of channels is cut into chunks of 16 to share out: an SE block's squeeze), every step is then a
store and a load of the same vector, a chain through memory: EfficientNet-B0's 56x56x144 pool
took 0.115 ms, ONNX Runtime 0.029.

When the reduction's body is one read that walks the row at unit stride (the pooled tensor
itself, its producer not inlined), ``emit`` sums each vector of the row's chunk in a register
over every reduction step and stores it once. The chunk's last elements that do not fill a
vector, and the epilogue (a mean's division), go the ordinary way. The vectors are 16 floats
on every target (LLVM splits them into the target's registers: four of SSE's or NEON's), or
8 or 4 where a unit's chunk of the row is that short: RegNetY's SE pools, whose row is one
group's 8 channels (the channel dim split into groups for its grouped convolutions).
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.codegen.llvm.reduce import combine, identity
from mlpack.codegen.llvm.types import F32, I64

LANES = 16          # floats a vector holds (fewer where a unit's chunk of the row is shorter)
MIN_LANES = 4
KINDS = ("sum", "max", "min")


def applies(k, out, buffers, row: str | None) -> bool:
    """Whether kernel ``k`` (strategy row, writing ``out``) reduces one plain f32 read that
    walks ``row`` at unit stride, into an f32 output whose unit-stride dim is ``row``."""
    if row is None or k.reduce not in KINDS or k.acc_dtype != "f32" or out.dtype != "f32":
        return False
    if k.blocked or k.points or out.contiguous_dim() != row:
        return False
    body = k.body
    if body.op != "read" or body.arg[2] is not None or body.dtype != "f32":
        return False
    buf = buffers[body.arg[0]]
    inner = buf.contiguous_dim()
    index = dict(zip(body.arg[1], body.args))
    if inner is None or index.get(inner) is None or not lanes(k, out, row):
        return False
    at = index[inner]
    if at.op != "var" or at.arg != row:
        return False
    return all(row not in ex.free_vars(ix) for d, ix in index.items() if d != inner)


def lanes(k, out, row: str) -> int:
    """The vector's lanes: LANES, or fewer (a power of two, at least MIN_LANES) where a unit's
    chunk of the row is shorter, known at build time (a group's 8 channels: RegNet's SE pools,
    the channel dim split into groups for its grouped convolutions); 0: none fits."""
    size = out.sizes[row]
    if not size.is_const:
        return LANES
    chunk = size.value // max(1, k.row_chunks)
    n = LANES
    while n > chunk:
        n //= 2
    return n if n >= MIN_LANES else 0


def emit(L, row: str) -> object:
    """The whole vectors of the unit's row chunk (``L.j_range``), each summed in a register
    over the reduction and stored to the output; the first element past them (an i64), from
    which the caller finishes the chunk as before."""
    b, E, k = L.b, L.E, L.k
    j0, j1 = L.j_range
    width = lanes(k, L.out, row)
    vty = ir.VectorType(F32, width)
    with b.goto_entry_block():
        acc = b.alloca(vty, name="rowacc")
    start = identity(k.reduce, "f32")
    start = ir.Constant(vty, [start.constant] * width)
    whole = b.udiv(b.sub(j1, j0), ir.Constant(I64, width))
    read = k.body
    buf = L.buffers[read.arg[0]]
    index = dict(zip(read.arg[1], read.args))

    def step():
        ptr = E.address(read.arg[0], [E.cast(E(index[d]), index[d].dtype, "i64")
                                      for d in buf.layout])
        x = b.load(b.bitcast(ptr, vty.as_pointer()), typ=vty, align=4)
        b.store(combine(E, k.reduce, b.load(acc, typ=vty), x, "f32"), acc)

    with L.loops.loop(ir.Constant(I64, 0), whole, f"v.{row}", unroll=False) as v:
        at = b.add(j0, b.mul(v, ir.Constant(I64, width)))
        with E.scope(**{row: at}):
            b.store(start, acc)
            L._nest(list(k.rdims), step)
            out = L._out_ptr()
            b.store(b.load(acc, typ=vty), b.bitcast(out, vty.as_pointer()), align=4)
    return b.add(j0, b.mul(whole, ir.Constant(I64, width)))
