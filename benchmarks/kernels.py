"""Single-layer GFLOP/s: mlpack's gemm kernels against ONNX Runtime, one thread each.

``python -m benchmarks.kernels [--target x86_64-v4] [--threads 1] [--layers a,b] [--repeat 20]``

Each layer is a one-node ONNX model (a convolution with bias and relu, a matmul, the capsule
einsum) with seeded random weights, built into a container holding only the chosen cpu target,
opened with ``mlpack.load(path, threads=...)`` and timed against an ONNX Runtime session with
``intra_op_num_threads`` equal to the same count, on the same input. Prints the best time and
GFLOP/s (2 flops per multiply-add) of each, and checks the outputs agree.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .models import tests_module

F = TensorProto.FLOAT


def _model(nodes, inputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def conv(cin, cout, size, k, stride=1, batch=1, groups=1):
    """Conv(k x k, pad k//2, ``groups``) + bias + relu: (model, feeds, multiply-adds)."""
    rng = np.random.default_rng(0)
    per = cin // groups
    w = (rng.standard_normal((cout, per, k, k)) * np.sqrt(2 / (per * k * k))).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    p = k // 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[p] * 4, strides=[stride] * 2,
                              group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    x = rng.standard_normal((batch, cin, size, size)).astype(np.float32)
    out = (size + 2 * p - k) // stride + 1
    return _model(nodes, [("x", x.shape)], {"w": w, "b": b}), {"x": x}, batch * cout * out * out * per * k * k


def matmul(m, k, n):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", x.shape)], {"w": w}), \
        {"x": x}, m * k * n


def capsule(batch=8, size=16, caps=32):
    mod = tests_module("capsule")
    m = mod.einsum_model(batch, size, caps)
    p = mod.poses(batch, size, caps)
    x = mod.out_size(size)
    feeds = {m.graph.input[0].name: p}
    return m, feeds, batch * x * x * caps * 4 * 4 * 9 * caps * 4


LAYERS = {
    "conv3x3_64_56": lambda: conv(64, 64, 56, 3),
    "conv3x3_64to192_56": lambda: conv(64, 192, 56, 3),
    "conv1x1_576to128_14": lambda: conv(576, 128, 14, 1),
    "conv1x1_1024to128_7": lambda: conv(1024, 128, 7, 1),
    "conv1x1_256to64_56": lambda: conv(256, 64, 56, 1),
    "conv3x3_128_28_s2": lambda: conv(128, 128, 56, 3, stride=2),
    "conv3x3_512_7": lambda: conv(512, 512, 7, 3),
    "conv1x1_1024to2048_7": lambda: conv(1024, 2048, 7, 1),
    "conv1x1_1024to256_14": lambda: conv(1024, 256, 14, 1),
    "conv1x1_512to1024_28_s2": lambda: conv(512, 1024, 28, 1, stride=2),
    "conv3x3_256_14": lambda: conv(256, 256, 14, 3),
    "conv3x3_128_28": lambda: conv(128, 128, 28, 3),
    "conv3x3_16to64_55": lambda: conv(16, 64, 55, 3),
    "conv3x3_48to192_13": lambda: conv(48, 192, 13, 3),
    "conv3x3_96to128_14": lambda: conv(96, 128, 14, 3),
    "conv3x3_64to96_14": lambda: conv(64, 96, 14, 3),
    "conv3x3_64to256_13": lambda: conv(64, 256, 13, 3),
    "conv3x3_32to128_27": lambda: conv(32, 128, 27, 3),
    "conv3x3_256to384_12": lambda: conv(256, 384, 12, 3),
    "conv1x1_512to1000_13": lambda: conv(512, 1000, 13, 1),
    "conv3x3_3to64_224_s2": lambda: conv(3, 64, 224, 3, stride=2),
    "conv3x3_3to32_224_s2": lambda: conv(3, 32, 224, 3, stride=2),   # a mobile net's stem
    "conv7x7_3to64_224_s2": lambda: conv(3, 64, 224, 7, stride=2),
    "conv1x1_16to64_55": lambda: conv(16, 64, 55, 1),
    "conv1x1_64to256_56": lambda: conv(64, 256, 56, 1),
    "conv1x1_128to16_55": lambda: conv(128, 16, 55, 1),
    "conv1x1_440_7": lambda: conv(440, 440, 7, 1),           # RegNetY-400MF's last stage
    "conv1x1_32to48_112": lambda: conv(32, 48, 112, 1),      # its first block's
    "conv1x1_208_14": lambda: conv(208, 208, 14, 1),
    # grouped 3x3 convolutions of 4 and 8 channels a group (ResNeXt-50's first stages, RegNetY)
    "gconv3x3_128_g32_56": lambda: conv(128, 128, 56, 3, groups=32),
    "gconv3x3_256_g32_28": lambda: conv(256, 256, 28, 3, groups=32),
    "gconv3x3_104_g13_28": lambda: conv(104, 104, 28, 3, groups=13),
    "gconv3x3_208_g26_14": lambda: conv(208, 208, 14, 3, groups=26),
    "matmul_64x784x1024": lambda: matmul(64, 784, 1024),
    "matmul_49x192x1152": lambda: matmul(49, 192, 1152),   # a mobile net's last expansion, 7x7
    "fc_1x2048x1000": lambda: matmul(1, 2048, 1000),
    "capsule_einsum": lambda: capsule(),
}


def _time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)   # the least disturbed run: the machine may be shared


def main(argv=None) -> None:
    import onnxruntime as ort

    import mlpack
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="x86_64-v4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args(argv)
    print(f"{'layer':24s} {'mlpack ms':>10s} {'GFLOP/s':>8s} {'ort ms':>10s} {'GFLOP/s':>8s}  maxdiff")
    with tempfile.TemporaryDirectory() as tmp:
        layers = {name: LAYERS[name]() for name in a.layers.split(",")}
        for name, (model, _, _) in layers.items():
            mlpack.build(model, os.path.join(tmp, f"{name}.mlpack"), targets=[a.target])
        alive = []   # models stay open: the engine's memfd-dlopen may otherwise reuse a closed one
        for name, (model, feeds, macs) in layers.items():
            m = mlpack.load(os.path.join(tmp, f"{name}.mlpack"), threads=a.threads)
            alive.append(m)
            so = ort.SessionOptions()
            so.intra_op_num_threads = a.threads
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            ours = m.run(feeds)
            ours = ours[0] if isinstance(ours, (list, tuple)) else next(iter(ours.values()))
            theirs = sess.run(None, feeds)[0]
            diff = float(np.abs(np.asarray(ours) - theirs).max())
            t_m = _time(lambda m=m, feeds=feeds: m.run(feeds), a.repeat)
            t_o = _time(lambda sess=sess, feeds=feeds: sess.run(None, feeds), a.repeat)
            gf = 2 * macs / 1e9
            print(f"{name:24s} {t_m * 1e3:10.3f} {gf / t_m:8.1f} {t_o * 1e3:10.3f} {gf / t_o:8.1f}  {diff:.1e}")


if __name__ == "__main__":
    main()
