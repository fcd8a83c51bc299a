"""int8: contractions multiply 8-bit integers and sum them in 32 bits; everything else stays f32.

A contraction ``y = sum_k x[...] * W[...]`` of an f32 activation ``x`` and a weight ``W`` (a
constant, codegen/precisions/weights16.py's ``weights``) whose depth is at least ``MIN_DEPTH``
and that sums along a dim ``x`` could hold at unit stride in runs of four (``intsum.quad_dim``: the
shape the integer dot-product instructions take) becomes:

* ``x#u8 = u8(clamp(round(x / sx) + zx, 0, 255))``: ``x`` quantized per tensor, asymmetric, with
  the range ``calibrate`` chose for it (shared by every contraction that reads ``x``; 0.0 maps
  to ``zx`` exactly, so a convolution's zero padding reads ``zx``);
* ``y#i32 = sum_k i32(x#u8[...]) * i32(W#i8[...])``: ``W`` quantized per output channel,
  symmetric in [-127, 127] (its largest magnitude per channel is 127: min-max, which for weights
  is what ONNX Runtime's quantizer does too); the sum is exact;
* ``y = f32(y#i32 - W#zsum) * W#scale``: ``W#zsum = zx * sum_k W#i8`` removes the zero point
  and ``W#scale = sx * sw`` (per channel) dequantizes.

Elementwise fusion then runs again, so the dequantization joins the maps that read ``y``
(bias, activation: the contraction's epilogue on the cpu target) and the quantization of the
next layer's input joins the map that produced it: a convolution's epilogue writes the next
one's u8 input. A max pooling between the two is quantized before it (``_max_pools``: the
byte of the max is the max of the bytes), so the contraction before it writes bytes and the
pooling takes their max. Contractions that are too shallow (depthwise convolutions, a first
convolution over the model's input) or read no weight (attention's products) stay f32. So does a
contraction over a model input whose K would have to grow to whole quads: the first
convolution over an image's three channels (the random-weight resnet50 of the benchmark set
doubles its error, 0.27 to 0.50, when it reads 8-bit pixels; a K dim of an activation computed
inside the model grows with zero weights, read as the zero point).

Activation ranges come from running the f32 graph on calibration inputs (``calibrate``): for
each tensor, min-max and clipping at the 99.9th, 99.99th and 99.999th percentiles are tried,
and the range whose quantization error (mean squared, over the observed values) is smallest
is kept. The cpu target multiplies with ``vpdpbusd`` (AVX512_VNNI), SDOT or USDOT where it has
them, with ``pmaddwd`` on i16 pairs on other x86 levels, else widens to 32-bit lanes
(codegen/targets/cpu/microkernel.py). Per-channel affine maps after a contraction (batch norms)
are folded into its weights first (``_scales_folded``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fold_constants import fold_constant_maps
from mlpack.codegen.passes.fold_scale import fold_scales
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.precisions.intsum import (MIN_DEPTH, IntegerRewrite, channels, fresh,
                                              quad_dim)
from mlpack.codegen.precisions.qdq import integer_contractions
from mlpack.codegen.precisions.qlinear import has_integer_sums, integer_sums
from mlpack.codegen.precisions.weights16 import weights
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType, tensors_read

NAME = "int8"
SUMMARY = "weights int8 per output channel, activations uint8 per tensor (calibrated), sums int32"
IMPLEMENTED = True
DEFAULT = False

PERCENTILES = (None, 99.9, 99.99, 99.999)   # range candidates; None: min-max
SAMPLE = 1 << 16        # values kept per tensor and case to compare the candidates on


class CalibrationError(UnsupportedTargetError):
    """The int8 rewrite was asked for without the ranges calibration gives."""


# ---------------------------------------------------------------- which contractions


def _split_product(op: Comprehension, g: Graph, candidates: set[str],
                   inputs: set[str]) -> tuple[Expr, Expr] | None:
    """(activation read, weight read) of a contraction int8 can take, else None."""
    if not (op.reduce == "sum" and op.type.dtype == "f32" and op.body.op == "mul"
            and len(op.body.args) == 2):
        return None
    a, b = op.body.args
    if a.op == "read" and a.arg[0] in candidates:
        a, b = b, a
    if not (b.op == "read" and b.arg[0] in candidates and b.arg[2] is None):
        return None
    if not (a.op == "read" and a.dtype == "f32" and a.arg[0] not in g.constants
            and a.arg[2] in (None, 0.0)):
        return None
    if not all(s.is_const for s in op.rdims.values()):
        return None
    if int(np.prod([s.value for s in op.rdims.values()])) < MIN_DEPTH:
        return None
    quad = quad_dim(op, a)
    if quad is None or channels(op, b, g) is None:
        return None
    if a.arg[0] in inputs and quad[1] != op.rdims[quad[0]].value:
        return None   # a first convolution over an image's channels (see the top)
    return a, b


def contractions(g: Graph) -> list[tuple[Comprehension, Expr, Expr]]:
    """(op, activation read, weight read) of each contraction the int8 rewrite quantizes."""
    candidates = set(weights(g))
    out = []
    for op in g.ops:
        if isinstance(op, Comprehension):
            hit = _split_product(op, g, candidates, {p.name for p in g.inputs})
            if hit is not None:
                out.append((op, *hit))
    return out


def quantizes(g: Graph) -> bool:
    """Whether ``g`` rounds values to 8-bit integers itself (``cast<u8>(... round(...))``: a
    QuantizeLinear, QLinearConv, ...): a model that arrives quantized. Its outputs step where
    its roundings do, so any two correct computations of it (ONNX Runtime's integer kernels, the
    float64 reference) may differ by a quantization step anywhere, as int8 artifacts do."""
    for op in g.ops:
        if isinstance(op, Comprehension):
            for n in ex.walk(op.body):
                if n.op == "cast" and n.dtype in ("u8", "i8") and any(
                        m.op == "round" for m in ex.walk(n.args[0])):
                    return True
    return has_integer_sums(g)   # ConvInteger, MatMulInteger: sums of its own 8-bit integers


# ---------------------------------------------------------------- calibration


def quantize_params(lo: float, hi: float) -> tuple[float, int]:
    """(scale, zero point) of u8 over [lo, hi] (widened to hold 0.0, which maps to the zero
    point exactly)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0
    if not np.isfinite(scale) or scale <= 0.0:
        return 1.0, 0
    return scale, int(np.clip(np.round(-lo / scale), 0, 255))


