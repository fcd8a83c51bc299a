"""Contractions (convolutions, matmuls, einsums) as packed, register-blocked GEMM kernels.

A kernel is a *contraction* when it sums, in f32, the product of two reads whose indices are
affine in the loop vars. Its output dims then fall into three spaces: ``N`` (dims only B
reads), ``M`` (dims only A reads) and ``batch`` (dims both read, walked outside); the
reduction dims are ``K``. The kernel becomes one GEMM per batch point: an ``M x K`` operand A
read in place (through affine offsets ``base(m) + off(k)``), times B, read one of three ways:

* ``const``: B is a graph constant of constant extents, packed at build time at
  ``[batch][N blocks][K][PACK]``, zero-padded along N;
* ``direct``: B's N dims (flattened) lie at unit stride in B's memory, so its PACK-column
  blocks are loaded in place (attention's P.V reads V so); a ragged last block loads under
  a mask where the target has cheap masked loads. An NCHW 1x1 convolution takes this form
  with the weights as A and the input as B (``_swapped``), so the epilogue stores along the
  output's unit-stride dim;
* ``pack``: anything else read at run time (attention's Q.K^T, symbolic sizes) is first
  copied by a map kernel into an arena buffer in the packed layout (``_pack_kernel``).

Which operand is B, when neither is a build-time constant, is chosen by ``_runtime``. Sizes
may be symbolic except those of a build-time pack. A contraction with too few columns for
a GEMM (a depthwise convolution) may still run as a row-vectorized direct kernel
(depthwise.py; ``apply`` tries it, ``emit_gemm`` and ``workgroups`` dispatch to it).

``PACK`` is 16 lanes for every target, so that all cpu artifacts of a model share one weights
archive (the packager stores equal archives once); a target with narrower vectors loads a
block in several vectors, a wider one (AVX-512) takes several blocks per tile.

A guarded read of A (convolution padding) is not checked in the inner loop: a map kernel first
copies A into an arena buffer with a zero halo covering every index the contraction reads, and
the contraction reads that buffer unguarded at shifted indices.

The micro-kernel keeps an ``MR x (TB*PACK)`` tile of outputs in vector registers (the target's
register budget decides MR and TB), and per step of the K loop loads the tile's B vectors once,
broadcasts MR scalars of A and does MR*TB*PACK/VL fused multiply-adds. Rows past the end of M
read a clamped row and are not stored; columns past N read the zero padding and are not
stored. After the K loop the tile goes to a stack buffer and a loop over its valid rows and
columns applies the kernel's epilogue (``_Expr``, with the output dims bound) and stores.

Workgroup units are tiles ordered (batch, N tile, M tile) with the M tile fastest, so a
workgroup's contiguous range of units reuses one packed B panel from cache.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu import depthwise, mathlib
from mlpack.codegen.targets.cpu.kernels import (
    MAX_WORKGROUPS,
    WORK_PER_WORKGROUP,
    Buffer,
    Kernel,
    _coeff,
    _is_one,
    schedule,
)
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.cpu.lower import delinearize
from mlpack.codegen.targets.cpu.plan import exact_bytes
from mlpack.codegen.targets.cpu.target import CpuTarget

PACK = 16                    # f32 lanes per packed column block, the same for every target
MIN_N = 8                    # fewer columns than this waste most of a block: leave the kernel
MIN_M = 4                    # a run-time B needs rows enough to repay its pack (or strided loads)
# workgroups as for the other kernels (kernels.py): small-M layers are memory bound and want
# every thread, and a tile group's setup is small next to its K loop
GEMM_WORK_PER_WORKGROUP = WORK_PER_WORKGROUP
GEMM_MAX_WORKGROUPS = MAX_WORKGROUPS
MAX_MR = 12                  # rows per tile: each row keeps an A pointer in a general register
L1_PANEL_BYTES = 24 << 10    # a K chunk's slice of the packed B panel stays in L1
GROUP_ROWS = 48              # rows of M (over several tiles) that share one K chunk
MAX_GROUP_ROWS = 96          # ... or all of M, up to this many rows
CACHE_REUSE_BYTES = 1 << 20  # an operand this small stays in L2 while the other streams
LINE_BYTES = 64              # a cache line
SWAP_MIN_N = 256             # pixels an NCHW 1x1 convolution needs to read x in place as B
PACK_MIN_M = 128             # rows a run-time pack of B must feed to repay its copy
PREFETCH_ROWS = 16           # K steps ahead a streamed B panel is fetched (8 to 32 measured
                             # alike on alexnet; a non-temporal fetch was 45% slower)


@dataclass
class Contraction:
    """How a kernel runs as a GEMM (Kernel.gemm when Kernel.strategy == "gemm")."""
    a: Expr                   # the read of A (unguarded), over batch, M and K vars
    packed: str               # B: packed weights, a run-time packed buffer, or (direct) B itself
    data: np.ndarray | None   # build-time packed data [batch points, N blocks, K, PACK], or None
    batch: list[str]          # output dims walked outside the GEMM
    m: list[str]              # output dims flattened into GEMM rows (output layout order)
    n: list[str]              # output dims flattened into GEMM columns (output layout order)
    k: list[str]              # reduction dims (loop order)
    n_size: Expr              # sizes, symbolic where B is read at run time
    k_size: Expr
    blocks: Expr              # N blocks of PACK columns
    vl: int                   # f32 lanes per vector register
    tb: int                   # blocks per tile
    mr: int                   # rows per tile
    fma: bool
    group: int = 1            # M tiles per workgroup unit (they share each K chunk)
    kc: int = 1               # K chunk, in steps of the outermost K dim
    b_direct: Expr | None = None   # B read in place: N dims flattened at unit stride
    b_masked: bool = False    # in place with a ragged N: the last columns load under a mask
    n_inner: bool = False     # units walk N tiles fastest (A stays cached, B is re-read)
    amx: bool = False         # bf16x6 tile products (amx.py): mr, group, tb as its blocks
    k_steps: int = 0          # AMX: K in steps of 32, zero-padded
    run_dims: int = 0         # AMX: the innermost K dims, A's unit-stride run
    run_group: int = 1        # AMX: runs per vector of A (amx.k_order)

    @property
    def ntiles(self) -> Expr:
        return ex.ceildiv(self.blocks, ex.const(self.tb))


# ---------------------------------------------------------------- classification


def _affine(ix: Expr, loop: set[str]) -> tuple[dict[str, int], Expr] | None:
    """(coefficient per loop var, constant part) of an index affine in the loop vars."""
    if any(n.op == "read" for n in ex.walk(ix)):
        return None
    coeffs = {}
    for v in ex.free_vars(ix):
        if v not in loop:
            return None
        c = _coeff(ix, v)
        if not isinstance(c, int):
            return None
        if c:
            coeffs[v] = c
    c0 = ex.simplify_size(ex.substitute(ix, {v: ex.const(0) for v in ex.free_vars(ix)}))
    if ex.free_vars(c0):
        return None
    return coeffs, c0


def _tile_shape(t: CpuTarget, blocks: int) -> tuple[int, int, int]:
    """(vl, tb, mr): vector lanes, PACK blocks per tile and rows per tile for ``t``."""
    vl = max(4, t.vector_bits // 32)
    per_block = PACK // vl

    def shape(tb):
        # accumulators, plus the step's B vectors and two for broadcasts, fit the registers
        nv = tb * per_block
        mr = max(1, min(MAX_MR, (t.vector_registers - nv - 2) // nv))
        fill = blocks / (-(-blocks // tb) * tb)        # padding columns are wasted work
        return fill * (mr * nv) / (mr + nv), mr        # FMAs per load, times that
    tbs = [tb for tb in range(1, 5) if tb * per_block * 2 + 2 <= t.vector_registers]
    tb = max(tbs or [1], key=lambda x: shape(x)[0])
    mr = shape(tb)[1]
    return vl, tb, mr


def _extent(v: str, out: Buffer, rdims: dict[str, Expr]) -> Expr:
    return rdims[v] if v in rdims else out.sizes[v]


def _split(k: Kernel, out: Buffer, ra: Expr, rb: Expr) -> dict | None:
    """The GEMM spaces of ``k`` with ``ra`` as A and ``rb`` as B, or None."""
    if ra.arg[0] == k.out or rb.arg[0] == k.out:
        return None
    loop = set(out.layout) | set(k.rdims)
    aff_a, aff_b = {}, {}
    for read, aff in ((ra, aff_a), (rb, aff_b)):
        for d, ix in zip(read.arg[1], read.args):
            hit = _affine(ix, loop)
            if hit is None:
                return None
            aff[d] = hit
    uses_a = {v for c, _ in aff_a.values() for v in c}
    uses_b = {v for c, _ in aff_b.values() for v in c}
    batch, m, n = [], [], []
    for d in out.layout:
        if _is_one(out.sizes[d]):
            continue
        if d in uses_a and d in uses_b:
            batch.append(d)
        elif d in uses_a:
            m.append(d)
        elif d in uses_b:
            n.append(d)
        else:
            return None   # a broadcast output dim: the product would be recomputed per point
    kdims = [r for r, s in k.rdims.items() if not _is_one(s)]
    if kdims and all(k.rdims[r].is_const for r in kdims):
        # the longest K dim outermost: K is chunked along it, and the short ones (a
        # convolution's window) unroll inside
        big = max(kdims, key=lambda r: k.rdims[r].value)
        kdims = [big] + [r for r in kdims if r != big]
    return {"a": ra, "b": rb, "aff_a": aff_a, "aff_b": aff_b, "batch": batch, "m": m, "n": n,
            "k": kdims, "n_size": ex.product([out.sizes[d] for d in n]),
            "k_size": ex.product([k.rdims[r] for r in kdims]),
            "m_size": ex.product([out.sizes[d] for d in m]),
            "n_sizes": {d: out.sizes[d] for d in n}}


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
    if k.reduce != "sum" or k.acc_dtype != "f32" or k.strategy == "gemm":
        return None
    body = k.body
    if body.op != "mul" or any(a.op != "read" or a.dtype != "f32" for a in body.args):
        return None
    r1, r2 = body.args
    out = bufs[k.out]
    for ra, rb in ((r1, r2), (r2, r1)):
        if not (rb.arg[0] in g.constants and rb.arg[2] is None):
            continue
        info = _split(k, out, ra, rb)
        if info is None or any(not c0.is_const for _, c0 in info["aff_b"].values()):
            break
        if any(not _extent(v, out, k.rdims).is_const
               for v in info["batch"] + info["n"] + info["k"]):
            break   # symbolic: B is packed at run time instead
        if info["n_size"].value < MIN_N or info["k_size"].value < 1:
            return None
        info["mode"] = "const"
        return _swapped(k, out, info, bufs, t) or info
    return _runtime(k, out, r1, r2, bufs, t)


def _masks(t: CpuTarget | None) -> bool:
    """Whether masked vector loads are cheap (AVX2 and up; SSE would scalarize them)."""
    return t is not None and t.vector_bits >= 256


def read_step(aff: dict, buf: Buffer, v: str, layout=None) -> Expr:
    """How many elements a read of ``buf`` moves in memory when loop var ``v`` steps by one:
    ``aff`` is the read's affine form per dim (``_affine``), ``layout`` the buffer's dims in
    memory order (its own by default)."""
    step, stride = ex.const(0), ex.const(1)
    for d in reversed(layout or buf.layout):
        c = aff[d][0].get(v)
        if c:
            step = ex.simplify_size(step + ex.const(c) * stride)
        stride = ex.simplify_size(stride * buf.sizes[d])
    return step


def _b_step(info: dict, bufs, v: str) -> Expr:
    """How many elements B's read moves in memory when loop var ``v`` steps by one."""
    return read_step(info["aff_b"], bufs[info["b"].arg[0]], v)


