"""Contractions (convolutions, matmuls, einsums) as packed, register-blocked GEMM kernels.

A kernel is a *contraction* when it sums, in f32, the product of two reads whose indices are
affine in the loop vars. Its output dims then fall into three spaces: ``N`` (dims only B
reads), ``M`` (dims only A reads) and ``batch`` (dims both read, walked outside); the
reduction dims are ``K``. The kernel becomes one GEMM per batch point: an ``M x K`` operand A
read in place (through affine offsets ``base(m) + off(k)``), times B, read one of three ways:

* ``const``: B is a graph constant of constant extents, packed when the engine opens the
  artifact (a prepare kernel, panels.py) at ``[batch][N blocks][K][PACK]``, zero-padded
  along N;
* ``direct``: B's N dims (flattened) lie at unit stride in B's memory, so its PACK-column
  blocks are loaded in place (attention's P.V reads V so); a ragged last block loads under
  a mask where the target has cheap masked loads. An NCHW 1x1 convolution takes this form
  with the weights as A and the input as B (``_swapped``), so the epilogue stores along the
  output's unit-stride dim;
* ``pack``: anything else read at run time (attention's Q.K^T, symbolic sizes) is first
  copied by a map kernel into an arena buffer in the packed layout (``panels.pack_kernel``).

Which operand is B, when neither is a build-time constant, is chosen by ``_runtime``. Sizes
may be symbolic except those of a build-time pack. A contraction with too few columns for
a GEMM (a depthwise convolution) may still run as a row-vectorized direct kernel
(depthwise.py; ``apply`` tries it, and ``workgroups`` dispatches to it).

A guarded read of A (convolution padding) is not checked in the inner loop: a map kernel first
copies A into an arena buffer with a zero halo covering every index the contraction reads, and
the contraction reads that buffer unguarded at shifted indices.

This module is the schedule: it classifies, chooses the tile shape for the target and records
it in the kernel (gemm.Contraction, with B packed by gemm.pack_b); microkernel.py emits the
register-blocked micro-kernel, amx.py and amxkernel.py the AMX form.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu import amx, depthwise, groupwise, panels
from mlpack.codegen.targets.cpu.gemm import (PACK, PAIR_PRODUCTS, SIGNED_A, Contraction,
                                            bf16_dot, int8_dot)
from mlpack.codegen.targets.cpu.gemmview import (MIN_N, const_view, extent, int8_view,
                                                 narrow_view, pair_size, panel_dtype, split,
                                                 widened)
from mlpack.codegen.targets.cpu.indexing import affine, index_range, is_one, read_step
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, exact_bytes
from mlpack.codegen.targets.cpu.kernels import (WORK_PER_WORKGROUP, fresh_name, schedule,
                                                shared_units)
from mlpack.codegen.targets.cpu.target import CpuTarget
from mlpack.codegen.targets.cpu.tileshape import narrow, row_runs, tile_shape

MIN_M = 4                    # a run-time B needs rows enough to repay its pack (or strided loads)
L1_PANEL_BYTES = 24 << 10    # a K chunk's slice of B read in place stays in L1
L2_PANEL_BYTES = 256 << 10   # ... of packed B panels, in L2 (``_k_chunk``)
L1_SETS, L1_WAYS = 64, 8     # a 32 KiB L1 data cache of 64-byte lines (Zen; Intel's has more ways)
GROUP_ROWS = 48              # rows of M (over several tiles) that share one K chunk
MAX_GROUP_ROWS = 96          # ... or all of M, up to this many rows
CACHE_REUSE_BYTES = 1 << 20  # an operand this small stays in L2 while the other streams
SMALL_L2_BYTES = 1 << 18     # ... or in the smallest L2 of a core that runs it (256 KiB)
LINE_BYTES = 64              # a cache line
SWAP_MIN_N = 256             # pixels an NCHW 1x1 convolution needs to read x in place as B
PACK_MIN_M = 128             # rows a run-time pack of B must feed to repay its copy
ALIAS_BYTES = 1024           # pixel strides of a multiple of this alias in L1 (``_aliasing``)
ALIAS_PAD = 16               # floats (a cache line) added to such a copy's rows


# ---------------------------------------------------------------- classification


def _direct(info: dict, bufs: dict[str, Buffer], masks: bool = False) -> bool:
    """Whether B can be read in place: unguarded, its N dims (flattened, last fastest) at
    unit stride and contiguous in B's memory. A ragged N (not whole PACK blocks) needs masked
    loads for the last tile's columns (``masks``: the target has them cheaply)."""
    rb = info["b"]
    if rb.arg[2] is not None or not info["n"]:
        return False
    ns = info["n_size"]
    if not (ns.is_const and (ns.value % PACK == 0 or masks)):
        return False
    want = ex.const(1)
    out_sizes = info["n_sizes"]
    for v in reversed(info["n"]):
        if not ex.same_size(_b_step(info, bufs, v), want):
            return False
        want = ex.simplify_size(want * out_sizes[v])
    return True


