"""Where a model's time goes, node by node: mlpack's dispatches beside ONNX Runtime's nodes.

    python -m benchmarks.nodes MODEL.onnx MODEL.mlpack [--threads 1] [--runs 100] [--top 30]
                               [--dims name=value,...]

mlpack's side is the engine's own profile (``MLPACK_PROFILE=1``: wall time per dispatch, printed
when the model is closed), from a child process that loads the container and runs it ``--runs``
times; ONNX Runtime's is its profiler (``SessionOptions.enable_profiling``: each node's kernel
time) over as many runs in this process, on the same seeded inputs (``packager.bench
.random_inputs``). Both are joined by the tensor each writes: a dispatch is named after its
kernel's output (``k12_<output>``, with suffixes such as ``_conv`` or ``_pad`` for its parts)
and an ONNX Runtime node by its output too (``<output>_nchwc`` once it has a blocked layout).
Printed: each runtime's total per run and one line per output, the biggest gaps first; a row
with a zero on one side is work the other fused into a neighbour, or a layout change. The two
profiles time differently (a pool run against a kernel call), so the totals, not the rows, are
comparable with benchmarks/run.py's latencies.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys

# a dispatch's line in the engine's profile: ms/run, %, workgroups, index: kernel name
_DISPATCH = re.compile(r"\s*([\d.]+)\s+[\d.]+\s+\d+\s+\d+: k\d+_(.*)$")
_PART = re.compile(r"_(conv|pad|mm|sum|sq|pack|panel)$")


def canonical(name: str) -> str:
    """A tensor name as both profiles can spell it (separators and a leading slash dropped)."""
    return re.sub(r"[/.:]", "_", name).strip("_")


def mlpack_profile(container: str, feeds_npz: str, threads: int, runs: int) -> dict[str, float]:
    """{output: ms per run} of each dispatch of ``container`` (its parts added up)."""
    # (each run's outputs let go at once: a list of them, hundreds of MB, made each run's
    # output writes fault in fresh pages, charged to the kernels that write the outputs)
    code = ("import sys, warnings, numpy as np, mlpack; warnings.simplefilter('ignore')\n"
            "m = mlpack.load(sys.argv[1], threads=int(sys.argv[3]))\n"
            "f = dict(np.load(sys.argv[2]))\n"
            "for _ in range(int(sys.argv[4])):\n    m.run(f)\n"
            "del m")
    env = dict(os.environ, MLPACK_PROFILE="1")
    proc = subprocess.run([sys.executable, "-c", code, container, feeds_npz, str(threads),
                           str(runs)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"mlpack failed on {container}:\n{proc.stderr}")
    out: dict[str, float] = collections.Counter()
    for line in proc.stderr.splitlines():
        m = _DISPATCH.match(line)
        if m:
            out[canonical(_PART.sub("", m.group(2)))] += float(m.group(1))
    return dict(out)


def ort_profile(model: str, feeds: dict, threads: int, runs: int, folder: str) -> list:
    """[(names the node may go by, its op type, ms per run)] of ONNX Runtime's nodes: its own
    name (a blocked-layout node is named after the output it computes) and its output's in the
    graph as ONNX Runtime runs it (a fused node is named after the first node it fused)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.log_severity_level = 3   # (saving an NCHWc graph warns that it is this host's)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(folder, "ort")
    so.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    outputs = {n.name: n.output[0] for n in _nodes(so.optimized_model_filepath) if n.output}
    for _ in range(runs):
        session.run(None, feeds)
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    times: dict[str, float] = collections.Counter()
    ops = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"].removesuffix("_kernel_time")
            times[node] += e["dur"] / runs / 1e3
            ops[node] = e["args"].get("op_name", "")
    return [(tuple(canonical(re.sub(r"_nchwc$", "", n)) for n in (node, outputs.get(node, node))),
             ops[node], ms) for node, ms in times.items()]


def _nodes(path: str) -> list:
    """The nodes of the ONNX file ``path`` (none where ONNX Runtime could not save it)."""
    import onnx

    try:
        return list(onnx.load(path, load_external_data=False).graph.node)
    except Exception:   # (whatever a file ONNX Runtime half wrote raises: no names then)
        return []


def main(argv=None) -> list[tuple[str, float, float]]:
    """Print the table; return its rows, (output, mlpack ms, ONNX Runtime ms), biggest gap
    first."""
    import tempfile
    import warnings

    import numpy as np

    import mlpack
    from mlpack.packager.bench import random_inputs

    from .ab import size_dims

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("container")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--top", type=int, default=30, help="rows printed (0: all)")
    ap.add_argument("--dims", default="sequence=128", help="size symbols, name=value,...")
    args = ap.parse_args(argv)
    dims = size_dims(args.dims)
    warnings.simplefilter("ignore")   # (an unsigned container: the user's own build)
    feeds = random_inputs(mlpack.load(args.container).inputs, dims)
    with tempfile.TemporaryDirectory(prefix="mlpack-nodes-") as tmp:
        npz = os.path.join(tmp, "feeds.npz")
        np.savez(npz, **feeds)
        ours = mlpack_profile(args.container, npz, args.threads, args.runs)
        nodes = ort_profile(args.model, feeds, args.threads, args.runs, tmp)
    theirs: dict[str, float] = collections.Counter()
    ops = {}
    for names, op, ms in nodes:   # the name mlpack's profile has, else the node's own
        name = next((n for n in names if n in ours), names[0])
        theirs[name] += ms
        ops[name] = "+".join(dict.fromkeys(filter(None, [ops.get(name), op])))
    rows = sorted(set(ours) | set(theirs), key=lambda k: -(ours.get(k, 0) - theirs.get(k, 0)))
    print(f"per run at {args.threads} thread(s), {args.runs} runs: mlpack "
          f"{sum(ours.values()):.3f} ms in {len(ours)} outputs, ONNX Runtime "
          f"{sum(theirs.values()):.3f} ms in {len(theirs)} nodes")
    print(f"{'mlpack ms':>10} {'ORT ms':>8} {'diff':>8}  op: output")
    for k in rows[:args.top or None]:
        a, b = ours.get(k, 0.0), theirs.get(k, 0.0)
        print(f"{a:10.3f} {b:8.3f} {a - b:+8.3f}  {ops.get(k, '-')}: {k}")
    return [(k, ours.get(k, 0.0), theirs.get(k, 0.0)) for k in rows]


if __name__ == "__main__":
    main()
