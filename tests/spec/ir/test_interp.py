"""The reference interpreter against NumPy, and the verifier against malformed graphs."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen.errors import VerifyError
from mlpack.spec.ir import (Comprehension, Constant, For, Graph, If, Let, Port, Procedure,
                               Store, TensorType, parse_graph, run_graph, verify)
from mlpack.spec.ir import expr as ex

V = ex.var
RNG = np.random.default_rng(0)


def _graph(inputs: dict[str, tuple[str, dict]]) -> Graph:
    g = Graph("t")
    for name, (dtype, dims) in inputs.items():
        g.add_input(name, TensorType(dtype, dims), tuple(dims))
    return g


def _op(g: Graph, out: str, dtype: str, dims: dict, body, reduce=None, rdims=None, layout=None):
    g.add_op(Comprehension(out, TensorType(dtype, dims), body, reduce, rdims or {}))
    g.outputs.append(Port(out, tuple(layout or dims)))


def _run(g: Graph, **inputs):
    verify(g)
    return run_graph(g, inputs)


# ---------------------------------------------------------------- comprehensions vs NumPy


def test_matmul_with_symbolic_batch():
    g = _graph({"a": ("f32", {"n": ex.sym("n"), "k": 6}), "b": ("f32", {"k": 6, "m": 5})})
    body = ex.read("a", {"n": V("n"), "k": V("k")}, "f32") * ex.read("b", {"k": V("k"), "m": V("m")}, "f32")
    _op(g, "c", "f32", {"n": ex.sym("n"), "m": 5}, body, "sum", {"k": 6}, layout=("m", "n"))
    a, b = RNG.standard_normal((7, 6), np.float32), RNG.standard_normal((6, 5), np.float32)
    np.testing.assert_allclose(_run(g, a=a, b=b)["c"], (a @ b).T, rtol=1e-5, atol=1e-5)


def test_matmul_with_bias_inside_the_sum_scales_by_nothing_else():
    # sum_k a[n,k] * 2.0: the constant factor rides along in the einsum
    g = _graph({"a": ("f32", {"n": 3, "k": 4})})
    body = ex.read("a", {"n": V("n"), "k": V("k")}, "f32") * ex.const(2.0)
    _op(g, "s", "f32", {"n": 3}, body, "sum", {"k": 4})
    a = RNG.standard_normal((3, 4), np.float32)
    np.testing.assert_allclose(_run(g, a=a)["s"], 2 * a.sum(1), rtol=1e-5)


def test_maxpool_with_padding():
    g = _graph({"x": ("f32", {"h": 7, "w": 6})})
    at = {"h": 2 * V("oh") + V("kh") - 1, "w": 2 * V("ow") + V("kw") - 1}
    _op(g, "y", "f32", {"oh": 4, "ow": 3}, ex.read("x", at, "f32", pad=-np.inf), "max", {"kh": 3, "kw": 3})
    x = RNG.standard_normal((7, 6)).astype(np.float32)
    padded = np.pad(x, 1, constant_values=-np.inf)
    want = np.array([[padded[2 * i:2 * i + 3, 2 * j:2 * j + 3].max() for j in range(3)] for i in range(4)])
    np.testing.assert_array_equal(_run(g, x=x)["y"], want)


def test_conv1d_with_zero_padding_and_stride():
    g = _graph({"x": ("f32", {"c": 2, "t": 9}), "w": ("f32", {"o": 3, "c": 2, "k": 3})})
    x_at = ex.read("x", {"c": V("c"), "t": 2 * V("p") + V("k") - 1}, "f32", pad=0.0)
    body = x_at * ex.read("w", {"o": V("o"), "c": V("c"), "k": V("k")}, "f32")
    _op(g, "y", "f32", {"o": 3, "p": 5}, body, "sum", {"c": 2, "k": 3})
    x, w = RNG.standard_normal((2, 9), np.float32), RNG.standard_normal((3, 2, 3), np.float32)
    xp = np.pad(x, ((0, 0), (1, 1)))
    want = np.stack([np.einsum("ck,ock->o", xp[:, 2 * p:2 * p + 3], w) for p in range(5)], axis=1)
    np.testing.assert_allclose(_run(g, x=x, w=w)["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, fn", [
    ("argmax", lambda x: x.argmax(1)), ("argmin", lambda x: x.argmin(1)),
    ("argmax_last", lambda x: 4 - x[:, ::-1].argmax(1)), ("argmin_last", lambda x: 4 - x[:, ::-1].argmin(1)),
])
def test_arg_reductions(kind, fn):
    g = _graph({"x": ("i32", {"n": 6, "k": 5})})
    _op(g, "i", "i64", {"n": 6}, ex.read("x", {"n": V("n"), "k": V("k")}, "i32"), kind, {"k": 5})
    x = RNG.integers(0, 3, (6, 5)).astype(np.int32)  # ties: first vs last matters
    np.testing.assert_array_equal(_run(g, x=x)["i"], fn(x))


@pytest.mark.parametrize("kind, fn", [("prod", np.prod), ("sum", np.sum), ("min", np.min),
                                      ("max", np.max)])
def test_plain_reductions_over_two_dims(kind, fn):
    g = _graph({"x": ("f64", {"a": 3, "b": 4, "c": 2})})
    body = ex.unary("exp", ex.read("x", {"a": V("a"), "b": V("b"), "c": V("c")}, "f64"))
    _op(g, "r", "f64", {"b": 4}, body, kind, {"a": 3, "c": 2})
    x = RNG.standard_normal((3, 4, 2))
    np.testing.assert_allclose(_run(g, x=x)["r"], fn(np.exp(x), axis=(0, 2)), rtol=1e-12)


def test_integer_division_truncates_like_onnx():
    g = _graph({"a": ("i32", {"n": 4}), "b": ("i32", {"n": 4})})
    body = ex.binary("div", ex.read("a", {"n": V("n")}, "i32"), ex.read("b", {"n": V("n")}, "i32"))
    _op(g, "q", "i32", {"n": 4}, body)
    a, b = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)
    np.testing.assert_array_equal(_run(g, a=a, b=b)["q"], [3, -3, -3, 3])


def test_broadcast_over_dims_the_body_ignores_and_gather():
    g = _graph({"table": ("f32", {"v": 10, "e": 3}), "ids": ("i64", {"s": 4})})
    at = {"v": ex.read("ids", {"s": V("s")}, "i64"), "e": V("e")}
    _op(g, "emb", "f32", {"s": 4, "e": 3, "r": 2}, ex.read("table", at, "f32"), layout=("r", "s", "e"))
    table, ids = RNG.standard_normal((10, 3), np.float32), np.array([3, 0, 9, 3])
    np.testing.assert_array_equal(_run(g, table=table, ids=ids)["emb"], np.stack([table[ids]] * 2))


def test_parsed_text_runs_like_the_built_graph():
    g = parse_graph('''graph "softmax" {
      in %x: f32{n=$n, c=5} (n, c)
      %m: f32{n=$n} = max{k=5} %x[n=n, c=k]
      %e: f32{n=$n, c=5} = exp(%x[n=n, c=c] - %m[n=n])
      %s: f32{n=$n} = sum{k=5} %e[n=n, c=k]
      %y: f32{n=$n, c=5} = div(%e[n=n, c=c], %s[n=n])
      out %y (n, c)
    }''')
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(_run(g, x=x)["y"], e / e.sum(1, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------- procedures


def test_procedure_prefix_sum():
    g = _graph({"x": ("f32", {"n": ex.sym("len")})})
    acc = V("acc", "f32")
    body = [
        Let("acc", ex.const(0.0)),
        For("i", ex.sym("len"), [
            Let("acc", ex.binary("add", acc, ex.read("x", {"n": V("i")}, "f32"))),
            Store("y", {"n": V("i")}, acc),
        ]),
    ]
    g.add_op(Procedure({"y": TensorType("f32", {"n": ex.sym("len")})}, body))
    g.outputs.append(Port("y", ("n",)))
    x = RNG.standard_normal(11).astype(np.float32)
    np.testing.assert_allclose(_run(g, x=x)["y"], np.cumsum(x), rtol=1e-5)


def test_procedure_data_dependent_size():
    g = parse_graph('''graph "nonzero" {
      in %x: f32{n=$len} (n)
      %idx: i64{k=$nnz} = proc bounds{$nnz=$len} {
        let count: i64 = 0
        for i in $len {
          if ne(%x[n=i], 0.0) {
            %idx[k=count] = i
            let count: i64 = count + 1
          }
        }
        size $nnz = count
      }
      out %idx (k)
    }''')
    x = np.array([0, 1.5, 0, -2, 3, 0], np.float32)
    np.testing.assert_array_equal(_run(g, x=x)["idx"], np.flatnonzero(x))


# ---------------------------------------------------------------- the verifier


def _bad(g: Graph, *fragments):
    with pytest.raises(VerifyError) as info:
        verify(g)
    for f in fragments:
        assert f in str(info.value), str(info.value)


def test_verifier_rejects_read_of_undefined_tensor():
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Comprehension("y", TensorType("f32", {"n": 4}), ex.read("ghost", {"n": V("n")}, "f32")))
    _bad(g, "op %y", "%ghost", "not defined")


def test_verifier_rejects_wrong_dims():
    g = _graph({"x": ("f32", {"n": 4, "c": 3})})
    g.add_op(Comprehension("y", TensorType("f32", {"n": 4}), ex.read("x", {"n": V("n")}, "f32")))
    _bad(g, "op %y", "%x", "['n']")


def test_verifier_rejects_variable_out_of_scope():
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Comprehension("y", TensorType("f32", {"n": 4}), ex.read("x", {"n": V("q")}, "f32")))
    _bad(g, "op %y", "variable q")


def test_verifier_rejects_body_dtype_mismatch():
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Comprehension("y", TensorType("f16", {"n": 4}), ex.read("x", {"n": V("n")}, "f32")))
    _bad(g, "op %y", "f32", "f16")


def test_verifier_rejects_unbound_symbol_and_double_definition():
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Comprehension("y", TensorType("f32", {"n": ex.sym("ghost")}), ex.const(1.0)))
    _bad(g, "op %y", "$ghost")
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Comprehension("x", TensorType("f32", {"n": 4}), ex.const(1.0)))
    _bad(g, "op %x", "defined twice")


def test_verifier_rejects_bad_layouts_and_constants():
    g = _graph({"x": ("f32", {"n": 4})})
    g.outputs.append(Port("x", ("n", "n")))
    _bad(g, "output %x", "layout")
    g = Graph("c")
    g.add_constant(Constant("w", TensorType("f32", {"a": 3}), ("a",), np.zeros(4, np.float32)))
    _bad(g, "constant %w", "shape")


def test_verifier_rejects_procedure_that_never_sets_its_size():
    g = _graph({"x": ("f32", {"n": 4})})
    g.add_op(Procedure({"y": TensorType("f32", {"k": ex.sym("m")})}, [If(ex.const(True), [])],
                       bounds={"m": ex.const(4)}))
    _bad(g, "procedure %y", "$m")


# ---------------------------------------------------------------- windowed reads


@pytest.mark.parametrize("stride, pad", [(1, 0.0), (2, 0.0), (2, None), (1, -3.5)])
def test_a_window_read_is_a_strided_view_with_the_gather_s_values(monkeypatch, stride, pad):
    """A read indexed by sums of loop variables (a convolution's ``s*h + kh - 1``) is taken as
    a strided view of the (padded) data: the same outputs as the general gather."""
    from mlpack.spec.ir import interp_comprehension

    x = RNG.standard_normal((3, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 2)).astype(np.float32)
    h_out, w_out = (9 + (2 if pad is not None else -2) - 3) // stride + 1, 7 if pad is not None else 6
    g = _graph({"x": ("f32", {"c": 3, "y": 9, "z": 8}), "w": ("f32", {"o": 4, "c": 3, "kh": 3, "kw": 2})})
    lo = -1 if pad is not None else 0
    read = ex.read("x", {"c": V("ci"), "y": stride * V("h") + V("r") + lo,
                         "z": V("q") + V("kq") + lo}, "f32", pad)
    body = read * ex.read("w", {"o": V("o"), "c": V("ci"), "kh": V("r"), "kw": V("kq")}, "f32")
    _op(g, "y", "f32", {"o": 4, "h": h_out, "q": w_out}, body, "sum", {"ci": 3, "r": 3, "kq": 2})
    fast = _run(g, x=x, w=w)["y"]
    monkeypatch.setattr(interp_comprehension.ComprehensionEval, "view", lambda *args: None)
    slow = _run(g, x=x, w=w)["y"]
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-6)


def test_a_window_read_out_of_range_still_raises():
    from mlpack.spec.errors import IndexRangeError

    g = _graph({"x": ("f32", {"y": 5})})
    _op(g, "y", "f32", {"h": 4}, ex.read("x", {"y": V("h") + 2}, "f32"))
    with pytest.raises(IndexRangeError):
        _run(g, x=np.zeros(5, np.float32))
