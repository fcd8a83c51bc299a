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
concatenation that cannot go channels last reads or produces it (concat.py then writes each part
in place, which needs the concatenated dim outermost), or when a grouped convolution reads or
produces it (depthwise.py vectorizes those along the image row). A concatenation of images
along their channel goes channels last with all its parts: it is then a copy kernel, whose row
lower.py splits at the parts (hoist.py), one plain vector loop each. That once cost squeezenet
14% (the copy then selected each element's part); now GoogLeNet's inception blocks, NCHW
before, their 3x3 poolings 2-4x behind ONNX Runtime's, run 1.07x faster at 1 thread and 1.18x
at 2 under a dynamic batch, SqueezeNet 1.1 1.23x and 1.20x, and the batch-1 models whose
concatenations were written in place gain too (``benchmarks.ab``, x86_64-v4, 1 / 2 threads:
inception_v2 1.20x / 1.21x, inception_v1 1.04x / 1.08x, densenet121 1.04x / 1.11x,
squeezenet 1.08x / 1.13x).

A depthwise convolution (one input channel per output channel) goes channels last together with
its input, and its weights are stored channels last: depthwise.py then takes a vector of
channels per window point, loading the weights as vectors. In NCHW its rows of 7 to 28 columns
wasted most of each 16-lane vector and kept every tensor of an inverted residual block out of
channels last; MobileNetV3-large ran 14.5 -> 7.7 ms at 1 thread (MLPACK_PROFILE=1, AVX-512).
A global pooling reads a channels-last tensor well too: its output's channels are its rows. So
does a reduction over the channel alone, ConvNeXt's LayerNorm (permuted to NHWC, normalized over
C, permuted back): its depthwise convolutions had stayed NCHW for it, a third of ONNX Runtime's
speed, and the whole model went 106.6 -> 94.2 ms at 1 thread (AVX-512, ``benchmarks.ab``).

The channel dim is found from the math, not from names: in a contraction with constant
weights, the one output dim that indexes the weights but no other operand (a convolution's or a
fully connected layer's output channel); a map or pooling that reads such a tensor with its
channel index a plain variable of its own output carries the channel over.
"""

from __future__ import annotations

from dataclasses import replace


from mlpack.codegen import debug
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, TensorType, tensors_read
from mlpack.codegen.targets.cpu import derived
from mlpack.codegen.targets.cpu.concat import clamp_of
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
    clamp = clamp_of(ix)
    if clamp is not None:
        ix = clamp[0]   # a concatenation's clamp of its part's index (in range there)
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
                weighted: set[str], candidates: dict[str, str]) -> bool:
    """Whether every read of ``t`` (laid out with ``c`` last) in ``op`` walks ``c`` with the
    op's own unit-stride loop: a contraction over weights reducing over it (a plain reduction
    variable), or a reduction over the channel alone (a LayerNorm's statistics over the
    channels: it sums each pixel's channels at unit stride, where NCHW reads them a plane
    apart), or a map or pooling (or a window along the channel) whose own channel, laid out
    last too, it is, or a reduction to a tensor that is never an image (a global pooling)
    whose own unit-stride dim walks it: its rows accumulate along the channels at unit stride."""
    for r in ex.reads(op.body):
        if r.arg[0] != t:
            continue
        ix = dict(zip(r.arg[1], r.args)).get(c)
        if ix is not None and ix.op == "var" and ix.arg in op.rdims or \
                op.out in weighted and _k_walk(ix, op):
            if op.out not in weighted and set(op.rdims) != {ix.arg}:
                return False
        else:
            v = _walk_var(ix, op)
            if v is None or (chosen.get(op.out) != v and not (
                    op.out not in candidates and _row(op.type) == v)):
                return False
    return True


def _k_walk(ix: Expr | None, op: Comprehension) -> bool:
    """Whether ``ix`` walks one reduction dim of ``op`` at unit step, shifted by output dims:
    a grouped convolution's K (``8 * g + ci``: its groups are output dims)."""
    if ix is None:
        return False
    form = _affine(ix, set(op.type.dims) | set(op.rdims))
    if form is None:
        return False
    inner = [v for v in form[0] if v in op.rdims]
    return len(inner) == 1 and form[0][inner[0]] == 1


def _row(t: TensorType) -> str | None:
    """The unit-stride dim of a tensor laid out in its type's order (sizes 1 left out)."""
    big = [d for d, s in t.dims.items() if not _is_one(s)]
    return big[-1] if big else None


def _concatenation(op: Comprehension) -> bool:
    return op.reduce is None and op.body.op == "select" and any(
        s.is_const and _arms(op.body, d, s.value) is not None for d, s in op.type.dims.items())


