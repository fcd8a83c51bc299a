"""What a build costs and what its container holds (issue 20's build bar), per model:

- cold build time (a fresh kernel cache) and warm rebuild time (the same cache again), of
  ``mlpack build MODEL`` with the default targets, as a user runs it (a child process);
- the build's peak memory: the proportional resident memory (PSS) summed over its process tree
  (the build, its compile workers, qemu), sampled every 50 ms by a thread at the lowest
  priority, against the model file's size;
- the container's weight bytes (each blob counted once) against the model's own (its
  initializers' bytes);
- with ``--run-rss``, the peak resident memory of a process that loads the container and runs it
  at one thread beside one that does the same with ONNX Runtime (packager/bench.py's
  ``peak_rss``).

    flock /tmp/mlpack-bench.lock python -m benchmarks.build_cost vgg19 tv_mobilenet_v3_small
    python -m benchmarks.build_cost --set real --run-rss --json out.json

A name is a model of the benchmark set (benchmarks/models.py), of the real set
(benchmarks/real_models.py, which needs torchvision or transformers to export it once), or a path
to an ONNX file. Time it under the shared lock: the numbers are wall-clock times on a shared
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def model_path(name: str) -> Path:
    """The ONNX file of ``name``: a path, or a model of the benchmark or real set (made once)."""
    if name.endswith(".onnx") or os.sep in name:
        return Path(name)
    from benchmarks import models, real_models

    if name in models.BUILDERS:
        return models.materialize(name)
    return real_models.materialize(name.split("@")[0])


def weight_bytes(path: Path) -> int:
    """The bytes of the model's initializers (its weights), as stored."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(os.fspath(path))
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _pss(pid: int) -> int:
    """Proportional resident bytes of ``pid``: its own pages, and its share of each page it
    maps with other processes (a weights file the build and its workers map counts once)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_memory(root: int) -> int:
    """Resident bytes of ``root`` and every process below it (PSS, from /proc)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += _pss(pid)
        todo.extend(children.get(pid, ()))
    return total


def timed_build(model: Path, out: Path, cache: Path, extra=()) -> dict:
    """Run ``mlpack build`` in a child: {"seconds", "peak_bytes", "report"}."""
    env = dict(os.environ, MLPACK_CACHE_DIR=os.fspath(cache))
    cmd = [sys.executable, "-m", "mlpack.packager.cli", "build", os.fspath(model), "-o",
           os.fspath(out), "--quiet", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0]

    def sample() -> None:
        # (at the lowest priority: reading a 2 GB process tree's PSS takes tens of ms, and every
        # 20 ms at normal priority it took a core's share from the build it timed, whose cold
        # builds then measured 3-6 s longer than the same build run alone)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_memory(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - t0
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"mlpack build {model} failed: {err.decode()[-2000:]}")
    return {"seconds": seconds, "peak_bytes": peak[0]}


def container_weights(path: Path) -> int:
    """The container's weight bytes, each distinct blob counted once."""
    from mlpack.packager.cli import _layer_sizes
    from mlpack.spec.container import open_container

    with open_container(os.fspath(path), verify=False) as c:
        return _layer_sizes(c)["weights"]


def run_rss(container: Path, model: Path) -> dict:
    """Peak RSS (MiB) of mlpack and of ONNX Runtime running the model once per process, at one
    thread, on the container's first test case."""
    from mlpack.packager import bench
    from mlpack.runtime import load

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with load(os.fspath(container)) as m:
            feeds, _ = bench.model_inputs(m)
    return {"mlpack": bench.peak_rss("mlpack", container, feeds, 1),
            "ort": bench.peak_rss("ort", model, feeds, 1)}


def measure(name: str, run: bool = False, extra=()) -> dict:
    model = model_path(name)
    row = {"model": name, "file_bytes": model.stat().st_size, "weight_bytes": weight_bytes(model),
           "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="mlpack-build-cost-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "m.mlpack"
        row["cold"] = timed_build(model, out, cache, extra)
        row["container_bytes"] = out.stat().st_size
        row["container_weight_bytes"] = container_weights(out)
        out.unlink()
        row["warm"] = timed_build(model, out, cache, extra)
        if run:
            row["run_rss"] = run_rss(out, model)
    return row


def line(r: dict) -> str:
    mib = 2 ** 20
    text = (f"{r['model']:24s} cold {r['cold']['seconds']:6.1f} s  warm {r['warm']['seconds']:5.1f} s"
            f"  weights {r['container_weight_bytes'] / r['weight_bytes']:.2f}x of "
            f"{r['weight_bytes'] / mib:.0f} MiB  build peak {r['cold']['peak_bytes'] / mib:.0f} MiB "
            f"= {r['cold']['peak_bytes'] / r['file_bytes']:.2f}x the file (warm "
            f"{r['warm']['peak_bytes'] / r['file_bytes']:.2f}x)  load {r['load']:.2f}")
    rss = r.get("run_rss")
    if rss:
        got = [f"{(rss[k] or {}).get('peak_mib', float('nan')):.0f}" for k in ("mlpack", "ort")]
        text += f"  run peak RSS mlpack {got[0]} MiB, ORT {got[1]} MiB"
    return text


def main(argv=None) -> None:
    from benchmarks import models, real_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--set", choices=("bench", "real"), help="every model of a set")
    parser.add_argument("--run-rss", action="store_true", help="peak RSS running it, beside ORT")
    parser.add_argument("--json", help="append each row as a JSON line to this file")
    parser.add_argument("--build-args", default="", help="more arguments for mlpack build")
    args = parser.parse_args(argv)
    names = list(args.models)
    if args.set == "bench":
        names += list(models.NAMES)
    elif args.set == "real":
        names += list(dict.fromkeys(e.model for e in real_models.BENCH.values()))
    for name in names:
        r = measure(name, args.run_rss, args.build_args.split())
        print(line(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
