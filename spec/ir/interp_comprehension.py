"""One comprehension evaluated by the NumPy interpreter, block by block.

An expression evaluates to a *labeled array*: data plus the loop variables its axes stand for,
so a subexpression is only ever as big as the variables it depends on (a bias read is a
vector, not a full output). A ``sum`` over a product runs as one ``np.einsum``. Reads at affine
indices are strided views of the tensor (spec/ir/views.py): no index arrays, no copies.

A comprehension whose body spans more than ``BLOCK_BYTES`` (its variables' extents multiplied,
at eight bytes an element) is evaluated over blocks of its output dims, outermost first, each
block's result written into its slice of the output (a map whose last operation is a float
ufunc computes straight into it: ``store``): the temporaries then stay a few MB
(reused by the allocator, in cache) instead of one array the size of the whole iteration space
per operation (hundreds of MB for a capsule layer's votes, each a fresh mapping the kernel has
to fault in and zero). A subexpression that depends on no blocked variable is computed once
and kept for every block. Each output element is computed from the same operands by the same
operations, blocked or not (a sum's terms may be added in another order).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from mlpack.spec.errors import IndexRangeError, InterpError
from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import views
from mlpack.spec.ir.expr import Expr, index_value
from mlpack.spec.ir.graph import Comprehension
from mlpack.spec.ir.origins import message as index_message
from mlpack.spec.ir.scalarops import apply_op, float_ufunc

# the largest iteration space (elements x 8 bytes) evaluated at once; larger ones go in blocks
BLOCK_BYTES = 32 << 20
# a padded read's lattice is read from a padded copy of its tensor only up to this growth
PAD_GROWTH = 4
# a max or min over at most this many elements per output (a pooling window) takes one
# elementwise maximum per element of the window (``_extreme``)
WINDOW_TAPS = 64


@dataclass
class LArr:
    data: np.ndarray
    vars: tuple[str, ...]


def align(parts: list[LArr]) -> tuple[list[np.ndarray], tuple[str, ...]]:
    """Broadcast labeled arrays against each other: axes in order of first appearance."""
    order: list[str] = []
    for p in parts:
        for v in p.vars:
            if v not in order:
                order.append(v)
    out = []
    for p in parts:
        if p.vars == tuple(order):
            out.append(p.data)
            continue
        present = [v for v in order if v in p.vars]
        data = np.transpose(p.data, [p.vars.index(v) for v in present]) if p.vars else p.data
        shape = [data.shape[present.index(v)] if v in p.vars else 1 for v in order]
        out.append(np.reshape(data, shape))
    return out, tuple(order)


def _laid_out(res: LArr, dims: tuple, dtype, shape) -> bool:
    """Whether ``res`` is an output of ``dims``, ``dtype`` and ``shape`` as it is laid out (its
    axes in that order, C-contiguous): then it is the output itself, not copied into one."""
    return res.vars == dims and res.data.dtype == dtype and res.data.flags.c_contiguous \
        and res.data.shape == tuple(shape)


class ComprehensionEval:
    """Evaluate one comprehension into an array over its output dims (``run``).

    ``tensors`` has ``data`` and ``layout`` by name (the interpreter's materialized tensors),
    ``syms`` the symbols' values, ``origins`` where each read's index came from (range errors
    name the ONNX node)."""

    def __init__(self, op: Comprehension, tensors, syms: dict[str, int],
                 origins: dict | None = None):
        self.op = op
        self.tensors = tensors
        self.syms = syms
        self.origins = origins or {}
        self.extent = {v: index_value(s, syms) for v, s in op.loop_dims.items()}
        for v, n in self.extent.items():
            if n < 0:
                raise InterpError(f"%{op.out}: dim {v} has negative size {n}")
        self.ranges = {v: (0, n) for v, n in self.extent.items()}   # this block's, per var
        self.blocked: frozenset[str] = frozenset()
        self.memo: dict[int, LArr] = {}          # by id: every node is in op.body, alive
        self.deps_of: dict[int, frozenset[str]] = {}
        self.forms: dict[int, list | None] = {}  # a read's affine index per axis
        self.padded: dict[int, tuple | None] = {}
        self.path = None                         # the einsum contraction order, found once
        # a map whose last operation is a float ufunc writes the output in place (``store``)
        body = op.body
        self.ufunc = None if op.reduce is not None or body.op in ("read", "const", "var", "sym") \
            else float_ufunc(body.op, op.type.dtype, [a.dtype for a in body.args])

    # ---- blocks

    def deps(self, e: Expr) -> frozenset[str]:
        """The loop variables ``e`` depends on."""
        hit = self.deps_of.get(id(e))
        if hit is None:
            hit = frozenset((e.arg,)) if e.op == "var" else \
                frozenset().union(*(self.deps(a) for a in e.args))
            self.deps_of[id(e)] = hit
        return hit

    def spaces(self) -> list[frozenset[str]]:
        """The variables of each array evaluating the body makes (a block's temporaries): every
        operation's result and gathered read, a read converted where it is read (the float64
        reference's weights), each factor of a sum of products (einsum copies a strided one
        into its batches: vgg19's 411 MB fc6 weight became 822 MB in float64, then a copy of
        that), and the reduction's result; not another affine read, which is a view, nor the
        product a sum of products hands to einsum."""
        op = self.op
        top = set(map(id, self._factors(op.body))) if op.reduce == "sum" else set()
        factors_only = op.reduce == "sum" and op.body.op == "mul"
        out, seen = [], set()

        def visit(e: Expr, chain: bool) -> None:
            if id(e) in seen or e.op in ("const", "sym"):
                return
            seen.add(id(e))
            if e.op == "read":
                index = dict(zip(e.arg[1], e.args))
                data = self.tensors.data.get(e.arg[0])
                converted = data is not None and not isinstance(data, np.ndarray)
                if converted or (factors_only and id(e) in top) or \
                        not all(views.affine(i, self.syms) is not None for i in index.values()):
                    out.append(self.deps(e))
                for a in e.args:
                    visit(a, False)
                return
            inner = chain and e.op == "mul" and id(e) not in top
            if not inner and not (e is op.body and self.ufunc is not None):   # (the output)
                out.append(self.deps(e))
            for a in e.args:
                visit(a, inner)

        visit(op.body, factors_only)
        # (a recursive closure is a reference cycle, with self in it: until the cycle
        # collector ran, every evaluator kept its memo, a block's temporaries, alive: 450 MB
        # of Whisper's float64 reference)
        visit = None
        if op.reduce is not None:
            out.append(self.deps(op.body) - op.rdims.keys())
        return out

    def blocks(self) -> list[tuple[str, int]]:
        """(output dim, block size) for each blocked dim, outermost first: the fewest that bring
        the largest temporary of a block under BLOCK_BYTES."""
        spaces = self.spaces()
        size = dict(self.extent)

        def nbytes(space) -> float:
            return 8 * float(np.prod([size[v] for v in space], dtype=np.float64))

        out = []
        for d in self.op.type.dims:
            worst = max(spaces, key=nbytes, default=frozenset())
            if nbytes(worst) <= BLOCK_BYTES:
                break
            if d not in worst or size[d] <= 1:
                continue
            per = nbytes(worst) / size[d]
            size[d] = min(size[d], max(1, int(BLOCK_BYTES // per)))
            out.append((d, size[d]))
        return out

    def run(self) -> np.ndarray:
        op = self.op
        out_dims = tuple(op.type.dims)
        shape = [self.extent[d] for d in out_dims]
        np_dtype = dt.to_numpy(op.type.dtype)
        if 0 in shape:
            return np.zeros(shape, dtype=np_dtype)
        if op.reduce is None and op.body.op == "read":   # a copy that moves nothing: shared
            res = self.view(op.body)
            if res is not None and _laid_out(res, out_dims, np_dtype, shape):
                return res.data
        blocks = self.blocks()
        self.blocked = frozenset(d for d, _ in blocks)
        if not blocks and self.ufunc is None:   # one block: a result already in the output's
            # form is the output (a ufunc's map stores into it below, as one block)
            # (copying a float64 reference's attention scores took Whisper's a third)
            res = self.compute()
            if _laid_out(res, out_dims, np_dtype, shape):
                return res.data
            out = np.empty(shape, dtype=np_dtype)
            self.arrange(res, out, tuple(slice(0, n) for n in shape))
            return out
        out = np.empty(shape, dtype=np_dtype)
        for starts in itertools.product(*(range(0, self.extent[d], size) for d, size in blocks)):
            for (d, size), s in zip(blocks, starts):
                self.ranges[d] = (s, min(size, self.extent[d] - s))
            if blocks:   # what depends on a blocked variable is this block's alone
                self.memo = {k: v for k, v in self.memo.items()
                             if not self.deps_of[k] & self.blocked}
            where = tuple(slice(self.ranges[d][0], sum(self.ranges[d])) for d in out_dims)
            if self.ufunc is not None:
                self.store(out, where)
            else:
                self.arrange(self.compute(), out, where)
        return out

    def store(self, out: np.ndarray, where: tuple) -> None:
        """Apply the body's last operation (``self.ufunc``) with ``out[where]`` as its result:
        no temporary the size of the block, and no copy of one into the output (blocked
        attention scores' copies were a third of Whisper's float64 reference)."""
        arrays, labels = align([self.eval(a) for a in self.op.body.args])
        out_dims = tuple(self.op.type.dims)
        missing = tuple(d for d in out_dims if d not in labels)
        arrays = [np.reshape(a, np.shape(a) + (1,) * (len(labels) + len(missing) - np.ndim(a)))
                  for a in arrays]
        dest = np.transpose(out[where + (...,)], [out_dims.index(d) for d in labels + missing])
        with np.errstate(all="ignore"):
            self.ufunc(*arrays, out=dest)

    def arrange(self, res: LArr, out: np.ndarray, where: tuple) -> None:
        """Store ``res`` into ``out[where]``: broadcast over the output dims the body does not
        depend on, axes in the output's order, converted to its dtype."""
        out_dims = tuple(self.op.type.dims)
        data, labels = res.data, res.vars
        missing = [d for d in out_dims if d not in labels]
        if missing:
            data = np.reshape(data, data.shape + (1,) * len(missing))
            labels = labels + tuple(missing)
        data = np.transpose(data, [labels.index(d) for d in out_dims])
        with np.errstate(all="ignore"):
            out[where] = np.broadcast_to(data, [self.ranges[d][1] for d in out_dims])

    def compute(self) -> LArr:
        op = self.op
        if op.reduce is None:
            return self.eval(op.body)
        if op.reduce == "sum" and op.body.op == "mul" and dt.is_float(op.type.dtype):
            return self.einsum()
        return self.reduce()

    # ---- expressions

    def eval(self, e: Expr) -> LArr:
        key = id(e)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.deps(e)
        out = self._eval(e)
        self.memo[key] = out
        return out

    def _eval(self, e: Expr) -> LArr:
        op = e.op
        if op == "const":
            return LArr(np.asarray(e.arg, dtype=dt.to_numpy(e.dtype)), ())
        if op == "var":
            if e.arg not in self.extent:
                raise InterpError(f"%{self.op.out}: unbound variable {e.arg}")
            lo, n = self.ranges[e.arg]
            return LArr(np.arange(lo, lo + n, dtype=np.int64), (e.arg,))
        if op == "sym":
            return LArr(np.asarray(index_value(e, self.syms), dtype=np.int64), ())
        if op == "read":
            return self.read(e)
        parts = [self.eval(a) for a in e.args]
        arrays, labels = align(parts)
        return LArr(apply_op(op, arrays, e.dtype, [a.dtype for a in e.args]), labels)

    def operand(self, e: Expr) -> tuple[np.ndarray, tuple[str, ...], dict[str, Expr]]:
        """A read's tensor, its layout and the index of each of its dims."""
        name, dims, _ = e.arg
        if name not in self.tensors.data:
            raise InterpError(f"%{self.op.out}: read of %{name}, which has no value")
        layout = self.tensors.layout[name]
        index = dict(zip(dims, e.args))
        if set(index) != set(layout):
            raise InterpError(f"%{self.op.out}: read of %{name} gives dims {sorted(index)}, "
                              f"the tensor has {sorted(layout)}")
        return self.tensors.data[name], layout, index

    def read(self, e: Expr) -> LArr:
        view = self.view(e)
        if view is not None:
            return view
        name, _, pad = e.arg
        data, layout, index = self.operand(e)
        parts = [self.eval(index[d]) for d in layout]
        arrays, labels = align(parts)
        arrays = [np.asarray(a).astype(np.int64, copy=False) for a in arrays]
        if pad is None:
            for d, a, n in zip(layout, arrays, data.shape):
                bad = (a < 0) | (a >= n)
                if bad.any():   # the first bad index, as the C interpreter meets it
                    v = int(np.broadcast_to(a, bad.shape)[bad].flat[0])
                    raise IndexRangeError(index_message(name, d, v, n, self.origins.get((name, d))))
            return LArr(data[tuple(arrays)], labels)
        mask = None
        clipped = []
        for a, n in zip(arrays, data.shape):
            ok = (a >= 0) & (a < n)
            mask = ok if mask is None else mask & ok
            clipped.append(np.clip(a, 0, max(n - 1, 0)))
        if data.size == 0:
            shape = np.broadcast_shapes(*[a.shape for a in arrays]) if arrays else ()
            return LArr(np.full(shape, pad, dtype=data.dtype), labels)
        vals = data[tuple(clipped)]
        if mask is None:
            return LArr(vals, labels)
        return LArr(np.where(mask, vals, np.asarray(pad, dtype=data.dtype)), labels)

    def view(self, e: Expr) -> LArr | None:
        """The read ``e`` as a strided view (spec/ir/views.py), or None for the general path."""
        key = id(e)
        data, layout, index = self.operand(e)
        pad = e.arg[2]
        if key not in self.forms:
            forms = [views.affine(index[d], self.syms) for d in layout]
            ok = all(f is not None and set(f[1]) <= self.extent.keys() for f in forms)
            self.forms[key] = forms if ok else None
        forms = self.forms[key]
        if forms is None or data.size == 0 or any(n == 0 for _, n in self.ranges.values()):
            return None
        if views.in_range(forms, data.shape, self.ranges):
            return LArr(*views.lattice(data, forms, self.ranges))
        if pad is None:
            return None   # the general path raises the range error
        if key not in self.padded:
            full = {v: (0, n) for v, n in self.extent.items()}
            margins = views.overhang(forms, data.shape, full)
            grown = np.prod([n + a + b for n, (a, b) in zip(data.shape, margins)],
                            dtype=np.float64)
            self.padded[key] = None if grown > PAD_GROWTH * data.size + (1 << 16) else (
                np.pad(data, margins, constant_values=np.asarray(pad, dtype=data.dtype)),
                margins)
        if self.padded[key] is None:
            return None
        padded, margins = self.padded[key]
        return LArr(*views.lattice(padded, views.shifted(forms, margins), self.ranges))

    # ---- reductions

    def _factors(self, e: Expr) -> list[Expr]:
        if e.op == "mul" and e.dtype == self.op.type.dtype:
            return self._factors(e.args[0]) + self._factors(e.args[1])
        return [e]

    def einsum(self) -> LArr:
        op = self.op
        factors = [self.eval(f) for f in self._factors(op.body)]
        if len(factors) == 2:
            # NumPy's GEMM path lays its result out as the batch dims, then one operand's own
            # dims, then the other's (which one first: ``_gemm_leads``), transposed to the
            # spec: the factors go in the order that lands the result as the output is laid
            # out, not to be copied into it (Whisper's attention scores)
            a, b = factors
            dims = tuple(op.type.dims)
            first = [min((dims.index(v) for v in f.vars if v in dims and v not in g.vars),
                         default=len(dims))
                     for f, g in ((a, b), (b, a))]
            if (first[1] < first[0]) == (_gemm_leads() == 0):
                factors = [b, a]
        labels: list[str] = []
        for f in factors:
            for v in f.vars:
                if v not in labels:
                    labels.append(v)
        if len(labels) > 52:
            return self.reduce()
        letters = {v: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26)
                   for i, v in enumerate(labels)}
        # the output's own dims order first: the sum then lands as the output is laid out
        kept = [v for v in labels if v not in op.rdims]
        out = [d for d in op.type.dims if d in kept] + [v for v in kept if v not in op.type.dims]
        spec = ",".join("".join(letters[v] for v in f.vars) for f in factors)
        spec += "->" + "".join(letters[v] for v in out)
        acc = np.float64 if op.type.dtype == "f64" else np.float32
        arrays = [f.data.astype(acc, copy=False) for f in factors]
        size = dict(zip(labels, [1] * len(labels)))
        for f, a in zip(factors, arrays):
            size.update(zip(f.vars, a.shape))
        full = np.prod(list(size.values()), dtype=np.float64)
        if max(a.size for a in arrays) * 4 >= full:
            # an operand spans (nearly) the whole space: a weighted sum, no contraction to
            # reorder; einsum's own loop does it in one pass (its GEMM paths would copy the
            # operands into batches first, ten times slower), fastest with the small factors
            # multiplied together first (its loop slows down with every operand it walks)
            small = [i for i, a in enumerate(arrays) if a.size * 4 < full]
            if len(small) > 1:
                part, names = align([LArr(arrays[i], factors[i].vars) for i in small])
                prod = part[0]
                for p in part[1:]:
                    prod = prod * p
                keep = [i for i in range(len(arrays)) if i not in small]
                arrays = [arrays[i] for i in keep] + [prod]
                subs = [factors[i].vars for i in keep] + [names]
                spec = ",".join("".join(letters[v] for v in s) for s in subs) + \
                    "->" + "".join(letters[v] for v in out)
            data = np.einsum(spec, *arrays, optimize=False)
        else:
            if self.path is None or self.path[0] != spec:
                self.path = (spec, np.einsum_path(spec, *arrays, optimize="greedy")[0])
            data = np.einsum(spec, *arrays, optimize=self.path[1])
        # A reduction dim no factor depends on multiplies the sum by its extent.
        for r in op.rdims:
            if r not in labels:
                data = data * self.extent[r]
        return LArr(np.asarray(data), tuple(out))

    def reduce(self) -> LArr:
        op = self.op
        body = self.eval(op.body)
        data, labels = body.data, body.vars
        rd = list(op.rdims)
        missing = [r for r in rd if r not in labels]
        if missing:
            data = np.broadcast_to(np.reshape(data, data.shape + (1,) * len(missing)),
                                   data.shape + tuple(self.extent[r] for r in missing))
            labels = labels + tuple(missing)
        axes = tuple(labels.index(r) for r in rd)
        keep = tuple(v for v in labels if v not in op.rdims)
        dtype = op.type.dtype
        kind = op.reduce
        with np.errstate(all="ignore"):
            if kind in ("sum", "prod"):
                acc = (np.float32 if dtype in ("f16", "bf16") else dt.to_numpy(dtype))
                f = np.sum if kind == "sum" else np.prod
                out = f(data, axis=axes, dtype=acc)
            elif kind in ("max", "min"):
                init = dt.lowest(dtype) if kind == "max" else dt.highest(dtype)
                out = _extreme(data, axes, kind, init)
            else:
                if len(axes) != 1:
                    raise InterpError(f"%{op.out}: {kind} needs exactly one reduction dim")
                ax = axes[0]
                if data.shape[ax] == 0:
                    raise InterpError(f"%{op.out}: {kind} over an empty dim")
                f = np.argmax if kind.startswith("argmax") else np.argmin
                if kind.endswith("_last"):
                    flipped = np.flip(data, axis=ax)
                    out = data.shape[ax] - 1 - f(flipped, axis=ax)
                else:
                    out = f(data, axis=ax)
        return LArr(np.asarray(out), keep)


