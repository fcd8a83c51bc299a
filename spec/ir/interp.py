"""The NumPy reference interpreter: what an IR graph means.

Every pass and every target is tested against this. It evaluates an expression to a *labeled
array*: data plus the loop variables its axes stand for, so a subexpression is only ever as big
as the variables it depends on (a bias read is a vector, not a full output). A ``sum`` over a
product of reads runs as one ``np.einsum``, which keeps convolutions and matmuls practical.
Procedures are executed statement by statement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import (Comprehension, For, Graph, If, Let, Procedure, SetSize, Store,
                                  While, tensors_read)
from mlpack.spec.ir.expr import index_value
from mlpack.spec.errors import IndexRangeError, InterpError
from mlpack.spec.ir.origins import message as index_message


def _affine_index(e: Expr) -> tuple[dict[str, int], int] | None:
    """``e`` as ({var: coefficient}, constant) when it is integer-affine in loop variables."""
    if e.op == "var":
        return {e.arg: 1}, 0
    if e.op == "const":
        return ({}, int(e.arg)) if isinstance(e.arg, (int, np.integer)) and \
            not isinstance(e.arg, bool) else None
    if e.op in ("add", "sub") and len(e.args) == 2:
        a, b = _affine_index(e.args[0]), _affine_index(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        coeffs = dict(a[0])
        for v, c in b[0].items():
            coeffs[v] = coeffs.get(v, 0) + sign * c
        return {v: c for v, c in coeffs.items() if c}, a[1] + sign * b[1]
    if e.op == "mul" and len(e.args) == 2:
        a, b = _affine_index(e.args[0]), _affine_index(e.args[1])
        if a is None or b is None or (a[0] and b[0]):
            return None
        (coeffs, c0), k = (a, b[1]) if a[0] else (b, a[1])
        return {v: c * k for v, c in coeffs.items() if c * k}, c0 * k
    return None


@dataclass
class LArr:
    data: np.ndarray
    vars: tuple[str, ...]


def _align(parts: list[LArr]) -> tuple[list[np.ndarray], tuple[str, ...]]:
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


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _int_div(a, b):
    """C-style truncating integer division (what ONNX Div does on integers)."""
    with np.errstate(all="ignore"):
        b_safe = np.where(b == 0, 1, b)
        q = np.floor_divide(a, b_safe)
        r = a - q * b_safe
        q = q + ((r != 0) & ((a < 0) != (b_safe < 0)))
        return np.where(b == 0, 0, q)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _int_floor(f):
    """Python // and % on integers, 0 for a zero divisor."""
    def rule(a, b, dtype):
        b_safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, f(a, b_safe))
    return rule


def _int_pow(a, b, dtype):
    return np.power(a.astype(np.float64), b.astype(np.float64))


def _shift(f):
    """Shifts by the width or more give 0 (NumPy's wrap the amount)."""
    def rule(a, b, dtype):
        w = dt.bits(dtype)
        out = f(a, np.minimum(b, w - 1).astype(a.dtype))
        return np.where(b >= w, 0, out)
    return rule


# One rule per op of spec/ir/expr.py's UNARY and BINARY (a NumPy function of the operands), with
# the integer rules that differ from it in _INT_* (shifts are integer only).
# tests/codegen/test_scalar_ops.py holds these tables, the C interpreter's and the LLVM
# lowering's (codegen/llvm/oprules.py) equal to the IR's ops.
_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "sign": np.sign, "not": np.logical_not, "bitnot": np.invert,
    "isnan": np.isnan, "isinf": np.isinf, "recip": np.reciprocal, "sigmoid": _sigmoid,
}
_INT_UNARY = {"recip": lambda x: _int_div(np.ones_like(x), x)}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "fmod": np.fmod, "pow": np.power,
    "max": np.maximum, "min": np.minimum,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "atan2": np.arctan2,
}
_INT_BINARY = {   # (a, b, dtype)
    "div": lambda a, b, dtype: _int_div(a, b), "pow": _int_pow,
    "floordiv": _int_floor(np.floor_divide), "mod": _int_floor(np.mod),
    "shl": _shift(np.left_shift), "shr": _shift(np.right_shift),
}
# ops computed in the node's dtype when the operands' promoted dtype differs from it
_IN_RESULT_DTYPE = ("add", "sub", "mul", "max", "min", "pow", "atan2")