def _qdq(v: np.ndarray, scale: float, zero: int) -> np.ndarray:
    q = np.clip(np.round(v / scale) + zero, 0, 255)
    return (q - zero) * scale


def choose_range(samples: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The range, of min-max and the PERCENTILES clippings, whose quantization of ``samples``
    has the smallest mean squared error (min-max on a tie)."""
    best, err = (lo, hi), None
    for p in PERCENTILES:
        cand = (lo, hi) if p is None else (float(np.percentile(samples, 100.0 - p)),
                                           float(np.percentile(samples, p)))
        e = float(np.mean((_qdq(samples, *quantize_params(*cand)) - samples) ** 2))
        if err is None or e < err:
            best, err = cand, e
    return best


def calibrate(g: Graph, feeds: list[dict]) -> dict[str, tuple[float, float]]:
    """{activation: (lo, hi)} for every activation an int8 contraction of ``g`` reads, from
    running ``g`` (f32, the reference interpreter) on each input set of ``feeds``."""
    from mlpack.spec.ir.interp import run_graph

    if quantizes(g):   # a model quantized by its author keeps its own quantization: its
        return {}      # QDQ contractions go on the integer sums (qdq.py), nothing else does
    wanted = {x.arg[0] for _, x, _ in contractions(g)}
    if not wanted:
        return {}
    rng = np.random.default_rng(0)
    seen: dict[str, list] = {n: [np.inf, -np.inf, []] for n in wanted}

    def observe(name, data):
        if name in seen:
            v = np.asarray(data, dtype=np.float64).reshape(-1)
            v = v[np.isfinite(v)]
            if v.size == 0:
                return
            s = seen[name]
            s[0], s[1] = min(s[0], float(v.min())), max(s[1], float(v.max()))
            s[2].append(v if v.size <= SAMPLE else rng.choice(v, SAMPLE, replace=False))
    for feed in feeds:
        run_graph(g, feed, observe)
    return {n: choose_range(np.concatenate(s[2]), s[0], s[1])
            for n, s in seen.items() if s[2]}


def most_sensitive(g: Graph, calibration: dict, feed: dict) -> list[str]:
    """The activations ``calibration`` quantizes, the one whose quantization alone moves the
    model's outputs most first (each quantized on its own, run on ``feed`` with the reference
    interpreter, measured as the worst output's max_error against the f32 graph). Keeping the
    first few in f32 is how a build whose int8 artifact misses the tolerance tries again
    (packager/build.py); a tensor's own rounding noise ranks them worse (a long-tailed
    activation is not always one the model amplifies)."""
    from mlpack.spec import accuracy
    from mlpack.spec.ir.interp import run_graph

    names = [p.name for p in g.outputs]
    want = run_graph(g, feed)
    moved = {}
    for n in calibration:
        got = run_graph(rewrite(g, {n: calibration[n]}), feed)
        moved[n] = max(accuracy.measure(got[o], want[o]).max_error for o in names)
    return sorted(moved, key=lambda n: (-moved[n], n))


# ---------------------------------------------------------------- the rewrite


def _quantize_map(x: str, q: str, dims: dict, sx: float, zx: int) -> Comprehension:
    """``q = u8(clamp(round(x / sx) + zx, 0, 255))`` over ``x``'s dims."""
    value = ex.unary("round", ex.mul(ex.read(x, {d: ex.var(d) for d in dims}, "f32"),
                                     ex.const(1.0 / sx, "f32")))
    if zx:
        value = ex.binary("add", value, ex.const(float(zx), "f32"))
    clamped = ex.minimum(ex.maximum(value, ex.const(0.0, "f32")), ex.const(255.0, "f32"))
    # (through i32: the value is already in range, and a float-to-i32 conversion vectorizes
    # at full width where one to u8 goes through i64 lanes)
    return Comprehension(q, TensorType("u8", dims), ex.cast(ex.cast(clamped, "i32"), "u8"))


