"""The passes that turn framework-shaped contractions (gathers, reshapes, MatMul + ReduceSum)
into the direct contraction: IR text in, IR text out, the meaning unchanged (interpreter)."""

import numpy as np

from mlpack.spec.ir import format_graph
from mlpack.codegen.passes.absorb import absorb_reductions
from mlpack.codegen.passes.affine_gather import fold_affine_gathers
from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.passes.split_dims import split_dims
from mlpack.codegen.passes.sums import merge_sums
from support import check_pass


def _check(before_text, fn, after_text, inputs):
    check_pass(before_text, fn, after_text, inputs, rtol=1e-5, atol=1e-6)


def _and_dce(fn):
    return lambda g: eliminate_dead_code(fn(g))


RNG = np.random.default_rng(0)
X = {"x": RNG.standard_normal((8, 5)).astype(np.float32)}


# ---------------------------------------------------------------- affine constant gathers


def test_affine_gather_turns_a_strided_index_table_into_arithmetic():
    # idx[o, k] = 2*o + k, read through the importer's negative-index wrap
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %idx: i64{o=3, k=2} (o, k) = [0, 1, 2, 3, 4, 5]
          %y: f32{o=3, k=2, c=5} = %x[h=select(lt(%idx[o=o, k=k], 0), %idx[o=o, k=k] + 8, %idx[o=o, k=k]), c=c]
          out %y (o, k, c)
        }
        """, _and_dce(fold_affine_gathers), """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{o=3, k=2, c=5} = %x[h=2 * o + k, c=c]
          out %y (o, k, c)
        }
        """, X)


def test_affine_gather_keeps_the_wrap_of_all_negative_indices_and_widens_i32():
    # idx[k] = -1 - k (reversed from the end), stored as i32
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %idx: i32{k=3} (k) = [-1:i32, -2:i32, -3:i32]
          %y: f32{k=3, c=5} = %x[h=select(lt(cast<i64>(%idx[k=k]), 0), cast<i64>(%idx[k=k]) + 8, cast<i64>(%idx[k=k])), c=c]
          out %y (k, c)
        }
        """, _and_dce(fold_affine_gathers), """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{k=3, c=5} = %x[h=7 - k, c=c]
          out %y (k, c)
        }
        """, X)


def test_affine_gather_leaves_tables_that_are_not_affine_or_read_guarded():
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %perm: i64{k=3} (k) = [0, 2, 1]
          const %idx: i64{k=3} (k) = [1, 2, 3]
          %y: f32{k=3, c=5} = %x[h=%perm[k=k], c=c] + %x[h=%idx[k=k + 1; pad=0], c=c]
          out %y (k, c)
        }
        """
    _check(text, _and_dce(fold_affine_gathers), text, X)


def test_affine_gather_keeps_a_mixed_sign_wrap_as_a_select():
    # idx = [-2, -1, 0, 1]: affine, but the wrap picks differently per element
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %idx: i64{k=4} (k) = [-2, -1, 0, 1]
          %y: f32{k=4, c=5} = %x[h=select(lt(%idx[k=k], 0), %idx[k=k] + 8, %idx[k=k]), c=c]
          out %y (k, c)
        }
        """, _and_dce(fold_affine_gathers), """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{k=4, c=5} = %x[h=select(lt(k - 2, 0), k + 6, k - 2), c=c]
          out %y (k, c)
        }
        """, X)


# ---------------------------------------------------------------- copies under a guard


def test_fuse_inlines_a_transposing_copy_into_a_padded_read():
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %t: f32{c=5, h=8} = %x[h=h, c=c]
          %y: f32{c=5, o=8} = %t[c=c, h=o - 1; pad=0.0] + %t[c=c, h=o + 1; pad=0.0]
          out %y (c, o)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{c=5, o=8} = %x[h=o - 1, c=c; pad=0.0] + %x[h=o + 1, c=c; pad=0.0]
          out %y (c, o)
        }
        """, X)


def test_fuse_inlines_a_reshaping_copy_into_a_padded_read_with_a_bounds_test():
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %r: f32{a=4, b=10} = %x[h=(10 * a + b) // 5, c=(10 * a + b) % 5]
          %y: f32{a=4, b=10} = %r[a=a, b=b + 3; pad=0.0]
          out %y (a, b)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{a=4, b=10} = select(and(and(ge(a, 0), lt(a, 4)), and(ge(b + 3, 0), lt(b + 3, 10))), %x[h=(10 * a + (b + 3)) // 5, c=(10 * a + (b + 3)) % 5; pad=0.0], 0.0)
          out %y (a, b)
        }
        """, X)


