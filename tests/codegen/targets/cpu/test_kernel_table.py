"""The cpu kernel library's table records each kernel's bindings (kernel ABI 1.3, table version 2).

module.py writes, per kernel, one character per buffer its dispatches bind ('w' written, 'r'
only read: procedure.binding_kinds), which the engine (runtime/c/src/plan.c) and the test plan
runner check every plan against. Here, on a comprehension model and a procedure model (a
procedure writes several tensors): the table is version 2, its record agrees with the plan's
dispatches and buffers (every written binding an output or an arena slice), and plan_runner
refuses the same faults the engine refuses.
"""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.module import TABLE_VERSION
from mlpack.codegen.targets.cpu.procedure import binding_kinds

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plan_runner import Library, rand, run_plan  # noqa: E402  (tests/codegen/targets/plan_runner.py)

F = TP.FLOAT


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "table", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _mlp():
    w = helper.make_tensor("w", F, [4, 3], rand(4, 3).ravel().tolist())
    b = helper.make_tensor("b", F, [3], [0.1, -0.2, 0.3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, [("x", ["batch", 4])], [("y", F)], [w, b]), {"x": rand(5, 4)}


def _nonzero():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0])]
    x = rand(6, 5) * (np.random.default_rng(1).random((6, 5)) > 0.5)
    return _model(nodes, [("x", ["n", 5])], [("t", TP.INT64)]), {"x": x.astype(np.float32)}


@pytest.fixture(scope="module", params=["mlp", "nonzero"])
def compiled(request):
    model, feeds = {"mlp": _mlp, "nonzero": _nonzero}[request.param]()
    g = compile_onnx(model)
    art = compile_cpu(g, "x86_64-v2")
    return g, art, feeds


def test_the_table_records_what_each_dispatch_binds(compiled):
    g, art, _ = compiled
    lib = Library(art.elf)
    assert TABLE_VERSION == 2 and lib.bindings is not None
    assert lib.names == art.kernel_names
    plan = art.plan
    for i, disp in enumerate(plan["dispatches"]):
        kinds = lib.bindings[disp["kernel"]]
        assert len(kinds) == len(disp["bindings"]) and set(kinds) <= {"r", "w"}, (i, kinds)
        assert kinds.startswith("w")   # every kernel writes something, and writes come first
        for b, kind in zip(disp["bindings"], kinds):
            if kind == "w":
                assert plan["buffers"][b]["kind"] in ("output", "arena"), (i, kinds, b)
    lib.check_plan(plan)


def test_binding_kinds_lists_writes_then_reads():
    from mlpack.codegen.targets.cpu.kernel import Kernel
    from mlpack.codegen.targets.cpu.procedure import ProcedureKernel, kernel_bindings

    k = Kernel("k0", "y", None, None, {}, "f32", reads=["x", "w"])
    assert kernel_bindings(k) == ["y", "x", "w"] and binding_kinds(k) == "wrr"
    p = ProcedureKernel("k1", "a", None, None, {}, "f32", reads=["x"], writes=["a", "n", "tmp"])
    assert kernel_bindings(p) == ["a", "n", "tmp", "x"] and binding_kinds(p) == "wwwr"


def test_the_plan_runner_refuses_what_the_engine_refuses(compiled):
    g, art, feeds = compiled
    lib = Library(art.elf)
    plan = art.plan
    if all("input" in s for s in plan["symbol_sources"]):   # (the runner has no computed symbols)
        run_plan(art, g, feeds, lib)   # the plan as compiled runs
    fewer = copy.deepcopy(plan)
    fewer["dispatches"][0]["bindings"].pop()
    with pytest.raises(RuntimeError, match="dispatch 0 binds .* buffers, its kernel"):
        lib.check_plan(fewer)
    read_only = next(j for j, b in enumerate(plan["buffers"]) if b["kind"] in ("input", "weight"))
    onto = copy.deepcopy(plan)
    onto["dispatches"][0]["bindings"][0] = read_only   # binding 0 is always written
    with pytest.raises(RuntimeError, match="dispatch 0 binding 0: kernel .* writes"):
        lib.check_plan(onto)
