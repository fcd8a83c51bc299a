"""The cpu target's narrow dtypes (fp8, fp4, int4, int2): conversions and storage.

Conversions are checked exhaustively through real kernels (one-cast graphs run by the plan
runner): every code of every narrow type decodes to what ml_dtypes gives, and a dense sweep of
f32 values (every 2**16-th bit pattern and its neighbours, every halfway point between two
codes and one f32 ulp either side, subnormals, overflow, +-inf, nans), all f16 and bf16
values and f64 halfway cases encode to the same bits as ml_dtypes (the interpreter's
``astype``). Storage: packed sub-byte intermediates and weights, unpacked ports, the
single-workgroup rule for packed outputs, and ONNX models (Cast with both saturate modes,
QuantizeLinear/DequantizeLinear) natively against the interpreter; and the f16 reduction
rounding points the kernels share with the interpreter.
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plan_runner

from plan_runner import run_plan  # noqa: E402
from support import host_lacks  # noqa: E402

from mlpack.codegen.compile import compile_onnx  # noqa: E402
from mlpack.codegen.targets.cpu import compile_cpu, narrowconv  # noqa: E402
from mlpack.codegen.targets.cpu.kernel import Buffer  # noqa: E402
from mlpack.codegen.targets.cpu.plan import nbytes  # noqa: E402
from mlpack.spec.ir import dtypes as dt  # noqa: E402
from mlpack.spec.ir import expr as ex  # noqa: E402
from mlpack.spec.ir.graph import Comprehension, Constant, Graph, Port, TensorType  # noqa: E402
from mlpack.spec.ir.interp import run_graph  # noqa: E402

# ml_dtypes warns when a cast overflows: that is what these tests feed it on purpose
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")
TARGET = "x86_64-v3"
FLOATS = ["f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "f8e8m0", "f4e2m1"]
INTS = ["i4", "u4", "i2", "u2"]
NARROW = FLOATS + INTS


def cast_graph(src: str, dst: str, n: int, via: str | None = None) -> Graph:
    """y = cast(a, dst), or through an intermediate tensor of dtype ``via``."""
    g = Graph("cast")
    g.add_input("a", TensorType(src, {"i": n}), ("i",))
    cur, cur_dt = "a", src
    if via is not None:
        g.add_op(Comprehension("t", TensorType(via, {"i": n}),
                               ex.cast(ex.read("a", {"i": ex.var("i")}, src), via)))
        cur, cur_dt = "t", via
    g.add_op(Comprehension("y", TensorType(dst, {"i": n}),
                           ex.cast(ex.read(cur, {"i": ex.var("i")}, cur_dt), dst)))
    g.outputs.append(Port("y", ("i",)))
    return g


def run_cast(x: np.ndarray, dst: str, via: str | None = None, target: str = TARGET) -> np.ndarray:
    src = dt.from_numpy(x.dtype)
    g = cast_graph(src, dst, x.size, via)
    return run_plan(compile_cpu(g, target), g, {"a": x})["y"]


def assert_same_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray | None = None) -> None:
    """Equal bit for bit; nans only need to be nans of the same sign."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}")
    if got.dtype.kind == "V" or dt.from_numpy(got.dtype) in NARROW or got.dtype.kind in "iub":
        bad = g != w
    else:
        nan = np.isnan(want.astype(np.float64))
        sign = np.signbit(got.astype(np.float64)) != np.signbit(want.astype(np.float64))
        bad = np.where(nan, ~np.isnan(got.astype(np.float64)) | sign, g != w)
    where = np.nonzero(bad)[0]
    if len(where):
        i = where[:8]
        shown = "" if x is None else f" inputs {x.reshape(-1)[i]!r}"
        raise AssertionError(f"{len(where)} mismatches, e.g. at {i}: got {g.reshape(-1)[i]}, "
                             f"want {w.reshape(-1)[i]}{shown}")


def codes(dtype: str) -> np.ndarray:
    return np.arange(1 << dt.bits(dtype), dtype=np.uint8).view(dt.to_numpy(dtype))