def rewrite(g: Graph, calibration: dict | None = None) -> Graph:
    """``g`` with its int8 contractions (``contractions``) quantized with the activation ranges
    of ``calibration`` (``calibrate``'s result), after the contractions the model quantizes
    itself (QDQ: qdq.py) are put on the same integer sums; ``g`` itself when there are none."""
    g = integer_contractions(integer_sums(g))
    if not contractions(g):
        return g
    g = _scales_folded(g)
    found = contractions(g)
    if calibration is None:
        raise CalibrationError("int8 needs activation ranges: calibrate the graph on inputs "
                               "first (mlpack build does, with --calibration or random inputs)")
    rw = IntegerRewrite(g)
    quantized: dict[str, tuple[str, float, int]] = {}   # x -> (its u8 tensor, scale, zero)
    changed: dict[int, list] = {}
    placed: dict[str, Comprehension] = {}   # x -> its quantization, right after x's producer
    pools = _max_pools(g)
    for op, x, w in found:
        xname = x.arg[0]
        if xname not in calibration:
            continue
        if xname not in quantized:
            sx, zx = quantize_params(*calibration[xname])
            q = fresh(f"{xname}#u8", rw.taken)
            pool = pools.get(xname)
            if pool is None:
                placed[xname] = _quantize_map(xname, q, dict(rw.types[xname].dims), sx, zx)
            else:   # quantized before the pooling, which then takes the max of bytes
                src = pool.body.arg[0]
                qsrc = fresh(f"{src}#u8", rw.taken)
                placed[src] = _quantize_map(src, qsrc, dict(rw.types[src].dims), sx, zx)
                rw.types[qsrc] = placed[src].type
                pad = None if pool.body.arg[2] is None else 0
                placed[xname] = replace(pool, out=q, type=TensorType("u8", dict(pool.type.dims)),
                                        body=Expr("read", pool.body.args,
                                                  (qsrc, pool.body.arg[1], pad), "u8"))
            rw.types[q] = placed[xname].type
            quantized[xname] = (q, sx, zx)
        changed[id(op)] = rw.contraction(op, x, w, *quantized[xname])
    if not changed:
        return g
    ops = [placed[p.name] for p in g.inputs if p.name in placed]
    for op in g.ops:
        ops.extend(changed.get(id(op), [op if not isinstance(op, Comprehension) else replace(op)]))
        ops.extend(placed[name] for name in getattr(op, "outs", ()) if name in placed)
    _share_quantized(ops, quantized, {p.name for p in g.outputs})
    out = replace(g, ops=ops, constants=rw.constants, types=rw.types)
    # (dead code first: a pooling whose bytes replace it must not keep its input from fusing)
    return eliminate_dead_code(fuse_elementwise(eliminate_dead_code(out)))