def test_fuse_still_keeps_a_computing_map_read_under_a_guard():
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %e: f32{h=8, c=5} = exp(%x[h=h, c=c])
          %y: f32{h=8, c=5} = %e[h=h + 1, c=c; pad=0.0]
          out %y (h, c)
        }
        """
    _check(text, fuse_elementwise, text, X)


# ---------------------------------------------------------------- sums of sums


def test_sum_of_sums_merges_a_matmul_and_its_reduce_sum():
    # votes[b, r, o] = sum_k x[b, k] w[k, r, o]; out[b, o] = sum_r votes; k clashes: renamed
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{c=5, r=2} (c, r) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          %v: f32{b=8, r=2, k=5} = sum{c=5} %x[h=b, c=c] * %w[c=c, r=r]
          %s: f32{b=8} = sum{k=2, c=5} %v[b=b, r=k, k=c]
          out %s (b)
        }
        """, merge_sums, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{c=5, r=2} (c, r) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          %s: f32{b=8} = sum{k=2, c=5, c_1=5} %x[h=b, c=c_1] * %w[c=c_1, r=k]
          out %s (b)
        }
        """, X)


def test_sum_of_sums_distributes_a_factor_and_merges_max_of_max():
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %v: f32{h=8} = sum{c=5} %x[h=h, c=c]
          %s: f32{} = sum{h=8} %v[h=h] * 0.5
          %m: f32{h=8} = max{c=5} %x[h=h, c=c]
          %n: f32{} = max{h=8} %m[h=h]
          %y: f32{} = %s[] + %n[]
          out %y ()
        }
        """, merge_sums, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %s: f32{} = sum{h=8, c=5} %x[h=h, c=c] * 0.5
          %n: f32{} = max{h=8, c=5} %x[h=h, c=c]
          %y: f32{} = %s[] + %n[]
          out %y ()
        }
        """, X)


def test_sum_of_sums_leaves_shared_outputs_and_mixed_reductions():
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %v: f32{h=8} = sum{c=5} %x[h=h, c=c]
          %s: f32{} = sum{h=8} %v[h=h]
          %m: f32{h=8} = max{c=5} %x[h=h, c=c]
          %n: f32{} = sum{h=8} %m[h=h]
          %p: f32{h=8} = sum{c=5} %x[h=h, c=c] * 2.0
          %q: f32{} = sum{h=8} exp(%p[h=h])
          out %s ()
          out %v (h)
          out %n ()
          out %q ()
        }
        """
    _check(text, merge_sums, text, X)


# ---------------------------------------------------------------- reductions into copies


def test_absorb_moves_a_reduction_into_the_reshape_that_copies_it():
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %s: f32{p=8} = sum{c=5} %x[h=p, c=c]
          %y: f32{a=2, b=4} = %s[p=4 * a + b]
          out %y (a, b)
        }
        """, absorb_reductions, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{a=2, b=4} = sum{c=5} %x[h=4 * a + b, c=c]
          out %y (a, b)
        }
        """, X)


def test_absorb_leaves_a_copy_that_repeats_the_reduction():
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %s: f32{p=8} = sum{c=5} %x[h=p, c=c]
          %y: f32{a=3, p=8} = %s[p=p]
          out %y (a, p)
        }
        """
    _check(text, absorb_reductions, text, X)


# ---------------------------------------------------------------- flattened reduction dims


def test_split_dims_undoes_a_flattening_reshape_of_the_reduced_axis():
    # r < 10 stands for (i < 2, j < 5) flattened: x[h=2*o + r // 5, c=r % 5]
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{r=10} (r) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          %y: f32{o=4} = sum{r=10} %x[h=2 * o + r // 5, c=r % 5] * %w[r=r]
          %z: f32{o=4} = %y[o=(4 * o + 3) // 4 % 4]
          out %z (o)
        }
        """, split_dims, """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{r=10} (r) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          %y: f32{o=4} = sum{r_0=2, r_1=5} %x[h=2 * o + r_0, c=r_1] * %w[r=5 * r_0 + r_1]
          %z: f32{o=4} = %y[o=o]
          out %z (o)
        }
        """, X)


