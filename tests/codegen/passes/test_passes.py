"""Pass tests: IR text in, IR text out, and the meaning unchanged (checked by the interpreter)."""

import textwrap

import numpy as np

from mlpack.spec.ir import format_graph
from mlpack.codegen.passes.cse import eliminate_common_subexpressions
from mlpack.codegen.passes.dce import eliminate_dead_code
from mlpack.codegen.passes.fuse import fuse_elementwise
from mlpack.codegen.passes.pipeline import run_pipeline
from support import check_pass, parse_ir


def _check(before_text, fn, after_text, inputs):
    check_pass(before_text, fn, after_text, inputs, rtol=1e-6)


X = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}


def test_fuse_inlines_single_use_map_into_its_consumer():
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3, k=4} = %x[n=n, k=k] * 2.0
          %b: f32{n=3} = sum{k=4} exp(%a[n=n, k=k])
          out %b (n)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %b: f32{n=3} = sum{k=4} exp(%x[n=n, k=k] * 2.0)
          out %b (n)
        }
        """, X)


def test_fuse_keeps_a_map_read_twice_and_one_read_with_padding():
    text = """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3, k=4} = exp(%x[n=n, k=k])
          %b: f32{n=3, k=4} = %a[n=n, k=k] + %a[n=n, k=3 - k]
          %c: f32{n=3, k=4} = tanh(%x[n=n, k=k])
          %d: f32{n=3, k=4} = %c[n=n, k=k + 1; pad=0.0] + %b[n=n, k=k]
          out %d (n, k)
        }
        """
    _check(text, fuse_elementwise, textwrap.dedent(text).replace(
        "  %b: f32{n=3, k=4} = %a[n=n, k=k] + %a[n=n, k=3 - k]\n", "").replace(
        "+ %b[n=n, k=k]", "+ (%a[n=n, k=k] + %a[n=n, k=3 - k])"), X)


def test_fuse_inlines_a_cheap_map_its_one_reader_reads_twice_at_one_index():
    # a bias add read twice by hardswish, x * clamp(x / 6 + 1/2): inlined (the convolution's
    # epilogue then takes both); an exp read twice the same way is kept (computed once)
    text = """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3, k=4} = %x[n=n, k=k] + 1.0
          %b: f32{n=3, k=4} = %a[n=n, k=k] * max(0.0, min(1.0, %a[n=n, k=k] * 0.25 + 0.5))
          %c: f32{n=3, k=4} = exp(%b[n=n, k=k])
          %d: f32{n=3, k=4} = %c[n=n, k=k] * %c[n=n, k=k]
          out %d (n, k)
        }
        """
    _check(text, fuse_elementwise, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %c: f32{n=3, k=4} = exp((%x[n=n, k=k] + 1.0) * max(0.0, min(1.0, (%x[n=n, k=k] + 1.0) * 0.25 + 0.5)))
          %d: f32{n=3, k=4} = %c[n=n, k=k] * %c[n=n, k=k]
          out %d (n, k)
        }
        """, X)


def test_fuse_repeats_until_a_producer_has_one_reader_left():
    # SiLU as exported, Sigmoid and Mul over a bias add: the bias add has two readers until the
    # sigmoid is inlined into the Mul, then one that reads it at one index; the next round
    # inlines it, so the sum before it takes the whole activation as its epilogue
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %c: f32{n=3} = sum{k=4} %x[n=n, k=k] * %x[n=n, k=k]
          %a: f32{n=3} = %c[n=n] + 1.0
          %s: f32{n=3} = sigmoid(%a[n=n])
          %y: f32{n=3} = %a[n=n] * %s[n=n]
          out %y (n)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %c: f32{n=3} = sum{k=4} %x[n=n, k=k] * %x[n=n, k=k]
          %y: f32{n=3} = (%c[n=n] + 1.0) * sigmoid(%c[n=n] + 1.0)
          out %y (n)
        }
        """, X)


def test_fuse_inlines_copies_even_when_read_twice():
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %t: f32{a=4, b=3} = %x[n=b, k=a]
          %y: f32{a=4, b=3} = %t[a=a, b=b] * %t[a=3 - a, b=b]
          out %y (b, a)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %y: f32{a=4, b=3} = %x[n=b, k=a] * %x[n=b, k=3 - a]
          out %y (b, a)
        }
        """, X)