def classify(k: Kernel, g, bufs: dict[str, Buffer], t: CpuTarget | None = None) -> dict | None:
    """The GEMM view of ``k`` (spaces, reads, coefficients, how B is read), or None when it is
    no contraction. B is packed at build time when it is a constant of constant extents;
    otherwise it is read at run time: in place when it allows (``_direct``), else through a
    pack kernel. Of the two operands, B is the one that reads better (see ``_runtime``)."""
    if k.reduce != "sum" or k.acc_dtype not in ("f32", "i32") or k.strategy == "gemm" or k.points:
        return None   # (a point tile's kernel runs one point at a time: tiles.py)
    body = k.body
    if body.op != "mul":
        return None
    out = bufs[k.out]
    if k.acc_dtype == "i32":
        return int8_view(k, g, out, body.args, bufs, t)
    narrow = [widened(a, g) for a in body.args]
    if any(narrow):
        return narrow_view(k, g, out, body.args, narrow, bufs, t)
    if any(a.op != "read" or a.dtype != "f32" for a in body.args):
        return None
    r1, r2 = body.args
    for ra, rb in ((r1, r2), (r2, r1)):
        if not (rb.arg[0] in g.constants and rb.arg[2] is None):
            continue
        info = const_view(k, out, ra, rb)
        if info is False:
            return None
        if info is None:
            break   # symbolic: B is packed at run time instead
        return _swapped(k, out, info, bufs, t) or info
    return _runtime(k, out, r1, r2, bufs, t)


def _masks(t: CpuTarget | None) -> bool:
    """Whether masked vector loads are cheap (AVX2 and up; SSE would scalarize them)."""
    return t is not None and t.vector_bits >= 256


def _b_step(info: dict, bufs, v: str) -> Expr:
    """How many elements B's read moves in memory when loop var ``v`` steps by one."""
    return read_step(info["aff_b"], bufs[info["b"].arg[0]], v)


def _in_place_mode(info: dict, bufs, sets: bool = False) -> str:
    """How to read a B that could be read in place: ``direct``, unless a step of K moves B by
    a whole number of floats that is no multiple of a cache line (an NCHW 1x1 convolution on
    55x55) and M has rows enough to repay a pack: every vector load of B would then
    straddle two lines, and a packed copy is aligned. ``sets``: also pack a B whose rows share
    too few L1 sets (``_set_bound``; asked for a B computed by the model, as attention's V,
    not for an NCHW convolution's input read as B, where it was not measured)."""
    ms = info["m_size"]
    if not (ms.is_const and ms.value >= PACK_MIN_M):
        return "direct"
    for v in info["k"]:
        step = _b_step(info, bufs, v)
        if step.is_const and ((step.value * 4) % LINE_BYTES
                              or (sets and _set_bound(step.value * 4))):
            return "pack"
    return "direct"


