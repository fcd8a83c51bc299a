"""CPU time per run at one thread, runtimes alternating: what a shared machine can still compare.

    python -m benchmarks.cputime int8=r50.mlpack:int8 fp32=r50.mlpack:fp32 \\
        ort=r50_qdq.onnx ort_exact=r50_qdq.onnx:exact
    python -m benchmarks.cputime before=old.mlpack after=new.mlpack ort=model.onnx \\
        --dim sequence=128

Each ``NAME=PATH[:WHAT]`` is a container with the precision to load (``:int8``; none: what
selection picks) or an ONNX model for ONNX Runtime (``:exact`` sets its
``session.x64quantprecision``, exact int8 kernels on CPUs without VNNI). All run one thread
(``--threads``) on one seeded random input (``packager.bench.random_inputs``: a symbolic dim is
1, or its ``--dim`` size), in blocks of ``--per`` runs, the runtimes' order reversed every
block, ``--blocks`` blocks; each block's CPU time (``time.process_time``, which excludes the
time the process waits for a core that other work holds) per run is a sample, and the medians
are printed with the wall-clock ones and each runtime's CPU time over the first's. Where the
machine is shared (other builds and tests on the same cores), wall-clock medians swing by tens
of percent between runs; CPU time moves far less (cache and memory contention still reach it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace

from mlpack.packager.bench import load_mlpack, random_inputs


def _runner(spec: str, dims: dict[str, int], threads: int):
    path, _, what = spec.partition(":")
    if path.endswith(".onnx"):
        from mlpack.packager.bench import ort_session
        from mlpack.packager.testvectors import EXACT_INT8
        session = ort_session(path, threads, {EXACT_INT8: "1"} if what == "exact" else None)
        feeds = random_inputs(_onnx_inputs(path), dims)
        return lambda: session.run(None, feeds)
    model = load_mlpack(path, threads, what or None)
    feeds = random_inputs(model.inputs, dims)
    return lambda: model.run(feeds)


def _onnx_inputs(path: str) -> list:
    """The ONNX model's graph inputs (initializers aside) as (name, IR dtype, shape) records,
    what ``random_inputs`` takes."""
    import onnx
    from onnx import helper

    from mlpack.spec.ir import dtypes as dt
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    out = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]
        dtype = dt.from_numpy(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        out.append(SimpleNamespace(name=vi.name, shape=shape, dtype=dtype))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runtimes", nargs="+", metavar="NAME=PATH[:WHAT]")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per", type=int, default=3, help="runs per block")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="a symbolic dim's size (repeatable; default 1): sequence=128")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of every runtime (CPU time then sums the threads')")
    args = parser.parse_args(argv)
    dims = {}
    for item in args.dim:
        name, sep, size = item.partition("=")
        if not sep or not size.isdigit():
            parser.error(f"--dim {item!r} is not NAME=SIZE")
        dims[name] = int(size)
    fns = {}
    for item in args.runtimes:
        name, sep, spec = item.partition("=")
        if not sep:
            parser.error(f"{item!r} is not NAME=PATH[:WHAT]")
        fns[name] = _runner(spec, dims, args.threads)
        fns[name]()   # warm up
    cpu = {n: [] for n in fns}
    wall = {n: [] for n in fns}
    for block in range(args.blocks):
        for name in list(fns) if block % 2 == 0 else list(fns)[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.per):
                fns[name]()
            cpu[name].append((time.process_time() - c0) / args.per)
            wall[name].append((time.perf_counter() - w0) / args.per)
    first = next(iter(fns))
    print(f"{'runtime':<16} {'cpu ms':>8} {'wall ms':>8}  cpu / {first}'s")
    for name in fns:
        c = statistics.median(cpu[name])
        print(f"{name:<16} {c * 1e3:>8.1f} {statistics.median(wall[name]) * 1e3:>8.1f}  "
              f"{c / statistics.median(cpu[first]):.3f}")
    with open("/proc/loadavg") as f:
        print("load average:", f.read().split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
