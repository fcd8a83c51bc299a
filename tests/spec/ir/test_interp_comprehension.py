"""Comprehensions evaluated in blocks (spec/ir/interp_comprehension.py) give what one piece does."""

from __future__ import annotations

import numpy as np

from mlpack.spec.ir import interp_comprehension as ic
from mlpack.spec.ir import parse_graph, run_graph

RNG = np.random.default_rng(5)

# the capsule routing's kinds of op: a weighted sum over the inputs of a broadcast deviation, a
# max and a softmax denominator over one dim, a strided convolution (a true contraction), a map
ROUTING = '''graph "routing" {
  in %v: f32{n=3, x=4, b=6, o=5} (n, x, b, o)
  in %r: f32{n=3, x=4, b=6} (n, x, b)
  in %p: f32{n=3, h=9, c=2} (n, h, c)
  in %w: f32{k=3, c=2, o=5} (k, c, o)
  %mu: f32{n=3, x=4, o=5} = sum{b=6} %v[n=n, x=x, b=b, o=o] * %r[n=n, x=x, b=b]
  %var: f32{n=3, x=4, o=5} = sum{b=6} (%v[n=n, x=x, b=b, o=o] - %mu[n=n, x=x, o=o]) * (%v[n=n, x=x, b=b, o=o] - %mu[n=n, x=x, o=o]) * %r[n=n, x=x, b=b] * 0.5
  %top: f32{n=3, x=4, b=6} = max{o=5} %v[n=n, x=x, b=b, o=o]
  %e: f32{n=3, x=4, b=6} = sum{o=5} exp(%v[n=n, x=x, b=b, o=o] - %top[n=n, x=x, b=b])
  %conv: f32{n=3, x=4, o=5} = sum{k=3, c=2} %p[n=n, h=2 * x + k, c=c] * %w[k=k, c=c, o=o]
  %y: f32{n=3, x=4, o=5} = %var[n=n, x=x, o=o] + log(%mu[n=n, x=x, o=o] * %mu[n=n, x=x, o=o]) + %conv[n=n, x=x, o=o]
  out %y (n, x, o)
  out %e (n, x, b)
}'''


def _inputs():
    return {"v": RNG.standard_normal((3, 4, 6, 5)).astype(np.float32),
            "r": RNG.uniform(0.1, 1, (3, 4, 6)).astype(np.float32),
            "p": RNG.standard_normal((3, 9, 2)).astype(np.float32),
            "w": RNG.standard_normal((3, 2, 5)).astype(np.float32)}


def test_blocks_give_what_one_piece_gives(monkeypatch):
    g, feeds = parse_graph(ROUTING), _inputs()
    whole = run_graph(g, feeds)
    seen = []
    plan = ic.ComprehensionEval.blocks

    def blocks(self):
        out = plan(self)
        seen.append(out)
        return out

    monkeypatch.setattr(ic, "BLOCK_BYTES", 64)   # a block of 8 elements at most
    monkeypatch.setattr(ic.ComprehensionEval, "blocks", blocks)
    blocked = run_graph(g, feeds)
    assert all(seen) and any(len(b) > 1 for b in seen)   # every op ran in several blocks
    for name in whole:
        np.testing.assert_allclose(blocked[name], whole[name], rtol=1e-6, atol=1e-6)
    v, r = feeds["v"].astype(np.float64), feeds["r"].astype(np.float64)
    mu = np.einsum("nxbo,nxb->nxo", v, r)
    var = 0.5 * np.einsum("nxbo,nxb->nxo", (v - mu[:, :, None]) ** 2, r)
    idx = 2 * np.arange(4)[:, None] + np.arange(3)[None, :]
    conv = np.einsum("nxkc,kco->nxo", feeds["p"][:, idx], feeds["w"])
    np.testing.assert_allclose(blocked["y"], var + np.log(mu * mu) + conv, rtol=1e-4, atol=1e-5)


