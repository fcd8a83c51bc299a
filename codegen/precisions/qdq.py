"""Quantized models onto integer sums: in the int8 precision, a QDQ contraction becomes the
exact i32 sum of intsum.py.

A model quantized by ONNX Runtime's ``quantize_static`` (QDQ format) or exported with fake
quantization states its integer arithmetic as float ops around each contraction:

    x#dq = (f32(x#u8) - zx) * sx             DequantizeLinear of an activation (per tensor)
    W#dq = (f32(W#i8) - 0) * sw[c]           DequantizeLinear of an int8 weight constant
    y    = sum_k x#dq[...] * W#dq[...]       the convolution or matmul, in f32

The sum is the same number as ``(sum_k i32(x#u8) * i32(W#i8) - zx * colsum(W#i8)) * sx * sw``,
computed exactly, which is what ONNX Runtime's own QDQ fusion runs and what the int8 precision
makes of a float model, so the int8 precision (int8.py) rewrites such a contraction into that
form first and it runs on the same integer kernels (``vpdpbusd``, SDOT, USDOT, or 32-bit lanes):
the scales and integers are the model's, nothing is calibrated or rounded again. The results
differ from the float formulation only by the float sum's rounding, which the rewrite removes.
The other precisions keep the float form (fast float kernels on the dequantized weights, which
fold_constants.py evaluates once).

Matched: a sum of two reads, one of a map dequantizing a u8 tensor per tensor, the other of a
map dequantizing an i8 constant with zero zero points and a per-tensor or per-output-channel
scale, deep enough and shaped as the integer kernels take them (``intsum.MIN_DEPTH``, a
reduction dim read in fours). Anything else keeps its float form.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fold_constants import fold_constant_maps
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.precisions import intsum, qlinear
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, TensorType


def _number(e: Expr, g: Graph) -> float | None:
    """The value of a literal, or of a read of a one-element constant, else None."""
    while e.op == "cast":
        e = e.args[0]
    if e.is_const:
        return float(e.value)
    if e.op == "read" and e.arg[0] in g.constants and g.constants[e.arg[0]].data.size == 1:
        return float(g.constants[e.arg[0]].data.reshape(-1)[0])
    return None


def _dequantized(body: Expr) -> tuple[Expr, Expr | None, Expr] | None:
    """(integer operand, zero point or None, scale) of ``(f32(q) - z) * s``, else None."""
    if body.op != "mul" or body.dtype != "f32" or len(body.args) != 2:
        return None
    for value, scale in (body.args, body.args[::-1]):
        zero = None
        if value.op == "sub":
            value, zero = value.args
        if value.op == "cast" and value.args[0].dtype in ("u8", "i8"):
            return value.args[0], zero, scale
    return None


def _activation(e: Expr, producers: dict, g: Graph):
    """(the u8 expression the map ``e`` reads dequantizes, scale, zero point) when that map
    dequantizes a u8 value per tensor; else None."""
    op = producers.get(e.arg[0])
    if op is None or op.reduce is not None or e.arg[2] not in (None, 0.0):
        return None
    parts = _dequantized(op.body)
    if parts is None:
        return None
    q, zero, scale = parts
    sx, zx = _number(scale, g), 0.0 if zero is None else _number(zero, g)
    if q.dtype != "u8" or sx is None or zx is None or not (sx > 0 and np.isfinite(sx)) \
            or zx != round(zx) or not 0 <= zx <= 255:
        return None
    return q, sx, int(zx)


def _weight(e: Expr, producers: dict, g: Graph):
    """(read of the 8-bit constant in place of ``e``, scale and zero point as arrays over the
    constant's layout, size 1 where they do not vary) when ``e`` reads a map dequantizing an
    8-bit constant per tensor or per output channel; else None."""
    op = producers.get(e.arg[0])
    if op is None or op.reduce is not None or e.arg[2] is not None:
        return None
    parts = _dequantized(op.body)
    if parts is None:
        return None
    q, zero, scale = parts
    if q.op != "read" or q.dtype not in ("i8", "u8") or q.arg[0] not in g.constants \
            or q.arg[2] is not None:
        return None
    if not all(i.op == "var" and i.arg == d for d, i in zip(q.arg[1], q.args)) \
            or set(q.arg[1]) != set(op.type.dims):
        return None   # the map reads the constant as it lies, one element per output
    c = g.constants[q.arg[0]]
    zw = np.zeros([1] * c.data.ndim, dtype=np.int64)
    if zero is not None and not _all_zero(zero, g):
        zw = _number(zero, g)
        zw = _per_channel(zero, c, g) if zw is None else np.full([1] * c.data.ndim, zw)
        if zw is None or np.any(zw != np.round(zw)):
            return None
        zw = zw.astype(np.int64)
    per_tensor = _number(scale, g)
    if per_tensor is not None:
        sw = np.full([1] * c.data.ndim, per_tensor)
    else:
        sw = _per_channel(scale, c, g)
        if sw is None:
            return None
    if not (np.all(sw > 0) and np.all(np.isfinite(sw))):
        return None
    at = dict(zip(e.arg[1], e.args))
    moved = ex.substitute(q, at)
    return Expr("read", moved.args, q.arg, q.dtype), sw, zw


def _all_zero(e: Expr, g: Graph) -> bool:
    """Whether ``e`` is a literal zero or reads a constant of zeros (a zero point)."""
    while e.op == "cast":
        e = e.args[0]
    if e.is_const:
        return e.value == 0
    return e.op == "read" and e.arg[0] in g.constants and not np.any(g.constants[e.arg[0]].data)


def _per_channel(scale: Expr, c: Constant, g: Graph) -> np.ndarray | None:
    """A scale read ``S[d=v]`` of one dim of the weight ``c``, as an array over ``c.layout``
    (size 1 on every other dim), else None."""
    while scale.op == "cast":
        scale = scale.args[0]
    if scale.op != "read" or scale.arg[0] not in g.constants or scale.arg[2] is not None:
        return None
    s = g.constants[scale.arg[0]]
    used = [(d, i) for d, i in zip(scale.arg[1], scale.args) if not (i.is_const and i.value == 0)]
    if len(used) != 1 or used[0][1].op != "var" or used[0][1].arg not in c.layout:
        return None
    dim = used[0][1].arg
    values = s.data.reshape(-1).astype(np.float64)
    if values.size != c.data.shape[c.layout.index(dim)]:
        return None
    shape = [values.size if d == dim else 1 for d in c.layout]
    return values.reshape(shape)


def _match(op: Comprehension, producers: dict, g: Graph):
    """(activation read, its u8 expression, sx, zx, weight read, weight scale) of a QDQ
    contraction, else None. The activation read is ``op``'s own read of the dequantizing map;
    the weight read reads the i8 constant where ``op`` read its dequantized map."""
    if not (op.reduce == "sum" and op.type.dtype == "f32" and op.body.op == "mul"
            and len(op.body.args) == 2 and all(a.op == "read" for a in op.body.args)
            and all(s.is_const for s in op.rdims.values())):
        return None
    if int(np.prod([s.value for s in op.rdims.values()])) < intsum.MIN_DEPTH:
        return None
    for a, b in (op.body.args, op.body.args[::-1]):
        x, w = _activation(a, producers, g), _weight(b, producers, g)
        if x is None or w is None:
            continue
        (q, sx, zx), (wr, sw, zw) = x, w
        channels = intsum.channels(op, wr, g)
        if channels is None or intsum.quad_dim(op, a) is None:
            continue
        c = g.constants[wr.arg[0]]
        if any(p.shape[i] > 1 and d not in channels for p in (sw, zw)
               for i, d in enumerate(c.layout)):
            continue   # a scale or zero point that varies along the sum cannot leave it
        keep = [c.data.shape[i] if d in channels else 1 for i, d in enumerate(c.layout)]
        values = c.data.astype(np.int64) - zw
        split = qlinear.shifted(values, c.layout, channels)   # W - zw = W8 + off[n]
        if split is None:
            continue
        return a, q, sx, zx, wr, np.broadcast_to(sw, keep), split
    return None


def _shifted_contraction(rw, op, xq, wr, u8, sx, zx, sw, w8, off, g) -> list[Comprehension]:
    """``op`` over weights with a zero point (or u8 ones): the u8 x s8 sum of ``W8`` with the
    row-sum correction of qlinear.py, in i32, then its dequantization by ``sx * sw``."""
    c = g.constants[wr.arg[0]]
    pad = None if xq.arg[2] is None else zx
    sop, ch_layout, ch_index = rw.integer_sum(op, xq, wr, u8, pad, w8, zx)
    total = intsum.fresh(f"{op.out}#sum", rw.taken)
    x = Expr("read", xq.args, (u8, xq.arg[1], pad), "u8")   # (its padding: the zero point)
    fixes = qlinear.corrections(rw, op, sop, x, wr, c, w8, off, zx, ch_layout, ch_index, total)
    rw.types[total] = fixes[-1].type
    shape = [c.data.shape[c.layout.index(d)] for d in ch_layout]
    sname = rw.constant(f"{wr.arg[0]}#scale", "f32", {d: c.type.dims[d] for d in ch_layout},
                        ch_layout, (sx * sw).astype(np.float32).reshape(shape))
    deq = ex.mul(ex.cast(ex.read(total, {d: ex.var(d) for d in op.type.dims}, "i32"), "f32"),
                 ex.read(sname, ch_index, "f32"))
    return [sop, *fixes, Comprehension(op.out, op.type, deq)]


def integer_contractions(g: Graph) -> Graph:
    """``g`` with its QDQ contractions as exact i32 sums (see the module docstring), and the
    maps of constants left (dequantized weights no integer sum took) evaluated."""
    producers = {op.out: op for op in g.ops if isinstance(op, Comprehension)}
    rw, changed = None, {}
    split: dict[str, Comprehension] = {}   # dequantizing map -> the u8 tensor it now reads
    for op in g.ops:
        if not isinstance(op, Comprehension):
            continue
        hit = _match(op, producers, g)
        if hit is None:
            continue
        xr, q, sx, zx, wr, sw, (w8, off) = hit
        rw = rw or intsum.IntegerRewrite(g)
        dq = producers[xr.arg[0]]
        if dq.out not in split:   # its u8 value becomes a tensor of its own, read by both
            name = intsum.fresh(f"{dq.out}#u8", rw.taken)
            split[dq.out] = Comprehension(name, TensorType("u8", dict(dq.type.dims)), q)
            rw.types[name] = split[dq.out].type
        u8 = split[dq.out].out
        xq = Expr("read", xr.args, (u8, xr.arg[1], xr.arg[2]), "u8")
        if not np.any(off):   # (s8 weights with a zero zero point: the common case)
            changed[id(op)] = rw.contraction(op, xq, wr, u8, sx, zx, quantized=(w8, sw))
        else:
            changed[id(op)] = _shifted_contraction(rw, op, xq, wr, u8, sx, zx, sw, w8, off, g)
    if not changed:
        return fold_constant_maps(g)
    ops = []
    for op in g.ops:   # (copies: fusion rewrites bodies in place)
        if isinstance(op, Comprehension) and op.out in split:
            u8 = split[op.out]   # its body is the u8 node of op's body: replaced by a read
            read = ex.read(u8.out, {d: ex.var(d) for d in op.type.dims}, "u8")
            ops += [u8, replace(op, body=ex.replace_node(op.body, u8.body, read))]
        else:
            ops.extend(changed.get(id(op), [replace(op) if isinstance(op, Comprehension) else op]))
    # fusion puts each dequantization into its sum's epilogue, as in int8.rewrite
    g = eliminate_dead_code(fuse_elementwise(
        replace(g, ops=ops, constants=rw.constants, types=rw.types)))
    return fold_constant_maps(g)

