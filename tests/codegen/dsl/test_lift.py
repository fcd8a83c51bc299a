"""lift.py: an operator written for one image runs over a (batch, time) video as one
comprehension, matching a batched convolution; the declared dims are checked by name."""

from __future__ import annotations

import numpy as np
import pytest

from mlpack.codegen import dsl
from mlpack.spec.ir.graph import Comprehension
from mlpack.spec.ir.interp import run_graph
from dsl_support import assert_close, rand


@dsl.op(image="x y ci", kernel="kx ky ci co")
def conv2d(image, kernel):
    """A 'same' 3x3 convolution of one image (x, y, ci), written for nothing else."""
    x, y = image.dim("x"), image.dim("y")
    kx, ky, ci = dsl.dims("kx ky ci")
    return dsl.sum[kx, ky, ci](image(x=x + kx - 1, y=y + ky - 1, pad=0.0) * kernel)


def batched_conv_reference(video, kernel):
    """float64 NumPy: every (b, t) image convolved, zero padding 1."""
    v = np.pad(video.astype(np.float64), [(0, 0), (0, 0), (1, 1), (1, 1), (0, 0)])
    H, Wd = video.shape[2], video.shape[3]
    out = 0
    for kx in range(3):
        for ky in range(3):
            out = out + np.einsum("btxyc,co->btxyo", v[:, :, kx:kx + H, ky:ky + Wd],
                                  kernel[kx, ky].astype(np.float64))
    return out


VIDEO = {"V": dsl.f32(b=2, t=3, x=6, y=5, ci=4), "K": dsl.f32(kx=3, ky=3, ci=4, co=2)}


def test_lifted_conv_is_one_comprehension_with_the_extra_dims_free(rng):
    g = dsl.to_graph(lambda V, K: conv2d(image=V, kernel=K), VIDEO,
                     layouts={"out": "b t x y co"})
    (op,) = g.ops      # no transpose, no reshape: the lifted dims are free loop dims
    assert isinstance(op, Comprehension) and op.reduce == "sum"
    assert set(op.type.dims) == {"b", "t", "x", "y", "co"}
    (read_v,) = [n for n in __import__("mlpack.spec.ir.expr", fromlist=["walk"]).walk(op.body)
                 if n.op == "read" and n.arg[0] == "V"]
    assert {d: repr(i) for d, i in zip(read_v.arg[1], read_v.args)}["b"] == "b"
    V, K = rand(rng, 2, 3, 6, 5, 4), rand(rng, 3, 3, 4, 2)
    assert_close(run_graph(g, {"V": V, "K": K})["out"], batched_conv_reference(V, K))


def test_lifting_over_a_time_dim_with_heads_too(rng):
    # lifted over three dims at once, one of them only on the kernel (heads of kernels)
    g = dsl.to_graph(lambda V, K: conv2d(image=V, kernel=K),
                     {"V": dsl.f32(b=2, t=3, x=6, y=5, ci=4),
                      "K": dsl.f32(h=2, kx=3, ky=3, ci=4, co=2)},
                     layouts={"out": "b t h x y co"})
    V, K = rand(rng, 2, 3, 6, 5, 4), rand(rng, 2, 3, 3, 4, 2)
    got = run_graph(g, {"V": V, "K": K})["out"]
    for h in range(2):
        assert_close(got[:, :, h], batched_conv_reference(V, K[h]))


def test_a_missing_declared_dim_is_named():
    with pytest.raises(dsl.DimError, match="conv2d: input image has no dim ci"):
        dsl.to_graph(lambda V, K: conv2d(image=V, kernel=K),
                     {"V": dsl.f32(x=6, y=5, c=4), "K": dsl.f32(kx=3, ky=3, ci=4, co=2)})


def test_lifting_over_a_dim_the_op_uses_is_refused():
    # the image's extra dim 'kx' would join the kernel's kx by name: refused, naming it
    with pytest.raises(dsl.DimError, match="dim kx of input image .* uses kx for kernel"):
        dsl.to_graph(lambda V, K: conv2d(image=V, kernel=K),
                     {"V": dsl.f32(kx=2, x=6, y=5, ci=4), "K": dsl.f32(kx=3, ky=3, ci=4, co=2)})
    # ... and one the op makes with dsl.dims; renaming the input's dim is the way out
    with pytest.raises(dsl.DimError, match="lifted over dim w of its inputs and names a dim w"):
        dsl.to_graph(lambda a: pairs(a=a), {"a": dsl.f32(w=2, i=6)})
    g = dsl.to_graph(lambda a: pairs(a=a.rename(w="batch")), {"a": dsl.f32(w=2, i=6)})
    assert set(g.types["out"].dims) == {"batch", "i"}


@dsl.op(a="i")
def pairs(a):
    """Sums of neighbours along i, through a window dim w of its own."""
    i, w = dsl.dim("i"), dsl.dim("w", size=2)
    return dsl.sum[w](a(i=i + w))
