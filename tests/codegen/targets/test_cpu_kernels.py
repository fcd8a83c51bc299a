"""cpu target kernels, one feature at a time, against the reference interpreter.

Each case is a small ONNX model compiled with ``compile_onnx`` then ``compile_cpu`` for
x86_64-v2, v3 and v4 (each one this host runs; v4 needs AVX-512), run by the Python plan runner,
and compared with ``spec.ir.interp.run_graph`` at fp32 rtol 1e-4 / atol 1e-5 (integer outputs
exactly). A test of one level's plan compiles for it everywhere and runs the nearest level the
host has where it cannot run that one.
Also: epilogue fusion, a dynamic batch from one library, the library's ELF (one export, no
imports, aarch64 machine), and the clear errors for what the target does not lower.
"""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.errors import UnsupportedTargetError
from mlpack.codegen.targets.cpu import compile_cpu
from mlpack.codegen.targets.cpu.link import lld_command
from mlpack.spec.ir.interp import run_graph
from plan_runner import HOST_TARGETS, TARGETS, Library, run_plan
from support import best_host_target, host_lacks

RTOL, ATOL = 1e-4, 1e-5
F = TP.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(m, feeds, target, **kw):
    """``m`` compiled for ``target`` (returned, for its plan) and run on ``feeds`` against the
    interpreter: that artifact, or where this host cannot run it the best level it runs."""
    g = compile_onnx(m)
    art = compile_cpu(g, target)
    ref = run_graph(g, feeds)
    ran = art if host_lacks(target) is None else compile_cpu(g, best_host_target(*TARGETS))
    got = run_plan(ran, g, feeds)
    for name, want in ref.items():
        have = got[name]
        assert have.shape == want.shape and have.dtype == want.dtype, name
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(have, want, rtol=kw.get("rtol", RTOL), atol=ATOL, err_msg=name)
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)
    return art


# ---------------------------------------------------------------- cases

def case_broadcast():
    nodes = [helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Mul", ["t", "s"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    m = model(nodes, [("x", F, [2, 3, 5]), ("s", F, [3, 1])], [("y", F, None)],
              [init("b", rand(5, seed=1))])
    return m, {"x": rand(2, 3, 5), "s": rand(3, 1, seed=2)}


def case_matmul():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [("x", F, [2, 5, 37])], [("y", F, None)], [init("w", rand(37, 19, seed=1))])
    return m, {"x": rand(2, 5, 37)}


def case_gemm_bias_tanh():
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["t"], transB=1),
             helper.make_node("Tanh", ["t"], ["y"])]
    m = model(nodes, [("x", F, [4, 64])], [("y", F, None)],
              [init("w", rand(33, 64, seed=1) * 0.2), init("b", rand(33, seed=2))])
    return m, {"x": rand(4, 64)}


def case_conv():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 2, 1, 0], strides=[2, 1],
                              group=2, dilations=[1, 2])]
    m = model(nodes, [("x", F, [2, 4, 9, 11])], [("y", F, None)],
              [init("w", rand(6, 2, 3, 3, seed=1)), init("b", rand(6, seed=2))])
    return m, {"x": rand(2, 4, 9, 11)}


def case_conv_bn_relu():
    scale, bias, mean = rand(8, seed=3), rand(8, seed=4), rand(8, seed=5)
    var = np.abs(rand(8, seed=6)) + 0.5
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    m = model(nodes, [("x", F, [1, 3, 10, 10])], [("y", F, None)],
              [init("w", rand(8, 3, 3, 3, seed=1)), init("s", scale), init("bb", bias),
               init("m", mean), init("v", var)])
    return m, {"x": rand(1, 3, 10, 10)}


def case_maxpool():
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]
    m = model(nodes, [("x", F, [1, 3, 11, 12])], [("y", F, None)])
    return m, {"x": rand(1, 3, 11, 12)}


def case_avgpool_global():
    nodes = [helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["a"], ["y"])]
    m = model(nodes, [("x", F, [2, 5, 8, 8])], [("y", F, None)])
    return m, {"x": rand(2, 5, 8, 8)}


def case_softmax():
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    m = model(nodes, [("x", F, [3, 4, 50])], [("y", F, None)])
    return m, {"x": rand(3, 4, 50) * 4}


def case_layernorm():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)]
    m = model(nodes, [("x", F, [2, 7, 48])], [("y", F, None)],
              [init("g", rand(48, seed=1)), init("b", rand(48, seed=2))])
    return m, {"x": rand(2, 7, 48) * 3 + 1}


