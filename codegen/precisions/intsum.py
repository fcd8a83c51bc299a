"""The exact integer form of a contraction, shared by the int8 precision and quantized models.

``y = sum_k x[...] * W[...]`` with ``x`` quantized per tensor to u8 (scale ``sx``, zero point
``zx``) and ``W`` per output channel to i8 (scale ``sw``, no zero point) is

* ``y#i32 = sum_k i32(x#u8[...]) * i32(W#i8[...])``, exact in 32 bits, and
* ``y = f32(y#i32 - W#zsum) * W#scale`` with ``W#zsum = zx * sum_k W#i8`` (one constant per
  channel: the zero point's share) and ``W#scale = sx * sw``.

The int8 precision (int8.py) reaches it from a float model by calibrating ``x`` and rounding
``W``; a model that arrives quantized (QDQ, qdq.py) states ``x#u8``, ``W#i8`` and the scales
itself. Either way the cpu target multiplies the bytes in fours where it has the instructions,
which needs a reduction dim that indexes one of ``x``'s dims alone (``quad_dim``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, TensorType

MIN_DEPTH = 32          # a shallower sum (a 3x3 depthwise window) gains nothing from 8 bits
QUAD = 4                # products per 32-bit lane of the dot-product instructions
QMAX_W = 127            # weights in [-127, 127]: symmetric, so the scale alone dequantizes


def quad_dim(op: Comprehension, x: Expr) -> tuple[str, int] | None:
    """(reduction dim, its extent rounded up to a multiple of four) of a reduction dim that
    indexes one of ``x``'s dims alone (the dim a target lays out innermost to multiply in runs
    of four): one whose extent is already a multiple if there is one, else the one that grows
    least (an RGB input's three channels become four, the fourth of zero weight); or None."""
    found = [(ix.arg, op.rdims[ix.arg].value) for ix in x.args
             if ix.op == "var" and ix.arg in op.rdims]
    if not found:
        return None
    v, ext = min(found, key=lambda f: (-f[1] % QUAD) / f[1])
    return v, ext + -ext % QUAD


def channels(op: Comprehension, w: Expr, g: Graph) -> list[str] | None:
    """The dims of weight ``w`` indexed by an output var (its output channels), when every other
    dim is indexed by its own reduction var over the whole dim or is of size 1 read at 0 (a
    weight read as it lies: the sum over the reduction reads each element once); else None."""
    c = g.constants[w.arg[0]]
    shape = dict(zip(c.layout, c.data.shape))
    channels, seen = [], set()
    for d, ix in zip(w.arg[1], w.args):
        if ix.op == "var" and ix.arg in op.type.dims:
            channels.append(d)
        elif ix.op == "var" and ix.arg in op.rdims and ix.arg not in seen \
                and op.rdims[ix.arg].value == shape[d]:
            seen.add(ix.arg)
        elif not (ix.is_const and ix.value == 0 and shape[d] == 1):
            return None
    return channels


def fresh(stem: str, taken: set[str]) -> str:
    name, i = stem, 1
    while name in taken:
        i += 1
        name = f"{stem}{i}"
    taken.add(name)
    return name


def quantize_weight(c: Constant, channels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, per-channel scale over ``channels`` in ``c.layout`` order) of ``c``."""
    axes = tuple(i for i, d in enumerate(c.layout) if d not in channels)
    top = np.max(np.abs(c.data.astype(np.float64)), axis=axes, keepdims=True)
    scale = np.where(top > 0, top / QMAX_W, 1.0)
    q = np.clip(np.round(c.data / scale), -QMAX_W, QMAX_W).astype(np.int8)
    return q, scale


class IntegerRewrite:
    """The new tensors of one int8 rewrite: constants, types and fresh names."""

    def __init__(self, g: Graph):
        self.g = g
        self.constants, self.types = dict(g.constants), dict(g.types)
        self.taken = set(g.types) | set(g.constants)

    def constant(self, stem: str, dtype: str, dims: dict, layout, data) -> str:
        name = fresh(stem, self.taken)
        self.constants[name] = Constant(name, TensorType(dtype, dict(dims)), tuple(layout), data)
        self.types[name] = self.constants[name].type
        return name

    def contraction(self, op: Comprehension, x: Expr, w: Expr, q: str, sx: float,
                    zx: int, quantized=None) -> list[Comprehension]:
        """``op`` as the i32 sum of ``q`` (``x`` quantized) times ``w`` quantized per output
        channel, and the map that dequantizes it into ``op``'s output. ``quantized``: the
        weight's (int8 values, per-channel scale) where the model gives them (a QDQ model's
        weights, codegen/passes/qdq.py), else ``w``'s values are quantized here."""
        c = self.g.constants[w.arg[0]]
        wq, sw = quantized if quantized is not None else quantize_weight(c, channels(op, w, self.g))
        sop, ch_layout, ch_index = self.integer_sum(op, x, w, q, None if x.arg[2] is None else zx,
                                                    wq, zx)
        ch_shape = [c.data.shape[c.layout.index(d)] for d in ch_layout]
        ch_dims = {d: c.type.dims[d] for d in ch_layout}
        zname = self.constant(f"{w.arg[0]}#zsum", "i32", ch_dims, ch_layout,
                              (zx * column_sums(wq, c.layout, ch_layout)).astype(np.int32)
                              .reshape(ch_shape))
        sname = self.constant(f"{w.arg[0]}#scale", "f32", ch_dims, ch_layout,
                              (sx * sw).astype(np.float32).reshape(ch_shape))
        deq = ex.mul(ex.cast(ex.sub(ex.read(sop.out, {d: ex.var(d) for d in op.type.dims}, "i32"),
                                    ex.read(zname, ch_index, "i32")), "f32"),
                     ex.read(sname, ch_index, "f32"))
        return [sop, Comprehension(op.out, op.type, deq)]

    def integer_sum(self, op: Comprehension, x: Expr, w: Expr, q: str, pad: int | None,
                    wq: np.ndarray, fill: int) -> tuple[Comprehension, list[str], dict[str, Expr]]:
        """(``sum_k i32(q#u8[x's index; pad]) * i32(W#i8[w's index])`` as a new i32 tensor,
        W's output-channel dims in its layout order, their index in ``op``): ``wq`` is W's int8
        values as ``w``'s constant lies. K grows to whole quads (``quad_dim``) with zero
        weights, where x is then read past its end (at ``fill`` if it had no padding)."""
        c = self.g.constants[w.arg[0]]
        chans = channels(op, w, self.g)
        dims = dict(c.type.dims)
        qv, qext = quad_dim(op, x)
        if qext != op.rdims[qv].value:   # K grown to whole quads: zero weights, x read guarded
            d = next(d for d, ix in zip(w.arg[1], w.args) if ix.op == "var" and ix.arg == qv)
            widths = [(0, 0)] * wq.ndim
            widths[c.layout.index(d)] = (0, qext - dims[d].value)
            wq, dims[d] = np.pad(wq, widths), ex.const(qext)
            op = replace(op, rdims={**op.rdims, qv: ex.const(qext)})
            pad = fill if pad is None else pad
        wname = self.constant(f"{w.arg[0]}#i8", "i8", dims, c.layout, wq)
        ch_layout = [d for d in c.layout if d in chans]
        at = dict(zip(w.arg[1], w.args))
        xq = Expr("read", x.args, (q, x.arg[1], pad), "u8")
        wr = Expr("read", w.args, (wname, w.arg[1], None), "i8")
        acc = fresh(f"{op.out}#i32", self.taken)
        sop = replace(op, out=acc, type=TensorType("i32", dict(op.type.dims)),
                      body=ex.mul(ex.cast(xq, "i32"), ex.cast(wr, "i32")))
        self.types[acc] = sop.type
        return sop, ch_layout, {d: at[d] for d in ch_layout}


def column_sums(wq: np.ndarray, layout, ch_layout) -> np.ndarray:
    """Per output channel (the dims ``ch_layout`` of ``wq``'s ``layout``), the sum of its
    int8 weights, as int64 in ``ch_layout`` order."""
    return wq.astype(np.int64).sum(axis=tuple(i for i, d in enumerate(layout)
                                              if d not in ch_layout))
