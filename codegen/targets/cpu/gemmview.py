"""The GEMM view of a kernel: which operand is A and which B, their spaces (batch, M, N, K),
and how narrow operands are read: 16-bit weights widened per vector, bf16 activations paired
(bf16dot.py), int8 contractions in quads (codegen/precisions/int8.py). contraction.py
classifies a kernel with these and schedules the GEMM.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.gemm import QUAD, bf16_dot, int8_dot
from mlpack.codegen.targets.cpu.indexing import affine, is_one, read_step
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.target import CpuTarget

MIN_N = 8                    # fewer columns than this waste most of a block: leave the kernel
# ... unless batched: a grouped convolution of 4 channels per group (ResNeXt's first stage)
# channels last is a GEMM per group (a vector of 8 half used on AVX2, tileshape.narrow),
# not a scalar row loop
MIN_BATCHED_N = 4
NARROW_B = ("bf16", "f16")   # 16-bit constants a build-time B panel may keep (precisions/)


def extent(v: str, out: Buffer, rdims: dict[str, Expr]) -> Expr:
    return rdims[v] if v in rdims else out.sizes[v]


def split(k: Kernel, out: Buffer, ra: Expr, rb: Expr) -> dict | None:
    """The GEMM spaces of ``k`` with ``ra`` as A and ``rb`` as B, or None."""
    if ra.arg[0] == k.out or rb.arg[0] == k.out:
        return None
    loop = set(out.layout) | set(k.rdims)
    aff_a, aff_b = {}, {}
    for read, aff in ((ra, aff_a), (rb, aff_b)):
        for d, ix in zip(read.arg[1], read.args):
            hit = affine(ix, loop)
            if hit is None:
                return None
            aff[d] = hit
    uses_a = {v for c, _ in aff_a.values() for v in c}
    uses_b = {v for c, _ in aff_b.values() for v in c}
    batch, m, n = [], [], []
    for d in out.layout:
        if is_one(out.sizes[d]):
            continue
        if d in uses_a and d in uses_b:
            batch.append(d)
        elif d in uses_a:
            m.append(d)
        elif d in uses_b:
            n.append(d)
        else:
            return None   # a broadcast output dim: the product would be recomputed per point
    kdims = [r for r, s in k.rdims.items() if not is_one(s)]
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


def const_view(k: Kernel, out: Buffer, ra: Expr, rb: Expr) -> dict | None | bool:
    """The GEMM view with constant ``rb`` as B packed at build time; None when B cannot be
    packed then (an index or extent not constant), False when the contraction has too few
    columns or no depth to be a GEMM at all."""
    info = split(k, out, ra, rb)
    if info is None or any(not c0.is_const for _, c0 in info["aff_b"].values()):
        return None
    if any(not extent(v, out, k.rdims).is_const for v in info["batch"] + info["n"] + info["k"]):
        return None
    if info["n_size"].value < (MIN_BATCHED_N if info["batch"] else MIN_N) or \
            info["k_size"].value < 1:
        return False
    info["mode"] = "const"
    return info


def widened(e: Expr, g) -> Expr | None:
    """The 16-bit constant that ``e`` reads widened to f32 (codegen/precisions/weights16.py's
    ``cast<f32>(W[...])``), or None."""
    if e.op != "cast" or e.dtype != "f32":
        return None
    r = e.args[0]
    if r.op == "read" and r.dtype in NARROW_B and r.arg[0] in g.constants and r.arg[2] is None:
        return r
    return None


def narrow_view(k: Kernel, g, out: Buffer, args, narrow, bufs, t) -> dict | None:
    """The GEMM view of a product of an f32 read and a 16-bit constant: that constant as B,
    packed at build time in its own dtype (the micro-kernel widens each vector it loads); None
    when it cannot be (the kernel then runs as a loop nest, widening each element). A bf16 A
    (bf16dot.py's rounded activations) multiplies in bf16 pairs where ``pair_dim`` finds a K
    dim to pair, else is widened per element like B."""
    hits = [i for i, r in enumerate(narrow) if r is not None]
    if len(hits) != 1 or len(args) != 2:
        return None
    rb, ra = narrow[hits[0]], args[1 - hits[0]]
    if ra.op == "cast" and ra.dtype == "f32" and ra.args[0].op == "read" \
            and ra.args[0].dtype == "bf16" and rb.dtype == "bf16":
        ra = ra.args[0]
    elif ra.op != "read" or ra.dtype != "f32":
        return None
    info = const_view(k, out, ra, rb)
    if not info:
        return None
    info["pair"] = pair_dim(info, k, bufs, t) if ra.dtype == "bf16" else None
    paired_last(info)
    return info


def pair_dim(info: dict, k: Kernel, bufs, t, size: int = 2, dot=bf16_dot) -> str | None:
    """The K dim the pair (or quad) products group: one that A reads at unit stride, of constant
    extent a multiple of ``size``, on a target that has them (``dot``: gemm.bf16_dot or
    int8_dot); None where there is none."""
    if t is None or not dot(t):
        return None
    a = bufs[info["a"].arg[0]]
    for v in info["k"]:
        ext = k.rdims[v]
        step = read_step(info["aff_a"], a, v)
        if ext.is_const and ext.value % size == 0 and step.is_const and step.value == 1:
            return v
    return None


def paired_last(info: dict) -> None:
    """The paired dim innermost of the short K dims (the outermost stays: K is chunked on it)."""
    ks, pair = info["k"], info["pair"]
    if pair is not None:
        info["k"] = ks[:1] + [v for v in ks[1:] if v != pair] + ([pair] if pair in ks[1:] else [])


def int8_view(k: Kernel, g, out: Buffer, args, bufs, t) -> dict | None:
    """The GEMM view of an int8 contraction (codegen/precisions/int8.py): the sum of
    ``i32(A u8) * i32(W s8)`` with the s8 constant as B, packed at build time in s8. Where the
    target multiplies in quads or pairs (gemm.int8_dot) and A has a K dim at unit stride in runs
    of four, K is grouped along it; else the micro-kernel widens both to i32 lanes."""
    inner = [a.args[0] if a.op == "cast" and a.dtype == "i32" else None for a in args]
    if len(args) != 2 or any(r is None or r.op != "read" for r in inner):
        return None
    hits = [i for i, r in enumerate(inner)
            if r.dtype == "i8" and r.arg[0] in g.constants and r.arg[2] is None]
    if len(hits) != 1:
        return None
    rb, ra = inner[hits[0]], inner[1 - hits[0]]
    if ra.dtype != "u8" or ra.arg[0] in g.constants:
        return None
    info = const_view(k, out, ra, rb)
    if not info:
        return None
    info["pair"] = pair_dim(info, k, bufs, t, QUAD, int8_dot)
    if info["pair"] is None and t is not None and int8_dot(t):
        info["relayout"] = quad_layout(info, k, bufs)
        if info["relayout"] is not None:   # A's copy (contraction.py's ``_unguard``) puts the quad dim innermost
            info["pair"] = info["relayout"][1]
            info["relayout"] = info["relayout"][0]
    paired_last(info)
    return info


def quad_layout(info: dict, k: Kernel, bufs) -> tuple[tuple[str, ...], str] | None:
    """(A's dims with one moved innermost, the K var indexing it) when A's unit-stride dim holds
    no quad but another dim is indexed by a K var alone, of extent a multiple of four (an NCHW
    input's channels): a copy of A in that layout (a u8 copy, cheap beside the GEMM) lets K go
    in quads. None when there is no such dim."""
    ra = info["a"]
    src = bufs[ra.arg[0]]
    index = dict(zip(ra.arg[1], ra.args))
    for v in info["k"]:
        ext = k.rdims[v]
        if not (ext.is_const and ext.value % QUAD == 0):
            continue
        for d in src.layout:
            ix = index[d]
            if ix.op == "var" and ix.arg == v and all(
                    v not in ex.free_vars(index[o]) for o in src.layout if o != d):
                return tuple(o for o in src.layout if o != d) + (d,), v
    return None


def pair_size(info: dict) -> int:
    """How many K a paired view groups: four for int8 (an s8 B), two for bf16."""
    return QUAD if info["b"].dtype == "i8" else 2


def panel_dtype(dtype: str, t: CpuTarget) -> str:
    """The dtype a build-time B panel of a ``dtype`` constant is packed in: its own where the
    micro-kernel can widen it (bf16 everywhere, by shifts; f16 with F16C or on arm64), else f32."""
    if dtype == "f16" and not (t.arch == "arm64" or "f16c" in t.features):
        return "f32"
    return dtype
