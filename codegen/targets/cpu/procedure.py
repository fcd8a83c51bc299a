"""Procedures on the cpu target: sequential statements (TopK, NonZero, Unique, NMS, scatters)
lowered to one kernel with the ordinary kernel ABI, run as a single workgroup.

A ``Procedure`` op becomes a ``ProcedureKernel`` that binds its results and scratch locals
(outputs first, then the tensors it reads) and walks its statements in order: ``Let`` and
``For`` variables are stack slots (LLVM's mem2reg turns them into registers), ``For``/``While``/
``If`` become branches, ``Store`` writes a buffer element. Scalar expressions, loads and stores
go through codegen/llvm/scalar.py's ``ScalarEmitter``; a subclass makes it safe for sequential
code (values are memoized within one statement only, a local is re-read at every use, and
every data-dependent index is checked on a read and on a store (checks.py): a bad one, a
scatter's index past the data, fails the run naming the ONNX node; a loop counter is clamped
on a read and a store outside the buffer stores nothing, so no index leaves a buffer).

Data-dependent sizes (spec/SPEC.md section 7, "computed symbols"): a ``SetSize`` writes the
symbol's value into its push-constant slot, which later dispatches read as any other symbol.
A procedure's results are laid out at the *bounds* of the symbols it sets (so a store never
needs the final size), and every arena slot is sized with each computed symbol replaced by its
bound (resolved down to input symbols), so the arena is allocated before the run. A result
that is also a graph output is copied into the output at its actual size by a copy kernel; the
runtime allocates such an output when the first dispatch binds it, from the plan's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.expr import Expr
from mlpack.spec.ir.graph import For, Graph, If, Let, Procedure, SetSize, Store, While
from mlpack.spec.ir.graph import tensors_read as op_reads
from mlpack.spec.ir.program import encode_expr
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.llvm.loops import Loops
from mlpack.codegen.llvm.scalar import ScalarEmitter
from mlpack.codegen.llvm.types import I32, I64, PTR, const, llvm_type
from mlpack.codegen.targets.cpu import checks as chk
from mlpack.codegen.targets.cpu.abi import DISPATCH, KERNEL_FN
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel

PROCEDURE = "procedure"   # the strategy of a ProcedureKernel


@dataclass
class ProcedureKernel(Kernel):
    """A kernel computing one Procedure op (one workgroup)."""
    op: Procedure | None = None
    writes: list[str] = field(default_factory=list)     # results, then locals (bindings first)
    computes: list[str] = field(default_factory=list)   # symbols its SetSize statements define


# ---------------------------------------------------------------- graph-level facts


def kernel_writes(k: Kernel) -> list[str]:
    """The tensors a kernel writes (its first bindings): a procedure's or a point tile's
    (tiles.py) ``writes``, else its ``out``."""
    writes = getattr(k, "writes", None)
    return [k.out] if writes is None else list(writes)


def kernel_bindings(k: Kernel) -> list[str]:
    """The tensors a kernel binds, in its dispatches' "bindings" order: those it writes, then
    those it reads (plan.py binds them so; each lowering's ``bound`` is this list)."""
    return [*kernel_writes(k), *k.reads]


def binding_kinds(k: Kernel) -> str:
    """What the kernel table records of ``kernel_bindings`` (ABI 1.3, module.py): one character
    per binding, 'w' written, 'r' only read; the engine checks every dispatch against it."""
    return "w" * len(kernel_writes(k)) + "r" * len(k.reads)


def computed_bounds(g: Graph) -> dict[str, Expr]:
    """Each data-dependent symbol -> its upper bound over input symbols only (a bound may name
    a symbol an earlier procedure computes: NonZero of a Compress; substitute to a fixpoint)."""
    raw = {s: b for op in g.ops if isinstance(op, Procedure) for s, b in op.bounds.items()}
    out: dict[str, Expr] = {}
    for s, b in raw.items():
        for _ in range(len(raw) + 1):
            if not ex.free_syms(b) & set(raw):
                break
            b = ex.substitute(b, raw, kind="sym")
        else:
            raise UnsupportedTargetError(f"cpu: the bound of ${s} depends on itself")
        out[s] = ex.simplify_size(b)
    return out


def _bounded_type_sizes(op: Procedure, name: str) -> dict[str, Expr]:
    ty = {**op.results, **op.locals_}[name]
    return {d: ex.simplify_size(ex.substitute(s, dict(op.bounds), kind="sym"))
            for d, s in ty.dims.items()}


def bounded_tensors(g: Graph) -> set[str]:
    """Procedure results sized by a symbol the procedure itself sets: laid out at its bound,
    so never written in place into a graph output (a copy kernel trims them)."""
    out = set()
    for op in g.ops:
        if isinstance(op, Procedure):
            for name, ty in op.results.items():
                if any(ex.free_syms(s) & set(op.bounds) for s in ty.dims.values()):
                    out.add(name)
    return out


def add_procedure_buffers(g: Graph, bufs: dict[str, Buffer]) -> None:
    """Buffers of the procedures' results (at their bounds) and locals, in type dim order;
    a result already placed (a graph output written in place) keeps its port layout."""
    for op in g.ops:
        if not isinstance(op, Procedure):
            continue
        for name, ty in {**op.results, **op.locals_}.items():
            if name not in bufs:
                bufs[name] = Buffer(name, tuple(ty.dims), _bounded_type_sizes(op, name), ty.dtype)


def alloc_sizes(buf: Buffer, bounds: dict[str, Expr]) -> Buffer:
    """``buf`` with every computed symbol replaced by its bound: what its arena slot holds."""
    if not bounds or not any(ex.free_syms(s) & set(bounds) for s in buf.sizes.values()):
        return buf
    sizes = {d: ex.simplify_size(ex.substitute(s, bounds, kind="sym")) for d, s in buf.sizes.items()}
    return Buffer(buf.name, buf.layout, sizes, buf.dtype)


def procedure_kernel(g: Graph, op: Procedure, index: int) -> ProcedureKernel:
    results = list(op.results)
    writes = results + [t for t in op.locals_ if t not in op.results]
    reads = [t for t in _reads_in_order(op.body) if t not in writes]
    reads += sorted(op_reads(op) - set(reads))   # (none: _reads_in_order sees every statement)
    return ProcedureKernel(f"k{index}_{results[0]}", results[0], ex.const(0), None, {}, "i64",
                           strategy=PROCEDURE, reads=reads, fused=list(results), op=op,
                           writes=writes, computes=list(op.bounds))


def _stmt_exprs(s) -> list[Expr]:
    if isinstance(s, (Let, SetSize)):
        return [s.value]
    if isinstance(s, Store):
        return [*s.index.values(), s.value]
    if isinstance(s, For):
        return [s.extent]
    if isinstance(s, (While, If)):
        return [s.cond]
    return []


def _children(s) -> list:
    if isinstance(s, (For, While)):
        return s.body
    if isinstance(s, If):
        return s.then + s.orelse
    return []


def _reads_in_order(stmts) -> list[str]:
    seen: dict[str, None] = {}
    for s in stmts:
        for e in _stmt_exprs(s):
            for n in ex.walk(e):
                if n.op == "read":
                    seen.setdefault(n.arg[0])
        for t in _reads_in_order(_children(s)):
            seen.setdefault(t)
    return list(seen)


def _local_dtypes(stmts, out: dict[str, str]) -> dict[str, str]:
    """Scalar locals and their dtypes: the first assignment declares (loop variables are i64)."""
    for s in stmts:
        if isinstance(s, Let):
            out.setdefault(s.name, s.value.dtype)
        elif isinstance(s, For):
            out.setdefault(s.var, dt.INDEX)
        _local_dtypes(_children(s), out)
    return out


# ---------------------------------------------------------------- lowering


class _ProcExpr(ScalarEmitter):
    """``ScalarEmitter`` for sequential code: memo per statement, locals re-read at each use, and
    every index that is not made of constants and symbols alone is treated as data."""

    NOT_PURE = ("read", "var")   # a var is a local or a loop variable set by data

    def __init__(self, *args, slots: dict, local_types: dict, own_syms: dict, **kw):
        super().__init__(*args, **kw)
        self.slots = slots            # local -> alloca
        self.local_types = local_types
        self.own_syms = own_syms      # symbol this procedure sets -> alloca

    def __call__(self, e: Expr):
        memo = self.memo[-1]          # only this statement's values: a local may change between
        key = id(e)
        if key in memo:
            return memo[key]
        v = self.emit_node(e)
        memo[key] = v
        self.keep.append(e)
        return v

    def emit_node(self, e: Expr):
        if e.op == "var":
            slot = self.slots.get(e.arg)
            if slot is None:
                raise UnsupportedTargetError(f"cpu: kernel {self.kname}: unbound variable {e.arg}")
            have = self.local_types[e.arg]
            return self.cast(self.b.load(slot), have, e.dtype)
        if e.op == "sym" and e.arg in self.own_syms:
            return self.b.load(self.own_syms[e.arg])
        return super().emit_node(e)


class ProcedureLowering:
    """Emits one ProcedureKernel: ``i32 k(const mlpack_dispatch *d, uint32_t wg)``; workgroup 0
    runs the whole procedure (the plan dispatches one)."""

    def __init__(self, module: ir.Module, k: ProcedureKernel, buffers: dict[str, Buffer],
                 symbols: list[str], loops_md=None, native_f16: tuple[bool, bool] = (True, True)):
        self.module = module
        self.k = k
        self.buffers = buffers
        self.symbols = symbols
        self.native_f16 = native_f16
        self.bound = [*k.writes, *k.reads]   # binding j of the dispatch is tensor bound[j]

    def emit(self) -> ir.Function:
        impl = self._impl()
        f = ir.Function(self.module, KERNEL_FN, name=self.k.name)
        f.linkage = "internal"
        f.attributes.add("nounwind")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        d, wg = f.args
        field_ptr = lambda i: b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, i)],  # noqa: E731
                                    source_etype=DISPATCH)
        bindings = b.load(field_ptr(0), typ=PTR)
        push = b.load(field_ptr(1), typ=PTR)
        args = [b.load(b.gep(bindings, [ir.Constant(I64, j)], source_etype=PTR), typ=PTR)
                for j in range(len(self.bound))]
        run = b.append_basic_block("run")
        done = b.append_basic_block("done")
        report = chk.wrapper_args(b, d, DISPATCH, self.E.checks)
        b.cbranch(b.icmp_unsigned("==", wg, ir.Constant(I32, 0)), run, done)
        b.position_at_end(run)
        b.call(impl, args + [push] + report)
        b.branch(done)
        b.position_at_end(done)
        b.ret(chk.wrapper_status(b, report))
        return f

    def _impl(self) -> ir.Function:
        n = len(self.bound)
        # bindings, push constants, the dispatch's error record and a status slot (checks.py)
        f = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR] * (n + 3)),
                        name=f"{self.k.name}.impl")
        f.linkage = "internal"
        f.attributes.add("alwaysinline")
        f.attributes.add("nounwind")
        for j in range(n):
            f.args[j].add_attribute("noalias")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        self.b = b
        push = f.args[n]
        op = self.k.op
        local_types = _local_dtypes(op.body, {})
        slots = {name: b.alloca(llvm_type(t, f" (local {name})", target="cpu"), name=f"l.{name}")
                 for name, t in local_types.items()}
        own = {s: b.alloca(I64, name=f"s.{s}") for s in self.k.computes}
        for a in own.values():
            b.store(ir.Constant(I64, 0), a)
        bases = {t: f.args[j] for j, t in enumerate(self.bound)}
        E = _ProcExpr(b, bases, self.buffers, self.k.name, self.native_f16, target="cpu",
                      slots=slots, local_types=local_types, own_syms=own)
        self.E = E
        self.push = push
        for i, s in enumerate(self.symbols):
            if s not in own:
                E.bind("$" + s, b.load(b.gep(push, [ir.Constant(I64, i)], source_etype=I64), typ=I64))
        self._sizes()
        for t in self.k.writes:   # the interpreter starts results and locals at zero
            self._zero(t)
        self._block(op.body)
        b.ret_void()
        E.checks.finish(f.args[n + 1], f.args[n + 2])
        self.k.checks = list(E.checks.keys)
        return f

    def _sizes(self) -> None:
        E, b = self.E, self.b
        self.numel = {}
        for t in self.bound:
            buf = self.buffers[t]
            sizes = {d: E.cast(E(buf.sizes[d]), buf.sizes[d].dtype, "i64") for d in buf.layout}
            E.sizes[t] = sizes
            strides, acc = [], ir.Constant(I64, 1)
            for d in reversed(buf.layout):
                strides.append(acc)
                acc = b.mul(acc, sizes[d])
            E.strides[t] = strides[::-1]
            self.numel[t] = acc

    # -- statements

    def _block(self, stmts) -> None:
        for s in stmts:
            with self.E.scope():
                self._stmt(s)

    def _stmt(self, s) -> None:
        E, b = self.E, self.b
        if isinstance(s, Let):
            t = self.E.local_types[s.name]
            b.store(E.cast(E(s.value), s.value.dtype, t), E.slots[s.name])
        elif isinstance(s, Store):
            self._store(s)
        elif isinstance(s, For):
            self._for(s)
        elif isinstance(s, While):
            self._while(s)
        elif isinstance(s, If):
            self._if(s)
        elif isinstance(s, SetSize):
            v = E.cast(E(s.value), s.value.dtype, "i64")
            b.store(v, E.own_syms[s.sym])
            slot = self.symbols.index(s.sym)
            b.store(v, b.gep(self.push, [ir.Constant(I64, slot)], source_etype=I64))
        else:
            raise UnsupportedTargetError(f"cpu: kernel {self.k.name}: statement {type(s).__name__}")

    def _store(self, s: Store) -> None:
        E, b = self.E, self.b
        buf = self.buffers[s.tensor]
        idx, ok = [], None
        for d in buf.layout:
            v = E.cast(E(s.index[d]), s.index[d].dtype, "i64")
            inb = b.icmp_unsigned("<", v, E.sizes[s.tensor][d])
            ok = inb if ok is None else b.and_(ok, inb)
            if E.is_data_index(s.index[d]):   # a scatter's index: a bad one fails the run
                E.checks.note(b, s.tensor, d, v, E.sizes[s.tensor][d])   # (checks.py)
            idx.append(v)
        value = E.cast(E(s.value), s.value.dtype, buf.dtype)
        fn = b.block.function
        then = fn.append_basic_block(f"st.{s.tensor[:20]}")
        merge = fn.append_basic_block("st.done")
        b.cbranch(ok if ok is not None else ir.Constant(ir.IntType(1), 1), then, merge)
        b.position_at_end(then)
        E.store(value, buf.dtype, E.address(s.tensor, idx))
        b.branch(merge)
        b.position_at_end(merge)

    def _for(self, s: For) -> None:
        E, b = self.E, self.b
        n = E.cast(E(s.extent), s.extent.dtype, "i64")
        with Loops(b, self.module).loop(ir.Constant(I64, 0), n, f"for.{s.var}") as i:
            b.store(i, E.slots[s.var])
            self._block(s.body)

    def _while(self, s: While) -> None:
        E, b = self.E, self.b
        fn = b.block.function
        head, body, exit_ = (fn.append_basic_block(f"while.{k}") for k in ("head", "body", "exit"))
        b.branch(head)
        b.position_at_end(head)
        with E.scope():
            c = E.cast(E(s.cond), s.cond.dtype, "bool")
        b.cbranch(c, body, exit_)
        b.position_at_end(body)
        self._block(s.body)
        b.branch(head)
        b.position_at_end(exit_)

    def _if(self, s: If) -> None:
        E, b = self.E, self.b
        c = E.cast(E(s.cond), s.cond.dtype, "bool")
        fn = b.block.function
        then, orelse, merge = (fn.append_basic_block(f"if.{k}") for k in ("then", "else", "end"))
        b.cbranch(c, then, orelse)
        b.position_at_end(then)
        self._block(s.then)
        b.branch(merge)
        b.position_at_end(orelse)
        self._block(s.orelse)
        b.branch(merge)
        b.position_at_end(merge)

    def _zero(self, t: str) -> None:
        """Fill buffer ``t`` with zeros, element by element through ``ScalarEmitter.store`` (so
        packed narrow dtypes are written as every kernel writes them)."""
        E, b = self.E, self.b
        buf = self.buffers[t]
        n = self.numel[t]
        fn = b.block.function
        pre = b.block
        head, body, exit_ = (fn.append_basic_block(f"zero.{t[:20]}.{k}") for k in ("head", "body", "exit"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, n), body, exit_)
        b.position_at_end(body)
        # the flat position i as an index whose last dim carries it all (the strides end in 1)
        idx = [ir.Constant(I64, 0)] * (len(buf.layout) - 1) + [i] if buf.layout else []
        E.store(const(buf.dtype, 0), buf.dtype, E.address(t, idx))
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(exit_)