def _concat_channel(op: Comprehension, channel: dict[str, str]) -> tuple[str, tuple] | None:
    """(the concatenated dim, the tensors it is carried from) of a concatenation of images
    along their channel: each part reads a channel-carrying tensor whose channel it walks
    with the concatenated dim."""
    for d, size in op.type.dims.items():
        arms = _arms(op.body, d, size.value) if size.is_const else None
        if arms is None:
            continue
        srcs = []
        for _, _, arm in arms:
            parts = [r.arg[0] for r in ex.reads(arm) if r.arg[0] in channel and _walk_var(
                dict(zip(r.arg[1], r.args)).get(channel[r.arg[0]]), op) == d]
            if not parts:
                return None
            srcs.extend(parts)
        return d, tuple(dict.fromkeys(srcs))
    return None


def _depthwise(op: Comprehension, g: Graph) -> tuple[str, str, Expr] | None:
    """(output channel, input tensor, read of the weights) of a depthwise convolution: a sum of
    the product
    of one constant and one other tensor (maybe under a bounds guard), where an output dim
    indexes the weights and is the input's channel index itself (one input channel per output
    channel, depthwise.py runs it channels last as well as along rows)."""
    if op.reduce != "sum" or not op.rdims or op.body.op != "mul" or len(op.body.args) != 2:
        return None
    reads = []
    for a in op.body.args:
        if a.op == "select" and a.args[2].is_const and a.args[2].value == 0:
            a = a.args[1]
        if a.op != "read":
            return None
        reads.append(a)
    consts = [r for r in reads if r.arg[0] in g.constants]
    if len(consts) != 1:
        return None
    w = consts[0]
    x = reads[1] if reads[0] is w else reads[0]
    # (a depthwise convolution is a grouped one whose groups are channels: its dims of size 1,
    # the channel within a group, are at 0)
    ones = {v: ex.const(0) for v, s in (*op.type.dims.items(), *op.rdims.items()) if _is_one(s)}
    wvars = set().union(*(ex.free_vars(ex.substitute(ix, ones)) for ix in w.args))
    for d, ix in zip(x.arg[1], (ex.substitute(ix, ones) for ix in x.args)):
        if ix.op == "var" and ix.arg in op.type.dims and ix.arg in wvars and not _is_one(
                op.type.dims[ix.arg]):
            others = [ex.substitute(j, ones) for e, j in zip(x.arg[1], x.args) if e != d]
            if all(ix.arg not in ex.free_vars(j) for j in others):
                return ix.arg, x.arg[0], w
    return None


def _weights_last(g: Graph, out: str, c: str, w: Expr, made: dict | None) -> Graph:
    """``g`` with the op writing ``out`` reading, instead of the constant ``w`` reads, a copy of
    it stored with the dim ``w`` indexes by ``c`` last (reads index dims by name, so only memory
    order changes): a constant derived from the weights (derived.py; ``made``: its record)."""
    name = w.arg[0]
    const = g.constants[name]
    dim = next(d for d, ix in zip(w.arg[1], w.args) if c in ex.free_vars(ix))
    if const.layout[-1] == dim:
        return g
    layout = tuple(d for d in const.layout if d != dim) + (dim,)
    new = f"{name}#last"
    if new not in g.constants:
        g = derived.relaid(g, name, new, layout, made)
    ops = [replace(op, body=ex.rename_tensors(op.body, {name: new}))
           if isinstance(op, Comprehension) and op.out == out else op for op in g.ops]
    return replace(g, ops=ops)


def _group_dim(op: Comprehension, g: Graph, c: str) -> str | None:
    """The output dim numbering the groups of a grouped contraction over weights whose
    channel is ``c``: the weights index ``size(c) * grp + c`` (a grouped convolution's
    ``w[8 * g + co]``). It goes just before ``c``, so the groups' channels lie in one run."""
    size = op.type.dims[c]
    if not size.is_const:
        return None
    for r in ex.reads(op.body):
        if r.arg[0] not in g.constants:
            continue
        for ix in r.args:
            form = _affine(ix, set(op.type.dims) | set(op.rdims))
            if form is None or form[0].get(c) != 1:
                continue
            others = [v for v in form[0] if v != c]
            if len(others) == 1 and others[0] in op.type.dims and \
                    form[0][others[0]] == size.value:
                return others[0]
    return None


def _carried_group(op: Comprehension, src: str, group: dict[str, str]) -> str | None:
    """The output dim of ``op`` that walks the group dim of the tensor its channel is
    carried from (the bias and activation of a grouped convolution)."""
    p = group.get(src)
    for r in ex.reads(op.body) if p is not None else ():
        ix = dict(zip(r.arg[1], r.args)).get(p) if r.arg[0] == src else None
        if ix is not None and ix.op == "var" and ix.arg in op.type.dims:
            return ix.arg
    return None


def _channels_apart(op: Comprehension, g: Graph, channel: str | None) -> bool:
    """A contraction over constant weights that keeps its output channels apart (grouped or
    depthwise): an output dim indexes both the weights and the input. ``channel``:
    ``_weights_channel`` of ``op``. Weights vary along the reduction; a constant read at the
    output's own indices alone (a bias and activation fused into a global pooling's sum) is
    not one."""
    if op.rdims and op.reduce == "sum" and channel is None:
        return any(r.arg[0] in g.constants and ex.free_vars(r) & set(op.rdims)
                   for r in ex.reads(op.body))
    return False


