"""The GPU suite of the cuda target (issue 19), skipped without an NVIDIA GPU.

Every light model, the MLP, the BERT block, both capsule forms, an LSTM and a TopK model are
built for the cuda level this GPU runs, in fp32 and fp16; the build validates each cuda artifact
on the GPU against the float64 reference (with its precision's tolerance), so a build that
returns is the check. benchmarks/gpu_session.sh runs this suite and ONNX's node suite through
cuda on a GPU machine and keeps their output for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mlpack.packager.build import build
from mlpack.runtime.host import probe_cuda

SM, WHY = probe_cuda()
pytestmark = pytest.mark.skipif(SM is None, reason=f"no CUDA GPU: {WHY}")
LEVEL = "cuda-sm90" if (SM or 0) >= 90 else "cuda-sm80"


def _lstm():
    rng = np.random.default_rng(0)
    hidden, inp = 16, 8
    inits = [helper.make_tensor(n, TP.FLOAT, s, (rng.standard_normal(int(np.prod(s))) * 0.3).tolist())
             for n, s in (("W", [1, 4 * hidden, inp]), ("R", [1, 4 * hidden, hidden]),
                          ("B", [1, 8 * hidden]))]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=hidden)
    g = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TP.FLOAT, [12, "batch", inp])],
                          [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y", "yh", "yc")],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _topk():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    g = helper.make_graph([node], "topk", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 50])],
                          [helper.make_tensor_value_info("v", TP.FLOAT, None),
                           helper.make_tensor_value_info("i", TP.INT64, None)],
                          [helper.make_tensor("k", TP.INT64, [1], [5])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _model(name: str):
    from benchmarks import models

    if name == "lstm":
        return _lstm()
    if name == "topk":
        return _topk()
    return onnx.load(str(models.materialize(name)))


NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512", "mlp", "bert_block", "capsule_einsum",
         "capsule_framework", "lstm", "topk"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_validates_on_the_gpu(name, precision, tmp_path):
    src = tmp_path / f"{name}.onnx"
    onnx.save(_model(name), str(src))
    report = build(str(src), str(tmp_path / f"{name}.mlpack"), targets=[LEVEL], precisions=[precision])
    cuda = [a for a in report.artifacts if a.device == "cuda"]
    assert cuda and all(a.validated for a in cuda), [(a.target, a.reason) for a in cuda]
    print(f"{name} {precision} {LEVEL}: max_error {cuda[0].max_error:.3g} "
          f"(ONNX Runtime {cuda[0].baseline_max_error:.3g}), {cuda[0].seconds}")
