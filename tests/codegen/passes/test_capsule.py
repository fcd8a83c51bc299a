"""End to end: the framework form of a convolutional capsule layer (Gather patches, Transpose,
Reshape, broadcasting MatMul, ReduceSum; tests/models/capsule.py) compiles to the same single
contraction as the direct Einsum form, and both match ONNX Runtime."""

import importlib.util
import os

import numpy as np
import onnxruntime as ort
import pytest

import mlpack
from mlpack.spec.ir.expr import substitute, var
from mlpack.spec.ir.graph import Comprehension, TensorType
from mlpack.spec.ir.printer import format_comprehension

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models")


def _capsule():
    spec = importlib.util.spec_from_file_location("mlpack_test_capsule", os.path.join(MODELS, "capsule.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


capsule = _capsule()


def _canonical(g) -> str:
    """The graph's one op with its dims renamed by position (output dims in the output's
    layout, reduction dims in order), so two spellings of the same math print the same."""
    (op,), (port,) = g.ops, g.outputs
    names = {d: f"o{k}" for k, d in enumerate(port.layout)}
    names.update({d: f"r{k}" for k, d in enumerate(op.rdims)})
    body = substitute(op.body, {d: var(n) for d, n in names.items()})
    dims = {names[d]: op.type.dims[d] for d in port.layout}
    rdims = {names[d]: s for d, s in op.rdims.items()}
    return format_comprehension(Comprehension(op.out, TensorType(op.type.dtype, dims), body,
                                              op.reduce, rdims))


# W must be too big for the importer to fold its Reshape into a new constant (see below)
@pytest.mark.parametrize("sizes", [dict(batch=1, size=7, caps=24), dict()])
def test_framework_form_compiles_to_the_einsum_contraction(sizes):
    direct = mlpack.compile_onnx(capsule.einsum_model(**sizes))
    framework = mlpack.compile_onnx(capsule.framework_model(**sizes))
    text = _canonical(framework)
    assert text == _canonical(direct)
    # one sum over (kx, ky, ci, k) of P at the strided window times W: nothing materialized
    assert [op.out for op in framework.ops] == ["V"] and list(framework.constants) == ["W"]
    assert text.startswith("%V: f32{") and " = sum{r0=3, r1=3, r2=" in text
    assert "%P[d0=o0, d1=2 * o1 + r0, d2=2 * o2 + r1, d3=r2, d4=o4, d5=r3] * %W[" in text


@pytest.mark.parametrize("build", ["einsum_model", "framework_model"])
def test_both_forms_match_onnx_runtime(build):
    model = getattr(capsule, build)(batch=2, size=9, caps=4)
    p = capsule.poses(batch=2, size=9, caps=4)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"P": p})[0]
    got = mlpack.run_reference(model, {"P": p})["V"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, capsule.reference(p, capsule.weights(4)), rtol=1e-4, atol=1e-5)


def test_a_small_folded_weight_reshape_is_read_at_an_affine_index():
    # W small enough that the importer folds Reshape(W) into a constant [9*caps, caps, 4, 4]:
    # still one contraction, that constant read at a flattened (affine) index, no div/mod
    framework = mlpack.compile_onnx(capsule.framework_model(batch=2, size=7, caps=3))
    text = _canonical(framework)
    assert len(framework.ops) == 1 and "//" not in text and "%" not in text.split("=", 1)[1].replace("%P", "").replace("%w_rows", "")
    assert "%P[d0=o0, d1=2 * o1 + r0, d2=2 * o2 + r1, d3=r2, d4=o4, d5=r3] * %w_rows[d0=9 * r0 + (3 * r1 + r2)" in text
