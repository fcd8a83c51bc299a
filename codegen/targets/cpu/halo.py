"""A pooling window's padded input copied once, with the halo the window reaches, so that the
pooling reads in bounds.

A max or min pooling whose window reaches past its input's edges (pads, ceil_mode) reads each
window position through a guard: out of range gives the pad value (the dtype's lowest for a
max). ``kernels.unroll_window`` writes the window's terms out as one map, and with the guards
LLVM vectorizes each term as a masked gather, or leaves it scalar: GoogLeNet's 3x3 poolings over
its inception blocks' concatenations (NCHW, ceil_mode) ran 4-8x slower than ONNX Runtime's.
Here the input is first copied into a buffer that also holds the halo the window reaches (the
pad value there: one pass over the input, the copy contraction.py makes for a padded
convolution's A), and the pooling reads that buffer at its own indices, shifted: plain loads,
which LLVM vectorizes along the row. A window that never leaves its input loses its guards and
needs no copy.
"""

from __future__ import annotations

from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.codegen.targets.cpu.indexing import affine, index_range
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.kernels import fresh_name, schedule, tensors_read


# A window strided along its output's row (a pooling of stride 2 over NCHW) is made plain only
# over rows of at least this many elements. Measured on 3x3 max poolings over NCHW concatenations
# (x86_64-v4, one thread, MLPACK_PROFILE): rows of 27 and 28 ran 1.3-2x faster plain (0.55 ->
# 0.31 ms, 0.29 -> 0.23, 0.37 -> 0.18), rows of 13 and 14 1.2x slower (0.27 -> 0.32, 0.57 ->
# 0.71); stride 1 was faster plain at every size (rows of 14: 0.38 -> 0.30 ms).
MIN_STRIDED_ROW = 16


def unguard_windows(kernels: list[Kernel], bufs: dict[str, Buffer]) -> list[Kernel]:
    """``kernels`` with each unrolled window's padded reads made plain, after the halo copies
    they need."""
    out: list[Kernel] = []
    for k in kernels:
        if k.window > 1 and not k.points:   # (a point tile runs its window a point at a time)
            out.extend(_unguard(k, bufs))
        out.append(k)
    return out


def _ranges(reads: list[Expr], out: Buffer,
            src: Buffer) -> dict[str, tuple[int, int] | None] | None:
    """The least and greatest index per dim of ``src`` that ``reads`` read over the whole
    output, None for a dim read exactly over its extent (a dynamic batch: a symbolic size);
    None for all where an index is not affine in the output's dims or not bounded so."""
    loop = set(out.layout)
    seen: dict[str, tuple[int, int] | None] = {}
    for r in reads:
        for d, ix in zip(r.arg[1], r.args):
            form = affine(ix, loop)
            if form is None:
                return None
            lo, hi = index_range(*form, lambda v: out.sizes[v])
            if not (lo.is_const and hi.is_const):
                if not (lo.is_const and lo.value == 0 and ex.same_size(hi + 1, src.sizes[d])) \
                        or seen.get(d) is not None:
                    return None
                seen[d] = None
                continue
            if d in seen and seen[d] is None:
                return None
            was = seen.get(d, (lo.value, hi.value))
            seen[d] = (min(was[0], lo.value), max(was[1], hi.value))
    return seen if set(seen) == set(src.layout) else None


def _extent(reads: list[Expr], out: Buffer, src: Buffer) -> dict[str, tuple[int, Expr]] | None:
    """Per dim of ``src``, (the first index the reads reach, relative to its origin, 0 or
    below; the size from there that covers both the tensor and every index read), or None
    where that is not known at compile time."""
    seen = _ranges(reads, out, src)
    if seen is None:
        return None
    extent = {}
    for d in src.layout:
        size, got = src.sizes[d], seen[d]
        if got is None or got[0] >= 0 and (ex.same_size(ex.const(got[1] + 1), size) or
                                           size.is_const and got[1] < size.value):
            extent[d] = (0, size)   # (this dim's reads stay inside)
        elif not size.is_const:
            return None
        else:
            first, last = min(got[0], 0), max(got[1], size.value - 1)
            extent[d] = (first, ex.const(last - first + 1))
    return extent


