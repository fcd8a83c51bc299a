"""From the optimized graph to kernels: epilogue fusion and the loop schedule of each kernel.

One kernel per comprehension, except that an elementwise map reading a reduction's output at
the identity index (bias, activation, residual add, batchnorm scale/shift), when it is that
reduction's only reader, fuses into the reduction's kernel as an epilogue: the reduction's
value is handed to the map's body as the variable ``acc`` and never stored.

The schedule of a kernel: its output buffer is walked in layout order; dims of constant size 1
are dropped; the last remaining dim is the *row* (innermost, unit stride in the output) and the
others are the *outer* dims, flattened into rows that workgroups split. A reduction runs in one
of two ways, whichever gives more unit-stride reads in the innermost loop:

* ``row``: the reduction loops go outside the row loop and each row element accumulates in the
  output buffer (matmul with a row-major right operand, convolution over output columns);
* ``inner``: the row loop goes outside and one reduction dim is innermost, accumulating in a
  scalar (dot products, softmax and layernorm statistics, argmax).

A ``row`` reduction may take a few outer dims into each unit (``block_rows``), walked inside
each reduction step around the row: an operand that does not move along them is then read once
for all of the unit's rows.

A kernel of a point tile (tiles.py; ``Kernel.points``) runs one point of its outer dims at a
time: the points are never its row nor in a block, its other rows are walked in loops
(``point_block``), and a sum of a few terms is written out as a map (``unroll_point_sum``).
"""

from __future__ import annotations

import itertools
import math

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph, Procedure
from mlpack.spec.ir.graph import tensors_read as op_reads
from mlpack.codegen.targets.cpu.indexing import coeff, is_one
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.passes.recompute import written_out
from mlpack.codegen.targets.cpu.procedure import check_procedures, procedure_kernel

ACC = "acc"                  # the epilogue's name for the reduction's value
MIN_VECTOR_TRIP = 8          # a loop shorter than this is a poor innermost loop
WORK_PER_WORKGROUP = 32768   # multiply-adds (roughly) worth handing a thread at once
MAX_WORKGROUPS = 256
MIN_ROW_CHUNK = 16           # rows are split into chunks no shorter than this
MAX_WINDOW = 16              # window positions a max/min pooling is unrolled over
ROW_BIAS = 0.5               # how much the row strategy is preferred at equal scores
ROW_BLOCK = 4096             # elements of the rows one unit of a blocked row kernel walks
MIN_UNITS = 64               # units a blocked row kernel leaves to share out at least
MAX_POINT_TERMS = 4         # terms of a point tile's sum written out as one expression
POINT_ROW_BLOCK = 512       # elements of the rows one unit of a point tile's kernel walks
L1_BYTES = 32768             # what a row's operands may touch and still be in L1 for the next


# ---------------------------------------------------------------- helpers


def replace_reads(e: Expr, tensor: str, repl: Expr) -> Expr:
    """``e`` with every read of ``tensor`` replaced by ``repl``."""
    if e.op == "read" and e.arg[0] == tensor:
        return repl
    if not e.args:
        return e
    args = tuple(replace_reads(a, tensor, repl) for a in e.args)
    return e if args == e.args else ex.rebuild(e, args)


def tensors_read(e: Expr) -> list[str]:
    """Tensors ``e`` reads, in first-read order."""
    seen: dict[str, None] = {}
    for n in ex.walk(e):
        if n.op == "read":
            seen.setdefault(n.arg[0])
    return list(seen)


def fresh_name(name: str, taken) -> str:
    """``name``, or ``name`` with the first number appended that makes it not in ``taken``."""
    i, base = 0, name
    while name in taken:
        i += 1
        name = f"{base}{i}"
    return name


def inline_scalar_constants(g: Graph, body: Expr) -> Expr:
    """Reads of single-element constants become immediates (no binding, foldable)."""
    def go(e: Expr) -> Expr:
        if e.op == "read" and e.arg[0] in g.constants:
            c = g.constants[e.arg[0]]
            if c.data.size == 1 and all(is_one(s) for s in c.type.dims.values()):
                return ex.const(c.data.reshape(()).item(), c.type.dtype)
        if not e.args:
            return e
        args = tuple(go(a) for a in e.args)
        return e if args == e.args else ex.rebuild(e, args)
    return go(body)


# ---------------------------------------------------------------- epilogue fusion