def _set_bound(stride: int) -> bool:
    """Whether B rows ``stride`` bytes apart, a tile's four PACK blocks of each (the widest
    tile), would not stay in L1 over a K chunk (L1_PANEL_BYTES of them): rows a multiple of
    many lines apart start in few of its L1_SETS sets and evict each other (attention's P.V
    reads V in place, a head's 64 columns of a row 6 * 64 floats long: its rows start in 8
    sets, 32 sets for 384 lines)."""
    lines = 4 * PACK * 4 // LINE_BYTES
    starts = L1_SETS // math.gcd(stride // LINE_BYTES, L1_SETS)
    return L1_PANEL_BYTES // LINE_BYTES > min(L1_SETS, starts * lines) * L1_WAYS


def _swapped(k: Kernel, out: Buffer, info: dict, bufs, t) -> dict | None:
    """The constant as A and the other operand read in place as B, when that stores the output
    along its unit-stride dim and the packed view would not: an NCHW 1x1 convolution is then
    W[co, ci] times x[ci, h*w], B's columns contiguous (as MLAS does it), instead of a GEMM
    over rows of strided A broadcasts whose epilogue stores across channels."""
    inner = out.contiguous_dim()
    if inner in info["n"]:
        return None
    alt = split(k, out, info["b"], info["a"])
    if alt is None or not alt["k"] or inner not in alt["n"] or alt["b"].arg[2] is not None:
        return None
    ms = alt["m_size"]
    if not (ms.is_const and ms.value >= MIN_M) or not _direct(alt, bufs, _masks(t)):
        return None
    if alt["n_size"].value < SWAP_MIN_N:
        return None   # a 7x7 or 13x13 image fills too little of a tile's 64 columns
    alt["mode"] = _in_place_mode(alt, bufs)
    return alt


def _runtime(k: Kernel, out: Buffer, r1: Expr, r2: Expr, bufs, t=None) -> dict | None:
    """The better GEMM view with B read at run time, or None. A pack costs a pass over N*K
    elements of B per batch point, worth it when every packed element feeds several rows."""
    best, key = None, None
    for ra, rb in ((r1, r2), (r2, r1)):
        info = split(k, out, ra, rb)
        if info is None or not info["k"]:
            continue
        ns, ms = info["n_size"], info["m_size"]
        if (ns.is_const and ns.value < MIN_N) or (ms.is_const and ms.value < MIN_M):
            continue
        in_place = _direct(info, bufs, _masks(t))
        info["mode"] = _in_place_mode(info, bufs, sets=True) if in_place else "pack"
        # readable in place beats a pack; then output columns at unit stride (the epilogue's
        # stores); then the wider N (symbolic counts as wide)
        score = (in_place, out.contiguous_dim() in info["n"],
                 ns.value if ns.is_const else 1 << 30)
        if key is None or score > key:
            best, key = info, score
    return best


# ---------------------------------------------------------------- A: the zero-halo copy


def _aliasing(size: Expr, coeffs: dict[str, int], rdims: dict) -> bool:
    """Whether a zero-halo copy whose innermost dim (of ``size``) A walks along K (channels
    last) would put its pixels a multiple of ALIAS_BYTES apart: a window's taps and a tile's
    rows then fall in a few L1 sets, evicting each other every K step (a grouped 3x3
    convolution over 1024 channels ran 3x slower than in NCHW). The copy's rows are then
    ALIAS_PAD floats longer."""
    along_k = any(v in rdims and c == 1 for v, c in coeffs.items())
    return along_k and size.is_const and (size.value * 4) % ALIAS_BYTES == 0


