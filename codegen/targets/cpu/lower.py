"""One kernel -> one LLVM function ``i32 k(const mlpack_dispatch *d, uint32_t wg)``.

The exported function only unpacks the dispatch (binding pointers, push constants, workgroup
count) and calls an always-inlined body whose buffer parameters are ``noalias``: after inlining
LLVM keeps that as alias scopes, so the vectorizer needs no runtime overlap checks. (Bindings
never alias: one binding per tensor, and the plan never overlaps the arena slots of an op's
inputs and output.)

The body walks the units this workgroup owns (``[units*wg/count, units*(wg+1)/count)``; a
unit is a row, or a chunk of one when the kernel cuts rows in ``row_chunks``), delinearizes
each into the outer dims' indices and runs the kernel's strategy (see kernels.py).
Scalar expressions are emitted by ``_Expr``: index math is i64 (``nsw`` where it only
involves loop variables, symbols and constants), floor division and modulo follow Python,
guarded reads branch around the load (LLVM if-converts them into masked loads), and
data-dependent indices of unguarded reads are checked (checks.py): a bad index fails the run
with an error naming the ONNX node, as ONNX Runtime's does, and never leaves the buffer.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import Expr, walk
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.cpu import checks as chk
from mlpack.codegen.targets.cpu import halfconv, hoist, mathlib, narrowconv
from mlpack.codegen.targets.cpu.kernels import ACC, Buffer, Kernel, row_dim

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
DISPATCH = ir.LiteralStructType([PTR, PTR, I32, I32, PTR])   # mlpack_dispatch (ABI 1.2)
KERNEL_FN = ir.FunctionType(I32, [PTR, I32])
F32, F16 = ir.FloatType(), ir.HalfType()
# f16 and bf16 live in f32 registers: loads widen, stores (and casts to them) round to nearest
# even, and so does every op on them, as the interpreter (NumPy, the ONNX reference) computes
# each f16 op in f32 and rounds it. Reductions too: an f16 sum accumulates its rounded terms in
# f32 (never in the f16 output row: kernels.schedule), a sum of products multiplies its rounded
# factors unrounded as the interpreter's einsum does (KernelLowering._term), and an epilogue
# sees the reduction's value rounded. (Rounding only at stores left the node suite's fp16
# Attention/CausalConv outputs an f16 ulp past its tolerance.)
FLOAT_TYPES = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "f16": ir.FloatType(),
               "bf16": ir.FloatType()}
NARROW_FLOATS = ("f16", "bf16")
# fp8/fp4 live in f32 registers too, int4/int2 in i8 ones (narrowconv.py converts them)
FLOAT_TYPES.update({d: F32 for d in narrowconv.FLOATS})
NARROW_FLOATS += tuple(sorted(narrowconv.FLOATS))
# ops whose f16 result needs no rounding: exact on f16 values, or rounded already
_F16_EXACT = frozenset({"const", "var", "sym", "read", "cast", "select", "neg", "abs", "max",
                        "min", "floor", "ceil", "round", "sign"})
FAST_SUM = ("reassoc", "contract")   # reductions may reassociate (fp32 rtol 1e-4 holds)
CONTRACT = ("contract",)             # a*b+c may become an fma


def llvm_type(dtype: str, what: str = "") -> ir.Type:
    """The register type of an IR dtype (bool is i1; storage of bool is i8)."""
    if dtype in FLOAT_TYPES:
        return FLOAT_TYPES[dtype]
    if dtype == "bool":
        return I1
    if dtype in narrowconv.INTS:
        return I8
    if dt.is_int(dtype) and dt.bits(dtype) in (8, 16, 32, 64):
        return ir.IntType(dt.bits(dtype))
    raise UnsupportedTargetError(f"cpu: dtype {dtype} is not supported{what}")


def storage_type(dtype: str) -> ir.Type:
    """How a dtype lies in memory: bool as i8, f16 as half, bf16 as its i16 bits."""
    if dtype == "f16":
        return F16
    if dtype == "bf16":
        return I16
    return I8 if dtype == "bool" or narrowconv.handles(dtype) else llvm_type(dtype)


def _itemsize(dtype: str) -> int:
    return 1 if dtype == "bool" or narrowconv.handles(dtype) else dt.bits(dtype) // 8


class Loops:
    """Counted loops with optional vectorizer metadata on the latch branch."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module):
        self.b = b
        self.module = module
        self.latches: list[ir.Instruction] = []

    @contextmanager
    def loop(self, start, end, name: str, vectorize: bool = False, unroll: bool = True):
        """``unroll=False`` tells LLVM not to unroll the loop (a micro-kernel's K loop, whose
        body is unrolled already: unrolling it further only costs compile time)."""
        b = self.b
        pre = b.block
        fn = pre.function
        header = fn.append_basic_block(f"{name}.head")
        body = fn.append_basic_block(f"{name}.body")
        exit_ = fn.append_basic_block(f"{name}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, end), body, exit_)
        b.position_at_end(body)
        yield i
        nxt = b.add(i, ir.Constant(I64, 1), flags=("nsw",))
        i.add_incoming(nxt, b.block)
        br = b.branch(header)
        if vectorize:
            self.latches.append(br)
        elif not unroll:
            _disable_unroll(self.module, br)
        b.position_at_end(exit_)


_NO_UNROLL = [0]   # numbers the no-unroll loop ids; only their uniqueness matters


def _disable_unroll(m: ir.Module, br) -> None:
    _NO_UNROLL[0] += 1
    # "LOOPSELF<n>" placeholders become self-referencing loop ids (module._LoopIds); these are
    # numbered far from _LoopIds' own so the two never meet in one module
    md = m.add_metadata([ir.MetaDataString(m, f"LOOPSELF{10 ** 9 + _NO_UNROLL[0]}"),
                         m.add_metadata([ir.MetaDataString(m, "llvm.loop.unroll.disable")])])
    br.set_metadata("llvm.loop", md)


def _const(dtype: str, value) -> ir.Constant:
    ty = llvm_type(dtype)
    if dtype in FLOAT_TYPES:
        return ir.Constant(ty, float(value))
    if dtype == "bool":
        return ir.Constant(I1, int(bool(value)))
    v = int(value)
    bits = ty.width   # (int4/int2 registers are i8, sign- or zero-extended)
    return ir.Constant(ty, v & ((1 << bits) - 1) if v < 0 else v)


def _signed(dtype: str) -> bool:
    return dtype in dt.SIGNED


class _Expr:
    """Emits scalar expressions; values are memoized per scope (a loop body is a scope)."""

    def __init__(self, b: ir.IRBuilder, bases: dict, buffers: dict[str, Buffer], kname: str,
                 native_f16: tuple[bool, bool] = (True, True)):
        self.b = b
        # (loads, stores): whether fpext / fptrunc on half are used (see module.build_module)
        self.f16_load_native, self.f16_store_native = native_f16
        self.bases = bases            # tensor -> base pointer (narrowconv.Base for narrow dtypes)
        for t, buf in buffers.items():
            if t in bases and narrowconv.handles(buf.dtype):
                bases[t] = narrowconv.Base(bases[t], buf.dtype, buf.packed)
        self.buffers = buffers
        self.kname = kname
        self.env: list[dict[str, ir.Value]] = [{}]
        self.memo: list[dict[int, ir.Value]] = [{}]
        self.keep: list[Expr] = []    # keeps memoized nodes alive so their ids stay unique
        self.strides: dict[str, list] = {}
        self.sizes: dict[str, dict] = {}
        self.pure: dict[int, bool] = {}
        self.checks = chk.IndexChecks(b.function)

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
        raise UnsupportedTargetError(f"cpu: kernel {self.kname}: unbound variable {name}")

    # -- entry

    def __call__(self, e: Expr):
        key = id(e)
        for m in reversed(self.memo):
            if key in m:
                return m[key]
        v = self._emit(e)
        if e.dtype in ("f16", "bf16") and e.op not in _F16_EXACT:
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

    def _emit(self, e: Expr):
        op = e.op
        if op == "const":
            return _const(e.dtype, e.arg)
        if op in ("var", "sym"):
            return self.lookup(("$" if op == "sym" else "") + e.arg)
        if op == "read":
            return self._read(e)
        if op == "cast":
            return self._cast(self(e.args[0]), e.args[0].dtype, e.dtype)
        if op == "select":
            c, a, x = (self(a) for a in e.args)
            a = self._cast(a, e.args[1].dtype, e.dtype)
            x = self._cast(x, e.args[2].dtype, e.dtype)
            return self.b.select(c, a, x)
        args = [self(a) for a in e.args]
        if len(args) == 1:
            return self._unary(op, args[0], e.args[0].dtype)
        adt = dt.promote(e.args[0].dtype, e.args[1].dtype)
        a = self._cast(args[0], e.args[0].dtype, adt)
        x = self._cast(args[1], e.args[1].dtype, adt)
        return self._binary(op, a, x, adt, self._is_pure_index(e))

    # -- reads

    def _read(self, e: Expr):
        name, dims, pad = e.arg
        buf = self.buffers[name]
        index = dict(zip(dims, e.args))
        b = self.b
        idx, ok = [], None
        for d in buf.layout:
            ix = e_ix = index[d]
            v = self._cast(self(ix), ix.dtype, "i64")
            n = self.sizes[name][d]
            if pad is not None:
                inb = b.icmp_unsigned("<", v, n)
                ok = inb if ok is None else b.and_(ok, inb)
            elif self._is_data_index(e_ix):
                v = self.checks.note(b, name, d, v, n)
            elif not self._is_pure_index(e_ix):   # a procedure's loop counter: in range by
                v = self._clamp(v, n)               # construction, clamped only for safety
            idx.append(v)
        flat = self._flat(name, idx)
        ety = storage_type(buf.dtype)
        if ok is None:
            return self._load(ety, buf.dtype, self.bases[name], flat)
        pre = b.block
        fn = pre.function
        then = fn.append_basic_block(f"{name[:20]}.in")
        merge = fn.append_basic_block(f"{name[:20]}.merge")
        b.cbranch(ok, then, merge)
        b.position_at_end(then)
        val = self._load(ety, buf.dtype, self.bases[name], flat)
        then_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(val.type)
        phi.add_incoming(val, then_end)
        phi.add_incoming(_const(buf.dtype, pad), pre)
        return phi

    def _clamp(self, v, n):
        b = self.b
        zero = ir.Constant(I64, 0)
        v = b.select(b.icmp_signed("<", v, zero), zero, v)
        last = b.sub(n, ir.Constant(I64, 1))
        return b.select(b.icmp_signed(">", v, last), last, v)

    def _is_data_index(self, e: Expr) -> bool:
        """An index that reads a tensor: data, checked (checks.py)."""
        return any(n.op == "read" for n in walk(e))

    def _flat(self, name: str, idx: list):
        b = self.b
        flat = None
        for v, s in zip(idx, self.strides[name]):
            if isinstance(v, ir.Constant) and v.constant == 0:
                continue
            t = v if (isinstance(s, ir.Constant) and s.constant == 1) else b.mul(v, s, flags=("nsw",))
            flat = t if flat is None else b.add(flat, t, flags=("nsw",))
        return flat if flat is not None else ir.Constant(I64, 0)

    def _load(self, ety, dtype: str, base, flat):
        b = self.b
        if isinstance(base, (narrowconv.Base, narrowconv.Ref)):
            return narrowconv.load(b, base, flat)
        ptr = b.gep(base, [flat], inbounds=True, source_etype=ety)
        v = b.load(ptr, typ=ety, align=_itemsize(dtype))
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
        if isinstance(self.bases[name], narrowconv.Base):
            return self.bases[name].at(self._flat(name, idx))
        return self.b.gep(self.bases[name], [self._flat(name, idx)], inbounds=True,
                          source_etype=storage_type(self.buffers[name].dtype))

    def store(self, value, dtype: str, ptr) -> None:
        if isinstance(ptr, narrowconv.Ref):
            ptr.store(self.b, value)
            return
        if dtype == "bool":
            value = self.b.zext(value, I8)
        elif dtype == "f16":
            value = (self.b.fptrunc(value, F16) if self.f16_store_native
                     else self.b.bitcast(halfconv.f32_to_f16(self.b, value), F16))
        elif dtype == "bf16":
            value = halfconv.f32_to_bf16(self.b, value)
        self.b.store(value, ptr, align=_itemsize(dtype))

    def round_to(self, v, dtype: str):
        """An f32 register value rounded to f16, bf16 or a narrow float (and back to f32)."""
        b = self.b
        if narrowconv.handles(dtype):
            return narrowconv.round_to(b, dtype, v)
        if dtype == "bf16":
            return halfconv.bf16_to_f32(b, halfconv.f32_to_bf16(b, v))
        if self.f16_store_native:
            return b.fpext(b.fptrunc(v, F16), F32)
        return halfconv.f16_to_f32(b, halfconv.f32_to_f16(b, v))

    # -- casts

    def _cast(self, v, src: str, dst: str):
        if src == dst:
            return v
        out = self._cast_register(v, src, dst)
        if dst in narrowconv.INTS:
            return narrowconv.round_to(self.b, dst, out)   # wrap, as ml_dtypes does
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
            return b.sitofp(v, ty) if _signed(src) else b.uitofp(v, ty)
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
            return b.sext(v, ty) if _signed(src) else b.zext(v, ty)
        return v

    # -- operations

    def intrinsic(self, name: str, ty, *args):
        return self.b.call(mathlib.intrinsic(self.b.module, name, ty, len(args)), list(args))

    def _unary(self, op: str, x, dtype: str):
        b = self.b
        if dtype in FLOAT_TYPES:
            ty = x.type
            if op == "neg":
                return b.fneg(x)
            if op in ("abs", "sqrt", "floor", "ceil"):
                return self.intrinsic({"abs": "llvm.fabs"}.get(op, f"llvm.{op}"), ty, x)
            if op == "round":
                return self.intrinsic("llvm.rint", ty, x)
            if op in mathlib.FUNCTIONS:
                return mathlib.emit(b, op, x)
            if op == "recip":
                return b.fdiv(ir.Constant(ty, 1.0), x)
            if op == "sign":
                one = ir.Constant(ty, 1.0)
                pos = b.fcmp_ordered(">", x, ir.Constant(ty, 0.0))
                neg = b.fcmp_ordered("<", x, ir.Constant(ty, 0.0))
                return b.select(pos, one, b.select(neg, ir.Constant(ty, -1.0), x))
            if op == "isnan":
                return b.fcmp_unordered("uno", x, x)
            if op == "isinf":
                return b.fcmp_ordered("==", self.intrinsic("llvm.fabs", ty, x), ir.Constant(ty, math.inf))
        elif dtype == "bool":
            if op == "not":
                return b.xor(x, ir.Constant(I1, 1))
            if op in ("abs",):
                return x
        else:
            zero = ir.Constant(x.type, 0)
            if op == "neg":
                return b.sub(zero, x)
            if op == "abs":
                return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if _signed(dtype) else x
            if op == "sign":
                one = ir.Constant(x.type, 1)
                if not _signed(dtype):
                    return b.zext(b.icmp_unsigned("!=", x, zero), x.type)
                return b.select(b.icmp_signed(">", x, zero), one,
                                b.select(b.icmp_signed("<", x, zero), ir.Constant(x.type, -1), zero))
            if op == "bitnot":
                return b.xor(x, ir.Constant(x.type, -1))
            if op == "recip":
                return self._int_div(ir.Constant(x.type, 1), x, dtype)
            if op in ("floor", "ceil", "round"):
                return x
            if op in ("isnan", "isinf"):
                return ir.Constant(I1, 0)
        raise UnsupportedTargetError(
            f"cpu: kernel {self.kname}: op {op} on {dtype} is not lowered by the cpu target")

    def _int_div(self, a, x, dtype: str):
        """C division; x == 0 gives 0 and INT_MIN / -1 wraps instead of trapping."""
        b = self.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        if not _signed(dtype):
            safe = b.select(b.icmp_unsigned("==", x, zero), one, x)
            return b.select(b.icmp_unsigned("==", x, zero), zero, b.udiv(a, safe))
        m1 = ir.Constant(a.type, -1)
        bad = b.or_(b.icmp_signed("==", x, zero), b.icmp_signed("==", x, m1))
        q = b.sdiv(a, b.select(bad, one, x))
        q = b.select(b.icmp_signed("==", x, m1), b.sub(zero, a), q)
        return b.select(b.icmp_signed("==", x, zero), zero, q)

    def _int_floor(self, op: str, a, x, dtype: str, pure: bool):
        """Python // and % (x == 0 gives 0)."""
        b = self.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        if not _signed(dtype):
            safe = b.select(b.icmp_unsigned("==", x, zero), one, x)
            r = b.udiv(a, safe) if op == "floordiv" else b.urem(a, safe)
            return b.select(b.icmp_unsigned("==", x, zero), zero, r)
        if isinstance(x, ir.Constant) and x.constant > 0:
            q, r = b.sdiv(a, x), b.srem(a, x)
            fix = b.icmp_signed("<", r, zero)
            if op == "floordiv":
                return b.sub(q, b.zext(fix, a.type))
            return b.select(fix, b.add(r, x), r)
        m1 = ir.Constant(a.type, -1)
        bad = b.or_(b.icmp_signed("==", x, zero), b.icmp_signed("==", x, m1))
        safe = b.select(bad, one, x)
        q, r = b.sdiv(a, safe), b.srem(a, safe)
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", safe, zero)))
        if op == "floordiv":
            q = b.sub(q, b.zext(fix, a.type))
            q = b.select(b.icmp_signed("==", x, m1), b.sub(zero, a), q)
        else:
            q = b.select(fix, b.add(r, safe), r)
            q = b.select(b.icmp_signed("==", x, m1), zero, q)
        return b.select(b.icmp_signed("==", x, zero), zero, q)

    def _binary(self, op: str, a, x, dtype: str, pure: bool):
        b = self.b
        if dtype in FLOAT_TYPES:
            return self._float_binary(op, a, x)
        if dtype == "bool" and op in ("and", "or", "xor", "bitand", "bitor", "bitxor", "max", "min",
                                      "eq", "ne"):
            if op in ("eq", "ne"):
                return b.icmp_unsigned("==" if op == "eq" else "!=", a, x)
            f = {"and": b.and_, "bitand": b.and_, "min": b.and_, "or": b.or_, "bitor": b.or_,
                 "max": b.or_, "xor": b.xor, "bitxor": b.xor}[op]
            return f(a, x)
        flags = ("nsw",) if pure else ()
        if op == "add":
            return b.add(a, x, flags=flags)
        if op == "sub":
            return b.sub(a, x, flags=flags)
        if op == "mul":
            return b.mul(a, x, flags=flags)
        if op == "div":
            return self._int_div(a, x, dtype)
        if op in ("floordiv", "mod"):
            return self._int_floor(op, a, x, dtype, pure)
        if op == "fmod":
            return b.srem(a, x) if _signed(dtype) else b.urem(a, x)
        cmp = b.icmp_signed if _signed(dtype) else b.icmp_unsigned
        if op in ("max", "min"):
            return b.select(cmp(">" if op == "max" else "<", a, x), a, x)
        rel = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        if op in rel:
            return cmp(rel[op], a, x)
        if op in ("and", "bitand"):
            return b.and_(a, x)
        if op in ("or", "bitor"):
            return b.or_(a, x)
        if op in ("xor", "bitxor"):
            return b.xor(a, x)
        if op in ("shl", "shr"):
            w = ir.Constant(a.type, dt.bits(dtype))
            amt = b.select(b.icmp_unsigned("<", x, w), x, ir.Constant(a.type, 0))
            r = b.shl(a, amt) if op == "shl" else (b.ashr(a, amt) if _signed(dtype) else b.lshr(a, amt))
            return b.select(b.icmp_unsigned("<", x, w), r, ir.Constant(a.type, 0))
        if op == "pow":
            return self._int_pow(a, x, dtype)
        raise UnsupportedTargetError(
            f"cpu: kernel {self.kname}: op {op} on {dtype} is not lowered by the cpu target")

    def _int_pow(self, a, x, dtype):
        """Exact (wrapping) square-and-multiply for exponents >= 0, as NumPy's f64 pow is exact
        in that range; negative exponents (0, +-1 or a cast inf) take the f64 pow, rounded."""
        b = self.b
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        # exponents past 63 overflow unless |a| <= 1, where only their parity matters
        big = b.icmp_unsigned(">", x, ir.Constant(a.type, 63))
        e = b.select(big, b.or_(ir.Constant(a.type, 62), b.and_(x, one)), x)
        acc, sq = one, a
        for bit in range(6):
            on = b.icmp_unsigned("!=", b.and_(e, ir.Constant(a.type, 1 << bit)), zero)
            acc = b.select(on, b.mul(acc, sq), acc)
            sq = b.mul(sq, sq)
        if not _signed(dtype):
            return acc
        fa = self._cast(a, dtype, "f64")
        fx = self._cast(x, dtype, "f64")
        p = self.intrinsic("llvm.rint", ir.DoubleType(), self._float_binary("pow", fa, fx))
        return b.select(b.icmp_signed("<", x, zero), self._cast(p, "f64", dtype), acc)

    def _float_binary(self, op: str, a, x):
        b = self.b
        ty = a.type
        if op == "add":
            return b.fadd(a, x, flags=CONTRACT)
        if op == "sub":
            return b.fsub(a, x, flags=CONTRACT)
        if op == "mul":
            return b.fmul(a, x, flags=CONTRACT)
        if op == "div":
            return b.fdiv(a, x)
        if op in ("max", "min"):
            return float_minmax(b, op, a, x)
        rel = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        if op in rel:
            return b.fcmp_ordered(rel[op], a, x)
        if op == "ne":
            return b.fcmp_unordered("!=", a, x)
        if op == "floordiv":
            return self.intrinsic("llvm.floor", ty, b.fdiv(a, x))
        if op in ("fmod", "mod"):
            r = mathlib.emit_binary(b, "fmod", a, x)
            if op == "fmod":
                return r
            # Python/NumPy mod: the remainder takes the divisor's sign
            zero = ir.Constant(ty, 0.0)
            fix = b.and_(b.fcmp_ordered("!=", r, zero),
                         b.icmp_unsigned("!=", b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", x, zero)))
            return b.select(fix, b.fadd(r, x), r)
        if op == "pow":
            return self._pow(a, x)
        if op == "atan2":
            return mathlib.emit_binary(b, "atan2", a, x)
        raise UnsupportedTargetError(
            f"cpu: kernel {self.kname}: op {op} on floats is not lowered by the cpu target")

    def _pow(self, a, x):
        """a**x: small constant integer exponents multiply; everything else is mathlib's pow."""
        b = self.b
        if isinstance(x, ir.Constant) and x.constant in (1.0, 2.0, 3.0):
            out = a
            for _ in range(int(x.constant) - 1):
                out = b.fmul(out, a)
            return out
        return mathlib.emit_binary(b, "pow", a, x)


def float_minmax(b: ir.IRBuilder, kind: str, a, x):
    """max(a, x) (min for kind "min") that propagates NaN, as compares and a select.

    llvm.maximum also orders -0 below +0, and its x86 lowering (blends on the sign bit plus
    NaN fix-ups) is several times longer than vmaxps and kept pooling windows from being
    vectorized; signed zeros compare equal at any tolerance, so they may come out either way."""
    rel = ">" if kind == "max" else "<"
    if isinstance(a, ir.Constant) and not isinstance(x, ir.Constant):
        a, x = x, a   # the constant second
    if isinstance(x, ir.Constant) and isinstance(x.constant, float) and not math.isnan(x.constant):
        # relu: a NaN ``a`` fails the compare and is kept
        return b.select(b.fcmp_ordered("<" if kind == "max" else ">", a, x), x, a)
    take_a = b.or_(b.fcmp_ordered(rel, a, x), b.fcmp_unordered("uno", a, a))
    return b.select(take_a, a, x)


# ---------------------------------------------------------------- reductions


def _identity(kind: str, dtype: str) -> ir.Constant:
    if kind == "sum":
        return _const(dtype, 0)
    if kind == "prod":
        return _const(dtype, 1)
    if kind in ("max", "argmax", "argmax_last"):
        return _const(dtype, dt.lowest(dtype))
    return _const(dtype, dt.highest(dtype))


def _combine(E: _Expr, kind: str, acc, x, dtype: str, inner: bool = False):
    b = E.b
    if dtype in FLOAT_TYPES:
        if kind == "sum":
            return b.fadd(acc, x, flags=FAST_SUM)
        if kind == "prod":
            return b.fmul(acc, x, flags=FAST_SUM)
        if inner:   # a scalar accumulator: the vectorizer turns llvm.maximum into a reduction
            return E.intrinsic("llvm.maximum" if kind == "max" else "llvm.minimum", acc.type, acc, x)
        return float_minmax(b, kind, x, acc)
    if dtype == "bool":
        return (b.or_ if kind in ("sum", "max") else b.and_)(acc, x)
    if kind == "sum":
        return b.add(acc, x)
    if kind == "prod":
        return b.mul(acc, x)
    cmp = b.icmp_signed if _signed(dtype) else b.icmp_unsigned
    return b.select(cmp(">" if kind == "max" else "<", x, acc), x, acc)


def _arg_better(E: _Expr, kind: str, x, best, dtype: str):
    """Whether x replaces the running best of an argmax/argmin (first or last occurrence)."""
    b = E.b
    last = kind.endswith("_last")
    if dtype in FLOAT_TYPES:
        rel = ("<=" if last else "<") if kind.startswith("argmin") else (">=" if last else ">")
        better = b.fcmp_ordered(rel, x, best)
        # numpy: the first nan wins
        first_nan = b.and_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered("ord", best, best))
        return b.or_(better, first_nan)
    cmp = b.icmp_signed if _signed(dtype) else b.icmp_unsigned
    rel = ("<=" if last else "<") if kind.startswith("argmin") else (">=" if last else ">")
    return cmp(rel, x, best)


# ---------------------------------------------------------------- the kernel


class KernelLowering:
    """Emits one kernel into a module."""

    def __init__(self, module: ir.Module, k: Kernel, buffers: dict[str, Buffer],
                 symbols: list[str], loops_md, native_f16: tuple[bool, bool] = (True, True)):
        self.module = module
        self.native_f16 = native_f16
        self.k = k
        self.buffers = buffers
        self.symbols = symbols
        self.loops_md = loops_md
        self.out = buffers[k.out]
        self.bound = [k.out, *k.reads]   # binding j of the dispatch is tensor bound[j]

    def emit(self) -> ir.Function:
        impl = self._impl_signature()
        self._emit_impl(impl)
        return self._emit_wrapper(impl)

    def _impl_signature(self) -> ir.Function:
        n = len(self.bound)
        # ..., wg, count, the dispatch's error record and a status slot (checks.py)
        fnty = ir.FunctionType(ir.VoidType(),
                               [PTR] * n + [I64] * len(self.symbols) + [I32, I32, PTR, PTR])
        f = ir.Function(self.module, fnty, name=f"{self.k.name}.impl")
        f.linkage = "internal"
        f.attributes.add("alwaysinline")
        f.attributes.add("nounwind")
        for j in range(n):
            f.args[j].add_attribute("noalias")
        return f

    def _emit_wrapper(self, impl: ir.Function) -> ir.Function:
        f = ir.Function(self.module, KERNEL_FN, name=self.k.name)
        f.linkage = "internal"
        f.attributes.add("nounwind")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        d, wg = f.args
        bindings = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 0)], source_etype=DISPATCH),
                          typ=PTR)
        push = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 1)], source_etype=DISPATCH),
                      typ=PTR)
        count = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 2)], source_etype=DISPATCH),
                       typ=I32)
        args = [b.load(b.gep(bindings, [ir.Constant(I64, j)], source_etype=PTR), typ=PTR)
                for j in range(len(self.bound))]
        args += [b.load(b.gep(push, [ir.Constant(I64, i)], source_etype=I64), typ=I64)
                 for i in range(len(self.symbols))]
        report = chk.wrapper_args(b, d, DISPATCH, self.E.checks)
        b.call(impl, args + [wg, count] + report)
        b.ret(chk.wrapper_status(b, report))
        return f

    # -- body

    def _emit_impl(self, f: ir.Function) -> None:
        b = ir.IRBuilder(f.append_basic_block("entry"))
        self.b = b
        self.loops = Loops(b, self.module)
        n = len(self.bound)
        bases = {t: f.args[j] for j, t in enumerate(self.bound)}
        E = _Expr(b, bases, self.buffers, self.k.name, self.native_f16)
        self.E = E
        for i, s in enumerate(self.symbols):
            E.bind("$" + s, f.args[n + i])
        wg, count, err, status = f.args[n + len(self.symbols):]
        self._sizes()
        self.allocas = self._allocas()
        if self.k.strategy == "gemm":   # packed, register-blocked tiles: contraction.py
            from mlpack.codegen.targets.cpu.contraction import emit_gemm
            emit_gemm(self, wg, count)
            self._finish_checks(err, status)
            return
        outer, row = row_dim(self.out)
        chunks = ir.Constant(I64, self.k.row_chunks)
        units = chunks
        for d in outer:
            units = b.mul(units, E.sizes[self.out.name][d], flags=("nsw",))
        w64, c64 = b.zext(wg, I64), b.zext(count, I64)
        start = b.udiv(b.mul(units, w64), c64)
        end = b.udiv(b.mul(units, b.add(w64, ir.Constant(I64, 1))), c64)
        if narrowconv.shares_bytes(self.out):
            # packed int4/int2/fp4: a store rewrites its whole byte, so workgroup 0 does every
            # unit and no two threads ever share a byte (the others find nothing to do)
            first = b.icmp_unsigned("==", w64, ir.Constant(I64, 0))
            start, end = b.select(first, ir.Constant(I64, 0), units), units
        with self.loops.loop(start, end, "unit") as u:
            with E.scope():
                r = u
                self.j_range = None
                if row is not None:
                    self.j_range = (ir.Constant(I64, 0), E.sizes[self.out.name][row])
                if self.k.row_chunks > 1:
                    r, c = b.udiv(u, chunks), b.urem(u, chunks)
                    n = E.sizes[self.out.name][row]
                    self.j_range = (b.udiv(b.mul(c, n), chunks),
                                    b.udiv(b.mul(b.add(c, ir.Constant(I64, 1)), n), chunks))
                self._delinearize(r, outer)
                self._row(row)
        b.ret_void()
        self.loops_md(self.loops.latches)
        self._finish_checks(err, status)

    def _finish_checks(self, err, status) -> None:
        self.E.checks.finish(err, status)
        self.k.checks = list(self.E.checks.keys)   # the plan lists them (checks.add_to_plan)

    def _sizes(self) -> None:
        """Every bound buffer's dim sizes and strides (i64 values) and the rdims' extents."""
        E = self.E
        for t in self.bound:
            buf = self.buffers[t]
            sizes = {d: E(buf.sizes[d]) for d in buf.layout}
            E.sizes[t] = sizes
            strides, acc = [], ir.Constant(I64, 1)
            for d in reversed(buf.layout):
                strides.append(acc)
                acc = acc if _const_one(sizes[d]) else (
                    sizes[d] if _const_one(acc) else self.b.mul(acc, sizes[d], flags=("nsw",)))
            E.strides[t] = strides[::-1]
        self.extents = {r: E(s) for r, s in self.k.rdims.items()}

    def _allocas(self) -> dict:
        k, b = self.k, self.b
        if k.strategy != "inner":
            return {}
        arg = k.reduce.startswith("arg")
        out = {"acc": b.alloca(llvm_type(k.body.dtype if arg else k.acc_dtype), name="acc")}
        if arg:
            out["idx"] = b.alloca(I64, name="idx")
        return out

    def _delinearize(self, r, outer: list[str], sizes: dict | None = None) -> None:
        """Bind ``outer`` from the flat unit index ``r`` (``sizes``: their extents, the
        output's by default), and the output's size-1 dims to 0."""
        E = self.E
        osz = E.sizes[self.out.name]
        for d, v in delinearize(self.b, r, outer, sizes or osz).items():
            E.bind(d, v)
        for d in self.out.layout:
            if _const_one(osz[d]):
                E.bind(d, ir.Constant(I64, 0))

    def _out_ptr(self):
        E = self.E
        return E.address(self.out.name, [E.lookup(d) for d in self.out.layout])

    @contextmanager
    def _row_loop(self, row: str | None, vectorize: bool = True):
        """Over the row dim (or just once, for an output with no dim left)."""
        if row is None:
            with self.E.scope():
                yield
            return
        j0, j1 = self.j_range
        with self.loops.loop(j0, j1, f"j.{row}", vectorize) as j:
            with self.E.scope(**{row: j}):
                yield

    def _row(self, row: str | None, depth: int = 0) -> None:
        """The row, branching first on any select whose condition is the same for the whole
        row (a concatenation on an outer dim: hoist.py), so each arm gets a plain row loop."""
        k, b = self.k, self.b
        outer = {d for d in self.out.layout if d != row}
        sel = hoist.invariant_select([k.body, k.epilogue], outer) if depth < hoist.MAX_HOISTED \
            else None
        if sel is None:
            self._row_body(row)
            return
        cond = self.E(sel.args[0])
        fn = b.block.function
        arms = [fn.append_basic_block("sel.then"), fn.append_basic_block("sel.else")]
        merge = fn.append_basic_block("sel.merge")
        b.cbranch(cond, *arms)
        for block, arm in zip(arms, sel.args[1:]):
            b.position_at_end(block)
            self.k = replace(k, body=hoist.replace_node(k.body, sel, arm),
                             epilogue=hoist.replace_node(k.epilogue, sel, arm))
            with self.E.scope():   # values made in one arm do not dominate the other
                self._row(row, depth + 1)
            b.branch(merge)
        self.k = k
        b.position_at_end(merge)

    def _row_body(self, row: str | None) -> None:
        k = self.k
        if k.strategy == "map":
            with self._row_loop(row):
                self._store(self._finish(self.E(k.body)))
        elif k.strategy == "row":
            self._row_accumulate(row)
        else:
            with self._row_loop(row, vectorize=False):
                self._store(self._finish(self._inner_reduce()))

    def _finish(self, value):
        """The epilogue applied to the kernel's value, cast to the output's dtype."""
        k, E = self.k, self.E
        if k.epilogue is None:
            return E._cast(value, k.acc_dtype, self.out.dtype)
        if k.acc_dtype in NARROW_FLOATS and k.strategy != "row":
            value = E.round_to(value, k.acc_dtype)   # the reduction's tensor is of that dtype
        with E.scope(**{ACC: value}):
            res = E(k.epilogue)
        return E._cast(res, k.epilogue.dtype, self.out.dtype)

    def _store(self, value) -> None:
        self.E.store(value, self.out.dtype, self._out_ptr())

    def _row_accumulate(self, row: str) -> None:
        """Reduction loops outside the row loop; the output row holds the accumulators."""
        k, E = self.k, self.E
        ety = storage_type(self.out.dtype)
        with self._row_loop(row):
            self._store(_identity(k.reduce, k.acc_dtype))
        self._nest(list(k.rdims), lambda: self._row_step(row, ety))
        if k.epilogue is not None:
            with self._row_loop(row):
                ptr = self._out_ptr()
                acc = E._load(ety, self.out.dtype, ptr, ir.Constant(I64, 0))
                self._store(self._finish(acc))

    def _row_step(self, row: str, ety) -> None:
        k, E = self.k, self.E
        with self._row_loop(row):
            ptr = self._out_ptr()
            acc = E._load(ety, self.out.dtype, ptr, ir.Constant(I64, 0))
            x = self._term(k.acc_dtype)
            self._store(_combine(E, k.reduce, acc, x, k.acc_dtype))

    def _term(self, vdt: str):
        """One step's value of the reduction body. An f16/bf16 sum of products multiplies its
        (rounded) factors in f32 without rounding the product, as the interpreter's einsum
        does (softmax probabilities times V in attention); other bodies round as every op."""
        k, E = self.k, self.E
        if k.reduce != "sum" or vdt not in ("f16", "bf16") or k.body.dtype != vdt:
            return E._cast(E(k.body), k.body.dtype, vdt)
        out = None
        for f in _factors(k.body):
            v = E(f)
            out = v if out is None else self.b.fmul(out, v, flags=CONTRACT)
        return out

    def _nest(self, dims: list[str], inner, vectorize_last: bool = False) -> None:
        if not dims:
            inner()
            return
        d = dims[0]
        vec = vectorize_last and len(dims) == 1
        with self.loops.loop(ir.Constant(I64, 0), self.extents[d], f"r.{d}", vec) as i:
            with self.E.scope(**{d: i}):
                self._nest(dims[1:], inner, vectorize_last)

    def _inner_reduce(self):
        """One output element: the reduction loops innermost, into a scalar accumulator."""
        k, E, b = self.k, self.E, self.b
        acc = self.allocas["acc"]
        arg = k.reduce.startswith("arg")
        vdt = k.body.dtype if arg else k.acc_dtype
        b.store(_identity(k.reduce, vdt), acc)
        if arg:
            if len(k.rdims) != 1:
                raise UnsupportedTargetError(f"cpu: kernel {k.name}: {k.reduce} over "
                                             f"{len(k.rdims)} dims")
            b.store(ir.Constant(I64, 0), self.allocas["idx"])

        def step():
            x = self._term(vdt)
            cur = b.load(acc)
            if not arg:
                b.store(_combine(E, k.reduce, cur, x, vdt, inner=True), acc)
                return
            better = _arg_better(E, k.reduce, x, cur, vdt)
            b.store(b.select(better, x, cur), acc)
            idx = self.allocas["idx"]
            b.store(b.select(better, E.lookup(list(k.rdims)[0]), b.load(idx)), idx)

        self._nest(list(k.rdims), step, vectorize_last=not arg)
        if arg:
            return b.load(self.allocas["idx"])
        return b.load(acc)


def delinearize(b: ir.IRBuilder, flat, dims: list[str], sizes: dict) -> dict:
    """The index of each of ``dims`` (the last fastest) in the flat index ``flat``."""
    out = {}
    for d in reversed(dims):
        if d == dims[0]:
            out[d] = flat
            break
        out[d] = b.urem(flat, sizes[d])
        flat = b.udiv(flat, sizes[d])
    return out


def _factors(e: Expr) -> list[Expr]:
    """The factors of a product chain of one dtype (as the interpreter's einsum splits it)."""
    if e.op == "mul" and all(a.dtype == e.dtype for a in e.args):
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _const_one(v) -> bool:
    return isinstance(v, ir.Constant) and v.constant == 1
