"""The cpu target's trigonometric/hyperbolic/pow/atan2/fmod lowerings and its f16/bf16 tensors.

Accuracy is measured through real kernels (one-op graphs run by the plan runner) against
float64 NumPy over wide grids; the bounds are mathlib.py's table (about 1.5x its measured
errors). Special values (nan, +-inf, signed zeros, pow's integer-exponent rules) must match
NumPy exactly. f16/bf16 kernels are compared with the reference interpreter, and libraries
using them are checked to import nothing on every target (no half-conversion libcalls).
"""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest

from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.spec.ir import expr as ex
from mlpack.spec.ir.graph import Comprehension, Graph, Port, TensorType
from mlpack.spec.ir.interp import run_graph
from plan_runner import HOST_TARGETS, NARROW_AND_WIDE, TARGETS, run_plan

ALL_TARGETS = (*TARGETS, "aarch64")


def op_graph(op: str, dtype: str, n: int, arity: int = 1, out_dtype: str | None = None) -> Graph:
    g = Graph("math")
    names = ["a", "b"][:arity]
    for name in names:
        g.add_input(name, TensorType(dtype, {"i": n}), ("i",))
    args = [ex.read(name, {"i": ex.var("i")}, dtype) for name in names]
    body = ex.unary(op, args[0]) if arity == 1 else ex.binary(op, *args)
    if out_dtype is not None:
        body = ex.cast(body, out_dtype)
    g.add_op(Comprehension("y", TensorType(body.dtype, {"i": n}), body))
    g.outputs.append(Port("y", ("i",)))
    return g


def run_op(op: str, *xs: np.ndarray, target: str = "x86_64-v3", dtype: str = "f32"):
    g = op_graph(op, dtype, xs[0].size, len(xs))
    feeds = dict(zip("ab", xs))
    return run_plan(compile_cpu(g, target), g, feeds)["y"], g, feeds


def _grid(lo, hi, n=200001):
    return np.linspace(lo, hi, n).astype(np.float32)


# name: (reference, grid, max relative error, floor for |ref| below which the error is absolute)
UNARY = {
    "sin": (np.sin, _grid(-1e4, 1e4), 2e-7, 1e-3),
    "cos": (np.cos, _grid(-1e4, 1e4), 2e-7, 1e-3),
    "tan": (np.tan, _grid(-100, 100), 2.5e-7, 1e-3),
    "asin": (np.arcsin, _grid(-1, 1), 4e-7, 0),
    "acos": (np.arccos, _grid(-1, 1), 2.5e-7, 0),
    "atan": (np.arctan, np.concatenate([_grid(-50, 50), np.geomspace(1e-30, 3e38, 20001)
                                        .astype(np.float32)]), 2.5e-7, 0),
    "sinh": (np.sinh, _grid(-89, 89), 2.5e-7, 0),
    "cosh": (np.cosh, _grid(-89, 89), 2.5e-7, 0),
    "asinh": (np.arcsinh, np.concatenate([_grid(-3000, 3000), np.geomspace(1e-30, 3e38, 20001)
                                          .astype(np.float32)]), 2e-7, 0),
    "acosh": (np.arccosh, np.concatenate([_grid(1, 3000), np.geomspace(1, 3e38, 20001)
                                          .astype(np.float32)]), 2e-7, 0),
    "atanh": (np.arctanh, _grid(-0.99999, 0.99999), 2e-7, 0),
}


@pytest.mark.parametrize("target", NARROW_AND_WIDE)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_accuracy(name, target):
    ref_fn, x, rel_bound, floor = UNARY[name]
    got = run_op(name, x, target=target)[0].astype(np.float64)
    ref = ref_fn(x.astype(np.float64))
    err = np.abs(got - ref) / np.maximum(np.abs(ref), max(floor, 1e-38))
    assert err.max() <= rel_bound, (name, float(err.max()), x[np.argmax(err)])


def test_trig_large_arguments_and_tiny_ones():
    # exact reduction for |x| < 1.6e6; absolute error ~|x| 1e-16 above, still tiny at 1e8
    x = np.concatenate([np.geomspace(1e4, 1e8, 50001), -np.geomspace(1e-30, 1e-3, 2001)])
    x = x.astype(np.float32)
    for name, fn in (("sin", np.sin), ("cos", np.cos)):
        got = run_op(name, x)[0].astype(np.float64)
        np.testing.assert_allclose(got, fn(x.astype(np.float64)), rtol=2e-7, atol=5e-8,
                                   err_msg=name)
    huge = np.array([1e20, -3e38, 2.0 ** 60], np.float32)
    assert np.all(np.abs(run_op("sin", huge)[0]) <= 1)