def _unguard(k: Kernel, info: dict, bufs: dict[str, Buffer], name: str, layout=None,
             dtype: str | None = None):
    """(A read without guards, pad kernel or None); None when the index range is unknown.
    ``layout``: the copy's dims in memory order (amx.a_layout), ``dtype``: its element type
    (u8 widened to u16 for gemm.PAIR_PRODUCTS), either of which makes a copy even of an A that
    needs no padding."""
    ra = info["a"]
    src = bufs[ra.arg[0]]
    dtype = dtype or src.dtype
    relaid = (layout is not None and tuple(layout) != tuple(src.layout)) or dtype != src.dtype
    if ra.arg[2] is None and not relaid:
        return ra, None
    out = bufs[k.out]
    index = dict(zip(ra.arg[1], ra.args))
    sizes, shift, inside = {}, {}, True
    for d in src.layout:
        lo, hi = index_range(*info["aff_a"][d], lambda v: extent(v, out, k.rdims))
        if lo.is_const and lo.value == 0 and ex.same_size(hi + 1, src.sizes[d]):
            sizes[d], shift[d] = src.sizes[d], 0
            continue
        if not (lo.is_const and hi.is_const):
            return None
        sizes[d], shift[d] = ex.const(hi.value - lo.value + 1), lo.value
        size = src.sizes[d]
        if not (size.is_const and lo.value >= 0 and hi.value < size.value):
            inside = False
    unguarded = {d: ex.simplify_size(index[d] - shift[d]) if shift[d] else index[d]
                 for d in ra.arg[1]}
    if inside and not relaid:   # every read is in bounds: no copy
        return ex.read(src.name, dict(zip(ra.arg[1], ra.args)), ra.dtype), None
    inner = (layout or src.layout)[-1]
    if ra.arg[2] is not None and _aliasing(sizes[inner], info["aff_a"][inner][0], k.rdims):
        sizes[inner] = ex.const(sizes[inner].value + ALIAS_PAD)   # (read as padding: zeros)
    pbuf = Buffer(name, tuple(layout or src.layout), sizes, dtype)
    bufs[name] = pbuf
    body = ex.read(src.name, {d: ex.var(d) + shift[d] if shift[d] else ex.var(d)
                              for d in src.layout}, src.dtype, ra.arg[2])
    if dtype != src.dtype:
        body = ex.cast(body, dtype)
    pk = Kernel(f"{k.name}_pad", name, body, None, {}, dtype, reads=[src.name],
                fused=list(k.fused))
    schedule(pk, pbuf, bufs)
    return ex.read(name, unguarded, dtype), pk


# ---------------------------------------------------------------- the pass


# packed B per graph, kept while the graph lives: packing is target independent, and a build
# compiles one graph for every cpu target
_PACKED: dict[int, dict] = {}


def _pack_cache(g) -> dict:
    key = id(g)
    if key not in _PACKED:
        _PACKED[key] = {}
        weakref.finalize(g, _PACKED.pop, key, None)
    return _PACKED[key]


