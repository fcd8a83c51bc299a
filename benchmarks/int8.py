"""int8 against fp32 and against ONNX Runtime's own int8, side by side in one process.

    python -m benchmarks.int8                                    # resnet50, 1 and 2 threads
    python -m benchmarks.int8 --model squeezenet --agreement 200
    python -m benchmarks.int8 --onnx path/to/model.onnx --threads 1
    python -m benchmarks.int8 --format qoperator --agreement 0   # ORT's QLinearConv model

Per model: mlpack builds fp32 and int8 for this host (int8 calibrated, as ``mlpack build``
does by default, on CALIBRATION_CASES seeded random input sets); ONNX Runtime quantizes the
same model with ``quantize_static`` (QDQ, weights per channel, u8 activations and s8 weights as
its x86 kernels prefer, MinMax calibration) on the very same input sets. The four runtimes are
timed alternating (packager/bench.py's ``time_alternating``) at each thread count on one input,
then the top-1 agreement of each int8 runtime with fp32 (mlpack's fp32 artifact's argmax; the
build checked it against the float64 reference) is counted over ``--agreement`` fresh random
inputs (the bar asks for 99% over 1,000).

"ORT int8 exact" is ONNX Runtime on its int8 model with ``session.x64quantprecision``: on x86
CPUs without VNNI its default u8 x s8 kernels add pairs of products in saturating 16 bits
(``vpmaddubsw``), so they compute other numbers than the model's; with the option they compute
the model's, as mlpack's do on every CPU (on VNNI CPUs the two are one kernel).

A fifth runtime is mlpack running ONNX Runtime's own int8 model: ``mlpack build`` of the QDQ
file (int8 by default, its own integers on the same kernels, codegen/precisions/qdq.py), timed
in the same rounds, with its top-1 agreement with ONNX Runtime's int8 on the same model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # python benchmarks/int8.py: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from mlpack.packager.testvectors import EXACT_INT8   # noqa: E402  (after the path fix above)


def _int8_targets() -> list[str]:
    """This host's fp32 target and, where it has VNNI, the int8 one."""
    from mlpack.backend import host_target
    from mlpack.runtime.host import detect_host

    targets = [host_target()]
    if targets[0] == "x86_64-v4" and "avx512vnni" in detect_host().cpu_features:
        targets.append("x86_64-v4-vnni")
    return targets


class _Reader:
    """onnxruntime.quantization's calibration data reader over a list of input dicts."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def ort_int8(model_path: str, feeds: list[dict], out_path: str, fmt: str = "qdq") -> str:
    """ONNX Runtime's static int8 model of ``model_path``, calibrated on ``feeds`` (a model of
    an opset before 13 is converted to 13 first: per-channel DequantizeLinear needs it), in QDQ
    format or (``fmt="qoperator"``) as QLinearConv and QLinearMatMul ops (only convolutions and
    matmuls quantized: the QLinear forms of the others, QLinearAdd..., are contrib ops)."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    proto = onnx.load(model_path)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 13:
        model_path = out_path + ".opset13.onnx"
        onnx.save(version_converter.convert_version(proto, 13), model_path)
    # the pre-processing ONNX Runtime asks for (shape inference, its graph optimizations:
    # batch norms folded into the convolutions), so that its quantizer sees what it runs
    prepared = out_path + ".pre.onnx"
    quant_pre_process(model_path, prepared)
    model_path = prepared
    extra = {} if fmt == "qdq" else {"op_types_to_quantize": ["Conv", "MatMul"]}
    quantize_static(model_path, out_path, _Reader(feeds),
                    quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, **extra)
    return out_path