def _max_pools(g: Graph) -> dict[str, Comprehension]:
    """{x: its producer} for each x that is a max over a window of one f32 tensor (a max
    pooling, padded with -inf or not) that nothing else reads and that is no graph output or
    input: quantization is non-decreasing, so quantizing that tensor and pooling its bytes
    gives x's bytes exactly, and the contraction before the pooling then writes them in its
    epilogue, a quarter of the f32 values (conv, relu, max pool, conv: the stem of most CNNs).
    The f32 pooling stays in the graph for any other reader of x (dead code otherwise)."""
    readers: dict[str, int] = {}
    for op in g.ops:
        for name in tensors_read(op):
            readers[name] = readers.get(name, 0) + 1
    ends = {p.name for p in g.outputs} | {p.name for p in g.inputs}
    out = {}
    for op in g.ops:
        if not (isinstance(op, Comprehension) and op.reduce == "max" and op.rdims
                and op.type.dtype == "f32" and op.body.op == "read" and op.body.dtype == "f32"):
            continue
        src, pad = op.body.arg[0], op.body.arg[2]
        if (pad is None or pad == -np.inf) and src not in g.constants and src not in ends \
                and op.out not in ends and readers.get(src) == 1:
            out[op.out] = op
    return out


def _scales_folded(g: Graph) -> Graph:
    """A copy of ``g`` with each per-channel affine map after a contraction (a BatchNormalization
    whose ``1 / sqrt(var + eps)`` is still a map of constants when the graph passes run) folded
    into its weights (codegen/passes/fold_scale.py): quantized per output channel, the weights
    give the same integers scaled, and the requantizing epilogue loses three multiplies and
    three loads per element, which a short-K int8 convolution feels."""
    copy = replace(g, ops=[replace(op) if isinstance(op, Comprehension) else op for op in g.ops],
                   constants=dict(g.constants), types=dict(g.types))
    return fold_scales(fold_constant_maps(copy), wider=True)


def _share_quantized(ops: list, quantized: dict, outputs: set[str]) -> None:
    """Let every other reader of a quantized tensor read its u8 copy, dequantized (in place in
    ``ops``): a residual add or a pooling then reads a byte instead of four, and once the copy
    is a tensor's only reader, elementwise fusion moves the quantization into the epilogue of
    the contraction that produces it (ONNX Runtime's QDQ models quantize the same tensors). A
    graph output keeps its f32 tensor; a guarded read other than zero padding (a max pooling's
    -inf) keeps reading f32, and so does a procedure."""
    copies = {q for q, _, _ in quantized.values()}
    for i, op in enumerate(ops):
        if not isinstance(op, Comprehension) or op.out in copies:
            continue
        body = _dequantized_reads(op.body, quantized, outputs)
        if body is not op.body:
            ops[i] = replace(op, body=body)


def _dequantized_reads(e: Expr, quantized: dict, outputs: set[str]) -> Expr:
    if e.op == "read" and e.arg[0] in quantized and e.arg[0] not in outputs \
            and e.arg[2] in (None, 0.0) and e.dtype == "f32":
        q, sx, zx = quantized[e.arg[0]]
        pad = None if e.arg[2] is None else zx
        u8 = Expr("read", e.args, (q, e.arg[1], pad), "u8")
        return ex.mul(ex.sub(ex.cast(u8, "f32"), ex.const(float(zx), "f32")),
                      ex.const(sx, "f32"))
    if not e.args:
        return e
    args = tuple(_dequantized_reads(a, quantized, outputs) for a in e.args)
    return e if args == e.args else ex.rebuild(e, args)
