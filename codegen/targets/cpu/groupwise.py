"""Grouped convolutions of 4, 8 or 16 channels per group as direct kernels on whole vectors.

A grouped convolution with ``c`` input and ``c`` output channels per group, laid out channels
last (layout.py), is a contraction whose batch is the group ``g`` and whose N is the group's
``c`` output channels (contraction.py): ``y[.., g, co] = sum{ci, kh, kw} x[.., c*g + ci] *
W[c*g + co, ci, kh, kw]``. As a GEMM its tile holds ``c`` useful columns of each 16-lane vector
(ResNeXt-50's first stage has 4 channels a group, its second and RegNet's every stage 8), a
quarter or half of the machine, and 16 (ResNeXt-50's third stage) a tile one vector wide. Here a vector instead holds ``vl / c`` whole groups, ``vl`` consecutive output
channels, and the reduction over a group's input channels is a rotation within each group's
lanes: at step ``s`` lane ``(g, co)`` takes input channel ``c*g + (co + s) % c``, a shuffle of
the input vector of those same ``vl`` channels, times ``W'[kh, kw, s, c*g + co] = W[c*g + co,
(co + s) % c, kh, kw]`` (the weights rotated once, when the engine opens the artifact: a
prepare kernel). Every lane multiplies a useful pair; a step costs one shuffle per input
vector besides its multiply-adds.

A workgroup unit holds ``rows`` consecutive output columns of one output row (as depthwise.py's
channels-last units do; the last unit starts early rather than run short) and walks the
channels a vector at a time. The window's rows are a loop; in it, the input vectors of the
columns the unit's window covers are loaded once and rotated once per step, and each rotation
feeds the up to ``kw`` accumulators whose window holds that column. The input is read in place:
a window row in the convolution's padding is skipped, a column in it (in a unit on the image's
edge) reads as zeros, and where the channels are not whole vectors the last vector's lanes are
masked (AVX2 on; without cheap masked loads such a convolution stays a GEMM). No zero-halo copy
of the input is made (as contraction.py makes for a GEMM): it had cost a third of the
convolution's own time on RegNet's stride-2 blocks.

Measured on ResNeXt-50's first stage (4 channels a group, 56 x 56 x 128): 3.0 -> 0.44 ms at one
thread on AVX-512, and the halo copy's 0.15 ms gone (``MLPACK_PROFILE=1``).

A group of a whole vector (16 channels on AVX-512, 8 on AVX2: ``Grouped.broadcast``) needs no
rotation: step ``s`` broadcasts input channel ``s`` of the column from memory (a load, which
AVX-512 folds into the multiply-add) and multiplies the weights as they are, ``W[co, s]``. A
column outside the input then loads from X's start and its multiply-adds keep the
accumulator (one masked multiply-add on AVX-512), so a 14-wide image, whose every unit touches
an edge, pays no select per channel: ResNeXt-50's third stage 0.24-0.29 -> 0.21-0.22 ms.
Such a unit holds no input vectors, only an accumulator a column besides the window's weight
vectors, so its columns are counted without the ``stride`` input vectors a rotating unit holds
per column: on AVX2's 16 registers 8 or 9 columns instead of 4 (3 at stride 2), each weight
vector feeding that many multiply-adds. Groups of 8 on AVX2 (ResNeXt-50's second stage, every
stage of RegNetY-400MF), x86_64-v3 on Zen 3, ``MLPACK_PROFILE=1``: 256 channels from 56 x 56 at
stride 2 1.03 -> 0.55-0.58 ms, at 28 x 28 stride 1 0.62 -> 0.43; RegNetY-400MF's grouped
convolutions 0.11-0.67 -> 0.06-0.54 ms each, its run 15.1 -> 13.7 ms.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.llvm.intrinsics import intrinsic, line_alloca, load_masked_f32, splat, umin
from mlpack.codegen.llvm.types import F32, I1, I32, I64, i64
from mlpack.codegen.targets.cpu import depthwise
from mlpack.codegen.targets.cpu.indexing import coeff, is_one
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.kernels import fresh_name, schedule
from mlpack.codegen.targets.cpu.target import CpuTarget
from mlpack.codegen.targets.cpu.tileepilogue import flat_bindable

# channels per group that run here (where they divide a vector): fewer are no GEMM
# (gemmview.MIN_BATCHED_N) and stay depthwise.py's row kernels; 32 and more fill a GEMM's tile
GROUP_SIZES = (4, 8, 16)
# Lanes from which a group of a whole vector broadcasts its input channels (Grouped.broadcast):
# SSE has no broadcast load (a load and a shuffle, against one shuffle to rotate)
BROADCAST_FROM = 8
MAX_ROWS = 12             # output columns per unit
RESERVED = 4              # vector registers left to the weights' vectors and a rotation
MAX_WINDOW = 7            # window columns (unrolled)


@dataclass
class Grouped:
    """How a grouped convolution runs as a direct kernel (Kernel.gemm, strategy gemm)."""
    x: Expr               # the input's read (unguarded), with ``ci`` at 0: channel c * g
    weights: str          # the rotated weights' buffer: [kh][kw][s][channel]
    group: str            # the output's group dim
    chan: str             # ... and its channel-in-group dim (unit stride)
    c: int                # channels per group
    groups: int           # the group dim's extent
    outer: list[str]      # the other output dims (not of size 1), a unit each; the last by
    rows: int             # ... blocks of this many columns
    ci: str               # the reduction dims: the group's input channel (the rotation),
    kw: str | None        # the window's column (unrolled; None: a window one column wide),
    kh: str | None        # the window's row (a loop; None: one row)
    kws: int
    khs: int
    stride: int           # input columns per output column
    xcol: str             # the input's dim those are
    vl: int
    fma: bool

    @property
    def broadcast(self) -> bool:
        """A group is a whole vector of 8 or 16: each step broadcasts one input channel from
        memory (a load, folded into the multiply-add on AVX-512) instead of rotating the
        column's vector (a shuffle), and the weights are not rotated (BROADCAST_FROM)."""
        return self.c == self.vl >= BROADCAST_FROM

    @property
    def padded(self) -> int:
        """The channels as whole vectors: the tiles' extent and the rotated weights'."""
        return -(-self.groups * self.c // self.vl) * self.vl


def plan(k: Kernel, info: dict, bufs: dict[str, Buffer], t: CpuTarget) -> dict | None:
    """Grouped's fields but the input's read and the weights' buffer (``fit`` makes those)
    when ``k`` (a contraction with a constant B, contraction.classify's ``info``) is a grouped
    convolution this kernel runs, else None."""
    if info.get("pair") is not None or info["b"].dtype != "f32" or k.acc_dtype != "f32" \
            or info["mode"] != "const" or len(info["batch"]) != 1 or len(info["n"]) != 1:
        return None
    out = bufs[k.out]
    g, co = info["batch"][0], info["n"][0]
    big = [d for d in out.layout if not is_one(out.sizes[d])]
    if big[-2:] != [g, co] or not all(out.sizes[d].is_const for d in (g, co)):
        return None
    c, vl = out.sizes[co].value, max(4, t.vector_bits // 32)
    if c not in GROUP_SIZES or vl % c or not all(s.is_const for s in k.rdims.values()):
        return None
    ra = info["a"]
    xbuf = bufs[ra.arg[0]]
    index = dict(zip(ra.arg[1], ra.args))
    chan = xbuf.layout[-1]
    ci = [r for r in k.rdims if coeff(index[chan], r) == 1]
    if len(ci) != 1 or k.rdims[ci[0]].value != c or coeff(index[chan], g) != c \
            or ex.free_vars(index[chan]) != {g, ci[0]}:
        return None
    ci = ci[0]
    outer = big[:-2]
    if not outer:
        return None
    col = outer[-1]
    # the window's column: the reduction dim moving X with the output's column; its row: any
    # other (one at most)
    cols = [d for d, ix in index.items() if col in ex.free_vars(ix)]
    if len(cols) != 1 or cols[0] == chan:
        return None
    stride = coeff(index[cols[0]], col)
    if stride not in (1, 2) or not out.sizes[col].is_const:
        return None
    kws = [r for r in k.rdims if r != ci and coeff(index[cols[0]], r) == 1]
    rest = [r for r in k.rdims if r != ci and r not in kws]
    if len(kws) > 1 or len(rest) > 1:
        return None
    if any(v in (g, ci) for dim, ix in index.items() if dim != chan for v in ex.free_vars(ix)):
        return None
    kw = kws[0] if kws else None
    kh = rest[0] if rest else None
    if kw is not None and k.rdims[kw].value > MAX_WINDOW:
        return None
    if any(ix is not None and not isinstance(coeff(ix, v), int)
           for ix in index.values() for v in ex.free_vars(ix)):
        return None
    free = t.vector_registers - RESERVED
    kwn = k.rdims[kw].value if kw else 1
    held = 0 if c == vl >= BROADCAST_FROM else stride   # input vectors a column (broadcast: none)
    rows = max(1, min(MAX_ROWS, (free - kwn) // (1 + held), out.sizes[col].value))
    width = out.sizes[col].value
    rows = -(-width // -(-width // rows))   # the columns split evenly into units
    return dict(group=g, chan=co, c=c, groups=out.sizes[g].value, outer=outer, rows=rows,
                ci=ci, kw=kw, kh=kh, kws=kwn, khs=k.rdims[kh].value if kh else 1,
                stride=stride, xcol=cols[0], vl=vl, fma=t.fma)


def fit(k: Kernel, found: dict, info: dict, bufs: dict[str, Buffer], masks: bool
        ) -> Kernel | None:
    """Make ``k`` a grouped direct kernel reading the input in place; the prepare kernel of
    its rotated weights, or None (``k`` untouched) where the channels are not whole vectors
    and the target has no cheap masked loads (``masks``), or a step of the input's columns is
    not known at build time."""
    ra = info["a"]
    if (found["groups"] * found["c"]) % found["vl"] and not masks:
        return None
    xbuf = bufs[ra.arg[0]]
    at = xbuf.layout.index(found["xcol"])
    if not all(xbuf.sizes[dim].is_const for dim in xbuf.layout[at + 1:]):
        return None
    d = Grouped(x=ex.substitute(ra, {found["ci"]: ex.const(0)}),
                weights=fresh_name(f"{info['b'].arg[0]}#rot", bufs), **found)
    pk = _weights_kernel(k, d, info["b"], bufs)
    k.gemm = d
    k.strategy = "gemm"
    k.row_chunks = 1
    return pk


def _weights_kernel(k: Kernel, d: Grouped, rb: Expr, bufs: dict[str, Buffer]) -> Kernel:
    """The prepare kernel writing W' (see the top), its channels past the last zero."""
    dims = {"rot.kh": d.khs, "rot.kw": d.kws, "rot.s": d.c, "rot.p": d.padded}
    buf = Buffer(d.weights, tuple(dims), {n: ex.const(v) for n, v in dims.items()}, "f32")
    bufs[d.weights] = buf
    last = d.groups * d.c - 1
    p = ex.binary("min", ex.var("rot.p"), ex.const(last))
    co = ex.mod(p, ex.const(d.c))
    s = ex.var("rot.s")
    env = {d.group: ex.floordiv(p, ex.const(d.c)), d.chan: co,
           d.ci: s if d.broadcast else ex.mod(co + s, ex.const(d.c))}
    if d.kh:
        env[d.kh] = ex.var("rot.kh")
    if d.kw:
        env[d.kw] = ex.var("rot.kw")
    index = {dim: ex.substitute(ix, {v: env.get(v, ex.const(0)) for v in ex.free_vars(ix)})
             for dim, ix in zip(rb.arg[1], rb.args)}
    read = ex.read(rb.arg[0], index, rb.dtype, rb.arg[2])
    body = ex.select(ex.binary("le", ex.var("rot.p"), ex.const(last)), read, ex.const(0.0))
    pk = Kernel(f"{k.name}_rot", d.weights, body, None, {}, "f32", reads=[rb.arg[0]],
                fused=list(k.fused), prepare=True)
    schedule(pk, buf, bufs)
    return pk


# ---------------------------------------------------------------- lowering


def emit_grouped(L, wg, count) -> None:
    """The body of a grouped direct kernel, into a KernelLowering (lower.py) whose entry block
    is current (as depthwise.emit_direct's)."""
    d: Grouped = L.k.gemm
    b, E = L.b, L.E
    osz = E.sizes[L.out.name]
    vty = ir.VectorType(F32, d.vl)
    accs = [b.alloca(vty, name=f"acc{r}") for r in range(d.rows)]
    buf = line_alloca(b, ir.ArrayType(F32, d.vl), "tile")
    col = d.outer[-1]
    sizes, start, end = depthwise.unit_range(L, d.outer, d.rows, wg, count)
    nchan = d.groups * d.c
    flat = flat_bindable(L.k.epilogue, L.out, [d.group, d.chan], L.buffers)
    x = _Input(L, d)

    with L.loops.loop(start, end, "unit") as u, E.scope():
        L.bind_unit(u, d.outer, sizes)
        c0 = b.mul(E.lookup(col), i64(d.rows))
        top = i64(osz[col].constant - d.rows)
        first = umin(b, c0, top)
        E.bind(col, first)
        with L.loops.loop(i64(0), i64(d.padded // d.vl), "tile") as ti, E.scope():
            pos = b.mul(ti, i64(d.vl))
            E.bind(d.group, b.udiv(pos, i64(d.c)))
            E.bind(d.chan, i64(0))
            for a in accs:
                b.store(ir.Constant(vty, [0.0] * d.vl), a)
            x.tile(pos)
            with _window_rows(L, d) as kh:
                x.window_row(lambda inside: _accumulate(L, d, accs, x, inside, b.add(
                    b.mul(kh, i64(d.kws * d.c * d.padded)), pos)))
            n = i64(d.vl)   # (whole vectors: a loop LLVM unrolls into one vector)
            if nchan % d.vl:
                n = b.sub(i64(nchan), pos)
                n = umin(b, n, i64(d.vl))
            for r, acc in enumerate(accs):
                here = b.add(first, i64(r), flags=("nsw",))
                fn = b.block.function
                body, after = fn.append_basic_block("row.st"), fn.append_basic_block("row.next")
                b.cbranch(b.icmp_unsigned(">=", here, c0), body, after)
                b.position_at_end(body)
                b.store(b.load(acc), b.bitcast(buf, vty.as_pointer()), align=4)
                with E.scope(**{col: here}), \
                        L.loops.loop(i64(0), n, "e.col", vectorize=True) as j, E.scope():
                    at = b.add(pos, j, flags=("nsw",))
                    if flat:   # every address affine in the channel: no division, vectors
                        # (as a GEMM tile's epilogue: tileepilogue.flat_bindable)
                        E.bind(d.group, i64(0))
                        E.bind(d.chan, at)
                    else:
                        E.bind(d.group, b.udiv(at, i64(d.c)))
                        E.bind(d.chan, b.urem(at, i64(d.c)))
                    v = b.load(b.gep(buf, [i64(0), j], inbounds=True), typ=F32)
                    L.store(L.finish(v))
                b.branch(after)
                b.position_at_end(after)
    b.ret_void()
    L.loops_md(L.loops.latches, L.loops.unroll)


class _Input:
    """The input's vectors for one unit: read in place, the window's rows and columns that
    fall in the convolution's padding read as zeros (a row skipped whole; a column, in a unit
    on the image's edge, loaded from the input's start and then zeroed), the lanes past the
    last channel masked off where the channels are not whole vectors."""

    def __init__(self, L, d: Grouped):
        self.L, self.d = L, d
        b, E = L.b, L.E
        self.vty = ir.VectorType(F32, d.vl)
        x = d.x
        self.name = x.arg[0]
        self.index = dict(zip(x.arg[1], x.args))
        layout = L.buffers[self.name].layout
        self.xix = [self.index[dim] for dim in layout]
        self.chan = layout[-1]
        strides = E.strides[self.name]
        if d.kw is not None:
            self.step = _var_step(self.xix, d.kw, strides)
        else:   # one window column: the next output column's input is a stride on
            self.step = _var_step(self.xix, d.outer[-1], strides) // d.stride
        self.span = d.stride * (d.rows - 1) + d.kws   # input columns a unit reads
        self.guarded = x.arg[2] is not None
        self.lanes = ir.Constant(ir.VectorType(I64, d.vl), list(range(d.vl)))
        self.mask = None

    def tile(self, pos) -> None:
        """At the tile of channels from ``pos``: its lanes' mask where channels end inside."""
        d, b = self.d, self.L.b
        if (d.groups * d.c) % d.vl:
            ity = ir.VectorType(I64, d.vl)
            self.mask = b.icmp_unsigned("<", b.add(splat(b, pos, ity), self.lanes),
                                        splat(b, i64(d.groups * d.c), ity))

    def window_row(self, accumulate) -> None:
        """``accumulate(inside)`` for the bound window row, with the anchor (its first
        column's offset) set: not at all for a row in the padding; in a unit whose columns
        all lie inside the input (``inside`` True), apart from one on its edge."""
        L, d = self.L, self.d
        b, E = L.b, L.E
        with E.scope(**{v: i64(0) for v in (d.ci, d.kw) if v}):
            self.anchor = E.flat_offset(self.name, [E.cast(E(ix), ix.dtype, "i64")
                                                    for ix in self.xix])
            row_ok, self.col0 = None, None
            for dim, ix in self.index.items():
                if not self.guarded or dim == self.chan:
                    continue
                v = E.cast(E(ix), ix.dtype, "i64")
                if dim == d.xcol:
                    self.col0, self.width = v, E.sizes[self.name][dim]
                    continue
                ok = b.icmp_unsigned("<", v, E.sizes[self.name][dim])
                row_ok = ok if row_ok is None else b.and_(row_ok, ok)
        fn = b.block.function
        done = fn.append_basic_block("wrow.done")
        if row_ok is not None:
            body = fn.append_basic_block("wrow")
            b.cbranch(row_ok, body, done)
            b.position_at_end(body)
        if self.col0 is None:
            accumulate(True)
            b.branch(done)
        else:   # the unit's columns [col0, col0 + span) inside [0, width)?
            inside = b.and_(b.icmp_signed(">=", self.col0, i64(0)), b.icmp_signed(
                "<=", b.add(self.col0, i64(self.span)), self.width))
            fast, slow = fn.append_basic_block("wrow.in"), fn.append_basic_block("wrow.edge")
            b.cbranch(inside, fast, slow)
            for block, flag in ((fast, True), (slow, False)):
                b.position_at_end(block)
                accumulate(flag)
                b.branch(done)
        b.position_at_end(done)

    def _offset(self, j: int, inside: bool, channel: int = 0):
        """(X's offset of input column ``j`` of the unit at the tile's ``channel``, and None
        or, for a column that may lie outside the input, whether it is inside): a column
        outside reads X's start instead. (The channel is added before the select: added
        after it, the broadcast kernel's addresses made ResNeXt-50's third stage 10% slower.)"""
        b = self.L.b
        off = b.add(self.anchor, i64(j * self.step + channel))
        if inside:
            return off, None
        ok = b.icmp_unsigned("<", b.add(self.col0, i64(j)), self.width)
        return b.select(ok, off, i64(channel)), ok

    def column(self, j: int, inside: bool):
        """The vector of input column ``j`` of the unit (its channels at the tile)."""
        b = self.L.b
        off, ok = self._offset(j, inside)
        base = self.L.E.bases[self.name]
        if self.mask is None:
            ptr = b.gep(base, [off], inbounds=True, source_etype=F32)
            v = b.load(ptr, typ=self.vty, align=4)
        else:   # (no inbounds: masked-off lanes may lie past the buffer)
            v = load_masked_f32(b, b.gep(base, [off], source_etype=F32), self.vty, self.mask)
        if ok is not None:
            v = b.select(ok, v, ir.Constant(self.vty, [0.0] * self.d.vl))
        return v

    def channel(self, j: int, s: int, inside: bool):
        """(input channel ``s`` of the tile at column ``j`` of the unit in every lane, and
        ``_offset``'s test): a whole-vector group, no lane mask. The caller keeps its
        accumulator where the column is outside (``_accumulate``)."""
        b = self.L.b
        off, ok = self._offset(j, inside, s)
        v = b.load(b.gep(self.L.E.bases[self.name], [off], inbounds=True, source_etype=F32),
                   typ=F32, align=4)
        return splat(b, v, self.vty), ok


def _accumulate(L, d: Grouped, accs, x: _Input, inside: bool, woff) -> None:
    """One window row's sums into ``accs``: step by step (the rotations, or the broadcast
    channels of a whole-vector group), each input column's vector into every accumulator whose
    window holds the column."""
    b = L.b
    vty = x.vty
    fma = intrinsic(b.module, "llvm.fma", vty, 3) if d.fma else None
    wbase = L.E.bases[d.weights]
    columns = {}
    for s in range(d.c):
        ws = [b.load(b.gep(wbase, [b.add(woff, i64((kw * d.c + s) * d.padded))],
                           inbounds=True, source_etype=F32), typ=vty, align=4)
              for kw in range(d.kws)]
        for r, acc in enumerate(accs):
            for kw in range(d.kws):
                j = d.stride * r + kw
                ok = None
                if d.broadcast:   # (input channel s of column j, in every lane)
                    if (j, s) not in columns:
                        columns[j, s] = x.channel(j, s, inside)
                    xv, ok = columns[j, s]
                else:
                    if j not in columns:
                        columns[j] = x.column(j, inside)
                    xv = columns[j]
                    if s:
                        xv = b.shuffle_vector(xv, ir.Constant(vty, ir.Undefined),
                                              _rotation(d.c, d.vl, s))
                cur = b.load(acc)
                new = b.call(fma, [xv, ws[kw], cur]) if fma is not None \
                    else b.fadd(cur, b.fmul(xv, ws[kw]))
                if ok is not None:   # (a column outside the input adds nothing: on AVX-512
                    # one multiply-add masked by the column's test, the broadcast folded in)
                    new = b.select(splat(b, ok, ir.VectorType(I1, d.vl)), new, cur)
                b.store(new, acc)


def _rotation(c: int, vl: int, s: int) -> ir.Constant:
    """The shuffle mask taking lane (g, co) from lane (g, (co + s) % c) of one vector."""
    return ir.Constant(ir.VectorType(I32, vl),
                       [j - j % c + (j % c + s) % c for j in range(vl)])


@contextmanager
def _window_rows(L, d: Grouped):
    """The loop over the window's rows (LLVM told not to unroll it), yielding its index; one
    pass at 0 when the window is one row."""
    if d.kh is None:
        yield i64(0)
        return
    with L.loops.loop(i64(0), i64(d.khs), "window", unroll=False) as kh, L.E.scope():
        L.E.bind(d.kh, kh)
        yield kh


def _var_step(index: list[Expr], var: str, strides) -> int:
    """How far X's flat offset moves per step of ``var`` (constant strides: ``plan`` checked
    the dims inside the channels)."""
    step = 0
    for ix, s in zip(index, strides):
        if var in ex.free_vars(ix):
            step += coeff(ix, var) * s.constant
    return step
