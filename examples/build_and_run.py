"""Build a container from an ONNX model, then load and run it as a deployment would.

    python examples/build_and_run.py [MODEL.onnx] [OUT.mlpack]

Builds ``examples/models/mlp.onnx`` into ``mlp.mlpack`` (in a temporary folder unless OUT is
given): the compiled model, its weights and reference test vectors from ONNX Runtime, validated
before the file is written. Then loads it with the runtime (which picks the best artifact this
host runs, and says why), runs a batch and checks the bundled vectors. The same on the command
line: ``mlpack build MODEL -o OUT``, ``mlpack inspect OUT --host``, ``mlpack validate OUT``,
``mlpack run OUT --input x=x.npy -o out/``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

import mlpack
from mlpack.packager.build import build

HERE = os.path.dirname(os.path.abspath(__file__))


def build_and_run(model_path: str, out: str) -> int:
    report = build(model_path, out, progress=lambda line: print(f"  {line}"))
    print(f"wrote {out}: {report.size} bytes, {report.cases} test cases ({report.reference})")

    # the runtime imports no compiler: this part is all a deployment host needs
    with warnings.catch_warnings():
        # only a portable artifact today: load says so with a PortableFallbackWarning
        warnings.simplefilter("ignore", mlpack.PortableFallbackWarning)
        model = mlpack.load(out)
    with model:
        print(f"inputs:  {', '.join(map(str, model.inputs))}")
        print(f"outputs: {', '.join(map(str, model.outputs))}")
        print(f"artifact: {model.artifact.device} {model.artifact.precision}: {model.artifact.reason}")
        info = model.inputs[0]
        shape = [3 if isinstance(s, str) else s for s in info.shape]  # a symbol: any size
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        y = model(**{info.name: x})
        for name, value in y.items():
            print(f"{name}: {value.dtype}{list(value.shape)}")
        result = model.validate()
    worst = max(o.max_abs_error for o in result.outputs)
    print(f"validate: {result.cases} cases, max abs error {worst:.2e}: {'ok' if result.ok else 'FAIL'}")
    return 0 if result.ok else 1


def main(argv: list[str]) -> int:
    model_path = argv[0] if argv else os.path.join(HERE, "models", "mlp.onnx")
    try:
        if len(argv) > 1:
            return build_and_run(model_path, argv[1])
        with tempfile.TemporaryDirectory() as tmp:
            return build_and_run(model_path, os.path.join(tmp, "mlp.mlpack"))
    except mlpack.Error as e:  # unsupported op, bad file, failed validation: one clear message
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