def f32_sweep(dtype: str) -> np.ndarray:
    """Every 2**16-th f32 bit pattern and its neighbours (both signs, subnormals, inf, nans),
    and around every halfway point of ``dtype``'s values: the point and one ulp either side."""
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], dtype=np.uint32)
    grid = (hi[:, None] | lows[None, :]).reshape(-1).view(np.float32)
    vals = codes(dtype).astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    # past the largest finite value: its halfway point to the next binade step, and beyond
    top = vals[-1]
    step = top - vals[-2]
    extra = np.array([top + step / 2, top + step, top * 2, 1e38, 3e38, 2.0 ** -127, 2.0 ** -128,
                      1.25 * 2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -149])
    pts = np.concatenate([mids, extra, vals]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(-np.inf))])
    return np.concatenate([grid, pts, -pts,
                           np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)])


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("dtype", NARROW)
def test_every_code_decodes_like_ml_dtypes(dtype):
    x = codes(dtype)
    for out in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        assert_same_bits(run_cast(x, dt.from_numpy(out)), x.astype(out), x.view(np.uint8))


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("out", ["i32", "u8", "i8", "bool"])
def test_every_code_casts_to_ints_like_the_interpreter(dtype, out):
    x = codes(dtype)
    if out == "i32":   # (out of range float -> int casts are C's undefined behaviour)
        x = x[np.abs(x.astype(np.float64)) < 2.0 ** 31]
    g = cast_graph(dtype, out, x.size)
    want = run_graph(g, {"a": x})["y"]
    assert_same_bits(run_plan(compile_cpu(g, TARGET), g, {"a": x})["y"], want, x.view(np.uint8))


# ---------------------------------------------------------------- encode


@pytest.mark.parametrize("dtype", NARROW)
def test_f32_sweep_encodes_like_ml_dtypes(dtype):
    x = f32_sweep(dtype)
    assert_same_bits(run_cast(x, dtype), x.astype(dt.to_numpy(dtype)), x)


@pytest.mark.parametrize("dtype", NARROW)
def test_f32_sweep_encodes_the_same_on_every_target(dtype):
    x = f32_sweep(dtype)
    want = x.astype(dt.to_numpy(dtype))
    # TARGET (v3) is the test above; v4 where the host runs it (AVX-512)
    for target in (t for t in ("x86_64-v2", "x86_64-v4") if host_lacks(t) is None):
        assert_same_bits(run_cast(x, dtype, target=target), want, x)