def test_the_largest_temporary_sets_the_blocks():
    """A weighted sum over a big space is blocked; a contraction whose operands are views and
    whose output is small is not (its GEMM would repeat the packing of the shared operand)."""
    g = parse_graph('''graph "big" {
      in %v: f32{n=64, b=512, o=256} (n, b, o)
      in %r: f32{n=64, b=512} (n, b)
      in %w: f32{b=512, o=256} (b, o)
      %d: f32{n=64, o=256} = sum{b=512} (%v[n=n, b=b, o=o] - 1.0) * %r[n=n, b=b]
      %m: f32{n=64, o=256} = sum{b=512} %r[n=n, b=b] * %w[b=b, o=o]
      out %d (n, o)
      out %m (n, o)
    }''')

    class Tensors:
        data = {"v": np.zeros((64, 512, 256), np.float32), "r": np.zeros((64, 512), np.float32),
                "w": np.zeros((512, 256), np.float32)}
        layout = {"v": ("n", "b", "o"), "r": ("n", "b"), "w": ("b", "o")}

    d, m = (ic.ComprehensionEval(op, Tensors, {}) for op in g.ops)
    [(dim, size)] = d.blocks()
    assert dim == "n" and 8 * size * 512 * 256 <= ic.BLOCK_BYTES
    assert m.blocks() == []


def test_a_factor_past_the_block_size_is_read_in_blocks():
    """vgg19's fc6 weight (411 MB), read whole, made an 822 MB float64 copy in the reference
    and einsum copied it again: a factor past BLOCK_BYTES is a block's temporary too."""
    g = parse_graph('''graph "fc" {
      in %x: f32{n=2, k=4096} (n, k)
      in %w: f32{k=4096, o=2048} (k, o)
      %y: f32{n=2, o=2048} = sum{k=4096} %x[n=n, k=k] * %w[k=k, o=o]
      out %y (n, o)
    }''')

    class Tensors:
        data = {"x": np.zeros((2, 4096), np.float32), "w": np.zeros((4096, 2048), np.float32)}
        layout = {"x": ("n", "k"), "w": ("k", "o")}

    [(dim, size)] = ic.ComprehensionEval(g.ops[0], Tensors, {}).blocks()
    assert dim == "o" and 8 * 4096 * size <= ic.BLOCK_BYTES and size < 2048
    x = RNG.standard_normal((2, 4096)).astype(np.float32)
    w = RNG.standard_normal((4096, 2048)).astype(np.float32)
    # (f32 sums of 4096 products of about 64 in scale: 2e-5 of it)
    np.testing.assert_allclose(run_graph(g, {"x": x, "w": w})["y"],
                               x.astype(np.float64) @ w.astype(np.float64), rtol=0, atol=1.5e-3)


def test_an_evaluator_and_its_temporaries_go_when_its_op_is_done():
    # a reference cycle through an evaluator kept its memo (a block's temporaries) alive until
    # the cycle collector ran, which big arrays and few objects seldom make it do
    import gc

    g, feeds = parse_graph(ROUTING), _inputs()
    gc.collect()
    gc.disable()
    try:
        run_graph(g, feeds)
        left = [o for o in gc.get_objects() if type(o) is ic.ComprehensionEval]
    finally:
        gc.enable()
    assert left == []


def test_a_windows_max_and_min_are_numpys_over_every_dtype_nan_and_the_identity():
    """A max or min over a few taps (a pooling window, read through a strided view) goes tap
    by tap (``_extreme``): the same values as numpy's reduction, nan propagated, at least the
    identity the reduction starts from, for floats, integers and bools; more taps than
    WINDOW_TAPS, or every axis reduced, go through numpy's reduction itself."""
    from numpy.lib.stride_tricks import as_strided

    from mlpack.spec.ir import dtypes as dt

    x = RNG.standard_normal((2, 3, 11, 9))
    x[0, 1, 4, 4] = np.nan
    s = x.strides   # a 3x3 window of stride 2 over the last two dims
    view = as_strided(x, (2, 3, 5, 4, 3, 3), (s[0], s[1], 2 * s[2], 2 * s[3], s[2], s[3]))
    for dtype in ("f64", "f32", "i32", "u8", "bool"):
        data = view > 0 if dtype == "bool" else view.astype(dt.to_numpy(dtype)) \
            if dt.is_float(dtype) else np.nan_to_num(view * 40).astype(dt.to_numpy(dtype))
        for kind, f, init in (("max", np.max, dt.lowest(dtype)),
                              ("min", np.min, dt.highest(dtype))):
            for axes in ((4, 5), (2, 4), (1,)):
                got = ic._extreme(data, axes, kind, init)
                want = f(data, axis=axes, initial=init)
                assert got.dtype == want.dtype and got.shape == want.shape, (dtype, kind, axes)
                np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {kind} {axes}")
    assert np.isnan(ic._extreme(view, (4, 5), "max", -np.inf)[0, 1, 2, 2])   # (the nan's window)
    # the identity bounds an all-lowest window (an integer max starts at the dtype's least)
    low = np.full((4, 2), -5, dtype=np.int8)
    np.testing.assert_array_equal(ic._extreme(low, (1,), "max", -3), np.full(4, -3, np.int8))
    wide = RNG.standard_normal((3, ic.WINDOW_TAPS + 1))
    np.testing.assert_array_equal(ic._extreme(wide, (1,), "max", -np.inf), wide.max(axis=1))
    np.testing.assert_array_equal(ic._extreme(wide, (0, 1), "min", np.inf), wide.min())