def _in_place_mode(info: dict, bufs) -> str:
    """How to read a B that could be read in place: ``direct``, unless a step of K moves B by
    a whole number of floats that is no multiple of a cache line (an NCHW 1x1 convolution on
    55x55) and M has rows enough to repay a pack: every vector load of B would then
    straddle two lines, and a packed copy is aligned."""
    ms = info["m_size"]
    if not (ms.is_const and ms.value >= PACK_MIN_M):
        return "direct"
    for v in info["k"]:
        step = _b_step(info, bufs, v)
        if step.is_const and (step.value * 4) % LINE_BYTES:
            return "pack"
    return "direct"


def _swapped(k: Kernel, out: Buffer, info: dict, bufs, t) -> dict | None:
    """The constant as A and the other operand read in place as B, when that stores the output
    along its unit-stride dim and the packed view would not: an NCHW 1x1 convolution is then
    W[co, ci] times x[ci, h*w], B's columns contiguous (as MLAS does it), instead of a GEMM
    over rows of strided A broadcasts whose epilogue stores across channels."""
    inner = out.contiguous_dim()
    if inner in info["n"]:
        return None
    alt = _split(k, out, info["b"], info["a"])
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
        info = _split(k, out, ra, rb)
        if info is None or not info["k"]:
            continue
        ns, ms = info["n_size"], info["m_size"]
        if (ns.is_const and ns.value < MIN_N) or (ms.is_const and ms.value < MIN_M):
            continue
        in_place = _direct(info, bufs, _masks(t))
        info["mode"] = _in_place_mode(info, bufs) if in_place else "pack"
        # readable in place beats a pack; then output columns at unit stride (the epilogue's
        # stores); then the wider N (symbolic counts as wide)
        score = (in_place, out.contiguous_dim() in info["n"],
                 ns.value if ns.is_const else 1 << 30)
        if key is None or score > key:
            best, key = info, score
    return best


