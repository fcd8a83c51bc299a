"""Run ONNX's backend node suite (shipped in the onnx wheel) through ``mlpack.backend``.

    python -m mlpack.conformance [--filter REGEX] [--jobs N] [--json FILE] [--verbose]
                                 [--native | --compare]

prints passes and failures per operator and in total. Each case runs in a worker process with
a time limit, and is compared exactly as ONNX's own runner compares (shape, dtype, rtol/atol of
the case). The recorded floor in tests/conformance/node_floor.txt is checked against this.

By default the cases run on the reference interpreter (``mlpack.backend``'s "interp" mode);
``--native`` runs them as native code in the C engine (mode "native", no fallback), and
``--compare`` runs both and lists the cases that pass on the interpreter but not natively,
grouped by reason (the first line of the error), most common first.
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


def _detail(message: str) -> str:
    """An error message on at most 300 characters: its lines with whitespace collapsed, so the
    first line stays the reason ``--compare`` groups by."""
    lines = (" ".join(line.split()) for line in message.splitlines())
    return "\n".join(line for line in lines if line)[:300]


def reason_of(detail: str) -> str:
    """What a failure is grouped by: the first line of its detail."""
    return (detail.splitlines() or ["?"])[0]


def run_case(case, mode: str = "interp") -> tuple[str, str]:
    """('pass'|'fail'|'error', detail) for one case, on ``mlpack.backend`` in ``mode``."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner

    from mlpack import backend
    from mlpack.spec.errors import Error

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                # one engine thread per worker: the workers already use every core
                rep = backend.prepare(case.model, mode=mode,
                                      threads=1 if mode == "native" else None)
                for inputs, ref in case.data_sets:
                    outs = rep.run(inputs)
                    ref = [numpy_helper.to_array(r) if isinstance(r, onnx.TensorProto) else r for r in ref]
                    Runner.assert_similar_outputs(ref, outs, rtol=case.rtol, atol=case.atol)
        return "pass", ""
    except _Timeout:
        return "fail", f"timeout after {CASE_SECONDS}s"
    except Error as e:
        return "error", _detail(f"{type(e).__name__}: {e}")
    except AssertionError as e:
        return "fail", _detail(f"wrong result: {str(e).strip()}")
    except Exception as e:  # an mlpack bug: still report, per case
        return "fail", _detail(f"{type(e).__name__}: {e}")
    finally:
        signal.alarm(0)


def _worker(args):
    name, pattern, mode = args
    cases = _CASES.get(pattern)
    if cases is None:
        cases = _CASES[pattern] = {c.name: c for c in load_cases(pattern)}
    return name, run_case(cases[name], mode)


_CASES: dict = {}


def run_suite(pattern: str | None = None, jobs: int | None = None,
              mode: str = "interp") -> dict[str, tuple[str, str, str]]:
    """{case name: (op, verdict, detail)} for every node case matching ``pattern``, run in the
    backend's ``mode`` ("interp" or "native")."""
    cases = load_cases(pattern)
    ops = {c.name: op_of(c) for c in cases}
    jobs = jobs or os.cpu_count() or 1
    results = {}
    if jobs == 1:
        for c in cases:
            results[c.name] = (ops[c.name], *run_case(c, mode))
        return results
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs, maxtasksperchild=200) as pool:
        for name, (verdict, detail) in pool.imap_unordered(
                _worker, [(c.name, pattern, mode) for c in cases], chunksize=8):
            results[name] = (ops[name], verdict, detail)
    return dict(sorted(results.items()))