def _special_inputs():
    v = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-40, 100.0, 1e30]
    return np.array(v, np.float32)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name):
    x = _special_inputs()
    with np.errstate(all="ignore"):
        ref = UNARY[name][0](x.astype(np.float64)).astype(np.float32)
    got = run_op(name, x, target="x86_64-v2")[0]
    finite = np.isfinite(ref) & (np.abs(x) < 1e29)   # sin(1e30) is below the stated range
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)], err_msg=name)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=3e-7, atol=1e-38, err_msg=name)
    zero = ref == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(ref[zero]), err_msg=name)


def test_pow_accuracy_and_rules():
    rng = np.random.default_rng(0)
    a = np.exp(rng.uniform(-20, 20, 100000)).astype(np.float32)
    x = rng.uniform(-4, 4, 100000).astype(np.float32)
    got = run_op("pow", a, x)[0].astype(np.float64)
    ref = np.power(a.astype(np.float64), x.astype(np.float64))
    ok = (ref > 1e-37) & (ref < 3e38)
    assert (np.abs(got - ref) / ref)[ok].max() < 1.2e-7       # rounded from f64: within 1 ulp
    s = _special_inputs()
    s = np.concatenate([s, [-2.0, -3.0, 3.0, -0.0, 0.5, 1.5, -np.inf]]).astype(np.float32)
    a, x = (m.ravel() for m in np.meshgrid(s, s))
    got = run_op("pow", a, x, target="x86_64-v2")[0]
    with np.errstate(all="ignore"):
        ref = np.power(a, x)
    np.testing.assert_allclose(got, ref, rtol=2e-7, atol=0, equal_nan=True)
    num = ~np.isnan(ref)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(ref[num]))
    # f64 pow computes in f64 (error ~|x log a| 2^-52)
    a64, x64 = np.array([3.0, 10.0, -2.5, 1e-5]), np.array([40.0, -7.5, 3.0, 0.3])
    got = run_op("pow", a64, x64, dtype="f64")[0]
    np.testing.assert_allclose(got, np.power(a64, x64), rtol=1e-13)


def test_f64_exp_and_log_compute_in_f64():
    x = np.concatenate([np.linspace(-745, 709, 100001), [-np.inf, np.inf, np.nan, 710.0]])
    got = run_op("exp", x, dtype="f64")[0]
    with np.errstate(over="ignore"):  # exp(710) overflows to inf on purpose
        ref = np.exp(x)
    np.testing.assert_allclose(got, ref, rtol=5e-16, atol=1e-320, equal_nan=True)
    y = np.concatenate([np.geomspace(5e-324, 1.7e308, 100001), [0.0, -1.0, np.inf, np.nan]])
    with np.errstate(all="ignore"):
        ref = np.log(y)
    got = run_op("log", y, dtype="f64")[0]
    np.testing.assert_allclose(got, ref, rtol=3e-16, atol=3e-16, equal_nan=True)


def test_integer_pow_is_exact():
    a = np.array([3, -3, 7, 2, 2, -1, 10, 0], np.int64)
    x = np.array([20, 21, 15, 62, -1, -3, 18, 5], np.int64)
    got, g, feeds = run_op("pow", a, x, dtype="i64")
    np.testing.assert_array_equal(got, run_graph(g, feeds)["y"])


def test_atan2():
    rng = np.random.default_rng(1)
    y = (rng.standard_normal(100000) * np.exp(rng.uniform(-10, 10, 100000))).astype(np.float32)
    x = (rng.standard_normal(100000) * np.exp(rng.uniform(-10, 10, 100000))).astype(np.float32)
    got = run_op("atan2", y, x)[0].astype(np.float64)
    ref = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    assert (np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)).max() < 3e-7
    s = _special_inputs()
    y, x = (m.ravel() for m in np.meshgrid(s, s))
    got = run_op("atan2", y, x, target="x86_64-v2")[0]
    ref = np.arctan2(y, x)
    np.testing.assert_allclose(got, ref, rtol=3e-7, atol=1e-38, equal_nan=True)
    num = ~np.isnan(ref)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(ref[num]))


def test_fmod_and_mod_are_exact():
    rng = np.random.default_rng(2)
    a = (rng.standard_normal(100000) * 1e3).astype(np.float32)
    b = (rng.standard_normal(100000) * 3).astype(np.float32)
    a[:5], b[:5] = [np.inf, 1.0, 5.0, -4.0, 7.0], [2.0, np.inf, 0.0, 2.0, -np.inf]
    for op, fn in (("fmod", np.fmod), ("mod", np.mod)):
        with np.errstate(all="ignore"):
            ref = fn(a, b)
        got = run_op(op, a, b, target="x86_64-v2")[0]
        if op == "mod":   # numpy's mod(a, +-inf) keeps a only when the signs agree; skip those
            got, ref = got[5:], ref[5:]
        np.testing.assert_array_equal(got, ref, err_msg=op)


