"""The cuda target (codegen/targets/cuda/): PTX per SM level that ptxas assembles, and the same
kernels compiled for this CPU (``cuda-emulated``) computing what the reference interpreter does.

ptxas comes from the cuda extra (``pip install 'mlpack[cuda]'``, which .ci/run installs) or a
CUDA toolkit on PATH; without one the assembling tests skip, saying so. The emulated kernels
run through tests/codegen/targets/plan_runner.py at the fp32 tolerance against ``run_graph``.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets import registry
from mlpack.codegen.targets.cuda import ptx
from mlpack.spec import media
from mlpack.spec.ir.interp import run_graph

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models")
sys.path.insert(0, MODELS)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import light  # noqa: E402
# tests/codegen/targets/plan_runner.py
from plan_runner import ATOL, RTOL, run_plan  # noqa: E402

PTXAS = ptx.find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="no ptxas (pip install 'mlpack[cuda]')")


def _graph(name: str):
    return compile_onnx(onnx.load(os.path.join(MODELS, name)))


def _ops_model():
    """Reductions (softmax's max and sum, argmax), a gather with a checked index, a procedure
    (TopK), f16 arithmetic and a broadcast, with a dynamic batch."""
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1),
             helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
             helper.make_node("Gather", ["table", "am"], ["g"], axis=0, name="emb"),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1),
             helper.make_node("Cast", ["s"], ["h"], to=TP.FLOAT16),
             helper.make_node("Mul", ["h", "h"], ["hh"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["rs"], keepdims=1)]
    inits = [helper.make_tensor("table", TP.FLOAT, [9, 2], np.linspace(-1, 1, 18).tolist()),
             helper.make_tensor("k", TP.INT64, [1], [3]),
             helper.make_tensor("axes", TP.INT64, [1], [0])]
    g = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 9])],
                          [helper.make_tensor_value_info(n, t, None) for n, t in
                           (("s", TP.FLOAT), ("g", TP.FLOAT), ("tv", TP.FLOAT), ("ti", TP.INT64),
                            ("hh", TP.FLOAT16), ("rs", TP.FLOAT))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_ptx_names_its_level_and_every_kernel():
    g = _graph("mlp.onnx")
    for name, version, target in (("cuda-sm80", "7.0", "sm_80"), ("cuda-sm90", "7.8", "sm_90")):
        code = registry.get(name).compile(g, "fp32")
        assert code.layers[0][0] == media.CODE_PTX
        text = code.layers[0][1].decode()
        assert f".version {version}" in text and f".target {target}" in text
        plan = code.config["plan"]
        entries = re.findall(r"\.visible \.entry (\w+)\(", text)
        assert entries == [k["name"] for k in plan["cuda"]["kernels"]]
        assert plan["cuda"]["sm"] == int(target[3:]) and code.config["cuda_sm"] == int(target[3:])
        assert len(plan["dispatches"]) == len(entries)
        assert [mt for mt, _ in code.layers[1:]] == ([media.CODE_CUBIN] if PTXAS else [])


@needs_ptxas
@pytest.mark.parametrize("name", ["mlp.onnx", "bert_block.onnx", "ops", "capsule", "squeezenet"])
@pytest.mark.parametrize("level", ["cuda-sm80", "cuda-sm90"])
def test_ptxas_assembles_every_kernel(name, level):
    if name == "ops":
        g = compile_onnx(_ops_model())
    elif name == "capsule":
        g = compile_onnx(__import__("capsule").einsum_model())
    elif name == "squeezenet":
        g = compile_onnx(light.random_weight_model("squeezenet", 0))
    else:
        g = _graph(name)
    code = registry.get(level).compile(g, "fp32")   # (compile assembles with ptxas, or raises)
    cubin = dict(code.layers)[media.CODE_CUBIN]
    assert cubin[:4] == b"\x7fELF" and code.timings["ptxas"] > 0


def _emulated(g, feeds):
    art = registry.get("cuda-emulated").compile(g, "fp32")
    from types import SimpleNamespace

    # plan_runner takes a cpu artifact: the ELF, plan and weights
    shim = SimpleNamespace(elf=art.layers[0][1], plan=art.config["plan"], weights=art.tensors(g),
                           target="cuda-emulated")
    got = run_plan(shim, g, feeds)
    want = run_graph(g, feeds)
    for name in want:
        if want[name].dtype.kind in "iub":
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        else:
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                       rtol=RTOL if want[name].dtype != np.float16 else 1e-3,
                                       atol=ATOL if want[name].dtype != np.float16 else 1e-3,
                                       err_msg=name)


@pytest.mark.parametrize("batch", [1, 5])
def test_emulated_kernels_compute_the_interpreters_values(batch):
    g = compile_onnx(_ops_model())
    x = np.random.default_rng(batch).standard_normal((batch, 9)).astype(np.float32)
    _emulated(g, {"x": x})


def test_emulated_bert_block():
    g = _graph("bert_block.onnx")
    ids = np.random.default_rng(0).integers(-1000, 1000, (2, 9)).astype(np.int64)
    _emulated(g, {"ids": ids})


@pytest.mark.parametrize("name", ["squeezenet"])
def test_emulated_light_model(name):
    m = light.random_weight_model(name, 0)
    _emulated(compile_onnx(m), light.random_inputs(m, 0))


@pytest.mark.slow
@pytest.mark.parametrize("name", light.NAMES)
def test_emulated_every_light_model(name):
    m = light.random_weight_model(name, 0)
    _emulated(compile_onnx(m), light.random_inputs(m, 0))


def _gemm_softmax_model():
    """A MatMul with a dynamic M, a bias and GELU epilogue, then a softmax over 300 columns and
    a ReduceMax: a tiled contraction, group reductions and grid maps, with symbolic sizes."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["z"]),
             helper.make_node("Gelu", ["z"], ["h"], domain=""),
             helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("ReduceMax", ["h"], ["mx"], keepdims=0, axes=[1])]
    inits = [helper.make_tensor("w", TP.FLOAT, [40, 300], (rng.standard_normal(12000) * 0.2).tolist()),
             helper.make_tensor("bias", TP.FLOAT, [300], rng.standard_normal(300).tolist())]
    g = helper.make_graph(nodes, "gemm_softmax", [helper.make_tensor_value_info("x", TP.FLOAT, ["m", 40])],
                          [helper.make_tensor_value_info("s", TP.FLOAT, None),
                           helper.make_tensor_value_info("mx", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def test_contractions_tile_and_long_reductions_group():
    from mlpack.codegen.targets.cuda import compile as cc

    g = compile_onnx(_gemm_softmax_model())
    kinds = sorted(s[0] for s in cc.schedule(g)[5].values())
    assert kinds.count("tiled") == 1 and kinds.count("group") >= 2, kinds
    for m in (1, 70, 129):   # M below, at and past a tile's 64 rows
        _emulated(g, {"x": np.random.default_rng(m).standard_normal((m, 40)).astype(np.float32)})
    # the same kernels on the grid schedule alone compute the same
    art = registry.get("cuda-emulated").compile(g, "fp32", frozenset({"tiled", "group_reduce"}))
    assert {k["block"] for k in art.config["plan"]["cuda"]["kernels"]} == {256}


@pytest.mark.parametrize("precision, rtol", [("fp16", 3e-3), ("bf16", 2e-2)])
def test_tensor_core_tiles_compute_within_their_precision(precision, rtol):
    # fp16 and bf16 contractions run on mma.sync; emulated, the instruction is computed from the
    # PTX ISA's fragment layouts, so a fragment loaded into the wrong lane or register is an
    # O(1) error here, not a rounding one
    from mlpack.codegen import precisions
    from mlpack.codegen.targets.cuda import compile as cc

    g = compile_onnx(_gemm_softmax_model())
    low = precisions.apply(precision, g)
    schedules = cc.schedule(low, precision=precision)[5]
    assert [s[0] for s in schedules.values()].count("mma") == 1
    art = registry.get("cuda-emulated").compile(low, precision)
    assert art.inexact_passes == ("tensor_cores",)
    from types import SimpleNamespace

    shim = SimpleNamespace(elf=art.layers[0][1], plan=art.config["plan"], weights=art.tensors(low),
                           target="cuda-emulated")
    for m in (5, 130):
        x = np.random.default_rng(m).standard_normal((m, 40)).astype(np.float32)
        got, want = run_plan(shim, low, {"x": x}), run_graph(g, {"x": x})
        for name in want:
            err = np.abs(got[name] - want[name]).max() / np.abs(want[name]).max()
            assert err < rtol, (name, err)


@needs_ptxas
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("level", ["cuda-sm80", "cuda-sm90"])
def test_ptxas_assembles_tensor_core_kernels(precision, level):
    from mlpack.codegen import precisions

    g = precisions.apply(precision, _graph("bert_block.onnx"))
    code = registry.get(level).compile(g, precision)
    assert b"mma.sync.aligned.m16n8k16.row.col.f32" in code.layers[0][1]
    assert dict(code.layers)[media.CODE_CUBIN][:4] == b"\x7fELF"


def test_a_contraction_with_few_tiles_sums_its_k_in_parts():
    # [64, 2048] x [2048, 64] is one 64 x 64 output tile: split_k makes it 16 parts (a batch dim
    # of the tiled contraction) and a short sum that takes the bias as its epilogue
    from mlpack.codegen.targets.cuda import compile as cc
    from mlpack.codegen.targets.cuda import splitk

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    inits = [helper.make_tensor("w", TP.FLOAT, [2048, 64], (rng.standard_normal(2048 * 64) * 0.05).tolist()),
             helper.make_tensor("b", TP.FLOAT, [64], rng.standard_normal(64).tolist())]
    m = helper.make_model(helper.make_graph(nodes, "skinny", [helper.make_tensor_value_info("x", TP.FLOAT, [64, 2048])],
                                            [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    g = compile_onnx(m)
    split = splitk.split_k(g)
    assert len(split.ops) == len(g.ops) + 1
    part = next(op for op in split.ops if op.out.endswith(".part"))
    assert part.type.dims["ksplit"].value == 16
    schedules = cc.schedule(g)[5]
    assert sorted(s[0] for s in schedules.values()) == ["tiled"]   # (the short sum: a grid)
    _emulated(g, {"x": rng.standard_normal((64, 2048)).astype(np.float32)})
    assert len(cc.schedule(g, frozenset({"split_k"}))[0]) == 1


@needs_ptxas
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", light.NAMES)
def test_ptxas_assembles_every_light_model(name, precision):
    from mlpack.codegen import precisions

    g = precisions.apply(precision, compile_onnx(light.random_weight_model(name, 0)))
    for level in ("cuda-sm80", "cuda-sm90"):
        assert dict(registry.get(level).compile(g, precision).layers)[media.CODE_CUBIN][:4] == b"\x7fELF"