def apply_op(op: str, args: list, dtype: str, arg_dtypes: list[str]):
    """Apply a scalar op elementwise to NumPy values, giving the node's dtype."""
    np_dtype = dt.to_numpy(dtype)
    with np.errstate(all="ignore"):
        if op in _UNARY:
            rule = (_INT_UNARY.get(op) if dt.is_int(arg_dtypes[0]) else None) or _UNARY[op]
            return np.asarray(rule(args[0])).astype(np_dtype, copy=False)
        if op in _INT_BINARY and dt.is_int(dtype):
            return np.asarray(_INT_BINARY[op](*args, dtype)).astype(np_dtype, copy=False)
        if op in _BINARY:
            a, b = args
            if op in _IN_RESULT_DTYPE and dt.promote(*arg_dtypes) != dtype:
                a, b = a.astype(np_dtype), b.astype(np_dtype)
            return np.asarray(_BINARY[op](a, b)).astype(np_dtype, copy=False)
        if op == "select":
            c, a, b = args
            return np.where(c, a, b).astype(np_dtype, copy=False)
        if op == "cast":
            x = np.asarray(args[0])
            if dtype == "bool":
                return x != 0
            if dt.is_int(dtype) and dt.is_float(arg_dtypes[0]):
                x = np.where(np.isfinite(x), x, 0)
            return x.astype(np_dtype)
    raise InterpError(f"the interpreter has no rule for op {op!r}")


class _Tensors:
    """Materialized tensors: data stored with axes in ``layout`` order."""

    def __init__(self):
        self.data: dict[str, np.ndarray] = {}
        self.layout: dict[str, tuple[str, ...]] = {}

    def put(self, name, data, layout):
        self.data[name] = data
        self.layout[name] = tuple(layout)


