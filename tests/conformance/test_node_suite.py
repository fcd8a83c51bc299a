"""The ONNX backend node suite through mlpack: the recorded floor must keep passing.

The floor (node_floor.txt) only ever rises: `python -m mlpack.conformance --update-floor
tests/conformance/node_floor.txt` adds new passes and refuses to run if any floor case fails.
"""

import os

import pytest

from mlpack import conformance

FLOOR = os.path.join(os.path.dirname(__file__), "node_floor.txt")
MIN_PASSING = 1000  # the bar of the foundation issue


@pytest.fixture(scope="module")
def results():
    return conformance.run_suite(jobs=os.cpu_count() or 1)


def test_floor_cases_still_pass(results):
    floor = conformance.read_floor(FLOOR)
    failing = {n: results[n][2] for n in sorted(floor) if n in results and results[n][1] != "pass"}
    missing = sorted(floor - set(results))
    assert not missing, f"floor cases no longer in the suite: {missing[:10]}"
    assert not failing, f"{len(failing)} floor cases fail: " + "; ".join(
        f"{n}: {d}" for n, d in list(failing.items())[:10])


def test_floor_meets_the_bar(results):
    floor = conformance.read_floor(FLOOR)
    passing = sum(1 for _, v, _ in results.values() if v == "pass")
    assert len(floor) >= MIN_PASSING, f"the floor holds {len(floor)} cases, the bar is {MIN_PASSING}"
    assert passing >= len(floor)


def test_every_failure_is_reported_per_operator(results, capsys):
    conformance.report(results)
    out = capsys.readouterr().out
    assert "TOTAL" in out and "Conv" in out
