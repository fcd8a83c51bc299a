"""A small single-threaded executor of cpu artifacts, per spec/SPEC.md section 7.

It loads the artifact's shared object with ctypes (from a temporary file), calls
``mlpack_kernel_table_v1``, checks the table's version, checks every dispatch's bindings against
the table's record of its kernel's (ABI 1.3: the count, and no written binding on an input or a
weight, as the engine's plan.c does), binds symbols from the inputs' shapes, lays out the arena,
and runs every dispatch's workgroups in order. The codegen tests use it so
they do not depend on the C engine.

Nothing selects here as the engine does, so ``run_plan`` refuses an artifact whose target this
host cannot run (support.host_lacks: an AVX-512 kernel on an AVX2 host would be SIGILL, killing
the test process); tests pick levels with ``HOST_TARGETS``, ``NARROW_AND_WIDE`` or
``best_host_target``.
"""

from __future__ import annotations

import ctypes
import os
import tempfile

import numpy as np

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir.expr import index_value
from mlpack.spec.ir.graph import Graph
from support import best_host_target, host_lacks, host_params


# what the cpu codegen tests share: the x86-64 targets they compile, the same as parameters
# that skip each level this host cannot run (naming what it lacks), and the fp32 tolerance
# against ONNX Runtime (summation orders differ)
TARGETS = ("x86_64-v2", "x86_64-v3", "x86_64-v4")
HOST_TARGETS = host_params(*TARGETS)
# the narrowest level (SSE, no FMA) and the widest this host runs (v4 with AVX-512, else v3),
# for tests of what two unlike levels both compute
NARROW_AND_WIDE = ("x86_64-v2", best_host_target("x86_64-v3", "x86_64-v4"))
RTOL, ATOL = 1e-4, 1e-5


def rand(*shape, seed=0, scale=1.0):
    """Seeded standard-normal f32 test data, times ``scale``."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


class KernelError(ctypes.Structure):
    _fields_ = [("claimed", ctypes.c_int32), ("check", ctypes.c_uint32), ("index", ctypes.c_int64),
                ("size", ctypes.c_int64)]


class Dispatch(ctypes.Structure):
    _fields_ = [("bindings", ctypes.POINTER(ctypes.c_void_p)), ("push", ctypes.POINTER(ctypes.c_int64)),
                ("workgroup_count", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("error", ctypes.POINTER(KernelError))]


class IndexCheckError(RuntimeError):
    """A kernel reported an index out of range (ABI 1.2): the message is the engine's."""


KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(Dispatch), ctypes.c_uint32)


class Table(ctypes.Structure):
    # `bindings` is there in a version-2 table only (ABI 1.3): read it only then
    _fields_ = [("abi_version", ctypes.c_uint32), ("kernel_count", ctypes.c_uint32),
                ("kernels", ctypes.POINTER(ctypes.c_void_p)), ("names", ctypes.POINTER(ctypes.c_char_p)),
                ("bindings", ctypes.POINTER(ctypes.c_char_p))]


def eval_expr(e, syms: dict[str, int]) -> int:
    """Evaluate a plan EXPR (an int, "$sym", or [op, a, b])."""
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return syms[e[1:]]
    op, a, b = e[0], eval_expr(e[1], syms), eval_expr(e[2], syms)
    return {"add": a + b, "sub": a - b, "mul": a * b, "floordiv": a // b if b else 0,
            "mod": a % b if b else 0, "div": int(a / b) if b else 0, "max": max(a, b),
            "min": min(a, b)}[op]