class _Comprehension:
    """Evaluate one comprehension into an array over its output dims."""

    def __init__(self, op: Comprehension, tensors: _Tensors, syms: dict[str, int],
                 origins: dict | None = None):
        self.op = op
        self.tensors = tensors
        self.syms = syms
        self.origins = origins or {}
        self.extent = {v: index_value(s, syms) for v, s in op.loop_dims.items()}
        for v, n in self.extent.items():
            if n < 0:
                raise InterpError(f"%{op.out}: dim {v} has negative size {n}")
        self.memo: dict[int, LArr] = {}

    def eval(self, e: Expr) -> LArr:
        key = id(e)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        out = self._eval(e)
        self.memo[key] = out
        self._keep = getattr(self, "_keep", [])
        self._keep.append(e)  # keep e alive so its id stays unique
        return out

    def _eval(self, e: Expr) -> LArr:
        op = e.op
        if op == "const":
            return LArr(np.asarray(e.arg, dtype=dt.to_numpy(e.dtype)), ())
        if op == "var":
            if e.arg not in self.extent:
                raise InterpError(f"%{self.op.out}: unbound variable {e.arg}")
            return LArr(np.arange(self.extent[e.arg], dtype=np.int64), (e.arg,))
        if op == "sym":
            return LArr(np.asarray(index_value(e, self.syms), dtype=np.int64), ())
        if op == "read":
            return self._read(e)
        parts = [self.eval(a) for a in e.args]
        arrays, labels = _align(parts)
        return LArr(apply_op(op, arrays, e.dtype, [a.dtype for a in e.args]), labels)

    def _read(self, e: Expr) -> LArr:
        name, dims, pad = e.arg
        if name not in self.tensors.data:
            raise InterpError(f"%{self.op.out}: read of %{name}, which has no value")
        data = self.tensors.data[name]
        layout = self.tensors.layout[name]
        index = dict(zip(dims, e.args))
        if set(index) != set(layout):
            raise InterpError(f"%{self.op.out}: read of %{name} gives dims {sorted(index)}, "
                              f"the tensor has {sorted(layout)}")
        # Fast path: every index a distinct plain variable spanning the dim, or a constant.
        basic, labels, used = [], [], set()
        for d, n in zip(layout, data.shape):
            ix = index[d]
            if ix.op == "var" and ix.arg not in used and self.extent.get(ix.arg) == n:
                basic.append(slice(None)); labels.append(ix.arg); used.add(ix.arg)
            elif ix.op == "const" and 0 <= ix.arg < n:
                basic.append(ix.arg)
            else:
                break
        else:
            return LArr(data[tuple(basic)], tuple(labels))
        window = self._window(data, layout, index, pad)
        if window is not None:
            return window
        parts = [self.eval(index[d]) for d in layout]
        arrays, labels = _align(parts)
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

    def _window(self, data, layout, index: dict, pad) -> LArr | None:
        """A read whose every index is a sum of distinct loop variables with positive constant
        coefficients plus a constant (a convolution's ``2*h + kh - 1``), as a strided view of
        the data (zero-padded by the read's pad where the window reaches outside): the values
        the general gather below would give, without gathering them. None when the read is not
        of that form, or leaves the data with no pad to give (the gather raises then)."""
        affs = []
        used: set[str] = set()
        for d in layout:
            aff = _affine_index(index[d])
            if aff is None:
                return None
            for v, a in aff[0].items():
                if v in used or a <= 0 or self.extent.get(v, 0) < 1:
                    return None
                used.add(v)
            affs.append(aff)
        starts, before, after = [], [], []
        for (coeffs, c0), n in zip(affs, data.shape):
            top = c0 + sum(a * (self.extent[v] - 1) for v, a in coeffs.items())
            before.append(max(0, -c0))
            after.append(max(0, top - (n - 1)))
            starts.append(c0 + before[-1])
        if any(before) or any(after):
            if pad is None:
                return None
            data = np.pad(np.asarray(data), list(zip(before, after)),
                          constant_values=np.asarray(pad, dtype=data.dtype))
        base = np.asarray(data[tuple(slice(s, None) for s in starts)])
        shape, strides, labels = [], [], []
        for (coeffs, _), step in zip(affs, base.strides):
            for v, a in coeffs.items():
                shape.append(self.extent[v])
                strides.append(a * step)
                labels.append(v)
        view = np.lib.stride_tricks.as_strided(base, shape, strides, writeable=False)
        return LArr(view, tuple(labels))

    def run(self) -> np.ndarray:
        op = self.op
        out_dims = tuple(op.type.dims)
        np_dtype = dt.to_numpy(op.type.dtype)
        if any(self.extent[d] == 0 for d in out_dims):
            return np.zeros([self.extent[d] for d in out_dims], dtype=np_dtype)
        if op.reduce is None:
            res = self.eval(op.body)
        elif op.reduce == "sum" and op.body.op == "mul" and dt.is_float(op.type.dtype):
            res = self._einsum()
        else:
            res = self._reduce()
        data, labels = res.data, res.vars
        # Broadcast over output dims the body does not depend on, then order as the type.
        missing = [d for d in out_dims if d not in labels]
        if missing:
            data = np.reshape(data, data.shape + (1,) * len(missing))
            labels = labels + tuple(missing)
        data = np.transpose(data, [labels.index(d) for d in out_dims])
        data = np.broadcast_to(data, [self.extent[d] for d in out_dims])
        with np.errstate(all="ignore"):
            data = data.astype(np_dtype, copy=False)
            # ascontiguousarray makes 0-d arrays 1-d: keep the shape
            return np.ascontiguousarray(data).reshape(data.shape)

    def _factors(self, e: Expr) -> list[Expr]:
        if e.op == "mul" and e.dtype == self.op.type.dtype:
            return self._factors(e.args[0]) + self._factors(e.args[1])
        return [e]

    def _einsum(self) -> LArr:
        op = self.op
        factors = [self.eval(f) for f in self._factors(op.body)]
        labels: list[str] = []
        for f in factors:
            for v in f.vars:
                if v not in labels:
                    labels.append(v)
        letters = {v: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, v in enumerate(labels)}
        if len(labels) > 52:
            return self._reduce()
        out = [v for v in labels if v not in op.rdims]
        spec = ",".join("".join(letters[v] for v in f.vars) for f in factors)
        spec += "->" + "".join(letters[v] for v in out)
        acc = np.float64 if op.type.dtype == "f64" else np.float32
        data = np.einsum(spec, *[f.data.astype(acc, copy=False) for f in factors], optimize=True)
        # A reduction dim no factor depends on multiplies the sum by its extent.
        for r in op.rdims:
            if r not in labels:
                data = data * self.extent[r]
        return LArr(np.asarray(data), tuple(out))

    def _reduce(self) -> LArr:
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
                f = np.max if kind == "max" else np.min
                out = f(data, axis=axes, initial=init)
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


