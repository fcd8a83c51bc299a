"""The plan of a cpu artifact (spec/SPEC.md section 7): symbols, buffers, arena, dispatches.

Buffers are listed inputs, outputs, weights, then arena slices. Graph inputs and outputs lie in
their port layout (ONNX order), constants in their own layout, and every other tensor in its
type's dim order. Arena offsets are assigned by liveness: a tensor's slot is free again after
the last dispatch that reads it, and a later tensor of a provably equal size (or, for constant
sizes, no larger size) reuses it. A slot keeps the offset it got, so offsets and sizes stay
plain polynomials in the symbols. When every size is constant, the tensors are also packed by
size (``_pack_by_size``: the largest first, each at the lowest offset clear of every tensor
live with it), and that placement is kept when its arena is smaller (the capsule layer's EM
routing: 45.8 -> 30.7 MB; ResNet-50 9.6 -> 8.0 MB). Tensors whose sizes are each a constant
times a product of symbols (a dynamic batch's activations) are packed the same way at a value
of 1, and their offsets scale with the product (``_pack_by_monomial``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import Graph, Procedure
from mlpack.spec.ir.program import encode_expr
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.cpu import contraction, procedure, tiles, transpose
from mlpack.codegen.targets.cpu.concat import root
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel, exact_bytes
from mlpack.codegen.targets.cpu.kernels import copy_kernel, row_dim, shared_units

ARENA_ALIGN = 64
PREPARE_ABI_MINOR = 4   # plan "abi_minor" of a plan with "prepare" dispatches and packed buffers


def tensor_buffers(g: Graph) -> dict[str, Buffer]:
    """The memory layout of every tensor the kernels touch (outputs: first port naming them)."""
    bufs: dict[str, Buffer] = {}
    # a procedure result sized at run time is laid out at its bound; a copy kernel trims it
    produced = {o for op in g.ops for o in op.outs} - procedure.bounded_tensors(g)
    for p in g.inputs:
        t = g.types[p.name]
        bufs[p.name] = Buffer(p.name, p.layout, dict(t.dims), t.dtype)
    for c in g.constants.values():
        bufs[c.name] = Buffer(c.name, tuple(c.layout), dict(c.type.dims), c.type.dtype)
    for p in g.outputs:
        if p.name in produced and p.name not in bufs:
            t = g.types[p.name]
            bufs[p.name] = Buffer(p.name, p.layout, dict(t.dims), t.dtype)
    procedure.add_procedure_buffers(g, bufs)
    for op in g.ops:
        if not isinstance(op, Procedure) and op.out not in bufs:
            bufs[op.out] = Buffer(op.out, tuple(op.type.dims), dict(op.type.dims), op.type.dtype)
    return bufs


def output_copies(g: Graph, bufs: dict[str, Buffer], first_index: int) -> tuple[list[Kernel], list[str]]:
    """Copy kernels for outputs no kernel writes in place, and each output's buffer tensor."""
    produced = {o for op in g.ops for o in op.outs} - procedure.bounded_tensors(g)
    owners: list[str] = []
    copies: list[Kernel] = []
    for i, p in enumerate(g.outputs):
        if p.name in produced and p.name not in owners:
            owners.append(p.name)
            continue
        t = g.types[p.name]
        dst = Buffer(f"{p.name}#out{i}", p.layout, dict(t.dims), t.dtype)
        bufs[dst.name] = dst
        copies.append(copy_kernel(f"k{first_index + len(copies)}_copy_out{i}", bufs[p.name], dst))
        owners.append(dst.name)
    return copies, owners


