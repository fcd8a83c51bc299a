"""Index checks in kernel code: a data-dependent index out of range fails the run, naming the
ONNX node, instead of leaving its buffer.

A read whose index is data (a Gather's token ids) must not leave its buffer, and must not
quietly read a neighbour either: ONNX Runtime refuses such an index, and so does every
executor here (spec/ir/origins.py). Each (tensor, dim) a kernel indexes with data is one
*check*, numbered in the order the kernel first meets it. At each such read the kernel folds
the index into two accumulators, ``hit |= v >=u n`` and ``worst = umax(worst, v)`` (both plain
reductions, so the loop still vectorizes), and reads at a safe index. Before the kernel returns
it reports a hit in the dispatch's ``mlpack_kernel_error`` (ABI 1.2, mlpack_abi.h): the first
workgroup to claim it (an atomic compare-exchange) writes the check, ``worst`` (one of the bad
indices: when any index is ``>=u n`` the unsigned maximum is too) and the dim's size, and the
kernel returns MLPACK_KERNEL_INDEX_ERROR. How the record reaches the kernel, and how the plan
names each check, is the target's (the cpu target: targets/cpu/checks.py).
"""

from __future__ import annotations

from llvmlite import ir

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
ERROR = ir.LiteralStructType([I32, I32, I64, I64])   # mlpack_kernel_error
INDEX_ERROR = 1        # MLPACK_KERNEL_INDEX_ERROR
_REPORT = "mlpack.index_error"


class IndexChecks:
    """The checks of one kernel function as it is emitted."""

    def __init__(self, fn: ir.Function):
        self.fn = fn
        self.keys: list[tuple[str, str]] = []
        self.slots: dict[tuple[str, str], tuple] = {}   # key -> (hit alloca, worst alloca, size)

    def note(self, b: ir.IRBuilder, tensor: str, dim: str, v, n):
        """Check index ``v`` (i64) of ``tensor``'s dim ``dim`` of size ``n`` (a value that
        dominates every return: the kernel's sizes are computed on entry); the index to read
        at, which stays inside the dim (0 for a bad one: the run fails anyway)."""
        key = (tensor, dim)
        if key not in self.slots:
            entry = ir.IRBuilder(self.fn.entry_basic_block)
            entry.position_at_start(self.fn.entry_basic_block)
            hit, worst = entry.alloca(I1, name="chk.hit"), entry.alloca(I64, name="chk.worst")
            entry.store(ir.Constant(I1, 0), hit)
            entry.store(ir.Constant(I64, 0), worst)
            self.slots[key] = (hit, worst, n)
            self.keys.append(key)
        hit, worst, _ = self.slots[key]
        bad = b.icmp_unsigned(">=", v, n)
        b.store(b.or_(b.load(hit), bad), hit)
        w = b.load(worst)
        b.store(b.select(b.icmp_unsigned(">", v, w), v, w), worst)
        return b.select(bad, ir.Constant(I64, 0), v)

    def finish(self, err, status) -> None:
        """Before every ``ret`` of the function: report each check's hit into ``err`` (the
        dispatch's mlpack_kernel_error) and set ``*status``."""
        if not self.keys:
            return
        report = _report_fn(self.fn.module)
        rets = [blk.instructions[-1] for blk in self.fn.blocks
                if blk.instructions and isinstance(blk.instructions[-1], ir.Ret)]
        for ret in rets:
            b = ir.IRBuilder(ret.parent)
            b.position_before(ret)
            for i, key in enumerate(self.keys):
                hit, worst, n = self.slots[key]
                b.call(report, [err, status, b.load(hit), ir.Constant(I32, i), b.load(worst), n])


def _report_fn(module: ir.Module) -> ir.Function:
    """``void report(err, status, hit, check, index, size)``, once per module."""
    if _REPORT in module.globals:
        return module.globals[_REPORT]
    f = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I1, I32, I64, I64]),
                    name=_REPORT)
    f.linkage = "internal"
    f.attributes.add("alwaysinline")
    f.attributes.add("nounwind")
    err, status, hit, check, index, size = f.args
    b = ir.IRBuilder(f.append_basic_block("entry"))
    claim, fill, done = (f.append_basic_block(n) for n in ("claim", "fill", "done"))
    b.cbranch(hit, claim, done)
    b.position_at_end(claim)
    b.store(ir.Constant(I32, INDEX_ERROR), status)
    field = lambda i: b.gep(err, [ir.Constant(I32, 0), ir.Constant(I32, i)],  # noqa: E731
                            source_etype=ERROR)
    won = b.cmpxchg(field(0), ir.Constant(I32, 0), ir.Constant(I32, 1), "acq_rel", "monotonic")
    b.cbranch(b.extract_value(won, 1), fill, done)   # another workgroup reported first
    b.position_at_end(fill)
    b.store(check, field(1))
    b.store(index, field(2))
    b.store(size, field(3))
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return f