def case_gather():
    nodes = [helper.make_node("Gather", ["w", "i"], ["y"], axis=0)]
    m = model(nodes, [("i", TP.INT64, [2, 5])], [("y", F, None)], [init("w", rand(10, 6, seed=1))])
    return m, {"i": np.array([[0, 3, -1, 9, 2], [-10, 5, 5, 1, 0]], np.int64)}


def case_gelu():
    nodes = [helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["q"]),
             helper.make_node("Mul", ["q", "half"], ["y"])]
    m = model(nodes, [("x", F, [4, 100])], [("y", F, None)],
              [init("r2", np.float32(np.sqrt(2))), init("one", np.float32(1)),
               init("half", np.float32(0.5))])
    return m, {"x": rand(4, 100) * 3}


def case_argmax():
    nodes = [helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0),
             helper.make_node("ArgMin", ["x"], ["z"], axis=2, keepdims=1, select_last_index=1)]
    m = model(nodes, [("x", F, [3, 20, 6])], [("y", TP.INT64, None), ("z", TP.INT64, None)])
    x = np.round(rand(3, 20, 6) * 2)  # ties: first/last index rules matter
    return m, {"x": x}


def case_casts():
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TP.INT32),
             helper.make_node("Cast", ["i"], ["y"], to=TP.FLOAT),
             helper.make_node("Cast", ["x"], ["b"], to=TP.BOOL),
             helper.make_node("Not", ["b"], ["z"]),
             helper.make_node("Cast", ["x"], ["u"], to=TP.UINT8),
             helper.make_node("Greater", ["x", "zero"], ["g"]),
             helper.make_node("Where", ["g", "x", "zero"], ["w"])]
    m = model(nodes, [("x", F, [5, 9])], [("y", F, None), ("z", TP.BOOL, None),
                                           ("u", TP.UINT8, None), ("w", F, None)],
              [init("zero", np.float32(0))])
    x = rand(5, 9) * 5
    x[0, :3] = 0
    x[1, 0] = 7.9
    return m, {"x": np.abs(x) * np.sign(x)}


def case_reduce_ops():
    nodes = [helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["m"], axes=[0, 2], keepdims=1),
             helper.make_node("Abs", ["x"], ["x2"]),
             helper.make_node("Sqrt", ["x2"], ["r"]),
             helper.make_node("Exp", ["s"], ["e"]),
             helper.make_node("Log", ["r"], ["l"])]
    m = model(nodes, [("x", F, [4, 6, 8])], [("e", F, None), ("m", F, None), ("l", F, None)],
              [init("ax", np.array([1], np.int64))], opset=17)
    return m, {"x": rand(4, 6, 8) * 0.3}


def case_max_min_over_rows_with_nan():
    """Rows of 300 (a vectorized body and a remainder): a NaN in the body, in the remainder
    and first, infinities, signed zeros; a NaN anywhere in a row makes its max and min NaN
    (the inner reduction tests its terms for NaN beside its running vmaxps, lower.py), and a
    softmax over such a row is NaN too."""
    x = rand(8, 300) * 10
    x[1, 17] = x[2, 299] = x[3, 0] = np.nan
    x[4, :] = -0.0
    x[4, 100] = 0.0
    x[5, 50], x[5, 60] = np.inf, -np.inf
    x[6, :] = -np.inf
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], axes=[1], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["mn"], axes=[1], keepdims=0),
             helper.make_node("Softmax", ["x"], ["sm"], axis=1)]
    m = model(nodes, [("x", F, [8, 300])], [("mx", F, None), ("mn", F, None), ("sm", F, None)],
              opset=17)
    return m, {"x": x}


def case_integer_math():
    nodes = [helper.make_node("Div", ["a", "b"], ["d"]), helper.make_node("Mod", ["a", "b"], ["m"]),
             helper.make_node("Mul", ["d", "m"], ["y"])]
    m = model(nodes, [("a", TP.INT64, [3, 7]), ("b", TP.INT64, [3, 7])], [("y", TP.INT64, None)])
    rng = np.random.default_rng(3)
    b = rng.integers(-5, 6, (3, 7))
    b[b == 0] = 3
    return m, {"a": rng.integers(-50, 50, (3, 7)), "b": b}