def test_round_sign_floor_ceil_recip_and_predicates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.7, -3.7, 0.0, np.nan, np.inf, -np.inf, 1e30],
                 np.float32)
    for op, fn in (("round", np.round), ("sign", np.sign), ("floor", np.floor), ("ceil", np.ceil),
                   ("recip", np.reciprocal), ("isnan", np.isnan), ("isinf", np.isinf)):
        got = run_op(op, x, target="x86_64-v2")[0]
        with np.errstate(divide="ignore"):  # recip(0) is inf on purpose
            ref = fn(x)
        np.testing.assert_array_equal(got, ref, err_msg=op)


@pytest.mark.parametrize("dtype", ["i8", "u8", "i32", "u32", "i64", "u64"])
def test_integer_bit_ops_and_comparisons(dtype):
    rng = np.random.default_rng(3)
    from mlpack.spec.ir import dtypes as dt
    info = np.iinfo(dt.to_numpy(dtype))
    a = rng.integers(info.min, info.max, 64, dtype=info.dtype, endpoint=True)
    b = rng.integers(info.min, info.max, 64, dtype=info.dtype, endpoint=True)
    shift = rng.integers(0, info.bits + 3, 64).astype(info.dtype)
    for op in ("bitand", "bitor", "bitxor", "eq", "ne", "lt", "le", "gt", "ge", "max", "min"):
        got, g, feeds = run_op(op, a, b, dtype=dtype)
        np.testing.assert_array_equal(got, run_graph(g, feeds)["y"], err_msg=op)
    for op in ("shl", "shr"):
        got, g, feeds = run_op(op, a, shift, dtype=dtype)
        np.testing.assert_array_equal(got, run_graph(g, feeds)["y"], err_msg=op)
    got, g, feeds = run_op("bitnot", a, dtype=dtype)
    np.testing.assert_array_equal(got, run_graph(g, feeds)["y"])


# ---------------------------------------------------------------- f16 and bf16

def _every(dtype: str) -> np.ndarray:
    """Every bit pattern of a 16-bit float type."""
    return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16 if dtype == "bf16"
                                                    else np.float16)


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_conversions_are_exact(dtype, target):
    """Every f16/bf16 round-trips; f32 values (ties, overflow, denormals) round to nearest even."""
    h = _every(dtype)
    g = op_graph("abs", dtype, h.size)            # load, |x|, store
    got = run_plan(compile_cpu(g, target), g, {"a": h})["y"]
    ref = np.abs(h)
    # every bit pattern includes signaling NaNs: ml_dtypes' bf16 isnan raises FE_INVALID on them
    with np.errstate(invalid="ignore"):
        nan = np.isnan(ref)
        assert np.isnan(got[nan].astype(np.float32)).all()
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], ref.view(np.uint16)[~nan])
    # f32 -> f16/bf16 through a cast (rounds to nearest even; midpoints included)
    rng = np.random.default_rng(4)
    bits = np.concatenate([rng.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32),
                           (np.arange(1 << 16, dtype=np.uint32) << 16) | 0x8000,
                           (np.arange(1 << 16, dtype=np.uint32) << 13) | 0x1000])
    x = bits.view(np.float32)
    g = op_graph("neg", "f32", x.size, out_dtype=dtype)
    got = run_plan(compile_cpu(g, target), g, {"a": x})["y"]
    with np.errstate(over="ignore", invalid="ignore"):  # large f32 -> inf, NaNs stay NaN
        ref = (-x).astype(got.dtype)
        keep = ~np.isnan(ref)
    np.testing.assert_array_equal(got.view(np.uint16)[keep], ref.view(np.uint16)[keep])
    assert np.isnan(got[~keep].astype(np.float32)).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["add", "mul", "div", "pow", "atan2", "max", "lt"])
def test_half_binary_ops_match_interp(op, dtype):
    rng = np.random.default_rng(5)
    np_t = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    a = np.abs(rng.standard_normal(4096) * 3).astype(np_t)
    b = (rng.standard_normal(4096) * 2).astype(np_t)
    got, g, feeds = run_op(op, a, b, dtype=dtype, target="x86_64-v2")
    want = run_graph(g, feeds)["y"]
    assert got.dtype == want.dtype
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
        return
    eps = 2.0 ** (-8 if dtype == "bf16" else -11)   # one rounding of the result
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=eps,
                               atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["exp", "tanh", "sin", "sqrt", "erf", "sigmoid", "round"])
