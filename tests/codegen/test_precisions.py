"""The precisions (codegen/precisions/): every name of the spec's vocabulary is a module or
planned, fp32 the identity with a tolerance, the planned ones refused by name; every target's
precisions known. fp16 and bf16 store the contraction weights in 16 bits (weights16.py) and
nothing else: biases, scales and small constants stay f32, the expressions keep their dtypes,
and the interpreter's result moves by the weights' rounding only."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import precisions
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets import registry
from mlpack.spec import media
import support
from support import parse_ir

GRAPH = """graph "g" {
  in %x: f32{n=4} (n)
  %y: f32{n=4} = %x[n=n] * 2.0
  out %y (n)
}"""


def test_every_precision_of_the_spec_is_a_module_or_planned():
    assert precisions.names() == media.PRECISIONS
    assert set(precisions.MODULES) <= set(media.PRECISIONS)
    for name in precisions.names():
        module = precisions.get(name)
        assert module.NAME == name and module.SUMMARY
        assert module.IMPLEMENTED == (name in precisions.MODULES)
    assert precisions.implemented() == ("fp32", "fp16", "bf16", "int8")
    assert precisions.defaults() == ("fp32",)
    for name in precisions.implemented():
        assert precisions.tolerance(name).multiple > 0
    for t in registry.TARGETS.values():
        assert set(t.precisions) <= set(precisions.names()), t.name


def test_fp32_is_the_identity_and_planned_ones_are_refused_by_name(monkeypatch):
    g = parse_ir(GRAPH)
    assert precisions.apply("fp32", g) is g
    monkeypatch.delitem(precisions.MODULES, "int8")   # a name of the spec with no module
    with pytest.raises(UnsupportedTargetError, match=r"precision int8 is not implemented yet \(planned\)"):
        precisions.apply("int8", g)
    with pytest.raises(UnsupportedTargetError, match=r"unknown precision 'fp64'"):
        precisions.get("fp64")


def _dense_model(scale: float = 1.0):
    """x @ W + b, then LayerNormalization with its own scale and bias: one contraction weight
    (W, 64 x 32) among constants that must stay f32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 32)) * scale).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("LayerNormalization", ["z", "gamma", "beta"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("name, dtype, bound", [("bf16", "bf16", 2 ** -7), ("fp16", "f16", 2 ** -10)])
def test_16_bit_precisions_store_the_contraction_weights_narrow(name, dtype, bound):
    import mlpack
    from mlpack.spec.ir.graph import Comprehension
    from mlpack.spec.ir.interp import run_graph

    model, w = _dense_model()
    g = mlpack.compile_onnx(model)
    narrow = precisions.apply(name, g)
    changed = {n for n, c in narrow.constants.items() if c.type.dtype != g.constants[n].type.dtype}
    assert len(changed) == 1, changed                   # W, and not b, gamma, beta or epsilon
    (wname,) = changed
    c = narrow.constants[wname]
    assert c.type.dtype == dtype and c.data.nbytes * 2 == g.constants[wname].data.nbytes
    # every read of W widens to f32: the ops' dtypes are unchanged
    assert [op.type for op in narrow.ops if isinstance(op, Comprehension)] == \
           [op.type for op in g.ops if isinstance(op, Comprehension)]
    # the values are W's, rounded to nearest (the constant may be laid out in another order)
    from mlpack.spec.ir import dtypes
    rounded = w.astype(dtypes.to_numpy(dtype)).astype(np.float32)
    np.testing.assert_array_equal(np.sort(c.data.astype(np.float32).ravel()), np.sort(rounded.ravel()))
    assert np.abs(rounded - w).max() <= bound / 2 * np.abs(w).max()
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    want, got = run_graph(g, {"x": x})["y"], run_graph(narrow, {"x": x})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 8 * bound, err                     # moved, by the weights' rounding only


def test_fp16_keeps_weights_beyond_its_range_in_f32():
    import mlpack

    model, _ = _dense_model(scale=1e5)                 # some |w| > 65504
    g = mlpack.compile_onnx(model)
    assert precisions.apply("fp16", g) is g
    assert precisions.apply("bf16", g) is not g        # bf16 has f32's range


def test_precision_lists_expand():
    assert precisions.expand(["fp32,bf16", "bf16"]) == ["fp32", "bf16"]
    assert precisions.expand(["all"]) == list(precisions.implemented())
    assert precisions.expand([]) == []


def test_int8_quantizes_weights_per_channel_and_activations_from_calibration():
    import mlpack
    from mlpack.codegen.precisions import int8
    from mlpack.spec.ir.interp import run_graph

    model, w = _dense_model()
    g = mlpack.compile_onnx(model)
    assert precisions.calibrates("int8") and not precisions.calibrates("bf16")
    with pytest.raises(UnsupportedTargetError, match="int8 needs activation ranges"):
        precisions.apply("int8", g)
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(4)]
    calib = precisions.calibrate("int8", g, feeds)
    (xname,) = calib
    lo, hi = calib[xname]
    assert lo < 0 < hi and hi - lo <= np.ptp(np.concatenate([f["x"] for f in feeds])) + 1e-6
    q = precisions.apply("int8", g, calib)
    dtypes = {n: c.type.dtype for n, c in q.constants.items()}
    (wq,) = [n for n, d in dtypes.items() if d == "i8"]
    data = q.constants[wq].data
    # per output channel (W's second axis, n): each channel's largest magnitude is 127
    axis = q.constants[wq].layout.index(q.constants[wq].layout[
        [i for i, s in enumerate(data.shape) if s == 32][0]])
    assert (np.abs(data).max(axis=1 - axis) == 127).all()
    sums = [op for op in q.ops if getattr(op, "reduce", None) == "sum"]
    assert any(op.type.dtype == "i32" for op in sums)        # the contraction sums in i32
    assert any(op.type.dtype == "u8" for op in q.ops if hasattr(op, "type"))   # x quantized
    # the scale that dequantizes is sx * sw per channel, and 0.0 maps to the zero point
    sx, zx = int8.quantize_params(lo, hi)
    assert np.round(0.0 / sx) + zx == zx and 0 <= zx <= 255
    x = rng.standard_normal((4, 64)).astype(np.float32)
    want, got = run_graph(g, {"x": x})["y"], run_graph(q, {"x": x})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 2 ** -10 < err < 2 ** -4, err


def test_int8_range_is_the_candidate_of_least_squared_error():
    from mlpack.codegen.precisions import int8

    rng = np.random.default_rng(0)
    for v in (rng.uniform(-1, 1, 50_000), np.maximum(rng.standard_normal(50_000), 0),
              rng.standard_t(1.5, 50_000)):
        def mse(r):
            return np.mean((int8._qdq(v, *int8.quantize_params(*r)) - v) ** 2)
        lo, hi = int8.choose_range(v, v.min(), v.max())
        for p in (99.9, 99.99, 99.999):
            assert mse((lo, hi)) <= mse((np.percentile(v, 100 - p), np.percentile(v, p)))
        assert mse((lo, hi)) <= mse((v.min(), v.max()))
    relu = np.maximum(rng.standard_normal(1000), 0)   # a ReLU's output: zero point 0
    assert int8.quantize_params(*int8.choose_range(relu, 0.0, relu.max()))[1] == 0


def test_int8_leaves_shallow_and_weightless_contractions_in_f32():
    from mlpack.codegen.precisions import int8

    g = parse_ir(f"""graph "g" {{
  in %x: f32{{n=4, k=8}} (n, k)
  const %W: f32{{k=8, m=16}} (k, m) = [{', '.join(['0.5'] * 128)}]
  %y: f32{{n=4, m=16}} = sum{{k=8}} %x[n=n, k=k] * %W[k=k, m=m]
  out %y (n, m)
}}""")
    assert int8.contractions(g) == []   # a depth of 8: below MIN_DEPTH
    assert precisions.apply("int8", g, {}) is g


def test_int8_pools_the_bytes_of_a_max_pooling_it_quantizes(monkeypatch):
    """The input of a contraction that a max pooling computes is quantized before the pooling
    (quantization does not decrease, so the max of the bytes is the byte of the max): the
    pooling takes the max of u8 values and the f32 one is gone; the outputs are the very same
    numbers as with the pooling's output quantized."""
    import mlpack
    from mlpack.codegen.precisions import int8
    from mlpack.spec.ir.interp import run_graph

    rng = np.random.default_rng(4)
    g = mlpack.compile_onnx(support.conv_pool_conv_model(rng))
    feeds = [{"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)} for _ in range(4)]
    calib = precisions.calibrate("int8", g, feeds)
    q = precisions.apply("int8", g, calib)
    pools = [op for op in q.ops if getattr(op, "reduce", None) == "max"]
    assert [op.type.dtype for op in pools] == ["u8"]
    monkeypatch.setattr(int8, "_max_pools", lambda graph: {})
    plain = precisions.apply("int8", g, calib)
    assert [op.type.dtype for op in plain.ops if getattr(op, "reduce", None) == "max"] == ["f32"]
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32) * 2
    np.testing.assert_array_equal(run_graph(q, {"x": x})["y"], run_graph(plain, {"x": x})["y"])
