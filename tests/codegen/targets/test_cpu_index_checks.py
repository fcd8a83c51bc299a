"""Index checks in cpu kernels (checks.py): a data-dependent index out of range fails the run.

A Gather's kernel lists its check in the plan (ABI 1.2) and reports a bad token id through the
dispatch's error record, with the message the interpreters give; in-range ids, negative ones
included, still give ONNX Runtime's output, over many workgroups; a plan without data-dependent
indices asks nothing new of the engine.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from plan_runner import NARROW_AND_WIDE, IndexCheckError, Library, assert_matches_ort, run_plan

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import compile_cpu

VOCAB, WIDTH, TOKENS = 1000, 64, 4096   # 8 workgroups


def embedding():
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((VOCAB, WIDTH)).astype(np.float32), "table")
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], name="emb")], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [TOKENS])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOKENS, WIDTH])],
                          [table])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
def test_in_range_ids_match_onnxruntime(target):
    ids = np.random.default_rng(1).integers(-VOCAB, VOCAB, TOKENS).astype(np.int64)
    _, art = assert_matches_ort(embedding(), {"ids": ids}, target)
    assert art.plan["abi_minor"] == 2
    assert art.plan["dispatches"][0]["checks"] == [
        {"tensor": "table", "dim": "d0", "node": "Gather node 'emb'", "wraps": True}]


@pytest.mark.parametrize("bad, shown", [(VOCAB, VOCAB), (-VOCAB - 1, -VOCAB - 1), (1 << 40, 1 << 40)])
def test_an_id_out_of_range_fails_naming_node_and_index(bad, shown):
    g = compile_onnx(embedding())
    art = compile_cpu(g, "x86_64-v3")
    assert art.plan["dispatches"][0]["workgroups"] > 1
    ids = np.zeros(TOKENS, dtype=np.int64)
    ids[TOKENS - 3] = bad   # in the last workgroup
    with pytest.raises(IndexCheckError, match=rf"Gather node 'emb': index {shown} out of range "
                                              rf"for dim of size {VOCAB} \(valid -{VOCAB}..{VOCAB - 1}\)"):
        run_plan(art, g, {"ids": ids}, Library(art.elf))


def test_plans_without_data_indices_ask_nothing_new():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    plan = compile_cpu(compile_onnx(helper.make_model(g)), "x86_64-v3").plan
    assert "abi_minor" not in plan and all("checks" not in d for d in plan["dispatches"])