def test_split_dims_leaves_a_dim_whose_split_removes_nothing():
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          %y: f32{o=4} = sum{r=10} %x[h=(o + r) // 2, c=r % 5]
          out %y (o)
        }
        """
    _check(text, split_dims, text, X)


# ---------------------------------------------------------------- per-channel epilogues


def test_fold_scale_moves_a_batchnorm_into_the_weights_and_one_shift():
    # y = max((c + b - m) * s, 0) with c = x @ w: w scaled by s, one shift (b - m) * s
    from mlpack.codegen.passes.fold_scale import fold_scales
    _check("""\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{c=5, o=2} (c, o) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          const %b: f32{o=2} (o) = [0.5, -1.0]
          const %m: f32{o=2} (o) = [0.25, 0.0]
          const %s: f32{o=2} (o) = [2.0, 0.5]
          %c: f32{n=8, o=2} = sum{c=5} %x[h=n, c=c] * %w[c=c, o=o]
          %y: f32{n=8, k=2} = max((%c[n=n, o=k] + %b[o=k] - %m[o=k]) * %s[o=k], 0.0)
          out %y (n, k)
        }
        """, _and_dce(fold_scales), """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w_scaled: f32{c=5, o=2} (c, o) = dense"AAAAQAAAgL8AAMBAAAAAvwAAgD8AAAC/AADAwAAAAD8AAIA/AACAvw=="
          const %c_shift: f32{k=2} (k) = [0.5, -0.5]
          %c: f32{n=8, o=2} = sum{c=5} %x[h=n, c=c] * %w_scaled[c=c, o=o]
          %y: f32{n=8, k=2} = max(%c[n=n, o=k] + %c_shift[k=k], 0.0)
          out %y (n, k)
        }
        """, X)


def test_fold_scale_leaves_a_bias_alone_and_a_scale_on_a_reduced_dim():
    from mlpack.codegen.passes.fold_scale import fold_scales
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          const %w: f32{c=5} (c) = [1.0, 2.0, 3.0, 4.0, 5.0]
          const %b: f32{n=8} (n) = [1.0, -2.0, 3.0, -1.0, 0.5, -1.0, -3.0, 1.0]
          %c: f32{n=8} = sum{c=5} %x[h=n, c=c] * %w[c=c]
          %y: f32{n=8} = %c[n=n] + %b[n=n]
          %d: f32{n=8} = sum{c=5} %x[h=n, c=c] * %w[c=c] * 2.0
          %z: f32{n=8} = %d[n=n] * %b[n=n]
          out %y (n)
          out %z (n)
        }
        """
    _check(text, _and_dce(fold_scales), text, X)


def test_fold_scale_wider_takes_a_batch_of_one_and_a_residual_beside_it():
    """``wider`` (the int8 precision's): the epilogue reads the contraction's size-1 dim at 0
    and adds another tensor (a residual); the default rule leaves such a graph as it is."""
    from mlpack.codegen.passes.fold_scale import fold_scales
    text = """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          in %r: f32{n=8, k=2} (n, k)
          const %w: f32{c=5, o=2} (c, o) = dense"AACAPwAAAMAAAEBAAACAvwAAAD8AAIC/AABAwAAAgD8AAAA/AAAAwA=="
          const %m: f32{o=2} (o) = [0.25, 0.0]
          const %s: f32{o=2} (o) = [2.0, 0.5]
          %c: f32{b=1, n=8, o=2} = sum{c=5} %x[h=n, c=c] * %w[c=c, o=o]
          %y: f32{b=1, n=8, k=2} = max((%c[b=0, n=n, o=k] - %m[o=k]) * %s[o=k] + %r[n=n, k=k], 0.0)
          out %y (b, n, k)
        }
        """
    inputs = {**X, "r": RNG.standard_normal((8, 2)).astype(np.float32)}
    _check(text, _and_dce(fold_scales), text, inputs)
    _check(text, _and_dce(lambda g: fold_scales(g, wider=True)), """\
        graph "g" {
          in %x: f32{h=8, c=5} (h, c)
          in %r: f32{n=8, k=2} (n, k)
          const %w_scaled: f32{c=5, o=2} (c, o) = dense"AAAAQAAAgL8AAMBAAAAAvwAAgD8AAAC/AADAwAAAAD8AAIA/AACAvw=="
          const %c_shift: f32{k=2} (k) = [-0.5, -0.0]
          %c: f32{b=1, n=8, o=2} = sum{c=5} %x[h=n, c=c] * %w_scaled[c=c, o=o]
          %y: f32{b=1, n=8, k=2} = max(%c[b=0, n=n, o=k] + %c_shift[k=k] + %r[n=n, k=k], 0.0)
          out %y (b, n, k)
        }
        """, inputs)


def test_conv_batchnorm_relu_folds_and_matches_onnx_runtime():
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import mlpack
    rng = np.random.default_rng(1)
    co, ci = 4, 3
    arrays = {"W": rng.standard_normal((co, ci, 3, 3)), "B": rng.standard_normal(co),
              "s": rng.uniform(0.5, 1.5, co), "t": rng.standard_normal(co),
              "mean": rng.standard_normal(co), "var": rng.uniform(0.5, 1.5, co)}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "t", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ci, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, co, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = mlpack.compile_onnx(model)
    assert sorted(g.constants) == ["W_scaled", "c_conv_shift"], format_graph(g)
    x = rng.standard_normal((2, ci, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(mlpack.run_reference(model, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)
