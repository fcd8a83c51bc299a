"""Kernels that are the same under a renaming of tensors are lowered once (sharing.py).

The key must tell apart whatever reaches the code (a buffer's dtype or size, a constant's type)
and nothing else (the tensors' names); a kernel that shares another's function gets its own
index checks, so an index out of range in a repeated layer names that layer's node.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import mlpack
from mlpack.codegen.targets.cpu import module
from mlpack.codegen.targets.cpu.kernel import Buffer, Kernel
from mlpack.codegen.targets.cpu.sharing import kernel_key, renamed_checks
from mlpack.spec.errors import IndexRangeError
from mlpack.spec.ir import expr as ex


def _kernel(name, x, y, *, dtype="f32", scale=ex.const(2.0, "f32")):
    body = ex.mul(ex.read(x, {"i": ex.var("i")}, dtype), scale)
    return Kernel(name, y, body, None, {}, dtype, reads=[x], fused=[f"Mul {name}"])


def _buffers(n=16, dtype="f32", **more):
    bufs = {t: Buffer(t, ("i",), {"i": ex.const(n)}, dtype) for t in ("a", "b", "c", "d")}
    bufs.update(more)
    return bufs


def test_kernels_that_differ_in_tensor_names_only_share_a_key():
    bufs = _buffers()
    one, tensors_one = kernel_key(_kernel("k0", "a", "b"), bufs)
    two, tensors_two = kernel_key(_kernel("k1", "c", "d"), bufs)
    assert one == two
    assert tensors_one == ["b", "a"] and tensors_two == ["d", "c"]   # out first, then reads
    assert renamed_checks([("a", "i"), ("b", "i")], tensors_one, tensors_two) == \
        [("c", "i"), ("d", "i")]


@pytest.mark.parametrize("change", ["size", "dtype", "negative zero", "same tensor twice"])
def test_what_reaches_the_code_keeps_kernels_apart(change):
    bufs = _buffers()
    base = kernel_key(_kernel("k0", "a", "b", scale=ex.const(0.0, "f32")), bufs)[0]
    if change == "size":
        other = kernel_key(_kernel("k1", "c", "e"), {**bufs, "e": Buffer("e", ("i",), {"i": ex.const(17)}, "f32")})
    elif change == "dtype":
        other = kernel_key(_kernel("k1", "c", "e"), {**bufs, "e": Buffer("e", ("i",), {"i": ex.const(16)}, "f16")})
    elif change == "int constant":
        k = _kernel("k1", "c", "d", scale=ex.cast(ex.const(2, "i32"), "f32"))
        other = kernel_key(k, bufs)
    else:   # reading the tensor it writes is another kernel than reading a second one
        other = kernel_key(_kernel("k1", "c", "c"), bufs)
    assert other is not None and other[0] != base


def test_a_value_the_key_cannot_spell_leaves_the_kernel_unkeyed():
    k = _kernel("k0", "a", "b")
    k.gemm = object()   # (no dataclass, no expression: nothing says what it holds)
    assert kernel_key(k, _buffers()) is None


ROWS = 12


def _two_lookups():
    """Two embedding lookups of the same shapes, on different tables and ids."""
    nodes = [h.make_node("Gather", ["table_a", "ids_a"], ["y_a"], name="lookup_a"),
             h.make_node("Gather", ["table_b", "ids_b"], ["y_b"], name="lookup_b")]
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((ROWS, 8)).astype(np.float32), n)
             for n in ("table_a", "table_b")]
    g = h.make_graph(nodes, "two_lookups",
                     [h.make_tensor_value_info(n, T.INT64, [5]) for n in ("ids_a", "ids_b")],
                     [h.make_tensor_value_info(n, T.FLOAT, [5, 8]) for n in ("y_a", "y_b")],
                     inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


@pytest.fixture(scope="module")
def lookups(tmp_path_factory):
    from mlpack.packager.build import build
    from mlpack.runtime import detect_host

    host = {"amd64": "x86_64-v2", "arm64": "aarch64"}.get(detect_host().arch)
    if host is None:
        pytest.skip(f"no cpu target for {detect_host().arch}")
    root = tmp_path_factory.mktemp("sharing")
    src, dst = root / "two_lookups.onnx", root / "two_lookups.mlpack"
    onnx.save(_two_lookups(), str(src))
    emitted = []
    emit = module.KernelLowering.emit
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module.KernelLowering, "emit",
                   lambda self: emitted.append(self.k.name) or emit(self))
        build(str(src), str(dst), targets=[host], cache=False)
    return src, dst, emitted


def test_a_repeated_lookup_is_lowered_once_and_runs_as_onnx_runtime(lookups):
    src, dst, emitted = lookups
    assert len([n for n in emitted if "y_" in n]) == 1, emitted
    feeds = {"ids_a": np.array([0, 3, -1, 11, 2]), "ids_b": np.array([5, -12, 7, 0, 1])}
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    with mlpack.load(str(dst), device="cpu") as m:
        got = m.run(feeds)
    for w, g in zip(want, (got["y_a"], got["y_b"])):
        np.testing.assert_array_equal(g, w)


def test_the_shared_lookup_names_its_own_node_when_an_index_is_out_of_range(lookups):
    _, dst, _ = lookups
    with mlpack.load(str(dst), device="cpu") as m:
        with pytest.raises(IndexRangeError, match="lookup_b") as e:
            m.run({"ids_a": np.array([0, 1, 2, 3, 4]), "ids_b": np.array([0, 1, ROWS, 3, 4])})
        assert "lookup_a" not in str(e.value)
        with pytest.raises(IndexRangeError, match="lookup_a"):
            m.run({"ids_a": np.array([0, 1, 2, -ROWS - 1, 4]), "ids_b": np.array([0, 1, 2, 3, 4])})