def report(results, verbose: bool = False, out=None) -> None:
    out = out or sys.stdout
    per_op = collections.defaultdict(lambda: [0, 0])
    for name, (op, verdict, detail) in results.items():
        per_op[op][0 if verdict == "pass" else 1] += 1
        if verbose and verdict != "pass":
            print(f"  {verdict:5} {name}: {' / '.join(detail.splitlines())}", file=out)
    print(f"{'operator':32} {'pass':>5} {'fail':>5}", file=out)
    for op in sorted(per_op):
        p, f = per_op[op]
        print(f"{op:32} {p:5d} {f:5d}", file=out)
    passed = sum(p for p, _ in per_op.values())
    failed = sum(f for _, f in per_op.values())
    print(f"{'TOTAL':32} {passed:5d} {failed:5d}   ({passed} of {passed + failed} node cases pass)", file=out)


def gap(interp: dict, native: dict) -> list[tuple[str, list[str]]]:
    """The cases that pass on the interpreter but not natively, as (reason, case names) groups,
    most common reason first."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name, (_, verdict, _) in interp.items():
        if verdict == "pass" and native.get(name, ("", "fail", "not run"))[1] != "pass":
            groups[reason_of(native.get(name, ("", "", "not run"))[2])].append(name)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def report_compare(interp: dict, native: dict, verbose: bool = False, out=None) -> None:
    """Per operator: passes on the interpreter and natively; then the gap grouped by reason."""
    out = out or sys.stdout
    per_op = collections.defaultdict(lambda: [0, 0, 0])
    for name, (op, verdict, _) in interp.items():
        per_op[op][2] += 1
        per_op[op][0] += verdict == "pass"
        per_op[op][1] += native.get(name, ("", ""))[1] == "pass"
    print(f"{'operator':32} {'interp':>6} {'native':>6} {'cases':>6}", file=out)
    for op in sorted(per_op):
        i, n, total = per_op[op]
        print(f"{op:32} {i:6d} {n:6d} {total:6d}", file=out)
    i, n, total = (sum(v[k] for v in per_op.values()) for k in range(3))
    print(f"{'TOTAL':32} {i:6d} {n:6d} {total:6d}   (interp {i}, native {n} of {total} node "
          f"cases pass)", file=out)
    groups = gap(interp, native)
    print(f"\n{sum(len(c) for _, c in groups)} cases pass on the interpreter but not natively, "
          f"by reason:", file=out)
    for reason, cases in groups:
        shown = cases if verbose else cases[:3]
        more = f", ... (+{len(cases) - len(shown)})" if len(cases) > len(shown) else ""
        print(f"{len(cases):5d}  {reason}\n       {', '.join(shown)}{more}", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlpack.conformance", description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="regular expression on case names")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", help="write {case: [op, verdict, detail]} here")
    ap.add_argument("--verbose", "-v", action="store_true", help="print each failure")
    ap.add_argument("--update-floor", metavar="FILE",
                    help="add the cases that now pass to the floor FILE (it only ever rises)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--native", action="store_true",
                     help="run natively (cpu target for this host, in libmlpack), not interpreted")
    how.add_argument("--compare", action="store_true",
                     help="run both; list what passes interpreted but not natively, by reason")
    args = ap.parse_args(argv)
    if args.update_floor and (args.native or args.compare):
        ap.error("--update-floor records the interpreter's floor: leave out --native/--compare")
    if args.compare:
        return _main_compare(args)
    t0 = time.time()
    mode = "native" if args.native else "interp"
    results = run_suite(args.filter, args.jobs, mode)
    print(f"mode: {_describe_mode(mode)}")
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


def _describe_mode(mode: str) -> str:
    if mode == "interp":
        return "interp (the NumPy reference interpreter)"
    from mlpack.backend import host_target
    from mlpack.runtime.engine import describe_engine

    return f"native ({host_target()} code in {describe_engine()})"


def _main_compare(args) -> int:
    t0 = time.time()
    interp = run_suite(args.filter, args.jobs, "interp")
    native = run_suite(args.filter, args.jobs, "native")
    print(f"modes: {_describe_mode('interp')} vs {_describe_mode('native')}")
    report_compare(interp, native, args.verbose)
    print(f"({time.time() - t0:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"interp": interp, "native": native}, f, indent=0, sort_keys=True)
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
