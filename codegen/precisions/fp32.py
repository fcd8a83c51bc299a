"""fp32: the model as exported. The rewrite only evaluates maps of constants once (a quantized
model's dequantized weights: codegen/passes/fold_constants.py); artifacts are judged within
fp32's tolerance (spec/accuracy.py: 32 times ONNX Runtime's own error)."""

from mlpack.codegen.passes.fold_constants import fold_constant_maps

NAME = "fp32"
SUMMARY = "IEEE single precision, as the model was exported"
IMPLEMENTED = True
DEFAULT = True


def rewrite(graph):
    return fold_constant_maps(graph)
