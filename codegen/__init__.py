"""mlpack.codegen: the compiler (IR, ONNX frontend, passes, targets)."""