def check_procedures(g: Graph) -> None:
    """Raise UnsupportedTargetError for a procedure the cpu target cannot lower: a size bound
    that does not resolve to input symbols, or a local of a dtype registers cannot hold."""
    computed_bounds(g)
    for op in g.ops:
        if isinstance(op, Procedure):
            for name, t in _local_dtypes(op.body, {}).items():
                llvm_type(t, f" (local {name} of the procedure computing %{op.outs[0]})",
                          target="cpu")


# ---------------------------------------------------------------- the plan (SPEC.md section 7)

ABI_MINOR = 1   # plan "abi_minor": computed symbols and run-time output shapes


def computed_sources(g: Graph, kernels: list[Kernel]) -> list[dict]:
    """symbol_sources entries of the computed symbols: the dispatch whose kernel writes the
    symbol's push slot, and the bound the runtime checks its value against."""
    bounds = computed_bounds(g)
    return [{"symbol": s, "dispatch": i, "bound": encode_expr(bounds[s])}
            for i, k in enumerate(kernels) if isinstance(k, ProcedureKernel) for s in k.computes]


def output_shapes(g: Graph) -> dict[int, dict]:
    """Output index -> {"shape": [EXPR, ...]} (ONNX order) for each output whose shape the
    signature cannot give before the run: a dim that is neither a count nor an input's symbol."""
    bound = {d.arg for p in g.inputs for d in g.types[p.name].dims.values() if d.op == "sym"}
    out = {}
    for i, p in enumerate(g.outputs):
        sizes = [ex.simplify_size(g.types[p.name].dims[d]) for d in p.layout]
        if all(s.is_const or (s.op == "sym" and s.arg in bound) for s in sizes):
            continue
        out[i] = {"shape": [encode_expr(s) for s in sizes]}
    return out


__all__ = ["ProcedureKernel", "ProcedureLowering", "procedure_kernel", "kernel_writes",
           "kernel_bindings", "binding_kinds",
           "computed_bounds", "bounded_tensors", "add_procedure_buffers", "alloc_sizes", "PROCEDURE",
           "check_procedures", "computed_sources", "output_shapes", "ABI_MINOR"]