@functools.cache
def _gemm_leads() -> int:
    """Which operand's own dims NumPy's einsum lays out first in a batched product's result
    (0 or 1): an implementation detail that differs between NumPy versions, so measured once
    on a tiny product."""
    a, b = np.ones((2, 3, 4)), np.ones((2, 5, 4))
    product = np.einsum("nik,njk->nij", a, b, optimize=["einsum_path", (0, 1)])
    return 0 if product.flags.c_contiguous else 1


def _extreme(data: np.ndarray, axes: tuple[int, ...], kind: str, init):
    """The max (or min) of ``data`` over ``axes``, at least ``init`` (at most, for a min). Over
    a window's few taps (a pooling: ``data`` a strided view of its input), numpy's reduction
    walks the taps innermost, element by element; one elementwise maximum per tap over all the
    outputs is 8x faster (GoogLeNet's 3x3 poolings took 0.79 s of its float64 reference's
    1.8 s). Exact in any order, as a sum would not be."""
    ufunc = np.maximum if kind == "max" else np.minimum
    taps = 1
    for a in axes:
        taps *= data.shape[a]
    if not 0 < taps <= WINDOW_TAPS or len(axes) == data.ndim:
        return ufunc.reduce(data, axis=axes, initial=init)   # (np.max, np.min)
    moved = np.moveaxis(data, axes, tuple(range(len(axes))))
    out = None
    for tap in np.ndindex(*moved.shape[:len(axes)]):
        out = np.array(moved[tap]) if out is None else ufunc(out, moved[tap], out=out)
    return ufunc(out, init, out=out)