def _unguard(k: Kernel, bufs: dict[str, Buffer]) -> list[Kernel]:
    """The halo copies ``k`` reads instead of its padded reads (rewritten in place)."""
    groups: dict[tuple, list[Expr]] = {}
    for r in ex.reads(k.body):
        if r.arg[2] is not None and r.arg[0] in bufs:
            groups.setdefault((r.arg[0], r.arg[2]), []).append(r)
    out = bufs[k.out]
    copies, plain = [], []   # (read, its plain form): the body's own nodes
    for (name, pad), reads in groups.items():
        src = bufs[name]
        extent = None if _short_strided_row(reads, out) else _extent(reads, out, src)
        if extent is None:
            continue
        grown = [d for d, (first, size) in extent.items() if first or size is not src.sizes[d]]
        if grown and not _along_row(reads, grown, out):
            continue   # (guards the same along a row cost one branch per vector)
        target = name   # (no halo: every position inside, the guard never fires)
        if grown:
            copy = _halo_copy(k, src, pad, extent, bufs)
            copies.append(copy)
            target = copy.out
        plain += [(r, ex.read(target, {d: ex.simplify_size(ix - extent[d][0])
                                       if extent[d][0] else ix
                                       for d, ix in zip(r.arg[1], r.args)}, r.dtype))
                  for r in reads]
    for r, new in plain:   # (by identity: untouched subtrees keep their nodes)
        k.body = ex.replace_node(k.body, r, new)
    if plain:
        k.reads = [t for t in dict.fromkeys(tensors_read(k.body)) if t != k.out]
        schedule(k, out, bufs)
    return copies


def _halo_copy(k: Kernel, src: Buffer, pad, extent: dict, bufs: dict[str, Buffer]) -> Kernel:
    """The kernel copying ``src`` into a new buffer over ``extent``, ``pad`` outside it."""
    halo = Buffer(fresh_name(f"{src.name}#halo", bufs), src.layout,
                  {d: extent[d][1] for d in src.layout}, src.dtype)
    bufs[halo.name] = halo
    body = ex.read(src.name, {d: ex.var(d) + extent[d][0] if extent[d][0] else ex.var(d)
                              for d in src.layout}, src.dtype, pad)
    copy = Kernel(f"{k.name}_pad", halo.name, body, None, {}, src.dtype, reads=[src.name],
                  fused=list(k.fused))
    schedule(copy, halo, bufs)
    return copy


def _short_strided_row(reads: list[Expr], out: Buffer) -> bool:
    """Whether the reads step through their tensor by more than one element per element of the
    output's row, a row shorter than MIN_STRIDED_ROW: LLVM's loop over it in plain loads
    deinterleaves vectors once and leaves the rest scalar, slower than its masked gathers."""
    row = out.contiguous_dim()
    if row is None:
        return False
    size = out.sizes[row]
    loop = set(out.layout)
    for r in reads:
        for ix in r.args:
            form = affine(ix, loop)
            if form is not None and abs(form[0].get(row, 1)) > 1:
                return not (size.is_const and size.value >= MIN_STRIDED_ROW)
    return False


def _along_row(reads: list[Expr], dims: list[str], out: Buffer) -> bool:
    """Whether the output's unit-stride dim moves the index of any of ``dims`` in ``reads``:
    the guard then differs lane by lane (an NCHW pooling's columns), which LLVM vectorizes as
    masked gathers; along channels (channels last) it holds for the whole vector."""
    row = out.contiguous_dim()
    return row is not None and any(
        d in dims and row in ex.free_vars(ix) for r in reads for d, ix in zip(r.arg[1], r.args))

