"""Weights the cpu target's passes compute from the model's own: how each is made at load.

A container stores the model's weights once, as the model has them, in one archive every
artifact of a precision shares (spec/SPEC.md section 7, kernel ABI 1.4). A pass of the cpu
target that wants a weight in another form (layout.py stores a depthwise convolution's weights
channels last; winograd.py folds a 3-tap window into six points) still adds a constant, with its
data computed at build time, so every later pass and schedule sees a constant as before; and it
records here, with ``add``, how that constant is computed from the weights: a comprehension over
them. The plan stores none of its data: a prepare kernel (a GEMM panel's) that reads it computes
it in place from the weights (``inline``), and ``kernels`` makes each one that a run's kernel
reads a prepare kernel of its own, which computes it into the artifact's packed region when
the engine opens the artifact (plan.py). ``tests/codegen/targets/cpu/test_derived.py`` checks each
recipe against the data computed at build time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlpack.spec.ir.graph import Comprehension, Constant, Graph, TensorType
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel


def add(derived: dict | None, constants: dict, types: dict, op: Comprehension,
        layout: tuple[str, ...], data: np.ndarray) -> None:
    """Add the constant ``op.out`` (of ``op.type``, ``data`` in ``layout``) to ``constants`` and
    ``types``, and record ``op``, a comprehension over the weights, as how to compute it
    (``derived``: the record, {name: comprehension}; None keeps only the data)."""
    constants[op.out] = Constant(op.out, op.type, tuple(layout), np.ascontiguousarray(data))
    types[op.out] = op.type
    if derived is not None:
        derived[op.out] = op


def relaid(g: Graph, name: str, new: str, layout: tuple[str, ...], derived: dict | None) -> Graph:
    """``g`` with constant ``new``: constant ``name`` stored in ``layout`` (a permutation of its
    own; reads index dims by name, so only the memory order differs)."""
    const = g.constants[name]
    order = [const.layout.index(d) for d in layout]
    constants, types = dict(g.constants), dict(g.types)
    body = _identity(name, const.type)
    add(derived, constants, types, Comprehension(new, const.type, body), layout,
        np.transpose(const.data, order))
    return replace(g, constants=constants, types=types)


def _identity(name: str, t: TensorType):
    from mlpack.spec.ir import expr as ex

    return ex.read(name, {d: ex.var(d) for d in t.dims}, t.dtype)


def inline(derived: dict, kernels: list[Kernel], bufs: dict[str, Buffer], source: Graph) -> None:
    """Compute the recorded constants that prepare kernels read (a GEMM panel of Winograd's
    folded weights) inside those kernels, from the weights, instead of storing them first: the
    packed region then holds only what the runs read. Each recorded constant is a map, linear
    in the weights (a relayout, a fold), so where a guarded read of one is out of bounds (a
    panel's padding columns) reading its weights guarded gives the pad, zero, too."""
    for k in kernels:
        if k.prepare:
            k.body = _inlined(k.body, derived)
            k.reads = [t for t in dict.fromkeys(_reads(k.body)) if t != k.out]
            _weight_buffers(k.reads, bufs, source)


def _weight_buffers(names, bufs: dict[str, Buffer], source: Graph) -> None:
    """A buffer for each weight of ``names`` a pass has dropped from the graph since
    (Winograd's 3-tap weights, which only what derives from them reads now)."""
    for t in names:
        c = source.constants.get(t)
        if t not in bufs and c is not None:
            bufs[t] = Buffer(t, tuple(c.layout), dict(c.type.dims), c.type.dtype)


def _inlined(e, derived: dict):
    from mlpack.spec.ir import expr as ex

    op = derived.get(e.arg[0]) if e.op == "read" else None
    if op is not None and op.reduce is None and e.arg[2] in (None, 0, 0.0):
        index = dict(zip(e.arg[1], e.args))
        body = ex.substitute(op.body, {d: index[d] for d in op.type.dims})
        if e.arg[2] is not None:
            body = _guarded(body)
        return _inlined(body, derived)
    if not e.args:
        return e
    args = tuple(_inlined(a, derived) for a in e.args)
    return e if args == e.args else ex.rebuild(e, args)


def _guarded(e):
    """``e`` with every read guarded: zero where out of bounds."""
    from mlpack.spec.ir import expr as ex

    args = tuple(_guarded(a) for a in e.args)
    if e.op == "read":
        return ex.read(e.arg[0], dict(zip(e.arg[1], args)), e.dtype, 0)
    return e if args == e.args else ex.rebuild(e, args)


def _reads(e) -> list[str]:
    from mlpack.codegen.targets.cpu.kernels import tensors_read

    return tensors_read(e)


def kernels(derived: dict, g: Graph, bufs: dict[str, Buffer], reads: set[str],
            source: Graph) -> list[Kernel]:
    """The prepare kernels of the recorded constants that ``reads`` (what the kernels read)
    names, and of those they are computed from in turn, each before its readers. ``source``:
    the graph the target was given, whose constants (the weights) they read."""
    from mlpack.codegen.targets.cpu.kernels import inline_scalar_constants, schedule, tensors_read

    wanted: list[str] = []

    def want(name: str) -> None:
        if name in derived and name not in wanted:
            for t in tensors_read(derived[name].body):
                want(t)
            wanted.append(name)
    for name in sorted(reads & set(derived)):
        want(name)
    out = []
    for name in wanted:
        op = derived[name]
        _weight_buffers(tensors_read(op.body), bufs, source)
        k = Kernel(f"derive_{name}", name, inline_scalar_constants(g, op.body), op.reduce,
                   dict(op.rdims), op.type.dtype, fused=[name], prepare=True)
        k.reads = [t for t in tensors_read(k.body) if t != name]
        schedule(k, bufs[name], bufs)
        out.append(k)
    return out


__all__ = ["add", "relaid", "inline", "kernels"]
