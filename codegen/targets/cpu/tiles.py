"""Point tiles: a span of comprehensions run one point of its outer dims at a time, as one kernel.

codegen/passes/points.py finds the spans: the ops from a big intermediate's producer to its
last reader, all of them over some common dims D (EM routing's output positions n, x, y) and
reading what the span writes at the same point. Run op by op, such an intermediate (the votes,
231 MB) goes through memory once per reader; run point by point, one point of it (590 KB) is
written and re-read while it is in cache, and the ``recompute`` pass keeps it materialized
rather than recompute it in every reader.

The cpu target runs a span so in three steps:

- ``point_tiles`` (a target pass) merges overlapping spans and lays every tensor the span
  writes out with D first (a point of it is then one contiguous run), graph outputs excepted
  (one not in that order already drops the span);
- ``kernels.build_kernels`` schedules the span's kernels with D kept out of rows and row blocks
  (``Kernel.points``), and ``contraction.apply`` leaves them as they are;
- ``group`` replaces the span's kernels by one ``TileKernel``: each workgroup walks its share of
  the points, running every member for one point before the next. A tensor only the span
  reads (``locals``) lives in the workgroup's slice of a scratch buffer that holds one point of
  it: the member reading or writing it is handed a base pointer moved back by the point's
  offset, so its own address arithmetic lands in the slice. A member runs for one point by
  being asked for workgroup ``p`` of ``P`` (the points): its units are the rows of its
  output, D-major, so workgroup p's share is exactly point p's rows.

The scratch holds POINTS_IN_FLIGHT slices, or as many as a batch of one has points, and the
tile kernel has as many workgroups at most: its memory does not grow with the batch.
``MLPACK_DISABLE_PASSES=point_tiles`` runs each op over every point, the intermediate whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llvmlite import ir

from mlpack.codegen import debug
from mlpack.codegen.passes.points import POINTS_IN_FLIGHT, Span, point_span
from mlpack.codegen.llvm.loops import Loops
from mlpack.codegen.llvm.scalar import ScalarEmitter
from mlpack.codegen.llvm.types import I8, I32, I64
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Comprehension, Graph
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, exact_bytes, share
from mlpack.codegen.targets.cpu.lower import KernelLowering
from mlpack.codegen.targets.cpu.rows import reordered
from mlpack.codegen.targets.cpu.sharing import kernel_key

ALIGN = 64   # each local's slice starts on a cache line


@dataclass(frozen=True)
class Tile:
    """A span as the target runs it: its ops (outputs, in graph order) and point dims."""
    ops: tuple[str, ...]
    dims: tuple[str, ...]


# ---------------------------------------------------------------- the graph pass


def _merged(spans: list[Span], order: list[str]) -> list[Tile]:
    """Overlapping spans as one tile over the dims they share (in the first one's order)."""
    at = {o: i for i, o in enumerate(order)}
    tiles: list[tuple[int, int, tuple[str, ...]]] = []
    for s in sorted(spans, key=lambda s: at[s.ops[0]]):
        lo, hi = at[s.ops[0]], at[s.ops[-1]]
        if tiles and lo <= tiles[-1][1]:
            a, b, dims = tiles[-1]
            tiles[-1] = (a, max(b, hi), tuple(d for d in dims if d in s.dims))
        else:
            tiles.append((lo, hi, s.dims))
    return [Tile(tuple(order[a:b + 1]), dims) for a, b, dims in tiles if dims]


def _fits(tile: Tile, g: Graph, outputs: set[str]) -> bool:
    """Whether every tensor the tile writes holds one point as a constant-size run: its
    non-point dims constant, and a graph output already laid out points first."""
    for t in tile.ops:
        dims = g.types[t].dims
        if any(d not in dims for d in tile.dims):
            return False
        if not all(s.is_const for d, s in dims.items() if d not in tile.dims):
            return False
        lead = [d for d, s in dims.items() if not (s.is_const and s.value == 1)]
        if t in outputs and lead[:len(tile.dims)] != list(tile.dims):
            return False
    return True


def find_tiles(g: Graph) -> list[Tile]:
    """The tiles of ``g``: the spans of its intermediates (points.py), merged."""
    spans = [s for op in g.ops if isinstance(op, Comprehension)
             for s in [point_span(g, op.out)] if s is not None]
    if not spans:
        return []
    outputs = {p.name for p in g.outputs}
    return [t for t in _merged(spans, [op.outs[0] for op in g.ops]) if _fits(t, g, outputs)]


def point_tiles(g: Graph, found: list) -> Graph:
    """``g`` with the tensors of each tile laid out points first; the tiles appended to
    ``found``. ``g`` itself is not changed: the targets of a build share it."""
    tiles = find_tiles(g)
    if not tiles:
        return g
    found.extend(tiles)
    orders = {}
    for tile in tiles:
        for t in tile.ops:
            dims = list(g.types[t].dims)
            order = [*tile.dims, *[d for d in dims if d not in tile.dims]]
            if order != dims:
                orders[t] = order
        debug.log(f"point tiles: {', '.join(tile.ops)} one point of ({', '.join(tile.dims)}) "
                  "at a time")
    return reordered(g, orders)


def boundaries(tiles: list[Tile], g: Graph) -> set[str]:
    """Tensors that cross a tile's edge (written inside and read outside, or the reverse):
    no epilogue fusion may pull one kernel across it."""
    inside = {t: i for i, tile in enumerate(tiles) for t in tile.ops}
    out = set()
    for op in g.ops:
        for n in ex.walk(op.body) if isinstance(op, Comprehension) else ():
            if n.op == "read" and n.arg[0] in g.types:
                if inside.get(n.arg[0]) != inside.get(op.outs[0]):
                    out.add(n.arg[0])
    return out


# ---------------------------------------------------------------- kernels


@dataclass
class TileKernel(Kernel):
    """One tile's kernels (``members``, each with ``points`` set) run point by point."""
    members: list[Kernel] = field(default_factory=list)
    dims: tuple[str, ...] = ()
    writes: list[str] = field(default_factory=list)   # what is read after the tile, the scratch
    locals: dict[str, tuple[int, int]] = field(default_factory=dict)   # offset, bytes a point
    scratch: str = ""
    slice_bytes: int = 0       # one workgroup's slice of the scratch
    slices: int = 1            # in the scratch: POINTS_IN_FLIGHT, or the points at a batch of 1

    def workgroups(self, bufs: dict[str, Buffer]) -> Expr:
        """min(points, slices): a workgroup per slice of the scratch at most."""
        return ex.binary("min", _points(self.dims, bufs[self.members[0].out]),
                         ex.const(self.slices))


def group(kernels: list[Kernel], tiles: list[Tile], bufs: dict[str, Buffer],
          outputs: set[str]) -> list[Kernel]:
    """``kernels`` with each tile's members, consecutive, replaced by their TileKernel (a
    tile whose members are not consecutive runs as its kernels, over every point each)."""
    tile_of = {t: i for i, tile in enumerate(tiles) for t in tile.ops}
    out: list[Kernel] = []
    i = 0
    while i < len(kernels):
        k = kernels[i]
        which = tile_of.get(k.out) if k.points else None
        if which is None:
            out.append(k)
            i += 1
            continue
        j = i
        while j < len(kernels) and kernels[j].points and tile_of.get(kernels[j].out) == which:
            j += 1
        members = kernels[i:j]
        rest = [m for m in kernels[j:] if m.points and tile_of.get(m.out) == which]
        if rest:
            debug.log(f"point tiles: {members[0].name} .. {rest[-1].name} are not consecutive; "
                      "each runs over every point")
            out.extend(members)
        else:
            out.append(_tile_kernel(members, tiles[which], kernels[j:], bufs, outputs))
        i = j
    return out


def _tile_kernel(members: list[Kernel], tile: Tile, after: list[Kernel],
                 bufs: dict[str, Buffer], outputs: set[str]) -> TileKernel:
    written = [m.out for m in members]
    read_after = {t for k in after for t in k.reads}
    local, offset = {}, 0
    for t in written:
        if t in outputs or t in read_after:
            continue
        buf = bufs[t]
        point = exact_bytes(replace(buf, sizes={d: (ex.const(1) if d in tile.dims else s)
                                                for d, s in buf.sizes.items()}))
        local[t] = (offset, point.value)
        offset += -(-point.value // ALIGN) * ALIGN
    name = f"{members[0].name}.tile"
    scratch = f"{name}#scratch"
    slices = min(POINTS_IN_FLIGHT, ex.value_at_one(_points(tile.dims, bufs[written[0]])))
    floats = max(slices * offset // 4, 1)
    bufs[scratch] = Buffer(scratch, ("slot",), {"slot": ex.const(floats)}, "f32")
    writes = [t for t in written if t not in local] + [scratch]
    reads = [t for t in dict.fromkeys(r for m in members for r in m.reads)
             if t not in written]
    for j, m in enumerate(members):
        m.name = f"{name}.{j}"
    return TileKernel(name, writes[0], ex.const(0.0), None, {}, "f32", strategy="tile",
                      reads=reads, fused=[t for m in members for t in m.fused],
                      members=members, dims=tile.dims, writes=writes, locals=local,
                      scratch=scratch, slice_bytes=offset, slices=slices)


def _points(dims: tuple[str, ...], buf: Buffer) -> Expr:
    return ex.product([buf.sizes[d] for d in dims])


# ---------------------------------------------------------------- lowering


class TileLowering(KernelLowering):
    """A TileKernel's body: its members' bodies (each its own always-inlined function, as
    KernelLowering emits it) called point by point."""

    def __init__(self, module, k: TileKernel, buffers, symbols, loops_md, native_f16=(True, True)):
        super().__init__(module, k, buffers, symbols, loops_md, native_f16)
        self.bound = [*k.writes, *k.reads]
        self.impls = []
        self.member_symbols = symbols   # what the members' functions take after the tensors

    def _member_impls(self) -> list[tuple[KernelLowering, ir.Function]]:
        """Each member's lowering and its function (members equal under a renaming of
        tensors, sharing.py, share one)."""
        k = self.k
        members = []
        first: dict[tuple, ir.Function] = {}   # a member's key (sharing.py) -> its function
        for m in k.members:
            lowering = KernelLowering(self.module, m, self.buffers, self.member_symbols,
                                      self.loops_md, self.native_f16)
            # an iteration repeated (EM routing's second and third) is the same code on other
            # tensors: called with its own, it is lowered and optimized once
            keyed = kernel_key(m, self.buffers)
            if keyed is not None and keyed[0] in first:
                members.append((lowering, first[keyed[0]]))
                continue
            impl = lowering._impl_signature()
            # each member is optimized on its own (one function of them all took LLVM 5x
            # the time), its buffers still noalias; a call per member and point costs nothing.
            # Never inlined, no pass sees that a moved base pointer lies before the scratch
            # (only the addresses the member forms from it are inside)
            impl.attributes.discard("alwaysinline")
            impl.attributes.add("noinline")
            lowering._emit_impl(impl)
            if m.checks:
                raise AssertionError(f"cpu: {m.name} checks indices inside a point tile")
            members.append((lowering, impl))
            if keyed is not None:
                first[keyed[0]] = impl
        self.impls = list(dict.fromkeys(impl.name for _, impl in members))
        return members

    def _begin(self, f: ir.Function):
        """The members' functions, then the tile's entry block: (members, scalar emitter,
        bound tensor -> pointer, the symbols' values, (wg, count, err, status))."""
        members = self._member_impls()
        b = ir.IRBuilder(f.append_basic_block("entry"))
        self.b = b
        self.loops = Loops(b, self.module, unroll=False)
        n = len(self.bound)
        bases = {t: f.args[j] for j, t in enumerate(self.bound)}
        E = ScalarEmitter(b, bases, self.buffers, self.k.name, self.native_f16, target="cpu")
        self.E = E
        syms = list(f.args[n:n + len(self.symbols)])
        for s, v in zip(self.symbols, syms):
            E.bind("$" + s, v)
        return members, E, bases, syms, tuple(f.args[n + len(self.symbols):])

    def _share(self, units, wg, count, scratch, slice_bytes):
        """This workgroup's [start, end) of ``units`` and its slice of the scratch."""
        b = self.b
        start, end = share(b, self.k, units, wg, count)
        return start, end, b.gep(scratch, [b.mul(b.zext(wg, I64), slice_bytes)],
                                 source_etype=I8)

    def _call(self, lowering, impl, bases, base, at, locals_, syms, tail) -> None:
        """Call a member's function with its tensors: a local, the workgroup's slice of the
        scratch (``base``) moved back by its (offset, size) pair's size times ``at`` (the
        point, or the block's first row), so the member's own addresses land in the slice."""
        b = self.b
        args = []
        for t in lowering.bound:
            if t in locals_:
                off, size = locals_[t]
                args.append(b.gep(base, [b.sub(off, b.mul(at, size))], source_etype=I8))
            else:
                args.append(bases[t])
        b.call(impl, args + syms + tail)

    def _emit_impl(self, f: ir.Function) -> None:
        k = self.k
        members, E, bases, syms, (wg, count, err, status) = self._begin(f)
        b = self.b
        sizes = self.buffers[k.members[0].out].sizes
        points = ir.Constant(I64, 1)
        for d in k.dims:
            points = b.mul(points, E(sizes[d]))
        start, end, base = self._share(points, wg, count, bases[k.scratch],
                                       ir.Constant(I64, k.slice_bytes))
        total = b.trunc(points, I32)
        locals_ = {t: (ir.Constant(I64, off), ir.Constant(I64, size))
                   for t, (off, size) in k.locals.items()}
        with self.loops.loop(start, end, "point") as p:
            for lowering, impl in members:
                self._call(lowering, impl, bases, base, p, locals_, syms,
                           [b.trunc(p, I32), total, err, status])
        b.ret_void()
        self.loops_md(self.loops.latches, self.loops.unroll)
        self._finish_checks(err, status)


__all__ = ["Tile", "TileKernel", "TileLowering", "boundaries", "find_tiles", "group",
           "point_tiles"]