def case_transpose_concat_pad():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=1),
             helper.make_node("Pad", ["c", "pads"], ["y"], mode="constant")]
    m = model(nodes, [("x", F, [2, 3, 4])], [("y", F, None)],
              [init("pads", np.array([0, 1, 0, 0, 0, 2], np.int64))])
    return m, {"x": rand(2, 3, 4)}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel(case, target):
    m, feeds = CASES[case]()
    check(m, feeds, target)


# ---------------------------------------------------------------- fusion, dynamic sizes


def test_epilogue_fuses_into_the_reduction():
    m, feeds = case_gemm_bias_tanh()
    art = check(m, feeds, "x86_64-v3")
    assert len(art.plan["dispatches"]) == 1          # matmul + bias + tanh: one kernel
    m, feeds = case_conv_bn_relu()
    art = check(m, feeds, "x86_64-v3")
    convs = [n for n in art.kernel_names if "Conv" in n or "y" in n]
    assert len(art.plan["dispatches"]) <= 3 and convs  # bn statistics fold, conv+bn+relu fuse


def _exported_pad_conv(explicit: bool):
    """What an exporter of TF-style SAME padding writes (Hugging Face's MobileNetV2 and
    EfficientNet): every Conv after a Pad whose pads and value are Constant nodes, 1x1 ones
    padded by zeros, a depthwise 3x3 one at stride 2 by (0, 1) rows and columns, after a Clip.
    ``explicit=False``: the same model with the Conv's own pads instead."""
    c = 24
    consts = {"zeros": np.zeros(8, np.int64), "same": np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64),
              "value": np.array(0.0, np.float32), "lo": np.array(0.0, np.float32),
              "hi": np.array(6.0, np.float32)}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k))
             for k, v in consts.items()]

    def padded(x, pads, out):
        if not explicit:
            return x
        nodes.append(helper.make_node("Pad", [x, pads, "value"], [out]))
        return out

    nodes.append(helper.make_node("Conv", [padded("x", "zeros", "xp"), "w1"], ["c1"]))
    nodes.append(helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]))
    nodes.append(helper.make_node("Conv", [padded("a1", "same", "ap"), "w2"], ["c2"], group=c,
                                  strides=[2, 2], **({} if explicit else {"pads": [0, 0, 1, 1]})))
    nodes.append(helper.make_node("Clip", ["c2", "lo", "hi"], ["a2"]))
    nodes.append(helper.make_node("Conv", [padded("a2", "zeros", "a2p"), "w3"], ["y"]))
    m = model(nodes, [("x", F, [1, 8, 14, 14])], [("y", F, None)],
              [init("w1", rand(c, 8, 1, 1, seed=1)), init("w2", rand(c, 1, 3, 3, seed=2)),
               init("w3", rand(8, c, 1, 1, seed=3))])
    return m, {"x": rand(1, 8, 14, 14)}


def test_explicit_pads_before_convolutions_compile_as_the_convolutions_own():
    # A Pad read its computed input through bounds checks and clamped indices, which no
    # convolution schedule recognized: Hugging Face's MobileNetV2 ran 12x slower than ONNX
    # Runtime. Now a zero Pad is its input and a constant one a padded read of a tensor, so
    # the model compiles to the kernels of the Conv with its own pads.
    kernels = {}
    for explicit in (True, False):
        m, feeds = _exported_pad_conv(explicit)
        kernels[explicit] = check(m, feeds, "x86_64-v3").kernel_names
    # (the same kernels: the 1x1 ones with their packed weight panels, the depthwise one with
    # its weights rearranged once; before, three plain loops over bounds checks)
    assert kernels[True] == kernels[False]


def test_dynamic_batch_from_one_library():
    path = __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..", "models",
                                      "mlp.onnx")
    g = compile_onnx(onnx.load(path))
    art = compile_cpu(g, best_host_target(*TARGETS))
    lib = Library(art.elf)
    assert art.plan["symbols"] == ["batch"]
    for batch in (1, 32):
        x = {"x": rand(batch, 784, seed=batch)}
        got = run_plan(art, g, x, lib)["y"]
        want = run_graph(g, x)["y"]
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_workgroups_split_big_ops_and_not_tiny_ones():
    m, feeds = case_matmul()
    art = check(m, feeds, "x86_64-v4")
    assert art.plan["dispatches"][0]["workgroups"] == 1
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, [("x", F, [64, 64, 128])], [("y", F, None)])
    art = check(m, {"x": rand(64, 64, 128)}, "x86_64-v4")
    assert art.plan["dispatches"][0]["workgroups"] >= 16
    # one big row (a batch-1 fully connected layer) is cut into chunks: its weights stream
    # once a run, so an eighth of the usual work each (524k multiply-adds: 128), at most its
    # 64 tiles of 16 columns
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)]
    m = model(nodes, [("x", F, [1, 512])], [("y", F, None)], [init("w", rand(1024, 512, seed=1))])
    art = check(m, {"x": rand(1, 512)}, "x86_64-v2")
    assert art.plan["dispatches"][0]["workgroups"] == 64