class Library:
    """A loaded kernel library."""

    def __init__(self, elf: bytes):
        fd, path = tempfile.mkstemp(suffix=".so", prefix="mlpack-test-")
        with os.fdopen(fd, "wb") as f:
            f.write(elf)
        try:
            self.lib = ctypes.CDLL(path)
        finally:
            os.unlink(path)
        fn = self.lib.mlpack_kernel_table_v1
        fn.restype = ctypes.POINTER(Table)
        table = fn().contents
        if table.abi_version not in (1, 2):
            raise RuntimeError(f"kernel table version {table.abi_version}, this runner reads 1 and 2")
        self.names = [table.names[i].decode() for i in range(table.kernel_count)]
        self.kernels = [KERNEL(table.kernels[i]) for i in range(table.kernel_count)]
        # per kernel, 'r'/'w' per binding (version 2), else None: nothing to check against
        self.bindings = ([table.bindings[i].decode() for i in range(table.kernel_count)]
                         if table.abi_version >= 2 else None)

    def check_plan(self, plan: dict) -> None:
        """Raise if a dispatch binds another number of buffers than its kernel takes, or an input
        or a weight where its kernel writes (what the engine refuses)."""
        if self.bindings is None:
            return
        for stage, writable in (("prepare", ("packed",)), ("dispatches", ("output", "arena"))):
            what = "prepare dispatch" if stage == "prepare" else "dispatch"
            for i, disp in enumerate(plan.get(stage, ())):
                kinds, name = self.bindings[disp["kernel"]], self.names[disp["kernel"]]
                if len(disp["bindings"]) != len(kinds):
                    raise RuntimeError(f"{what} {i} binds {len(disp['bindings'])} buffers, its "
                                       f"kernel {name} takes {len(kinds)} ({kinds})")
                for j, (b, kind) in enumerate(zip(disp["bindings"], kinds)):
                    got = plan["buffers"][b]["kind"]
                    if stage == "prepare" and got not in ("weight", "packed"):
                        raise RuntimeError(f"{what} {i} binding {j}: kernel {name} binds "
                                           f"a {got} buffer")
                    if kind == "w" and got not in writable:
                        raise RuntimeError(f"{what} {i} binding {j}: kernel {name} writes "
                                           f"a {got} buffer")


ARENA = 64   # the packed region's alignment, as the arena's


def prepared(artifact, lib: Library | None = None) -> dict[str, np.ndarray]:
    """Run only ``artifact``'s prepare dispatches (ABI 1.4): each packed buffer's bytes, by the
    name the plan gives it."""
    lib = lib or Library(artifact.elf)
    plan = artifact.plan
    lib.check_plan(plan)
    region = np.zeros(plan.get("packed_size", 0) + ARENA, dtype=np.uint8)
    start = (-region.ctypes.data) % ARENA
    ptrs = []
    for b in plan["buffers"]:
        if b["kind"] == "packed":
            ptrs.append(region.ctypes.data + start + b["offset"])
        else:
            ptrs.append(artifact.weights[b["name"]].ctypes.data if b["kind"] == "weight" else 0)
    push = (ctypes.c_int64 * max(1, len(plan["symbols"])))()
    for disp in plan.get("prepare", []):
        binds = (ctypes.c_void_p * max(1, len(disp["bindings"])))(*[ptrs[j] for j in disp["bindings"]])
        d = Dispatch(binds, push, eval_expr(disp["workgroups"], {}), 0, ctypes.pointer(KernelError()))
        for w in range(d.workgroup_count):
            assert lib.kernels[disp["kernel"]](ctypes.byref(d), w) == 0
    return {b["name"]: region[start + b["offset"]:start + b["offset"] + b["size"]].copy()
            for b in plan["buffers"] if b["kind"] == "packed"}


def skip_unless_runs(artifact) -> None:
    """Skip the test when this host cannot run ``artifact`` (an AVX-512 level on a CPU without
    it: loading its code would end the whole run with SIGILL), naming what it lacks
    (support.host_lacks). Tests that run several levels pick them with host_params or
    best_host_target, so this only catches a level a test did not choose by the host."""
    import pytest

    why = host_lacks(artifact.target)
    if why is not None:
        pytest.skip(f"this host cannot run it: {why}")


