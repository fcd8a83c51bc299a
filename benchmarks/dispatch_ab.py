"""Two (or more) builds of one model compared dispatch by dispatch: which kernels did a change to
the compiler make faster or slower?

    python -m benchmarks.dispatch_ab A.mlpack B.mlpack [C.mlpack ...] [--threads 1] [--runs 200]
                                     [--rounds 3] [--match TEXT] [--dims name=value,...]

Each container runs in a child process with the engine's profile on (``MLPACK_PROFILE=1``:
wall time per dispatch; benchmarks/nodes.py's ``mlpack_profile``), ``--runs`` times on the same
seeded inputs; the containers take turns, ``--rounds`` times, and each dispatch keeps its
fastest time over the rounds. Printed: each container's sum of those times, the sum over the
dispatches whose output's name contains ``--match``, and one line per such dispatch.

On a shared host whose neighbours come and go, a whole-model A/B (benchmarks/ab.py) can move
by 5% between two runs of the same pair; the least-disturbed time of each kernel moves far
less, which is what a change to one kind of kernel needs. The containers must be builds of one
model for one target (the same dispatches); a dispatch that only one has shows 0 in the others.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

from .nodes import mlpack_profile


def fastest(containers: list[str], npz: str, threads: int, runs: int,
            rounds: int) -> list[dict[str, float]]:
    """Per container, {dispatch output: its fastest ms per run over ``rounds`` turns}."""
    best: list[dict[str, float]] = [{} for _ in containers]
    for _ in range(rounds):
        for seen, path in zip(best, containers):
            for name, ms in mlpack_profile(path, npz, threads, runs).items():
                seen[name] = min(ms, seen.get(name, ms))
    return best


def main(argv=None) -> list[dict[str, float]]:
    import numpy as np

    import mlpack
    from mlpack.packager.bench import random_inputs

    from .ab import size_dims

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("containers", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--match", default="", help="only dispatches whose output contains this")
    ap.add_argument("--dims", default="sequence=128", help="size symbols, name=value,...")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")   # (an unsigned container: the user's own build)
    feeds = random_inputs(mlpack.load(args.containers[0]).inputs, size_dims(args.dims))
    with tempfile.TemporaryDirectory(prefix="mlpack-dispatch-ab-") as tmp:
        npz = os.path.join(tmp, "feeds.npz")
        np.savez(npz, **feeds)
        best = fastest(args.containers, npz, args.threads, args.runs, args.rounds)
    names = [n for n in best[0] if args.match in n]
    print(f"{args.threads} thread(s), fastest of {args.rounds} rounds of {args.runs} runs, "
          "ms per run")
    print("all dispatches:  " + "  ".join(f"{sum(b.values()):8.3f}" for b in best))
    print(f"matching {args.match!r}:" + "  ".join(f"{sum(b.get(n, 0) for n in names):8.3f}"
                                              for b in best))
    for n in sorted(names, key=lambda n: -best[0][n]):
        print("  ".join(f"{b.get(n, 0):8.3f}" for b in best) + f"  {n}")
    return best


if __name__ == "__main__":
    main()
