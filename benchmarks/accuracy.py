"""Where the fp32 tolerance's constants come from: every artifact's error against the float64
reference, as a multiple of ONNX Runtime's own.

    python -m benchmarks.accuracy                         # the benchmark set (benchmarks/models.py)
    python -m benchmarks.accuracy --model a.onnx --model b.onnx --json out.json

Each model is built with default targets and judging switched off (every artifact is measured,
none refused), then for every output and artifact this host runs it prints:

* ``base``: ONNX Runtime's max_error against the float64 reference (the fp32 floor);
* ``art/base``: the worst artifact's max_error and rel_l2 as multiples of ONNX Runtime's: what
  the tolerance's ``multiple`` must cover (a correct engine with another summation order);
* ``noopt/base``: the same for ONNX Runtime with graph optimizations off, a second correct
  engine (the issue's 5.9e-4 on resnet50 was the spread between these two);
* ``defect/base``: the ONNX Runtime outputs with their largest channel (the last dim) scaled by
  1 + 1e-3, a planted defect: what the tolerance must refuse.

With ``--precision fp16`` (or bf16) it measures that precision instead: each model is built
for this host's cpu target in that precision, judging off, and each artifact's worst
``max_error``, ``rel_l2`` and top-1 agreement are printed as they are (the 16-bit tolerances'
floors come from these: the weights' rounding, not ONNX Runtime's, sets them).

spec/SPEC.md ("Accuracy") records the numbers and the constants chosen from them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from mlpack.spec import accuracy


def _ort_noopt(path: str, feeds: list[dict], names: list[str]) -> list[dict]:
    import onnxruntime as ort

    from mlpack.packager.testvectors import _ort_feeds

    import onnx

    proto = onnx.load(path)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return [dict(zip(names, session.run(names, _ort_feeds(proto, f)))) for f in feeds]


def _defect(a: np.ndarray) -> np.ndarray:
    """``a`` with the channel (index of the last dim) that holds its largest value off by 1e-3."""
    out = a.astype(np.float64)
    if out.ndim == 0:
        return out * (1 + 1e-3)
    channel = np.unravel_index(int(np.argmax(np.abs(out))), out.shape)[-1]
    out[..., channel] *= 1 + 1e-3
    return out


def _ratio(x: float, base: float) -> float:
    return x / base if base > 0 else (0.0 if x == 0 else math.inf)


def measure_model(path: str, folder: str) -> list[dict]:
    """One row per output: the baseline's error and the ratios above."""
    from mlpack.packager import build as b
    from mlpack.runtime import load
    from mlpack.spec.errors import PortableFallbackWarning

    out = os.path.join(folder, Path(path).stem + ".mlpack")
    saved = accuracy.TOLERANCES["fp32"]
    accuracy.TOLERANCES["fp32"] = accuracy.Tolerance("fp32", 1e300, 1e300)  # measure only
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b.build(path, out)
    finally:
        accuracy.TOLERANCES["fp32"] = saved
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortableFallbackWarning)
        with load(out) as model:
            from mlpack.runtime.model import _cases

            triples = _cases(model._container, model._art)
            cases = [(ins, outs) for ins, outs, _ in triples]
            refs = [ref for _, _, ref in triples]
            names = [o.name for o in model.outputs]
            noopt = _ort_noopt(path, [c[0] for c in cases], names)
            results = {v.artifact.config["artifact"]["target"]: model.validate(v.artifact.index)
                       for v in model.verdicts if v.runnable}
    for name in names:
        if not accuracy.is_float(np.asarray(refs[0][name])):
            continue
        base, other, bad = accuracy.Errors(), accuracy.Errors(), accuracy.Errors()
        for (_, ort_out), r, n in zip(cases, refs, noopt):
            base = base.worst(accuracy.measure(ort_out[name], r[name]))
            other = other.worst(accuracy.measure(n[name], r[name]))
            bad = bad.worst(accuracy.measure(_defect(ort_out[name]), r[name]))
        row = {"model": Path(path).stem, "output": name, "base_max": base.max_error,
               "base_l2": base.rel_l2,
               "noopt": max(_ratio(other.max_error, base.max_error),
                            _ratio(other.rel_l2, base.rel_l2)),
               "defect_max": _ratio(bad.max_error, base.max_error),
               "defect_l2": _ratio(bad.rel_l2, base.rel_l2), "artifacts": {}}
        for target, result in results.items():
            o = next(c for c in result.outputs if c.name == name)
            row["artifacts"][target] = max(_ratio(o.max_error, base.max_error),
                                           _ratio(o.rel_l2, base.rel_l2))
        rows.append(row)
    os.unlink(out)
    return rows


def measure_precision(path: str, folder: str, precision: str, target: str | None = None) -> list[dict]:
    """One row: the cpu artifact of ``path`` for ``target`` (default: this host's) in
    ``precision``, measured, not judged."""
    from mlpack.backend import host_target
    from mlpack.packager import build as b

    out = os.path.join(folder, Path(path).stem + ".mlpack")
    saved = accuracy.TOLERANCES[precision]
    accuracy.TOLERANCES[precision] = accuracy.Tolerance(precision, 1e300, 1e300)  # measure only
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = b.build(path, out, targets=[target or host_target()], precisions=[precision])
    finally:
        accuracy.TOLERANCES[precision] = saved
    os.unlink(out)
    return [{"model": Path(path).stem, "target": a.target, "precision": precision,
             "max_error": a.max_error, "rel_l2": a.rel_l2, "top1": a.top1,
             "base_max": a.baseline_max_error}
            for a in report.artifacts if a.precision == precision and a.validated]


def _print_precision(rows: list[dict]) -> None:
    for r in rows:
        top1 = "-" if r["top1"] is None else f"{r['top1']:.0%}"
        print(f"{r['model'][:22]:22} {r['target']:10} {r['precision']:5} max {r['max_error']:9.2e} "
              f"rel L2 {r['rel_l2']:9.2e} top-1 {top1:>4}  (ONNX Runtime fp32 {r['base_max']:.2e})")


def _print(rows: list[dict]) -> None:
    head = f"{'model':22} {'output':14} {'base':>9} {'art/base':>9} {'worst':>10} {'noopt':>7} " \
           f"{'defect max':>11} {'defect L2':>10}"
    print(head)
    for r in rows:
        worst = max(r["artifacts"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        print(f"{r['model'][:22]:22} {r['output'][:14]:14} {r['base_max']:9.2e} {worst[1]:9.2f} "
              f"{worst[0]:>10} {r['noopt']:7.2f} {r['defect_max']:11.1f} {r['defect_l2']:10.1f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="an ONNX file (repeatable)")
    parser.add_argument("--bench", action="append", default=[],
                        help="a benchmark-set model by name (default: all, when no --model)")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--precision", default="fp32",
                        help="fp32 (the ratios above), or fp16/bf16: their errors as they are")
    parser.add_argument("--target", help="with --precision: the cpu target (default: this host's)")
    args = parser.parse_args(argv)
    paths = list(args.model)
    if not paths or args.bench:
        from benchmarks.models import NAMES, materialize

        paths += [str(materialize(n)) for n in (args.bench or NAMES)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for path in paths:
            if args.precision == "fp32":
                new = measure_model(path, folder)
                _print(new)
            else:
                new = measure_precision(path, folder, args.precision, args.target)
                _print_precision(new)
            rows += new
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