MAPS = '''graph "maps" {
  in %a: f32{h=3, t=40, s=24} (h, t, s)
  in %b: f32{h=3, s=24} (h, s)
  in %q: f64{h=3, t=40, d=8} (h, t, d)
  in %k: f64{h=3, s=24, d=8} (h, s, d)
  %m: f32{h=3, t=40, s=24} = %a[h=h, t=t, s=s] * %b[h=h, s=s]
  %e: f32{s=24, h=3, t=40} = exp(%a[h=h, t=t, s=s] - 1.5)
  %w: f32{h=3, t=40, s=24} = %b[h=h, s=s] + 2.0
  %c: f32{} = 3.0 * 2.0
  %sc: f64{h=3, t=40, s=24} = sum{d=8} %k[h=h, s=s, d=d] * %q[h=h, t=t, d=d]
  out %m (h, t, s)
  out %e (s, h, t)
  out %w (h, t, s)
  out %c ()
  out %sc (h, t, s)
}'''


def test_a_maps_last_operation_writes_the_output_in_place(monkeypatch):
    """A map ending in a float ufunc stores its result straight into the output, whole or in
    blocks (``store``): the values of NumPy's own arithmetic over dims in any order, broadcast
    over the dims the body lacks, a 0-d output; its result is not a block's temporary, and
    nothing is copied into the output (``arrange``). A contraction of two factors comes out of
    einsum laid out as its output, whichever factor is written first, so it is not copied."""
    g = parse_graph(MAPS)
    a = RNG.standard_normal((3, 40, 24)).astype(np.float32)
    b = RNG.standard_normal((3, 24)).astype(np.float32)
    q, k = RNG.standard_normal((3, 40, 8)), RNG.standard_normal((3, 24, 8))
    feeds = {"a": a, "b": b, "q": q, "k": k}
    want = {"m": a * b[:, None, :], "e": np.transpose(np.exp(a - np.float32(1.5)), (2, 0, 1)),
            "w": np.broadcast_to((b + np.float32(2))[:, None, :], (3, 40, 24)),
            "c": np.float32(6), "sc": np.einsum("htd,hsd->hts", q, k)}
    copies = []
    arrange = ic.ComprehensionEval.arrange
    monkeypatch.setattr(ic.ComprehensionEval, "arrange",
                        lambda self, *args: copies.append(self.op.out) or arrange(self, *args))
    whole = ic.BLOCK_BYTES
    for limit in (whole, 8 * 24 * 8):   # whole, then blocks of a few rows
        monkeypatch.setattr(ic, "BLOCK_BYTES", limit)
        got = run_graph(g, feeds)
        for name, value in want.items():
            assert got[name].dtype == value.dtype, name
            np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-12, err_msg=name)
        if limit == whole:
            assert copies == []
    assert set(copies) == {"sc"}   # (only the contraction's blocks are copied in)

    class Tensors:
        data, layout = {"a": a, "b": b}, {"a": ("h", "t", "s"), "b": ("h", "s")}

    m = ic.ComprehensionEval(g.ops[0], Tensors, {})
    # (the reads are views, their indices vectors: no temporary spans the output's dims)
    assert m.ufunc is np.multiply and max(map(len, m.spaces())) == 1
