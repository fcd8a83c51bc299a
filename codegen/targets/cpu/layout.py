"""Buffer layouts chosen over the whole graph before lowering: image channels last where it pays.

The plan lays every intermediate tensor out in its type's dim order (plan.tensor_buffers), and
the importer gives a convolution's result ONNX's order, channels before rows and columns. A
gemm's tile holds output channels in its vector lanes (contraction.py), so storing it to NCHW
scatters each vector across channel planes, and the next convolution reads one input channel
per cache line. ``channels_last`` reorders the type of each image tensor whose producer and
readers are indifferent to its order, so its channels are the unit-stride dim: the tiles are
stored as whole vectors and read back along K at unit stride. Measured with both builds loaded
in one process, runs interleaved (MLPACK_PROFILE=1): vgg19 363 -> 288 ms at 1 thread and 161 ->
138 at 2, resnet50 95.6 -> 83.3 / 62.2 -> 56.6, zfnet512 85.7 -> 80.1 / 50.5 -> 44.9.

A tensor keeps its order when it is a graph output (ports have their own layout), when a
concatenation reads or produces it (concat.py writes each part in place only when the
concatenated dim is outermost, and squeezenet's concatenations became copies, 14% slower
overall), or when a convolution that keeps channels apart (grouped or depthwise: depthwise.py
vectorizes along the image row) reads or produces it.

The channel dim is found from the math, not from names: in a contraction with constant
weights, the one output dim that indexes the weights but no other operand (a convolution's or a
fully connected layer's output channel); a map or pooling that reads such a tensor with its
channel index a plain variable of its own output carries the channel over.
"""

from __future__ import annotations

from dataclasses import replace

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType, tensors_read
from mlpack.codegen.targets.cpu.concat import select_arms as _arms
from mlpack.codegen.targets.cpu.indexing import affine as _affine
from mlpack.codegen.targets.cpu.indexing import is_one as _is_one

IMAGE_DIMS = 3   # dims of size above 1 that make an image (channels, rows, columns)


def _weights_channel(op: Comprehension, g: Graph) -> str | None:
    """The output dim that indexes the constant weights and nothing else, if exactly one."""
    if op.reduce != "sum" or not op.rdims:
        return None
    const, other = set(), set()
    for r in ex.reads(op.body):
        (const if r.arg[0] in g.constants else other).update(*map(ex.free_vars, r.args))
    dims = [d for d in op.type.dims if d in const and d not in other]
    return dims[0] if len(dims) == 1 else None


def _walk_var(ix: Expr | None, op: Comprehension) -> str | None:
    """The output dim ``ix`` walks at unit step: the dim itself, or shifted by constants and
    reduction variables (a window along it: local response normalization's sum of squares)."""
    if ix is None:
        return None
    if ix.op == "var":
        return ix.arg
    form = _affine(ix, set(op.type.dims) | set(op.rdims))
    if form is None:
        return None
    outer = [v for v in form[0] if v in op.type.dims]
    if len(outer) == 1 and form[0][outer[0]] == 1 and form[1].is_const:
        return outer[0]
    return None


def _carried_channel(op: Comprehension, channel: dict[str, str]) -> tuple[str, str] | None:
    """(the output dim, the tensor) of a map or pooling that walks a channel-carrying tensor's
    channel with a dim of its own output."""
    for r in ex.reads(op.body):
        c = channel.get(r.arg[0])
        if c is None:
            continue
        v = _walk_var(dict(zip(r.arg[1], r.args)).get(c), op)
        if v is not None and v in op.type.dims:
            return v, r.arg[0]
    return None


def _reads_well(op: Comprehension, t: str, c: str, chosen: dict[str, str],
                weighted: set[str]) -> bool:
    """Whether every read of ``t`` (laid out with ``c`` last) in ``op`` walks ``c`` with the
    op's own unit-stride loop: a contraction over weights reducing over it (a plain reduction
    variable), or a map or pooling (or a window along the channel) whose own channel, laid
    out last too, it is."""
    for r in ex.reads(op.body):
        if r.arg[0] != t:
            continue
        ix = dict(zip(r.arg[1], r.args)).get(c)
        if ix is not None and ix.op == "var" and ix.arg in op.rdims:
            if op.out not in weighted:
                return False
        else:
            v = _walk_var(ix, op)
            if v is None or chosen.get(op.out) != v:
                return False
    return True


def _concatenation(op: Comprehension) -> bool:
    return op.reduce is None and op.body.op == "select" and any(
        s.is_const and _arms(op.body, d, s.value) is not None for d, s in op.type.dims.items())


def _channels_apart(op: Comprehension, g: Graph, channel: str | None) -> bool:
    """A contraction over constant weights that keeps its output channels apart (grouped or
    depthwise): an output dim indexes both the weights and the input. ``channel``:
    ``_weights_channel`` of ``op``."""
    if op.rdims and op.reduce == "sum" and channel is None:
        return any(r.arg[0] in g.constants for r in ex.reads(op.body))
    return False


def channels_last(g: Graph) -> Graph:
    """``g`` with each image tensor it pays for laid out channels last (module docstring). ``g``
    itself is not changed: the targets of a build share it. ``MLPACK_DISABLE_PASSES=channels_last``
    keeps every tensor in its type's order."""
    outputs = {p.name for p in g.outputs}
    channel: dict[str, str] = {}
    source: dict[str, str | None] = {}   # the tensor a map's channel is carried from
    keep = set(outputs)
    weighted: set[str] = set()   # outputs of contractions over weights with one channel dim
    for op in g.ops:
        if not isinstance(op, Comprehension):
            keep.update(op.outs)
            keep.update(tensors_read(op))
            continue
        c, src = _weights_channel(op, g), None
        if _concatenation(op) or _channels_apart(op, g, c):
            keep.add(op.out)
            keep.update(tensors_read(op))
            continue
        if c is not None:
            weighted.add(op.out)
        else:
            c, src = _carried_channel(op, channel) or (None, None)
        big = [d for d, s in op.type.dims.items() if not _is_one(s)]
        if c is not None and len(big) >= IMAGE_DIMS and c in big:
            channel[op.out], source[op.out] = c, src
    readers: dict[str, list[Comprehension]] = {}
    for op in g.ops:
        if isinstance(op, Comprehension):
            for t in tensors_read(op):
                readers.setdefault(t, []).append(op)
    # a tensor stays channels-last only if what it is carried from does and every reader walks
    # its channel at unit stride: drop the others until nothing changes
    chosen = {t: c for t, c in channel.items() if t not in keep}
    changed = True
    while changed:
        changed = False
        for t, c in list(chosen.items()):
            if (source[t] is not None and source[t] not in chosen) or not all(
                    _reads_well(r, t, c, chosen, weighted) for r in readers.get(t, [])):
                del chosen[t]
                changed = True
    if not chosen:
        return g
    ops, types = [], dict(g.types)
    for op in g.ops:
        c = chosen.get(op.out) if isinstance(op, Comprehension) else None
        if c is not None and list(op.type.dims)[-1] != c:
            dims = {d: s for d, s in op.type.dims.items() if d != c}
            dims[c] = op.type.dims[c]
            op = replace(op, type=TensorType(op.type.dtype, dims))
            types[op.out] = op.type
        ops.append(op)
    return replace(g, ops=ops, types=types)


__all__ = ["channels_last"]