def identity_map(r: Comprehension, m: Comprehension, reads: list[Expr]) -> dict[str, Expr] | None:
    """R's dim -> M's index, when every read of R in M is the same identity read, else None."""
    first = reads[0]
    if any(rd.args != first.args or rd.arg != first.arg for rd in reads) or first.arg[2] is not None:
        return None
    index = dict(zip(first.arg[1], first.args))
    used: set[str] = set()
    for d, size in r.type.dims.items():
        ix = index[d]
        if is_one(size) and ix.is_const and ix.value == 0:
            continue
        if ix.op != "var" or ix.arg in used or ix.arg not in m.type.dims \
                or not ex.same_size(size, m.type.dims[ix.arg]):
            return None
        used.add(ix.arg)
    if any(d not in used and not is_one(s) for d, s in m.type.dims.items()):
        return None  # M iterates more points than R has: R's value would be recomputed
    return index


def _fusable_reduction(m: Comprehension, producers, readers, pinned) -> tuple | None:
    """The (reduction, index map) whose kernel ``m`` can join as an epilogue, if any."""
    if m.reduce is not None:
        return None
    for name in tensors_read(m.body):
        r = producers.get(name)
        if r is None or r.reduce is None or name in pinned or readers.get(name) != [m.out]:
            continue
        reads = [n for n in ex.walk(m.body) if n.op == "read" and n.arg[0] == name]
        index = identity_map(r, m, reads)
        if index is not None:
            return r, index
    return None


def _fuse(r: Comprehension, m: Comprehension, index: dict[str, Expr]) -> tuple[Expr, dict]:
    """R's body over M's vars (R's rdims renamed apart) and R's renamed rdims."""
    fresh = {d: f"r.{d}" for d in r.rdims}
    mapping = {d: ex.var(v) for d, v in fresh.items()}
    mapping.update({d: index[d] for d in r.type.dims})
    body = ex.substitute(r.body, mapping)
    return body, {fresh[d]: s for d, s in r.rdims.items()}


# ---------------------------------------------------------------- schedule


def _access(read: Expr, v: str, buffers: dict[str, Buffer]) -> str:
    """'inv', 'unit' or 'other': how a read moves when ``v`` steps by one."""
    buf = buffers[read.arg[0]]
    index = dict(zip(read.arg[1], read.args))
    coeffs = {d: coeff(index[d], v) for d in buf.layout}
    if all(c == 0 for c in coeffs.values()):
        return "inv"
    inner = buf.contiguous_dim()
    if coeffs.get(inner) == 1 and all(c == 0 for d, c in coeffs.items() if d != inner):
        return "unit"
    return "other"


def _score(body: Expr, v: str, extent: Expr, buffers) -> float:
    """How good ``v`` is as the innermost (vectorized) loop."""
    weights = {"inv": 0.5, "unit": 1.0, "other": -1.0}
    reads = {id(n): n for n in ex.walk(body) if n.op == "read"}.values()
    score = sum(weights[_access(r, v, buffers)] for r in reads)
    if extent.is_const and extent.value < MIN_VECTOR_TRIP:
        score -= 10
    return score


def row_dim(buf: Buffer, block=(), points=()) -> tuple[list[str], str | None]:
    """(outer dims, row dim) of a kernel writing ``buf``; the outer dims leave out ``block``
    (``Kernel.block``: walked inside each unit with the row). ``points`` (``Kernel.points``)
    are outer dims whatever their place: a tile's kernel whose dims are all points has no
    row."""
    dims = [d for d in buf.layout if not is_one(buf.sizes[d])]
    if not dims:
        return [], None
    if dims[-1] in points:
        return dims, None
    return [d for d in dims[:-1] if d not in block], dims[-1]


