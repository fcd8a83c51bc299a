"""Scalar expressions of the IR as LLVM IR: ``ScalarEmitter``.

A target's kernel binds the loop variables and symbols, gives each tensor's base pointer,
sizes and strides, and calls the emitter on each expression it needs. Values are memoized per
scope (a loop body is a scope). Index math is i64 (``nsw`` where it only involves loop
variables, symbols and constants), floor division and modulo follow Python, guarded reads
branch around the load (LLVM if-converts them into masked loads), and data-dependent indices of
unguarded reads are checked (indexchecks.py): a bad index fails the run with an error naming
the ONNX node, as ONNX Runtime's does, and never leaves the buffer.

f16 and bf16 are f32 in registers (types.py), and every op on them rounds, as the interpreter
(NumPy, the ONNX reference) computes each f16 op in f32 and rounds it. Reductions too: an f16
sum accumulates its rounded terms in f32 (never in an f16 output row), a sum of products may
multiply its rounded factors unrounded as the interpreter's einsum does (the cpu target's
KernelLowering._term), and an epilogue sees the reduction's value rounded. (Rounding only at
stores left the node suite's fp16 Attention/CausalConv outputs an f16 ulp past its
tolerance.) The narrow dtypes convert through narrow.py, half floats where the target lacks
instructions for them through halfconv.py, and each op's rule is in
oprules.py's tables (transcendental functions from mathlib.py).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Protocol

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr, free_vars, walk
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.llvm import halfconv, narrow, oprules
from mlpack.codegen.llvm.indexchecks import IndexChecks
from mlpack.codegen.llvm.intrinsics import intrinsic
from mlpack.codegen.llvm.types import (F16, F32, FLOAT_TYPES, I8, I16, I32, I64, NARROW_FLOATS,
                                       const, is_signed, itemsize, llvm_type, storage_type)


class Memory(Protocol):
    """How a tensor lies in memory, as far as the emitter needs it (the cpu target's Buffer is
    one): its dims in layout order, its dtype, and whether a sub-byte dtype is packed
    (narrow.py)."""
    layout: tuple[str, ...]
    dtype: str
    packed: bool


# ops whose f16 result needs no rounding: exact on f16 values, or rounded already
F16_EXACT = frozenset({"const", "var", "sym", "read", "cast", "select", "neg", "abs", "max",
                        "min", "floor", "ceil", "round", "sign"})
FAST_SUM = ("reassoc", "contract")   # reductions may reassociate (fp32 rtol 1e-4 holds)


class ScalarEmitter:
    """Emits scalar expressions; values are memoized per scope (a loop body is a scope)."""

    def __init__(self, b: ir.IRBuilder, bases: dict, buffers: dict[str, Memory], kname: str,
                 native_f16: tuple[bool, bool] = (True, True), *, target: str):
        self.b = b
        # (loads, stores): whether fpext / fptrunc on half are used, where the target has them
        # as instructions (the others go through halfconv.py)
        self.f16_load_native, self.f16_store_native = native_f16
        self.target = target          # the target's name, which begins every error
        self.bases = bases            # tensor -> base pointer (narrow.Base for narrow dtypes)
        for t, buf in buffers.items():
            if t in bases and narrow.handles(buf.dtype):
                bases[t] = narrow.Base(bases[t], buf.dtype, buf.packed)
        self.buffers = buffers
        self.kname = kname
        self.env: list[dict[str, ir.Value]] = [{}]
        self.memo: list[dict[int, ir.Value]] = [{}]
        self.keep: list[Expr] = []    # keeps memoized nodes alive so their ids stay unique
        self.strides: dict[str, list] = {}
        self.sizes: dict[str, dict] = {}
        self.pure: dict[int, bool] = {}
        self.checks = IndexChecks(b.function)
        # (the var a vectorized loop walks while its body is emitted, its extent): a guarded
        # read that does not move with it, or only indexes by it a dim of that extent, loads
        # under a select, not a branch (_read)
        self.lane: tuple[str, ir.Value] | None = None
        # (the least and one past the greatest value the lane var takes there, when known at
        # build time): a dim indexed by the lane var plus a constant that stays in range over
        # it needs no guard (a padded copy's interior, lower.py's _split_guarded)
        self.lane_range: tuple[int, int] | None = None

    # -- scopes

    @contextmanager
    def scope(self, **binds):
        self.env.append(dict(binds))
        self.memo.append({})
        try:
            yield
        finally:
            self.env.pop()
            self.memo.pop()

    def bind(self, name: str, value) -> None:
        self.env[-1][name] = value

    def lookup(self, name: str):
        for scope in reversed(self.env):
            if name in scope:
                return scope[name]
        raise UnsupportedTargetError(f"{self.target}: kernel {self.kname}: unbound variable {name}")

    # -- entry

    def __call__(self, e: Expr):
        key = id(e)
        for m in reversed(self.memo):
            if key in m:
                return m[key]
        v = self.emit_node(e)
        if e.dtype in ("f16", "bf16") and e.op not in F16_EXACT:
            v = self.round_to(v, e.dtype)   # every f16/bf16 op rounds, as the interpreter's
        self.memo[-1][key] = v
        self.keep.append(e)
        return v

    # ops below which index arithmetic is data, so may overflow (no nsw)
    NOT_PURE = ("read",)

    def _is_pure_index(self, e: Expr) -> bool:
        """No reads below: index arithmetic that cannot overflow (nsw is safe)."""
        key = id(e)
        hit = self.pure.get(key)
        if hit is None:
            hit = e.op not in self.NOT_PURE and all(self._is_pure_index(a) for a in e.args)
            self.pure[key] = hit
            self.keep.append(e)
        return hit

    def emit_node(self, e: Expr):
        op = e.op
        if op == "const":
            return const(e.dtype, e.arg)
        if op in ("var", "sym"):
            return self.lookup(("$" if op == "sym" else "") + e.arg)
        if op == "read":
            return self._read(e)
        if op == "cast":
            if _in_i32(e.args[0]) and dt.is_int(e.dtype) and dt.bits(e.dtype) <= 32:
                return self._cast_clamped(self(e.args[0]), e.dtype)
            return self.cast(self(e.args[0]), e.args[0].dtype, e.dtype)
        if op == "select":
            c, a, x = (self(a) for a in e.args)
            a = self.cast(a, e.args[1].dtype, e.dtype)
            x = self.cast(x, e.args[2].dtype, e.dtype)
            return self.b.select(c, a, x)
        if op in ("max", "min") and e.dtype in ("f32", "f64"):
            leaves = _chain(e)
            if len(leaves) > 2:   # a window's extreme: one NaN test for all (oprules.py)
                return oprules.float_extreme_chain(
                    self.b, op, [self.cast(self(x), x.dtype, e.dtype) for x in leaves])
        if op == "erf" and e.dtype == "f32" and _by_constant(e.args[0]):
            # erf(x / c), GELU's erf(x / sqrt(2)): x times 1/c, which may round once more (an
            # ulp of erf's argument, against erf's own 4.5e-7), instead of a division, the
            # slowest instruction of the epilogue
            x, c = e.args[0].args
            scaled = self.b.fmul(self.cast(self(x), x.dtype, "f32"), const("f32", 1.0 / c.arg))
            return self._unary(op, scaled, "f32")
        args = [self(a) for a in e.args]
        if len(args) == 1:
            return self._unary(op, args[0], e.args[0].dtype)
        adt = dt.promote(e.args[0].dtype, e.args[1].dtype)
        a = self.cast(args[0], e.args[0].dtype, adt)
        x = self.cast(args[1], e.args[1].dtype, adt)
        return self._binary(op, a, x, adt, self._is_pure_index(e))

    # -- reads

    def _read(self, e: Expr):
        name, dims, pad = e.arg
        buf = self.buffers[name]
        index = dict(zip(dims, e.args))
        b = self.b
        idx, ok, uniform = [], None, pad is not None and self.lane is not None
        lanes = []   # the dims the lane var alone indexes, over their whole extent
        for d in buf.layout:
            ix = e_ix = index[d]
            v = self.cast(self(ix), ix.dtype, "i64")
            n = self.sizes[name][d]
            if pad is not None and uniform and ix.op == "var" and ix.arg == self.lane[0] \
                    and _same(n, self.lane[1]):
                lanes.append(d)   # in range: the loop runs over this very extent
            elif pad is not None and uniform and self._lane_inside(ix, buf.sizes[d]):
                lanes.append(d)   # in range: the lane's values keep it there
            elif pad is not None:
                uniform = uniform and self.lane[0] not in free_vars(ix)
                inb = b.icmp_unsigned("<", v, n)
                ok = inb if ok is None else b.and_(ok, inb)
            elif self.is_data_index(e_ix):
                v = self.checks.note(b, name, d, v, n)
            elif not self._is_pure_index(e_ix):   # a procedure's loop counter: in range by
                v = self._clamp(v, n)               # construction, clamped only for safety
            idx.append(v)
        flat = self.flat_offset(name, idx)
        ety = storage_type(buf.dtype)
        if ok is None:
            return self.load(ety, buf.dtype, self.bases[name], flat)
        if uniform and ok is not None:
            # the guard is the same for every lane of the vectorized loop (a channels-last
            # pooling's window point): a plain load from the buffer's first row when out of
            # bounds, then a select, not the masked loads LLVM makes of the branch (the
            # lanes' own offset stays outside the select, so the loads stay consecutive)
            zero = ir.Constant(I64, 0)
            at = [zero if d in lanes else v for d, v in zip(buf.layout, idx)]
            along = [v if d in lanes else zero for d, v in zip(buf.layout, idx)]
            flat = b.add(b.select(ok, self.flat_offset(name, at), zero),
                         self.flat_offset(name, along))
            val = self.load(ety, buf.dtype, self.bases[name], flat)
            return b.select(ok, val, const(buf.dtype, pad))
        pre = b.block
        fn = pre.function
        then = fn.append_basic_block(f"{name[:20]}.in")
        merge = fn.append_basic_block(f"{name[:20]}.merge")
        b.cbranch(ok, then, merge)
        b.position_at_end(then)
        val = self.load(ety, buf.dtype, self.bases[name], flat)
        then_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(val.type)
        phi.add_incoming(val, then_end)
        phi.add_incoming(const(buf.dtype, pad), pre)
        return phi

    def _lane_inside(self, ix: Expr, size: Expr) -> bool:
        """Whether ``ix``, the lane var plus a constant, stays in ``[0, size)`` over the lane
        var's known range (``lane_range``)."""
        if self.lane_range is None or not size.is_const:
            return False
        shift = lane_shift(ix, self.lane[0])
        lo, hi = self.lane_range
        return shift is not None and lo < hi and lo + shift >= 0 and hi + shift <= size.value

    def _clamp(self, v, n):
        b = self.b
        zero = ir.Constant(I64, 0)
        v = b.select(b.icmp_signed("<", v, zero), zero, v)
        last = b.sub(n, ir.Constant(I64, 1))
        return b.select(b.icmp_signed(">", v, last), last, v)

    def is_data_index(self, e: Expr) -> bool:
        """An index that reads a tensor: data, checked (checks.py)."""
        return any(n.op == "read" for n in walk(e))

    def flat_offset(self, name: str, idx: list):
        b = self.b
        flat = None
        for v, s in zip(idx, self.strides[name]):
            if isinstance(v, ir.Constant) and v.constant == 0:
                continue
            t = v if (isinstance(s, ir.Constant) and s.constant == 1) else b.mul(v, s, flags=("nsw",))
            flat = t if flat is None else b.add(flat, t, flags=("nsw",))
        return flat if flat is not None else ir.Constant(I64, 0)

    def load(self, ety, dtype: str, base, flat):
        b = self.b
        if isinstance(base, (narrow.Base, narrow.Ref)):
            return narrow.load(b, base, flat)
        ptr = b.gep(base, [flat], inbounds=True, source_etype=ety)
        v = b.load(ptr, typ=ety, align=itemsize(dtype))
        if dtype == "bool":
            return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        if dtype == "f16":
            if self.f16_load_native:
                return b.fpext(v, F32)
            return halfconv.f16_to_f32(b, b.bitcast(v, I16))
        if dtype == "bf16":
            return halfconv.bf16_to_f32(b, v)
        return v

    def address(self, name: str, idx: list):
        if isinstance(self.bases[name], narrow.Base):
            return self.bases[name].at(self.flat_offset(name, idx))
        return self.b.gep(self.bases[name], [self.flat_offset(name, idx)], inbounds=True,
                          source_etype=storage_type(self.buffers[name].dtype))

    def store(self, value, dtype: str, ptr) -> None:
        if isinstance(ptr, narrow.Ref):
            ptr.store(self.b, value)
            return
        if dtype == "bool":
            value = self.b.zext(value, I8)
        elif dtype == "f16":
            value = (self.b.fptrunc(value, F16) if self.f16_store_native
                     else self.b.bitcast(halfconv.f32_to_f16(self.b, value), F16))
        elif dtype == "bf16":
            value = halfconv.f32_to_bf16(self.b, value)
        self.b.store(value, ptr, align=itemsize(dtype))

    def round_to(self, v, dtype: str):
        """An f32 register value rounded to f16, bf16 or a narrow float (and back to f32)."""
        b = self.b
        if narrow.handles(dtype):
            return narrow.round_to(b, dtype, v)
        if dtype == "bf16":
            return halfconv.bf16_to_f32(b, halfconv.f32_to_bf16(b, v))
        if self.f16_store_native:
            return b.fpext(b.fptrunc(v, F16), F32)
        return halfconv.f16_to_f32(b, halfconv.f32_to_f16(b, v))

    # -- casts

    def cast(self, v, src: str, dst: str):
        if src == dst:
            return v
        out = self._cast_register(v, src, dst)
        if dst in narrow.INTS:
            return narrow.round_to(self.b, dst, out)   # wrap, as ml_dtypes does
        exact = src == "bool" or (dt.is_int(src) and dt.bits(src) <= 8 and dst in ("f16", "bf16"))
        if dst in NARROW_FLOATS and not exact:
            return self.round_to(out, dst)   # (bool and 8-bit ints are exact in f16 and bf16)
        return out

    def _cast_register(self, v, src: str, dst: str):
        """The cast between register types (f16/bf16 are f32 here; _cast rounds to them)."""
        b = self.b
        ty = llvm_type(dst)
        if dst == "bool":
            if src in FLOAT_TYPES:
                return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if src == "bool":
            return b.uitofp(v, ty) if dst in FLOAT_TYPES else b.zext(v, ty)
        if src in FLOAT_TYPES and dst in FLOAT_TYPES:
            if v.type == ty:
                return v
            return b.fpext(v, ty) if ty == ir.DoubleType() else b.fptrunc(v, ty)
        if dst in FLOAT_TYPES:
            return b.sitofp(v, ty) if is_signed(src) else b.uitofp(v, ty)
        if src in FLOAT_TYPES:
            # nan/inf give 0 (as the interpreter); narrow ints wrap like a C cast via i64
            finite = b.fcmp_ordered("<", self._unary("abs", v, src), ir.Constant(v.type, math.inf))
            v = b.select(finite, v, ir.Constant(v.type, 0.0))
            if dst == "u64":
                return b.fptoui(v, ty)
            wide = b.fptosi(v, I64)
            return wide if ty == I64 else b.trunc(wide, ty)
        sb, db = v.type.width, ty.width   # register widths (int4/int2 are in i8)
        if db < sb:
            return b.trunc(v, ty)
        if db > sb:
            return b.sext(v, ty) if is_signed(src) else b.zext(v, ty)
        return v

    def _cast_clamped(self, v, dst: str):
        """A float known to lie in i32's range when finite (``_in_i32``) as the int ``dst``:
        what ``cast`` gives (nan/inf are 0, narrower ints wrap), through i32 instead of i64,
        which vector units convert at full width (AVX2 has no f32-to-i64 conversion: the
        i64 path goes element by element, a requantizing epilogue's main cost)."""
        b = self.b
        finite = b.fcmp_ordered("<", self._unary("abs", v, "f32" if v.type == F32 else "f64"),
                                ir.Constant(v.type, math.inf))
        wide = b.fptosi(b.select(finite, v, ir.Constant(v.type, 0.0)), I32)
        out = wide if dst in ("i32", "u32") else b.trunc(wide, llvm_type(dst))
        return narrow.round_to(b, dst, out) if dst in narrow.INTS else out

    # -- operations

    def intrinsic(self, name: str, ty, *args):
        return self.b.call(intrinsic(self.b.module, name, ty, len(args)), list(args))

    def _unary(self, op: str, x, dtype: str):
        v = oprules.unary(self, op, x, dtype)
        if v is None:
            raise self._no_rule(op, dtype)
        return v

    def _binary(self, op: str, a, x, dtype: str, pure: bool):
        v = oprules.binary(self, op, a, x, dtype, pure)
        if v is None:
            raise self._no_rule(op, dtype)
        return v

    def _no_rule(self, op: str, dtype: str) -> UnsupportedTargetError:
        return UnsupportedTargetError(
            f"{self.target}: kernel {self.kname}: op {op} on {dtype} is not lowered by the "
            f"{self.target} target")


