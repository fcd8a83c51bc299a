"""Per-run overhead: what a run costs beyond its kernels, mlpack's Python API next to ONNX
Runtime's, on a model whose kernels take next to no time.

``python -m benchmarks.overhead [--elements 4] [--threads 1]``

The model is one Relu on ``[1, elements]`` floats, built for this host's cpu targets and
opened with ``mlpack.load``; ONNX Runtime runs the same model (packager/bench.py's session).
Both are timed alternating (``time_alternating``), and the median of each is the fixed cost
a run of any model pays: checking the feeds, handing the tensors to the engine, binding the
shapes, waking the threads, allocating the outputs. The engine's own part (one C call with
prepared arguments) is timed too.
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile

import numpy as np
from onnx import TensorProto, helper


def relu_model(elements: int):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, elements])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, elements])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "overhead", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _engine_call(model, feeds):
    """A function making the one C call (mlpack_run_into) a run of ``model`` makes, with its
    arguments prepared once: the engine's share of a run."""
    native = model._executor.engine
    native.run(feeds)   # builds the call's structs for this signature
    call = next(iter(native._calls.values()))
    outs = [np.empty(shape, dt) for shape, dt in call.out_shapes]
    for t, a in zip(call.ins, feeds.values()):
        t.data, t.nbytes = a.ctypes.data, a.nbytes
    for t, a in zip(call.outs, outs):
        t.data, t.nbytes = a.ctypes.data, a.nbytes
    err = ctypes.c_void_p()
    lib, m = native._lib, native._m
    return lambda: lib.mlpack_run_into(m, call.ins, len(feeds), call.outs, call.n_out,
                                       ctypes.byref(err))


def measure(elements: int = 4, threads: int = 1, seconds: float = 2.0) -> dict[str, float]:
    """Median microseconds per run: ``mlpack`` (Model.run), ``engine`` (its C call alone) and
    ``ONNX Runtime`` (InferenceSession.run); the outputs are checked equal first."""
    import mlpack
    from mlpack.packager.bench import ort_session, time_alternating

    model = relu_model(elements)
    feeds = {"x": np.linspace(-1, 1, elements, dtype=np.float32).reshape(1, elements)}
    sess = ort_session(model.SerializeToString(), threads)
    with tempfile.TemporaryDirectory() as tmp:
        mlpack.build(model, f"{tmp}/relu.mlpack")
        with mlpack.load(f"{tmp}/relu.mlpack", threads=threads) as m:
            if m.artifact.device == "portable":
                raise RuntimeError("no native artifact runs here: the overhead measured would "
                                   "be the NumPy interpreter's")
            got, want = m.run(feeds)["y"], sess.run(None, feeds)[0]
            if not np.array_equal(got, want):
                raise RuntimeError(f"mlpack and ONNX Runtime disagree on Relu: {got} vs {want}")
            timings, _ = time_alternating({
                "mlpack": lambda: m.run(feeds), "engine": _engine_call(m, feeds),
                "ONNX Runtime": lambda: sess.run(None, feeds)},
                repeat=1000, min_seconds=seconds, max_seconds=4 * seconds)
    return {name: t.median_s * 1e6 for name, t in timings.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4, help="floats the Relu runs on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0, help="time per runtime, at least")
    args = ap.parse_args(argv)
    us = measure(args.elements, args.threads, args.seconds)
    for name, v in us.items():
        print(f"{name:14s} {v:8.1f} us per run (median)")
    print(f"ONNX Runtime / mlpack: {us['ONNX Runtime'] / us['mlpack']:.2f}")


if __name__ == "__main__":
    main()