# ---------------------------------------------------------------- A: the zero-halo copy


def index_range(coeffs: dict[str, int], c0: Expr, extent) -> tuple[Expr, Expr]:
    """The least and greatest value of ``c0 + sum(c * v)`` (``_affine``'s form), each var
    ``v`` over ``[0, extent(v))``."""
    lo, hi = c0, c0
    for v, c in coeffs.items():
        span = ex.const(c) * (extent(v) - 1)
        if c < 0:
            lo = lo + span
        else:
            hi = hi + span
    return ex.simplify_size(lo), ex.simplify_size(hi)


def _unguard(k: Kernel, info: dict, bufs: dict[str, Buffer], name: str, layout=None):
    """(A read without guards, pad kernel or None); None when the index range is unknown.
    ``layout``: the copy's dims in memory order (amx.a_layout), which makes a copy even of an
    A that needs no padding."""
    ra = info["a"]
    src = bufs[ra.arg[0]]
    relaid = layout is not None and tuple(layout) != tuple(src.layout)
    if ra.arg[2] is None and not relaid:
        return ra, None
    out = bufs[k.out]
    index = dict(zip(ra.arg[1], ra.args))
    sizes, shift, inside = {}, {}, True
    for d in src.layout:
        lo, hi = index_range(*info["aff_a"][d], lambda v: _extent(v, out, k.rdims))
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
    pbuf = Buffer(name, tuple(layout or src.layout), sizes, src.dtype)
    bufs[name] = pbuf
    body = ex.read(src.name, {d: ex.var(d) + shift[d] if shift[d] else ex.var(d)
                              for d in src.layout}, src.dtype, ra.arg[2])
    pk = Kernel(f"{k.name}_pad", name, body, None, {}, src.dtype, reads=[src.name],
                fused=list(k.fused))
    schedule(pk, pbuf, bufs)
    return ex.read(name, unguarded, ra.dtype), pk


# ---------------------------------------------------------------- B: packing


def pack_b(data: np.ndarray, layout, rb: Expr, aff_b: dict, dims: list[str],
           extents: dict[str, int], n_dims: list[str], k_dims: list[str]) -> np.ndarray:
    """B evaluated at every (batch, n, k) point, as [batch, N blocks, K, PACK] (N zero-padded)."""
    perm = _permutation(data, layout, aff_b, dims, extents)
    if perm is not None:   # B's dims are the loop vars themselves: a transpose, no gather
        kept = [s for s in data.shape if s != 1]
        return _blocked(np.transpose(data.reshape(kept), perm).astype(np.float32), dims,
                        extents, n_dims, k_dims)
    flat = np.zeros([extents[v] for v in dims], dtype=np.int64)
    strides = np.cumprod([1, *data.shape[::-1]])[:-1][::-1]
    grids = {v: np.arange(extents[v], dtype=np.int64).reshape(
        [-1 if i == j else 1 for j in range(len(dims))]) for i, v in enumerate(dims)}
    for axis, d in enumerate(layout):
        coeffs, c0 = aff_b[d]
        ix = np.full([1] * len(dims), c0.value, dtype=np.int64)
        for v, c in coeffs.items():
            if v in grids:   # (a dim of size 1 is at 0)
                ix = ix + c * grids[v]
        if ix.size and (ix.min() < 0 or ix.max() >= data.shape[axis]):   # (affine: never data)
            raise UnsupportedTargetError(f"cpu: packing B: dim {d} read at {int(ix.min())}.."
                                         f"{int(ix.max())}, outside its size {data.shape[axis]}")
        flat = flat + ix * int(strides[axis])
    return _blocked(data.reshape(-1)[flat].astype(np.float32), dims, extents, n_dims, k_dims)


def _permutation(data, layout, aff_b: dict, dims: list[str], extents: dict[str, int]):
    """The axes of ``data`` (its size-1 axes left out) in ``dims`` order when each of B's dims
    is indexed by one of the loop vars ``dims`` over its whole extent (a weight read as it
    lies), else None."""
    axis_of, kept = {}, 0
    for axis, d in enumerate(layout):
        coeffs, c0 = aff_b[d]
        if not (c0.is_const and c0.value == 0):
            return None
        if data.shape[axis] == 1 and not any(v in extents for v in coeffs):
            continue   # a size-1 axis read at 0 (a 1x1 kernel's window)
        if len(coeffs) != 1 or data.shape[axis] == 1:
            return None
        (v, c), = coeffs.items()
        if c != 1 or v not in extents or v in axis_of or extents[v] != data.shape[axis]:
            return None
        axis_of[v] = kept
        kept += 1
    if sorted(axis_of) != sorted(dims):
        return None
    return [axis_of[v] for v in dims]


