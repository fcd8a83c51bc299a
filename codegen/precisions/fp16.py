"""fp16: contraction weights stored as IEEE half precision (11 bits of mantissa, range +-65504),
computed in f32 (codegen/precisions/weights16.py says which constants). Judged by fp16's
tolerance (spec/accuracy.py), whose floor comes from the weights' rounding."""

from mlpack.codegen.precisions.weights16 import store_weights

NAME = "fp16"
SUMMARY = "weights in IEEE half precision (half the bytes), arithmetic in f32"
IMPLEMENTED = True
DEFAULT = False


def rewrite(graph):
    return store_weights(graph, "f16")
