"""fp32: the model as exported. The rewrite is the identity; artifacts are judged within
fp32's tolerance (spec/accuracy.py: 32 times ONNX Runtime's own error)."""

NAME = "fp32"
SUMMARY = "IEEE single precision, as the model was exported"
IMPLEMENTED = True
DEFAULT = True


def rewrite(graph):
    return graph