def _bounds(e: Expr) -> tuple[float, float]:
    """(lower, upper) bounds of a float expression's finite values, from constants and the
    min/max of a clamp (nan passes min and max; ``_cast_clamped`` handles it); infinite where
    unknown."""
    if e.op == "const":
        return float(e.arg), float(e.arg)
    if e.op in ("min", "max") and len(e.args) == 2:
        (la, ha), (lb, hb) = _bounds(e.args[0]), _bounds(e.args[1])
        if e.op == "min":
            return min(la, lb), min(ha, hb)
        return max(la, lb), max(ha, hb)
    return -math.inf, math.inf


def _by_constant(e: Expr) -> bool:
    """Whether ``e`` is an f32 quotient by a finite, nonzero constant."""
    if e.op != "div" or e.dtype != "f32" or e.args[1].op != "const":
        return False
    c = e.args[1].arg
    return isinstance(c, (int, float)) and c != 0 and math.isfinite(c) and \
        math.isfinite(1.0 / c) and e.args[0].dtype == "f32"


def _chain(e: Expr) -> list[Expr]:
    """The operands of a nest of the same float max (or min) as ``e``, in order: the values
    it takes the extreme of."""
    out, todo = [], [e]
    while todo:
        x = todo.pop()
        if x.op == e.op and x.dtype == e.dtype and len(x.args) == 2:
            todo.extend(reversed(x.args))
        else:
            out.append(x)
    return out


def _in_i32(e: Expr) -> bool:
    """Whether float expression ``e`` is clamped into i32's range (a quantization's
    ``min(max(round(x), 0), 255)``)."""
    if e.dtype not in ("f32", "f64") or e.op not in ("min", "max"):
        return False
    lo, hi = _bounds(e)
    return lo >= -2.0 ** 31 and hi < 2.0 ** 31


def _same(n, m) -> bool:
    """Whether two i64 sizes are the same value: one SSA value, or equal constants."""
    if n is m:
        return True
    return isinstance(n, ir.Constant) and isinstance(m, ir.Constant) and n.constant == m.constant


def lane_shift(ix: Expr, var: str) -> int | None:
    """``c`` where ``ix`` is ``var + c`` (or ``var - c``, ``c + var``), c a constant; else None."""
    if ix.op == "var":
        return 0 if ix.arg == var else None
    if ix.op in ("add", "sub") and len(ix.args) == 2:
        a, c = ix.args
        if ix.op == "add" and a.is_const:
            a, c = c, a
        if a.op == "var" and a.arg == var and c.is_const and isinstance(c.value, int):
            return c.value if ix.op == "add" else -c.value
    return None