def _row_chunks(k: Kernel, out: Buffer) -> int:
    """Into how many chunks to cut each row so that a few big rows still spread over threads
    (a batch-1 fully connected layer has one row; a LayerNorm's statistics of one image, [$batch,
    1500] over 384, have one row per batch item). Symbols count as 1 (ex.value_at_one): a
    dynamic batch is cut as a batch of one, and a row of symbolic length is not cut."""
    outer, row = row_dim(out)
    if row is None or k.points:   # (a tile's kernel runs one point at a time: tiles.py)
        return 1
    rows = 1
    for d in outer:
        rows *= ex.value_at_one(out.sizes[d])
    work = 1
    for s in [*out.sizes.values(), *k.rdims.values()]:
        work *= ex.value_at_one(s)
    want = max(1, min(MAX_WORKGROUPS, work // WORK_PER_WORKGROUP))
    if rows == 0 or rows >= want:  # an empty output (a zero-size slice) has no row to cut
        return 1
    return max(1, min(-(-want // rows), ex.value_at_one(out.sizes[row]) // MIN_ROW_CHUNK))


def shared_units(units: Expr, work: Expr, per: int = WORK_PER_WORKGROUP) -> Expr:
    """A dispatch's workgroup count as an expression: its ``units`` (what the kernel shares
    out), but one workgroup per ``per`` multiply-adds of ``work`` at most, and at least one and
    at most MAX_WORKGROUPS (plan.py's, contraction.py's and depthwise.py's dispatches)."""
    per_work = ex.binary("max", ex.const(1), ex.binary(
        "min", ex.const(MAX_WORKGROUPS), ex.floordiv(work, ex.const(per))))
    return ex.binary("min", units, per_work)


def schedule(k: Kernel, out: Buffer, buffers: dict[str, Buffer]) -> None:
    """Pick the kernel's strategy, its reduction loop order and its row chunks."""
    k.row_chunks = _row_chunks(k, out)
    if k.reduce is None:
        k.strategy = "map"
        point_block(k, out)
        return
    _, row = row_dim(out, points=k.points)
    scores = {r: _score(k.body, r, s, buffers) for r, s in k.rdims.items()}
    best = max(reversed(list(k.rdims)), key=lambda r: scores[r]) if k.rdims else None
    # (an f16/bf16 sum or product accumulated in its output row would round every partial
    # result; the interpreter accumulates them in f32)
    can_row = (row is not None and k.reduce in ("sum", "prod", "max", "min")
               and k.acc_dtype == out.dtype
               and not (k.acc_dtype in ("f16", "bf16") and k.reduce in ("sum", "prod")))
    # ties and near-ties go to ``row``: a strided reduction walks far through memory per output
    # element, while a strided row stays within a few cache lines
    if can_row and (best is None or _score(k.body, row, out.sizes[row], buffers) + ROW_BIAS
                    >= scores[best]):
        k.strategy = "row"
        block_rows(k, out)
        return
    k.strategy = "inner"
    if best is not None:
        k.rdims = {**{r: s for r, s in k.rdims.items() if r != best}, best: k.rdims[best]}
    point_block(k, out)


def point_block(k: Kernel, out: Buffer) -> None:
    """A point tile's kernel (tiles.py) walks all of one point's rows in loops: a unit each
    would delinearize its index for a row of a few vectors. A ``row`` reduction's rows hold
    its accumulators, re-read at every step: at most POINT_ROW_BLOCK elements of them."""
    if not k.points:
        return
    dims = [d for d in out.layout if not is_one(out.sizes[d]) and d not in k.points]
    if len(dims) < 2 or not all(out.sizes[d].is_const for d in dims):
        return
    size, block = out.sizes[dims[-1]].value, []
    for d in reversed(dims[:-1]):
        if k.strategy == "row" and size * out.sizes[d].value > POINT_ROW_BLOCK:
            break
        block.append(d)
        size *= out.sizes[d].value
    k.block = tuple(d for d in dims if d in block)


def _streams(read: Expr, dims) -> bool:
    """Whether ``read``'s index moves with any of ``dims``."""
    return any(ex.free_vars(i) & set(dims) for i in read.args)


def _footprint(reads: list[Expr], k: Kernel, out: Buffer, row: str) -> int:
    """Bytes ``reads`` touch over one row's whole reduction (each read over the reduction dims
    and the row dim it moves with; constant extents only, others count as 1)."""
    total = 0
    for r in reads:
        n = dt.bits(r.dtype) // 8 or 1
        for d, size in [*k.rdims.items(), (row, out.sizes[row])]:
            if _streams(r, [d]) and size.is_const:
                n *= size.value
        total += n
    return total


def block_rows(k: Kernel, out: Buffer) -> None:
    """A ``row`` reduction walks, in each unit, the outer dims (innermost first) whose extents
    are small constants and along which some operand that streams with the reduction does not
    move (the capsule routing's transformation matrices W[.., k, j, co] do not vary
    with the pose row i nor the position y), those along which the most bytes stay put first: that operand is then read once per unit and reduction step, not once
    per row, which is what bounded such kernels (each row re-read all of W from L2). The rows
    of a unit are at most ROW_BLOCK elements (their accumulators stay in L1), at least
    MIN_UNITS units are left to share out, and what stays put along a blocked dim touches more
    than L1_BYTES per row (less is read from L1 by the next row anyway)."""
    if k.points:
        point_block(k, out)
        return
    if k.strategy != "row" or k.row_chunks != 1 or not k.rdims:
        return
    dims = [d for d in out.layout if not is_one(out.sizes[d])]
    if len(dims) < 2 or not all(out.sizes[d].is_const for d in dims):
        return
    reads = [n for n in ex.walk(k.body) if n.op == "read" and _streams(n, k.rdims)]
    size, units = out.sizes[dims[-1]].value, 1
    for d in dims[:-1]:
        units *= out.sizes[d].value
    # the dims along which the most bytes stay put first (ties: the innermost)
    reuse = {d: _footprint([r for r in reads if not _streams(r, [d])], k, out, dims[-1])
             for d in dims[:-1]}
    block: list[str] = []
    for d in sorted(reversed(dims[:-1]), key=lambda d: -reuse[d]):
        n = out.sizes[d].value
        if reuse[d] <= L1_BYTES:
            break   # what stays put along d is in L1 for the next row anyway
        if size * n > ROW_BLOCK or units // n < MIN_UNITS:
            continue
        block.append(d)
        size, units = size * n, units // n
    k.block = tuple(d for d in dims if d in block)   # (in layout order)


# ---------------------------------------------------------------- building


def unroll_window(k: Kernel) -> None:
    """A max, min or sum over a small constant window (a pooling) as a map whose body combines
    the window's terms, in the order the reduction loop would take them: the row strategy
    would read and write the output row once per window position, the map keeps the running
    value in a register and is one vector loop, and halo.py can then read a padded input in
    bounds. A sum is one only where each term is the input itself (an average pooling's, not
    a convolution's products). A select whose condition holds for the whole window (a
    concatenation inlined into the pooling) is kept outside, for hoist.py."""
    if k.reduce == "sum":
        if k.acc_dtype != "f32" or not k.rdims or not _window_terms(k.body, set(k.rdims)):
            return
    elif k.reduce not in ("max", "min") or k.acc_dtype not in ("f32", "u8", "i8") \
            or not k.rdims:
        return   # (8-bit: a pooling of int8's bytes, codegen/precisions/int8.py)
    sizes = list(k.rdims.values())
    if not all(s.is_const for s in sizes):
        return
    window = math.prod(s.value for s in sizes)
    if window > MAX_WINDOW:
        return
    names = list(k.rdims)
    acc = k.acc_dtype
    combine = "add" if k.reduce == "sum" else k.reduce
    start = ex.const({"sum": 0, "max": dt.lowest(acc), "min": dt.highest(acc)}[k.reduce], acc)

    def unroll(body: Expr) -> Expr:
        if body.op == "select":
            cond = body.args[0]
            if not (ex.free_vars(cond) & set(names)) and not any(
                    n.op == "read" for n in ex.walk(cond)):
                return ex.select(cond, unroll(body.args[1]), unroll(body.args[2]))
        inner = body if combine == "add" else _monotone_core(body, set(names))
        if inner is not body:   # max over g(x) is g(max over x) for a non-decreasing g
            return ex.replace_node(body, inner, unroll(inner))
        acc = start
        for point in itertools.product(*[range(s.value) for s in sizes]):
            term = ex.substitute(body, {r: ex.const(v) for r, v in zip(names, point)})
            acc = ex.binary(combine, term, acc)
        return acc
    value = unroll(k.body)
    if k.epilogue is not None:
        value = ex.substitute(k.epilogue, {ACC: value})
    k.body, k.reduce, k.rdims, k.epilogue = value, None, {}, None
    k.acc_dtype = value.dtype   # the epilogue's, if it had one (a compare gives bool)
    k.window = window


def unroll_point_sum(k: Kernel) -> None:
    """A point tile's sum over at most MAX_POINT_TERMS constant terms (the capsule votes' four
    products) as a map adding them up: the row strategy would load and store its output row
    at each term, the map keeps the sum in a register."""
    if not k.points or k.reduce != "sum" or not k.rdims or k.acc_dtype != "f32":
        return
    value = written_out(k, MAX_POINT_TERMS)
    if value is None:
        return
    if k.epilogue is not None:
        value = ex.substitute(k.epilogue, {ACC: value})
    k.body, k.reduce, k.rdims, k.epilogue = value, None, {}, None
    k.acc_dtype = value.dtype


def _window_terms(body: Expr, window: set[str]) -> bool:
    """Whether a sum's terms are reads of its input at window-shifted indices (through a
    select whose condition the window does not change): an average pooling's window."""
    if body.op == "select" and not (ex.free_vars(body.args[0]) & window):
        return all(_window_terms(a, window) for a in body.args[1:])
    return body.op == "read" and bool(ex.free_vars(body) & window)


def _monotone_core(e: Expr, window: set[str]) -> Expr:
    """The part of ``e`` that depends on the window, below a chain of non-decreasing steps
    whose other operands do not (a bias add, a relu: ``max(x[w] + b, 0)`` gives ``x[w]``), or
    ``e`` itself. Rounding is monotone too, and a NaN passes through either way."""
    def varies(x: Expr) -> bool:
        return bool(ex.free_vars(x) & window)
    while e.dtype == "f32" and e.op in ("add", "sub", "max", "min") and len(e.args) == 2:
        a, b = e.args
        if varies(a) and not varies(b):
            e = a
        elif varies(b) and not varies(a) and e.op != "sub":
            e = b
        else:
            break
    return e


def reject_procedures(g: Graph) -> None:
    """Refuse the procedures the cpu target cannot lower (procedure.py says which and why)."""
    check_procedures(g)


def build_kernels(g: Graph, buffers: dict[str, Buffer], keep=(), points=None) -> list[Kernel]:
    """The graph's comprehensions as kernels, in order, with epilogues fused. ``keep``:
    tensors that must be written even if their only reader could take them as an epilogue
    (a concatenation's part that lies in its slice: concat.py). ``points``: op output -> the
    point dims of the tile it runs in (tiles.py)."""
    points = points or {}
    reject_procedures(g)
    ops = [op for op in g.ops if not isinstance(op, Procedure)]
    producers = {op.out: op for op in ops}
    readers: dict[str, list[str]] = {}
    for op in g.ops:   # a procedure reading a reduction keeps it from fusing away
        for t in sorted(op_reads(op)):
            readers.setdefault(t, []).append(op.outs[0])
    pinned = {p.name for p in g.outputs} | set(keep)
    fused_into: dict[str, tuple] = {}
    for m in ops:
        hit = _fusable_reduction(m, producers, readers, pinned)
        if hit is not None:
            fused_into[hit[0].out] = (m, hit[1])
    epilogue_of = {m.out: (r, index) for r_out, (m, index) in fused_into.items()
                   for r in [producers[r_out]]}
    kernels = []
    for op in g.ops:
        if isinstance(op, Procedure):   # sequential code, one workgroup: procedure.py
            kernels.append(procedure_kernel(g, op, len(kernels)))
            continue
        if op.out in fused_into:
            continue
        if op.out in epilogue_of:
            r, index = epilogue_of[op.out]
            body, rdims = _fuse(r, op, index)
            epi = replace_reads(op.body, r.out, ex.var(ACC, r.type.dtype))
            k = Kernel(f"k{len(kernels)}_{op.out}", op.out, inline_scalar_constants(g, body),
                       r.reduce, rdims, r.type.dtype, inline_scalar_constants(g, epi),
                       fused=[r.out, op.out])
        else:
            k = Kernel(f"k{len(kernels)}_{op.out}", op.out, inline_scalar_constants(g, op.body),
                       op.reduce, dict(op.rdims), op.type.dtype, fused=[op.out])
        unroll_window(k)
        reads = tensors_read(k.body) + (tensors_read(k.epilogue) if k.epilogue is not None else [])
        k.reads = [t for t in dict.fromkeys(reads) if t != k.out]
        k.points = points.get(k.out, ())
        unroll_point_sum(k)
        schedule(k, buffers[k.out], buffers)
        kernels.append(k)
    return kernels


def copy_kernel(name: str, src: Buffer, dst: Buffer) -> Kernel:
    """A kernel copying ``src`` to ``dst`` (an output that is an input, a constant or repeated)."""
    body = ex.read(src.name, {d: ex.var(d) for d in src.layout}, src.dtype)
    k = Kernel(name, dst.name, body, None, {}, src.dtype, reads=[src.name], fused=[dst.name])
    return k