def test_arena_slots_are_reused():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Softmax", ["b"], ["c"]), helper.make_node("Softmax", ["c"], ["d"]),
             helper.make_node("Softmax", ["d"], ["y"])]
    m = model(nodes, [("x", F, [8, 32])], [("y", F, None)])
    art = check(m, {"x": rand(8, 32)}, "x86_64-v3")
    arena = [b for b in art.plan["buffers"] if b["kind"] == "arena"]
    assert len({b["offset"] for b in arena}) < len(arena)


# ---------------------------------------------------------------- the library itself


def _readelf(elf: bytes, *args: str, tmp_path) -> str:
    p = tmp_path / "k.so"
    p.write_bytes(elf)
    return subprocess.run(["readelf", *args, str(p)], capture_output=True, text=True, check=True).stdout


def test_library_exports_one_symbol_and_imports_nothing(tmp_path):
    m, _ = case_gelu()   # exp-free erf, plus softmax's exp below
    g = compile_onnx(m)
    for target in (*TARGETS, "aarch64"):
        elf = compile_cpu(g, target).elf
        syms = _readelf(elf, "--dyn-syms", "-W", tmp_path=tmp_path)
        rows = [ln.split() for ln in syms.splitlines() if ln.strip()[:1].isdigit()]
        named = [r for r in rows if len(r) >= 8]
        assert [r[7] for r in named] == ["mlpack_kernel_table_v1"], syms
        assert all(r[6] != "UND" for r in named), syms
        assert "NEEDED" not in _readelf(elf, "-d", tmp_path=tmp_path)


def test_aarch64_objects_build_and_link(tmp_path):
    m, _ = case_conv()
    art = compile_cpu(compile_onnx(m), "aarch64")
    assert art.elf[:4] == b"\x7fELF"
    assert "AArch64" in _readelf(art.elf, "-h", tmp_path=tmp_path)
    assert art.features == ["fp-armv8", "neon"]


def test_levels_are_strict_supersets():
    from mlpack.codegen.targets.cpu.target import TARGETS as T
    v2, v3, v4 = (set(T[n].features) for n in TARGETS)
    assert v2 < v3 < v4 and {"avx2", "fma"} <= v3 and "avx512f" in v4


def test_lld_is_available():
    out = subprocess.run([*lld_command(), "--version"], capture_output=True, text=True)
    assert "LLD" in out.stdout


# ---------------------------------------------------------------- what is not lowered


def test_procedures_compile_to_one_workgroup_kernels():
    # sequential code (procedure.py); cpu/test_procedure.py runs them against ONNX Runtime
    nodes = [helper.make_node("NonZero", ["x"], ["y"])]
    m = model(nodes, [("x", F, [4])], [("y", TP.INT64, None)])
    art = compile_cpu(compile_onnx(m), "x86_64-v3")
    assert art.plan["dispatches"][0]["workgroups"] == 1 and art.plan["abi_minor"] == 1


def test_unlowered_dtype_is_named():
    # every IR dtype lowers now (fp8/fp4/int4/int2: codegen/llvm/narrow.py); an unknown one is named
    from mlpack.codegen.llvm.types import llvm_type

    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E4M3FN)]
    m = model(nodes, [("x", F, [4])], [("y", TP.FLOAT8E4M3FN, None)], opset=19)
    compile_cpu(compile_onnx(m), "x86_64-v3")
    with pytest.raises(UnsupportedTargetError, match="dtype c64"):
        llvm_type("c64")


def test_unknown_target():
    m, _ = case_matmul()
    with pytest.raises(UnsupportedTargetError, match="unknown cpu target"):
        compile_cpu(compile_onnx(m), "mips64")


def test_outputs_that_are_inputs_constants_or_repeated_are_copied():
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["c"], ["z"]),
             helper.make_node("Relu", ["x"], ["r"])]
    m = model(nodes, [("x", F, [3, 4])], [("y", F, None), ("z", F, None), ("r", F, None)],
              [init("c", rand(2, 5, seed=1))])
    check(m, {"x": rand(3, 4)}, "x86_64-v3")