def run_plan(artifact, graph: Graph, inputs: dict[str, np.ndarray], lib: Library | None = None):
    """Run ``artifact`` on ``inputs`` (arrays in port layout); outputs by name, in port layout.
    The test is skipped where this host cannot run it (``skip_unless_runs``)."""
    skip_unless_runs(artifact)
    lib = lib or Library(artifact.elf)
    plan = artifact.plan
    lib.check_plan(plan)
    arrays_in = [np.ascontiguousarray(inputs[p.name], dtype=dt.to_numpy(graph.types[p.name].dtype))
                 for p in graph.inputs]
    syms = {}
    for src in plan["symbol_sources"]:
        n = arrays_in[src["input"]].shape[src["axis"]]
        if syms.setdefault(src["symbol"], n) != n:
            raise ValueError(f"symbol {src['symbol']} bound to {syms[src['symbol']]} and {n}")
    outs = []
    for p in graph.outputs:
        t = graph.types[p.name]
        shape = [index_value(t.dims[d], syms) for d in p.layout]
        outs.append(np.zeros(shape, dtype=dt.to_numpy(t.dtype)))
    arena_size = eval_expr(plan["arena_size"], syms)
    arena_raw = np.zeros(arena_size + plan["arena_align"], dtype=np.uint8)
    base = arena_raw.ctypes.data
    arena_base = base + (-base) % plan["arena_align"]
    packed_raw = np.zeros(plan.get("packed_size", 0) + ARENA, dtype=np.uint8)
    packed_base = packed_raw.ctypes.data + (-packed_raw.ctypes.data) % ARENA
    ptrs = []
    for b in plan["buffers"]:
        kind = b["kind"]
        if kind == "packed":
            assert b["offset"] + b["size"] <= plan["packed_size"], b
            ptrs.append(packed_base + b["offset"])
        elif kind == "input":
            ptrs.append(arrays_in[b["index"]].ctypes.data)
        elif kind == "output":
            ptrs.append(outs[b["index"]].ctypes.data)
        elif kind == "weight":
            ptrs.append(artifact.weights[b["name"]].ctypes.data)
        else:
            off, size = eval_expr(b["offset"], syms), eval_expr(b["size"], syms)
            assert off + size <= arena_size, (off, size, arena_size)
            ptrs.append(arena_base + off)
    push = (ctypes.c_int64 * max(1, len(plan["symbols"])))(*[syms[s] for s in plan["symbols"]])
    # (a real engine runs "prepare" once, at open; here each run prepares afresh)
    for disp in plan.get("prepare", []) + plan["dispatches"]:
        count = eval_expr(disp["workgroups"], syms)
        binds = (ctypes.c_void_p * max(1, len(disp["bindings"])))(*[ptrs[j] for j in disp["bindings"]])
        kerr = KernelError()
        d = Dispatch(binds, push, count, 0, ctypes.pointer(kerr))
        fn = lib.kernels[disp["kernel"]]
        for w in range(count):
            rc = fn(ctypes.byref(d), w)
            if rc == 1 and kerr.claimed:
                from mlpack.spec.ir.origins import Origin, message
                c = disp["checks"][kerr.check]
                o = Origin(c["node"], c["wraps"]) if "node" in c else None
                raise IndexCheckError(message(c["tensor"], c["dim"], kerr.index, kerr.size, o))
            if rc != 0:
                raise RuntimeError(f"kernel {lib.names[disp['kernel']]} returned {rc}")
    return {p.name: o for p, o in zip(graph.outputs, outs)}


def compile_and_run(model, feeds: dict[str, np.ndarray], target: str):
    """``model`` (ONNX) compiled for the cpu ``target`` and run on ``feeds``: (the graph, the
    artifact, its first output)."""
    from mlpack.codegen.compile import compile_onnx
    from mlpack.codegen.targets.cpu import compile_cpu
    g = compile_onnx(model)
    art = compile_cpu(g, target)
    return g, art, run_plan(art, g, feeds)[g.outputs[0].name]


def assert_matches_ort(model, feeds: dict[str, np.ndarray], target: str):
    """``compile_and_run``, its first output checked against ONNX Runtime's at RTOL/ATOL:
    (the graph, the artifact)."""
    from support import oracle_outputs
    g, art, got = compile_and_run(model, feeds, target)
    np.testing.assert_allclose(got, oracle_outputs(model, feeds)[0], rtol=RTOL, atol=ATOL)
    return g, art
