"""Channels-last layouts (codegen/targets/cpu/layout.py) against ONNX Runtime.

Which image tensors are laid out channels last is checked on small models: a convolution chain
with a pooling and a residual add (all of them), local response normalization (its window along
the channel too), a concatenation of images along the channel (channels last with its parts,
at batch 1 and under a dynamic batch; kept in its order with a graph input for a part), a
depthwise convolution's input,
output and weights (channels last too, unless its input is a graph input), a grouped
convolution's input, output and readers (its group dim just before the channel), graph outputs
(their ports' layout), and ``MLPACK_DISABLE_PASSES=channels_last``. Each model
is compiled for x86_64-v2/v3/v4, run by the plan runner and compared with ONNX Runtime at the
fp32 tolerance (rtol 1e-4, atol 1e-5).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mlpack.codegen.compile import compile_onnx
from mlpack.codegen.targets.cpu import layout
from mlpack.spec.ir import expr as ex
from onnx import TensorProto as TP
from onnx import helper
from support import one_output_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/codegen/targets/plan_runner.py
from plan_runner import HOST_TARGETS, assert_matches_ort, rand

F = TP.FLOAT


def conv(x, y, prefix, cin, cout, k=3, group=1, seed=0):
    node = helper.make_node("Conv", [x, f"{prefix}w", f"{prefix}b"], [y], pads=[k // 2] * 4,
                            group=group)
    w = rand(cout, cin // group, k, k, seed=seed, scale=1 / np.sqrt(cin * k * k / group))
    return node, [(f"{prefix}w", w), (f"{prefix}b", rand(cout, seed=seed + 1, scale=0.1))]


def chain():
    """conv -> relu -> max pool -> conv (+ the pooled input: a residual) -> relu -> conv"""
    c1, w1 = conv("x", "c1", "a", 8, 16)
    c2, w2 = conv("p", "c2", "b", 16, 16, seed=2)
    c3, w3 = conv("r", "y", "c", 16, 8, k=1, seed=4)
    nodes = [c1, helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             c2, helper.make_node("Add", ["c2", "p"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             c3]
    return one_output_model(nodes, [("x", F, [1, 8, 20, 20])], w1 + w2 + w3), \
        {"x": rand(1, 8, 20, 20)}


def lrn():
    c1, w1 = conv("x", "c1", "a", 4, 12)
    c2, w2 = conv("n", "y", "b", 12, 6, seed=2)
    nodes = [c1, helper.make_node("LRN", ["c1"], ["n"], size=5, alpha=1e-2, beta=0.75, bias=1.0),
             c2]
    return one_output_model(nodes, [("x", F, [1, 4, 12, 12])], w1 + w2), {"x": rand(1, 4, 12, 12)}


def concat(with_input=False):
    """Two convolutions concatenated along the channel, then a convolution; ``with_input``:
    the second part is the graph input itself, which has its port's order."""
    c1, w1 = conv("x", "c1", "a", 8, 16)
    c2, w2 = conv("x", "c2", "b", 8, 16, k=1, seed=2)
    c3, w3 = conv("t", "y", "c", 24 if with_input else 32, 8, seed=4)
    parts = ["c1", "x"] if with_input else ["c1", "c2"]
    nodes = [c1] + ([] if with_input else [c2]) + [
        helper.make_node("Concat", parts, ["t"], axis=1), c3]
    weights = w1 + w3 if with_input else w1 + w2 + w3
    return one_output_model(nodes, [("x", F, [1, 8, 10, 10])], weights), \
        {"x": rand(1, 8, 10, 10)}


