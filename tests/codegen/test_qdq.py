"""Models that arrive quantized (codegen/precisions/qdq.py): ONNX Runtime's QDQ contractions go
on int8's exact i32 sums in the int8 precision (s8 weights, or u8 ones with zero points), keep their float form in the others (with the
dequantized weights evaluated once), and compute what ONNX Runtime computes for the same model.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import support

from mlpack.codegen import precisions
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.passes.fold_constants import fold_constant_maps
from mlpack.codegen.precisions import int8
from mlpack.spec import accuracy
from mlpack.spec.ir.interp import run_graph
from mlpack.spec.ir.printer import format_graph

quantized = support.load_models_module("quantized")


@pytest.fixture(scope="module")
def qdq(tmp_path_factory):
    path = quantized.qdq_convnet(str(tmp_path_factory.mktemp("qdq")))
    return path, compile_onnx(onnx.load(path))


def _sums(g):
    """(output dtype, operand dtypes) of each sum of products of ``g``."""
    out = []
    for op in g.ops:
        if getattr(op, "reduce", None) == "sum" and op.body.op == "mul":
            reads = [n for n in op.body.args for n in [n.args[0] if n.op == "cast" else n]]
            out.append((op.type.dtype, tuple(r.dtype for r in reads)))
    return out


def test_int8_puts_the_deep_qdq_contractions_on_integer_sums(qdq):
    _, g = qdq
    before = format_graph(g)
    out = precisions.apply("int8", g, int8.calibrate(g, quantized.feeds(2, 3)))
    assert format_graph(g) == before   # the shared graph is not touched
    sums = _sums(out)
    # the 3x3 convolution over 32 channels and the 32-deep Gemm: u8 x i8 in i32; the first
    # convolution (27 deep, under int8.MIN_DEPTH) and the pooling stay f32
    assert sums.count(("i32", ("u8", "i8"))) == 2
    assert ("f32", ("f32", "f32")) in sums
    # the model's own integers, not requantized ones: its i8 initializer is what the sum reads
    model = onnx.load(qdq[0])
    w2 = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer
              if t.name == "w2_quantized")
    assert any(np.array_equal(c.data, w2) for c in out.constants.values() if c.type.dtype == "i8")


def test_a_quantized_model_is_calibrated_on_nothing(qdq):
    _, g = qdq
    assert int8.quantizes(g)
    assert int8.calibrate(g, quantized.feeds(2, 3)) == {}


def test_the_integer_sums_compute_what_onnx_runtime_computes(qdq):
    """Sums exact in i32, scaled once: the outputs are ONNX Runtime's with its exact int8
    kernels (support.oracle_outputs: they saturate on CPUs without VNNI otherwise) up to the
    requantizations' rounding, an output step at most, and within int8's tolerance of the
    float64 reference."""
    path, g = qdq
    out = precisions.apply("int8", g, {})
    from mlpack.packager.reference import float64_outputs
    model = onnx.load(path)
    worst_ort, worst_ref, scale = 0.0, 0.0, 0.0
    for feed in quantized.feeds(4, 11):
        got = run_graph(out, feed)["y"]
        [ort] = support.oracle_outputs(model, feed, "ort-exact")
        scale = max(scale, float(abs(ort).max()))
        ref = float64_outputs(g, [feed])[0]["y"]
        worst_ort = max(worst_ort, accuracy.measure(got, ort).max_error)
        worst_ref = max(worst_ref, accuracy.measure(got, ref).max_error)
    step = float(onnx.numpy_helper.to_array(next(
        t for t in model.graph.initializer if t.name == "y_scale")))
    assert worst_ort <= 2 * step / scale
    assert worst_ref <= accuracy.TOLERANCES["int8"].cap


@pytest.mark.parametrize("per_channel", [True, False])
def test_asymmetric_u8_weights_with_zero_points_sum_on_the_same_kernels(tmp_path, per_channel):
    """u8 weights with zero points (quantize_static's asymmetric QUInt8, per channel and per
    tensor): ``W - zw`` is an s8 weight plus a per-channel shift whose share is a row sum
    (qlinear.py), so the deep contractions still multiply u8 x s8 and give ONNX Runtime's
    outputs (its exact int8 kernels) bit for bit."""
    path = quantized.qdq_convnet(str(tmp_path), "u8", per_channel)
    model = onnx.load(path)
    assert any(t.data_type == onnx.TensorProto.UINT8 and onnx.numpy_helper.to_array(t).any()
               for t in model.graph.initializer if t.name.endswith("zero_point")
               and t.name.startswith("w"))
    out = precisions.apply("int8", compile_onnx(model), {})
    assert _sums(out).count(("i32", ("u8", "i8"))) == 2
    for feed in quantized.feeds(3, 13):
        [want] = support.oracle_outputs(model, feed, "ort-exact")
        np.testing.assert_array_equal(run_graph(out, feed)["y"], want)


def test_fp32_keeps_the_float_form_with_its_weights_evaluated_once(qdq):
    _, g = qdq
    out = precisions.apply("fp32", g)
    assert all(s[0] == "f32" for s in _sums(out))
    # no weight is dequantized on every run any more: no op reads an i8 constant
    i8 = {n for n, c in out.constants.items() if c.type.dtype == "i8"}
    assert not i8 and len(out.ops) < len(g.ops)
    feed = quantized.feeds(1, 5)[0]
    np.testing.assert_array_equal(run_graph(out, feed)["y"], run_graph(g, feed)["y"])
    assert _sums(precisions.apply("bf16", g))   # 16-bit weights of the evaluated ones


def test_folding_never_materializes_a_broadcast():
    g = support.parse_ir("""
graph "b" {
  in %x: f32{a=4, b=64} (a, b)
  const %c: f32{b=64} (b) = dense"%s"
  %wide: f32{a=4, b=64} = %c[b=b] * 2.0
  %half: f32{b=64} = %c[b=b] * 0.5
  %y: f32{a=4, b=64} = %x[a=a, b=b] * %wide[a=a, b=b] + %half[b=b]
  out %y (a, b)
}""".replace("%s", __import__("base64").b64encode(np.arange(64, dtype=np.float32).tobytes()).decode()))
    out = fold_constant_maps(g)
    assert "half" in out.constants and "wide" not in out.constants
    x = np.ones((4, 64), np.float32)
    np.testing.assert_array_equal(run_graph(out, {"x": x})["y"], run_graph(g, {"x": x})["y"])
