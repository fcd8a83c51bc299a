"""Integer operators onto the int8 kernels: QLinearConv, QLinearMatMul, ConvInteger and
MatMulInteger, whose sums the importer states exactly as ONNX defines them (in i32):

    y#i32[m, n] = sum_k (x[m, k] - zx) * (W[k, n] - zw[n])

with ``x`` a u8 activation (an i8 one keeps the widened sum), ``zx`` its zero point (per
tensor), ``W`` an 8-bit constant (or the i32 constant the importer folded ``W - zw`` into)
and ``zw`` its zero point (per tensor or per output channel). Where ``x`` is padded, its padding
holds ``zx`` (QLinearConv masks the centred value to 0 outside the image, ConvInteger pads the
shifted tensor with 0: both are ``x`` padded with ``zx``).

The same integer is, writing ``W - zw = W8 + off[n]`` with ``W8`` in [-128, 127] (``off`` is 0
where ``W - zw`` already fits, as s8 weights with a zero zero point do; else a per-channel shift,
possible where a channel's values span at most 256, as u8 weights' do),

    y#i32 = sum_k x[m, k] * W8[k, n]  +  off[n] * rows[m]  -  d[n]
    rows[m] = sum_k x[m, k],   d[n] = zx * (sum_k W8[k, n] + K * off[n])

whose first sum is the u8 x s8 one of intsum.py (``vpdpbusd``, ``pmaddwd``, SDOT, USDOT), the
row sums a cheap reduction made only when some ``off[n]`` is not zero (a zero point of the
weights, u8 weights), and the rest per-channel constants computed here: the result is the same i32,
bit for bit, and the requantization after it (the op's own f64 arithmetic) is untouched.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.precisions import intsum
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, Port, TensorType


def _integer(e: Expr, g: Graph) -> int | None:
    """The value of an integer literal or a one-element integer constant (through casts)."""
    while e.op == "cast":
        e = e.args[0]
    if e.is_const and float(e.value) == int(e.value):
        return int(e.value)
    if e.op == "read" and e.arg[0] in g.constants:
        data = g.constants[e.arg[0]].data
        if data.size == 1 and data.dtype.kind in "iu":
            return int(data.reshape(-1)[0])
    return None


def _centred(e: Expr, g: Graph) -> tuple[Expr, int] | None:
    """(the 8-bit read, its zero point) of ``cast<i32>(read)`` or ``cast<i32>(read) - z``."""
    zero = 0
    if e.op == "sub":
        e, z = e.args
        zero = _integer(z, g)
        if zero is None:
            return None
    if e.op == "cast" and e.dtype == "i32" and e.args[0].op == "read" \
            and e.args[0].dtype in ("u8", "i8"):
        return e.args[0], zero
    return None


def _activation(e: Expr, op: Comprehension, producers: dict, g: Graph) -> tuple[Expr, int] | None:
    """(read of the 8-bit activation with its padding, zero point) of the centred activation
    term ``e`` of ``op``'s integer sum, else None (see the module docstring for the forms)."""
    if e.op == "select" and _integer(e.args[2], g) == 0:
        hit = _centred(e.args[1], g)
        if hit is None or hit[0].arg[2] != 0 or not _inside(e.args[0], hit[0], op, g):
            return None
        x, zx = hit
        return Expr("read", x.args, (x.arg[0], x.arg[1], zx), x.dtype), zx
    hit = _centred(e, g)
    if hit is not None:
        return hit
    if e.op != "read" or e.dtype != "i32" or e.arg[2] not in (None, 0):
        return None
    copy = producers.get(e.arg[0])    # a shifted copy (ConvInteger, MatMulInteger)
    if copy is None or copy.reduce is not None:
        return None
    hit = _centred(copy.body, g)
    if hit is None or hit[0].arg[2] is not None:
        return None
    x, zx = hit
    moved = ex.substitute(x, dict(zip(e.arg[1], e.args)))
    pad = None if e.arg[2] is None else zx   # the copy's 0 outside is x's zero point
    return Expr("read", moved.args, (x.arg[0], x.arg[1], pad), x.dtype), zx