@pytest.mark.parametrize("dtype", NARROW)
def test_every_f16_and_bf16_encodes_like_ml_dtypes(dtype):
    for src in (np.float16, ml_dtypes.bfloat16):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(src)
        assert_same_bits(run_cast(x, dtype), x.astype(dt.to_numpy(dtype)), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_f64_narrows_through_f32_like_ml_dtypes(dtype):
    # ml_dtypes converts f64 via f32: a value a hair above a halfway point rounds as the point
    vals = codes(dtype).astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    x = np.concatenate([mids, mids * (1 + 1e-12), mids * (1 - 1e-12), -mids, vals, [1e300, -1e300]])
    assert_same_bits(run_cast(x, dtype), x.astype(dt.to_numpy(dtype)), x)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("src", ["i8", "u8", "i32", "i64", "bool"])
def test_ints_narrow_like_the_interpreter(dtype, src):
    if src == "bool":
        x = np.array([True, False, True])
    elif src in ("i8", "u8"):
        x = np.arange(256, dtype=np.uint8).view(dt.to_numpy(src))
    else:
        x = np.concatenate([np.arange(-300, 300), [2**20 + 1, -(2**24) - 3, 2**31 - 1]]).astype(
            dt.to_numpy(src))
    g = cast_graph(src, dtype, x.size)
    assert_same_bits(run_plan(compile_cpu(g, TARGET), g, {"a": x})["y"], run_graph(g, {"a": x})["y"], x)


@pytest.mark.parametrize("dtype", INTS)
def test_floats_wrap_into_narrow_ints_like_ml_dtypes(dtype):
    x = np.concatenate([np.linspace(-40, 40, 3201), [np.nan, np.inf, -np.inf, 1e6]]).astype(np.float32)
    g = cast_graph("f32", dtype, x.size)
    assert_same_bits(run_plan(compile_cpu(g, TARGET), g, {"a": x})["y"], run_graph(g, {"a": x})["y"], x)


def _interpreter_casts(a: str, b: str) -> bool:
    """Whether ml_dtypes (so the interpreter, the oracle here) casts ``a`` to ``b`` at all: it
    has no e8m0 <-> other fp8 or int4 <-> uint4 casts, among others."""
    try:
        np.zeros(1, dt.to_numpy(a)).astype(dt.to_numpy(b))
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("a, b", [(a, b) for a in NARROW for b in NARROW if _interpreter_casts(a, b)])
def test_narrow_to_narrow(a, b):
    x = codes(a)
    g = cast_graph(a, b, x.size)
    want = run_graph(g, {"a": x})["y"]
    got = run_plan(compile_cpu(g, TARGET), g, {"a": x})["y"]
    if a == b == "f8e5m2":
        # the only format with several nans: they pass through an f32 register, so a copy
        # gives the canonical one (0x7e/0xfe), as f16 copies on x86 do
        nan = np.isnan(want.astype(np.float32))
        assert np.isnan(got[nan].astype(np.float32)).all()
        got, want, x = got[~nan], want[~nan], x[~nan]
    assert_same_bits(got, want, x.view(np.uint8))


# ---------------------------------------------------------------- storage


def test_pack_matches_onnx_packing():
    x = np.array([1, -2, 3, -8, 7], dtype=ml_dtypes.int4)
    packed = narrowconv.pack(x, "i4")
    assert packed.tolist() == [0xE1, 0x83, 0x07]   # low nibble first, last high nibble zero
    assert narrowconv.unpack(packed, "i4", x.shape).tolist() == x.tolist()
    y = np.array([1, 2, 3, 0, 1], dtype=ml_dtypes.uint2)
    assert narrowconv.pack(y, "u2").tolist() == [0b00111001, 0b01]
    assert narrowconv.unpack(narrowconv.pack(y, "u2"), "u2", y.shape).tolist() == y.tolist()


def test_sub_byte_arena_bytes_round_up():
    for n, dtype, want in ((129, "i4", 65), (129, "u2", 33), (129, "f8e4m3fn", 129)):
        buf = Buffer("t", ("i",), {"i": ex.const(n)}, dtype)
        assert nbytes(buf).value >= want
    buf = Buffer("t", ("i",), {"i": ex.sym("n")}, "i4")
    size = nbytes(buf)
    from plan_runner import eval_expr
    from mlpack.spec.ir.program import encode_expr
    for n in (1, 63, 127, 128, 129, 1001):
        assert eval_expr(encode_expr(size), {"n": n}) >= (n + 1) // 2


@pytest.mark.parametrize("via", ["i4", "u4", "i2", "u2", "f4e2m1", "f8e5m2"])
@pytest.mark.parametrize("n", [1, 7, 64, 1001, 70001])
def test_packed_intermediates_round_trip(via, n):
    # the intermediate lives in the arena, packed; a big one spans several workgroups
    x = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)
    g = cast_graph("f32", "f32", n, via)
    assert_same_bits(run_plan(compile_cpu(g, TARGET), g, {"a": x})["y"], run_graph(g, {"a": x})["y"], x)


def test_packed_output_is_written_by_one_workgroup():
    g = cast_graph("f32", "f32", 200001, "i4")
    art = compile_cpu(g, TARGET)
    disp = art.plan["dispatches"][0]
    from plan_runner import eval_expr
    assert eval_expr(disp["workgroups"], {}) > 1   # shared out, but workgroup 0 does it all
    x = np.linspace(-9, 9, 200001).astype(np.float32)
    assert_same_bits(run_plan(art, g, {"a": x})["y"], run_graph(g, {"a": x})["y"], x)


def test_narrow_weight_is_packed():
    w = (np.arange(7 * 33) % 16 - 8).astype(ml_dtypes.int4).reshape(7, 33)
    g = Graph("w")
    g.add_input("a", TensorType("f32", {"i": 7, "j": 33}), ("i", "j"))
    g.add_constant(Constant("w", TensorType("i4", {"i": 7, "j": 33}), ("i", "j"), w))
    ix = {"i": ex.var("i"), "j": ex.var("j")}
    g.add_op(Comprehension("y", TensorType("f32", {"i": 7, "j": 33}),
                           ex.read("a", ix, "f32") * ex.cast(ex.read("w", ix, "i4"), "f32")))
    g.outputs.append(Port("y", ("i", "j")))
    art = compile_cpu(g, TARGET)
    assert art.weights["w"].dtype == np.uint8 and art.weights["w"].size == (7 * 33 + 1) // 2
    x = np.ones((7, 33), np.float32)
    assert_same_bits(run_plan(art, g, {"a": x})["y"], w.astype(np.float32))


# ---------------------------------------------------------------- ONNX models, natively


def _native():
    from mlpack.runtime import native
    if not native.available():
        pytest.skip("libmlpack is not built")
    from mlpack import backend
    return backend


