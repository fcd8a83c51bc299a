"""Compile an ONNX model with mlpack from Python, look at its IR and run it.

    python examples/mlp_reference.py [MODEL.onnx]

Imports ``examples/models/mlp.onnx`` (a Gemm-Relu-Gemm perceptron with a dynamic ``batch``),
prints the IR mlpack compiled it to, runs the NumPy reference interpreter on a random batch and,
where ONNX Runtime is installed, checks the result against it. The same steps on the command
line: ``mlpack import MODEL --print-ir`` and ``mlpack run-reference MODEL --input x=x.npy -o out``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import mlpack

HERE = os.path.dirname(os.path.abspath(__file__))


def main(path: str) -> int:
    try:
        graph = mlpack.compile_onnx(path)  # ONNX -> verified, optimized IR graph
    except mlpack.Error as e:  # unsupported op, malformed file: one clear message
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(graph)  # the IR's text form

    batch = 3  # any size: the model's batch dim is the symbol $batch
    x = np.random.default_rng(0).standard_normal((batch, 16)).astype(np.float32)
    y = mlpack.run_reference(path, {"x": x})["y"]
    print(f"y = reference(x): shape {y.shape}, dtype {y.dtype}")
    print(np.array2string(y, precision=4))

    try:
        import onnxruntime as ort
    except ImportError:
        print("(onnxruntime is not installed: skipping the comparison)")
        return 0
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    err = float(np.max(np.abs(y - want)))
    print(f"max |mlpack - onnxruntime| = {err:.2e}")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "models", "mlp.onnx")))