class _Procedure:
    """Execute a procedure's statements with scalar locals."""

    def __init__(self, op: Procedure, tensors: _Tensors, syms: dict[str, int],
                 origins: dict | None = None):
        self.op, self.tensors, self.syms = op, tensors, syms
        self.origins = origins or {}
        self.locals: dict[str, object] = {}

    def value(self, e: Expr):
        op = e.op
        if op == "const":
            return np.asarray(e.arg, dtype=dt.to_numpy(e.dtype))
        if op == "var":
            try:
                return self.locals[e.arg]
            except KeyError:
                raise InterpError(f"procedure: unbound variable {e.arg}") from None
        if op == "sym":
            return np.int64(index_value(e, self.syms))
        if op == "read":
            name, dims, pad = e.arg
            data, layout = self.tensors.data[name], self.tensors.layout[name]
            index = {d: int(self.value(a)) for d, a in zip(dims, e.args)}
            pos = tuple(index[d] for d in layout)
            if any(not 0 <= p < n for p, n in zip(pos, data.shape)):
                if pad is not None:
                    return np.asarray(pad, dtype=data.dtype)
                raise self._range_error(name, layout, pos, data.shape, "read of")
            return data[pos]
        vals = [self.value(a) for a in e.args]
        return apply_op(op, [np.asarray(v) for v in vals], e.dtype, [a.dtype for a in e.args])

    def exec(self, stmts):
        for s in stmts:
            if isinstance(s, Let):
                self.locals[s.name] = self.value(s.value)
            elif isinstance(s, Store):
                data, layout = self.tensors.data[s.tensor], self.tensors.layout[s.tensor]
                pos = tuple(int(self.value(s.index[d])) for d in layout)
                if any(not 0 <= p < n for p, n in zip(pos, data.shape)):
                    raise self._range_error(s.tensor, layout, pos, data.shape, "store to")
                data[pos] = self.value(s.value)
            elif isinstance(s, For):
                n = int(self.value(s.extent))
                for i in range(n):
                    self.locals[s.var] = np.int64(i)
                    self.exec(s.body)
            elif isinstance(s, While):
                while bool(self.value(s.cond)):
                    self.exec(s.body)
            elif isinstance(s, If):
                self.exec(s.then if bool(self.value(s.cond)) else s.orelse)
            elif isinstance(s, SetSize):
                self.syms[s.sym] = int(self.value(s.value))

    def _range_error(self, name, layout, pos, shape, what) -> IndexRangeError:
        d, p, n = next((d, p, n) for d, p, n in zip(layout, pos, shape) if not 0 <= p < n)
        return IndexRangeError(index_message(name, d, p, n, self.origins.get((name, d)), what))

    def run(self):
        op = self.op
        bounded = dict(self.syms)
        for s, b in op.bounds.items():
            bounded[s] = index_value(b, self.syms)
        for name, ty in {**op.results, **op.locals_}.items():
            shape = [index_value(ty.dims[d], bounded) for d in ty.dims]
            self.tensors.put(name, np.zeros(shape, dtype=dt.to_numpy(ty.dtype)), tuple(ty.dims))
        self.exec(op.body)
        for name, ty in op.results.items():
            shape = tuple(index_value(ty.dims[d], self.syms) for d in ty.dims)
            trimmed = self.tensors.data[name][tuple(slice(0, n) for n in shape)]
            self.tensors.data[name] = np.ascontiguousarray(trimmed).reshape(trimmed.shape)
        for name in op.locals_:
            del self.tensors.data[name]