def _model(nodes, inputs, outputs, inits=(), opset=21):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _both(model, feeds):
    backend = _native()
    want = backend.prepare(model, mode="interp").run(feeds)
    got = backend.prepare(model, mode="native", threads=4).run(feeds)
    for a, b in zip(got, want):
        assert_same_bits(np.asarray(a), np.asarray(b))


ONNX_TYPES = {"f8e4m3fn": TensorProto.FLOAT8E4M3FN, "f8e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
              "f8e5m2": TensorProto.FLOAT8E5M2, "f8e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ}


@pytest.mark.parametrize("dtype", list(ONNX_TYPES))
@pytest.mark.parametrize("saturate", [0, 1])
def test_onnx_cast_saturate_modes(dtype, saturate):
    x = f32_sweep(dtype)[::7].copy()
    node = helper.make_node("Cast", ["x"], ["y"], to=ONNX_TYPES[dtype], saturate=saturate)
    model = _model([node], [("x", TensorProto.FLOAT, [x.size])], [("y", ONNX_TYPES[dtype], [x.size])])
    _both(model, {"x": x})
    # and through the plan runner, against the interpreter of the same graph
    g = compile_onnx(model)
    assert_same_bits(run_plan(compile_cpu(g, TARGET), g, {"x": x})["y"], run_graph(g, {"x": x})["y"], x)


@pytest.mark.parametrize("qtype", [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2,
                                   TensorProto.UINT2, TensorProto.FLOAT4E2M1,
                                   TensorProto.FLOAT8E4M3FN])
def test_onnx_quantize_dequantize_through_packed_intermediate(qtype):
    # a big odd-shaped packed intermediate written by one workgroup while the engine runs
    # several threads: any byte shared between threads would show as a wrong element
    shape = [301, 257]
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(np.float32)
    np_q = helper.tensor_dtype_to_np_dtype(qtype)
    zp = numpy_helper.from_array(np.zeros((), np_q), "zp")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    # q is read twice, so it is not fused away: it stays a packed tensor in the arena
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0]),
             helper.make_node("DequantizeLinear", ["qt", "scale", "zp"], ["yt"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, shape)],
                   [("y", TensorProto.FLOAT, shape), ("yt", TensorProto.FLOAT, shape[::-1])],
                   [zp, scale], opset=25 if qtype in (TensorProto.INT2, TensorProto.UINT2) else 23)
    g = compile_onnx(model)
    assert any(op.out not in ("y", "yt") and op.type.dtype == g.types["q"].dtype for op in g.ops)
    for _ in range(3):
        _both(model, {"x": x})


def test_onnx_dequantize_packed_int4_weight_blocked():
    w = np.random.default_rng(2).integers(-8, 8, size=(33, 17)).astype(ml_dtypes.int4)
    scale = np.random.default_rng(3).uniform(0.1, 1, size=(11, 17)).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0, block_size=3),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "s")]
    model = _model(nodes, [("x", TensorProto.FLOAT, [5, 33])], [("y", TensorProto.FLOAT, [5, 17])],
                   inits)
    x = np.random.default_rng(4).standard_normal((5, 33)).astype(np.float32)
    backend = _native()
    want = backend.prepare(model, mode="interp").run({"x": x})[0]
    got = backend.prepare(model, mode="native").run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_narrow_ports_round_trip():
    # int4 in, int4 out: ports are one element a byte, passed to the engine as u8
    x = np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4).reshape(4, 4)
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])]
    model = _model(nodes, [("x", TensorProto.INT4, [4, 4])], [("y", TensorProto.INT4, [4, 4])])
    backend = _native()
    got = backend.prepare(model, mode="native").run({"x": x})[0]
    assert got.dtype == np.dtype(ml_dtypes.int4)
    assert got.tolist() == x.T.tolist()
    onnx.checker.check_model(model)


# ---------------------------------------------------------------- f16 reductions (lower.py)


@pytest.mark.parametrize("name", ["test_attention_4d_causal_fp16",
                                  "test_attention_4d_gqa_causal_nonpad_decode_fp16",
                                  "test_causal_conv_with_state_silu_fp16"])
def test_f16_reductions_round_where_the_interpreter_does(name):
    # f16 sums accumulate in f32 over f16-rounded terms (softmax probabilities times V),
    # and an epilogue sees the f16 value: these were 1 f16 ulp over the suite's tolerance
    _native()
    from mlpack import conformance
    (case,) = conformance.load_cases(f"^{name}$")
    assert conformance.run_case(case, "native") == ("pass", "")