def _inside(cond: Expr, read: Expr, op: Comprehension, g: Graph) -> bool:
    """Whether ``cond`` holds exactly where ``read`` (in ``op``) is inside its tensor: a
    conjunction of ``index >= 0`` and ``index < size`` for each dim whose index is not a plain
    variable, and those span their dim exactly (QLinearConv's mask of its padding)."""
    terms, todo = set(), [cond]
    while todo:
        e = todo.pop()
        if e.op == "and":
            todo.extend(e.args)
        elif e.op in ("ge", "lt") and e.args[1].is_const:
            terms.add((e.op, e.args[0], int(e.args[1].value)))
        else:
            return False
    want = set()
    extents = {**op.type.dims, **op.rdims}
    for d, ix in zip(read.arg[1], read.args):
        size = g.types[read.arg[0]].dims[d]
        if ix.op == "var":
            if not ex.same_size(extents[ix.arg], size):
                return False
            continue
        if not size.is_const:
            return False
        want |= {("ge", ix, 0), ("lt", ix, size.value)}
    return terms == want


def _weight(e: Expr, op: Comprehension, g: Graph):
    """(the constant's read, its values minus the zero point as int64 over its layout, the
    channel dims) of the weight term ``e``: ``cast<i32>(W) - zw`` with ``zw`` a function of the
    output channels alone, ``cast<i32>(W)``, or an i32 constant ``W`` (a folded shift); W a
    constant read as it lies (intsum.channels). None when it is none of these."""
    zero = None
    if e.op == "sub":
        e, zero = e.args
        if set(ex.free_vars(zero)) & set(op.rdims) or ex.reads(zero) and any(
                r.arg[0] not in g.constants for r in ex.reads(zero)):
            return None
    if e.op == "cast" and e.dtype == "i32":
        e = e.args[0]
    if not (e.op == "read" and e.arg[0] in g.constants and e.arg[2] is None
            and e.dtype in ("u8", "i8", "i32")):
        return None
    chans = intsum.channels(op, e, g)
    if chans is None:
        return None
    c = g.constants[e.arg[0]]
    values = c.data.astype(np.int64)
    if zero is not None:
        z = _integer(zero, g)
        z = _per_channel(zero, e, c, chans, g) if z is None else np.int64(z)
        if z is None:
            return None
        values = values - z
    return e, values, chans


def _per_channel(zero: Expr, w: Expr, c, chans: list[str], g: Graph) -> np.ndarray | None:
    """``zero``, a function of the output vars indexing ``w``'s channel dims, evaluated at each
    channel: an int64 array over ``c.layout`` (size 1 on the other dims)."""
    from mlpack.spec.ir.interp import run_graph

    at = dict(zip(w.arg[1], w.args))
    var_dim = {at[d].arg: d for d in chans}
    if not set(ex.free_vars(zero)) <= set(var_dim):
        return None
    shape = dict(zip(c.layout, c.data.shape))
    dims = {v: ex.const(shape[d]) for v, d in var_dim.items()}
    probe = Graph("zero_point", constants=dict(g.constants), types=dict(g.types))
    probe.add_op(Comprehension("z", TensorType("i64", dims), ex.cast(zero, "i64")))
    probe.outputs.append(Port("z", tuple(dims)))
    try:
        z = np.asarray(run_graph(probe, {})["z"], dtype=np.int64)
    except Exception:   # (an expression the probe cannot evaluate: keep the op as it is)
        return None
    order = [d for d in c.layout if d in chans]            # z's axes: var_dim order
    z = np.transpose(z, [list(var_dim.values()).index(d) for d in order])
    return z.reshape([shape[d] if d in chans else 1 for d in c.layout])