def _blocked(vals: np.ndarray, dims, extents, n_dims, k_dims) -> np.ndarray:
    """B's values at the (batch, n, k) points as [batch, N blocks, K, PACK], N zero-padded."""
    nb = len(dims) - len(n_dims) - len(k_dims)
    bsz = int(np.prod([extents[v] for v in dims[:nb]], dtype=np.int64))
    nsz = int(np.prod([extents[v] for v in n_dims], dtype=np.int64))
    ksz = int(np.prod([extents[v] for v in k_dims], dtype=np.int64))
    vals = vals.reshape(bsz, nsz, ksz)
    blocks = -(-nsz // PACK)
    padded = np.zeros((bsz, blocks * PACK, ksz), dtype=np.float32)
    padded[:, :nsz] = vals
    return np.ascontiguousarray(padded.reshape(bsz, blocks, PACK, ksz).transpose(0, 1, 3, 2))


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


def _pack_kernel(k: Kernel, info: dict, bufs: dict[str, Buffer], name: str) -> Kernel:
    """A map kernel writing B, as the GEMM reads it, into the arena buffer ``name``: layout
    (batch dims, N block, K dims, lane), the N columns past the end zero."""
    rb, out = info["b"], bufs[k.out]
    nb, lane = "pack.nb", "pack.l"
    sizes = {d: out.sizes[d] for d in info["batch"]}
    sizes[nb] = ex.ceildiv(info["n_size"], ex.const(PACK))
    sizes.update({r: k.rdims[r] for r in info["k"]})
    sizes[lane] = ex.const(PACK)
    layout = (*info["batch"], nb, *info["k"], lane)
    buf = Buffer(name, layout, {d: ex.simplify_size(sizes[d]) for d in layout}, "f32")
    bufs[name] = buf
    col = ex.var(nb) * PACK + ex.var(lane)
    env = {d: ex.var(d) for d in (*info["batch"], *info["k"])}
    flat = col
    for d in reversed(info["n"]):   # the flat column over the N dims (last fastest)
        size = out.sizes[d]
        env[d] = flat if d == info["n"][0] else ex.mod(flat, size)
        flat = ex.floordiv(flat, size)
    index = {}
    for d, ix in zip(rb.arg[1], rb.args):
        index[d] = ex.substitute(ix, {v: env.get(v, ex.const(0)) for v in ex.free_vars(ix)})
    # guarded, so a padding column (or the read's own padding) loads nothing out of bounds
    pad = 0.0 if rb.arg[2] is None else rb.arg[2]
    read = ex.read(rb.arg[0], index, "f32", pad)
    body = ex.select(ex.binary("lt", col, info["n_size"]), read, ex.const(0.0, "f32"))
    pk = Kernel(f"{k.name}_packb", name, body, None, {}, "f32", reads=[rb.arg[0]],
                fused=list(k.fused))
    schedule(pk, buf, bufs)
    return pk


def _k_chunk(t_tb: int, info: dict, rdims: dict) -> int:
    """Steps of the outermost K dim per chunk: a chunk's slice of the B panel fits L1."""
    steps = max(1, L1_PANEL_BYTES // (t_tb * PACK * 4))
    inner = ex.product([rdims[r] for r in info["k"][1:]])
    if not inner.is_const:
        return 1
    return max(1, steps // max(1, inner.value))


def apply(g, kernels: list[Kernel], bufs: dict[str, Buffer], t: CpuTarget,
          source=None) -> list[Kernel]:
    """``kernels`` with every contraction turned into a GEMM kernel (after its pad copy and,
    for a B packed at run time, its pack kernel). ``source``: the graph ``g`` was rewritten
    from for this target (concat.py, winograd.py), which every target of a build shares: the
    packed weights are cached on it."""
    out: list[Kernel] = []
    packs: dict = {}
    cache = _pack_cache(g if source is None else source)
    for k in kernels:
        info = classify(k, g, bufs, t)
        if info is None:
            depthwise.apply(k, bufs, t)   # a narrow contraction may still vectorize by rows
            out.append(k)
            continue
        ob = bufs[k.out]
        tiles = None
        if t.amx and info["mode"] == "const":   # (then every K extent is a constant)
            tiles = amx.plan(info, bufs, {v: _extent(v, ob, k.rdims).value for v in info["k"]},
                             ob.contiguous_dim())
        hit = _unguard(k, info, bufs, f"{k.out}#a", tiles and tiles[0])
        if hit is None:
            out.append(k)
            continue
        ra, pad = hit
        rb = info["b"]
        pre = [] if pad is None else [pad]
        if tiles is not None and _amx_gemm(k, info, ra, g, bufs, packs, cache):
            k.reads = _gemm_reads(k, ra, k.gemm.packed)
            out.extend(pre)
            out.append(k)
            continue
        direct = None
        if info["mode"] == "const":
            const = g.constants[rb.arg[0]]
            dims = info["batch"] + info["n"] + info["k"]
            extents = {v: _extent(v, ob, k.rdims).value for v in dims}
            key = (rb.arg[0], rb, tuple(dims), tuple(extents.items()), tuple(info["n"]))
            name, data = _weights_pack(
                key, f"{rb.arg[0]}#pack{len(packs)}" if packs else f"{rb.arg[0]}#pack",
                ("b", "nb", "k", "l"), "f32", lambda: pack_b(
                    const.data, const.layout, rb, info["aff_b"], dims, extents, info["n"],
                    info["k"]), bufs, packs, cache)
        elif info["mode"] == "pack":
            data = None
            name = _fresh(f"{k.out}#b", bufs)
            pre.append(_pack_kernel(k, info, bufs, name))
        else:
            data, name, direct = None, rb.arg[0], rb
        blocks = ex.simplify_size(ex.ceildiv(info["n_size"], ex.const(PACK)))
        vl, tb, mr = _tile_shape(t, blocks.value if blocks.is_const else 64)
        k.gemm = Contraction(ra, name, data, info["batch"], info["m"], info["n"], info["k"],
                             info["n_size"], info["k_size"], blocks, vl, tb, mr,
                             t.fma, _group(info["m_size"], mr), _k_chunk(tb, info, k.rdims),
                             direct, direct is not None and info["n_size"].value % PACK != 0,
                             _n_inner(bufs[ra.arg[0]], bufs[name]))
        k.strategy = "gemm"
        k.reads = _gemm_reads(k, ra, name)
        out.extend(pre)
        out.append(k)
    return out


def _amx_gemm(k: Kernel, info: dict, ra: Expr, g, bufs: dict[str, Buffer], packs: dict,
              cache: dict) -> bool:
    """Make ``k`` an AMX gemm (amx.py) reading A through ``ra``: B split and packed as tiles
    (once per graph), K in A's stride order. False when A's K cannot be read in whole vectors."""
    ob, rb = bufs[k.out], info["b"]
    extents = {v: _extent(v, ob, k.rdims).value for v in info["batch"] + info["n"] + info["k"]}
    found = amx.k_order(ra, bufs[ra.arg[0]], info["k"], extents)
    if found is None:
        return False
    order, run, group = found
    dims = info["batch"] + info["n"] + order
    key = ("amx", rb.arg[0], rb, tuple(dims), tuple(extents.items()), tuple(info["n"]))
    const = g.constants[rb.arg[0]]
    name, data = _weights_pack(
        key, f"{rb.arg[0]}#amx", ("b", "nb", "ks", "part", "pair", "l", "e"), "u16",
        lambda: amx.pack_b(pack_b(const.data, const.layout, rb, info["aff_b"], dims, extents,
                                  info["n"], order)), bufs, packs, cache)
    blocks = data.shape[1]
    tb = min(amx.MAX_N // PACK, -(-blocks // 2) * 2)
    others = ex.const(data.shape[0] * -(-blocks // tb))
    nblk = amx.unit_blocks(data.shape[2], tb, info["m_size"], others)
    k.gemm = Contraction(ra, name, data, info["batch"], info["m"], info["n"], order,
                         info["n_size"], info["k_size"], ex.const(blocks), amx.RUN, tb,
                         amx.TILE_ROWS, True, 2 * nblk, 1, amx=True, k_steps=data.shape[2],
                         run_dims=run, run_group=group)
    k.strategy = "gemm"
    return True


def _weights_pack(key: tuple, stem: str, axes: tuple[str, ...], dtype: str, make,
                  bufs: dict[str, Buffer], packs: dict, cache: dict) -> tuple[str, np.ndarray]:
    """(buffer name, data) of constant weights packed at build time: ``make()``d once per
    graph (``cache``, which every target of a build shares) and declared once per kernel list
    (``packs``), as a buffer named after ``stem`` with ``axes``."""
    if key not in packs:
        if key not in cache:
            cache[key] = make()
        data = cache[key]
        name = _fresh(stem, bufs)
        bufs[name] = Buffer(name, axes, {d: ex.const(n) for d, n in zip(axes, data.shape)},
                            dtype)
        packs[key] = (name, data)
    return packs[key]


def _group(m_size: Expr, mr: int) -> int:
    """M tiles per workgroup unit (they share each K chunk of the B panel from L1): about
    GROUP_ROWS rows, or all of M when it is at most MAX_GROUP_ROWS rows. A late convolution's
    7x7 = 49 rows would otherwise be 48 + 1, and the 1-row group would stream the whole panel
    again (resnet50's 3x3 512-channel convolution on 7x7: 0.87 -> 0.95 of ONNX Runtime)."""
    tiles = max(1, GROUP_ROWS // mr)
    if m_size.is_const and m_size.value <= MAX_GROUP_ROWS:
        tiles = max(tiles, -(-m_size.value // mr))
    return tiles


def _n_inner(a: Buffer, b: Buffer) -> bool:
    """Whether the units should walk N tiles fastest: each M group's rows of A then stay in
    cache while every N tile uses them, and B is read once per M group. Worth it when A is
    too big to stay in the core's cache over a sweep of M (M fastest re-reads all of A per
    N tile) but B is small enough to."""
    sa, sb = exact_bytes(a), exact_bytes(b)
    return sa.is_const and sb.is_const and sa.value > CACHE_REUSE_BYTES >= sb.value


def _gemm_reads(k: Kernel, ra: Expr, b_name: str) -> list[str]:
    """What a gemm kernel reads: A, B (packed or in place) and its epilogue's other tensors."""
    epi = [] if k.epilogue is None else _reads(k.epilogue)
    return list(dict.fromkeys([ra.arg[0], b_name, *[r for r in epi if r != k.out]]))


def _reads(e: Expr) -> list[str]:
    return list(dict.fromkeys(n.arg[0] for n in ex.walk(e) if n.op == "read"))


def _fresh(name: str, bufs) -> str:
    i, base = 0, name
    while name in bufs:
        i += 1
        name = f"{base}{i}"
    return name


def packed_weights(kernels: list[Kernel]) -> dict[str, np.ndarray]:
    """The packed B tensors the kernels read, by name (for the plan's weights)."""
    return {k.gemm.packed: k.gemm.data for k in kernels
            if getattr(k, "gemm", None) is not None and getattr(k.gemm, "data", None) is not None}


def workgroups(k: Kernel, out: Buffer) -> Expr:
    """The dispatch's workgroup count: tiles shared out in chunks of about
    GEMM_WORK_PER_WORKGROUP multiply-adds, at most GEMM_MAX_WORKGROUPS."""
    c = k.gemm
    if isinstance(c, depthwise.Direct):
        return depthwise.workgroups(k, out)
    m = ex.product([out.sizes[d] for d in c.m])
    bsz = ex.product([out.sizes[d] for d in c.batch])
    groups = ex.ceildiv(ex.ceildiv(m, ex.const(c.mr)), ex.const(c.group))
    units = ex.simplify_size(bsz * c.ntiles * groups)
    work = ex.simplify_size(bsz * m * c.n_size * c.k_size)
    per = ex.binary("max", ex.const(1), ex.binary(
        "min", ex.const(GEMM_MAX_WORKGROUPS), ex.floordiv(work, ex.const(GEMM_WORK_PER_WORKGROUP))))
    return ex.binary("min", units, per)


# ---------------------------------------------------------------- lowering


I64 = ir.IntType(64)
F32 = ir.FloatType()
I32 = ir.IntType(32)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


class _Gemm:
    """Emits a gemm kernel's body into a KernelLowering whose entry block is current."""

    def __init__(self, L, wg, count):
        self.L, self.b, self.E = L, L.b, L.E
        self.c: Contraction = L.k.gemm
        self.wg, self.count = wg, count
        self.vty = ir.VectorType(F32, self.c.vl)

    # small integer helpers (operands i64)
    def add(self, x, y):
        if isinstance(y, ir.Constant) and y.constant == 0:
            return x
        if isinstance(x, ir.Constant) and x.constant == 0:
            return y
        return self.b.add(x, y, flags=("nsw",))

    def mul(self, x, y):
        if isinstance(y, ir.Constant) and y.constant == 1:
            return x
        if isinstance(x, ir.Constant) and x.constant == 1:
            return y
        return self.b.mul(x, y, flags=("nsw",))

    def umin(self, x, y):
        return self.b.select(self.b.icmp_unsigned("<", x, y), x, y)

    def _share(self, units):
        """This workgroup's [start, end) of ``units`` (the count shared out evenly)."""
        b = self.b
        w64, c64 = b.zext(self.wg, I64), b.zext(self.count, I64)
        return b.udiv(b.mul(units, w64), c64), b.udiv(b.mul(units, b.add(w64, _c(1))), c64)

    def _unit(self, u, mgroups, ntiles, c0, S, n_inner: bool = False):
        """(M group, N tile, batch point, A's offset there) of unit ``u``, the M groups walked
        fastest (or the N tiles, ``n_inner``); binds the batch dims."""
        b, c, E = self.b, self.c, self.E
        if n_inner:
            nt, rest = b.urem(u, ntiles), b.udiv(u, ntiles)
            mg, bi = b.urem(rest, mgroups), b.udiv(rest, mgroups)
        else:
            mg, rest = b.urem(u, mgroups), b.udiv(u, mgroups)
            nt, bi = b.urem(rest, ntiles), b.udiv(rest, ntiles)
        self.L._delinearize(bi, c.batch)
        base = c0
        for d in c.batch:
            if d in S:
                base = self.add(base, self.mul(S[d], E.lookup(d)))
        return mg, nt, bi, base

    def _row_offset(self, base, m, S, osz):
        """A's offset at flat row ``m`` (over the M dims) from ``base``, its batch point's."""
        off = base
        for d, v in delinearize(self.b, m, self.c.m, osz).items():
            if d in S:
                off = self.add(off, self.mul(S[d], v))
        return off

    def _size(self, dims, osz):
        """The product of the output's sizes along ``dims`` (i64)."""
        n = _c(1)
        for d in dims:
            n = self.mul(n, osz[d])
        return n

    def _offsets(self, read: Expr):
        """(constant part, {loop var: stride}) of ``read``'s flat element offset:
        c0 + sum_v S_v * v, with S_v = sum_d stride_d * coeff(ix_d, v)."""
        L, E = self.L, self.E
        name = read.arg[0]
        index = dict(zip(read.arg[1], read.args))
        loop = set(L.out.layout) | set(L.k.rdims)
        S: dict[str, ir.Value] = {}
        c0 = _c(0)
        for d, stride in zip(L.buffers[name].layout, E.strides[name]):
            coeffs, k0 = _affine(index[d], loop)
            if not (k0.is_const and k0.value == 0):
                c0 = self.add(c0, self.mul(E._cast(E(k0), k0.dtype, "i64"), stride))
            for v, cf in coeffs.items():
                S[v] = self.add(S.get(v, _c(0)), self.mul(_c(cf), stride))
        return c0, S

    def emit(self) -> None:
        L, b, E, c = self.L, self.b, self.E, self.c
        osz = E.sizes[L.out.name]
        a_name = c.a.arg[0]
        c0, S = self._offsets(c.a)
        # B read in place: its offset is c0_b + sum S_b[v] * v (S_b[n] == 1); packed: panels
        self.SB = None
        if c.b_direct is not None:
            cb0, self.SB = self._offsets(c.b_direct)
        n_size, k_size, blocks = E(c.n_size), E(c.k_size), E(c.blocks)
        self.n_size = n_size
        self.kext = {r: E(L.k.rdims[r]) for r in c.k}
        ntiles = b.udiv(self.add(blocks, _c(c.tb - 1)), _c(c.tb))
        zero_vec = ir.Constant(self.vty, [0.0] * c.vl)
        per_block = PACK // c.vl
        nv = c.tb * per_block
        accs = [b.alloca(self.vty, name=f"acc{i}") for i in range(c.mr * nv)]
        tile_n = c.tb * PACK
        # the group's outputs between K chunks (and for the epilogue): [G][MR][tile_n]
        cbuf = b.alloca(ir.ArrayType(F32, c.group * c.mr * tile_n), name="cbuf")
        m_size = self._size(c.m, osz)
        # one M group: each B panel is read once per run, from memory (a fully connected
        # layer at batch 1, a late convolution's 7x7 image): the hardware prefetcher alone
        # leaves the loads waiting (alexnet's fc6 15.4 -> 13.8 ms with it)
        rows = ex.product([L.out.sizes[d] for d in c.m])
        self.stream_b = self.SB is None and rows.is_const and rows.value <= c.group * c.mr
        mtiles = b.udiv(self.add(m_size, _c(c.mr - 1)), _c(c.mr))
        mgroups = b.udiv(self.add(mtiles, _c(c.group - 1)), _c(c.group))
        start, end = self._share(self.mul(self.mul(self._size(c.batch, osz), ntiles), mgroups))
        packed = L.E.bases[c.packed]
        A = L.E.bases[a_name]
        last = b.sub(m_size, _c(1))
        k0 = self.kext[c.k[0]]
        nchunks = b.udiv(self.add(k0, _c(c.kc - 1)), _c(c.kc))
        panel_size = self.mul(k_size, _c(PACK))

        def cvec(g, r, q):
            p = b.gep(cbuf, [_c(0), self.add(b.mul(g, _c(c.mr * tile_n)), _c(r * tile_n + q * c.vl))],
                      inbounds=True)
            return b.bitcast(p, self.vty.as_pointer())

        with L.loops.loop(start, end, "unit") as u, E.scope():
            mg, nt, bi, base = self._unit(u, mgroups, ntiles, c0, S, c.n_inner)
            t0 = b.mul(mg, _c(c.group))
            ng = self.umin(_c(c.group), b.sub(mtiles, t0))
            blk0 = b.mul(nt, _c(c.tb))
            last_blk = b.sub(blocks, _c(1))
            panels = []
            if self.SB is not None:
                bbase = cb0
                for d in c.batch:
                    if d in self.SB:
                        bbase = self.add(bbase, self.mul(self.SB[d], E.lookup(d)))
            self.bmasks = None
            if c.b_masked:   # columns past N: masked off (their memory may be past B's end)
                ity = ir.VectorType(I64, c.vl)
                und = ir.Constant(ity, ir.Undefined)
                nsplat = b.shuffle_vector(b.insert_element(und, n_size, ir.Constant(ir.IntType(32), 0)),
                                          und, ir.Constant(ir.VectorType(ir.IntType(32), c.vl), [0] * c.vl))
                col0 = b.mul(blk0, _c(PACK))
                csplat = b.shuffle_vector(b.insert_element(und, col0, ir.Constant(ir.IntType(32), 0)),
                                          und, ir.Constant(ir.VectorType(ir.IntType(32), c.vl), [0] * c.vl))
                self.bmasks = [b.icmp_signed("<", b.add(csplat, ir.Constant(
                    ity, [q * c.vl + i for i in range(c.vl)])), nsplat) for q in range(nv)]
            for j in range(c.tb):
                blk = self.umin(self.add(blk0, _c(j)), last_blk)
                if self.SB is not None:   # (blocks past the end repeat the last, not stored)
                    at = self.add(bbase, b.mul(blk, _c(PACK)))
                else:
                    at = b.mul(self.add(b.mul(bi, blocks), blk), panel_size)
                panels.append(b.gep(packed, [at], inbounds=True, source_etype=F32))
            # one K chunk (a short K, a 1x1 convolution's): each tile starts from zero in its
            # registers and goes to the buffer once, instead of through it per chunk
            single = self._single_chunk()
            if not single:
                with L.loops.loop(_c(0), ng, "zero") as g:
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(zero_vec, cvec(g, r, q), align=4)
            # K in chunks (of the outermost K dim) outside the group's tiles: the chunk of the
            # B panel and the A rows it touches stay in L1 while every tile of the group uses them
            with L.loops.loop(_c(0), nchunks, "chunk") as ch:
                lo = b.mul(ch, _c(c.kc))
                hi = self.umin(b.add(lo, _c(c.kc)), k0)
                with L.loops.loop(_c(0), ng, "mtile") as g:
                    m0 = b.mul(b.add(t0, g), _c(c.mr))
                    rows = []
                    for r in range(c.mr):
                        m = self.umin(self.add(m0, _c(r)), last)
                        rows.append(b.gep(A, [self._row_offset(base, m, S, osz)], inbounds=True,
                                          source_etype=F32))
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(zero_vec if single else b.load(cvec(g, r, q), align=4),
                                    accs[r * nv + q])
                    self._k_loop(0, _c(0), _c(0), _c(0), rows, panels, accs, S, (lo, hi))
                    for r in range(c.mr):
                        for q in range(nv):
                            b.store(b.load(accs[r * nv + q]), cvec(g, r, q), align=4)
            tile = b.gep(cbuf, [_c(0), _c(0)], inbounds=True)
            self._epilogue(tile, b.mul(t0, _c(c.mr)), m_size, nt, osz)
        b.ret_void()
        L.loops_md(L.loops.latches)

    def _single_chunk(self) -> bool:
        """Whether the outermost K dim fits one chunk, known at build time."""
        ext = self.L.k.rdims[self.c.k[0]]
        return ext.is_const and ext.value <= self.c.kc

    def _k_loop(self, depth: int, off, kflat, boff, rows, panels, accs, S, span) -> None:
        """Nested loops over the K dims (the outermost over ``span``); the innermost body is
        the micro-kernel step. ``off``: A's offset, ``kflat``: the flat K index (packed B),
        ``boff``: B's offset from the panel (B read in place)."""
        c, b, L = self.c, self.b, self.L
        if depth < len(c.k):
            r = c.k[depth]
            ext = self.kext[r]
            lo, hi = span if depth == 0 else (_c(0), ext)
            with L.loops.loop(lo, hi, f"k.{r}", unroll=False) as i:
                nb = boff
                if self.SB is not None and r in self.SB:
                    nb = self.add(boff, self.mul(self.SB[r], i))
                self._k_loop(depth + 1, self.add(off, self.mul(S[r], i)) if r in S else off,
                             self.add(self.mul(kflat, ext), i), nb, rows, panels, accs, S, span)
            return
        per_block = PACK // c.vl
        bv = []
        kp = boff if self.SB is not None else b.mul(kflat, _c(PACK))
        for j in range(c.tb):
            for q in range(per_block):
                p = b.gep(panels[j], [self.add(kp, _c(q * c.vl))], inbounds=True,
                          source_etype=F32)
                if self.bmasks is not None:
                    bv.append(self._masked_load(p, self.bmasks[j * per_block + q]))
                else:
                    bv.append(b.load(p, typ=self.vty, align=4))
        if self.stream_b:   # B is read once: fetch its panels PREFETCH_ROWS K steps ahead
            pf = mathlib.declare(b.module, "llvm.prefetch.p0", ir.FunctionType(
                ir.VoidType(), [ir.PointerType(), I32, I32, I32]))
            read, to_l1, data = ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)
            for j in range(c.tb):   # (no inbounds: the last steps' addresses pass the panel)
                ahead = b.gep(panels[j], [self.add(kp, _c(PREFETCH_ROWS * PACK))], source_etype=F32)
                b.call(pf, [ahead, read, to_l1, data])
        undef = ir.Constant(self.vty, ir.Undefined)
        mask = ir.Constant(ir.VectorType(ir.IntType(32), c.vl), [0] * c.vl)
        fma = mathlib.intrinsic(b.module, "llvm.fma", self.vty, 3) if c.fma else None
        nv = len(bv)
        for r, row in enumerate(rows):
            a = b.load(b.gep(row, [off], inbounds=True, source_etype=F32), typ=F32, align=4)
            splat = b.shuffle_vector(b.insert_element(undef, a, ir.Constant(ir.IntType(32), 0)),
                                     undef, mask)
            for q in range(nv):
                acc = accs[r * nv + q]
                cur = b.load(acc)
                if fma is not None:
                    new = b.call(fma, [splat, bv[q], cur])
                else:
                    new = b.fadd(cur, b.fmul(splat, bv[q]))
                b.store(new, acc)

    def _masked_load(self, ptr, mask):
        vty = self.vty
        fn = mathlib.masked_load(self.b.module, vty)
        return self.b.call(fn, [ptr, ir.Constant(ir.IntType(32), 4), mask,
                                ir.Constant(vty, [0.0] * self.c.vl)])

    def _epilogue(self, tile, m0, m_size, nt, osz) -> None:
        c, b, L, E = self.c, self.b, self.L, self.E
        tile_n = c.tb * PACK
        nrows = self.umin(_c(c.group * c.mr), b.sub(m_size, m0))
        n0 = b.mul(nt, _c(tile_n))
        ncols = self.umin(_c(tile_n), b.sub(self.n_size, n0))
        # the inner loop walks the output's unit-stride dim when it can (NCHW: along M)
        loops = [("row", nrows, m0, c.m), ("col", ncols, n0, c.n)]
        if L.out.contiguous_dim() in c.m:
            loops.reverse()
        idx = {}
        # the inner dims bound as one flat index when every address they reach is affine in
        # it (no division per element), so the loop vectorizes
        flat = flat_bindable(L.k.epilogue, L.out, loops[1][3], L.buffers)
        with L.loops.loop(_c(0), loops[0][1], f"e.{loops[0][0]}") as i, E.scope():
            idx[loops[0][0]] = i
            for d, v in delinearize(b, b.add(loops[0][2], i), loops[0][3], osz).items():
                E.bind(d, v)
            with L.loops.loop(_c(0), loops[1][1], f"e.{loops[1][0]}", vectorize=flat) as j, \
                    E.scope():
                idx[loops[1][0]] = j
                at = b.add(loops[1][2], j)
                if flat:
                    *outer, last = loops[1][3]
                    for d in outer:
                        E.bind(d, _c(0))
                    E.bind(last, at)
                else:
                    for d, v in delinearize(b, at, loops[1][3], osz).items():
                        E.bind(d, v)
                p = b.gep(tile, [b.add(b.mul(idx["row"], _c(tile_n)), idx["col"])], inbounds=True)
                L._store(L._finish(b.load(p, typ=F32)))


def _adjacent(buf: Buffer, bdims: list[str], sizes: list[Expr]) -> bool:
    """Whether ``buf``'s dims ``bdims`` lie next to each other in its layout, in this order
    (size-1 dims aside), each after the first of the size ``sizes`` gives it: then a flat index
    over them addresses ``buf`` as the last alone would, with the others at 0."""
    order = [d for d in buf.layout if d in bdims or not _is_one(buf.sizes[d])]
    pos = [order.index(d) for d in bdims]
    if pos != list(range(pos[0], pos[0] + len(bdims))):
        return False
    return all(ex.same_size(buf.sizes[d], s) for d, s in zip(bdims[1:], sizes[1:]))


def flat_bindable(epilogue: Expr | None, out: Buffer, dims: list[str], bufs) -> bool:
    """Whether the epilogue's inner loop over ``dims`` (flattened, last fastest) may bind them
    as one flat index: the output and every read that uses them hold them adjacent and in
    order, each indexed by the plain var (once), unguarded, and no other use of them."""
    sizes = [out.sizes[d] for d in dims]
    if not dims or not _adjacent(out, dims, sizes):
        return False
    want = set(dims)

    def ok(e: Expr) -> bool:
        if e.op == "var":
            return e.arg not in want
        if e.op != "read":
            return all(ok(a) for a in e.args)
        at = {}   # loop dim -> the buffer dim it indexes
        for d, ix in zip(e.arg[1], e.args):
            if ix.op == "var" and ix.arg in want:
                if ix.arg in at:
                    return False   # one var indexing two dims (a diagonal): not a flat walk
                at[ix.arg] = d
            elif not ok(ix):
                return False
        if not at:
            return True
        if set(at) != want or e.arg[2] is not None:
            return False
        return _adjacent(bufs[e.arg[0]], [at[v] for v in dims], sizes)
    return epilogue is None or ok(epilogue)


def emit_gemm(L, wg, count) -> None:
    """The body of a gemm kernel (called by KernelLowering._emit_impl)."""
    if isinstance(L.k.gemm, depthwise.Direct):
        depthwise.emit_direct(L, wg, count)
        return
    (amx.AmxGemm if L.k.gemm.amx else _Gemm)(L, wg, count).emit()


from mlpack.codegen.targets.cpu import amx  # noqa: E402  (amx.AmxGemm builds on _Gemm above)