def _k_chunk(t_tb: int, info: dict, rdims: dict, packed: bool, first: int = 1) -> int:
    """Steps of the outermost K loop (its ``first`` K dims) per chunk (even when that dim is
    paired, bf16dot.py). A chunk's slice of ``packed`` panels (contiguous) stays in L2, so
    that a transformer's K of 768 or 1024 is one chunk: each tile then keeps its accumulators
    in registers from its first step to its store, where L1-sized chunks (96 steps of a
    64-column tile) took each tile's 24 accumulators through the tile buffer eight times and
    stored the group's outputs in one burst after its last (GPT-2's, ViT's, DistilBERT's GEMMs
    2-4% slower; docs/decisions.md, "A K chunk is an L2's worth of panel"). A B read in place
    (rows strided, ``_set_bound``) keeps a slice that fits L1. An int8 panel takes a byte per
    element, so its chunks are four times as deep."""
    width = 1 if info["b"].dtype == "i8" else 4
    steps = max(1, (L2_PANEL_BYTES if packed else L1_PANEL_BYTES) // (t_tb * PACK * width))
    inner = ex.product([rdims[r] for r in info["k"][first:]])
    kc = 1 if not inner.is_const else max(1, steps // max(1, inner.value))
    if info.get("pair") is not None and info["pair"] == info["k"][0]:
        kc += -kc % pair_size(info)
    return kc


def batch_symbols(g) -> dict[str, Expr]:
    """Each symbol that sizes only the leading dim of the graph's inputs (a dynamic batch),
    as 1: the schedule's choices that depend on sizes (cache reuse, groups of rows, streamed
    weights) are made for the batch of one a model is mostly run at, not left to the
    symbolic default (a $batch x 56 x 56 image would never count as too big for L2). A
    sequence length, or any other symbol, stays symbolic."""
    lead, rest = set(), set()
    for p in g.inputs:
        for i, size in enumerate(g.types[p.name].dims.values()):
            (lead if i == 0 else rest).update(ex.free_syms(size))
    return {s: ex.const(1) for s in lead - rest}


def typical(e: Expr, one: dict[str, Expr]) -> Expr:
    """``e`` at a batch of one (``batch_symbols``)."""
    return ex.simplify_size(ex.substitute(e, one, kind="sym")) if one else e


def apply(g, kernels: list[Kernel], bufs: dict[str, Buffer], t: CpuTarget,
          source=None) -> list[Kernel]:
    """``kernels`` with every contraction turned into a GEMM kernel (after its pad copy and,
    for a B packed at run time, its pack kernel). ``source``: the graph ``g`` was rewritten
    from for this target (concat.py, winograd.py), which every target of a build shares: the
    packed weights are cached on it."""
    out: list[Kernel] = []
    packs: dict = {}
    cache = _pack_cache(g if source is None else source)
    one = batch_symbols(g)
    for k in kernels:
        info = classify(k, g, bufs, t)
        if info is None:
            depthwise.apply(k, bufs, t)   # a narrow contraction may still vectorize by rows
            out.append(k)
            continue
        ob = bufs[k.out]
        tiles = None
        if t.amx and info["mode"] == "const" and info["b"].dtype == "f32":   # (then every K
            # extent is a constant)
            tiles = amx.plan(info, bufs, {v: extent(v, ob, k.rdims).value for v in info["k"]},
                             ob.contiguous_dim())
        grouped = groupwise.plan(k, info, bufs, t) if tiles is None else None
        rotated = None if grouped is None else groupwise.fit(k, grouped, info, bufs, _masks(t))
        if rotated is not None:   # a few channels a group: whole vectors of groups
            k.reads = _gemm_reads(k, info["a"], k.gemm.weights)
            out.extend([rotated, k])
            continue
        dot = _dot_of(info, t)
        # pmaddwd multiplies i16: A is copied widened, once per run, so that a row's pair of K
        # is one 32-bit broadcast (the copy is a pass over A; the GEMM reads it N / 16 times)
        hit = _unguard(k, info, bufs, f"{k.out}#a", tiles[0] if tiles else info.get("relayout"),
                       "u16" if dot in PAIR_PRODUCTS else None)
        if hit is None:
            out.append(k)
            continue
        ra, pad = hit
        rb = info["b"]
        pre = [] if pad is None else [pad]
        if tiles is not None and amx.gemm(k, info, ra, g, bufs, packs, cache):
            k.reads = _gemm_reads(k, ra, k.gemm.packed)
            out.extend(pre)
            out.append(k)
            continue
        direct = None
        if info["mode"] == "const":
            dims = info["batch"] + info["n"] + info["k"]
            extents = {v: extent(v, ob, k.rdims).value for v in dims}
            pdt = panel_dtype(rb.dtype, t)
            pair, size = info.get("pair"), pair_size(info)
            halves = dot in PAIR_PRODUCTS
            key = (rb.arg[0], rb, tuple(dims), tuple(extents.items()), tuple(info["n"]), pdt,
                   pair, size) + (("halves",) if halves else ())
            if key not in packs:   # one panel per way of packing a constant, made at load
                stem = f"{rb.arg[0]}#pack{len(packs)}" if packs else f"{rb.arg[0]}#pack"
                panel = panels.panel_kernel(k, info, bufs, fresh_name(stem, bufs), pdt, pair,
                                            size, halves)
                packs[key] = panel.out
                pre.append(panel)
            name = packs[key]
        elif info["mode"] == "pack":
            name = fresh_name(f"{k.out}#b", bufs)
            pre.append(panels.pack_kernel(k, info, bufs, name))
        else:
            name, direct = rb.arg[0], rb
        init = None
        if dot in SIGNED_A:   # (then B is a panel packed at load)
            if ("init",) + key not in packs:
                correction = panels.correction_kernel(
                    bufs[name], fresh_name(f"{name}#init", bufs), bufs)
                packs[("init",) + key] = correction.out
                pre.append(correction)
            init = packs[("init",) + key]
        blocks = ex.simplify_size(ex.ceildiv(info["n_size"], ex.const(PACK)))
        nvec = narrow(t, info) if k.acc_dtype == "f32" else 0
        m_size = typical(info["m_size"], one)
        points = _batch_points(ob, info, one)
        vl, tb, mr = tile_shape(t, blocks.value if blocks.is_const else 64,
                                dot in PAIR_PRODUCTS, nvec,
                                _one_group(m_size) and points.is_const and points.value == 1)
        if _one_group(m_size) and m_size.value > mr:
            # (an M of one tile keeps its height: seen at a batch of one, a layer of one row
            # would otherwise have tiles of one row at every batch)
            mr = even_rows(m_size.value, mr)
        if info["m"]:
            mr = row_runs(mr, [k.rdims[r] for r in info["k"]], ob.sizes[info["m"][-1]])
        plain = k.acc_dtype == "f32" and info.get("pair") is None
        k_runs = _k_runs(ra, bufs, info, k.rdims, direct) if plain else ()
        group = _group(m_size, mr)
        # (B's data is the AMX tiles' alone, amx.gemm: every other panel is packed at load)
        k.gemm = Contraction(ra, name, None, info["batch"], info["m"], info["n"], info["k"],
                             info["n_size"], info["k_size"], blocks, vl, tb, mr,
                             t.fma, group, _k_chunk(tb, info, k.rdims, direct is None),
                             direct, direct is not None and info["n_size"].value % PACK != 0,
                             _n_inner(bufs[ra.arg[0]], bufs[name], ob, info, one),
                             pair=info.get("pair"),
                             dot=dot, init=init,
                             nvec=nvec, k_runs=k_runs, batch_inner=_batch_inside(ob, info),
                             stream=direct is None and m_size.is_const
                             and m_size.value <= group * mr)
        k.gemm.tail_rows = m_size.value % mr if m_size.is_const else 0
        # (one tile of rows reads each chunk once: ``stream``'s fetches serve it)
        k.gemm.fetch_ahead = direct is None and _passes_l2(bufs[name], ob, info, one) \
            and not (m_size.is_const and m_size.value <= mr)
        if k_runs:   # chunks count steps of the outermost K loop
            k.gemm.kc = _k_chunk(tb, {**info, "k": [r for run in k.gemm.k_loops[1:]
                                                   for r in run]}, k.rdims, direct is None,
                                 first=k_runs[0])
        k.strategy = "gemm"
        k.reads = _gemm_reads(k, ra, name) + ([init] if init else [])
        out.extend(pre)
        out.append(k)
    return out


def _k_runs(ra: Expr, bufs: dict[str, Buffer], info: dict, rdims: dict,
            direct: Expr | None) -> tuple[int, ...]:
    """K dims per micro-kernel loop (gemm.Contraction.k_runs), or () for one each: a K dim and
    the next loop as one when A (and B read in place) step the outer by the inner's whole
    extent, as a channel unflatten split into groups reads (a 1x1 convolution after a grouped
    one: 32 groups of 4 channels would be an inner loop of 4 steps)."""
    loop = set(bufs[ra.arg[0]].layout) | set(rdims) | set(info["m"]) | set(info["batch"])

    def step(read: Expr, v: str) -> Expr | None:
        buf = bufs[read.arg[0]]
        index = dict(zip(read.arg[1], read.args))
        aff = {d: affine(index[d], loop | set(buf.layout)) for d in buf.layout}
        return None if any(f is None for f in aff.values()) else read_step(aff, buf, v)

    def joins(u: str, v: str) -> bool:
        for read in (ra, direct) if direct is not None else (ra,):
            su, sv = step(read, u), step(read, v)
            if su is None or sv is None or not ex.same_size(su, ex.simplify_size(sv * rdims[v])):
                return False
        return True
    runs: list[int] = []
    for i, v in enumerate(info["k"]):
        if runs and joins(info["k"][i - 1], v):
            runs[-1] += 1
        else:
            runs.append(1)
    return tuple(runs) if len(runs) < len(info["k"]) else ()


def _batch_inside(out: Buffer, info: dict) -> bool:
    """Whether the output lays every batch dim inside the M dims (a grouped convolution
    channels last: its groups within each pixel), so the units walk the batch fastest."""
    order = [d for d in out.layout if not is_one(out.sizes[d])]
    pos = {d: i for i, d in enumerate(order)}
    batch = [pos[d] for d in info["batch"] if d in pos]
    m = [pos[d] for d in info["m"] if d in pos]
    return bool(batch and m) and min(batch) > max(m)


def _dot_of(info: dict, t: CpuTarget) -> str | None:
    """The product intrinsic of a paired contraction (bf16 pairs or int8 quads), or None."""
    if info.get("pair") is None:
        return None
    return int8_dot(t) if info["b"].dtype == "i8" else bf16_dot(t)


def _group(m_size: Expr, mr: int) -> int:
    """M tiles per workgroup unit (they share each K chunk of the B panel from cache): about
    GROUP_ROWS rows, or all of M when it is at most MAX_GROUP_ROWS rows. A late convolution's
    7x7 = 49 rows would otherwise be 48 + 1, and the 1-row group would stream the whole panel
    again (resnet50's 3x3 512-channel convolution on 7x7: 0.87 -> 0.95 of ONNX Runtime)."""
    tiles = max(1, GROUP_ROWS // mr)
    if _one_group(m_size):
        tiles = max(tiles, -(-m_size.value // mr))
    return tiles


def even_rows(m: int, mr: int) -> int:
    """The tile height for an M of ``m`` rows that is one group: of the tile counts that
    tiles of ``mr`` rows, or of one row fewer, need, the one whose tiles compute the fewest
    rows, the fewer tiles at a tie, its rows shared evenly. The last tile computes its rows
    past M's end all the same (they read a clamped row), so a 7x7 image's 49 rows are 10
    tiles of 5 (50 rows), not 9 of 6 (54; a 49 x 192 x 1152 GEMM at one thread, the last
    expansions of MobileNets and EfficientNets, went from 0.85-0.91 of ONNX Runtime's speed
    to 0.92-0.95), and 5 tiles of 10 where 12 rows fit, not 4 of 12 and one row. Tiles of 4
    rows or fewer are not made shorter: a step's B loads would outweigh its FMAs."""
    shortest = mr - 1 if mr > 4 else mr
    counts = range(-(-m // mr), -(-m // shortest) + 1)
    return -(-m // min(counts, key=lambda n: (n * -(-m // n), n)))


def _one_group(m_size: Expr) -> bool:
    """Whether all of M is one group of rows (``_group``)."""
    return m_size.is_const and m_size.value <= MAX_GROUP_ROWS


def _batch_points(out: Buffer, info: dict, one: dict[str, Expr]) -> Expr:
    """How many batch points (the output dims walked outside the GEMM) there are at a batch
    of one."""
    return typical(ex.product([extent(v, out, {}) for v in info["batch"]]), one)


def _n_inner(a: Buffer, b: Buffer, out: Buffer, info: dict, one: dict[str, Expr]) -> bool:
    """Whether the units should walk N tiles fastest: each M group's rows of A then stay in
    cache while every N tile uses them, B is read once per M group, and the output is written
    row after row. Sizes are a batch point's (attention's heads, walked outermost). Worth it
    when B stays in cache over a sweep of N (it fits Zen 4's L2, 1 MiB) and either

    - A is too big to stay there over a sweep of M (M fastest re-reads all of A per N tile),
      passing the smallest L2 a core has (Zen 3's is 512 KiB, and a 112x112 image of 16
      channels 800 KiB: 1.47 -> 1.23 ms for its 1x1 convolution on AVX2), and bigger than B;
    - or the output passes that L2: M fastest writes it one column block at a time, a line's
      halves by tiles a whole sweep apart (Whisper's attention scores, 1500 x 1500 a head from
      K = 64: 41 -> 30 ms a layer at 1 thread on AVX2).

    Where neither operand fits L2, N fastest too when B is the smaller: an M group's rows of A
    are then re-read from L2 while B's panels stream in order, instead of A's rows, strided,
    coming from L3 once per N tile (Whisper's stride-2 convolution, A 4.6 MB and B 1.8 MB:
    17.0 -> 14.4 ms; its second fully connected layers, A 9.2 MB and B 2.4 MB: 17.2 -> 16.4
    ms, at 1 thread on AVX-512). With B the bigger it is not (ViT-B/16's second fully
    connected layers, B 9.4 MB: the model 3-4% slower)."""
    sizes = _point_bytes(out, info, one, a, b, out)
    if sizes is None:
        return False
    sa, sb, so = sizes
    if sb > CACHE_REUSE_BYTES:
        return sa > CACHE_REUSE_BYTES and sb < sa
    return (sa > SMALL_L2_BYTES and sb < sa) or so > SMALL_L2_BYTES


def _passes_l2(b: Buffer, out: Buffer, info: dict, one: dict[str, Expr]) -> bool:
    """Whether a batch point's packed B is bigger than an L2 keeps (CACHE_REUSE_BYTES), so
    that its panels come from L3 or memory each time an M group reads them: a transformer's
    weights (GPT-2's 768 x 3072, 9.4 MB), a late convolution's (ResNeXt-50's 1024 x 2048)."""
    sizes = _point_bytes(out, info, one, b)
    return sizes is not None and sizes[0] > CACHE_REUSE_BYTES


def _point_bytes(out: Buffer, info: dict, one: dict[str, Expr], *bufs: Buffer) -> list | None:
    """The bytes of each of ``bufs`` a batch point takes at a batch of one, or None where
    that is not known at build time."""
    points = _batch_points(out, info, one)
    sizes = [typical(exact_bytes(x), one) for x in bufs]
    if not points.is_const or points.value < 1 or not all(x.is_const for x in sizes):
        return None
    return [x.value // points.value for x in sizes]


def _gemm_reads(k: Kernel, ra: Expr, b_name: str) -> list[str]:
    """What a gemm kernel reads: A, B (packed or in place) and its epilogue's other tensors."""
    epi = [] if k.epilogue is None else _reads(k.epilogue)
    return list(dict.fromkeys([ra.arg[0], b_name, *[r for r in epi if r != k.out]]))


def _reads(e: Expr) -> list[str]:
    return list(dict.fromkeys(n.arg[0] for n in ex.walk(e) if n.op == "read"))


def packed_weights(kernels: list[Kernel]) -> dict[str, np.ndarray]:
    """The B tensors packed at build time that the kernels read, by name (for the plan's
    weights): the AMX target's tiles. Every other panel is packed when the engine opens the
    artifact (``panels.panel_kernel``)."""
    out = {}
    for k in kernels:
        c = getattr(k, "gemm", None)
        if c is not None and getattr(c, "data", None) is not None:
            out[c.packed] = c.data
    return out


def workgroups(k: Kernel, out: Buffer) -> Expr:
    """The dispatch's workgroup count: tiles shared out in chunks of about as many
    multiply-adds as the other kernels' (kernels.shared_units: small-M layers are memory bound
    and want every thread, and a tile group's setup is small next to its K loop); an eighth for
    a GEMM that streams its weights once per run (``stream``: a batch-1 fully connected
    layer), which memory bounds: threads fetching their parts side by side (EfficientNet-B0's
    squeeze-excitation layers and classifier at 2 threads: 0.40-0.42 -> 0.31-0.32 ms a run)."""
    c = k.gemm
    if isinstance(c, (depthwise.Direct, groupwise.Grouped)):
        return depthwise.workgroups(k, out)
    m = ex.product([out.sizes[d] for d in c.m])
    bsz = ex.product([out.sizes[d] for d in c.batch])
    groups = ex.ceildiv(ex.ceildiv(m, ex.const(c.mr)), ex.const(c.group))
    units = ex.simplify_size(bsz * c.ntiles * groups)
    work = ex.simplify_size(bsz * m * c.n_size * c.k_size)
    return shared_units(units, work, WORK_PER_WORKGROUP // (8 if c.stream else 1))
