"""Run ONNX's backend node suite (shipped in the onnx wheel) through ``mlpack.backend``.

    python -m mlpack.conformance [--filter REGEX] [--jobs N] [--json FILE] [--verbose]

prints passes and failures per operator and in total. Each case runs in a worker process with
a time limit, and is compared exactly as ONNX's own runner compares (shape, dtype, rtol/atol of
the case). The recorded floor in tests/conformance/node_floor.txt is checked against this.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import warnings

CASE_SECONDS = 20


def load_cases(pattern: str | None = None):
    """The node test cases, as (name, case) pairs in a stable order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import onnx.backend.test.loader as loader
        cases = loader.load_model_tests(kind="node")
    rx = re.compile(pattern) if pattern else None
    return [c for c in sorted(cases, key=lambda c: c.name) if rx is None or rx.search(c.name)]


def op_of(case) -> str:
    """The operator a case tests: the op of its last node that is not a plumbing op."""
    types = [n.op_type for n in case.model.graph.node]
    name = case.name[len("test_"):]
    for t in types:
        if name.lower().startswith(t.lower()):
            return t
    return types[-1] if types else "?"


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_case(case) -> tuple[str, str]:
    """('pass'|'fail'|'error', detail) for one case."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner

    from . import backend
    from .spec.errors import Error

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                rep = backend.prepare(case.model)
                for inputs, ref in case.data_sets:
                    outs = rep.run(inputs)
                    ref = [numpy_helper.to_array(r) if isinstance(r, onnx.TensorProto) else r for r in ref]
                    Runner.assert_similar_outputs(ref, outs, rtol=case.rtol, atol=case.atol)
        return "pass", ""
    except _Timeout:
        return "fail", f"timeout after {CASE_SECONDS}s"
    except Error as e:
        return "error", f"{type(e).__name__}: {e}"
    except AssertionError as e:
        return "fail", " ".join(str(e).split())[:300]
    except Exception as e:  # an mlpack bug: still report, per case
        return "fail", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    finally:
        signal.alarm(0)


def _worker(args):
    name, idx, pattern = args
    cases = _CASES.get(pattern)
    if cases is None:
        cases = _CASES[pattern] = {c.name: c for c in load_cases(pattern)}
    return name, run_case(cases[name])


_CASES: dict = {}


def run_suite(pattern: str | None = None, jobs: int | None = None) -> dict[str, tuple[str, str, str]]:
    """{case name: (op, verdict, detail)} for every node case matching ``pattern``."""
    cases = load_cases(pattern)
    ops = {c.name: op_of(c) for c in cases}
    jobs = jobs or os.cpu_count() or 1
    results = {}
    if jobs == 1:
        for c in cases:
            results[c.name] = (ops[c.name], *run_case(c))
        return results
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs, maxtasksperchild=200) as pool:
        for name, (verdict, detail) in pool.imap_unordered(
                _worker, [(c.name, i, pattern) for i, c in enumerate(cases)], chunksize=8):
            results[name] = (ops[name], verdict, detail)
    return dict(sorted(results.items()))


def report(results, verbose: bool = False, out=None) -> None:
    out = out or sys.stdout
    per_op = collections.defaultdict(lambda: [0, 0])
    for name, (op, verdict, detail) in results.items():
        per_op[op][0 if verdict == "pass" else 1] += 1
        if verbose and verdict != "pass":
            print(f"  {verdict:5} {name}: {detail}", file=out)
    print(f"{'operator':32} {'pass':>5} {'fail':>5}", file=out)
    for op in sorted(per_op):
        p, f = per_op[op]
        print(f"{op:32} {p:5d} {f:5d}", file=out)
    passed = sum(p for p, _ in per_op.values())
    failed = sum(f for _, f in per_op.values())
    print(f"{'TOTAL':32} {passed:5d} {failed:5d}   ({passed} of {passed + failed} node cases pass)", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlpack.conformance", description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="regular expression on case names")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", help="write {case: [op, verdict, detail]} here")
    ap.add_argument("--verbose", "-v", action="store_true", help="print each failure")
    ap.add_argument("--update-floor", metavar="FILE",
                    help="add the cases that now pass to the floor FILE (it only ever rises)")
    args = ap.parse_args(argv)
    t0 = time.time()
    results = run_suite(args.filter, args.jobs)
    report(results, args.verbose)
    print(f"({time.time() - t0:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=0, sort_keys=True)
    if args.update_floor:
        floor = read_floor(args.update_floor)
        lost = sorted(n for n in floor if results.get(n, ("", "fail"))[1] != "pass")
        if lost:
            print(f"not updating the floor: {len(lost)} floor cases fail now: {lost[:10]}")
            return 1
        passing = {n for n, (_, v, _) in results.items() if v == "pass"}
        write_floor(args.update_floor, floor | passing)
        print(f"floor: {len(floor)} -> {len(floor | passing)} cases")
    return 0


def read_floor(path: str) -> set[str]:
    """The recorded floor: case names that must keep passing."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def write_floor(path: str, names: set[str]) -> None:
    with open(path, "w") as f:
        f.write("# ONNX node cases mlpack must keep passing (python -m mlpack.conformance "
                "--update-floor FILE adds new passes)\n")
        for n in sorted(names):
            f.write(n + "\n")


if __name__ == "__main__":
    sys.exit(main())