def bind_symbols(g: Graph, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Sizes of the symbols, read off the inputs' shapes (checked for consistency)."""
    from mlpack.spec.ir.expr import free_syms
    syms: dict[str, int] = {}
    deferred = []
    for port in g.inputs:
        ty = g.types[port.name]
        arr = inputs[port.name]
        if arr.ndim != len(port.layout):
            raise InterpError(f"input {port.name!r} has rank {arr.ndim}, expected {len(port.layout)}")
        for d, n in zip(port.layout, arr.shape):
            s = ty.dims[d]
            if s.op == "sym" and s.arg not in syms:
                syms[s.arg] = n
            else:
                deferred.append((port.name, d, s, n))
    for name, d, s, n in deferred:
        if free_syms(s) - set(syms):
            continue
        if index_value(s, syms) != n:
            raise InterpError(f"input {name!r}: dim {d} is {n}, expected {index_value(s, syms)}")
    return syms


def _last_uses(g: Graph) -> dict[int, list[str]]:
    """For each op index, the tensors no later op reads (freed after it: peak memory stays low)."""
    last: dict[str, int] = {}
    for i, op in enumerate(g.ops):
        for name in tensors_read(op):
            last[name] = i
    out: dict[int, list[str]] = {}
    for name, i in last.items():
        out.setdefault(i, []).append(name)
    return out


def run_graph(g: Graph, inputs: dict[str, np.ndarray], observe=None) -> dict[str, np.ndarray]:
    """Evaluate ``g`` on NumPy inputs (arrays in each input's layout); outputs in theirs.
    ``observe(name, data)``, when given, sees every input and every comprehension's output as it
    is computed (data in the tensor's dims order; calibration, codegen/precisions/int8.py)."""
    tensors = _Tensors()
    for port in g.inputs:
        if port.name not in inputs:
            raise InterpError(f"missing input {port.name!r}")
        want = dt.to_numpy(g.types[port.name].dtype)
        tensors.put(port.name, np.asarray(inputs[port.name]).astype(want, copy=False), port.layout)
    syms = bind_symbols(g, {p.name: tensors.data[p.name] for p in g.inputs})
    if observe is not None:
        for port in g.inputs:
            observe(port.name, tensors.data[port.name])
    for c in g.constants.values():
        tensors.put(c.name, c.data, c.layout)
    last_use = _last_uses(g)
    keep = {p.name for p in g.outputs}
    for i, op in enumerate(g.ops):
        if isinstance(op, Comprehension):
            tensors.put(op.out, _Comprehension(op, tensors, syms, g.origins).run(),
                        tuple(op.type.dims))
            if observe is not None:
                observe(op.out, tensors.data[op.out])
        else:
            _Procedure(op, tensors, syms, g.origins).run()
        for name in last_use.get(i, ()):
            if name not in keep and name not in g.constants:
                tensors.data.pop(name, None)
    out = {}
    for port in g.outputs:
        data, layout = tensors.data[port.name], tensors.layout[port.name]
        data = np.transpose(data, [layout.index(d) for d in port.layout])
        out[port.name] = np.ascontiguousarray(data).reshape(data.shape)
    return out