def shifted(values: np.ndarray, layout, chans: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(W8 in [-128, 127], off per channel over ``layout``) with ``values = W8 + off``; None
    when a channel spans more than 256 values."""
    axes = tuple(i for i, d in enumerate(layout) if d not in chans)
    lo = values.min(axis=axes, keepdims=True)
    hi = values.max(axis=axes, keepdims=True)
    if np.any(hi - lo > 255):
        return None
    off = np.where((lo >= -128) & (hi <= 127), 0, lo + 128)
    return (values - off).astype(np.int8), off


def _match(op, producers: dict, g: Graph):
    """(activation read, zero point, weight read, its channel dims, W8, off) of an integer sum
    this rewrite takes (``shifted``), else None."""
    if not (isinstance(op, Comprehension) and op.reduce == "sum" and op.type.dtype == "i32"
            and op.body.op == "mul" and len(op.body.args) == 2
            and all(s.is_const for s in op.rdims.values())):
        return None
    if int(np.prod([s.value for s in op.rdims.values()])) < intsum.MIN_DEPTH:
        return None
    for a, b in (op.body.args, op.body.args[::-1]):
        x = _activation(a, op, producers, g)
        w = _weight(b, op, g)
        if x is None or w is None or x[0].dtype != "u8" or x[0].arg[0] in g.constants:
            continue
        split = shifted(w[1], g.constants[w[0].arg[0]].layout, w[2])
        if intsum.quad_dim(op, x[0]) is None or split is None:
            continue
        return (*x, w[0], w[2], *split)
    return None


def integer_sums(g: Graph) -> Graph:
    """``g`` with the integer sums of its QLinearConv, QLinearMatMul, ConvInteger and
    MatMulInteger ops as u8 x s8 sums (see the module docstring); ``g`` itself when none."""
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    rw, changed = None, {}
    for op in g.ops:
        hit = _match(op, producers, g)
        if hit is None:
            continue
        x, zx, w, chans, w8, off = hit
        c = g.constants[w.arg[0]]
        rw = rw or intsum.IntegerRewrite(g)
        pad = None if x.arg[2] is None else int(x.arg[2])
        sop, ch_layout, ch_index = rw.integer_sum(op, x, w, x.arg[0], pad, w8, zx)
        changed[id(op)] = [sop] + corrections(rw, op, sop, x, w, c, w8, off, zx, ch_layout,
                                               ch_index)
    if not changed:
        return g
    ops = []
    for op in g.ops:   # (copies: fusion rewrites bodies in place)
        ops.extend(changed.get(id(op), [replace(op) if isinstance(op, Comprehension) else op]))
    # the corrections join the requantization that reads them, and with it the sum's epilogue;
    # a shifted copy no sum reads any more goes
    return eliminate_dead_code(fuse_elementwise(
        replace(g, ops=ops, constants=rw.constants, types=rw.types)))


def has_integer_sums(g: Graph) -> bool:
    """Whether ``g`` has an integer sum this rewrite takes (a model that quantized itself
    with QLinearConv, ConvInteger, ...)."""
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    return any(_match(op, producers, g) is not None for op in g.ops)


def corrections(rw, op: Comprehension, sop: Comprehension, x: Expr, w: Expr, c, w8, off,
                zx: int, ch_layout: list[str], ch_index: dict,
                out: str | None = None) -> list[Comprehension]:
    """The row sums of ``x`` (where some channel is shifted) and the map that gives ``op``'s
    integer sum from ``sop``'s, as ``out`` (``op``'s own output when None):
    ``sop + off[n] * rows[m] - zx * (colsum(W8)[n] + K * off[n])``."""
    k = int(np.prod([s.value for s in op.rdims.values()]))
    shape = [c.data.shape[c.layout.index(d)] for d in ch_layout]
    ch_dims = {d: c.type.dims[d] for d in ch_layout}
    offs = off.reshape(shape).astype(np.int64)
    d = zx * (intsum.column_sums(w8, c.layout, ch_layout).reshape(shape) + k * offs)
    rows_op = []
    value = ex.read(sop.out, {v: ex.var(v) for v in op.type.dims}, "i32")
    if np.any(d):
        dname = rw.constant(f"{w.arg[0]}#zsum", "i32", ch_dims, ch_layout, d.astype(np.int32))
        value = ex.sub(value, ex.read(dname, ch_index, "i32"))
    if np.any(offs):
        used = set(ex.free_vars(x))
        rdims = {v: s for v, s in op.type.dims.items() if v in used}
        rows = intsum.fresh(f"{op.out}#rows", rw.taken)
        rows_op.append(replace(op, out=rows, type=TensorType("i32", rdims),
                               body=ex.cast(x, "i32")))
        rw.types[rows] = rows_op[-1].type
        oname = rw.constant(f"{w.arg[0]}#off", "i32", ch_dims, ch_layout, offs.astype(np.int32))
        value = ex.add(value, ex.mul(ex.read(oname, ch_index, "i32"),
                                     ex.read(rows, {v: ex.var(v) for v in rdims}, "i32")))
    return rows_op + [Comprehension(out or op.out, TensorType("i32", dict(op.type.dims)), value)]