def channels_last(g: Graph, made: dict | None = None) -> Graph:
    """``g`` with each image tensor it pays for laid out channels last (module docstring). ``g``
    itself is not changed: the targets of a build share it. ``MLPACK_DISABLE_PASSES=channels_last``
    keeps every tensor in its type's order. ``made``: where the weights it stores in another
    order are recorded (derived.py)."""
    outputs = {p.name for p in g.outputs}
    channel: dict[str, str] = {}
    source: dict[str, tuple] = {}   # the tensors a map's channel is carried from
    keep = dict.fromkeys(outputs, "a graph output (its port's order)")   # tensor -> why
    weighted: set[str] = set()   # outputs of contractions over weights with one channel dim
    group: dict[str, str] = {}   # the group dim laid out just before the channel
    depthwise: dict[str, tuple[str, str, Expr]] = {}   # output -> _depthwise(op)
    concats: set[str] = set()   # concatenations that may go channels last with their parts
    for op in g.ops:
        if not isinstance(op, Comprehension):
            why = f"a procedure's ({', '.join(op.outs)})"
            for t in (*op.outs, *tensors_read(op)):
                keep.setdefault(t, why)
            continue
        c, src = _weights_channel(op, g), ()
        dw = _depthwise(op, g)
        concat = _concatenation(op)
        # a concatenation of images along their channel goes channels last with its parts
        cat = _concat_channel(op, channel) if concat else None
        if cat is not None:
            c, src = cat
            concats.add(op.out)
        elif dw is not None and not concat:
            # channels last only together with its input (source): depthwise.py then
            # vectorizes it along the channels, with the weights stored channels last
            c, src = dw[0], (dw[1],)
            depthwise[op.out] = dw
        elif concat or _channels_apart(op, g, c):
            what = "a concatenation" if concat else "a grouped contraction"
            keep.setdefault(op.out, what)
            for t in tensors_read(op):
                keep.setdefault(t, f"read by {what} ({op.out})")
            continue
        if cat is not None:
            grp = None
        elif c is not None:
            weighted.add(op.out)
            grp = None if dw is not None else _group_dim(op, g, c)
        else:
            c, one = _carried_channel(op, channel) or (None, None)
            src = (one,) if one else ()
            grp = one and _carried_group(op, one, group)
        big = [d for d, s in op.type.dims.items() if not _is_one(s)]
        if c is not None and len(big) >= IMAGE_DIMS and c in big:
            channel[op.out], source[op.out] = c, src
            if grp is not None and grp in big:
                group[op.out] = grp
    readers: dict[str, list[Comprehension]] = {}
    for op in g.ops:
        if isinstance(op, Comprehension):
            for t in tensors_read(op):
                readers.setdefault(t, []).append(op)
    # a tensor stays channels-last only if what it is carried from does and every reader walks
    # its channel at unit stride: drop the others until nothing changes
    chosen = {t: c for t, c in channel.items() if t not in keep}
    dropped: dict[str, str] = {}   # tensor -> why it keeps its order (MLPACK_DEBUG=2)
    changed = True
    while changed:
        changed = False
        for t, c in list(chosen.items()):
            lost = next((s for s in source[t] if s not in chosen), None)
            if lost is not None:
                dropped[t] = f"its channel is carried from {lost}, which keeps its order"
            else:
                bad = next((r for r in readers.get(t, []) if not _reads_well(
                    r, t, c, chosen, weighted, channel)), None)
                if bad is None:
                    continue
                dropped[t] = f"{bad.out} does not read its channel {c} at unit stride"
            del chosen[t]
            changed = True
    if debug.level() >= 2:   # (what keeps an image NCHW: the first thing to look at when a
        for t in channel:    # convolutional model runs slower than it should)
            if t not in chosen:
                debug.log(f"channels_last: {t} keeps its order: {keep.get(t) or dropped[t]}", 2)
            elif t in concats:
                debug.log(f"channels_last: {t}, a concatenation, goes channels last with its "
                          "parts (a copy, not written in place)", 2)
    if not chosen:
        return g
    ops, types = [], dict(g.types)
    for op in g.ops:
        c = chosen.get(op.out) if isinstance(op, Comprehension) else None
        last = [d for d in (group.get(op.out), c) if d is not None] if c is not None else []
        if last and list(op.type.dims)[-len(last):] != last:
            dims = {d: s for d, s in op.type.dims.items() if d not in last}
            dims.update({d: op.type.dims[d] for d in last})
            op = replace(op, type=TensorType(op.type.dtype, dims))
            types[op.out] = op.type
        ops.append(op)
    g = replace(g, ops=ops, types=types)
    for out, (c, _, w) in depthwise.items():
        if out in chosen:
            g = _weights_last(g, out, c, w, made)
    return g


__all__ = ["channels_last"]
