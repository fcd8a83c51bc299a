"""Soak: one loaded model run from many threads at once for minutes, every result checked.

``python -m benchmarks.threads --model PATH [--threads 8] [--minutes 10] [--engine-threads 2]``

The model is opened once with ``mlpack.load`` (the engine's pool: ``--engine-threads``; a
native artifact unless ``--device portable``). ``--inputs`` input sets are made from the
container's bundled test vectors (values drawn anew around theirs, integers from the values the
vectors hold, so token ids stay in range; without vectors, random ones), each symbolic dim sized
1..``--max-size`` by case (0: the vectors' shapes), and each is run once serially: the reference.
Then ``--threads`` threads run randomly chosen sets until the time is up, comparing every output
byte for byte with the serial result of its set. It reports the runs done, the mismatches and
errors, and the process's resident memory (VmRSS) before the threads, after a warm-up (5% of the
time: each thread's engine context and scratch exist by then), at the middle and at the end, so
growth over the run shows. It exits 1 on any mismatch or error. ``--json OUT`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import warnings

import numpy as np


def rss_mib() -> float:
    """This process's resident set size (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _resize(base: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``base`` cut or repeated (index modulo its size) along each axis to ``shape``."""
    if base.shape == shape:
        return base.copy()
    if base.size == 0:
        return np.zeros(shape, base.dtype)
    return base[np.ix_(*[np.arange(n) % b for n, b in zip(shape, base.shape)])]


def make_inputs(model, count: int, max_size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` input sets for ``model`` (see the module's docstring)."""
    from mlpack.spec.ir import dtypes

    rng = np.random.default_rng(seed)
    vectors = model.test_vectors()
    cases = []
    for c in range(count):
        base = vectors[c % len(vectors)][0] if vectors else {}
        sizes: dict[str, int] = {}
        feeds = {}
        for info in model.inputs:
            dt = dtypes.to_numpy(info.dtype)
            b = base.get(info.name)
            shape = []
            for k, d in enumerate(info.shape):
                if isinstance(d, int):
                    shape.append(d)
                elif max_size > 0:
                    shape.append(sizes.setdefault(d, 1 + (c + len(sizes)) % max_size))
                else:
                    shape.append(b.shape[k] if b is not None else 1)
            shape = tuple(shape)
            if b is None:
                b = (rng.standard_normal(shape) if np.issubdtype(dt, np.floating)
                     else rng.integers(0, 2, shape)).astype(dt)
            x = _resize(np.asarray(b, dt), shape)
            if np.issubdtype(dt, np.floating):
                scale = float(np.std(b)) if b.size else 1.0
                x = (x + rng.standard_normal(shape) * (scale or 1.0)).astype(dt)
            elif x.size:
                x = rng.choice(np.asarray(b).ravel(), size=shape).astype(dt)
            feeds[info.name] = x
        cases.append(feeds)
    return cases


def _same(got: dict, want: list[tuple]) -> bool:
    return len(got) == len(want) and all(
        a.dtype == dt and a.shape == shape and a.tobytes() == data
        for a, (dt, shape, data) in zip(got.values(), want))


class _Worker(threading.Thread):
    def __init__(self, model, cases, reference, seed: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.model, self.cases, self.reference, self.stop = model, cases, reference, stop
        self.rng = np.random.default_rng(seed)
        self.runs = self.mismatches = self.errors = 0
        self.first: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            i = int(self.rng.integers(len(self.cases)))
            try:
                ok = _same(self.model.run(self.cases[i]), self.reference[i])
            except Exception as e:   # noqa: BLE001 (counted and reported, the soak goes on)
                self.errors += 1
                self.first = self.first or f"input set {i}: {type(e).__name__}: {e}"
            else:
                if not ok:
                    self.mismatches += 1
                    self.first = self.first or f"input set {i}: differs from its serial run"
            self.runs += 1


def soak(path, threads: int = 8, minutes: float = 10.0, engine_threads: int | None = 2,
         device: str | None = None, inputs: int = 32, max_size: int = 4, seed: int = 0,
         progress=print) -> dict:
    """Run the soak (see the module's docstring); the numbers as a dict."""
    import mlpack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (a portable fallback says so in the result's artifact)
        model = mlpack.load(path, threads=engine_threads, device=device)
    with model:
        cases = make_inputs(model, inputs, max_size, seed)
        reference = [[(a.dtype, a.shape, a.tobytes()) for a in model.run(feeds).values()]
                     for feeds in cases]
        stop = threading.Event()
        workers = [_Worker(model, cases, reference, seed + 1 + t, stop) for t in range(threads)]
        rss = {"before": rss_mib()}
        seconds = minutes * 60
        t0 = time.monotonic()
        for w in workers:
            w.start()
        marks = [(0.05, "start"), (0.5, "middle")]
        next_report = 60.0
        while (elapsed := time.monotonic() - t0) < seconds:
            if marks and elapsed >= marks[0][0] * seconds:
                rss[marks.pop(0)[1]] = rss_mib()
            if elapsed >= next_report:
                progress(f"{elapsed / 60:5.1f} min: {sum(w.runs for w in workers)} runs, "
                         f"{sum(w.mismatches + w.errors for w in workers)} bad, RSS {rss_mib():.1f} MiB")
                next_report += 60
            time.sleep(min(0.25, max(seconds - elapsed, 0)))
        rss["end"] = rss_mib()
        stop.set()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - t0
        for _, name in marks:   # (a run too short to reach them)
            rss.setdefault(name, rss["end"])
        return {
            "model": str(path), "artifact": model.artifact.reason, "device": model.artifact.device,
            "threads": threads, "engine_threads": engine_threads, "seconds": elapsed,
            "input_sets": len(cases), "runs": sum(w.runs for w in workers),
            "runs_per_thread": [w.runs for w in workers],
            "mismatches": sum(w.mismatches for w in workers), "errors": sum(w.errors for w in workers),
            "first_failure": next((w.first for w in workers if w.first), None),
            "rss_mib": rss,
        }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .mlpack container")
    ap.add_argument("--threads", type=int, default=8, help="threads running the model at once")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--engine-threads", type=int, default=2, help="the engine's pool (load's threads=)")
    ap.add_argument("--device", default=None, help="as load's device= (portable: the NumPy interpreter)")
    ap.add_argument("--inputs", type=int, default=32, help="input sets")
    ap.add_argument("--max-size", type=int, default=4, help="symbolic dims sized 1..N (0: as the vectors)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    r = soak(args.model, args.threads, args.minutes, args.engine_threads, args.device, args.inputs,
             args.max_size, args.seed)
    rss = r["rss_mib"]
    print(f"{r['model']}: {r['artifact']}")
    print(f"{r['threads']} threads (engine pool {r['engine_threads']}), {r['seconds']:.0f} s, "
          f"{r['input_sets']} input sets")
    print(f"runs: {r['runs']} ({r['runs'] / r['seconds']:.0f}/s; per thread {min(r['runs_per_thread'])}.."
          f"{max(r['runs_per_thread'])}), mismatches: {r['mismatches']}, errors: {r['errors']}")
    if r["first_failure"]:
        print(f"first failure: {r['first_failure']}")
    print(f"RSS MiB: before threads {rss['before']:.1f}, start {rss['start']:.1f}, middle "
          f"{rss['middle']:.1f}, end {rss['end']:.1f} (start -> end {rss['end'] - rss['start']:+.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 1 if r["mismatches"] or r["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
