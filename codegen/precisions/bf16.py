"""bf16: contraction weights stored as bfloat16 (8 bits of mantissa, f32's range), computed in
f32 (codegen/precisions/weights16.py says which constants). Judged by bf16's tolerance
(spec/accuracy.py), whose floor comes from the weights' rounding."""

from mlpack.codegen.precisions.weights16 import store_weights

NAME = "bf16"
SUMMARY = "weights in bfloat16 (half the bytes), arithmetic in f32"
IMPLEMENTED = True
DEFAULT = False


def rewrite(graph):
    return store_weights(graph, "bf16")