def concat_batched(head=False):
    """An Inception block's end over a dynamic batch: three convolutions (16, 12 and 5
    channels, two with a relu) concatenated, then a padded 3x3 max pooling and a 1x1
    convolution, or (``head``) a global average pooling. concat.py writes a concatenation in
    place only where every size is constant, so this one runs as a kernel (a copy)."""
    c1, w1 = conv("x", "c1", "a", 8, 16)
    c2, w2 = conv("x", "c2", "b", 8, 12, k=1, seed=2)
    c3, w3 = conv("x", "c3", "d", 8, 5, seed=6)
    nodes = [c1, c2, c3, helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Concat", ["r1", "c2", "r3"], ["t"], axis=1)]
    weights = w1 + w2 + w3
    if head:
        nodes.append(helper.make_node("GlobalAveragePool", ["t"], ["y"]))
    else:
        c4, w4 = conv("p", "y", "e", 33, 8, k=1, seed=4)
        nodes += [helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[3, 3], pads=[1] * 4),
                  c4]
        weights += w4
    return one_output_model(nodes, [("x", F, ["N", 8, 10, 10])], weights), \
        {"x": rand(2, 8, 10, 10)}


def depthwise(channels=16, k=3, stride=1):
    """1x1 conv -> depthwise conv -> global average pool (a squeeze-excitation's) and scale ->
    1x1 conv: an inverted residual block"""
    c = channels
    c1, w1 = conv("x", "c1", "a", 8, c, k=1)
    c2, w2 = conv("c1", "c2", "b", c, c, k=k, group=c, seed=2)
    c2.attribute.append(helper.make_attribute("strides", [stride, stride]))
    c3, w3 = conv("s", "y", "c", c, 8, k=1, seed=4)
    nodes = [c1, c2, helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Mul", ["c2", "g"], ["s"]), c3]
    return one_output_model(nodes, [("x", F, [1, 8, 14, 14])], w1 + w2 + w3), \
        {"x": rand(1, 8, 14, 14)}


def depthwise_input():
    """a depthwise convolution of the graph's input (its port's order: it stays NCHW)"""
    c2, w2 = conv("x", "c2", "b", 8, 8, group=8, seed=2)
    c3, w3 = conv("c2", "y", "c", 8, 4, k=1, seed=4)
    return one_output_model([c2, c3], [("x", F, [1, 8, 14, 14])], w2 + w3), \
        {"x": rand(1, 8, 14, 14)}


def depthwise_topk():
    """an inverted residual block whose output a procedure (TopK over the channels) reads"""
    m, feeds = depthwise()
    g = m.graph
    g.node[-1].output[0] = "z"
    g.node.append(helper.make_node("TopK", ["z", "k"], ["y", "i"], axis=1))
    g.initializer.append(helper.make_tensor("k", TP.INT64, [1], [3]))
    return m, feeds


def grouped(per_group=8, groups=4, stride=1):
    """1x1 conv -> grouped 3x3 conv -> relu -> a squeeze-excitation's pooling and scale ->
    1x1 conv: a RegNet or ResNeXt block (``per_group`` channels in each of ``groups``)"""
    c = per_group * groups
    c1, w1 = conv("x", "c1", "a", 8, c, k=1)
    c2, w2 = conv("c1", "c2", "b", c, c, group=groups, seed=2)
    c2.attribute.append(helper.make_attribute("strides", [stride, stride]))
    c3, w3 = conv("s", "y", "c", c, 8, k=1, seed=4)
    nodes = [c1, c2, helper.make_node("Relu", ["c2"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Mul", ["r", "g"], ["s"]), c3]
    return one_output_model(nodes, [("x", F, [1, 8, 14, 14])], w1 + w2 + w3), \
        {"x": rand(1, 8, 14, 14)}


def padded_pools():
    """conv -> relu -> 3x3 max pool (padded, stride 1) -> 3x3 max pool (stride 2, ceil mode:
    its last window passes the edge) -> conv: channels-last windows whose points fall outside
    their input (read as -inf under a select, the whole vector at once)"""
    c1, w1 = conv("x", "c1", "a", 8, 24)
    c2, w2 = conv("q", "y", "b", 24, 8, k=1, seed=2)
    nodes = [c1, helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("MaxPool", ["p"], ["q"], kernel_shape=[3, 3], strides=[2, 2],
                              ceil_mode=1), c2]
    return one_output_model(nodes, [("x", F, [1, 8, 12, 12])], w1 + w2), {"x": rand(1, 8, 12, 12)}


def pooled_head():
    """conv -> relu -> 1x1 conv -> relu -> global average pool: a classifier's head, the last
    convolution's bias and relu inlined into the pooling's sum"""
    c1, w1 = conv("x", "c1", "a", 8, 16)
    c2, w2 = conv("r1", "c2", "b", 16, 24, k=1, seed=2)
    nodes = [c1, helper.make_node("Relu", ["c1"], ["r1"]), c2,
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["y"])]
    return one_output_model(nodes, [("x", F, [1, 8, 10, 10])], w1 + w2), {"x": rand(1, 8, 10, 10)}


def convnext_block(c=24):
    """1x1 conv -> 7x7 depthwise conv -> LayerNorm over the channels (NCHW -> NHWC) -> a linear
    layer -> GELU -> a linear layer back (NHWC -> NCHW) -> + the block's input -> 1x1 conv:
    ConvNeXt's block, its statistics a reduction over the channel alone"""
    c1, w1 = conv("x", "c1", "a", 8, c, k=1)
    c2, w2 = conv("c1", "c2", "b", c, c, k=7, group=c, seed=2)
    c3, w3 = conv("s", "y", "c", c, 8, k=1, seed=4)
    nodes = [c1, c2, helper.make_node("Transpose", ["c2"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "up"], ["u"]),
             helper.make_node("Gelu", ["u"], ["e"], domain=""),
             helper.make_node("MatMul", ["e", "down"], ["d"]),
             helper.make_node("Transpose", ["d"], ["dt"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["dt", "c1"], ["s"]), c3]
    weights = w1 + w2 + w3 + [("g", rand(c, seed=5, scale=1.0)),
                              ("beta", rand(c, seed=6, scale=0.1)),
                              ("up", rand(c, 4 * c, seed=7, scale=1 / np.sqrt(c))),
                              ("down", rand(4 * c, c, seed=8, scale=1 / np.sqrt(4 * c)))]
    return one_output_model(nodes, [("x", F, [1, 8, 12, 12])], weights, opset=20), \
        {"x": rand(1, 8, 12, 12)}


MODELS = {"chain": chain, "lrn": lrn, "concat": concat,
          "concat_with_input": lambda: concat(with_input=True), "concat_batched": concat_batched,
          "concat_batched_head": lambda: concat_batched(head=True), "depthwise": depthwise,
          "depthwise_wide_strided": lambda: depthwise(40, k=5, stride=2),
          "depthwise_input": depthwise_input, "depthwise_topk": depthwise_topk,
          "grouped": grouped, "grouped_narrow_strided": lambda: grouped(4, 6, stride=2),
          "padded_pools": padded_pools, "convnext_block": convnext_block,
          "pooled_head": pooled_head}


def last_dims(g) -> dict[str, str]:
    """Each op's output -> the dim its type (the plan's layout) puts last."""
    return {op.out: list(op.type.dims)[-1] for op in g.ops}


def test_a_convolution_chain_is_laid_out_channels_last():
    g = compile_onnx(chain()[0])
    before = last_dims(g)
    after = last_dims(layout.channels_last(g))
    changed = {t for t in before if before[t] != after[t]}
    # two convolutions, the pooling, the residual add; not the output (its port's layout) nor
    # the last convolution, which only the output's bias map reads
    assert len(changed) == 4 and "y" not in changed, (before, after)
    assert [op.out for op in g.ops if op.out not in changed][-2:] == [g.ops[-2].out, "y"]
    assert last_dims(g) == before   # the shared graph is left alone


def test_a_window_along_the_channel_follows_it():
    g = compile_onnx(lrn()[0])
    before, after = last_dims(g), last_dims(layout.channels_last(g))
    sq = [t for t in before if t.endswith("_sq")]
    assert sq and all(after[t] != before[t] for t in sq)   # the sum of squares walks c too


@pytest.mark.parametrize("name", ["concat_with_input", "depthwise_input"])
def test_concatenated_tensors_and_a_depthwise_input_port_keep_their_order(name):
    """A concatenation with a part that cannot go channels last (a graph input: its port's
    order) keeps its order and its parts', written in place (concat.py)."""
    g = compile_onnx(MODELS[name]()[0])
    kept = layout.channels_last(g)
    producers = {op.out: op for op in g.ops}
    for op in kept.ops:
        if name == "concat_with_input" or op.out != "y":
            assert list(op.type.dims) == list(producers[op.out].type.dims), op.out


@pytest.mark.parametrize("batch", ["dynamic", 1])
def test_a_concatenation_of_images_goes_channels_last_with_its_parts(batch):
    """The parts, the concatenation (a copy kernel now, not written in place) and the pooling
    that reads it lay their channels last (GoogLeNet's and SqueezeNet's blocks: their
    convolutions store whole vectors of channels, their poolings take one per window point),
    at batch 1 and under a dynamic batch alike."""
    m = concat_batched()[0] if batch == "dynamic" else concat()[0]
    g = compile_onnx(m)
    before, after = last_dims(g), last_dims(layout.channels_last(g))
    cat = next(op for op in g.ops if op.out == "t")
    assert before["t"] != after["t"] == list(cat.type.dims)[1]   # the concatenated channel
    moved = {t for t in before if before[t] != after[t]}
    parts = [t for t in before if t.startswith(("c1", "c2", "c3", "r1", "r3"))]
    assert parts and set(parts) <= moved and "y" not in moved, (before, after)
    assert batch == 1 or "p" in moved


def test_a_depthwise_convolution_goes_channels_last_with_its_input_and_weights():
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.depthwise import Direct
    from mlpack.codegen.targets.cpu.target import get_target

    g = compile_onnx(depthwise()[0])
    before, moved = last_dims(g), layout.channels_last(g)
    after = last_dims(moved)
    grouped = [t for t in before if t.endswith("_grouped")]
    assert grouped and all(after[t] != before[t] for t in grouped)
    # its input (the first convolution's output) too, and the weights: channels last
    assert after[g.ops[0].out] != before[g.ops[0].out]
    # (a copy of the weights, made from them when the engine opens the artifact: derived.py)
    [w] = [c for c in moved.constants.values() if c.name not in g.constants]
    source = g.constants[w.name.removesuffix("#last")]
    assert w.layout[-1] == "d0" and source.layout[0] == "d0"
    np.testing.assert_array_equal(w.data, np.moveaxis(source.data, 0, -1))
    # and its kernel runs channels last: a vector of weights per window point
    _, kernels, *_ = schedule_kernels(g, get_target("x86_64-v4"))
    [k] = [k for k in kernels if isinstance(k.gemm, Direct)]
    assert k.gemm.w_vector and k.gemm.step == 1


def test_a_reduction_over_the_channel_alone_reads_it_channels_last():
    """A LayerNorm over the channels (ConvNeXt's) sums along the unit-stride dim of a
    channels-last tensor: the depthwise convolution it reads, and that one's input, go channels
    last (NCHW, ConvNeXt-tiny's depthwise convolutions ran at a third of ONNX Runtime's speed,
    its LayerNorms read each pixel's channels a plane apart)."""
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.depthwise import Direct
    from mlpack.codegen.targets.cpu.target import get_target

    g = compile_onnx(convnext_block()[0])
    before, after = last_dims(g), last_dims(layout.channels_last(g))
    dw = next(t for t in before if t.endswith("_grouped"))
    assert after[dw] != before[dw] and after[g.ops[0].out] != before[g.ops[0].out]
    _, kernels, bufs, *_ = schedule_kernels(g, get_target("x86_64-v3"))
    [k] = [k for k in kernels if isinstance(k.gemm, Direct)]
    assert k.gemm.w_vector and k.gemm.step == 1
    # the statistics sum a pixel's channels at unit stride (innermost), one pixel per row
    stats = [k for k in kernels if k.reduce == "sum" and k.strategy != "gemm"]
    assert stats and all(k.strategy == "inner" for k in stats), [(k.name, k.strategy)
                                                                  for k in stats]


def test_a_global_pooling_with_a_bias_inlined_reads_channels_last():
    """The pooling's sum reads the bias (a constant) at its own channel: not the weights of a
    grouped contraction, which keep their input's order (the last stage of every ResNet,
    MobileNet and RegNet had stayed NCHW for the pooling at its end)."""
    g = compile_onnx(pooled_head()[0])
    pool = g.ops[-2]   # (then the division by the pixel count, a map)
    assert pool.reduce == "sum" and set(pool.rdims) == {"kh", "kw"}, pool
    assert any(r.arg[0] in g.constants for r in ex.reads(pool.body))   # the bias, inlined
    before, after = last_dims(g), last_dims(layout.channels_last(g))
    [conv_out] = [r.arg[0] for r in ex.reads(pool.body) if r.arg[0] not in g.constants]
    assert after[conv_out] != before[conv_out]


def test_a_grouped_convolution_goes_channels_last_with_its_groups_before_the_channel():
    from mlpack.codegen.targets.cpu.compile import schedule_kernels
    from mlpack.codegen.targets.cpu.target import get_target

    g = compile_onnx(grouped()[0])
    # (unflatten has split the channel of the bias, the relu and the scale into the groups'
    # two dims, so they read the convolution at the identity index)
    conv_out = next(op for op in g.ops if op.out.endswith("_grouped"))
    split = [op for op in g.ops if len(op.type.dims) == 5]
    assert len(split) >= 3, [op.out for op in g.ops]
    moved = {op.out: [d for d, s in op.type.dims.items() if not (s.is_const and s.value == 1)]
             for op in layout.channels_last(g).ops}
    for op in split:   # (memory order: dims of size 1 aside, so the pooling's too)
        grp, ch = list(op.type.dims)[1:3]
        assert moved[op.out][-2:] == [grp, ch], (op.out, moved[op.out])
    assert moved[g.ops[0].out][-1] == list(g.ops[0].type.dims)[1]   # its input as well
    # the bias and relu run in the convolution's epilogue, on vectors of whole groups
    # (groupwise.py: one group of 8 channels a vector on AVX2)
    from mlpack.codegen.targets.cpu.groupwise import Grouped
    _, kernels, *_ = schedule_kernels(g, get_target("x86_64-v3"))
    [k] = [k for k in kernels if conv_out.out in k.fused and k.strategy == "gemm"]
    assert len(k.fused) == 2 and isinstance(k.gemm, Grouped) and (k.gemm.c, k.gemm.vl) == (8, 8)


def test_debug_says_why_a_tensor_keeps_its_order(monkeypatch, capsys):
    """MLPACK_DEBUG=2 names, for each image tensor left in its type's order, what kept it: a
    rule that keeps a model NCHW is the first thing to look at when it runs slow (ConvNeXt's
    LayerNorm and a classifier's pooling were found so)."""
    monkeypatch.setenv("MLPACK_DEBUG", "2")
    g = compile_onnx(concat(with_input=True)[0])
    capsys.readouterr()
    moved = last_dims(layout.channels_last(g))
    said = dict(line.split(": ", 2)[1:] for line in capsys.readouterr().err.splitlines()
                if line.startswith("[mlpack] channels_last: "))
    kept = {t.removesuffix(" keeps its order"): why for t, why in said.items()}
    assert kept and all(moved[t] == last_dims(g)[t] for t in kept)
    parts = [op.out for op in g.ops if op.out.startswith("c1")]
    assert parts and all(kept[t].startswith("read by a concatenation") for t in parts)
    # a reader whose unit-stride loop is not the channel: a mean over the rows alone
    c1, w1 = conv("x", "c1", "a", 8, 16)
    nodes = [c1, helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=[2])]
    m = one_output_model(nodes, [("x", F, [1, 8, 6, 6])], w1)
    capsys.readouterr()
    layout.channels_last(compile_onnx(m))
    err = capsys.readouterr().err
    assert "does not read its channel" in err, err


def test_switched_off(monkeypatch):
    from mlpack.codegen.passes.pipeline import run_passes
    from mlpack.codegen.targets.cpu.compile import _Rewritten, target_passes

    g = compile_onnx(chain()[0])
    [channels_last] = [p for p in target_passes(_Rewritten()) if p[0] == "channels_last"]
    assert run_passes(g, [channels_last]) is not g
    monkeypatch.setenv("MLPACK_DISABLE_PASSES", "channels_last")
    assert run_passes(g, [channels_last]) is g


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_matches_ort(name, target):
    m, feeds = MODELS[name]()
    assert_matches_ort(m, feeds, target)
