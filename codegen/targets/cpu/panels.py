"""The kernels that write a GEMM's B panels (contraction.py): a map kernel copying B, as the
micro-kernel reads it, into ``[batch dims][N block][K dims][lane]`` (bf16 pairs and int8 quads
innermost; pmaddwd's quads as their two pairs apart), run on every run for a B computed at run
time, or once, when the engine opens the artifact, for a constant B (a *prepare* kernel: the
container stores the weights as the model has them, and each target packs its own copy into
its packed region); and SDOT's column correction of an int8 panel, a prepare kernel too."""

from __future__ import annotations

from mlpack.spec.ir import dtypes
from mlpack.spec.ir import expr as ex
from mlpack.codegen.targets.cpu.gemm import PACK
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu import transpose
from mlpack.codegen.targets.cpu.kernels import schedule


def pack_kernel(k: Kernel, info: dict, bufs: dict[str, Buffer], name: str, dtype: str = "f32",
                pair: str | None = None, size: int = 1, halves: bool = False) -> Kernel:
    """A map kernel writing B, as the GEMM reads it, into the buffer ``name``: layout (batch
    dims, N block, K dims, lane), the N columns past the end zero; with a ``pair`` K dim, that
    dim split into (dim / ``size``) in its place and ``size`` innermost, after the lane
    (gemm.pack_pairs); with ``halves`` too, each quad's two pairs apart, the pair's half before
    the lane (gemm.pair_halves: pmaddwd's panel). ``dtype``: the panel's (gemm.PACK's B, or a
    16-bit or s8 constant's own)."""
    rb, out = info["b"], bufs[k.out]
    nb, lane, outer, inner, half = "pack.nb", "pack.l", "pack.p", "pack.e", "pack.h"
    sizes = {d: out.sizes[d] for d in info["batch"]}
    sizes[nb] = ex.ceildiv(info["n_size"], ex.const(PACK))
    kdims = []
    for r in info["k"]:
        kdims.append(outer if r == pair else r)
        sizes[kdims[-1]] = ex.const(k.rdims[r].value // size) if r == pair else k.rdims[r]
    sizes[lane] = ex.const(PACK)
    layout = (*info["batch"], nb, *kdims, lane)
    if pair is not None and halves:
        sizes[half], sizes[inner] = ex.const(size // 2), ex.const(2)
        layout = (*info["batch"], nb, *kdims, half, lane, inner)
    elif pair is not None:
        sizes[inner] = ex.const(size)
        layout += (inner,)
    buf = Buffer(name, layout, {d: ex.simplify_size(sizes[d]) for d in layout}, dtype)
    bufs[name] = buf
    col = ex.var(nb) * PACK + ex.var(lane)
    env = {d: ex.var(d) for d in (*info["batch"], *info["k"])}
    if pair is not None:
        env[pair] = ex.var(outer) * size + ex.var(inner)
        if halves:
            env[pair] = env[pair] + ex.var(half) * 2
    # B's read, unguarded (a constant B: the panel's padding columns read the last column, and
    # the select below zeroes them), or guarded (its own padding, a symbolic N)
    clamp = rb.arg[2] is None and info["n_size"].is_const
    flat = ex.binary("min", col, info["n_size"] - 1) if clamp else col
    for d in reversed(info["n"]):   # the flat column over the N dims (last fastest)
        size_d = out.sizes[d]
        env[d] = flat if d == info["n"][0] else ex.mod(flat, size_d)
        flat = ex.floordiv(flat, size_d)
    index = {}
    for d, ix in zip(rb.arg[1], rb.args):
        index[d] = ex.substitute(ix, {v: env.get(v, ex.const(0)) for v in ex.free_vars(ix)})
    pad = None if clamp else 0 if rb.arg[2] is None else rb.arg[2]
    read = ex.read(rb.arg[0], index, rb.dtype, pad)
    value = read if rb.dtype == dtype else ex.cast(read, dtype)
    zero = ex.const(0 if dtypes.is_int(dtype) else 0.0, dtype)
    body = ex.select(ex.binary("lt", col, info["n_size"]), value, zero)
    pk = Kernel(f"{k.name}_packb", name, body, None, {}, dtype, reads=[rb.arg[0]],
                fused=list(k.fused))
    schedule(pk, buf, bufs)
    how = transpose.plan(pk, info, bufs, k.rdims)
    if how is not None:   # B runs along K in memory: blocks transposed in registers
        pk.strategy, pk.gemm = "transpose", how
    return pk


def panel_kernel(k: Kernel, info: dict, bufs: dict[str, Buffer], name: str, dtype: str,
                 pair: str | None, size: int, halves: bool = False) -> Kernel:
    """The prepare kernel packing a constant B once, when the engine opens the artifact: the
    container stores the model's weights as they are, once for every target (a packing is a
    target's choice), and the panel is the target's own copy in its packed region."""
    pk = pack_kernel(k, info, bufs, name, dtype, pair, size, halves)
    pk.name = f"{k.name}_panel"
    pk.prepare = True
    return pk


def correction_kernel(panel: Buffer, name: str, bufs: dict[str, Buffer]) -> Kernel:
    """The prepare kernel of gemm.signed_correction: 128 times the sum over K of an s8 panel
    [batch dims, N block, K dims, lane, quad] (``pack_kernel``), per (batch dims, N block,
    lane), in i32."""
    at = panel.layout.index("pack.nb")
    layout = panel.layout[:at + 1] + ("pack.l",)
    buf = Buffer(name, layout, {d: panel.sizes[d] for d in layout}, "i32")
    bufs[name] = buf
    rdims = {d: panel.sizes[d] for d in panel.layout if d not in layout}
    read = ex.read(panel.name, {d: ex.var(d) for d in panel.layout}, panel.dtype)
    body = ex.mul(ex.cast(read, "i32"), ex.const(128, "i32"))
    ck = Kernel(f"{name}_sum", name, body, "sum", rdims, "i32", reads=[panel.name],
                fused=[name], prepare=True)
    schedule(ck, buf, bufs)
    return ck


__all__ = ["pack_kernel", "panel_kernel", "correction_kernel"]
