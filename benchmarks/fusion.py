"""Would running an inverted residual block a band of rows at a time pay on this host? The most
it could save, measured: each of the block's kernels timed per row at the block's full height
and at a band of rows whose expanded tensor fits in L2.

    python -m benchmarks.fusion [--runs 2000] [--band-kib 256] [--target T]

An inverted residual block (MobileNetV2, MnasNet, EfficientNet) expands a narrow image with a
1x1 convolution (6x the channels), runs a 3x3 depthwise convolution over the wide one and
projects it back with another 1x1. Fused, the three would run a band of rows at a time, so
the wide tensors are written and read back while in L2 instead of going out to L3 or memory
and back: that is all fusion saves (the arithmetic is the same, plus the depthwise's halo
rows computed twice). So the kernels of the block, each alone, are timed per row of their
output in two builds of the same block: the block at its model's height, and the block at a
band's height (the rows whose expanded tensor takes ``--band-kib``), where every tensor stays
in L2 from one kernel to the next. The band's per-row times, scaled to the full height, are
what a fused block would cost at best; the report gives that beside the full block's time.

It runs on one thread: what fusion saves is each core's traffic to its L2, and at more threads
each kernel of a band is a dispatch of its own whose hand-over the band's few rows would be
charged (a fused block would share out bands, not kernels). On the Zen 5 guest of
benchmarks/RESULTS.md (1 MiB of L2 a core, 32 MiB of L3) a fused block would save 0.5-3.4% at
best: the expansions run at 72-81% of the FMA ceiling with their output going to L3 and no
faster in L2, and only the stride-2 depthwise convolution reading a 4.8 MB tensor is faster
per row from L2 (part of that is a band's edge rows, which skip the padded taps). So fusion
was not built (docs/decisions.md). On a host whose caches are small beside a block's wide
tensor, this is the measurement that says whether it would pay.

The blocks are MobileNetV2's shapes, batch 1, random weights, built for ``--target`` (default:
every default target, of which the engine runs the host's best); times are the engine's own per-dispatch profile (``MLPACK_PROFILE=1``, through
benchmarks/nodes.py), the median of ``--repeat`` processes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .nodes import mlpack_profile

# (name, height = width, channels in, expanded, out, depthwise stride): MobileNetV2's blocks
BLOCKS = [("112x16-96-24/2", 112, 16, 96, 24, 2),
          ("56x24-144-24", 56, 24, 144, 24, 1),
          ("28x32-192-32", 28, 32, 192, 32, 1),
          ("14x64-384-96", 14, 64, 384, 96, 1)]
KERNELS = ("expand", "depthwise", "project")


def block_model(height: int, width: int, cin: int, cexp: int, cout: int, stride: int) -> onnx.ModelProto:
    """expand (1x1 + ReLU6), depthwise 3x3 (+ ReLU6), project (1x1): outputs named after KERNELS."""
    rng = np.random.default_rng(0)

    def weights(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    inits = {"w1": weights(cexp, cin, 1, 1), "w2": weights(cexp, 1, 3, 3), "w3": weights(cout, cexp, 1, 1),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["e"]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["expand"]),
             helper.make_node("Conv", ["expand", "w2"], ["d"], group=cexp, pads=[1] * 4, strides=[stride] * 2),
             helper.make_node("Clip", ["d", "lo", "hi"], ["depthwise"]),
             helper.make_node("Conv", ["depthwise", "w3"], ["project"])]
    out_h, out_w = (height - 1) // stride + 1, (width - 1) // stride + 1
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, cin, height, width])],
                          [helper.make_tensor_value_info("project", TensorProto.FLOAT,
                                                         [1, cout, out_h, out_w])],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def band_rows(width: int, cexp: int, stride: int, band_kib: int) -> int:
    """Input rows of a band whose expanded tensor takes about ``band_kib`` KiB (a multiple of
    the stride, at least 2 strides)."""
    rows = max(2 * stride, (band_kib << 10) // (width * cexp * 4))
    return rows - rows % stride


def per_row_ms(onnx_path: Path, folder: Path, runs: int, rows: dict[str, int], repeat: int,
               targets: list[str] | None) -> dict[str, float]:
    """{kernel: ms per output row} of the block at ``onnx_path``, at one thread."""
    import mlpack

    container = folder / (onnx_path.stem + ".mlpack")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlpack.build(str(onnx_path), str(container), targets=targets, cases=1)
    model = onnx.load(str(onnx_path))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = folder / (onnx_path.stem + ".npz")
    np.savez(feeds, x=np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    samples = [mlpack_profile(str(container), str(feeds), 1, runs) for _ in range(repeat)]
    out = {}
    for k in KERNELS:
        times = [next((ms for name, ms in s.items() if name.startswith(k)), math.nan) for s in samples]
        out[k] = statistics.median(times) / rows[k]
    return out


def measure(blocks=BLOCKS, runs: int = 2000, band_kib: int = 256,
            repeat: int = 3, targets: list[str] | None = None) -> list[dict]:
    """Per block: its kernels' ms per row at full height and in a band, and the block's ms at
    full height against the band's per-row times scaled to it (what fusion would cost at best)."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, size, cin, cexp, cout, stride in blocks:
            full_rows, band = size, band_rows(size, cexp, stride, band_kib)
            row = {"block": name, "band_rows": band}
            for label, height in (("full", full_rows), ("band", band)):
                out_h = (height - 1) // stride + 1
                path = folder / f"{label}_{len(results)}.onnx"
                onnx.save(block_model(height, size, cin, cexp, cout, stride), str(path))
                row[label] = per_row_ms(path, folder, runs,
                                        {"expand": height, "depthwise": out_h, "project": out_h},
                                        repeat, targets)
            out_h = (size - 1) // stride + 1
            scale = {"expand": size, "depthwise": out_h, "project": out_h}
            row["full_ms"] = sum(row["full"][k] * scale[k] for k in KERNELS)
            row["fused_ms"] = sum(row["band"][k] * scale[k] for k in KERNELS)
            results.append(row)
    return results


def report(results: list[dict]) -> str:
    lines = ["inverted residual blocks at 1 thread: each kernel's us per output row, the block at "
             "full height and in a band that stays in L2; the block's ms, and at best fused",
             f"{'block':>16} {'band':>5}  " + "  ".join(f"{k + ' full/band':>22}" for k in KERNELS)
             + f"  {'block ms':>9} {'fused best':>10} {'saves':>6}"]
    for r in results:
        cells = "  ".join(f"{1e3 * r['full'][k]:>10.3f} /{1e3 * r['band'][k]:>10.3f}" for k in KERNELS)
        saves = 1 - r["fused_ms"] / r["full_ms"]
        lines.append(f"{r['block']:>16} {r['band_rows']:>5}  {cells}  {r['full_ms']:>9.3f} "
                     f"{r['fused_ms']:>10.3f} {saves:>6.1%}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="processes per build; the median is kept")
    ap.add_argument("--band-kib", type=int, default=256)
    ap.add_argument("--target", action="append", help="cpu target to build (repeatable)")
    args = ap.parse_args(argv)
    print(report(measure(runs=args.runs, band_kib=args.band_kib, repeat=args.repeat,
                         targets=args.target)))


if __name__ == "__main__":
    main()
