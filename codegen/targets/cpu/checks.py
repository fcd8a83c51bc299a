"""Index checks on the cpu target: the kernel wrapper's side and the plan's.

The checks themselves are emitted by the scalar lowering (codegen/llvm/indexchecks.py): a
kernel body gets the dispatch's ``mlpack_kernel_error`` and a status slot from its wrapper
(``wrapper_args``), and returns MLPACK_KERNEL_INDEX_ERROR through it (``wrapper_status``). The
plan's dispatch lists its checks (``add_to_plan``) so the engine can name the node and the
caller's index.
"""

from __future__ import annotations

from llvmlite import ir

from mlpack.codegen.llvm.indexchecks import IndexChecks

I32 = ir.IntType(32)
PTR = ir.PointerType()
ABI_MINOR = 2          # plan "abi_minor" of a plan with checks


def wrapper_args(b: ir.IRBuilder, d, dispatch_type, checks: IndexChecks) -> list:
    """The (err, status) arguments a kernel's wrapper hands its body: the dispatch's error
    record and a status slot when the body has checks (only then is ``d->error`` read, so a
    kernel without checks runs under an engine older than ABI 1.2), else null pointers."""
    if not checks.keys:
        return [ir.Constant(PTR, None), ir.Constant(PTR, None)]
    err = b.load(b.gep(d, [ir.Constant(I32, 0), ir.Constant(I32, 4)], source_etype=dispatch_type),
                 typ=PTR)
    status = b.alloca(I32, name="status")
    b.store(ir.Constant(I32, 0), status)
    return [err, status]


def wrapper_status(b: ir.IRBuilder, args: list):
    """The wrapper's return value after the body ran."""
    if isinstance(args[1], ir.Constant):
        return ir.Constant(I32, 0)
    return b.load(args[1], typ=I32)


def add_to_plan(plan: dict, kernels: list, origins: dict) -> None:
    """List each dispatch's checks in the plan (dispatch i runs kernel i) and raise the plan's
    abi_minor to 1.2 when any has one."""
    for disp, k in zip(plan["dispatches"], kernels):
        if not getattr(k, "checks", None):
            continue
        entries = []
        for t, d in k.checks:
            entry = {"tensor": t, "dim": d}
            o = origins.get((t, d))
            if o is not None:
                entry.update(node=o.node, wraps=o.wraps)
            entries.append(entry)
        disp["checks"] = entries
        plan["abi_minor"] = max(plan.get("abi_minor", 0), ABI_MINOR)