def test_cse_merges_identical_ops():
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3} = max{k=4} %x[n=n, k=k]
          %b: f32{n=3} = max{k=4} %x[n=n, k=k]
          %c: f32{n=3} = %a[n=n] - %b[n=n]
          out %c (n)
        }
        """, eliminate_common_subexpressions, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3} = max{k=4} %x[n=n, k=k]
          %c: f32{n=3} = %a[n=n] - %a[n=n]
          out %c (n)
        }
        """, X)


def test_dce_drops_unused_ops_and_constants():
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          const %w: f32{k=4} (k) = [1.0, 2.0, 3.0, 4.0]
          %dead: f32{n=3, k=4} = %x[n=n, k=k] * %w[k=k]
          %y: f32{n=3, k=4} = neg(%x[n=n, k=k])
          out %y (n, k)
        }
        """, eliminate_dead_code, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %y: f32{n=3, k=4} = neg(%x[n=n, k=k])
          out %y (n, k)
        }
        """, X)


def test_pipeline_logs_passes_at_debug_1_and_ir_at_2(monkeypatch, capsys):
    g = parse_ir("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          %a: f32{n=3, k=4} = exp(%x[n=n, k=k])
          %b: f32{n=3, k=4} = neg(%a[n=n, k=k])
          out %b (n, k)
        }
        """)
    monkeypatch.setenv("MLPACK_DEBUG", "1")
    run_pipeline(g)
    err = capsys.readouterr().err
    assert "pass fuse:" in err and "ms" in err and "IR after" not in err
    monkeypatch.setenv("MLPACK_DEBUG", "2")
    run_pipeline(parse_ir(format_graph(g)))
    err = capsys.readouterr().err
    assert "IR after import" in err


def test_unflatten_splits_rows_a_reshape_flattened():
    # x.view(-1, k) @ w, viewed back: the rows m < 6 read as m // 3, m % 3 become (m_hi, m_lo),
    # and the reader's m = b * 3 + s becomes (b, s): both sides affine
    from mlpack.codegen.passes.unflatten import unflatten_dims

    rng = np.random.default_rng(1)
    _check("""\
        graph "g" {
          in %x: f32{b=2, s=3, k=4} (b, s, k)
          in %w: f32{k=4, n=5} (k, n)
          %y: f32{m=6, n=5} = sum{k=4} %x[b=m // 3, s=m % 3, k=k] * %w[k=k, n=n]
          %z: f32{b=2, s=3, n=5} = %y[m=b * 3 + s, n=n] + 1.0
          out %z (b, s, n)
        }
        """, unflatten_dims, """\
        graph "g" {
          in %x: f32{b=2, s=3, k=4} (b, s, k)
          in %w: f32{k=4, n=5} (k, n)
          %y: f32{m_hi=2, m_lo=3, n=5} = sum{k=4} %x[b=m_hi, s=m_lo, k=k] * %w[k=k, n=n]
          %z: f32{b=2, s=3, n=5} = %y[m_hi=b, m_lo=s, n=n] + 1.0
          out %z (b, s, n)
        }
        """, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
              "w": rng.standard_normal((4, 5)).astype(np.float32)})


def test_unflatten_leaves_a_dim_used_whole():
    from mlpack.codegen.passes.unflatten import unflatten_dims

    text = """\
        graph "g" {
          in %x: f32{b=2, s=3, k=4} (b, s, k)
          in %v: f32{m=6} (m)
          %y: f32{m=6, k=4} = %x[b=m // 3, s=m % 3, k=k] * %v[m=m]
          %z: f32{m=6, k=4} = %y[m=m, k=k] + 1.0
          out %z (m, k)
        }
        """
    rng = np.random.default_rng(2)
    _check(text, unflatten_dims, text, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
                                        "v": rng.standard_normal(6).astype(np.float32)})


def test_unflatten_splits_a_grouped_convolutions_channel_used_whole_too():
    # a grouped convolution's [g, co] read back as c // 4, c % 4 by its bias and relu, which
    # read the bias at c: the map is split (c = 4 * c_hi + c_lo) and reads x at the identity,
    # its readers follow (the pooling splits its output, the contraction its K)
    from mlpack.codegen.passes.unflatten import unflatten_dims

    rng = np.random.default_rng(4)
    _check("""\
        graph "g" {
          in %x: f32{g=2, co=4, h=3} (g, co, h)
          in %b: f32{c=8} (c)
          in %w: f32{k=8, j=5} (k, j)
          %y: f32{c=8, h=3} = max(%x[g=c // 4, co=c % 4, h=h] + %b[c=c], 0.0)
          %s: f32{c=8} = sum{r=3} %y[c=c, h=r]
          %z: f32{h=3, j=5} = sum{k=8} %y[c=k, h=h] * %w[k=k, j=j] * %s[c=k]
          out %z (h, j)
        }
        """, unflatten_dims, """\
        graph "g" {
          in %x: f32{g=2, co=4, h=3} (g, co, h)
          in %b: f32{c=8} (c)
          in %w: f32{k=8, j=5} (k, j)
          %y: f32{c_hi=2, c_lo=4, h=3} = max(%x[g=c_hi, co=c_lo, h=h] + %b[c=4 * c_hi + c_lo], 0.0)
          %s: f32{c_hi=2, c_lo=4} = sum{r=3} %y[c_hi=c_hi, c_lo=c_lo, h=r]
          %z: f32{h=3, j=5} = sum{k_0=2, k_1=4} %y[c_hi=k_0, c_lo=k_1, h=h] * %w[k=4 * k_0 + k_1, j=j] * %s[c_hi=k_0, c_lo=k_1]
          out %z (h, j)
        }
        """, {"x": rng.standard_normal((2, 4, 3)).astype(np.float32),
              "b": rng.standard_normal(8).astype(np.float32),
              "w": rng.standard_normal((8, 5)).astype(np.float32)})


def test_unflatten_leaves_a_dim_whose_reader_could_not_follow():
    # the same map read whole by a graph output, which keeps its type: splitting would leave
    # that reader dividing
    from mlpack.codegen.passes.unflatten import unflatten_dims

    text = """\
        graph "g" {
          in %x: f32{g=2, co=4, h=3} (g, co, h)
          in %b: f32{c=8} (c)
          %y: f32{c=8, h=3} = max(%x[g=c // 4, co=c % 4, h=h] + %b[c=c], 0.0)
          %z: f32{c=8, h=3} = %y[c=c, h=h] * 2.0
          out %z (c, h)
        }
        """
    rng = np.random.default_rng(5)
    _check(text, unflatten_dims, text, {"x": rng.standard_normal((2, 4, 3)).astype(np.float32),
                                        "b": rng.standard_normal(8).astype(np.float32)})


def test_divide_after_moves_a_softmax_normalization_past_the_product():
    # P.V with P = e / z: the sum reads e and the result is divided by z once per element
    from mlpack.codegen.passes.divide_after import divide_after

    rng = np.random.default_rng(6)
    _check("""\
        graph "g" {
          in %s: f32{x=3, j=4} (x, j)
          in %v: f32{k=4, n=5} (k, n)
          %e: f32{x=3, j=4} = exp(%s[x=x, j=j])
          %z: f32{x=3, j=1} = sum{r=4} %e[x=x, j=r]
          %p: f32{x=3, j=4} = div(%e[x=x, j=j], %z[x=x, j=0])
          %o: f32{x=3, n=5} = sum{k=4} %p[x=x, j=k] * %v[k=k, n=n]
          out %o (x, n)
        }
        """, divide_after, """\
        graph "g" {
          in %s: f32{x=3, j=4} (x, j)
          in %v: f32{k=4, n=5} (k, n)
          %e: f32{x=3, j=4} = exp(%s[x=x, j=j])
          %z: f32{x=3, j=1} = sum{r=4} %e[x=x, j=r]
          %p: f32{x=3, j=4} = div(%e[x=x, j=j], %z[x=x, j=0])
          %o_undivided: f32{x=3, n=5} = sum{k=4} %e[x=x, j=k] * %v[k=k, n=n]
          %o: f32{x=3, n=5} = div(%o_undivided[x=x, n=n], %z[x=x, j=0])
          out %o (x, n)
        }
        """, {"s": rng.standard_normal((3, 4)).astype(np.float32),
              "v": rng.standard_normal((4, 5)).astype(np.float32)})


def test_divide_after_leaves_a_divisor_that_moves_with_the_sum():
    from mlpack.codegen.passes.divide_after import divide_after

    text = """\
        graph "g" {
          in %a: f32{x=3, j=4} (x, j)
          in %b: f32{j=4} (j)
          in %v: f32{k=4, n=5} (k, n)
          %p: f32{x=3, j=4} = div(%a[x=x, j=j], %b[j=j])
          %o: f32{x=3, n=5} = sum{k=4} %p[x=x, j=k] * %v[k=k, n=n]
          out %o (x, n)
        }
        """
    rng = np.random.default_rng(7)
    _check(text, divide_after, text, {"a": rng.standard_normal((3, 4)).astype(np.float32),
                                      "b": rng.uniform(1, 2, 4).astype(np.float32),
                                      "v": rng.standard_normal((4, 5)).astype(np.float32)})


def test_scale_after_moves_both_scaled_operands_of_a_shared_projection():
    # torch's exported attention: Q and K^T each scaled, both slices of one projection that
    # the values' product reads too; the product reads the slices and scales once after
    from mlpack.codegen.passes.divide_after import scale_after

    rng = np.random.default_rng(8)
    _check("""\
        graph "g" {
          in %p: f32{t=4, c=6} (t, c)
          %q: f32{t=4, d=2} = %p[t=t, c=d] * 0.5
          %k: f32{t=4, d=2} = %p[t=t, c=2 + d] * 0.25
          %s: f32{x=4, j=4} = sum{r=2} %q[t=x, d=r] * %k[t=j, d=r]
          %o: f32{x=4, n=2} = sum{r=4} %s[x=x, j=r] * %p[t=r, c=4 + n]
          out %o (x, n)
        }
        """, scale_after, """\
        graph "g" {
          in %p: f32{t=4, c=6} (t, c)
          %q: f32{t=4, d=2} = %p[t=t, c=d] * 0.5
          %k: f32{t=4, d=2} = %p[t=t, c=2 + d] * 0.25
          %s_unscaled: f32{x=4, j=4} = sum{r=2} %p[t=x, c=r] * %p[t=j, c=2 + r]
          %s: f32{x=4, j=4} = %s_unscaled[x=x, j=j] * 0.5 * 0.25
          %o: f32{x=4, n=2} = sum{r=4} %s[x=x, j=r] * %p[t=r, c=4 + n]
          out %o (x, n)
        }
        """, {"p": rng.standard_normal((4, 6)).astype(np.float32)})


def test_scale_after_leaves_a_scale_its_producer_takes_and_one_along_the_sum():
    # a scaled tensor read by the map alone (fused into its producer for nothing), and a
    # scale that varies along the summed dim, stay where they are
    from mlpack.codegen.passes.divide_after import scale_after

    rng = np.random.default_rng(9)
    text = """\
        graph "g" {
          in %a: f32{x=3, j=4} (x, j)
          in %b: f32{x=3, j=4} (x, j)
          in %w: f32{j=4} (j)
          in %v: f32{k=4, n=5} (k, n)
          %q: f32{x=3, j=4} = %a[x=x, j=j] * 0.5
          %o: f32{x=3, n=5} = sum{k=4} %q[x=x, j=k] * %v[k=k, n=n]
          %p: f32{x=3, j=4} = %b[x=x, j=j] * %w[j=j]
          %u: f32{x=3, n=5} = sum{k=4} %p[x=x, j=k] * %v[k=k, n=n]
          %z: f32{x=3, j=4} = %b[x=x, j=j] + 1.0
          out %o (x, n)
          out %u (x, n)
          out %z (x, j)
        }
        """
    _check(text, scale_after, text, {"a": rng.standard_normal((3, 4)).astype(np.float32),
                                     "b": rng.standard_normal((3, 4)).astype(np.float32),
                                     "w": rng.standard_normal(4).astype(np.float32),
                                     "v": rng.standard_normal((4, 5)).astype(np.float32)})


def test_fuse_keeps_a_map_that_a_reused_copy_reads():
    # softmax -> Cast -> P.V: the copy is inlined into the matmul, which reads it for every
    # output column, so the exp below it must stay a tensor (else it runs once per column)
    _check("""\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          in %v: f32{k=4, j=5} (k, j)
          %e: f32{n=3, k=4} = exp(%x[n=n, k=k])
          %c: f32{n=3, k=4} = %e[n=n, k=k]
          %y: f32{n=3, j=5} = sum{k=4} %c[n=n, k=k] * %v[k=k, j=j]
          out %y (n, j)
        }
        """, fuse_elementwise, """\
        graph "g" {
          in %x: f32{n=3, k=4} (n, k)
          in %v: f32{k=4, j=5} (k, j)
          %e: f32{n=3, k=4} = exp(%x[n=n, k=k])
          %y: f32{n=3, j=5} = sum{k=4} %e[n=n, k=k] * %v[k=k, j=j]
          out %y (n, j)
        }
        """, {"x": X["x"], "v": np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)})