def measure(model_path: str, threads: list[int], agreement: int, folder: str,
            max_seconds: float = 20.0, fmt: str = "qdq") -> dict:
    import onnx

    from mlpack.codegen.compile import compile_onnx
    from mlpack.packager import bench, build as b
    from mlpack.packager import testvectors as tv

    graph = compile_onnx(onnx.load(model_path))
    calib = b.calibration_inputs(graph, None, None, 0)
    container = os.path.join(folder, "model.mlpack")
    targets = _int8_targets()
    b.build(model_path, container, targets=targets, precisions=["fp32", "int8"])
    quant = ort_int8(model_path, calib, os.path.join(folder, "model.int8.onnx"), fmt)
    from_qdq = os.path.join(folder, "qdq.mlpack")
    b.build(quant, from_qdq, targets=targets)
    feeds = tv.random_cases(graph, dims=None, cases=1, seed=7)[0]
    proto = onnx.load(model_path)
    out_name = graph.outputs[0].name
    rows = []
    for n in threads:
        sessions = {"ort fp32": bench.ort_session(model_path, n),
                    "ort int8": bench.ort_session(quant, n),
                    "ort int8 exact": bench.ort_session(quant, n, {EXACT_INT8: "1"})}
        models = {p: bench.load_mlpack(container, n, p) for p in ("fp32", "int8")}
        models["qdq"] = bench.load_mlpack(from_qdq, n, "int8")
        ort_feeds = bench._ort_feeds(proto, feeds)
        fns = {"mlpack fp32": lambda: models["fp32"].run(feeds),
               "mlpack int8": lambda: models["int8"].run(feeds),
               "mlpack qdq": lambda: models["qdq"].run(feeds),
               "ort fp32": lambda: sessions["ort fp32"].run(None, ort_feeds),
               "ort int8": lambda: sessions["ort int8"].run(None, ort_feeds),
               "ort int8 exact": lambda: sessions["ort int8 exact"].run(None, ort_feeds)}
        timings, _ = bench.time_alternating(fns, max_seconds=max_seconds)
        ms = {k: t.median_s * 1e3 for k, t in timings.items()}
        rows.append({"threads": n, "ms": ms,
                     "int8_vs_fp32": ms["mlpack fp32"] / ms["mlpack int8"],
                     "ort_int8_vs_mlpack_int8": ms["ort int8"] / ms["mlpack int8"],
                     "ort_int8_vs_mlpack_qdq": ms["ort int8"] / ms["mlpack qdq"],
                     "ort_exact_vs_mlpack_int8": ms["ort int8 exact"] / ms["mlpack int8"]})
    agree = {"mlpack int8": 0, "ort int8": 0, "mlpack qdq": 0, "mlpack qdq vs ort int8": 0}
    if agreement:
        most = max(threads or [os.cpu_count() or 1])
        model = {p: bench.load_mlpack(container, most, p) for p in ("fp32", "int8")}
        model["qdq"] = bench.load_mlpack(from_qdq, most, "int8")
        session = bench.ort_session(quant, most)
        for i in range(agreement):
            case = tv.random_cases(graph, dims=None, cases=1, seed=10_000 + i)[0]
            want = int(np.argmax(model["fp32"].run(case)[out_name]))
            agree["mlpack int8"] += int(np.argmax(model["int8"].run(case)[out_name])) == want
            got = int(np.argmax(session.run(None, bench._ort_feeds(proto, case))[0]))
            agree["ort int8"] += got == want
            qdq = int(np.argmax(model["qdq"].run(case)[out_name]))
            agree["mlpack qdq"] += qdq == want
            agree["mlpack qdq vs ort int8"] += qdq == got
    return {"model": Path(model_path).stem, "targets": targets, "format": fmt, "rows": rows,
            "agreement_inputs": agreement,
            "top1": {k: v / agreement for k, v in agree.items()} if agreement else {}}


def _print(doc: dict) -> None:
    print(f"{doc['model']} ({', '.join(doc['targets'])}; ONNX Runtime's int8 model: "
          f"{doc['format']}, 'mlpack qdq' runs it)")
    print("threads  mlpack fp32  mlpack int8  mlpack qdq  ORT fp32  ORT int8  ORT int8 exact  "
          "fp32/int8  ORT int8/mlpack int8  ORT int8/mlpack qdq  ORT exact/mlpack int8")
    for r in doc["rows"]:
        ms = r["ms"]
        print(f"{r['threads']:>7}  {ms['mlpack fp32']:>8.1f} ms  {ms['mlpack int8']:>8.1f} ms  "
              f"{ms['mlpack qdq']:>7.1f} ms  {ms['ort fp32']:>5.1f} ms  {ms['ort int8']:>5.1f} ms  "
              f"{ms['ort int8 exact']:>11.1f} ms  {r['int8_vs_fp32']:>8.2f}x  "
              f"{r['ort_int8_vs_mlpack_int8']:>19.2f}x  {r['ort_int8_vs_mlpack_qdq']:>17.2f}x  "
              f"{r['ort_exact_vs_mlpack_int8']:>19.2f}x")
    if doc["top1"]:
        print(f"top-1 agreement with mlpack fp32 over {doc['agreement_inputs']} "
              "random inputs (the last: mlpack on ONNX Runtime's int8 model against ONNX Runtime "
              "on it): " + ", ".join(f"{k} {v:.1%}" for k, v in doc["top1"].items()))


def main(argv: list[str] | None = None) -> int:
    from benchmarks import models as bench_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", help="a model of benchmarks/models.py")
    parser.add_argument("--onnx", help="an ONNX file instead of --model")
    parser.add_argument("--threads", default="1,2",
                        help="thread counts to time at (\"\": time nothing, count agreement only, "
                             "which needs no timing lock)")
    parser.add_argument("--agreement", type=int, default=1000,
                        help="random inputs to count top-1 agreement on (0: skip)")
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--format", choices=("qdq", "qoperator"), default="qdq",
                        help="ONNX Runtime's int8 model: QDQ, or QLinearConv/QLinearMatMul ops")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    path = args.onnx or str(bench_models.materialize(args.model))
    with tempfile.TemporaryDirectory() as folder:
        doc = measure(path, [int(t) for t in args.threads.split(",") if t], args.agreement,
                      folder, args.max_seconds, args.format)
    _print(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