def nbytes(buf: Buffer) -> Expr:
    """exact_bytes rounded up to the arena's alignment (a slot's size)."""
    size = exact_bytes(buf)
    if size.is_const:
        return ex.const(-(-size.value // ARENA_ALIGN) * ARENA_ALIGN)
    if ex.simplify_size(ex.floordiv(size, ex.const(ARENA_ALIGN))).op != "floordiv":
        return size  # every coefficient is a multiple of the alignment already
    return ex.floordiv(size + (ARENA_ALIGN - 1), ex.const(ARENA_ALIGN)) * ex.const(ARENA_ALIGN)


@dataclass
class _Slot:
    size: Expr
    free: bool = False
    tenants: list[str] = field(default_factory=list)


def _pick_slot(slots: list[_Slot], need: Expr) -> _Slot:
    free = [s for s in slots if s.free]
    for s in free:
        if ex.same_size(s.size, need):
            return s
    if need.is_const:
        consts = [s for s in free if s.size.is_const]
        fits = [s for s in consts if s.size.value >= need.value]
        if fits:
            return min(fits, key=lambda s: s.size.value)
        if consts:
            s = max(consts, key=lambda s: s.size.value)
            s.size = need
            return s
    s = _Slot(need)
    slots.append(s)
    return s


def assign_arena(kernels: list[Kernel], arena: list[str], bufs: dict[str, Buffer],
                 bounds: dict[str, Expr] | None = None,
                 aliases: dict[str, tuple[str, int]] | None = None) -> tuple[dict, Expr]:
    """Tensor -> (offset, size) expressions, and the arena size. ``bounds``: computed symbols
    -> their bounds, at which slots are sized (the arena is allocated before the run).
    ``aliases``: tensors that lie inside another (concat.py): they share their root's slot,
    which lives from the first write of any of them to the last use of any."""
    aliases = aliases or {}

    def need(t: str) -> Expr:
        return nbytes(procedure.alloc_sizes(bufs[t], bounds or {}))
    last_use: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for t in [*procedure.kernel_writes(k), *k.reads]:
            last_use[root(t, aliases)[0]] = i
    in_arena = {root(t, aliases)[0] for t in arena}
    scaled = _scaled(in_arena, bufs, bounds or {})
    placed, total = _slots(kernels, in_arena - set(scaled), need, last_use, aliases)
    sizes = {t: size for t, (_, size) in placed.items()}
    if total.is_const and all(v.is_const for v in sizes.values()):
        packed, end = _pack_by_size(kernels, sizes, last_use, aliases)
        if end < total.value:   # (never worse than the slots: the smaller of the two)
            placed = {t: (ex.const(packed[t]), sizes[t]) for t in sizes}
            total = ex.const(end)
    if scaled:   # after the rest, region by region
        regions, total = _pack_by_monomial(kernels, scaled, last_use, aliases, total)
        alone, alone_total = _slots(kernels, in_arena, need, last_use, aliases)
        if ex.value_at_one(total) <= ex.value_at_one(alone_total):
            placed.update(regions)
        else:   # (never larger at a batch of one than every tensor in slots)
            placed, total = alone, alone_total
    for t in arena:
        r, off = root(t, aliases)
        if r != t:   # its exact bytes: rounded up, the last part would pass its root's end
            item = dt.bits(bufs[t].dtype) // 8   # (concat.py aliases whole bytes only)
            placed[t] = (ex.simplify_size(placed[r][0] + ex.const(off * item)),
                         exact_bytes(bufs[t]))
    return placed, total


def _slots(kernels: list[Kernel], tensors: set[str], need, last_use: dict[str, int],
           aliases: dict) -> tuple[dict, Expr]:
    """``tensors`` (roots) in slots by liveness (_pick_slot): {tensor: (offset, size)} and the
    slots' total."""
    slots: list[_Slot] = []
    slot_of: dict[str, _Slot] = {}
    for i, k in enumerate(kernels):
        for t, s in slot_of.items():
            if last_use[t] < i and t in s.tenants and not s.free and s.tenants[-1] == t:
                s.free = True
        for t in procedure.kernel_writes(k):
            r = root(t, aliases)[0]
            if r in tensors and not (r != t and r in slot_of):
                s = _pick_slot(slots, need(r))
                s.free = False
                s.tenants.append(r)
                slot_of[r] = s
    offsets, total = {}, ex.const(0)
    for s in slots:
        offsets[id(s)] = total
        total = ex.simplify_size(total + s.size)
    return {t: (offsets[id(s)], need(t)) for t, s in slot_of.items()}, total


MIN_SCALED_BYTES = 1024   # bytes per unit of the symbols a tensor needs to pack scaled: each is
                          # rounded up to the alignment at a batch of one (4 bytes a row would
                          # take 64)


def _scaled(tensors: set[str], bufs: dict[str, Buffer], bounds: dict) -> dict:
    """{tensor: (symbols, bytes per unit of their product)} of the ``tensors`` whose exact size
    is a constant times a product of symbols (a dynamic batch's activations) and big enough
    (MIN_SCALED_BYTES)."""
    out = {}
    for t in tensors:
        mono = ex.monomial(exact_bytes(procedure.alloc_sizes(bufs[t], bounds)))
        if mono is not None and mono[0] and mono[1] >= MIN_SCALED_BYTES:
            out[t] = mono
    return out


def _pack_by_monomial(kernels: list[Kernel], scaled: dict, last_use: dict[str, int],
                      aliases: dict, base: Expr) -> tuple[dict, Expr]:
    """The ``scaled`` tensors (_scaled) of one product of symbols packed by size at that
    product's value of 1 (``_pack_by_size``), each at its offset there times the product:
    tensors apart at a batch of one stay apart at any batch. Each product gets its own region,
    from ``base`` on. Without this a dynamic batch gave every tensor of a distinct size its own
    slot, and each layer wrote memory no cache held (MobileNetV2: 17 MB an image, 6 MB
    packed). Returns ({tensor: (offset, size)}, the arena's end)."""
    groups: dict[tuple[str, ...], dict[str, Expr]] = {}
    for t, (syms, coeff) in scaled.items():
        groups.setdefault(syms, {})[t] = ex.const(-(-coeff // ARENA_ALIGN) * ARENA_ALIGN)
    placed, total = {}, base
    for syms in sorted(groups):
        sizes = groups[syms]
        scale = ex.product([ex.sym(s) for s in syms])
        packed, end = _pack_by_size(kernels, sizes, last_use, aliases)
        for t, at in packed.items():
            placed[t] = (ex.simplify_size(total + ex.const(at) * scale),
                         ex.simplify_size(sizes[t] * scale))
        total = ex.simplify_size(total + ex.const(end) * scale)
    return placed, total


def _pack_by_size(kernels: list[Kernel], sizes: dict[str, Expr], last_use: dict[str, int],
                  aliases: dict) -> tuple[dict[str, int], int]:
    """Constant sizes: each tensor at the lowest offset where it overlaps no tensor live at
    the same time, the largest placed first (the greedy-by-size planner of TensorFlow Lite).
    The slots above keep two big tensors that never live together apart when small ones
    sat in the slot one of them grew from; this packs them by what is live. Returns
    ({tensor: offset}, arena bytes)."""
    first: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for t in procedure.kernel_writes(k):
            first.setdefault(root(t, aliases)[0], i)
    span = {t: (first[t], max(last_use.get(t, first[t]), first[t])) for t in sizes}
    order = sorted(sizes, key=lambda t: (-sizes[t].value, span[t][0]))
    offset: dict[str, int] = {}
    for t in order:
        lo, hi = span[t]
        busy = sorted((offset[u], offset[u] + sizes[u].value) for u in offset
                      if span[u][0] <= hi and lo <= span[u][1])
        at = 0
        for a, b in busy:
            if at + sizes[t].value <= a:
                break
            at = max(at, b)
        offset[t] = at
    return offset, max((offset[t] + sizes[t].value for t in sizes), default=0)


def symbol_sources(g: Graph) -> tuple[list[str], list[dict]]:
    """The symbols in push order and where each input-bound one is read (procedures compute
    the others: procedure.computed_sources)."""
    syms = g.symbols()
    sources = []
    computed = procedure.computed_bounds(g)
    for s in syms:
        if s in computed:
            continue
        for i, p in enumerate(g.inputs):
            dims = g.types[p.name].dims
            axis = next((a for a, d in enumerate(p.layout)
                         if dims[d].op == "sym" and dims[d].arg == s), None)
            if axis is not None:
                sources.append({"symbol": s, "input": i, "axis": axis})
                break
        else:
            raise UnsupportedTargetError(
                f"cpu: size symbol ${s} is not the size of any input axis; the plan cannot bind it")
    return syms, sources


def workgroups(k: Kernel, out: Buffer, bufs: dict[str, Buffer] | None = None) -> Expr:
    """The dispatch's workgroup count as an expression (kernels.shared_units) for the rows *
    row_chunks units a row kernel shares out."""
    if isinstance(k, procedure.ProcedureKernel):   # sequential code: one workgroup
        return ex.const(1)
    if k.strategy == "transpose":   # a pack of B's N blocks (transpose.py)
        return transpose.workgroups(k, out)
    if k.gemm is not None:   # a gemm kernel shares out tiles (contraction.py)
        return contraction.workgroups(k, out)
    if isinstance(k, tiles.TileKernel):
        return k.workgroups(bufs)
    outer, _ = row_dim(out, k.blocked, k.points)
    rows = ex.product([*[out.sizes[d] for d in outer], ex.const(k.row_chunks)])
    work = ex.product([*out.sizes.values(), *k.rdims.values(), ex.const(k.window)])
    return shared_units(rows, work)


def make_plan(g: Graph, kernels: list[Kernel], bufs: dict[str, Buffer],
              output_owners: list[str], aliases: dict[str, tuple[str, int]] | None = None,
              raw: dict | None = None) -> tuple[dict, dict[str, np.ndarray], tuple[str, ...]]:
    """The plan dict and the weights (name -> array in its layout). ``aliases``: tensors placed
    inside others (concat.py). ``raw``: the constants of the graph the target was given (its
    own passes rewrite some), which are the weights, every one as it is (default: ``g``'s):
    so every target of a build, and the portable artifact, store the same weights archive.
    Kernels marked ``prepare`` run once when the engine opens the artifact (the plan's
    "prepare"), writing the tensors they compute from the weights (a packed B panel, a weight
    in another layout) into the packed region, which every run then reads. The third value
    names the weights beyond ``raw`` (made at build time: the AMX target's tiles)."""
    raw = g.constants if raw is None else raw
    syms, sources = symbol_sources(g)
    entries: list[dict] = []
    index: dict[str, int] = {}
    for i, p in enumerate(g.inputs):
        index[p.name] = len(entries)
        entries.append({"kind": "input", "index": i})
    shapes = procedure.output_shapes(g)   # outputs sized at run time: the runtime allocates
    for i, owner in enumerate(output_owners):
        index[owner] = len(entries)
        entries.append({"kind": "output", "index": i, **shapes.get(i, {})})
    used = {t for k in kernels for t in k.reads}
    prepare = [k for k in kernels if k.prepare]
    made = {k.out for k in prepare}
    weights = {name: np.ascontiguousarray(c.data) for name, c in raw.items()}
    extra: list[str] = []
    # (a weight the target's passes replaced in g is still read by what derives from it)
    for name, c in {**raw, **g.constants}.items():
        if name not in used or name in made:
            continue
        index[name] = len(entries)
        entries.append({"kind": "weight", "name": name})
        if not _same_constant(raw.get(name), c):   # made by the target's passes at build time
            weights[name] = np.ascontiguousarray(c.data)
            extra.append(name)
    # built by the gemm schedule at build time (the AMX target's tiles)
    for name, data in contraction.packed_weights(kernels).items():
        index[name] = len(entries)
        entries.append({"kind": "weight", "name": name})
        weights[name] = data
        extra.append(name)
    runs = [k for k in kernels if not k.prepare]
    packed_total = 0
    for k in prepare:
        size = exact_bytes(bufs[k.out])
        if not size.is_const:
            raise UnsupportedTargetError(f"cpu: {k.name} prepares {k.out} of size {size}, "
                                         "which is not a constant")
        index[k.out] = len(entries)
        entries.append({"kind": "packed", "name": k.out, "offset": packed_total,
                        "size": size.value})
        packed_total += -(-size.value // ARENA_ALIGN) * ARENA_ALIGN
    arena = [t for k in runs for t in procedure.kernel_writes(k) if t not in index]
    # a concatenation no kernel writes itself (concat.py), read whole by later kernels
    family = {t for a in (aliases or {}).items() for t in (a[0], a[1][0])}
    arena += [t for t in dict.fromkeys(t for k in runs for t in k.reads)
              if t in family and t not in arena and t not in index]
    placed, total = assign_arena(runs, arena, bufs, procedure.computed_bounds(g), aliases)
    for t in arena:
        off, size = placed[t]
        index[t] = len(entries)
        entries.append({"kind": "arena", "offset": encode_expr(off), "size": encode_expr(size)})

    def dispatch(i: int, k: Kernel) -> dict:
        return {"kernel": i, "workgroups": encode_expr(workgroups(k, bufs[k.out], bufs)),
                "bindings": [index[t] for t in procedure.kernel_bindings(k)]}
    dispatches = [dispatch(i, k) for i, k in enumerate(kernels) if not k.prepare]
    computed = procedure.computed_sources(g, kernels)
    plan = {"abi": 1, "symbols": syms, "symbol_sources": sources + computed, "buffers": entries,
            "arena_size": encode_expr(total), "arena_align": ARENA_ALIGN, "dispatches": dispatches}
    if computed or shapes:   # computed symbols and run-time output shapes: ABI 1.1
        plan["abi_minor"] = procedure.ABI_MINOR
    if prepare:   # ABI 1.4
        plan["prepare"] = [dispatch(i, k) for i, k in enumerate(kernels) if k.prepare]
        plan["packed_size"] = packed_total
        plan["abi_minor"] = max(plan.get("abi_minor", 0), PREPARE_ABI_MINOR)
    return plan, weights, tuple(extra)


def _same_constant(a, b) -> bool:
    """Whether constant ``b`` (the target's graph) is ``a`` (the graph it was given) unchanged."""
    return a is not None and (a is b or (a.layout == b.layout and a.data is b.data))