def test_half_unary_ops_are_rounded_once(op, dtype):
    """Computed in f32 and rounded once: within one f16/bf16 rounding of the exact value (the
    interpreter, which rounds every NumPy step to the dtype, can be further off: sigmoid)."""
    np_t = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    a = np.linspace(-6, 6, 3001).astype(np_t)
    got = run_op(op, a, dtype=dtype, target="x86_64-v3")[0]
    x = a.astype(np.float64)
    exact = {"sqrt": np.sqrt, "exp": np.exp, "tanh": np.tanh, "sin": np.sin, "round": np.round,
             "erf": np.vectorize(__import__("math").erf),
             "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[op]
    with np.errstate(all="ignore"):
        ref = exact(x)
    eps = 2.0 ** (-8 if dtype == "bf16" else -11)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=eps, atol=1e-7, equal_nan=True)


def test_half_libraries_import_nothing(tmp_path):
    """f16 uses fpext/fptrunc with F16C and on aarch64, integer bit operations on x86-64 v2."""
    g = Graph("h")
    g.add_input("a", TensorType("f16", {"i": 8}), ("i",))
    g.add_input("b", TensorType("bf16", {"i": 8}), ("i",))
    ra = ex.read("a", {"i": ex.var("i")}, "f16")
    rb = ex.cast(ex.read("b", {"i": ex.var("i")}, "bf16"), "f16")
    body = ex.binary("atan2", ex.binary("pow", ra, rb), ex.unary("sin", ra))
    # f64 -> f32 -> f16 chains (fmod and pow work in f64; f64 casts): no __truncdfhf2
    wide = ex.binary("mul", ex.cast(ra, "f64"), ex.const(3.0, "f64"))
    body = ex.binary("add", ex.binary("add", body, ex.binary("fmod", ra, rb)), ex.cast(wide, "f16"))
    g.add_op(Comprehension("y", TensorType("f16", {"i": 8}), body))
    g.outputs.append(Port("y", ("i",)))
    for target in ALL_TARGETS:
        p = tmp_path / f"{target}.so"
        p.write_bytes(compile_cpu(g, target).elf)
        syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(p)], capture_output=True,
                              text=True, check=True).stdout
        assert "UND" not in "".join(ln for ln in syms.splitlines()[4:] if "mlpack" not in ln)
        assert "hf" not in syms and "NEEDED" not in subprocess.run(
            ["readelf", "-d", str(p)], capture_output=True, text=True).stdout, target


def test_narrow_types_are_lowered():
    # fp8 and int4 compute in f32/i8 registers (codegen/llvm/narrow.py; exhaustive tests in cpu/)
    for dtype in ("f8e4m3fn", "i4"):
        g = op_graph("abs", dtype, 16)
        x = np.arange(16, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn if dtype == "f8e4m3fn"
                                                 else ml_dtypes.int4)
        got = run_plan(compile_cpu(g, "x86_64-v3"), g, {"a": x})["y"]
        assert got.view(np.uint8).tolist() == run_graph(g, {"a": x})["y"].view(np.uint8).tolist()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dst", ["i32", "u32", "u8", "i8"])
def test_clamped_float_to_int_casts_keep_the_interpreters_values(dst, target):
    """A float clamped into i32's range converts through i32 lanes (scalar.py's
    ``_cast_clamped``: a requantizing epilogue's ``cast<i32>(min(max(...)))``, element by
    element through i64 on AVX2 before): the same values, nan and inf as 0, truncated toward
    zero, and wrapped into narrower ints."""
    n = 64
    g = Graph("clamp")
    g.add_input("a", TensorType("f32", {"i": n}), ("i",))
    x = ex.read("a", {"i": ex.var("i")}, "f32")
    body = ex.cast(ex.minimum(ex.maximum(x, ex.const(-300.0, "f32")), ex.const(70000.5, "f32")),
                   dst)
    g.add_op(Comprehension("y", TensorType(dst, {"i": n}), body))
    g.outputs.append(Port("y", ("i",)))
    a = np.concatenate([[np.nan, np.inf, -np.inf, 0.5, -0.5, 1.5, -2.5, 255.9, 256.0, -129.0,
                         1e30, -1e30, 70000.0],
                        np.random.default_rng(0).uniform(-400, 80000, n - 13)]).astype(np.float32)
    got = run_plan(compile_cpu(g, target), g, {"a": a})["y"]
    np.testing.assert_array_equal(got, run_graph(g, {"a": a})["y"])
